"""Choose and report a trained relation's recipe by whole-corpus retrieval (retrieval/recipe.py).

A split's whole corpus is every distinct text of the split (heads and tails of all its items),
searched as an index of them would be: each query (a head) against all of them, itself excluded.
On dev the recipe's weights are searched; on test the recipe is compared with identity, BM25,
their RRF hybrid and the operator alone, and the numbers go into the operator's bundle entry
(``info["recipe"]``, ``info["whole_corpus"]``) for ``relsearch relations``, the model card and
the warning of ``relsearch train`` when the recipe does not beat the best of them.

Items are plain ``(head, tail)`` texts; metadata (``same`` bonuses) come with a
:class:`Corpus` built by the caller (tools/build_pack.py does for companies). Many relations
fitted on one split (``relsearch train``: a hundred on a knowledge graph's 16k entities) share a
:class:`Split`: its texts are encoded, normalised and indexed by BM25 once.

:func:`fit_bundle` is what ``relsearch train`` runs after training (the CLI only echoes its lines):
every relation of a written bundle fitted on dev and judged on test, over the corpus a user indexes
(``--candidates``) or, without it, over the split's own candidates — a figure then labelled so,
with a ``warning:`` that it may not hold on a larger index and the command that measures it there.
"""
from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from . import hybrid
from . import prior as answer_prior
from .fit_corpus import Corpus, Encoded, Split, Training, read, relation_pairs, split_corpora
from .graph import Graph
from .recipe import (MIXES, TITLE, Choice, Recipe, choose, first_hit_mrr, first_line, mrr, pair_reciprocal_ranks,
                     score_matrix, title_vectors)

BASELINES = ("identity", "bm25", "hybrid", "operator")
# A relation whose recipe ranks more than this below identity on its held-back test split ships as
# identity (fall_back): the promise that a user's own relation never ranks below plain similarity
# by more than it (issue 51). A fixed figure, not the noise margin: one paired standard error on
# a test split of ~90 queries is 0.01-0.03, and the loser that prompted this lost by 0.016.
LOSS_TOLERANCE = 0.005
IDENTITY = Recipe(mixture={"identity": 1.0})  # plain similarity: what a losing relation ships as


@dataclass(frozen=True)
class Tables:
    """A corpus scored by every part a recipe may use."""

    dense: dict[str, np.ndarray]  # "identity" and the operator → (n_queries, m) cosines
    lexical: np.ndarray
    parts: dict  # each additive part's values by name (retrieval/parts.py), as score_matrix reads them
    exclude: np.ndarray
    gold: list[set[int]]
    known: list[set[int]] | None = None  # each query's answers known from training (Corpus.known)


def tables(corpus: Corpus, operator, encode: Callable[[list[str]], np.ndarray], graph: Graph | None = None) -> Tables:
    """Score ``corpus`` by identity, ``operator`` (query side), BM25 and, when some query has a
    title (a first line above more text), that title's cosine (key :data:`TITLE`), and by each
    additive part the corpus gives: its metadata fields (``same``), the operator's answer prior
    (when it has one), with the training ``graph`` which texts it links to each query
    (``neighbours``), each text's prominence and which texts name each query or are named by it
    (``mentions``; both None when the corpus has no names). ``encode``:
    texts → raw (n, d) vectors of the bundle's encoder (query towers attached by the caller); the
    corpus's own texts are encoded only when it is not already :attr:`~Corpus.encoded`."""
    e = corpus.encoded or Encoded.of(corpus.texts, encode)
    heads_h, head_texts = e.raw[corpus.heads], [corpus.texts[i] for i in corpus.heads]
    dense = {"identity": e.unit[corpus.heads] @ e.unit.T,
             operator.name: operator.apply(heads_h, head_texts) @ operator.documents(e.unit).T}
    if any(first_line(t) is not None for t in head_texts):
        dense[TITLE] = title_vectors(encode, head_texts, heads_h) @ e.unit.T
    p = corpus.prominence  # each query's prominence times each candidate's (retrieval/parts.py Prominence)
    parts = {"same": corpus.same(), "prominence": None if p is None else np.outer(p[corpus.heads], p),
             "mentions": None if corpus.mentions is None else
             {f: corpus.mentions[corpus.heads] * same for f, same in corpus.same().items()},
             "prior": {operator.name: answer_prior.scores(operator, corpus.texts)}
             if answer_prior.weights_of(operator) is not None else None,
             "unanswered": {operator.name: answer_prior.unanswered(operator, corpus.texts)},
             "neighbours": graph.linked(head_texts, corpus.texts) if graph is not None else None}
    return Tables(dense, e.bm25.scores(head_texts), parts, corpus.exclude(), corpus.gold, corpus.known)


