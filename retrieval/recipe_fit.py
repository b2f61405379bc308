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
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..encoder.relations import normalize
from ..indexer.lexical import BM25
from . import hybrid
from .recipe import MIXES, TITLE, Choice, Recipe, choose, first_hit_mrr, first_line, mrr, score_matrix, title_vectors

BASELINES = ("identity", "bm25", "hybrid", "operator")


@dataclass(frozen=True)
class Encoded:
    """A corpus's texts encoded once — raw vectors of the bundle's encoder and their unit vectors —
    and indexed once by BM25: what :func:`tables` scores a corpus with."""

    raw: np.ndarray
    unit: np.ndarray
    bm25: BM25

    @classmethod
    def of(cls, texts: list[str], encode: Callable[[list[str]], np.ndarray]) -> Encoded:
        raw = encode(texts)
        return cls(raw, normalize(raw), BM25(texts))


@dataclass(frozen=True)
class Corpus:
    """One split's whole corpus: ``texts`` (m) the candidates and the queries, the queries
    (``heads``: positions in ``texts``), each query's gold positions, ``metadata`` field → each
    text's value, and ``candidate`` (m bools, default all): which texts an index of the split
    holds (a question is a query of qa-entailment, never one of its answers). ``encoded``: the
    texts already encoded and indexed (corpora of one :class:`Split` share it); None: :func:`tables`
    encodes them."""

    texts: list[str]
    heads: list[int]
    gold: list[set[int]]
    metadata: dict[str, list] = field(default_factory=dict)
    candidate: list[bool] | None = None
    encoded: Encoded | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of_pairs(cls, pairs: list[tuple[str, str]], texts: list[str] = (), *, heads: bool = True) -> Corpus:
        """The candidates are every tail of ``pairs`` (head, tail), every text of ``texts`` (the
        rest of the split: negatives, a corpus) and, with ``heads``, every head (questions of a
        forum are its documents; questions of answer selection are not its answers: heads=False
        keeps a head only when it is among the others). Each distinct head is a query."""
        index: dict[str, int] = {t: i for i, t in enumerate(dict.fromkeys(
            [*texts, *(t for _, t in pairs), *(h for h, _ in pairs if heads)]))}
        candidates = len(index)
        for head, _ in pairs:
            index.setdefault(head, len(index))
        gold: dict[int, set[int]] = {}
        for head, tail in pairs:
            if head != tail:
                gold.setdefault(index[head], set()).add(index[tail])
        return cls(list(index), list(gold), list(gold.values()), candidate=[i < candidates for i in range(len(index))])

    def same(self) -> dict[str, np.ndarray]:
        """field → (n_queries, m) bool: the candidate holds the query's (non-null) value."""
        out = {}
        for f, values in self.metadata.items():
            column = np.asarray([str(v) if v is not None else "\0none" for v in values])
            query = column[self.heads]
            out[f] = (column[None, :] == query[:, None]) & (query[:, None] != "\0none")
        return out

    def exclude(self) -> np.ndarray:
        """(n_queries, m) bool: each query itself, and every text that is not a candidate."""
        mask = np.zeros((len(self.heads), len(self.texts)), bool)
        mask[np.arange(len(self.heads)), self.heads] = True
        if self.candidate is not None:
            mask |= ~np.asarray(self.candidate, bool)[None, :]
        return mask

    @property
    def candidates(self) -> int:
        return len(self.texts) if self.candidate is None else int(sum(self.candidate))


@dataclass(frozen=True)
class Tables:
    """A corpus scored by every part a recipe may use."""

    dense: dict[str, np.ndarray]  # "identity" and the operator → (n_queries, m) cosines
    lexical: np.ndarray
    same: dict[str, np.ndarray]
    exclude: np.ndarray
    gold: list[set[int]]


class Split:
    """The texts of one split that the corpora of every relation fitted on it share: the
    ``candidates`` (what an index of the split holds), then the ``queries`` that are not among them;
    encoded, normalised and indexed by BM25 once (:class:`Encoded`), so that fitting a hundred
    relations on a split does that once, not once per relation. :meth:`corpus` gives a relation's."""

    def __init__(self, candidates: list[str], queries: list[str], encode: Callable[[list[str]], np.ndarray]):
        candidates = list(dict.fromkeys(candidates))
        self.texts = list(dict.fromkeys([*candidates, *queries]))
        self.candidate = [i < len(candidates) for i in range(len(self.texts))]
        self.position = {t: i for i, t in enumerate(self.texts)}
        self.encoded = Encoded.of(self.texts, encode)

    def corpus(self, pairs: list[tuple[str, str]]) -> Corpus:
        """The corpus of ``pairs`` (head, tail): each distinct head with a tail other than itself is a
        query, every tail a gold (heads among ``queries``, tails among ``candidates``)."""
        gold: dict[int, set[int]] = {}
        for head, tail in pairs:
            if head != tail:
                gold.setdefault(self.position[head], set()).add(self.position[tail])
        return Corpus(self.texts, list(gold), list(gold.values()), candidate=self.candidate, encoded=self.encoded)


