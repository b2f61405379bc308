"""Link-prediction ranking metrics (design.md §5), numpy only.

A query's gold candidate is ranked among the candidates that remain after removing

- *filtered* candidates: other known true answers of the query (``filter_mask``), and
- the query itself (``exclude``), when it is among the candidates.

The gold candidate itself is never removed. Ties are handled explicitly:

- optimistic rank  = 1 + #{remaining candidates scoring strictly higher than gold}
- pessimistic rank = optimistic + #{other remaining candidates scoring exactly as gold}
- realistic rank   = their mean = the expected rank when ties are broken uniformly at random.

:func:`ranking_metrics` turns ranks into ``{"mrr", "mr", "hits@1", "hits@3", "hits@10"}``. In the
``realistic`` setting every metric is its exact *expectation under uniform random tie-breaking*:
MR is the mean realistic rank, MRR is the mean over the tied positions k ∈ [optimistic,
pessimistic] of 1/k, Hits@k the fraction of those positions ≤ k. Without ties this is the same as
using the rank itself; with ties it makes a constant scorer score exactly at chance
(MRR = H_n / n for n candidates, Hits@k = k / n), which ``1 / mean rank`` would not (it gives
2 / (n + 1), below chance). ``optimistic`` / ``pessimistic`` use the rank as is (RSE's raw
protocol uses optimistic).

It imports nothing from relsearch: training (dev/test metrics) and the bench runners share it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HITS_AT = (1, 3, 10)
METRIC_KEYS = ("mrr", "mr") + tuple(f"hits@{k}" for k in HITS_AT)
SETTINGS = ("realistic", "optimistic", "pessimistic")


@dataclass(frozen=True)
class Ranks:
    """1-based ranks of each query's gold candidate: int64 arrays of shape (n_queries,)."""

    optimistic: np.ndarray
    pessimistic: np.ndarray

    def __post_init__(self):
        if self.optimistic.shape != self.pessimistic.shape:
            raise ValueError("optimistic and pessimistic ranks differ in shape")

    @property
    def realistic(self) -> np.ndarray:
        """Mean of optimistic and pessimistic rank (float64): the expected rank under random tie-breaking."""
        return (self.optimistic + self.pessimistic) / 2.0

    def __len__(self) -> int:
        return int(self.optimistic.shape[0])

    @staticmethod
    def concat(parts: list["Ranks"]) -> "Ranks":
        """Join ranks computed on chunks of queries, in order."""
        if not parts:
            return Ranks(np.zeros(0, np.int64), np.zeros(0, np.int64))
        return Ranks(np.concatenate([p.optimistic for p in parts]), np.concatenate([p.pessimistic for p in parts]))


def rank_gold(
    scores: np.ndarray,
    gold: np.ndarray,
    *,
    filter_mask: np.ndarray | None = None,
    exclude: np.ndarray | None = None,
) -> Ranks:
    """Rank each query's gold candidate among its candidates.

    ``scores``: (n_queries, n_candidates), higher is better; NaN is an error.
    ``gold``: (n_queries,) int, the gold candidate's column.
    ``filter_mask``: optional (n_queries, n_candidates) bool, True = another known true answer to
    remove (a True at the gold column is ignored).
    ``exclude``: optional query-itself exclusion, either (n_queries,) int — the query's own column,
    −1 where the query is not among the candidates — or an (n_queries, n_candidates) bool mask.
    The gold column is never removed, even when it is the query itself.
    """
    scores = np.asarray(scores)
    if scores.ndim != 2:
        raise ValueError(f"scores must be 2-d (n_queries, n_candidates), got shape {scores.shape}")
    n, c = scores.shape
    gold = np.asarray(gold, dtype=np.int64)
    if gold.shape != (n,):
        raise ValueError(f"gold must have shape ({n},), got {gold.shape}")
    if n and (gold.min() < 0 or gold.max() >= c):
        raise ValueError(f"gold index out of range [0, {c})")
    if np.isnan(scores).any():
        raise ValueError("scores contain NaN")
    rows = np.arange(n)
    removed = np.zeros((n, c), dtype=bool)
    if filter_mask is not None:
        filter_mask = np.asarray(filter_mask, dtype=bool)
        if filter_mask.shape != (n, c):
            raise ValueError(f"filter_mask must have shape {(n, c)}, got {filter_mask.shape}")
        removed |= filter_mask
    if exclude is not None:
        exclude = np.asarray(exclude)
        if exclude.dtype == bool:
            if exclude.shape != (n, c):
                raise ValueError(f"exclude mask must have shape {(n, c)}, got {exclude.shape}")
            removed |= exclude
        else:
            exclude = exclude.astype(np.int64)
            if exclude.shape != (n,):
                raise ValueError(f"exclude index must have shape ({n},), got {exclude.shape}")
            if n and exclude.max() >= c:
                raise ValueError(f"exclude index out of range [-1, {c})")
            has = exclude >= 0
            removed[rows[has], exclude[has]] = True
    removed[rows, gold] = False
    gold_score = scores[rows, gold][:, None]
    kept = ~removed
    higher = ((scores > gold_score) & kept).sum(axis=1)
    tied = ((scores == gold_score) & kept).sum(axis=1) - 1  # minus gold itself
    optimistic = higher.astype(np.int64) + 1
    return Ranks(optimistic, optimistic + tied.astype(np.int64))


def _harmonic(upto: int) -> np.ndarray:
    """H[k] = Σ_{i≤k} 1/i for k = 0..upto (H[0] = 0)."""
    return np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, upto + 1, dtype=np.float64))])