def _baseline_scores(t: Tables, name: str) -> dict[str, np.ndarray]:
    """(n, m) scores of identity, BM25, identity+BM25 (RRF, as ``--hybrid``) and the operator alone."""
    return {"identity": t.dense["identity"], "bm25": t.lexical,
            "hybrid": hybrid.rrf_matrix(t.dense["identity"], t.lexical, exclude=t.exclude), "operator": t.dense[name]}


def baselines(t: Tables, name: str) -> dict[str, float]:
    """Whole-corpus MRR (every gold of every query) of each baseline of :func:`_baseline_scores`."""
    return {k: mrr(v, t.gold, t.exclude, t.known) for k, v in _baseline_scores(t, name).items()}


def fit(operator, dev: Corpus | None, test: Corpus | None, encode: Callable[[list[str]], np.ndarray],
        graph: Graph | None = None) -> dict:
    """Choose ``operator``'s recipe on ``dev`` and measure it on ``test``; store both in the
    operator's info and return the report ``{"recipe", "dev"?, "test"?}``. Without ``dev`` nothing
    is chosen: the recipe is the operator alone, still judged on ``test`` against the baselines.
    ``graph``: the training graph, which offers the recipe a neighbours bonus (retrieval/graph.py)."""
    if dev is None or not dev.heads:  # no dev query with a gold other than itself: nothing to choose on
        recipe = Recipe(mixture={operator.name: 1.0})
        operator.info.pop("answer_prior", None)
        report = {"recipe": recipe.to_json()}
        if test is not None and test.heads:
            report["test"] = measure(recipe, operator, test, encode)
        operator.info["recipe"] = recipe.to_json()
        operator.info["whole_corpus"] = {k: v for k, v in report.items() if k != "recipe"}
        return report
    dev_t = tables(dev, operator, encode, graph)
    # an identity-kind relation (a recipe over plain cosine) has no operator share to choose
    mixes = (1.0,) if operator.kind == "identity" else MIXES
    choice: Choice = choose(operator.name, dev_t.dense, dev_t.lexical, dev_t.parts, dev_t.exclude, dev_t.gold,
                            mixes=mixes, known=dev_t.known)
    report = {"recipe": choice.recipe.to_json(), "dev": {**baselines(dev_t, operator.name), "recipe": choice.dev_mrr,
                                                          "queries": len(dev.heads), "candidates": dev.candidates,
                                                          "recipes_tried": choice.tried,
                                                          "noise_margin": choice.margin if math.isfinite(choice.margin)
                                                          else None}}
    if choice.within_noise:  # the best recipe tried, turned down: its gain over the simplest was within noise
        report["dev"]["within_noise"] = {"recipe": choice.within_noise[0].to_json(), "mrr": choice.within_noise[1]}
    keep_table(operator, choice.recipe)
    if test is not None:
        report["test"] = measure(choice.recipe, operator, test, encode, graph=graph)
    operator.info["recipe"] = choice.recipe.to_json()
    operator.info["whole_corpus"] = {k: v for k, v in report.items() if k != "recipe"}
    return report


def keep_table(operator, recipe: Recipe) -> None:
    """Keep of the operator's answer table (retrieval/prior.py) what ``recipe`` reads: every answer for
    ``unanswered``, the most frequent for a prior alone, none for neither."""
    if recipe.unanswered:
        return
    if recipe.prior:
        operator.info["answer_prior"] = answer_prior.trimmed(operator.info["answer_prior"])
    else:
        operator.info.pop("answer_prior", None)


