"""``--faiss-index auto`` and build-time tuning of search parameters.

Auto picks by corpus size (:class:`AutoPolicy`):

- ``exact``: ``Flat`` up to ``exact_max`` vectors: exact scores, no parameters.
- ``ivf``: ``IVF{nlist},Flat`` (nlist = the largest power of two ≤ 4√n): trained once on a sample,
  exact scores of the probed lists, removal without renumbering, cheap id filters, a fast build.
  (An HNSW graph searches about as fast but builds ~7x slower here and cannot remove vectors;
  it is still one ``--faiss-index HNSW32`` away.)
- ``compressed``: when the float32 vectors would exceed ``compressed_min_bytes`` of RAM,
  ``IVF{nlist},PQ{m}`` (m bytes per vector, d/8 by default: 32x smaller) plus exact re-ranking of
  the top ``rerank`` candidates from ``vectors.npy`` (memory-mapped, read only for candidates).

Tuning (:func:`tune`): ``queries`` vectors sampled from the corpus itself are searched with each
candidate setting; each query's own position is left out of both its ANN and its exact top-k
(a held-out query); recall@k is measured against exact inner-product search, tolerating ties.
For every re-rank depth (compressed indexes only) the smallest nprobe / efSearch that reaches
``recall_target`` is found by bisection over a ladder; the cheapest setting by :func:`cost`
wins. A second, disjoint query sample gives the recall reported in the manifest, so it is not
the number that was optimised.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from . import ann

NPROBE_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
                 3072, 4096, 8192, 16384, 32768, 65536)
EF_LADDER = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 4096)
RERANK_FACTORS = (1, 2, 4, 8, 16, 32)  # re-rank depth = factor · k


@dataclass(frozen=True, kw_only=True)
class AutoPolicy:
    """Thresholds for ``--faiss-index auto``."""

    exact_max: int = 50_000
    compressed_min_bytes: int = 8 << 30  # float32 vectors larger than this get compressed codes
    pq_bytes: int | None = None  # bytes per vector for PQ; None: d/8 (a divisor of d)


@dataclass(frozen=True)
class AutoChoice:
    factory: str
    tier: str  # "exact" | "ivf" | "compressed"
    reason: str


def nlist_for(n: int) -> int:
    """Largest power of two ≤ 4√n, within [16, 65536] and leaving ≥ 39 training points per list."""
    target = max(16, min(65536, 4 * math.sqrt(max(n, 1)), n / 39))
    return max(1, 2 ** int(math.floor(math.log2(target))))


def pq_bytes_for(d: int, wanted: int | None = None) -> int:
    """Largest divisor of ``d`` not above ``wanted`` (default d/8): PQ needs m | d."""
    wanted = max(1, wanted or d // 8)
    return max(m for m in range(1, min(wanted, d) + 1) if d % m == 0)


def choose_factory(n: int, d: int, policy: AutoPolicy = AutoPolicy()) -> AutoChoice:
    """The index-factory string ``auto`` resolves to for n vectors of dimension d."""
    if n <= policy.exact_max:
        return AutoChoice("Flat", "exact", f"{n} vectors ≤ exact_max {policy.exact_max}: exact search")
    nlist = nlist_for(n)
    size = n * d * 4
    if size > policy.compressed_min_bytes:
        m = pq_bytes_for(d, policy.pq_bytes)
        return AutoChoice(f"IVF{nlist},PQ{m}", "compressed",
                          f"float32 vectors {size / 2**30:.1f} GiB > {policy.compressed_min_bytes / 2**30:.1f} GiB: "
                          f"{m}-byte PQ codes with exact re-ranking from vectors.npy")
    return AutoChoice(f"IVF{nlist},Flat", "ivf", f"{n} vectors > exact_max {policy.exact_max}: inverted file, "
                                                 f"{nlist} lists")


def exact_scores(index) -> bool:
    """Whether FAISS's scores for ``index`` are exact inner products (then re-ranking is useless)."""
    import faiss

    index = faiss.downcast_index(index) if type(index) is faiss.Index else index
    if isinstance(index, faiss.IndexRefine):
        return exact_scores(faiss.downcast_index(index.refine_index))
    return isinstance(index, (faiss.IndexFlat, faiss.IndexIVFFlat, faiss.IndexHNSWFlat))


