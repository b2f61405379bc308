"""Fuse a relational (dense) result list with a BM25 (lexical) one: local hybrid search.

- ``rrf`` (the default): reciprocal rank fusion, score(d) = Σ over the lists that hold d of
  1 / (RRF_K + rank of d in that list), ranks from 1, RRF_K = 60 (Cormack et al. 2009; also
  Elasticsearch's ``rrf`` retriever default). Needs only each list's order, so BM25's unbounded
  scores and inner products mix without calibration. An index runs it by :func:`fuse_rrf`, whose
  hits past the pool follow in dense order with score 0.
- ``weighted``: each list's scores min-max normalised to [0, 1] over its own candidates (a
  document absent from a list gets 0 there), then ``weight`` · dense + (1 − ``weight``) · lexical,
  ``weight`` in [0, 1], 0.5 by default (``--hybrid-weight``, the option of that name in the API): 1 is the
  relational order alone, 0 BM25's alone (both restricted to the union of the two candidate lists).
  It runs as a recipe with BM25 share 1 − ``weight`` (retrieval/plan.py, retrieval/recipe.py);
  :func:`minmax_list` and :func:`fuse_lists` are the parts the recipe's whole-table scoring shares.

Both take the top ``depth`` of each side (HYBRID_DEPTH, fixed by the query plan whatever k is:
retrieval/plan.py) and return the fused top k; ties go to the smaller position. The fused score
replaces the hit's score. An ``--id`` query's own document (``exclude``) leaves both lists before
fusing: it is never a hit, and left in, it would take rank 1 and, as the maximum of each list,
squeeze the normalised scores of the rest, BM25's far more than the dense ones (a text matches all
its own terms). :func:`rrf_matrix` and :func:`weighted_matrix` score whole candidate tables the
same way (the benchmarks).
"""
from __future__ import annotations

import numpy as np

from ..indexer.ann import SearchResult

RRF_K = 60
HYBRID_DEPTH = 100  # candidates taken from each side
METHODS = ("rrf", "weighted")
WEIGHT = 0.5  # weighted fusion: the relational list's share


def check(method: str | None, weight: float | None) -> None:
    """ValueError unless ``method`` is None or one of METHODS and ``weight`` is None or, with
    ``weighted``, a number in [0, 1]."""
    if method is not None and method not in METHODS:
        raise ValueError(f"unknown hybrid fusion {method!r}; choose {' or '.join(METHODS)}")
    if weight is None:
        return
    if method != "weighted":
        raise ValueError("a hybrid weight needs the weighted fusion" + (" (rrf uses ranks only)" if method else ""))
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0.0 <= weight <= 1.0:
        raise ValueError(f"the hybrid weight must be a number between 0 and 1, got {repr(weight)[:40]}")


def fuse_rrf(dense: SearchResult, lexical: SearchResult, k: int, *, depth: int = HYBRID_DEPTH,
             exclude: np.ndarray | None = None) -> SearchResult:
    """RRF of each row's top ``depth`` dense and lexical candidates (``exclude`` left out first),
    then the rest of the dense list in its order with score 0: the ranking does not move with k."""
    n = len(dense.positions)
    exclude = np.full(n, -1, np.int64) if exclude is None else np.asarray(exclude, np.int64)

    def cut(result: SearchResult, i: int) -> np.ndarray:
        row = result.positions[i]
        return row[(row >= 0) & (row != exclude[i])]

    out_p = np.full((n, k), -1, np.int64)
    out_s = np.full((n, k), -np.inf, np.float32)
    for i in range(n):
        ranked_dense = cut(dense, i)
        fused: dict[int, float] = {}
        for row in (ranked_dense[:depth], cut(lexical, i)[:depth]):
            for rank, p in enumerate(row.tolist(), 1):
                fused[p] = fused.get(p, 0.0) + 1.0 / (RRF_K + rank)
        ranked = sorted(fused.items(), key=lambda item: (-np.float32(item[1]), item[0]))
        ranked += [(p, 0.0) for p in ranked_dense[depth:].tolist() if p not in fused]
        ranked = ranked[:k]
        out_p[i, :len(ranked)] = [p for p, _ in ranked]
        out_s[i, :len(ranked)] = [s for _, s in ranked]
    return SearchResult(out_p, out_s)


