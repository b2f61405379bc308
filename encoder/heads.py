"""Pair heads: re-rankers stored in a bundle beside the relation operators (design.md §4, PAUSE).

A :class:`PairHead` scores a pair of texts from their *raw* pooled vectors ``h_a``, ``h_b`` (the
same vectors operators act on; an index keeps them as ``t̂ · ‖h‖``)::

    u = P h_a,  v = P h_b                    (P: d×d projection, shared by both sides; optional)
    x = [u; v; |u − v|; u ⊙ v]               (4d)
    logits = W2 · ELU(W1 x + b1) + b2        (K classes)
    probabilities = softmax(logits);  score = P(positive label)

It is numpy only (no torch at query time). In a bundle its parameters are the tensors
``head:<name>/<param>`` of ``operators.safetensors`` and its description is an entry of the
manifest's ``"heads"`` list (see :meth:`PairHead.manifest_entry`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

HEAD_KINDS = ("pair-classifier",)
TENSOR_PREFIX = "head:"  # tensors "head:<name>/<param>" in operators.safetensors


@dataclass(kw_only=True)
class PairHead:
    """A pair classifier over [u; v; |u−v|; u⊙v]; ``params``: optional ``P``, and ``W1``, ``b1``, ``W2``, ``b2``."""

    name: str
    labels: tuple[str, ...]
    positive: str
    params: dict[str, np.ndarray] = field(default_factory=dict)
    kind: str = "pair-classifier"
    description: str = ""
    info: dict = field(default_factory=dict)  # training data, hyperparameters, metrics

    def __post_init__(self):
        if self.kind not in HEAD_KINDS:
            raise ValueError(f"head {self.name!r}: unknown kind {self.kind!r}; choose one of {', '.join(HEAD_KINDS)}")
        self.labels = tuple(str(x) for x in self.labels)
        if self.positive not in self.labels:
            raise ValueError(f"head {self.name!r}: positive label {self.positive!r} is not one of its labels "
                             f"{', '.join(self.labels)}")
        missing = {"W1", "b1", "W2", "b2"} - set(self.params)
        if missing:
            raise ValueError(f"head {self.name!r} lacks parameters {sorted(missing)}")
        self.params = {k: np.asarray(v, dtype=np.float32) for k, v in self.params.items()}
        w1, w2 = self.params["W1"], self.params["W2"]
        d = w1.shape[1] // 4
        ok = (w1.ndim == 2 and w1.shape[1] == 4 * d and self.params["b1"].shape == (w1.shape[0],)
              and w2.shape == (len(self.labels), w1.shape[0]) and self.params["b2"].shape == (len(self.labels),))
        if "P" in self.params:
            ok = ok and self.params["P"].shape == (d, d)
        if not ok:
            raise ValueError(f"head {self.name!r}: inconsistent parameter shapes "
                             f"{ {k: v.shape for k, v in sorted(self.params.items())} } for {len(self.labels)} labels")

    @property
    def dim(self) -> int:
        return int(self.params["W1"].shape[1] // 4)

    @property
    def projection(self) -> str:
        return "linear" if "P" in self.params else "none"

    @property
    def positive_index(self) -> int:
        return self.labels.index(self.positive)

    def logits(self, h_a: np.ndarray, h_b: np.ndarray) -> np.ndarray:
        """(n, K) class logits for raw vectors ``h_a``, ``h_b`` (n, d) (a single (d,) row is broadcast)."""
        h_a, h_b = np.atleast_2d(np.asarray(h_a, np.float32)), np.atleast_2d(np.asarray(h_b, np.float32))
        if h_a.shape[1] != self.dim or h_b.shape[1] != self.dim:
            raise ValueError(f"head {self.name!r} expects {self.dim}-d vectors, got {h_a.shape[1]} and {h_b.shape[1]}")
        h_a, h_b = np.broadcast_arrays(h_a, h_b)
        p = self.params
        u, v = (h_a @ p["P"].T, h_b @ p["P"].T) if "P" in p else (h_a, h_b)
        x = np.concatenate([u, v, np.abs(u - v), u * v], axis=1)
        z = x @ p["W1"].T + p["b1"]
        z = np.where(z > 0, z, np.expm1(np.minimum(z, 0)))  # ELU
        return (z @ p["W2"].T + p["b2"]).astype(np.float32)

    def probabilities(self, h_a: np.ndarray, h_b: np.ndarray) -> np.ndarray:
        """(n, K) softmax probabilities, columns in ``labels`` order."""
        z = self.logits(h_a, h_b)
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)

    def score(self, h_a: np.ndarray, h_b: np.ndarray) -> np.ndarray:
        """(n,) P(positive label | a, b): the re-ranking score."""
        return self.probabilities(h_a, h_b)[:, self.positive_index]

    def predict(self, h_a: np.ndarray, h_b: np.ndarray) -> list[str]:
        return [self.labels[i] for i in self.logits(h_a, h_b).argmax(axis=1)]

    # ------------------------------------------------------------------------------ persistence
    def tensors(self) -> dict[str, np.ndarray]:
        return {f"{TENSOR_PREFIX}{self.name}/{k}": np.ascontiguousarray(v, dtype=np.float32)
                for k, v in self.params.items()}

    def manifest_entry(self) -> dict:
        return {"name": self.name, "kind": self.kind, "description": self.description, "labels": list(self.labels),
                "positive": self.positive, "projection": self.projection, "dim": self.dim, "info": self.info}

    @classmethod
    def from_manifest(cls, entry: dict, tensors: dict[str, np.ndarray]) -> "PairHead":
        prefix = f"{TENSOR_PREFIX}{entry['name']}/"
        params = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        return cls(name=entry["name"], kind=entry.get("kind", "pair-classifier"), labels=tuple(entry["labels"]),
                   positive=entry["positive"], description=entry.get("description", ""), params=params,
                   info=dict(entry.get("info", {})))


def lookup_head(heads: dict[str, PairHead], name: str, where: str = "the bundle") -> PairHead:
    try:
        return heads[name]
    except KeyError:
        have = ", ".join(sorted(heads)) or "none"
        raise KeyError(f"{where} has no re-ranking head {name!r}; heads available: {have} "
                       "(train one with `relsearch train --objective pu`)") from None