def _knob(index) -> tuple[str | None, tuple[int, ...]]:
    import faiss

    keys = ann.param_keys(index)
    if "nprobe" in keys:
        ivf = faiss.extract_index_ivf(index)
        return "nprobe", tuple(v for v in NPROBE_LADDER if v < ivf.nlist) + (ivf.nlist,)
    if "efSearch" in keys:
        return "efSearch", EF_LADDER
    return None, ()


def cost(index, params: dict, d: int) -> float:
    """Estimated float-equivalent vector scores per query: probed codes (scaled by code size)
    plus the coarse quantizer plus re-ranked candidates. Deterministic, so tuning is too."""
    import faiss

    depth = params.get("rerank", 0)
    try:
        code = index.sa_code_size() / (4 * d)
    except RuntimeError:  # no standalone codec (HNSW): its storage is what is scored
        storage = getattr(index, "storage", None)
        code = storage.sa_code_size() / (4 * d) if storage is not None else 1.0
    if "nprobe" in params:
        ivf = faiss.extract_index_ivf(index)
        return params["nprobe"] * index.ntotal / ivf.nlist * code + ivf.nlist + depth
    if "efSearch" in params:
        hnsw = getattr(index, "hnsw", None)
        degree = hnsw.nb_neighbors(0) if hnsw is not None else 64
        return params["efSearch"] * degree * code + depth
    return index.ntotal * code + depth


@dataclass(frozen=True, kw_only=True)
class TuningConfig:
    recall_target: float = 0.95
    k: int = 10
    queries: int = 500
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class Tuning:
    """The chosen ``params``; ``recall`` on the tuning queries, ``validation_recall`` on fresh ones."""

    params: dict
    recall: float | None
    validation_recall: float | None
    reached: bool
    tried: list = field(default_factory=list)
    config: TuningConfig = TuningConfig()
    note: str = ""

    def to_json(self) -> dict:
        out = asdict(self)
        out["config"] = asdict(self.config)
        return out


class _Bench:
    """Held-out corpus queries with their exact top-k (ties tolerated through the k-th score)."""

    def __init__(self, index, vectors, positions: np.ndarray, k: int, selection=None):
        self.index, self.vectors, self.k = index, vectors, k
        self.selection = selection
        self.positions = positions
        self.q = np.asarray(vectors[np.sort(positions)], dtype=np.float32)[np.argsort(np.argsort(positions))]
        truth = ann.exact_search(vectors, self.q, k + 1, None if selection is None else selection.positions)
        kept = _drop_self(truth.positions, truth.scores, positions, k)
        self.kth = kept[1][:, -1]

    def recall(self, params: dict) -> float:
        res = ann.search(self.index, self.q, self.k + 1, params=params, vectors=self.vectors, selection=self.selection)
        pos, _ = _drop_self(res.positions, res.scores, self.positions, self.k)
        valid = pos >= 0
        rows = np.asarray(self.vectors[np.where(valid, pos, 0).ravel()], dtype=np.float32).reshape(*pos.shape, -1)
        true = np.einsum("nd,nkd->nk", self.q, rows)
        hits = valid & (true >= self.kth[:, None] - 1e-6)
        return float(hits.sum() / (len(pos) * self.k))


def _drop_self(positions: np.ndarray, scores: np.ndarray, own: np.ndarray, k: int):
    out_p = np.full((len(positions), k), -1, dtype=np.int64)
    out_s = np.full((len(positions), k), -np.inf, dtype=np.float32)
    for i, (p, s) in enumerate(zip(positions, scores)):
        keep = p != own[i]
        out_p[i], out_s[i] = p[keep][:k], s[keep][:k]
    return out_p, out_s


