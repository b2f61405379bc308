"""``relsearch bench linkpred``: rank each test triple's gold answer among all candidates (design.md §5).

For every test triple (h, r, t) the query is h's raw vector and the gold answer t is ranked among
*all* candidates — an index's documents or a candidate file's texts, matched to the triple by
exact text — never only among test tails. Each triple is scored by

- ``bm25``: BM25 of the query text over the candidate texts (lexical baseline);
- ``identity``: cos(h, t), plain semantic similarity;
- ``relation``: cos(op_r(h), t) with the operator named by the triple's ``relation`` field, or
  each operator given with ``--relation`` (then applied to every triple);
- ``hybrid``: that own operator's ranking fused with BM25's by RRF (retrieval/hybrid.py, as
  ``relsearch query --hybrid``), and ``hybrid-w<W>`` for each ``--hybrid-weight W``: their
  weighted fusion (``--hybrid weighted --hybrid-weight W``). Choose W on a dev split, not on test;
- ``recipe``: the own relation as ``--relation NAME`` runs it, its stored recipe
  (retrieval/recipe.py: the operator mixed with identity, fused with BM25; metadata bonuses left
  out, triples have no metadata), when the bundle stores recipes.

Two settings side by side. *Filtered*: every other known true answer of (h, r) — from the
``--known`` files and the test file — is removed, and ranks are *realistic* (expectation under
random tie-breaking; BM25's zero scores tie a lot). *Raw*: nothing filtered, *optimistic* ranks
(RSE's protocol). In both, candidates whose text is the query's are excluded (the query itself)
and so are other copies of the gold text (a duplicated document is not a competitor).

Head prediction (``both_directions``) asks (?, r, t) with the operator named ``<r>^-1`` when the
bundle has one (``relsearch train --inverse`` trains it on reversed triples, for every regime);
otherwise the operator's kind gives its inverse where it has one (encoder/kinds.py ``Kind.inverse``:
translation operators use normalize(h_t − r)) and other kinds report the direction as unavailable.
``both_directions=None`` (the default) predicts heads too when the bundle has ``<r>^-1`` for every
relation scored (it was trained with ``--inverse``): knowledge-graph papers report the
mean of both directions. Rows ``mean`` average the two; ``summary`` holds, per method, the overall
filtered figures with uniform keys: ``mrr_tail``, ``mrr_head`` and ``mrr`` (their mean; the tail's
alone when only tails are predicted), likewise ``mr`` and ``hits@1/3/10``.
Query encoders (kind ``encoder``) read the query text through their tower. Gold
answers missing from the candidates are an error unless
``skip_missing``, which counts them per relation and leaves them out.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field, replace

import numpy as np

from ..encoder.bundle import Bundle, load_bundle
from ..encoder.kinds import INVERTIBLE, kind_of
from ..encoder.relations import Operator, lookup, normalize
from ..retrieval.hybrid import check as check_fusion
from ..retrieval.hybrid import rrf_matrix, weighted_matrix
from ..retrieval import prior as answer_prior
from ..retrieval.graph import Graph, of_bundle
from ..retrieval.recipe import TITLE, Recipe, check_recipes, first_line, recipe_of, score_matrix, title_vectors
from ..indexer.lexical import BM25
from ..encoder.metrics import METRIC_KEYS, Ranks, rank_gold, ranking_metrics
from ..files import sha256_file
from .report import BenchInputError, BenchResult, Table, file_fingerprint, finish, read_jsonl

BASELINES = ("bm25", "identity")
OWN = "relation"  # method label: each triple's own relation operator
HYBRID = "hybrid"  # each triple's own operator fused with BM25 by RRF, as `relsearch query --hybrid` does
WEIGHTED = "hybrid-w"  # + W: the same two fused by weighted scores, `--hybrid weighted --hybrid-weight W`
RECIPE = "recipe"  # each triple's own relation as `--relation NAME` runs it: its stored recipe (retrieval/recipe.py)
DIRECTIONS = ("tail", "head")
PROTOCOL = {
    "filtered": "other known true answers of (query, relation) from --known files and the test file removed; "
                "realistic ranks (expectation under uniform random tie-breaking)",
    "raw": "nothing filtered; optimistic ranks (ties counted in the gold's favour), RSE's protocol",
    "both": "candidates = every indexed document / candidate text, matched by exact text; the query's own "
            "text and other copies of the gold text are excluded; overall = mean over all triples (micro)",
}


@dataclass(frozen=True, kw_only=True)
class LinkPredJob:
    """One link-prediction run. Exactly one of ``index`` / ``candidates``."""

    test: str
    index: str | None = None
    candidates: str | None = None  # JSONL with ``text_field`` or plain text, one candidate per line
    known: tuple[str, ...] = ()
    relations: tuple[str, ...] = ()  # () → each triple's own relation operator
    model: str | None = None  # bundle (default: the index's bundle, else the default relation pack)
    both_directions: bool | None = None  # None: both when the bundle has "<r>^-1" for every relation scored
    skip_missing: bool = False
    text_field: str = "text"
    cache_dir: str | None = None  # vector cache for --candidates (default: encoder.training's)
    precision: str = "auto"  # encoder precision: auto | fp32 | bf16 | fp16
    progress: bool = False
    chunk: int = 256  # queries per score matrix
    fusion_weights: tuple[float, ...] = ()  # also report weighted fusion with each of these relational weights


# ---------------------------------------------------------------- shared by the benchmark runners

_ENCODERS: dict = {}


def raw_vectors(bundle: Bundle, texts: list[str], *, cache_dir: str | None = None, progress: bool = False,
                precision: str = "auto") -> np.ndarray:
    """(n, d) raw pooled vectors of ``texts`` with the bundle's encoder, through the on-disk vector cache.

    16-bit precisions (``auto`` picks bf16 on CPUs with AMX) make a vector depend slightly on which
    texts share its batch; ``fp32`` gives batch-independent vectors (and its own cache entries).
    """
    from ..encoder.model import Encoder
    from ..encoder.training import encode_cached

    config = bundle.encoder_config(precision=precision)
    if config not in _ENCODERS:  # one model per process: the suite runs many benchmarks on one encoder
        _ENCODERS[config] = Encoder(config)
    return encode_cached(_ENCODERS[config], list(texts), cache_dir=cache_dir, progress=progress)


def read_texts(path: str, text_field: str = "text") -> list[str]:
    """Candidate texts: JSONL objects with ``text_field`` (when the file starts with ``{``) or lines of text."""
    with open(path, encoding="utf-8") as f:
        first = f.readline().lstrip()
    if first.startswith("{"):
        rows = read_jsonl(path)
        bad = [i for i, r in enumerate(rows, 1) if not isinstance(r.get(text_field), str) or not r[text_field].strip()]
        if bad:
            raise BenchInputError(f"{path}: {len(bad)} record(s) lack a non-empty {text_field!r} field "
                                  f"(e.g. record {bad[0]})")
        return [r[text_field] for r in rows]
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def read_triples(path: str) -> list[dict]:
    rows = read_jsonl(path)
    for n, t in enumerate(rows, 1):
        for key in ("head", "relation", "tail"):
            if not isinstance(t.get(key), str) or not t[key]:
                raise BenchInputError(f"{path}: triple {n} lacks a non-empty string {key!r}")
    if not rows:
        raise BenchInputError(f"{path}: no triples")
    return rows


def operator_for(operators: dict[str, Operator], name: str, direction: str) -> Operator | None:
    """The operator answering ``name`` in ``direction`` ("tail" or "head"), None when there is none:
    for heads, the bundle's ``<name>^-1``, else the inverse its kind gives (encoder/kinds.py)."""
    op = lookup(operators, name)
    kind = kind_of(op.kind)
    if direction == "tail" or kind.plain:  # plain cosine is symmetric: heads are asked as tails are
        return op
    if f"{name}^-1" in operators:  # trained on reversed triples (relsearch train --inverse)
        return operators[f"{name}^-1"]
    if kind.inverse is not None:
        return Operator(name=f"{name}^-1", kind=op.kind, params=kind.inverse(op.params))
    return None


# ---------------------------------------------------------------- candidates

@dataclass
class Candidates:
    """``texts`` (n_c) and unit vectors (n_c, d); ``raw`` maps every query text, and every query
    title (first line: retrieval/recipe.py), to its raw vector."""

    texts: list[str]
    unit: np.ndarray
    raw: dict[str, np.ndarray]
    bundle: Bundle
    inputs: dict
    applied: dict = field(default_factory=dict)  # (query encoder, query text) → its vector; ("@prior", op) → its prior

    def query_vectors(self, op: Operator, queries: list[str]) -> np.ndarray:
        """``op`` applied to each query's raw vector. A query encoder (a tower: a transformer pass
        per text) runs once per distinct query over the whole evaluation, not once per method and
        per triple: the own, hybrid and recipe rows score the same tower vectors."""
        if not op.needs_text:
            return op.apply(np.stack([self.raw[q] for q in queries]), queries)
        new = list(dict.fromkeys(q for q in queries if (op.name, q) not in self.applied))
        if new:
            self.applied.update(zip(((op.name, q) for q in new), op.apply(np.stack([self.raw[q] for q in new]), new)))
        return np.stack([self.applied[op.name, q] for q in queries])

    def prior(self, name: str) -> np.ndarray:
        """Operator ``name``'s answer prior of every candidate (retrieval/prior.py), hashed once."""
        if ("@prior", name) not in self.applied:
            self.applied["@prior", name] = answer_prior.scores(self.bundle.operators[name], self.texts)
        return self.applied["@prior", name]

    def graph(self) -> Graph:
        """The bundle's training graph (retrieval/graph.py), parsed once (load_candidates checked that a
        recipe reading it finds it)."""
        if "@graph" not in self.applied:
            self.applied["@graph"] = of_bundle(self.bundle)
        return self.applied["@graph"]


def load_candidates(job: LinkPredJob, query_texts) -> Candidates:
    """The candidates and the raw vectors of ``query_texts`` (a list, or a function of the bundle
    that returns it: which texts are queries may depend on the operators it has)."""
    if (job.index is None) == (job.candidates is None):
        raise BenchInputError("give exactly one of --index DIR or --candidates FILE")

    def query_list(bundle: Bundle) -> list[str]:
        texts = query_texts(bundle) if callable(query_texts) else query_texts
        return list(dict.fromkeys([*texts, *filter(None, map(first_line, texts))]))

    if job.index is not None:
        from ..retrieval.search import Query, Searcher

        searcher = Searcher(job.index, job.model, precision=job.precision)
        searcher.reads_text(searcher.operators)  # query encoders get their towers on the index's encoder
        queries = query_list(searcher.bundle)
        files = searcher.files
        n = files.docstore.count()
        docs = files.docstore.get(list(range(n)))
        # a query that is an indexed document's text uses its stored vector, as `query --id` does, so
        # every method ranks as the index answers that document (recipes to 1e-4: test_bench.py)
        stored = {docs[p]["text"]: docs[p]["id"] for p in sorted(docs, reverse=True)}  # the first copy wins
        asked = [Query(doc_id=stored[t]) if t in stored else Query(text=t) for t in queries]
        raw = searcher.raw_vectors(asked) if queries else np.zeros((0, files.manifest.dim))
        inputs = {"index": {"path": str(files.root), "sha256": sha256_file(files.root / "manifest.json"),
                            "corpus_sha256": (files.manifest.input or {}).get("sha256")}}
        return Candidates([docs[p]["text"] for p in range(n)], np.asarray(files.vectors, dtype=np.float32),
                          dict(zip(queries, raw)), searcher.bundle, inputs)
    bundle = load_bundle(job.model)
    try:  # a recipe that reads a prior or a graph the bundle lacks: one line, before any encoding
        check_recipes(bundle)
    except ValueError as e:
        raise BenchInputError(f"model {job.model}: {e}") from None
    queries = query_list(bundle)
    texts = read_texts(job.candidates, job.text_field)
    distinct = list(dict.fromkeys(texts + queries))
    vecs = raw_vectors(bundle, distinct, cache_dir=job.cache_dir, progress=job.progress, precision=job.precision)
    if any(op.needs_text for op in bundle.operators.values()):
        from ..encoder.tower import attach_towers

        attach_towers(bundle.operators, _ENCODERS[bundle.encoder_config(precision=job.precision)])
    by_text = dict(zip(distinct, vecs))
    unit = normalize(np.stack([by_text[t] for t in texts])) if texts else np.zeros((0, vecs.shape[1]), np.float32)
    return Candidates(texts, unit, by_text, bundle, {"candidates": file_fingerprint(job.candidates)})


# ---------------------------------------------------------------- ranking

@dataclass(frozen=True)
class _Item:
    relation: str
    query: str
    gold: str
    known: frozenset  # every known true answer text of (query, relation)


def _items(test: list[dict], known: list[dict], direction: str) -> list[_Item]:
    q, a = ("head", "tail") if direction == "tail" else ("tail", "head")
    answers = defaultdict(set)
    for t in known + test:
        answers[(t[q], t["relation"])].add(t[a])
    return [_Item(t["relation"], t[q], t[a], frozenset(answers[(t[q], t["relation"])])) for t in test]


def _masks(items: list[_Item], columns: dict[str, list[int]], n_c: int):
    """(gold (n,), exclude (n, n_c), filtered (n, n_c)) for items whose gold is among the candidates."""
    gold = np.array([columns[it.gold][0] for it in items], dtype=np.int64)
    exclude = np.zeros((len(items), n_c), dtype=bool)
    filt = np.zeros((len(items), n_c), dtype=bool)
    for row, it in enumerate(items):
        exclude[row, columns.get(it.query, [])] = True
        exclude[row, columns[it.gold][1:]] = True  # other copies of the gold text
        for other in it.known - {it.gold}:
            filt[row, columns.get(other, [])] = True
    return gold, exclude, filt


def _scores(method: str, items: list[_Item], cands: Candidates, bm25: BM25, op: Operator | None,
            exclude: np.ndarray) -> np.ndarray:
    if method == "bm25":
        return bm25.scores([it.query for it in items])
    h = np.stack([cands.raw[it.query] for it in items])
    dense = cands.query_vectors(op, [it.query for it in items]) @ op.documents(cands.unit).T
    # the excluded candidates leave both lists, as `query --id` leaves out its own document
    if method == HYBRID:
        return rrf_matrix(dense, bm25.scores([it.query for it in items]), exclude=exclude)
    if method.startswith(WEIGHTED):
        return weighted_matrix(dense, bm25.scores([it.query for it in items]), float(method[len(WEIGHTED):]),
                               exclude=exclude)
    if method == RECIPE:  # metadata bonuses need an index's metadata: triples have none
        recipe = replace(recipe_of(op) or Recipe(mixture={op.name: 1.0}), same={})
        parts = {op.name: dense, "identity": normalize(h) @ cands.unit.T}
        if recipe.title:
            titles = title_vectors(lambda texts: np.stack([cands.raw[t] for t in texts]), [it.query for it in items], h)
            parts[TITLE] = titles @ cands.unit.T
        lexical = bm25.scores([it.query for it in items]) if recipe.bm25 else None
        tables = {"prior": {name: cands.prior(name) for name in recipe.prior},  # no names in triples: no prominence
                  "unanswered": {name: (cands.prior(name) == 0).astype(np.float32) for name in recipe.unanswered}}
        if recipe.neighbours:
            tables["neighbours"] = cands.graph().linked([it.query for it in items], cands.texts)
        return score_matrix(recipe, parts, lexical, tables, exclude)
    return dense


def _own(method: str) -> bool:
    """Whether ``method`` scores each triple with its own relation's operator."""
    return method in (OWN, HYBRID, RECIPE) or method.startswith(WEIGHTED)


def _rank(method, items, cands, bm25, op, columns, chunk) -> tuple[Ranks, Ranks]:
    filtered, raw = [], []
    for start in range(0, len(items), chunk):
        part = items[start:start + chunk]
        gold, exclude, filt = _masks(part, columns, len(cands.texts))
        scores = _scores(method, part, cands, bm25, op, exclude)
        filtered.append(rank_gold(scores, gold, filter_mask=filt, exclude=exclude))
        raw.append(rank_gold(scores, gold, exclude=exclude))
    return Ranks.concat(filtered), Ranks.concat(raw)


def _metrics(pair: tuple[Ranks, Ranks]) -> dict:
    return {"filtered": ranking_metrics(pair[0], "realistic"), "raw": ranking_metrics(pair[1], "optimistic")}


def _mean(a: dict, b: dict) -> dict:
    return {s: {k: (a[s][k] + b[s][k]) / 2 for k in METRIC_KEYS} for s in ("filtered", "raw")}


def inverse_trained(bundle: Bundle, test: list[dict], relations: tuple[str, ...] = ()) -> bool:
    """Whether the bundle has ``<r>^-1`` for every relation scored (``relations``, else the triples' own):
    it was trained with ``--inverse``, so head prediction is what it was trained for too."""
    names = relations or {t["relation"] for t in test}
    return bool(names) and all(f"{n}^-1" in bundle.operators for n in names)


def summary(rows: list[dict], methods: list[str], directions: tuple[str, ...]) -> dict[str, dict]:
    """Per method, the overall filtered (realistic) figures: ``<key>_tail``, ``<key>_head`` and ``<key>``,
    their mean, for every metric key. Tail prediction only: ``<key>`` is the tail's and no ``_head`` keys;
    a direction unavailable to the method (no ``r^-1``): its keys and the mean are None."""
    overall = {(r["direction"], r["method"]): r for r in rows if r["relation"] == "overall"}
    out = {}
    for method in methods:
        entry: dict = {}
        figures = {}
        for side in directions:
            row = overall[(side, method)]
            figures[side] = row["filtered"] if row["available"] else None
            entry[f"queries_{side}"] = row["queries"]
            entry.update({f"{k}_{side}": figures[side][k] if figures[side] else None for k in METRIC_KEYS})
        both = all(figures.values())
        entry.update({k: sum(f[k] for f in figures.values()) / len(figures) if both else None for k in METRIC_KEYS})
        out[method] = entry
    return out


def evaluate(test: list[dict], known: list[dict], cands: Candidates, methods: list[str], *,
             directions=("tail",), skip_missing: bool = False, chunk: int = 256) -> dict:
    """Rows of metrics per (direction, relation incl. "overall", method) plus counts; see module doc."""
    columns: dict[str, list[int]] = defaultdict(list)
    for col, text in enumerate(cands.texts):
        columns[text].append(col)
    bm25 = BM25(cands.texts)
    relations = sorted({t["relation"] for t in test})
    rows, missing = [], {}
    for direction in directions:
        items = _items(test, known, direction)
        lost = [it for it in items if it.gold not in columns]
        if lost and not skip_missing:
            raise BenchInputError(
                f"{len(lost)} of {len(items)} gold {'tails' if direction == 'tail' else 'heads'} are not among the "
                f"{len(cands.texts)} candidates (matched by exact text), e.g. {lost[0].gold[:80]!r}; add them to the "
                f"candidates or pass --skip-missing to count and skip them")
        missing[direction] = {r: sum(it.relation == r for it in lost) for r in relations}
        items = [it for it in items if it.gold in columns]
        for method in methods:
            rows += _method_rows(method, direction, items, relations, missing[direction],
                                 _Ranking(cands, bm25, columns, chunk))
    if len(directions) == 2:
        rows += _mean_rows(rows, relations, methods)
    place = [{key: i for i, key in enumerate(keys)} for keys in ([*DIRECTIONS, "mean"], [*relations, "overall"], methods)]
    rows.sort(key=lambda r: (place[0][r["direction"]], place[1][r["relation"]], place[2][r["method"]]))
    return {"rows": rows, "counts": {"triples": len(test), "known_triples": len(known),
                                     "candidates": len(cands.texts), "distinct_candidate_texts": len(columns),
                                     "missing": missing}}


@dataclass(frozen=True)
class _Ranking:
    """What ranks a group of items: the candidates, their BM25 index, each text's columns, the chunk size."""

    cands: Candidates
    bm25: BM25
    columns: dict[str, list[int]]
    chunk: int


def _method_rows(method: str, direction: str, items: list, relations: list[str], missing: dict[str, int],
                 ranking: _Ranking) -> list[dict]:
    """``method``'s rows in ``direction``: one per relation, then "overall" (unavailable when some
    relation's operator has no inverse for head prediction)."""
    rows, collected = [], []
    for rel in relations:
        group = [it for it in items if it.relation == rel]
        op_name = rel if _own(method) else method
        op = None if method == "bm25" else operator_for(ranking.cands.bundle.operators, op_name, direction)
        row = {"direction": direction, "relation": rel, "method": method,
               "operator": None if method == "bm25" else op_name, "queries": len(group), "missing": missing[rel]}
        if method != "bm25" and op is None:
            kind = lookup(ranking.cands.bundle.operators, op_name).kind
            rows.append(dict(row, available=False, reason=f"no inverse of {op_name!r}: its kind {kind} has none "
                             f"(kinds with one: {', '.join(INVERTIBLE)}) and the bundle has no operator "
                             f"{op_name + '^-1'!r}"))
            collected = None
            continue
        pair = _rank(method, group, ranking.cands, ranking.bm25, op, ranking.columns, ranking.chunk)
        rows.append(dict(row, available=True, **_metrics(pair)))
        if collected is not None:
            collected.append(pair)
    overall = {"direction": direction, "relation": "overall", "method": method,
               "operator": None if _own(method) else method, "queries": len(items), "missing": sum(missing.values())}
    if collected is None:
        rows.append(dict(overall, available=False, reason="unavailable for some relation"))
    else:
        pair = (Ranks.concat([p[0] for p in collected]), Ranks.concat([p[1] for p in collected]))
        rows.append(dict(overall, available=True, **_metrics(pair)))
    return rows


def _mean_rows(rows: list[dict], relations: list[str], methods: list[str]) -> list[dict]:
    """The "mean" direction's rows: each relation's (and overall) tail and head metrics averaged."""
    by_key = {(r["direction"], r["relation"], r["method"]): r for r in rows}
    means = []
    for rel in relations + ["overall"]:
        for method in methods:
            a, b = by_key[("tail", rel, method)], by_key[("head", rel, method)]
            row = {"direction": "mean", "relation": rel, "method": method, "operator": a["operator"],
                   "queries": a["queries"] + b["queries"], "missing": a["missing"] + b["missing"]}
            if a["available"] and b["available"]:
                means.append(dict(row, available=True, **_mean(a, b)))
            else:
                means.append(dict(row, available=False, reason="head prediction unavailable"))
    return means


# ---------------------------------------------------------------- tables and the command

def table(rows: list[dict], title: str) -> Table:
    """One line per (relation, method): filtered (realistic) | raw (optimistic) metrics, gain over identity."""
    cols = ["dir", "relation", "method", "n", "MRR", "MR", "H@1", "H@3", "H@10", "ΔMRR id",
            "raw MRR", "raw MR", "raw H@1", "raw H@3", "raw H@10"]
    ident = {(r["direction"], r["relation"]): r for r in rows if r["method"] == "identity" and r["available"]}
    out = []
    for r in rows:
        label = r["operator"] if r["method"] == OWN and r["operator"] else r["method"]
        head = [r["direction"], r["relation"], label, r["queries"]]
        if not r["available"]:
            out.append(head + ["unavailable"] + [None] * 10)
            continue
        f, w = r["filtered"], r["raw"]
        base = ident.get((r["direction"], r["relation"]))
        gain = f["mrr"] - base["filtered"]["mrr"] if base and r["method"] != "identity" else None
        out.append(head + [f["mrr"], f["mr"], f["hits@1"], f["hits@3"], f["hits@10"], gain,
                           w["mrr"], w["mr"], w["hits@1"], w["hits@3"], w["hits@10"]])
    return Table(title, cols, out, note="MRR…H@10: filtered, realistic ranks; raw …: unfiltered, optimistic ranks; "
                                        "ΔMRR id: filtered MRR minus identity's.")


def summary_table(summ: dict[str, dict], title: str) -> Table:
    """One line per method: MRR of tail and head prediction and their mean, then Hits@1/3/10 the same way."""
    keys = ("mrr", "hits@1", "hits@3", "hits@10")
    cols = ["method", "n tail", "n head"] + [f"{name} {side}" for name in ("MRR", "H@1", "H@3", "H@10")
                                             for side in ("tail", "head", "mean")]
    out = [[m, e["queries_tail"], e.get("queries_head")]
           + [v for k in keys for v in (e[f"{k}_tail"], e.get(f"{k}_head"), e[k] if "queries_head" in e else None)]
           for m, e in summ.items()]
    return Table(title, cols, out, note="filtered, realistic ranks; head = (?, r, t) through r^-1 from the tail; "
                                        "mean = (tail + head) / 2, as knowledge-graph papers report it; "
                                        "– = not predicted or no r^-1.")


def methods_for(job: LinkPredJob, bundle: Bundle, test: list[dict]) -> list[str]:
    """bm25, identity, then each --relation, or the triples' own operators (checked to exist) and their
    fusion with BM25 (RRF, then weighted with each of ``job.fusion_weights``)."""
    for name in job.relations:
        lookup(bundle.operators, name)
    for weight in job.fusion_weights:
        try:
            check_fusion("weighted", weight)
        except ValueError as e:
            raise BenchInputError(str(e)) from None
    if job.relations and job.fusion_weights:
        raise BenchInputError("--hybrid-weight fuses the triples' own operators with BM25; leave out --relation")
    if job.relations:
        return list(dict.fromkeys([*BASELINES, *job.relations]))
    absent = sorted({t["relation"] for t in test} - set(bundle.operators))
    if absent:
        raise BenchInputError(f"the triples use relation(s) the bundle lacks: {', '.join(absent)}; available: "
                              f"{', '.join(sorted(bundle.operators))}; pick operators with --relation NAME")
    recipes = [RECIPE] if any(recipe_of(bundle.operators[t["relation"]]) for t in test) else []
    return [*BASELINES, OWN, *recipes, HYBRID, *dict.fromkeys(f"{WEIGHTED}{w:g}" for w in job.fusion_weights)]


def run_linkpred(job: LinkPredJob, *, json_out: str | None = None, plot_out: str | None = None,
                 command: str | None = None, clock=time.perf_counter) -> BenchResult:
    """Read, encode, rank, tabulate; write ``json_out`` and ``plot_out`` when given."""
    started = clock()
    test = read_triples(job.test)
    known = [t for path in job.known for t in read_triples(path)]
    chosen: dict[str, tuple[str, ...]] = {}

    def queries(bundle: Bundle) -> list[str]:  # heads, and tails when heads are predicted too
        both = job.both_directions
        if both is None:
            both = inverse_trained(bundle, test, job.relations)
        chosen["directions"] = DIRECTIONS if both else ("tail",)
        return [t[side] for t in test for side in ("head", "tail")[:len(chosen["directions"])]]

    cands = load_candidates(job, queries)
    directions = chosen["directions"]
    methods = methods_for(job, cands.bundle, test)
    result = evaluate(test, known, cands, methods, directions=directions, skip_missing=job.skip_missing,
                      chunk=job.chunk)
    summ = summary(result["rows"], methods, directions)
    inputs = {"test": file_fingerprint(job.test), "known": [file_fingerprint(p) for p in job.known], **cands.inputs}
    payload = {"protocol": PROTOCOL, "methods": methods, "directions": list(directions), "summary": summ, **result}
    tables = [table(result["rows"], f"link prediction: {job.test}"),
              summary_table(summ, "overall, " + ("tail and head prediction and their mean"
                                                 if len(directions) == 2 else "tail prediction only"))]
    res = finish("linkpred", payload, tables, inputs=inputs, bundle=cands.bundle, command=command, started=started,
                 clock=clock, json_out=json_out, precision=job.precision)
    if plot_out:
        from . import plots

        sample = np.stack(list(cands.raw.values())[:2000])
        plots.linkpred_figure(result["rows"], cands.bundle.operators, sample, plot_out)
        res.plot = plot_out
    return res
