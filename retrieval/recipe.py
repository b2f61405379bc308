"""A relation's recipe: what ``--relation NAME`` runs, chosen on dev at training time (design.md §3).

A query-side operator on frozen embeddings learns its training label and loses the fine-grained
similarity that plain cosine and BM25 keep, so a trained relation is stored with the way of using
it that won on its dev split, by whole-corpus retrieval:

    score(d) = (1 − b) · minmax(dense)(d) + b · minmax(bm25)(d) + Σ_f bonus_f · [d.f = q.f]
               + Σ_R w_R · prior_R(d) + Σ_R u_R · [prior_R(d) = 0]
               + w_g · [d linked to q in training] + w_p · p(q) · p(d)
               + Σ_f w_m,f · [q's texts name d, or d's name q, and d.f = q.f]

- dense = ⟨Σ_k w_k normalize(op_k(h)) + w_title · normalize(enc(title)), t̂⟩: the operator mixed
  with identity (``mixture``), one query vector and one ANN search, as any relation mixture
  (design.md §3), plus optionally the query's *title* — its first line, as forum questions are
  "title\nbody": the title says what is asked, the body mostly how it came up, and that view is
  what carried over between forums (docs/results.md, "Transfer to other datasets"); a one-line query is
  its own title, so the share then changes nothing;
- bm25 on the query text, fused by min-max normalised scores with BM25 share ``b``
  (retrieval/hybrid.py's ``weighted`` fusion: each list's top ``depth``, 0 outside a list);
- a bonus per metadata field a hit shares with the query document (``same``: only ``--id``
  queries have metadata; a text query gets none), e.g. the same GICS sub-industry as a weak prior;
- an answer prior per relation (retrieval/prior.py): how often d answered R in training, for
  relations trained on triples whose answers recur (a knowledge graph's "occupation": "actor");
- a bonus for each candidate training never gave as an answer of R (``unanswered``, the same
  table): most entities have one birthplace, so the one still without is the likelier answer;
- a bonus for each candidate that a training triple links to the query (retrieval/graph.py:
  SimKGC's neighbour re-ranking), for relations trained on a knowledge graph;
- prominence p: how much the corpus itself says of d (indexer/mining.py: how many other texts name
  it, how much text it has), in [0, 1], times as much of the query document q, so that a major's
  rivals everyone names are not outranked by small firms that share its label, while a small firm's
  list is not filled with majors; mined from the index's own texts (an ``--id`` query's: a text
  query has no q);
- mentions: a bonus for each candidate that the query document's texts name, or whose texts name
  it (less when a smaller firm names a larger: indexer/mining.py, the same names), within a metadata
  field the two share (a rival named on a company's own pages in its industry, not its supplier or
  shareholder in another).

These five additive parts are components registered in one table (retrieval/parts.py ``PARTS``):
the code here and in plan.py and recipe_search.py loops over it.

Candidates are the dense list's top ``depth`` and, when b > 0, BM25's: fusion and bonuses only
reorder this bounded list. The recipe is stored in the operator's bundle entry
(``info["recipe"]``); :func:`choose` searches its weights on dev, :func:`score_matrix` scores a
whole candidate table the way :func:`search` scores an index, so dev, test and the index agree.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace

import numpy as np

from ..encoder.metrics import Ranks, linkpred_metrics, rank_gold, reciprocal_ranks
from ..encoder.relations import normalize
from . import hybrid
from . import prior as answer_prior
from .graph import Graph, of_bundle
from .parts import PARTS, Part

DEPTH = hybrid.HYBRID_DEPTH
MIXES = (1.0, 0.75, 0.5, 0.25, 0.0)  # the operator's share of the dense query vector (the rest: identity)
TITLE_SHARES = (0.0, 0.25, 0.5, 1.0)  # the query title's weight beside the mixture (when queries have one)
TITLE = "@title"  # the dense tables' key of the query-title cosines (no relation name starts with "@")
BM25_SHARES = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7)
MIN_DEV_QUERIES = 10  # fewer dev queries than this: no recipe beats the operator alone (noise_margin)
MAX_DEPTH = 10_000  # candidates per list (MAX_K)
MAX_FIELDS = 64  # mixture operators / keys of one keyed part (bonus fields, priors) of one recipe
MAX_RECIPE_WEIGHT = 1e3  # |mixture weight|, title weight
MAX_SWEEPS = 5  # choose's sweeps over every part's keys after the first pass, until one changes nothing
DEEPER = 10  # choose tries a recipe with additive parts once more with a pool this many times deeper
MAX_BONUS = 10.0  # a bonus past this outweighs every fused score many times: no dev search picks it


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """``mixture``: operator → weight of the dense query vector; ``bm25``: BM25's share in [0, 1];
    ``same``: metadata field → bonus for sharing the query document's value; ``prior``: operator →
    weight of its answer prior (retrieval/prior.py); ``unanswered``: operator → bonus for a candidate
    training never gave as its answer (the same table); ``neighbours``: bonus for a candidate the
    bundle's training graph links to the query (retrieval/graph.py); ``prominence``: weight of a
    candidate's prominence in the corpus times the query document's (indexer/mining.py); ``mentions``: metadata field → bonus for a
    candidate the query document's texts name or that names it (indexer/mining.py) and that shares the
    query's value of the field; ``title``: weight of the query's
    title (first line) vector beside the mixture; ``depth``: candidates taken from each list. The
    additive parts (``same`` … ``mentions``) are declared in retrieval/parts.py's table, in this order."""

    mixture: dict[str, float]
    bm25: float = 0.0
    title: float = 0.0
    same: dict[str, float] = field(default_factory=dict)
    prior: dict[str, float] = field(default_factory=dict)
    unanswered: dict[str, float] = field(default_factory=dict)
    neighbours: float = 0.0
    prominence: float = 0.0
    mentions: dict[str, float] = field(default_factory=dict)
    depth: int = DEPTH

    def __post_init__(self):
        # bounds checked once, when a bundle's recipe is read: a weight of 1e308 makes scores inf
        # (invalid JSON), a fractional depth breaks the search, 10⁵ bonus fields cost a second a query
        parts = [(part, part.weights(self)) for part in PARTS.values()]
        weights = [*self.mixture.values(), self.bm25, self.title, *(w for _, ws in parts for w in ws.values())]
        if not self.mixture or not all(isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w)
                                       for w in weights):
            raise ValueError(f"a recipe needs finite numeric weights, got {_short(self.to_json())}")
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or not 1 <= self.depth <= MAX_DEPTH:
            raise ValueError(f"depth must be an integer in [1, {MAX_DEPTH}], got {self.depth!r}")
        sizes = {"mixture": len(self.mixture), **{part.name: len(ws) for part, ws in parts if part.keyed}}
        big = [name for name, size in sizes.items() if size > MAX_FIELDS]
        if big:
            raise ValueError(f"{big[0]} has {sizes[big[0]]} entries: at most {MAX_FIELDS} in each of {', '.join(sizes)}")
        if any(abs(w) > MAX_RECIPE_WEIGHT for w in self.mixture.values()) or not any(self.mixture.values()):
            raise ValueError(f"mixture weights must be within ±{MAX_RECIPE_WEIGHT:g}, not all zero; "
                             f"got {_short(self.mixture)}")
        if not 0.0 <= self.bm25 <= 1.0:
            raise ValueError(f"bm25 share must be in [0, 1], got {self.bm25!r}")
        if not 0.0 <= self.title <= MAX_RECIPE_WEIGHT:
            raise ValueError(f"title weight must be in [0, {MAX_RECIPE_WEIGHT:g}], got {self.title!r}")
        for part, ws in parts:
            if not all(0.0 <= w <= MAX_BONUS for w in ws.values()):
                value = getattr(self, part.name)
                raise ValueError(f"{part.what} must be in [0, {MAX_BONUS:g}], got "
                                 f"{_short(value) if part.keyed else repr(value)}")

    @property
    def reorders(self) -> bool:
        """Whether anything beside the dense vector ranks: BM25, the title, a bonus or a prior."""
        return bool(self.bm25 or self.title or self.adds)

    @property
    def adds(self) -> bool:
        """Whether the recipe adds scores to pooled candidates (any part of retrieval/parts.py): rank fusion cannot."""
        return any(w for part in PARTS.values() for w in part.weights(self).values())

    def alone(self, name: str) -> bool:
        """True when the recipe ranks as operator ``name`` alone: nothing to mix, fuse or re-order.
        (A recipe of identity alone, what dev chooses when the operator never helps, is not.)"""
        return set(self.mixture) == {name} and not self.reorders

    def to_json(self) -> dict:
        return {"mixture": self.mixture, "bm25": self.bm25, "title": self.title,
                **{name: getattr(self, name) for name in PARTS}, "depth": self.depth}

    @classmethod
    def from_json(cls, entry, where: str = "recipe") -> Recipe:
        """A recipe from a bundle's ``recipe`` entry; ValueError naming ``where`` when malformed."""
        try:
            if not isinstance(entry, dict) or not isinstance(entry.get("mixture"), dict) \
                    or any(part.keyed and not isinstance(entry.get(name, {}), dict) for name, part in PARTS.items()):
                raise ValueError("not an object with a mixture")
            unknown = set(entry) - {"mixture", "bm25", "title", "depth", *PARTS}
            if unknown:
                raise ValueError(f"unknown key {sorted(unknown)[0][:40]!r}")
            parts = {name: {str(k): v for k, v in entry.get(name, {}).items()} if part.keyed else entry.get(name, 0.0)
                     for name, part in PARTS.items()}
            return cls(mixture={str(k): v for k, v in entry["mixture"].items()}, bm25=entry.get("bm25", 0.0),
                       title=entry.get("title", 0.0), depth=entry.get("depth", DEPTH), **parts)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{where}: malformed recipe ({e})") from None

    def describe(self) -> str:
        parts = [" + ".join([f"{w:g}·{name}" for name, w in self.mixture.items()]
                            + ([f"{self.title:g}·title"] if self.title else []))]
        if self.bm25:
            parts = [f"{1 - self.bm25:g}·minmax({parts[0]}) + {self.bm25:g}·minmax(bm25)"]
        described = " + ".join(parts + [part.describe(key, w) for part in PARTS.values()
                                        for key, w in part.weights(self).items() if w])
        return described if self.depth == DEPTH else f"{described} (pool {self.depth})"