def rrf_matrix(dense: np.ndarray, lexical: np.ndarray, depth: int = HYBRID_DEPTH,
               exclude: np.ndarray | None = None) -> np.ndarray:
    """RRF of two (n, m) score matrices over the same m candidates, as :func:`fuse_rrf` does for
    result lists: the top ``depth`` of each row of each matrix contribute 1 / (RRF_K + rank); a lexical
    score of 0 (no query term matches) is no hit, as in indexer/lexical.py. Candidates in neither
    top ``depth`` score 0; so do those ``exclude`` (n, m) marks (the query itself), which leave both
    lists before ranking as the query document does in :func:`fuse_rrf`. Used by the benchmarks, which
    score every candidate."""
    out = np.zeros(dense.shape, np.float64)
    contribution = 1.0 / (RRF_K + np.arange(1, min(depth, dense.shape[1]) + 1))
    for scores, must_match in ((dense, False), (lexical, True)):
        rows, order, valid, _ = _top(scores, depth, must_match, exclude)
        out[rows, order] += contribution[None, :order.shape[1]] * valid
    return out.astype(np.float32)


def weighted_matrix(dense: np.ndarray, lexical: np.ndarray, weight: float = WEIGHT, depth: int = HYBRID_DEPTH,
                    exclude: np.ndarray | None = None) -> np.ndarray:
    """Weighted fusion of two (n, m) score matrices, as the weighted recipe (BM25 share
    1 − ``weight``, retrieval/recipe.py) scores its pool: each row's top ``depth`` of each matrix
    (BM25: scores above 0 only), min-max normalised over themselves, ``weight`` · dense +
    (1 − ``weight``) · lexical, 0 outside a list; ``exclude`` as in :func:`rrf_matrix`."""
    check("weighted", weight)
    return fuse_lists([(minmax_list(dense, depth, False, exclude), weight),
                       (minmax_list(lexical, depth, True, exclude), 1.0 - weight)], dense.shape)[0]


def minmax_list(scores: np.ndarray, depth: int, must_match: bool, exclude: np.ndarray | None):
    """Each row's top ``depth`` list (:func:`_top`) with its scores min-max normalised over the
    list: (rows, order, valid, normalised). Computed once, fused under any weight by
    :func:`fuse_lists` (retrieval/recipe.py's dev search reuses it across ~30 recipes)."""
    rows, order, valid, top = _top(scores, depth, must_match, exclude)
    lo = np.where(valid, top, np.inf).min(axis=1, keepdims=True)
    span = np.where(valid, top, -np.inf).max(axis=1, keepdims=True) - lo
    with np.errstate(invalid="ignore", over="ignore"):  # rows without candidates: masked below
        normalised = np.where(span > 0, (top - lo) / np.where(span > 0, span, 1.0), 1.0)
    return rows, order, valid, np.where(valid, normalised, 0.0)


def fuse_lists(weighted: list[tuple[tuple, float]], shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Σ share · normalised score over ``weighted`` lists of :func:`minmax_list` (0 outside a
    list) as an (n, m) float32 matrix, and the pool: the candidates of any list."""
    out = np.zeros(shape, np.float64)
    pool = np.zeros(shape, bool)
    for (rows, order, valid, normalised), share in weighted:
        out[rows, order] += share * normalised
        pool[rows, order] |= valid
    return out.astype(np.float32), pool


def _top(scores: np.ndarray, depth: int, must_match: bool, exclude: np.ndarray | None):
    """(rows, order, valid, top scores) of each row's ``depth`` best candidates, best first; valid
    drops the excluded ones and, with ``must_match``, scores of 0 (no BM25 term matched). Ties, at
    the depth cut too, go to the smaller column."""
    if exclude is not None:
        scores = np.where(exclude, -np.inf, scores)
    rows = np.arange(len(scores))[:, None]
    if depth < scores.shape[1]:  # a partition, then a sort of the top only: tables of 10⁴ × 10⁴ stay cheap
        part = np.argpartition(-scores, depth - 1, axis=1)[:, :depth]
        kth = scores[rows, part].min(axis=1)
        # ties across the cut go to the smaller column, as the index's lists keep them (indexer/lexical.py)
        crossing = ((scores >= kth[:, None]).sum(axis=1) > depth) & (kth > (0 if must_match else -np.inf))
        for i in np.flatnonzero(crossing):
            tied = np.flatnonzero(scores[i] >= kth[i])
            part[i] = tied[np.lexsort((tied, -scores[i, tied]))[:depth]]
        order = part[rows, np.lexsort((part, -scores[rows, part]), axis=1)]
    else:
        order = np.argsort(-scores, axis=1, kind="stable")
    top = scores[rows, order].astype(np.float64)
    return rows, order, top > 0 if must_match else top > -np.inf, top