def tune(index, vectors: np.ndarray, config: TuningConfig = TuningConfig(), *, selection=None) -> Tuning:
    """Cheapest search parameters for ``index`` reaching ``config.recall_target`` recall@k.

    ``vectors`` (n, d): the unit vectors the index holds, by position (a memory map is fine);
    ``selection``: the positions that are live (tombstones excluded), if not all.
    """
    live = np.arange(len(vectors)) if selection is None else selection.positions
    knob, ladder = _knob(index)
    approximate = not exact_scores(index)
    if not knob and not approximate:
        return Tuning(params={}, recall=1.0, validation_recall=1.0, reached=True, config=config,
                      note="exact index: nothing to tune")
    if len(live) <= config.k + 1:
        return Tuning(params={}, recall=None, validation_recall=None, reached=False, config=config,
                      note=f"only {len(live)} vectors: too few to tune")
    bench, check = _benches(index, vectors, live, config, selection)
    tried: list[dict] = []

    def measure(params: dict) -> float:
        recall = bench.recall(params)
        tried.append({"params": dict(params), "recall": round(recall, 4), "cost": round(cost(index, params, vectors.shape[1]), 1)})
        return recall

    depths = [f * config.k for f in RERANK_FACTORS] if approximate else [0]
    best: tuple[float, dict, float] | None = None
    fallback: tuple[float, dict] | None = None
    last_knob = None
    for depth in depths:
        params, recall, reached = _at_depth({"rerank": depth} if depth else {}, knob, ladder, measure, tried,
                                            config.recall_target)
        if not reached:
            if fallback is None or recall > fallback[0]:
                fallback = (recall, params)
            continue
        c = cost(index, params, vectors.shape[1])
        if best is None or c < best[0]:
            best = (c, params, recall)
        if knob and last_knob is not None and params[knob] >= last_knob:
            break  # a deeper re-rank no longer lets the search itself get cheaper
        last_knob = params.get(knob) if knob else None
    if best is None:
        recall, params = fallback
        return Tuning(params=params, recall=recall, validation_recall=round(check.recall(params), 4), reached=False,
                      tried=tried, config=config, note=f"recall target {config.recall_target} not reached; "
                                                       f"using the most accurate setting tried")
    _, params, recall = best
    return Tuning(params=params, recall=round(recall, 4), validation_recall=round(check.recall(params), 4),
                  reached=True, tried=tried, config=config)


def _benches(index, vectors: np.ndarray, live: np.ndarray, config: TuningConfig, selection) -> tuple[_Bench, _Bench]:
    """Two seeded sets of live queries: one to tune on, one to validate the choice (the same
    when there are too few vectors for two)."""
    rng = np.random.default_rng(config.seed)
    nq = min(config.queries, max(1, len(live) // 2))
    picked = rng.choice(live, size=min(len(live), 2 * nq), replace=False)
    return (_Bench(index, vectors, picked[:nq], config.k, selection),
            _Bench(index, vectors, picked[nq:] if len(picked) > nq else picked[:nq], config.k, selection))


def _at_depth(base: dict, knob: str | None, ladder, measure, tried: list[dict], target: float) -> tuple[dict, float, bool]:
    """With re-rank ``base``: the cheapest setting of ``knob`` (up its ``ladder``) whose ``measure``
    reaches ``target``, its recall and True; else the most accurate setting ``tried``, its recall and False."""
    if knob:
        found = _smallest(ladder, lambda v: measure({**base, knob: v}), target)
        if found is None:
            top = {**base, knob: ladder[-1]}
            return top, next(t["recall"] for t in reversed(tried) if t["params"] == top), False
        return {**base, knob: found[0]}, found[1], True
    recall = measure(base)
    return base, recall, recall >= target


def _smallest(ladder, recall_of, target: float):
    """(value, recall) of the smallest ladder value whose recall reaches ``target``, by bisection
    (recall grows with the knob), or None if even the largest falls short."""
    cache: dict[int, float] = {}

    def at(i: int) -> float:
        if i not in cache:
            cache[i] = recall_of(ladder[i])
        return cache[i]

    # gallop up from the cheapest setting (full-scan settings on a big index cost a lot), then bisect
    lo, hi, step = 0, 0, 1
    while at(hi) < target:
        if hi == len(ladder) - 1:
            return None
        lo, hi, step = hi + 1, min(hi + step, len(ladder) - 1), step * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if at(mid) >= target:
            hi = mid
        else:
            lo = mid + 1
    return ladder[lo], at(lo)
