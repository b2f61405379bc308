"""Search a FAISS index with explicit parameters, an id selection and exact re-scoring.

One function, :func:`search`, serves the query path (retrieval/search.py), build-time tuning
(indexer/tuning.py) and the scale benchmark, so what is tuned is exactly what is served.

Search parameters (a plain dict, the manifest's ``faiss.search_params``):

- ``nprobe`` / ``max_codes``: inverted-file indexes (IVF…), ``quantizer_efSearch`` for an HNSW
  coarse quantizer;
- ``efSearch``: HNSW graphs;
- ``k_factor``: FAISS refine wrappers (``…,RFlat``);
- ``rerank``: relsearch's own exact re-scoring depth: fetch that many candidates, score them
  exactly against ``vectors.npy``, keep the top k. 0 (the default) = off.

Positions are FAISS ids (rows of ``vectors.npy``); ``-1`` pads rows with fewer than k hits.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np

from . import rowfile

INT_PARAMS = ("nprobe", "max_codes", "efSearch", "quantizer_efSearch", "rerank")
FLOAT_PARAMS = ("k_factor",)
MAX_EF_SEARCH = 4096  # cap when widening a graph search for a selective id filter
# A filter passing a fraction f of the vectors widens nprobe / efSearch by about WIDEN / f: 1/f keeps
# the number of matching vectors met constant, but the filtered top-k sit deeper in the unfiltered
# ranking (around rank k/f), which needs more lists than the top-k did; 2 was measured to bring
# recall back near the unfiltered level on clustered data (tests/indexer/test_faiss.py). The factor
# fades out as f → 1, so a few tombstones (f ≈ 0.99) cost about 1/f, not twice the work:
# scale = 1 + (WIDEN/f − 1)·(1 − f).
WIDEN = 2.0


# A batch of fewer queries than this is searched on the calling thread alone (threads_for)
ONE_THREAD_BELOW = 16
# A flat index (or an IVF index's coarse quantizer) scores a batch of at least this many queries as
# one BLAS matrix product (blas_from_batches)
BLAS_FROM_QUERIES = 4


def blas_from_batches(d: int) -> None:
    """Let FAISS score batches of :data:`BLAS_FROM_QUERIES` or more ``d``-dimensional queries against
    flat vectors as BLAS matrix products (a process-wide FAISS setting; the last index opened sets
    it for its ``d``).

    FAISS 1.15 switches to BLAS only once queries × d reaches ``distance_compute_blas_threshold``
    (128,000: 334 queries at d = 384). Below it each query scans the vectors on its own: on 20k ×
    384 vectors (2-core Xeon, 2026-11-26) 560-590 µs a query against ~60 µs in BLAS batches, so a
    lookup job's batch of 256 took 141 ms instead of 17 and a server pass of 32 queries 17.5 ms
    instead of 3.6. BLAS already won from 4 queries (2.2 → 1.9 ms); a single query keeps the scan
    (1.2 ms against 1.5-3.1 ms). Both paths are exact (scores may differ in the last float bits)."""
    import faiss

    faiss.cvar.distance_compute_blas_threshold = BLAS_FROM_QUERIES * d


@contextlib.contextmanager
def threads_for(n_queries: int):
    """FAISS's OpenMP threads for a search of ``n_queries``: the calling thread alone for a few.
    FAISS and PyTorch each bring their own OpenMP pool; right after an encoder pass PyTorch's
    threads still spin on the same cores, and a two-thread FAISS search waited for them: one text
    query on a 20k flat index (2 cores) took 15.2 ms end to end with FAISS on two threads, 9.7 ms
    on one, while FAISS's own search of one query costs 1.2 ms either way. Big batches keep every
    thread, where they pay."""
    import faiss

    if n_queries >= ONE_THREAD_BELOW:
        yield
        return
    before = faiss.omp_get_max_threads()  # this thread's setting (OpenMP keeps one per thread)
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


@dataclass(frozen=True)
class SearchResult:
    """``positions`` (n, k) int64, -1 where fewer than k hits; ``scores`` (n, k) float32, -inf there."""

    positions: np.ndarray
    scores: np.ndarray


class Selection:
    """The positions a search may return: a bitmap for FAISS (``IDSelectorBitmap``) and the
    position list for exact search. ``use_selector=False`` when FAISS already holds only these
    positions (e.g. deleted ids were removed from an IVF index) and only the exact path needs them."""

    def __init__(self, mask: np.ndarray, *, use_selector: bool = True):
        self.mask = np.asarray(mask, dtype=bool)  # (positions,)
        self.count = int(self.mask.sum())
        self.fraction = self.count / max(len(self.mask), 1)
        self.use_selector = use_selector
        self._positions: np.ndarray | None = None
        self._bits: np.ndarray | None = None
        self._sel = None
        self._parts: dict[tuple[int, int], Selection] = {}

    @classmethod
    def of(cls, positions: np.ndarray, total: int, **kw) -> Selection:
        mask = np.zeros(total, dtype=bool)
        mask[np.asarray(positions, dtype=np.int64)] = True
        return cls(mask, **kw)

    def part(self, start: int, stop: int) -> Selection:
        """This selection restricted to positions ``[start, stop)``, renumbered from 0 (one segment);
        kept, so an index's live selection builds each segment's bitmap once."""
        if (start, stop) not in self._parts:
            self._parts[start, stop] = Selection(self.mask[start:stop], use_selector=self.use_selector)
        return self._parts[start, stop]

    @property
    def positions(self) -> np.ndarray:
        if self._positions is None:
            self._positions = np.flatnonzero(self.mask).astype(np.int64)
        return self._positions

    @property
    def selector(self):
        """A FAISS ``IDSelectorBitmap`` over the mask (kept alive with its bitmap), or None."""
        if not self.use_selector:
            return None
        if self._sel is None:
            import faiss

            self._bits = np.packbits(self.mask, bitorder="little")  # FAISS reads bit (id & 7) of byte id >> 3
            self._sel = faiss.IDSelectorBitmap(len(self.mask), faiss.swig_ptr(self._bits))
        return self._sel


# ---------------------------------------------------------------- parameters

def _unwrap(index):
    import faiss

    return faiss.downcast_index(index) if type(index) is faiss.Index else index


def param_keys(index) -> set[str]:
    """The search-parameter keys that apply to ``index`` (``rerank`` always does)."""
    import faiss

    index, keys = _unwrap(index), {"rerank"}
    if isinstance(index, faiss.IndexPreTransform):
        return keys | param_keys(faiss.downcast_index(index.index))
    if isinstance(index, faiss.IndexRefine):
        return keys | {"k_factor"} | param_keys(faiss.downcast_index(index.base_index))
    if isinstance(index, faiss.IndexIVF):
        keys |= {"nprobe", "max_codes"}
        if isinstance(faiss.downcast_index(index.quantizer), faiss.IndexHNSW):
            keys.add("quantizer_efSearch")
    elif isinstance(index, faiss.IndexHNSW):
        keys.add("efSearch")
    return keys


def parse_params(raw: dict[str, str | int | float], index=None) -> dict[str, int | float]:
    """``{"nprobe": "16"}`` → ``{"nprobe": 16}``; names the valid keys on an unknown one."""
    valid = param_keys(index) if index is not None else set(INT_PARAMS + FLOAT_PARAMS)
    out: dict[str, int | float] = {}
    for key, value in raw.items():
        if key not in valid:
            raise ValueError(f"search parameter {key!r} does not apply to this index; valid: {', '.join(sorted(valid))}")
        try:
            number = float(value)
            out[key] = number if key in FLOAT_PARAMS else int(number)
        except (TypeError, ValueError):
            raise ValueError(f"search parameter {key}={value!r} is not a number") from None
        if out[key] < 0 or (key != "rerank" and out[key] == 0 and key != "max_codes"):
            raise ValueError(f"search parameter {key}={value!r} must be positive")
    return out


def faiss_parameters(index, params: dict, selector=None):
    """A FAISS ``SearchParameters`` tree for ``index`` carrying ``params`` and ``selector``.

    Values absent from ``params`` keep the index's own (FAISS would otherwise reset, e.g.,
    nprobe to 1 as soon as a parameter object is passed).
    """
    import faiss

    index = _unwrap(index)
    if isinstance(index, faiss.IndexPreTransform):
        p = faiss.SearchParametersPreTransform()
        p.index_params = faiss_parameters(faiss.downcast_index(index.index), params, selector)
        p.referenced = p.index_params  # keep the child alive as long as the parent
        return p
    if isinstance(index, faiss.IndexRefine):
        p = faiss.IndexRefineSearchParameters()
        p.k_factor = float(params.get("k_factor", index.k_factor))
        p.base_index_params = faiss_parameters(faiss.downcast_index(index.base_index), params, selector)
        p.referenced = p.base_index_params
        return p
    if isinstance(index, faiss.IndexIVF):
        p = faiss.SearchParametersIVF()
        p.nprobe = int(min(params.get("nprobe", index.nprobe), index.nlist))
        p.max_codes = int(params.get("max_codes", index.max_codes))
        if "quantizer_efSearch" in params:
            qp = faiss.SearchParametersHNSW()
            qp.efSearch = int(params["quantizer_efSearch"])
            p.quantizer_params, p.referenced = qp, qp
    elif isinstance(index, faiss.IndexHNSW):
        p = faiss.SearchParametersHNSW()
        p.efSearch = int(params.get("efSearch", index.hnsw.efSearch))
    else:
        p = faiss.SearchParameters()
    if selector is not None:
        p.sel = selector
        p.referenced_sel = selector
    return p


def widen_for_selection(index, params: dict, fraction: float, k: int) -> dict:
    """Scale nprobe / efSearch for a search restricted to ``fraction`` of the vectors (bounded by
    nlist and MAX_EF_SEARCH); see WIDEN."""
    import faiss

    if fraction >= 1.0 or fraction <= 0.0:
        return params
    out = dict(params)
    scale = 1.0 + (WIDEN / fraction - 1.0) * (1.0 - fraction)
    inner = _unwrap(index)
    while isinstance(inner, (faiss.IndexPreTransform, faiss.IndexRefine)):
        inner = faiss.downcast_index(inner.index if isinstance(inner, faiss.IndexPreTransform) else inner.base_index)
    if isinstance(inner, faiss.IndexIVF):  # rounded: a few tombstones (scale 1.001) must not double nprobe 1
        out["nprobe"] = int(min(inner.nlist, max(1, round(out.get("nprobe", inner.nprobe) * scale))))
    elif isinstance(inner, faiss.IndexHNSW):
        ef = max(out.get("efSearch", inner.hnsw.efSearch), k)
        out["efSearch"] = int(min(max(MAX_EF_SEARCH, ef), math.ceil(ef * scale)))
    return out


# ---------------------------------------------------------------- exact search

def top_k(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Best ``k`` per row of ``scores`` (n, m) with their ``ids`` (n, m) or (m,); descending,
    ties broken by smaller id; pads with (-inf, -1)."""
    n, m = scores.shape
    ids = np.broadcast_to(ids, scores.shape)
    if m > k:
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        scores, ids = np.take_along_axis(scores, part, 1), np.take_along_axis(ids, part, 1)
    order = np.lexsort((ids, -scores), axis=1)
    scores, ids = np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)
    if ids.shape[1] < k:
        pad = k - ids.shape[1]
        scores = np.hstack([scores, np.full((n, pad), -np.inf, scores.dtype)])
        ids = np.hstack([ids, np.full((n, pad), -1, np.int64)])
    ids = np.where(np.isfinite(scores), ids, -1)
    return scores.astype(np.float32), ids.astype(np.int64)