def _bounds(ranks: Ranks, setting: str) -> tuple[np.ndarray, np.ndarray]:
    """(lowest, highest) rank each query's gold may take under ``setting``."""
    if setting not in SETTINGS:
        raise ValueError(f"unknown setting {setting!r}; choose one of {', '.join(SETTINGS)}")
    lo, hi = ranks.optimistic.astype(np.int64), ranks.pessimistic.astype(np.int64)
    return (lo, lo) if setting == "optimistic" else (hi, hi) if setting == "pessimistic" else (lo, hi)


def reciprocal_ranks(ranks: Ranks, setting: str = "realistic") -> np.ndarray:
    """Each query's reciprocal rank (float64) for ``setting``; ``realistic``: its expectation under
    uniform random tie-breaking (what :func:`ranking_metrics` averages into MRR)."""
    lo, hi = _bounds(ranks, setting)
    if not len(lo):
        return np.zeros(0)
    harmonic = _harmonic(int(hi.max()))
    return (harmonic[hi] - harmonic[lo - 1]) / (hi - lo + 1)


def ranking_metrics(ranks: Ranks, setting: str = "realistic") -> dict[str, float]:
    """MRR, MR, Hits@1/3/10 (means over queries) for ``setting`` in realistic|optimistic|pessimistic.

    ``realistic`` = exact expectation under uniform random tie-breaking (see module doc).
    An empty ``ranks`` gives NaN for every metric.
    """
    if len(ranks) == 0:
        _bounds(ranks, setting)  # an unknown setting is still an error
        return {k: float("nan") for k in METRIC_KEYS}
    lo, hi = _bounds(ranks, setting)
    width = (hi - lo + 1).astype(np.float64)
    out = {"mrr": float(reciprocal_ranks(ranks, setting).mean()), "mr": float(((lo + hi) / 2.0).mean())}
    for k in HITS_AT:
        out[f"hits@{k}"] = float((np.clip(k - lo + 1, 0, None).clip(max=width) / width).mean())
    return out


def linkpred_metrics(
    scores: np.ndarray,
    gold: np.ndarray,
    *,
    filter_mask: np.ndarray | None = None,
    exclude: np.ndarray | None = None,
    setting: str = "realistic",
) -> dict[str, float]:
    """:func:`rank_gold` then :func:`ranking_metrics` in one call."""
    return ranking_metrics(rank_gold(scores, gold, filter_mask=filter_mask, exclude=exclude), setting)


# ------------------------------------------------------------ aspect retrieval (AspectCSE protocol)
def seed_metrics(scores: np.ndarray, relevant: np.ndarray, k: int) -> tuple[float, float, float]:
    """Expected (P@k, R@k, MRR@k) of one seed under random tie-breaking.

    ``scores``, ``relevant``: (n,) over the seed's candidates (the seed itself already removed);
    at least one candidate must be relevant.
    """
    n, n_rel = len(scores), int(relevant.sum())
    if n <= k:
        found, cut = float(n_rel), -np.inf
    else:
        cut = np.partition(scores, n - k)[n - k]  # the k-th largest score
        above, tied = scores > cut, scores == cut
        found = relevant[above].sum() + (k - above.sum()) * relevant[tied].sum() / tied.sum()
    before, mrr = 0, 0.0
    for value in np.unique(scores[scores >= cut])[::-1]:
        group = scores == value
        size, m = int(group.sum()), int(relevant[group].sum())
        if m:  # first relevant at position before + j with probability C(size−j, m−1) / C(size, m)
            p = m / size
            for j in range(1, min(size - m + 1, k - before) + 1):
                mrr += p / (before + j)
                if j < size:
                    p *= (size - j - m + 1) / (size - j)
            break
        before += size
        if before >= k:
            break
    return found / k, found / n_rel, mrr


def aspect_retrieval_metrics(score_rows, labels, k: int, *, chunk: int = 1024) -> dict:
    """AspectCSE retrieval: macro means over seeds of (P@k, R@k, MRR@k), seed excluded from its neighbours.

    ``score_rows(start, stop)`` gives (stop − start, n) scores of seeds start…stop−1 against all n
    documents. ``labels``: n hashable labels (relevant = equal label), or a function
    ``i -> (n,) bool`` of the documents relevant to seed i (multi-valued or combined aspects).
    """
    if callable(labels):
        relevant_to, n = labels, None
    else:
        keys = np.array(labels)
        relevant_to, n = (lambda i: keys == keys[i]), len(keys)
    n = n if n is not None else len(relevant_to(0))
    per_seed, no_relevant = [], 0
    for start in range(0, n, chunk):
        block = score_rows(start, min(start + chunk, n))
        for row, i in enumerate(range(start, min(start + chunk, n))):
            keep = np.arange(n) != i
            relevant = relevant_to(i)[keep]
            if not relevant.any():
                no_relevant += 1
                continue
            if np.isnan(block[row]).any():
                raise ValueError("scores contain NaN")
            per_seed.append(seed_metrics(block[row][keep], relevant, k))
    m = np.array(per_seed, dtype=np.float64).reshape(-1, 3)
    means = m.mean(axis=0) if len(m) else np.full(3, np.nan)
    return {f"p@{k}": float(means[0]), f"r@{k}": float(means[1]), f"mrr@{k}": float(means[2]),
            "seeds": len(m), "seeds_without_relevant": no_relevant}
