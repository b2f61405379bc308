"""The PAUSE pair model and its evaluation: projection + classifier head, classification and retrieval metrics.

:func:`build_model` is the trainable torch form of :class:`~relsearch.encoder.heads.PairHead`
(:func:`head_params` exports it); :func:`classification_metrics` scores the head,
:func:`retrieval_metrics` the ANN operator (``OPERATOR_PROTOCOL``).
"""
from __future__ import annotations

import numpy as np

from ..metrics import Ranks, rank_gold, ranking_metrics
from ..relations import normalize

OPERATOR_PROTOCOL = ("retrieval on the test pairs labelled with the positive label: query = a, gold = b, "
                     "candidates = all distinct texts of the test pairs; filtered (other positive partners of a "
                     "removed); query itself excluded; realistic ranks (expectation under random tie-breaking)")


def build_model(d: int, n_classes: int, hidden: int):
    import torch

    class PUModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.P = torch.nn.Parameter(torch.eye(d))
            self.fc1 = torch.nn.Linear(4 * d, hidden)
            self.fc2 = torch.nn.Linear(hidden, n_classes)

        def forward(self, h_a, h_b):
            u, v = h_a @ self.P.T, h_b @ self.P.T
            x = torch.cat([u, v, (u - v).abs(), u * v], dim=-1)
            return self.fc2(torch.nn.functional.elu(self.fc1(x)))

    return PUModel()


def head_params(model) -> dict[str, np.ndarray]:
    return {"P": model.P.detach().cpu().numpy().copy(), "W1": model.fc1.weight.detach().cpu().numpy().copy(),
            "b1": model.fc1.bias.detach().cpu().numpy().copy(), "W2": model.fc2.weight.detach().cpu().numpy().copy(),
            "b2": model.fc2.bias.detach().cpu().numpy().copy()}


def classification_metrics(pred: np.ndarray, gold: np.ndarray, n_classes: int, labels: list[str]) -> dict:
    """Accuracy, macro F1 and per-class F1 of class indices ``pred`` against ``gold``."""
    f1 = {}
    for k in range(n_classes):
        tp = int(((pred == k) & (gold == k)).sum())
        fp, fn = int(((pred == k) & (gold != k)).sum()), int(((pred != k) & (gold == k)).sum())
        f1[labels[k]] = 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)
    return {"accuracy": round(float((pred == gold).mean()) if len(gold) else float("nan"), 5),
            "macro_f1": round(float(np.mean(list(f1.values()))), 5),
            "f1": {k: round(v, 5) for k, v in f1.items()}, "pairs": int(len(gold))}


def retrieval_metrics(apply, vectors: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[dict, int, int]:
    """Rank each gold b for query a among all texts of the split (see ``OPERATOR_PROTOCOL``)."""
    cand = np.unique(np.concatenate([a, b]))
    pos = np.full(len(vectors), -1, dtype=np.int64)
    pos[cand] = np.arange(len(cand))
    known: dict[int, set[int]] = {}
    for x, y in zip(a.tolist(), b.tolist()):
        known.setdefault(x, set()).add(y)
    keep = a != b
    a, b = a[keep], b[keep]
    cand_unit = normalize(vectors[cand])
    parts = []
    for start in range(0, len(a), 2048):
        qa, qb = a[start:start + 2048], b[start:start + 2048]
        scores = apply(vectors[qa]) @ cand_unit.T
        filt = np.zeros(scores.shape, dtype=bool)
        for row, x in enumerate(qa.tolist()):
            filt[row, pos[list(known[x])]] = True
        parts.append(rank_gold(scores, pos[qb], filter_mask=filt, exclude=pos[qa]))
    return ranking_metrics(Ranks.concat(parts)), len(a), len(cand)