def exact_search(vectors: np.ndarray, q: np.ndarray, k: int, subset: np.ndarray | None = None,
                 *, max_block_floats: int = 1 << 24) -> SearchResult:
    """Exact inner-product top-k of ``q`` (n, d) over rows ``subset`` of ``vectors`` (all rows if
    None), reading ``vectors`` in blocks so memory stays ~max_block_floats; a whole ``.npy`` memory
    map is read with file reads (indexer/rowfile.py), so the pass leaves no mapped pages behind."""
    q = np.ascontiguousarray(q, dtype=np.float32)
    total = len(vectors) if subset is None else len(subset)
    block = max(1024, max_block_floats // max(len(q), 1))
    best_s = np.full((len(q), k), -np.inf, dtype=np.float32)
    best_p = np.full((len(q), k), -1, dtype=np.int64)
    for start in range(0, total, block):
        if subset is None:
            ids = np.arange(start, min(start + block, total), dtype=np.int64)
            rows = rowfile.read_rows(vectors, start, start + block)
        else:
            ids = np.asarray(subset[start:start + block], dtype=np.int64)
            ordered = bool(np.all(ids[1:] > ids[:-1]))
            rows = rowfile.take(vectors, ids) if ordered else np.asarray(vectors[ids], dtype=np.float32)
        sims = q @ rows.T
        best_s, best_p = top_k(np.hstack([best_s, sims]), np.hstack([best_p, np.broadcast_to(ids, sims.shape)]), k)
    return SearchResult(best_p, best_s)


def rescore(vectors: np.ndarray, q: np.ndarray, candidates: np.ndarray, k: int) -> SearchResult:
    """Exact scores for candidate positions (n, c) from ``vectors``; best k per row."""
    out_p = np.full((len(q), k), -1, dtype=np.int64)
    out_s = np.full((len(q), k), -np.inf, dtype=np.float32)
    for start in range(0, len(q), 256):
        cand = candidates[start:start + 256]
        valid = cand >= 0
        flat = np.where(valid, cand, 0).ravel()
        uniq, inverse = np.unique(flat, return_inverse=True)  # sorted reads from the memory map
        rows = np.asarray(vectors[uniq], dtype=np.float32)[inverse].reshape(*cand.shape, -1)
        sims = np.einsum("nd,ncd->nc", q[start:start + 256], rows)
        sims[~valid] = -np.inf
        out_s[start:start + 256], out_p[start:start + 256] = top_k(sims.astype(np.float32), cand, k)
    return SearchResult(out_p, out_s)


# ---------------------------------------------------------------- ties

TIE_TOLERANCE = 1e-5  # float32 products of unit vectors differ by ~1e-7 with a batch's shape
TIE_MARGIN = 8  # candidates fetched past k so that a tied group at the cut is seen whole


def settle_ties(result: SearchResult, q: np.ndarray, vectors, k: int) -> SearchResult:
    """``result`` cut to ``k``, its near-tied scores settled: every hit within
    :data:`TIE_TOLERANCE` of a neighbour in its row is scored again in float64 from ``vectors``,
    one pair at a time, and the row sorted by (score, position). A float32 inner product's last
    bits depend on the batch's shape and on a vector's place in it (BLAS tiles, FAISS's blocks), so
    two identical documents (share classes: GOOG and GOOGL) swapped places between a batch of
    queries and one query; scored pair by pair, identical vectors tie exactly and the smaller
    position goes first on every path."""
    scores, positions = result.scores, result.positions
    with np.errstate(invalid="ignore"):  # -inf pads: nan, not near
        close = np.abs(np.diff(scores, axis=1)) <= TIE_TOLERANCE
    near = np.zeros(scores.shape, bool)
    near[:, 1:] |= close
    near[:, :-1] |= close
    near &= positions >= 0
    if near.any():
        rows, cols = np.nonzero(near)
        pairs = np.asarray(vectors[positions[rows, cols]], np.float64) * np.asarray(q, np.float64)[rows]
        scores = scores.copy()
        scores[rows, cols] = pairs.sum(axis=1)  # each row's own pairwise sum: the same for the same pair
        order = np.lexsort((positions, -scores), axis=1)
        positions = np.take_along_axis(positions, order, 1)
        scores = np.take_along_axis(scores, order, 1)
    return SearchResult(positions[:, :k], scores[:, :k])


# ---------------------------------------------------------------- the search

def search(index, q: np.ndarray, k: int, *, params: dict | None = None, vectors: np.ndarray | None = None,
           selection: Selection | None = None, run=None) -> SearchResult:
    """Top-k positions of ``q`` (n, d) float32 in ``index`` with ``params`` (module docstring).

    ``selection``: only these positions may come back (docstore filter, tombstones); the search
    is widened by 1/fraction and any row left with fewer than min(k, selection.count) hits is
    answered by exact search over the selection, so k hits come back whenever k qualify.
    ``vectors`` (positions, d): needed for ``rerank`` and for that exact fallback.
    ``run(q, fetch, params) -> (scores, positions)``: another engine for the raw search (a GPU
    copy of ``index``); selections always run on ``index`` itself.
    """
    q = np.ascontiguousarray(q, dtype=np.float32)
    params = dict(params or {})
    depth = int(params.pop("rerank", 0) or 0)
    if depth and vectors is None:
        raise ValueError("rerank needs the index's vectors")
    fetch = max(k, depth)
    sel = selection.selector if selection is not None else None
    if sel is not None:
        params = widen_for_selection(index, params, selection.fraction, fetch)
    fetch = min(fetch, max(int(index.ntotal), 1))
    if run is not None and sel is None:
        scores, positions = run(q, fetch, params)
    else:
        scores, positions = index.search(q, fetch, params=faiss_parameters(index, params, sel))
    result = rescore(vectors, q, positions, k) if depth else SearchResult(*_pad(positions, scores, k))
    return _top_up(result, q, k, selection, vectors, int(index.ntotal))


def _top_up(result: SearchResult, q: np.ndarray, k: int, selection: Selection | None, vectors, total: int):
    """Answer rows left with fewer than min(k, selectable) hits by exact search (needs ``vectors``)."""
    want = min(k, selection.count if selection is not None else total)
    short = np.flatnonzero((result.positions[:, :want] < 0).any(axis=1)) if want else np.zeros(0, int)
    if len(short) and vectors is not None:
        exact = exact_search(vectors, q[short], k, None if selection is None else selection.positions)
        result.positions[short], result.scores[short] = exact.positions, exact.scores
    return result


def shares_quantizer(indexes) -> bool:
    """True when every index is a plain IVF index with the same coarse centroids as the first (appended
    segments filled from the build's trained copy): one coarse assignment then serves them all."""
    import faiss

    ivfs = [_unwrap(i) for i in indexes]
    if len(ivfs) < 2 or not all(isinstance(i, faiss.IndexIVF) for i in ivfs):
        return False
    first = ivfs[0].quantizer.reconstruct_n(0, ivfs[0].nlist)
    return all(i.nlist == ivfs[0].nlist and np.array_equal(i.quantizer.reconstruct_n(0, i.nlist), first)
               for i in ivfs[1:])


def search_segments(segments, q: np.ndarray, k: int, *, params: dict | None = None,
                    selection: Selection | None = None, vectors=None, shared_quantizer: bool = False) -> SearchResult:
    """:func:`search` over several segments, ``(start, index, rows)`` in position order, each index
    numbered from 0, ``selection`` and ``vectors`` over all positions.

    Each segment returns its own best candidates (positions shifted by ``start``) and the best k
    of all are kept: exact for exact segments, as recall-bound as the segments' own indexes
    otherwise (a document among the global top k is among its segment's top k). With
    ``shared_quantizer`` (:func:`shares_quantizer`) the coarse assignment is computed once for all
    segments, so a small IVF segment costs only its share of the probed lists. Re-ranking and the
    exact top-up for rows short of k run once, over all segments, as in :func:`search`.
    """
    import faiss

    q = np.ascontiguousarray(q, dtype=np.float32)
    params = dict(params or {})
    depth = int(params.pop("rerank", 0) or 0)
    fetch = max(k, depth)
    first = segments[0][1]
    if selection is not None and selection.use_selector:
        params = widen_for_selection(first, params, selection.fraction, fetch)
    if shared_quantizer:
        nprobe = faiss_parameters(first, params).nprobe
        coarse_scores, coarse_lists = _unwrap(first).quantizer.search(q, nprobe)
    positions, scores = [np.full((len(q), 0), -1, np.int64)], [np.full((len(q), 0), -np.inf, np.float32)]
    for start, index, rows in segments:
        part = None if selection is None else selection.part(start, start + len(rows))
        if part is not None and part.count == 0:
            continue
        search_params = faiss_parameters(index, params, None if part is None else part.selector)
        if shared_quantizer:
            found_s = np.empty((len(q), fetch), np.float32)
            found_p = np.empty((len(q), fetch), np.int64)
            _unwrap(index).search_preassigned_c(len(q), faiss.swig_ptr(q), fetch, faiss.swig_ptr(coarse_lists),
                                                faiss.swig_ptr(coarse_scores), faiss.swig_ptr(found_s),
                                                faiss.swig_ptr(found_p), False, search_params)
        else:
            found_s, found_p = index.search(q, min(fetch, max(int(index.ntotal), 1)), params=search_params)
        positions.append(np.where(found_p >= 0, found_p + start, -1))
        scores.append(np.where(found_p >= 0, found_s, -np.inf).astype(np.float32))
    best_scores, best_positions = top_k(np.hstack(scores), np.hstack(positions), fetch)
    result = rescore(vectors, q, best_positions, k) if depth else SearchResult(*_pad(best_positions, best_scores, k))
    return _top_up(result, q, k, selection, vectors, sum(len(rows) for _, _, rows in segments))


def _pad(positions: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    positions = np.asarray(positions, dtype=np.int64)[:, :k]
    scores = np.asarray(scores, dtype=np.float32)[:, :k]
    if positions.shape[1] < k:
        pad = k - positions.shape[1]
        positions = np.hstack([positions, np.full((len(positions), pad), -1, np.int64)])
        scores = np.hstack([scores, np.full((len(scores), pad), -np.inf, np.float32)])
    scores = np.where(positions >= 0, scores, -np.inf).astype(np.float32)
    return positions, scores