def measure(recipe: Recipe, operator, corpus: Corpus, encode, *, k: int | None = None, graph: Graph | None = None) -> dict:
    """Whole-corpus MRR of ``recipe`` and of every baseline on ``corpus``: over every (query, gold)
    pair, and in ``first_hit`` over queries by their first relevant hit (answer selection's MRR);
    with ``k``, also ``at_k``: method → :func:`at_k`."""
    t = tables(corpus, operator, encode, graph if recipe.neighbours else None)
    scores = {**_baseline_scores(t, operator.name),
              "recipe": score_matrix(recipe, t.dense, t.lexical, t.parts, t.exclude)}
    out = {**{m: mrr(v, t.gold, t.exclude, t.known) for m, v in scores.items()},
           "first_hit": {m: first_hit_mrr(v, t.gold, t.exclude, t.known) for m, v in scores.items()},
           "queries": len(corpus.heads), "candidates": corpus.candidates}
    if k is not None:
        out["at_k"] = {m: at_k(v, t.gold, t.exclude, k, t.known) for m, v in scores.items()}
    return out


def at_k(scores: np.ndarray, gold: list[set[int]], exclude: np.ndarray, k: int,
         known: list[set[int]] | None = None) -> dict[str, float]:
    """MRR@k and hits@k over every (query, gold) pair, as a user reading ``-k k`` hits sees them: a
    gold ranked past k counts 0 (filtered, realistic ranks, the query itself excluded)."""
    reciprocal = pair_reciprocal_ranks(scores, gold, exclude, known)
    inside = reciprocal >= 1.0 / k - 1e-12
    return {f"mrr@{k}": float(np.where(inside, reciprocal, 0.0).mean()), f"hits@{k}": float(inside.mean()),
            "pairs": len(reciprocal)}