def first_line(text: str) -> str | None:
    """A multi-line text's first non-blank line (a forum question's title), stripped; None when
    the text has no other non-blank line (it is its own title)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if len(lines) > 1 else None


def title_vectors(encode, texts: list[str], h: np.ndarray) -> np.ndarray:
    """(n, d) unit vectors of each text's title: ``encode`` (texts → raw vectors) of its first line,
    or its own raw vector ``h`` (n, d) when it has one line (nothing encoded twice)."""
    out = normalize(h)
    lines = [first_line(t) for t in texts]
    rows = [i for i, line in enumerate(lines) if line is not None]
    if rows:
        out[rows] = normalize(encode([lines[i] for i in rows]))
    return out


_PARSED: dict[int, tuple[object, Recipe | None]] = {}  # id(info) → (info, its recipe): parsed once per bundle


def recipe_of(operator) -> Recipe | None:
    """The recipe stored with ``operator`` (its bundle entry), or None; parsed once per operator."""
    info = operator.info
    cached = _PARSED.get(id(info))
    if cached is not None and cached[0] is info:
        return cached[1]
    entry = info.get("recipe")
    recipe = None if entry is None else Recipe.from_json(entry, f"relation {operator.name!r}")
    if len(_PARSED) > 4096:  # bundles opened and dropped in a long process: keep the cache bounded
        _PARSED.clear()
    _PARSED[id(info)] = (info, recipe)
    return recipe


def check_recipes(bundle) -> Graph | None:
    """Every stored recipe of ``bundle`` parses and names operators that exist, and its training
    graph (retrieval/graph.py) is well formed and there when a recipe reads it: the check made once,
    when a bundle is opened for search (each part's :meth:`~.parts.Part.check`); returns that graph,
    parsed. ValueError: one line naming the relation and key."""
    operators, graph = bundle.operators, of_bundle(bundle)
    for name, op in operators.items():
        recipe = recipe_of(op)
        missing = [m for m in (recipe.mixture if recipe else ()) if m not in operators]
        if missing:
            raise ValueError(f"relation {name!r}: malformed recipe (mixture names {missing[0][:60]!r}, which is not "
                             f"an operator of this bundle; operators: {', '.join(sorted(operators))})")
        answer_prior.weights_of(op)
        for part in PARTS.values() if recipe else ():
            for key, w in part.weights(recipe).items():
                problem = part.check(key, w, operators, graph)
                if problem:
                    raise ValueError(f"relation {name!r}: malformed recipe ({problem})")
    return graph


def _short(value) -> str:
    text = str(value)
    return text if len(text) <= 120 else text[:117] + "..."


# ---- scoring a whole candidate table (dev, test, benchmarks) -------------------------------------

def score_matrix(recipe: Recipe, dense: dict[str, np.ndarray], lexical: np.ndarray | None, tables: dict,
                 exclude: np.ndarray) -> np.ndarray:
    """(n, m) recipe scores, as :func:`search` ranks an index: ``dense`` operator → (n, m) cosines
    (every operator of the mixture, and :data:`TITLE` when the recipe weighs the query title),
    ``lexical`` (n, m) BM25 scores (needed when ``recipe.bm25``), ``tables`` each additive part's
    values by name (retrieval/parts.py): ``{"same": {field: (n, m) bool "shares the query's value"},
    "prior": {operator: (m,) answer prior of each candidate}, "unanswered": {operator: (m,) 1 where
    training never gave the candidate as its answer}, "neighbours": (n, m) bool "the training
    graph links the query to the candidate", "prominence": (n, m) p(q) · p(d) in [0, 1], "mentions": {field: (n, m)
    how strongly one names the other where they share the field's value, else 0}}``, a part or key it lacks
    (or holds None for: a corpus without names has no prominence) adding nothing, as at query time;
    ``exclude`` (n, m) bool: the query itself, never a candidate. Candidates past the pool score
    :func:`past_pool` of their dense score."""
    mixed = _dense(recipe, dense)
    dense_list = hybrid.minmax_list(mixed, recipe.depth, False, exclude)
    lex = hybrid.minmax_list(lexical, recipe.depth, True, exclude) if recipe.bm25 else None
    fused = _fused(recipe, dense_list, lex, _additions(recipe, tables), mixed.shape)
    pool = np.zeros(mixed.shape, bool)
    for rows, order, valid, _ in [dense_list] + ([lex] if lex is not None else []):
        pool[rows, order] |= valid
    lo, span = _bounds(np.take_along_axis(mixed, dense_list[1], axis=1), dense_list[2])
    return np.where(pool, fused, past_pool(recipe, mixed, lo, span)).astype(np.float32)


def _bounds(top: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, 1) min and span of each row's valid top-depth dense scores (span 0 where all tie)."""
    lo = np.where(valid, top, np.inf).min(axis=1, keepdims=True)
    span = np.where(valid, top, -np.inf).max(axis=1, keepdims=True) - lo
    return np.where(np.isfinite(lo), lo, 0.0), np.where(np.isfinite(span), span, 0.0)


def past_pool(recipe: Recipe, dense: np.ndarray, lo, span) -> np.ndarray:
    """The score of a candidate in neither top-``depth`` list: −1 + (1 − b) · min(0, its dense score
    normalised with the pool's bounds ``lo``, ``span``). Below every pooled score (those are ≥ 0) and in
    dense order, so a deeper page continues the ranking instead of changing it."""
    with np.errstate(divide="ignore", invalid="ignore"):
        normalised = np.where(span > 0, (dense - lo) / np.where(span > 0, span, 1.0), 0.0)
    return -1.0 + (1.0 - recipe.bm25) * np.minimum(0.0, normalised)


def _dense(recipe: Recipe, dense: dict[str, np.ndarray]) -> np.ndarray:
    """The recipe's dense scores: its mixture's weighted cosines plus the title's."""
    mixed = sum(w * dense[name] for name, w in recipe.mixture.items())
    return mixed + recipe.title * dense[TITLE] if recipe.title else mixed


def _additions(recipe: Recipe, tables: dict) -> list:
    """(weight, array) of every score the recipe adds to a pooled candidate, in the parts' order:
    each non-zero weight's table in ``tables`` (:func:`score_matrix`), (n, m) or (m,)."""
    return [(w, values) for part in PARTS.values() for key, w in part.weights(recipe).items()
            if w and (values := part.tables(tables.get(part.name)).get(key)) is not None]


def _fused(recipe: Recipe, dense_list, lexical_list, additions: list, shape) -> np.ndarray:
    """:func:`score_matrix` from its lists already cut and normalised (hybrid.minmax_list), so the
    dev search computes each list once, not once per recipe; ``additions``: :func:`_additions`."""
    lists = [(dense_list, 1.0 - recipe.bm25)] + ([(lexical_list, recipe.bm25)] if recipe.bm25 else [])
    fused, pool = hybrid.fuse_lists(lists, shape)
    bonus = sum((w * a for w, a in additions), np.zeros_like(fused))
    return np.where(pool, fused + bonus, -1.0).astype(np.float32)


def _true(gold: list[set[int]], known: list[set[int]] | None) -> list[set[int]]:
    """Each query's true answers: its golds and the answers training already knows (``known``)."""
    return gold if known is None else [g | k for g, k in zip(gold, known)]


class _Pairs:
    """The (query, gold) pairs of a dev split in :func:`pair_reciprocal_ranks`' order, with what
    :func:`_pool_reciprocal_ranks` needs of the whole table, counted once per dev search; every
    true answer of a query (its golds and ``known``) is removed from its golds' competitors."""

    def __init__(self, gold: list[set[int]], exclude: np.ndarray, known: list[set[int]] | None = None):
        self.m = exclude.shape[1]
        self.rows = np.asarray([i for i, g in enumerate(gold) for _ in g], np.int64)
        self.cols = np.asarray([c for g in gold for c in sorted(g)], np.int64)
        true = _true(gold, known)
        true_rows = np.asarray([i for i, g in enumerate(true) for _ in g], np.int64)
        true_cols = np.asarray([c for g in true for c in sorted(g)], np.int64)
        self.keys = np.sort(true_rows * self.m + true_cols)  # (query, true answer) as one number
        self.open = self.m - exclude.sum(axis=1)  # candidates per query: not itself, not excluded
        gold_open = ~exclude[self.rows, self.cols]
        per_query = np.bincount(true_rows, weights=~exclude[true_rows, true_cols], minlength=len(gold))
        self.other_golds = per_query[self.rows] - gold_open  # other true answers of the pair's query, not excluded
        self.gold_open = gold_open


def _pool_reciprocal_ranks(recipe: Recipe, dense_list, lexical_list, additions: list, pairs: _Pairs) -> np.ndarray:
    """:func:`pair_reciprocal_ranks` of :func:`_fused`'s scores, computed over each query's pool
    (its lists' candidates, at most two × depth) instead of the whole table: every other
    candidate scores −1 there, below the pool, so it only ties a gold that is outside the pool too.
    The same float32 scores, so the same ranks, at a hundredth of the work on 16k candidates."""
    lists = [(dense_list, 1.0 - recipe.bm25)] + ([(lexical_list, recipe.bm25)] if recipe.bm25 else [])
    cols = np.concatenate([order for (_, order, _, _), _ in lists], axis=1)
    values = np.concatenate([share * normalised for (_, _, _, normalised), share in lists], axis=1)
    valid = np.concatenate([ok for (_, _, ok, _), _ in lists], axis=1)
    by_col = np.argsort(cols, axis=1, kind="stable")  # a column in both lists: the dense entry first
    cols, values, valid = (np.take_along_axis(a, by_col, axis=1) for a in (cols, values, valid))
    again = cols[:, 1:] == cols[:, :-1]  # entry k+1 repeats entry k's column (once at most: two lists)
    values[:, :-1] += np.where(again, values[:, 1:], 0.0)
    valid[:, :-1] |= again & valid[:, 1:]
    pool = valid.copy()
    pool[:, 1:] &= ~again
    rows = np.arange(len(cols))[:, None]
    bonus = sum((w * (a[rows, cols] if a.ndim == 2 else a[cols]) for w, a in additions), np.zeros(cols.shape))
    scores = (values.astype(np.float32) + bonus).astype(np.float32)
    is_gold = np.isin(rows * pairs.m + cols, pairs.keys)  # the query's golds, removed as competitors
    competitor = (pool & ~is_gold)[pairs.rows]
    here = pool[pairs.rows] & (cols[pairs.rows] == pairs.cols[:, None])
    in_pool = here.any(axis=1)
    score = np.where(here, scores[pairs.rows], 0.0).sum(axis=1, dtype=np.float32)[:, None]
    pair_scores = scores[pairs.rows]
    higher = np.where(in_pool, (competitor & (pair_scores > score)).sum(axis=1), competitor.sum(axis=1))
    golds_in_pool = (pool & is_gold).sum(axis=1)[pairs.rows]
    outside = (pairs.open[pairs.rows] - pool.sum(axis=1)[pairs.rows]  # open candidates outside the pool,
               - (pairs.other_golds - golds_in_pool) - pairs.gold_open)  # less the golds among them
    tied = np.where(in_pool, (competitor & (pair_scores == score)).sum(axis=1), outside)
    optimistic = higher.astype(np.int64) + 1
    return reciprocal_ranks(Ranks(optimistic, optimistic + tied.astype(np.int64)))


def mrr(scores: np.ndarray, gold: list[set[int]], exclude: np.ndarray, known: list[set[int]] | None = None) -> float:
    """Filtered MRR (realistic ranks) of every (query, gold) pair: each gold ranked with the
    query's other golds and ``known`` answers (what training knows) removed, the query itself excluded."""
    reciprocal = pair_reciprocal_ranks(scores, gold, exclude, known)
    return float(reciprocal.mean()) if len(reciprocal) else float("nan")


def pair_reciprocal_ranks(scores: np.ndarray, gold: list[set[int]], exclude: np.ndarray,
                          known: list[set[int]] | None = None) -> np.ndarray:
    """The reciprocal rank of every (query, gold) pair that :func:`mrr` averages, queries in order,
    each query's golds in increasing column order."""
    rows = [i for i, g in enumerate(gold) for _ in g]
    cols = np.asarray([c for g in gold for c in sorted(g)], np.int64)
    true = _true(gold, known)
    others = np.zeros((len(rows), scores.shape[1]), bool)
    for r, i in enumerate(rows):
        others[r, sorted(true[i])] = True
    return reciprocal_ranks(rank_gold(scores[rows], cols, filter_mask=others, exclude=exclude[rows]))


def noise_margin(a: np.ndarray, b: np.ndarray, query: np.ndarray) -> float:
    """One paired standard error of MRR(a) − MRR(b): ``a`` and ``b`` the reciprocal ranks of the
    same (query, gold) pairs under two recipes, ``query`` each pair's query. A query's pairs share
    its vector, so their differences are summed per query before the spread is taken (a
    cluster-robust standard error); infinite with fewer than :data:`MIN_DEV_QUERIES` queries (a
    spread taken from a handful of queries is no guide: on CoDEx-M richer recipes were chosen on 3)."""
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    per_query, pairs = np.bincount(query, weights=d), np.bincount(query)
    per_query, pairs = per_query[pairs > 0], pairs[pairs > 0]
    if len(pairs) < MIN_DEV_QUERIES:
        return math.inf
    spread = per_query - pairs * d.mean()
    return math.sqrt(len(pairs) / (len(pairs) - 1) * float(spread @ spread)) / len(d)


def first_hit_mrr(scores: np.ndarray, gold: list[set[int]], exclude: np.ndarray,
                  known: list[set[int]] | None = None) -> float:
    """MRR of each query's first relevant candidate (answer selection's protocol: one reciprocal
    rank per query, the best-ranked gold; realistic ties), the query itself and its ``known``
    answers excluded."""
    best = np.asarray([max(g, key=lambda c: scores[i, c]) for i, g in enumerate(gold)], np.int64)
    others = np.zeros(scores.shape, bool)
    for i, g in enumerate(_true(gold, known)):
        others[i, sorted(g)] = True
    return linkpred_metrics(scores, best, filter_mask=others, exclude=exclude)["mrr"]


@dataclass(frozen=True)
class Choice:
    """The chosen recipe and its dev MRR; ``tried``: recipes evaluated; ``margin``: the noise margin
    the best recipe had to clear against the simplest; ``within_noise``: the best recipe and its dev
    MRR when it did not clear it (the simplest was kept)."""

    recipe: Recipe
    dev_mrr: float
    tried: int
    margin: float = 0.0
    within_noise: tuple[Recipe, float] | None = None


def choose(name: str, dense: dict[str, np.ndarray], lexical: np.ndarray | None, tables: dict,
           exclude: np.ndarray, gold: list[set[int]], *, depth: int = DEPTH, mixes: tuple = MIXES,
           known: list[set[int]] | None = None) -> Choice:
    """The recipe for operator ``name`` chosen on dev: its share of the dense vector against
    identity (:data:`MIXES`) × BM25's share (:data:`BM25_SHARES`, when ``lexical`` is given) ×
    the query title's weight (:data:`TITLE_SHARES`, when ``dense`` holds :data:`TITLE`), then the
    additive parts (retrieval/parts.py) that ``tables`` holds, each key by coordinate ascent over its
    part's grid: first the keys of the parts tried around the others (the ``same`` bonuses, two
    rounds), then each other part's keys whose table has a non-zero value (the operator's answer
    prior, the neighbours bonus, prominence), then whole sweeps over all of them until one changes
    nothing (at most :data:`MAX_SWEEPS`), so that no one key's weight does better on dev and where
    the search ends depends less on the order the keys come in; ties keep the simpler recipe (tried
    first). A recipe that adds parts is then tried once with a pool :data:`DEEPER` times deeper
    (when the table has more candidates than that): a bonus lifts only pooled candidates, and a
    knowledge graph's head prediction often has its gold past the top 100. It is kept when dev
    gains more than the noise margin below, since every query then reads ten times the candidates
    (similar-company's lookups ran 3 times slower for a gain within noise). The
    best of these replaces the simplest — the first tried: the operator alone under the default
    ``mixes`` — only when it beats it by more than one paired standard error of the per-pair
    reciprocal-rank differences
    (:func:`noise_margin`): dev splits per relation are small and dozens of recipes are tried, so a
    smaller gain is likely noise that costs on test. Arrays as in :func:`score_matrix` (the answer
    prior offered is ``tables["prior"][name]``); ``known``: each query's answers that training already
    knows, removed from its golds' competitors (link prediction's filtered ranks)."""
    search = _Search(name, dense, lexical, tables, exclude, gold, depth=depth, known=known)
    simplest = search.grid(mixes)
    offered = [(part, key, table) for part in PARTS.values()
               for key, table in part.tables(tables.get(part.name)).items() if table is not None]
    around = [(part, key) for part, key, _ in offered if part.around]
    offered = [(part, key) for part, key, table in offered if not part.around and table.any()]
    for part, key in around * 2 + offered:
        search.ascend(part, key)
    for _ in range(MAX_SWEEPS):  # then whole sweeps until one changes nothing: where it ends depends less on the order
        before = search.best
        for part, key in around + offered:
            search.ascend(part, key)
        if search.best == before:
            break
    best, best_rr, tried = search.best, search.best_rr, search.tried
    if best.adds and exclude.shape[1] > depth * DEEPER:  # a bonus lifts only what the pool holds: a deeper one
        deep = _Search(name, dense, lexical, tables, exclude, gold, depth=depth * DEEPER, known=known)
        rr, tried = deep.evaluate(replace(best, depth=deep.depth), search.best_share), tried + 1
        if rr.mean() - best_rr.mean() > noise_margin(rr, best_rr, search.pairs.rows) + 1e-9:  # it costs every query
            best, best_rr = replace(best, depth=deep.depth), rr
    best = replace(best, **{part.name: {k: w for k, w in getattr(best, part.name).items() if w}
                            for part in PARTS.values() if part.keyed})
    if best == simplest[0]:
        return Choice(best, float(best_rr.mean()), tried)
    margin = noise_margin(best_rr, simplest[1], search.pairs.rows)
    if best_rr.mean() - simplest[1].mean() > margin:
        return Choice(best, float(best_rr.mean()), tried, margin)
    return Choice(simplest[0], float(simplest[1].mean()), tried, margin, (best, float(best_rr.mean())))


class _Search:
    """The dev search of :func:`choose` (its arguments): each recipe tried is scored by its pairs'
    reciprocal ranks; ``best`` (with its operator share and ranks) is the best so far, ``tried`` counts them."""

    def __init__(self, name: str, dense: dict[str, np.ndarray], lexical: np.ndarray | None, tables: dict,
                 exclude: np.ndarray, gold: list[set[int]], *, depth: int, known: list[set[int]] | None):
        self.name, self.dense, self.lexical, self.tables, self.exclude, self.depth = \
            name, dense, lexical, tables, exclude, depth
        self.tried = 0
        self.pairs = _Pairs(gold, exclude, known)  # ranks are computed over each query's pool only
        self.lexical_list = hybrid.minmax_list(lexical, depth, True, exclude) if lexical is not None else None
        self.dense_lists: dict[tuple, tuple] = {}  # (operator share, title) → its dense list, cut and normalised once
        self.best = self.best_share = self.best_rr = None

    def evaluate(self, recipe: Recipe, share: float) -> np.ndarray:
        """Each dev pair's reciprocal rank under ``recipe`` (its operator's ``share``)."""
        self.tried += 1
        if (share, recipe.title) not in self.dense_lists:
            self.dense_lists[share, recipe.title] = hybrid.minmax_list(_dense(recipe, self.dense), self.depth, False,
                                                                       self.exclude)
        return _pool_reciprocal_ranks(recipe, self.dense_lists[share, recipe.title], self.lexical_list,
                                      _additions(recipe, self.tables), self.pairs)

    def grid(self, mixes: tuple) -> tuple[Recipe, np.ndarray]:
        """Try every operator share × title weight × BM25 share, keeping the best; returns the
        simplest (the first tried) with its ranks."""
        simplest = None
        for share, title, b in itertools.product(mixes, TITLE_SHARES if TITLE in self.dense else (0.0,),
                                                 BM25_SHARES if self.lexical is not None else (0.0,)):
            mixture = {k: w for k, w in ((self.name, share), ("identity", 1.0 - share)) if w}
            recipe = Recipe(mixture=mixture, bm25=b, title=title, depth=self.depth)
            rr = self.evaluate(recipe, share)
            if self.best is None or rr.mean() > self.best_rr.mean() + 1e-9:
                self.best, self.best_share, self.best_rr = recipe, share, rr
            simplest = simplest or (recipe, rr)
        return simplest

    def ascend(self, part: Part, key) -> None:
        """Try each weight of ``part``'s grid for ``key`` (None: a single part) on the best recipe,
        keeping one that beats it."""
        for value in part.grid:
            current = getattr(self.best, part.name)
            recipe = replace(self.best, **{part.name: {**current, key: value} if part.keyed else value})
            rr = self.evaluate(recipe, self.best_share)
            if rr.mean() > self.best_rr.mean() + 1e-9:
                self.best, self.best_rr = recipe, rr
