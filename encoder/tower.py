"""Relation-conditioned query towers: the operators of kind ``encoder`` (design.md §4).

A tower is the base encoder with LoRA deltas added to some of its linear layers; it reads the query
text marked with the relation (``marker``, e.g. ``"relation: duplicate-question; How do I …"``) and
returns a raw pooled vector in the base encoder's space, which is searched against the unchanged
document vectors of any index built with that base encoder.

Stored per tower (bundle tensors ``tower:<name>/<module>.lora_A`` (r, in) and ``.lora_B`` (out, r)):
the merged weight is W + scale · B A (scale = α / r), the standard LoRA update, so serving needs
neither ``peft`` nor a second copy of the unchanged weights on disk. Operators trained together
share one tower (one model in memory) and differ by their marker's relation name.
"""
from __future__ import annotations

import copy
import functools
import math
import string
import threading

import numpy as np

from .relations import Operator

MARKER = "relation: {relation}; {text}"
MAX_MARKER_CHARS = 256  # a template is a short prefix; its placeholders are the only fields
PLACEHOLDERS = ("relation", "text")


@functools.lru_cache(maxsize=64)
def marker_parts(template: str) -> tuple[tuple[str, str | None], ...]:
    """``((literal, placeholder | None), ...)`` of a marker template; ValueError unless it holds
    ``{text}`` and ``{relation}`` at most once each, no other field, no format spec or conversion
    (it is filled by plain concatenation, never ``str.format``), and at most MAX_MARKER_CHARS."""
    if not isinstance(template, str) or len(template) > MAX_MARKER_CHARS:
        raise ValueError(f"query tower marker must be a string of at most {MAX_MARKER_CHARS} characters")
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ValueError(f"query tower marker {template!r} is not a template ({e})") from None
    parts = []
    for literal, name, spec, conversion in fields:
        if name is not None and (name not in PLACEHOLDERS or spec or conversion):
            raise ValueError(f"query tower marker {template!r}: only the placeholders {{relation}} and {{text}} "
                             "are allowed, without format specs or conversions")
        parts.append((literal, name))
    names = [name for _, name in parts]
    if names.count("text") > 1 or names.count("relation") > 1:
        raise ValueError(f"query tower marker {template!r} may hold {{text}} and {{relation}} once each")
    return tuple(parts)


def marked(template: str, relation: str, texts: list[str]) -> list[str]:
    """The texts as the tower reads them: ``template`` filled with the relation and each text."""
    parts = marker_parts(template)
    return ["".join(literal + ({"relation": relation, "text": t}[name] if name else "") for literal, name in parts)
            for t in texts]


def lora_pairs(params: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{module: (A (r, in), B (out, r))}`` from tensors named ``<module>.lora_A`` / ``<module>.lora_B``."""
    modules = {k.rsplit(".", 1)[0] for k in params}
    pairs = {}
    for m in sorted(modules):
        a, b = params.get(f"{m}.lora_A"), params.get(f"{m}.lora_B")
        if a is None or b is None or a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1] or a.shape[0] < 1:
            raise ValueError(f"query tower module {m!r}: needs lora_A (r, in) and lora_B (out, r) of one rank")
        pairs[m] = (a, b)
    return pairs


def check_lora(model, params: dict[str, np.ndarray], scale: object) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The LoRA pairs of ``params`` once each is known to fit ``model`` — B A has exactly the shape
    of the module's weight and the rank is at most its smaller side, so no delta is larger than the
    weight it changes — checked from the shapes alone, before any product is computed."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"query tower scale must be a finite number, got {scale!r}")
    pairs = lora_pairs(params)
    for module, (a, b) in pairs.items():
        try:
            weight = model.get_submodule(module).weight
        except AttributeError as e:
            raise ValueError(f"query tower module {module!r} is not in the base encoder ({e})") from None
        shape, rank = tuple(weight.shape), a.shape[0]
        if len(shape) != 2 or (b.shape[0], a.shape[1]) != shape or rank > min(shape):
            raise ValueError(f"query tower module {module!r}: lora_B {tuple(b.shape)} x lora_A {tuple(a.shape)} "
                             f"does not fit its weight {shape}")
    return pairs


def merge_lora(model, params: dict[str, np.ndarray], scale: float) -> None:
    """Add scale · B A to the weight of each named linear module of ``model`` (in place); every
    shape is checked (:func:`check_lora`) before the first product."""
    import torch

    for module, (a, b) in check_lora(model, params, scale).items():
        weight = model.get_submodule(module).weight
        delta = scale * (torch.from_numpy(np.asarray(b, np.float32)) @ torch.from_numpy(np.asarray(a, np.float32)))
        with torch.no_grad():
            weight.copy_((weight.float() + delta.to(weight.device)).to(weight.dtype))


def attach_towers(operators: dict[str, Operator], encoder) -> None:
    """Give every ``encoder`` operator of ``operators`` its ``query_tower``, built on ``encoder``
    (an :class:`~.model.Encoder` of the tower's base: its weights fingerprint must match).

    Cheap and checked here: the base, the marker and every LoRA shape against ``encoder``'s model.
    The merged model itself is built lazily, when the operator first encodes a query, so a command
    that never uses a tower never copies the transformer. Operators sharing a tower name share one
    merged model. Already attached operators are kept.
    """
    built: dict[str, _LazyTower] = {}
    for op in operators.values():
        if not op.needs_text or op.query_tower is not None:  # a query tower reads the text (encoder/kinds.py)
            continue
        tower = op.info["tower"]
        base = encoder.identity["weights_sha256"]
        if tower["base"] != base:
            raise ValueError(f"relation {op.name!r} is a query encoder trained on encoder weights {tower['base']}, "
                             f"but this encoder's are {base}; use an index built with its base encoder")
        try:
            marker_parts(tower["marker"])
            check_lora(encoder.model, op.params, tower["scale"])
        except ValueError as e:
            raise ValueError(f"relation {op.name!r} (query encoder): {e}") from None
        if tower["name"] not in built:
            built[tower["name"]] = _LazyTower(encoder, op.params, float(tower["scale"]))
        op.query_tower = _encode_marked(built[tower["name"]], tower["marker"], op.name)


class _LazyTower:
    """The base encoder with a tower's LoRA merged in, built on first use (once, thread-safe)."""

    def __init__(self, encoder, params: dict[str, np.ndarray], scale: float):
        self.encoder, self.params, self.scale = encoder, params, scale
        self.variant = None
        self.lock = threading.Lock()

    def get(self):
        with self.lock:
            if self.variant is None:
                variant = copy.copy(self.encoder)  # same tokenizer, batching and pooling; its own weights
                variant.model = copy.deepcopy(self.encoder.model)
                merge_lora(variant.model, self.params, self.scale)
                variant.model.eval()
                self.variant = variant
            return self.variant


def _encode_marked(tower: _LazyTower, template: str, relation: str):
    def encode(texts: list[str]) -> np.ndarray:
        return tower.get().encode(marked(template, relation, texts)).vectors

    return encode