def query_folds(corpus: Corpus, k: int) -> list[list[int]]:
    """``k`` folds of ``corpus``'s queries (positions in ``corpus.heads``) for cross-validation, so
    that no text is on both sides of a fold: queries joined by a gold pair (A names B, or both name
    C) form one connected component, and a component stays in one fold — the fitting side of a fold
    then never holds a held-out query or one of its golds. Components are dealt largest first to the
    fold with the fewest queries so far (ties: the lowest fold), as scikit-learn's GroupKFold does:
    the same corpus gives the same folds."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    if k < 2:
        raise ValueError(f"cross-validation needs at least 2 folds, not {k}")
    edges = [(q, g) for q, golds in zip(corpus.heads, corpus.gold) for g in golds]
    m = len(corpus.texts)
    graph = coo_matrix((np.ones(len(edges)), ([a for a, _ in edges], [b for _, b in edges])), shape=(m, m))
    _, component = connected_components(graph, directed=False)
    members: dict[int, list[int]] = {}
    for i, head in enumerate(corpus.heads):
        members.setdefault(int(component[head]), []).append(i)
    if len(members) < k:
        raise ValueError(f"{len(members)} groups of linked queries cannot fill {k} folds")
    folds: list[list[int]] = [[] for _ in range(k)]
    for group in sorted(members.values(), key=lambda g: (-len(g), g[0])):
        min(folds, key=len).extend(group)
    return [sorted(f) for f in folds]


def _rows(t: Tables, rows: list[int]) -> Tables:
    def cut(table):  # a part's table: per query (n, m) cut to ``rows``, per candidate (m,) kept whole
        return {key: cut(v) for key, v in table.items()} if isinstance(table, dict) \
            else table[rows] if getattr(table, "ndim", 0) == 2 else table

    return Tables({k: v[rows] for k, v in t.dense.items()}, t.lexical[rows], cut(t.parts), t.exclude[rows],
                  [t.gold[i] for i in rows], None if t.known is None else [t.known[i] for i in rows])


def cross_validate(operator, corpus: Corpus, folds: list[list[int]], encode: Callable[[list[str]], np.ndarray], *,
                   k: int = 10, mixes: tuple | None = None) -> dict:
    """The recipe choice judged on queries that chose nothing: for each fold, the recipe is chosen
    (:func:`~.recipe.choose`, as :func:`fit` chooses it) on the other folds' queries and measured on
    the fold's, beside identity, BM25, hybrid and the operator alone. ``folds``: positions in
    ``corpus.heads`` (:func:`query_folds`); a fold whose queries or golds are queries or golds of
    another fold is refused (what was measured would have chosen). Returns ``{"folds": [{"chosen" (the
    fold's recipe), "queries", METHOD: {"mrr@k", "hits@k", "pairs"}}...], "summary": {METHOD: {"mrr@k": {"mean",
    "std", "pooled"}, ...}}}``: the mean and spread (sample standard deviation) over folds, and every
    held-out pair pooled."""
    texts = [{corpus.heads[i], *corpus.gold[i]} for i in range(len(corpus.heads))]
    seen: dict[int, int] = {}
    for f, fold in enumerate(folds):
        for i in fold:
            for text in texts[i]:
                if seen.setdefault(text, f) != f:
                    raise ValueError(f"company text {text} is in folds {seen[text]} and {f}: a fold's fitting side "
                                     "would hold what it measures")
    t = tables(corpus, operator, encode)
    mixes = mixes or ((1.0,) if operator.kind == "identity" else MIXES)
    out, pooled = [], {}
    for held in folds:
        held_set = set(held)
        fitting, measured = _rows(t, [i for i in range(len(corpus.heads)) if i not in held_set]), _rows(t, held)
        choice = choose(operator.name, fitting.dense, fitting.lexical, fitting.parts, fitting.exclude, fitting.gold,
                        mixes=mixes)
        scores = {**_baseline_scores(measured, operator.name),
                  "recipe": score_matrix(choice.recipe, measured.dense, measured.lexical, measured.parts,
                                         measured.exclude)}
        row = {"chosen": choice.recipe.to_json(), "queries": len(held)}
        for method, s in scores.items():
            row[method] = at_k(s, measured.gold, measured.exclude, k)
            pooled.setdefault(method, []).append(pair_reciprocal_ranks(s, measured.gold, measured.exclude))
        out.append(row)
    summary = {}
    for method, parts in pooled.items():
        reciprocal = np.concatenate(parts)
        inside = reciprocal >= 1.0 / k - 1e-12
        whole = {f"mrr@{k}": float(np.where(inside, reciprocal, 0.0).mean()), f"hits@{k}": float(inside.mean())}
        summary[method] = {key: {"mean": float(np.mean([r[method][key] for r in out])),
                                 "std": float(np.std([r[method][key] for r in out], ddof=1)), "pooled": whole[key]}
                           for key in whole}
    return {"folds": out, "summary": summary, "k": k}


def verdict(name: str, report: dict) -> tuple[bool, str]:
    """(wins, one line): does the recipe beat the best of identity, BM25 and hybrid on test
    (dev when there is no test split)?"""
    split = "test" if "test" in report else "dev"
    scores = report[split]
    best = max(("identity", "bm25", "hybrid"), key=lambda k: scores[k])
    recipe = Recipe.from_json(report["recipe"])
    line = (f"{name}: recipe {recipe.describe()} — whole-corpus {split} MRR {scores['recipe']:.3f} "
            f"(identity {scores['identity']:.3f}, BM25 {scores['bm25']:.3f}, hybrid {scores['hybrid']:.3f}, "
            f"operator alone {scores['operator']:.3f}; {scores['queries']} queries over {scores['candidates']} texts)")
    if "first_hit" in scores:
        first = scores["first_hit"]
        line += (f"; by each query's first relevant hit: recipe {first['recipe']:.3f} (identity {first['identity']:.3f}, "
                 f"BM25 {first['bm25']:.3f}, hybrid {first['hybrid']:.3f})")
    return scores["recipe"] > scores[best], line


def loses_to_identity(report: dict) -> bool:
    """Whether ``report``'s test split ranks the recipe more than :data:`LOSS_TOLERANCE` below identity."""
    test = report.get("test") or {}
    return "recipe" in test and test["recipe"] < test["identity"] - LOSS_TOLERANCE


def fall_back(operator, report: dict) -> None:
    """Ship ``operator``'s relation as plain similarity: its stored recipe becomes :data:`IDENTITY`
    (``--relation NAME`` then ranks exactly as identity), ``report``'s figures of what it runs become
    identity's, and ``report["fallback"]`` (kept in ``info["whole_corpus"]``) records the recipe
    turned down with its test MRR beside identity's, for the card and ``relsearch relations``."""
    test = report["test"]
    report["fallback"] = {"recipe": report["recipe"], "test": test["recipe"], "identity": test["identity"],
                          "tolerance": LOSS_TOLERANCE}
    report["recipe"] = IDENTITY.to_json()
    for figures in (test, test.get("first_hit"), report.get("dev")):
        if figures:
            figures["recipe"] = figures["identity"]
    operator.info.pop("answer_prior", None)
    operator.info["recipe"] = IDENTITY.to_json()
    operator.info["whole_corpus"] = {k: v for k, v in report.items() if k != "recipe"}


