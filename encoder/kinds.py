"""Operator kinds, registered in one place: each kind's parameters and their shapes, its numpy map
(what a query runs), its torch init and forward (what training runs), and what it needs.

    kind          q (before normalising)          params     documents        reads
    identity      h                               —          t̂                h
    translation   h + r                           r (d)      t̂                h
    linear        W h + b                         W (d, d), b t̂                h
    projection    P h                             P (k, d)   normalize(P t̂)   h
    encoder       tower(marker(relation, text))   LoRA       t̂                the query text

encoder/relations.py's :class:`~.relations.Operator` asks its kind for all of these, so a new kind
is one entry here; trainers (encoder/training/) take :attr:`Kind.init`, :attr:`Kind.forward` and
:attr:`Kind.lr`, bench linkpred's head prediction :attr:`Kind.plain` and :attr:`Kind.inverse`.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Kind:
    """One operator kind. ``map``: raw vectors h (n, d) and params → q before normalising (None for a
    kind that reads text); ``shapes_ok``: the parameter shapes fit; ``dim``: the vector size the
    params fix (None when they fix none); ``init`` (d, torch generator, device) → trainable
    tensors and ``forward`` (params, h) → q before normalising, and ``lr`` their default learning
    rate, for the trainable kinds. ``plain``: q = ĥ, plain cosine (the baseline every relation is
    measured against; symmetric, so it is its own inverse). ``inverse``: params → the params of the
    same kind's inverse map, which asks (?, r, t) from the tail when a bundle has no trained
    ``r^-1`` (None: the kind has none used in closed form)."""

    name: str
    params: tuple[str, ...] = ()
    map: Callable[[dict, np.ndarray], np.ndarray] | None = None
    shapes_ok: Callable[[dict], bool] = lambda shapes: True
    dim: Callable[[dict], int | None] = lambda params: None
    both_sides: bool = False
    needs_text: bool = False
    init: Callable | None = None
    forward: Callable | None = None
    lr: float | None = None
    plain: bool = False
    inverse: Callable[[dict], dict] | None = None

    def __reduce__(self):  # pickled by name (an Operator carries its Kind; lambdas do not pickle)
        return kind_of, (self.name,)


def _init_translation(d: int, gen, device: str = "cpu") -> dict:
    import torch

    return {"r": (torch.randn(d, generator=gen, device=device) * 0.02).requires_grad_()}  # starts near identity


def _init_linear(d: int, gen, device: str = "cpu") -> dict:
    import torch

    return {"W": torch.eye(d, device=device).requires_grad_(), "b": torch.zeros(d, device=device).requires_grad_()}


REGISTRY: dict[str, Kind] = {k.name: k for k in (
    Kind("identity", map=lambda p, h: h, plain=True),
    # a vector moves further per step than a matrix needs to: 1e-2 against 3e-3
    Kind("translation", ("r",), map=lambda p, h: h + p["r"], shapes_ok=lambda s: len(s["r"]) == 1,
         dim=lambda p: int(p["r"].shape[0]), init=_init_translation, forward=lambda p, h: h + p["r"], lr=1e-2,
         inverse=lambda p: {"r": -p["r"]}),  # (?, r, t): q = normalize(h_t − r)
    Kind("linear", ("W", "b"), map=lambda p, h: h @ p["W"].T + p["b"],
         shapes_ok=lambda s: len(s["W"]) == 2 and s["W"][0] == s["W"][1] and s["b"] == (s["W"][0],),
         dim=lambda p: int(p["W"].shape[1]), init=_init_linear, forward=lambda p, h: h @ p["W"].T + p["b"], lr=3e-3),
    Kind("projection", ("P",), map=lambda p, h: h @ p["P"].T, shapes_ok=lambda s: len(s["P"]) == 2 and 0 not in s["P"],
         dim=lambda p: int(p["P"].shape[1]), both_sides=True),
    Kind("encoder", needs_text=True),
)}
KINDS = tuple(REGISTRY)
TRAINABLE = tuple(name for name, kind in REGISTRY.items() if kind.init is not None)  # relsearch train --operator


INVERTIBLE = tuple(name for name, kind in REGISTRY.items() if kind.plain or kind.inverse is not None)


def kind_of(name: str) -> Kind:
    """The registered kind ``name``; ValueError naming the kinds otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown operator kind {name!r}; choose one of {', '.join(KINDS)}") from None


def trained_kind(params: dict) -> Kind:
    """The trainable kind whose parameters ``params`` holds (a trainer's ``{"r"}`` or ``{"W", "b"}``);
    ValueError naming each trainable kind's parameters otherwise."""
    for name in TRAINABLE:
        if set(REGISTRY[name].params) == set(params):
            return REGISTRY[name]
    raise ValueError(f"no trainable operator kind has parameters {sorted(params)}; "
                     + "; ".join(f"{n}: {', '.join(REGISTRY[n].params)}" for n in TRAINABLE))
