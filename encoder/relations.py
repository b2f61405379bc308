"""Relation operators: raw query vectors h (n, d) → relational query vectors (design.md §3).

Operators act on the *raw* pooled vector and return unit vectors, so an inner-product search over
unit document vectors scores ``cos(op(h), t)``. They are stateless apart from their parameters.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .kinds import KINDS, Kind, kind_of  # noqa: F401  (KINDS re-exported: bundle.py reads it from here)

TOWER_KEYS = ("name", "marker", "scale", "base")  # what info["tower"] of an encoder operator holds


def normalize(x: np.ndarray) -> np.ndarray:
    """Row-normalise (n, d) float32; zero rows stay zero."""
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


@dataclass(kw_only=True)
class Operator:
    """A named relation operator.

    kind ``identity``: q = ĥ;  ``translation``: q = normalize(h + r);
    ``linear``: q = normalize(h Wᵀ + b);  ``projection``: q = normalize(h Pᵀ) on *both* sides — the
    documents searched are normalize(t̂ Pᵀ) too (:meth:`documents`), so such an operator is searched
    in its own projected copy of the index (design.md §3: maps on both sides do not collapse).
    ``encoder``: q = normalize(tower(marker(relation, query text))) — a relation-conditioned query
    encoder (encoder/tower.py): the base encoder plus LoRA deltas, reading the query *text* marked
    with the relation; documents stay in the base encoder's space, so any index of that encoder
    serves it. It ignores h, needs the text, and works once :func:`~.tower.attach_towers` has set
    its ``query_tower`` (texts → raw (n, d) vectors); its ``info["tower"]`` describes the tower.
    ``params`` holds ``r``, ``W``/``b``, ``P`` or the tower's LoRA tensors as float32 arrays.
    """

    name: str
    kind: str
    description: str = ""
    params: dict[str, np.ndarray] = field(default_factory=dict)
    info: dict = field(default_factory=dict)  # training data, hyperparameters, metrics
    # kind "encoder" only: set at run time by encoder/tower.py (it needs the base transformer)
    query_tower: Callable[[list[str]], np.ndarray] | None = field(default=None, repr=False, compare=False)
    # the registered Kind of ``kind``, looked up once here rather than on every apply
    _kind: Kind = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"operator {self.name!r}: unknown kind {self.kind!r}; choose one of {', '.join(KINDS)}")
        kind = self._kind = kind_of(self.kind)
        missing = set(kind.params) - set(self.params)
        if missing:
            raise ValueError(f"operator {self.name!r} ({self.kind}) lacks parameters {sorted(missing)}")
        shapes = {k: np.shape(v) for k, v in self.params.items()}
        if not kind.shapes_ok(shapes):
            raise ValueError(f"operator {self.name!r} ({self.kind}): parameter shapes {shapes} do not fit its kind")
        if kind.needs_text:
            tower = self.info.get("tower")
            absent = [k for k in TOWER_KEYS if not isinstance(tower, dict) or k not in tower]
            if absent or not self.params:
                raise ValueError(f"operator {self.name!r} (encoder) lacks its query tower "
                                 f"({'LoRA tensors' if not self.params else 'tower ' + ', '.join(absent)})")

    @property
    def dim(self) -> int | None:
        return self._kind.dim(self.params)

    @property
    def needs_text(self) -> bool:
        """True when the operator reads the query text rather than its vector (kind ``encoder``)."""
        return self._kind.needs_text

    @property
    def both_sides(self) -> bool:
        """True when documents must be transformed too (:meth:`documents` is not the identity)."""
        return self._kind.both_sides

    def apply(self, h: np.ndarray, texts: list[str] | None = None) -> np.ndarray:
        """(n, d) raw vectors → (n, d) unit query vectors; kind ``encoder`` reads ``texts`` (n) instead."""
        if self.needs_text:
            if self.query_tower is None:
                raise ValueError(f"relation {self.name!r} is a query encoder (kind encoder): it needs its base "
                                 "transformer, which this command does not load")
            if texts is None:
                raise ValueError(f"relation {self.name!r} is a query encoder (kind encoder): it needs the query "
                                 "text, not only its vector")
            return normalize(self.query_tower(list(texts)))
        h = np.asarray(h, dtype=np.float32)
        return normalize(h if self._kind.plain else self._kind.map(self.params, h))  # a plain kind's map is h itself

    def documents(self, unit: np.ndarray) -> np.ndarray:
        """The document side of the score: unit vectors t̂ (n, d) as this operator compares them.

        Query-side operators leave documents alone; a projection maps them like queries
        (normalize(P t̂) = normalize(P h_t): the norm of h does not matter, no bias).
        """
        return normalize(np.asarray(unit, dtype=np.float32) @ self.params["P"].T) if self.both_sides else unit


IDENTITY = Operator(name="identity", kind="identity", description="plain cosine similarity (no relation)")


def parse_relation_args(specs: list[str] | tuple[str, ...]) -> dict[str, float]:
    """``["a=0.7", "b=0.3"]`` or ``["a"]`` → ``{"a": 0.7, "b": 0.3}``; empty → identity. A relation
    given twice is a ValueError (its weights would silently add up), as a JSON mixture names each once."""
    weights: dict[str, float] = {}
    for spec in specs:
        name, sep, w = spec.partition("=")
        name = name.strip()
        if not name:
            raise ValueError(f"empty relation name in {spec!r}")
        if name in weights:
            raise ValueError(f"relation {name!r} given twice: give each relation once, with its weight")
        try:
            weights[name] = float(w) if sep else 1.0
        except ValueError as e:
            raise ValueError(f"relation weight in {spec!r} is not a number") from e
        if not np.isfinite(weights[name]):
            raise ValueError(f"relation weight in {spec!r} is not a finite number")
    return weights or {"identity": 1.0}


def mixture_query(operators: dict[str, Operator], h: np.ndarray, weights: dict[str, float],
                  texts: list[str] | None = None) -> np.ndarray:
    """Σ_k w_k · op_k(h): one query vector whose inner product with t̂ is Σ_k w_k cos(op_k(h), t).

    Not renormalised, so scores stay the exact weighted sum of per-relation cosines. ``texts`` (n):
    the query texts, which ``encoder`` operators read (their unit vector joins the sum like any other).
    """
    q = np.zeros_like(np.asarray(h, dtype=np.float32))
    for name, w in weights.items():
        if not np.isfinite(w):  # a NaN weight would score every document NaN: nothing ranks
            raise ValueError(f"the weight of relation {name!r} is not a finite number")
        if lookup(operators, name).both_sides and len(weights) > 1:
            raise ValueError(f"{name!r} projects documents too (its own index); query it alone, not in a mixture")
    for name, w in weights.items():
        q += np.float32(w) * lookup(operators, name).apply(h, texts)
    return q


def lookup(operators: dict[str, Operator], name: str) -> Operator:
    try:
        return operators[name]
    except KeyError:
        raise KeyError(f"unknown relation {name!r}; available: {', '.join(sorted(operators))}") from None
