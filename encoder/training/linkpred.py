"""Link prediction for the triple trainers: the operators' torch forms and the evaluation protocol.

:func:`init_params` / :func:`forward` are the trainable (torch) forms of the ``translation`` and
``linear`` operators of encoder/relations.py, shared by the adapter (:mod:`.rse`) and the joint
regime (:mod:`.rse_joint`); :func:`link_prediction` is the filtered ranking protocol (``PROTOCOL``)
every triple trainer uses for dev early stopping and test metrics.
"""
from __future__ import annotations

import numpy as np

from ..metrics import Ranks, rank_gold, ranking_metrics
from ..kinds import TRAINABLE, kind_of, trained_kind
from ..relations import normalize
from .splits import RelationSplit

PROTOCOL = ("link prediction on the test triples of the relation: candidates = all distinct heads and "
            "tails of those triples; filtered (other true tails of the head in train/dev/test removed); "
            "query itself excluded; realistic ranks (expectation under random tie-breaking)")


def init_params(kind: str, d: int, gen, device: str = "cpu") -> dict:
    """A relation's trainable tensors on ``device`` (``gen``, a generator on that device, draws them):
    the kind's ``init`` (encoder/kinds.py). ``translation``: r ~ N(0, 0.02); ``linear``: W = I,
    b = 0 (so the start is plain cosine)."""
    init = kind_of(kind).init
    if init is None:
        raise ValueError(f"operator kind {kind!r} is not trained here; choose one of {', '.join(TRAINABLE)}")
    return init(d, gen, device)


def forward(params: dict, h):
    """Unit query vectors of raw vectors ``h`` (torch) under ``params`` (``r``, or ``W`` and ``b``):
    the kind's ``forward`` (encoder/kinds.py), normalised."""
    import torch.nn.functional as F

    return F.normalize(trained_kind(params).forward(params, h), dim=-1)


def numpy_apply(params: dict):
    """:func:`forward` as a numpy function without gradients (what :func:`link_prediction` calls)."""
    import torch

    def apply(h: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return forward(params, torch.from_numpy(np.ascontiguousarray(h))).numpy()

    return apply


def link_ranks(apply, vectors: np.ndarray, split: RelationSplit, known: dict[int, set[int]], *,
               chunk: int = 2048) -> tuple[Ranks, int]:
    """Filtered ranks of each query's gold tail under ``apply`` (raw (n, d) → unit (n, d)) on ``split``
    (see ``PROTOCOL``), and the number of candidates."""
    cand = np.unique(np.concatenate([split.head, split.tail]))
    pos = np.full(len(vectors), -1, dtype=np.int64)
    pos[cand] = np.arange(len(cand))
    cand_unit = normalize(vectors[cand])
    rows = np.arange(len(split)) if split.query_rows is None else split.query_rows
    parts = []
    for start in range(0, len(rows), chunk):
        heads, tails = split.head[rows[start:start + chunk]], split.tail[rows[start:start + chunk]]
        scores = apply(vectors[heads]) @ cand_unit.T
        filt = np.zeros(scores.shape, dtype=bool)
        for row, h in enumerate(heads.tolist()):
            p = pos[list(known[h])]
            filt[row, p[p >= 0]] = True
        parts.append(rank_gold(scores, pos[tails], filter_mask=filt, exclude=pos[heads]))
    return Ranks.concat(parts), len(cand)


def link_prediction(apply, vectors: np.ndarray, split: RelationSplit, known: dict[int, set[int]], *,
                    chunk: int = 2048) -> tuple[dict, int, int]:
    """Metrics of ``apply`` (raw (n, d) → unit (n, d)) on ``split``; see ``PROTOCOL``.

    Returns (metrics, n_queries, n_candidates).
    """
    ranks, n_candidates = link_ranks(apply, vectors, split, known, chunk=chunk)
    return ranking_metrics(ranks), len(ranks), n_candidates


def trained_vs_identity(apply, vectors: np.ndarray, test: RelationSplit, known: dict[int, set[int]]) -> dict:
    """``operator.info["metrics"]`` of a triple trainer: ``apply`` and identity (plain cosine) on ``test``."""
    metrics = {"split": "test", "protocol": PROTOCOL}
    if len(test):
        for label, fn in (("trained", apply), ("identity", normalize)):
            metrics[label], metrics["queries"], metrics["candidates"] = link_prediction(fn, vectors, test, known)
            metrics[label] = {k: round(v, 5) for k, v in metrics[label].items()}
    return metrics
