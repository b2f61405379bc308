"""The maths of PU learning (PAUSE): the annealed weight, the nnPU risk, class priors, label subsampling.

See :mod:`.pu` for the loss these make up and the trainer that uses them.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .data import Pair


def pu_weight_at(step: int, total: int, config) -> float:
    """w(t) = pu_weight · (t/T)^p for the global step t (1-based) of T (``config``: a :class:`.pu.PUConfig`)."""
    return config.pu_weight * (min(step, total) / max(total, 1)) ** config.power


def nnpu_risk(z, positive, unlabelled, prior: float):
    """Non-negative PU risk (sigmoid loss) of one class's logits ``z`` (n,); masks are bool (n,).

    Returns the value to minimise: R_p⁺ + R_n⁻ when R_n⁻ ≥ 0, else −R_n⁻ (module docstring).
    """
    import torch

    pos, unl = positive.float(), unlabelled.float()
    n_pos, n_unl = pos.sum().clamp(min=1.0), unl.sum().clamp(min=1.0)
    loss_pos, loss_neg = torch.sigmoid(-z), torch.sigmoid(z)  # ℓ(z, +1), ℓ(z, −1)
    risk_pos = prior * (pos * loss_pos).sum() / n_pos
    risk_neg = (unl * loss_neg).sum() / n_unl - prior * (pos * loss_neg).sum() / n_pos
    return torch.where(risk_neg < 0, -risk_neg, risk_pos + risk_neg)


def pu_term(logits, y, priors: np.ndarray, classes: list[int]):
    """mean over ``classes`` of nnPU risks; y (n,) class index or −1 (unlabelled). 0 when inapplicable."""
    unlabelled = y < 0
    risks = []
    if bool(unlabelled.any()):
        for k in classes:
            positive = y == k
            if bool(positive.any()):
                risks.append(nnpu_risk(logits[:, k], positive, unlabelled, float(priors[k])))
    if not risks:
        return logits.sum() * 0.0
    return sum(risks) / len(classes)


def class_priors(y_labelled: np.ndarray, n_classes: int, positive: int, prior: float | None) -> np.ndarray:
    """Per-class π: class fractions among labelled pairs; ``prior`` replaces the positive one (others rescaled)."""
    counts = np.bincount(y_labelled, minlength=n_classes).astype(np.float64)
    frac = counts / max(counts.sum(), 1.0)
    if prior is None:
        return frac
    out = frac.copy()
    rest = 1.0 - frac[positive]
    out[positive] = prior
    others = [k for k in range(n_classes) if k != positive]
    for k in others:
        out[k] = (1.0 - prior) * (frac[k] / rest if rest > 0 else 1.0 / len(others))
    return out


def subsample_labels(pairs: list[Pair], fraction: float | None, seed: int) -> list[Pair]:
    """Keep labels on exactly round(fraction × #labelled) labelled pairs (seeded); the rest become unlabelled."""
    if fraction is None or fraction >= 1:
        return list(pairs)
    labelled = [i for i, p in enumerate(pairs) if p.label is not None]
    keep_n = max(1, int(round(fraction * len(labelled)))) if labelled else 0
    rng = np.random.default_rng([seed, 0x50])
    keep = set(rng.choice(labelled, size=keep_n, replace=False).tolist()) if keep_n else set()
    return [p if p.label is None or i in keep else dataclasses.replace(p, label=None) for i, p in enumerate(pairs)]