def tables(corpus: Corpus, operator, encode: Callable[[list[str]], np.ndarray]) -> Tables:
    """Score ``corpus`` by identity, ``operator`` (query side), BM25 and, when some query has a
    title (a first line above more text), that title's cosine (key :data:`TITLE`). ``encode``:
    texts → raw (n, d) vectors of the bundle's encoder (query towers attached by the caller); the
    corpus's own texts are encoded only when it is not already :attr:`~Corpus.encoded`."""
    e = corpus.encoded or Encoded.of(corpus.texts, encode)
    heads_h, head_texts = e.raw[corpus.heads], [corpus.texts[i] for i in corpus.heads]
    dense = {"identity": e.unit[corpus.heads] @ e.unit.T,
             operator.name: operator.apply(heads_h, head_texts) @ operator.documents(e.unit).T}
    if any(first_line(t) is not None for t in head_texts):
        dense[TITLE] = title_vectors(encode, head_texts, heads_h) @ e.unit.T
    return Tables(dense, e.bm25.scores(head_texts), corpus.same(), corpus.exclude(), corpus.gold)


def _baseline_scores(t: Tables, name: str) -> dict[str, np.ndarray]:
    """(n, m) scores of identity, BM25, identity+BM25 (RRF, as ``--hybrid``) and the operator alone."""
    return {"identity": t.dense["identity"], "bm25": t.lexical,
            "hybrid": hybrid.rrf_matrix(t.dense["identity"], t.lexical, exclude=t.exclude), "operator": t.dense[name]}


def baselines(t: Tables, name: str) -> dict[str, float]:
    """Whole-corpus MRR (every gold of every query) of each baseline of :func:`_baseline_scores`."""
    return {k: mrr(v, t.gold, t.exclude) for k, v in _baseline_scores(t, name).items()}


def fit(operator, dev: Corpus | None, test: Corpus | None, encode: Callable[[list[str]], np.ndarray]) -> dict:
    """Choose ``operator``'s recipe on ``dev`` and measure it on ``test``; store both in the
    operator's info and return the report ``{"recipe", "dev"?, "test"?}``. Without ``dev`` nothing
    is chosen: the recipe is the operator alone, still judged on ``test`` against the baselines."""
    if dev is None or not dev.heads:  # no dev query with a gold other than itself: nothing to choose on
        recipe = Recipe(mixture={operator.name: 1.0})
        report = {"recipe": recipe.to_json()}
        if test is not None and test.heads:
            report["test"] = measure(recipe, operator, test, encode)
        operator.info["recipe"] = recipe.to_json()
        operator.info["whole_corpus"] = {k: v for k, v in report.items() if k != "recipe"}
        return report
    dev_t = tables(dev, operator, encode)
    # an identity-kind relation (a recipe over plain cosine) has no operator share to choose
    mixes = (1.0,) if operator.kind == "identity" else MIXES
    choice: Choice = choose(operator.name, dev_t.dense, dev_t.lexical, dev_t.same, dev_t.exclude, dev_t.gold,
                            mixes=mixes)
    report = {"recipe": choice.recipe.to_json(), "dev": {**baselines(dev_t, operator.name), "recipe": choice.dev_mrr,
                                                          "queries": len(dev.heads), "candidates": dev.candidates,
                                                          "recipes_tried": choice.tried,
                                                          "noise_margin": choice.margin if math.isfinite(choice.margin)
                                                          else None}}
    if choice.within_noise:  # the best recipe tried, turned down: its gain over the simplest was within noise
        report["dev"]["within_noise"] = {"recipe": choice.within_noise[0].to_json(), "mrr": choice.within_noise[1]}
    if test is not None:
        report["test"] = measure(choice.recipe, operator, test, encode)
    operator.info["recipe"] = choice.recipe.to_json()
    operator.info["whole_corpus"] = {k: v for k, v in report.items() if k != "recipe"}
    return report


def measure(recipe: Recipe, operator, corpus: Corpus, encode) -> dict:
    """Whole-corpus MRR of ``recipe`` and of every baseline on ``corpus``: over every (query, gold)
    pair, and in ``first_hit`` over queries by their first relevant hit (answer selection's MRR)."""
    t = tables(corpus, operator, encode)
    scores = {**_baseline_scores(t, operator.name),
              "recipe": score_matrix(recipe, t.dense, t.lexical, t.same, t.exclude)}
    return {**{k: mrr(v, t.gold, t.exclude) for k, v in scores.items()},
            "first_hit": {k: first_hit_mrr(v, t.gold, t.exclude) for k, v in scores.items()},
            "queries": len(corpus.heads), "candidates": corpus.candidates}


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


def card_section(reports: dict[str, dict]) -> str:
    """Markdown for the model card: each relation's recipe and its whole-corpus comparison."""
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
    return "\n".join(lines) + "\n"