def fallback_line(name: str, fallback: dict) -> str:
    """One line: ``name``'s recipe lost to identity on test and was shipped as identity."""
    return (f"{name}: recipe {fallback['test']:.3f} < identity {fallback['identity']:.3f} on the test corpus: "
            "shipped as identity (--keep-worse keeps the recipe)")


def card_section(reports: dict[str, dict], own_texts: bool = False) -> str:
    """Markdown for the model card: each relation's recipe and its whole-corpus comparison.
    ``own_texts``: each split's corpus was its own candidates (no ``--candidates``), which the
    section then says, with what measures the figures on the corpus a user indexes."""
    lines = ["", "## Recipes (what `--relation NAME` runs), by whole-corpus retrieval", "",
             "Chosen on dev (retrieval/recipe.py): a recipe other than the operator alone only when it beats it by "
             "more than one paired standard error; each query searches every text of its split, itself excluded; "
             "MRR, filtered, realistic ranks, over every (query, gold) pair; \"test, first hit\": over queries, each by "
             "its first relevant hit (answer selection's MRR).", "",
             "| relation | recipe | split | recipe | identity | BM25 | hybrid (RRF) | operator alone | queries | texts |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, report in sorted(reports.items()):
        described = Recipe.from_json(report["recipe"]).describe()
        rows = [(split, report[split], report[split]) for split in ("dev", "test") if split in report]
        if "first_hit" in report.get("test", {}):
            rows.append(("test, first hit", report["test"]["first_hit"], report["test"]))
        for split, s, counts in rows:
            lines.append(f"| {name} | {described} | {split} | **{s['recipe']:.3f}** | {s['identity']:.3f} | "
                         f"{s['bm25']:.3f} | {s['hybrid']:.3f} | {s['operator']:.3f} | {counts['queries']} | "
                         f"{counts['candidates']} |")
    for name, report in sorted(reports.items()):
        if "fallback" in report:
            turned_down = Recipe.from_json(report["fallback"]["recipe"]).describe()
            lines += ["", f"{name} ships as identity (plain similarity): its recipe {turned_down} ranked test MRR "
                      f"{report['fallback']['test']:.3f} against identity's {report['fallback']['identity']:.3f}, more "
                      f"than {LOSS_TOLERANCE:g} below it; `relsearch train --keep-worse` keeps such a recipe."]
    if own_texts:
        lines += ["", "The texts searched are each split's own candidates (its heads, tails and hard negatives; no "
                  "`--candidates`), which may be far fewer than the corpus you index: these figures may not hold "
                  "there. `relsearch bench linkpred TEST.jsonl --candidates CORPUS --model BUNDLE` measures them on "
                  "that corpus."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Fitting a trained bundle (what `relsearch train` runs after training, with --dev or --test)

OWN_TEXTS = "the {split} split's own candidates"  # the label of a figure not measured on the corpus indexed


def _echo(line: str, err: bool = False) -> None:
    print(line, file=sys.stderr if err else sys.stdout)


def fit_bundle(path, dev: tuple[str, ...] | list[str], test: tuple[str, ...] | list[str], *,
               card: Callable[[object], str], candidates: list[str] | None = None, cache_dir=None,
               deadline: float | None = None, command_started: float | None = None,
               remeasure: Callable[[str], str] | None = None, train: tuple[str, ...] | list[str] = (),
               keep_worse: bool = False, say: Callable[[str, bool], None] = _echo) -> dict[str, dict]:
    """Choose each relation's recipe of the bundle at ``path`` on the ``dev`` triples files by
    whole-corpus retrieval (:func:`fit`; without dev the recipe is the operator alone), compare it
    on the ``test`` files with identity, BM25 and hybrid, say plainly when it does not beat them,
    and write the bundle again with the recipes and the comparison in its card (``card``: bundle →
    the card's markdown, the recipes section left out). Returns each fitted relation's report.

    What a split's queries search: ``candidates`` (the corpus a user indexes: ``--candidates``),
    with the split's tails and hard negatives, heads only among them; without ``candidates``, every
    head, tail and hard negative of the split — the split's own candidates, which may be far fewer
    texts than an index holds (TrecQA's test triples: 354 texts, the 1,393 test sentences a user
    indexes left out). Each figure of the latter kind is labelled :data:`OWN_TEXTS`, and a
    ``warning:`` says it may not hold on a larger index and what measures it there:
    ``remeasure(split)``, the commands to name (default: a generic hint).

    ``say(line, err)`` prints a line (``err``: to stderr). ``deadline`` (:func:`loop.clock` time):
    relations are fitted largest first (dev and test pairs), each only when its estimated cost — its
    pairs at the mean cost per pair so far — still fits; the others keep their operator alone, and
    a line and the card say so. ``command_started``: when the budget's clock started, for the
    record of how it was spent (``bundle.info["time_budget"]``, when the bundle has one).

    ``train``: the training triples files. Their answers of a dev or test query are filtered from
    its ranks (:attr:`Corpus.known`), as link prediction filters them. A relation with training answers
    is also offered its answer prior and the unanswered bonus (retrieval/prior.py; the bonus while the
    bundle's complete tables hold fewer than MAX_BUNDLE_ANSWERS answers), and every relation the
    neighbours bonus of the graph the training triples draw (retrieval/graph.py); the bundle keeps a
    table or the graph only when dev chooses it.

    A relation whose recipe ranks more than :data:`LOSS_TOLERANCE` below identity on test ships as
    identity (:func:`fall_back`), and a line says so with both figures; ``keep_worse`` keeps the
    recipe, with a ``warning:``."""
    from ..encoder.training import loop
    from ..encoder.training.loop import write_bundle

    started = loop.clock()
    bundle, encode = _load(path, cache_dir)
    triples = {s: read(files) for s, files in (("dev", dev), ("test", test))}
    training = Training.read(train, say)
    pairs = relation_pairs(bundle, triples)
    splits = split_corpora(triples, pairs, candidates, encode)
    reports, budget, room = {}, _Budget(deadline), answer_prior.MAX_BUNDLE_ANSWERS
    own: dict[str, int] = {}  # split → its texts, for each split judged on its own candidates only
    for name, by_split in sorted(pairs.items(), key=lambda item: -sum(map(len, item[1].values()))):
        op, size = bundle.operators[name], sum(map(len, by_split.values()))
        if not budget.fits(name, op, size):
            continue
        t0 = loop.clock()
        reports[name], has_dev = _fit_relation(name, op, by_split, splits, training, encode, room)
        budget.spent(size, loop.clock() - t0)
        # its whole table is kept (parsed afresh: recipe_of's cache may hold the recipe before this fit)
        if Recipe.from_json(op.info["recipe"]).unanswered:
            room -= len(answer_prior.weights_of(op))
        judged = _judge(name, op, reports[name], has_dev, bool(candidates), keep_worse, say)
        if judged and not candidates:
            own[judged] = sum(splits[judged].candidate)
    _say_caveats(own, budget.late, len(pairs), remeasure, say)
    _record(bundle, training.graph, reports, budget.late, started, command_started)
    if reports or budget.late:
        write_bundle(bundle, path, card=card(bundle) + card_section(reports, own_texts=bool(own)))
    return reports


def _load(path, cache_dir) -> tuple[object, Callable[[list[str]], np.ndarray]]:
    """The bundle at ``path`` and its encoder's cached ``encode`` (with towers when an operator reads text)."""
    from ..encoder.bundle import load_bundle
    from ..encoder.model import Encoder
    from ..encoder.training import encode_cached

    bundle = load_bundle(str(path))
    encoder = Encoder(bundle.encoder_config())
    if any(op.needs_text for op in bundle.operators.values()):
        from ..encoder.tower import attach_towers

        attach_towers(bundle.operators, encoder)
    return bundle, partial(encode_cached, encoder, cache_dir=cache_dir, progress=False)


class _Budget:
    """:func:`fit_bundle`'s time budget: relations that do not fit (``late``) keep their operator alone."""

    def __init__(self, deadline: float | None):
        self.deadline, self.late, self.pairs, self.seconds = deadline, [], 0, 0.0

    def fits(self, name: str, op, size: int) -> bool:
        """Whether relation ``name`` of ``size`` pairs fits; if not, ``op`` is marked not fitted."""
        from ..encoder.training import loop

        estimate = size * self.seconds / self.pairs if self.pairs else 0.0
        if self.deadline is None or loop.clock() + estimate <= self.deadline:
            return True
        self.late.append(name)
        op.info["recipe"] = Recipe(mixture={name: 1.0}).to_json()
        op.info["whole_corpus"] = {"not_fitted": "time budget"}
        return False

    def spent(self, size: int, seconds: float) -> None:
        self.seconds, self.pairs = self.seconds + seconds, self.pairs + size


def _fit_relation(name: str, op, by_split: dict, splits: dict[str, Split], training: Training, encode, room: int):
    """Fit relation ``name`` (:func:`fit`), its known training answers filtered from its ranks, offered
    its answer prior and, when its answers fit the ``room`` the bundle's complete tables have left, the
    unanswered bonus. Returns its report and whether it had dev pairs."""
    answers = training.answers.get(name, ())
    if answers:  # fit keeps of the table what the chosen recipe reads
        op.info["answer_prior"] = answer_prior.table(answers, room)  # complete only when it fits
    corpus = {s: splits[s].corpus(by_split[s], training.known.get(name, ())) if by_split[s] else None
              for s in by_split}
    return fit(op, corpus["dev"], corpus["test"], encode, training.graph), corpus["dev"] is not None


def _judge(name: str, op, report: dict, has_dev: bool, on_candidates: bool, keep_worse: bool,
           say: Callable[[str, bool], None]) -> str | None:
    """Say how relation ``name`` did, falling back to identity when it ranks below it (unless
    ``keep_worse``). Returns the split judged on (None: no query whose gold is another text)."""
    if not {"dev", "test"} & set(report):
        return None
    wins, line = verdict(name, report)
    judged = "test" if "test" in report else "dev"
    say(line + ("" if has_dev else " [no --dev: the operator alone, no recipe chosen]")
        + ("" if on_candidates else f" [{OWN_TEXTS.format(split=judged)}: --candidates CORPUS judges it on the "
                                    "corpus you index]"), False)
    if loses_to_identity(report):
        if keep_worse:
            say(f"warning: {name}: recipe {report['test']['recipe']:.3f} < identity {report['test']['identity']:.3f} "
                "on the test corpus: kept as trained (--keep-worse); query with identity or --hybrid instead", True)
        else:
            fall_back(op, report)
            say(fallback_line(name, report["fallback"]), False)
    elif not wins:
        unused = name not in report["recipe"]["mixture"]  # dev chose plain cosine (and BM25) over it
        say(f"warning: {name} does not beat plain retrieval on its whole-corpus {judged} split; "
            + ("its recipe leaves the operator out, so --relation " + name + " answers without it"
               if unused else "query with identity or --hybrid instead"), True)
    return judged


def _say_caveats(own: dict[str, int], late: list[str], relations: int, remeasure, say) -> None:
    """Warn of figures measured on a split's own candidates only, and of relations left unfitted."""
    for split, texts in sorted(own.items(), key=lambda item: item[0] != "test"):
        say(f"warning: the whole-corpus {split} figures above rank each query among {OWN_TEXTS.format(split=split)} "
            f"only (its heads, tails and negatives: {texts} texts), not the corpus you will index; they may not hold "
            f"on a larger index. Measure them there: "
            + (remeasure(split) if remeasure else "fit again with that corpus as the candidates"), True)
    if late:
        say(f"time budget: {len(late)} of {relations} relations were not fitted in the time left and "
            f"keep their operator alone: {', '.join(sorted(late))}", True)


def _record(bundle, graph: Graph | None, reports: dict, late: list[str], started: float,
            command_started: float | None) -> None:
    """Record in the bundle how the time budget was spent, and the training graph when a recipe reads it."""
    from ..encoder.training import loop

    if "time_budget" in bundle.info and command_started is not None:
        bundle.info["time_budget"].update(fitting_seconds=round(loop.clock() - started, 1),
                                          relations_fitted=len(reports), relations_not_fitted=sorted(late),
                                          seconds_to_last_write=round(loop.clock() - command_started, 1))
    if graph is not None:  # this training graph replaces an earlier one; kept when a recipe reads it
        bundle.info.pop("graph", None)
        if any(Recipe.from_json(op.info["recipe"]).neighbours for op in bundle.operators.values() if "recipe" in op.info):
            bundle.info["graph"] = graph.to_json()
