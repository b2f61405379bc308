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

import numpy as np

from .relations import Operator

MARKER = "relation: {relation}; {text}"


def marked(template: str, relation: str, texts: list[str]) -> list[str]:
    """The texts as the tower reads them: ``template`` filled with the relation and each text."""
    return [template.format(relation=relation, text=t) for t in texts]


def lora_pairs(params: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{module: (A (r, in), B (out, r))}`` from tensors named ``<module>.lora_A`` / ``<module>.lora_B``."""
    modules = {k.rsplit(".", 1)[0] for k in params}
    pairs = {}
    for m in sorted(modules):
        a, b = params.get(f"{m}.lora_A"), params.get(f"{m}.lora_B")
        if a is None or b is None or a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
            raise ValueError(f"query tower module {m!r}: needs lora_A (r, in) and lora_B (out, r) of one rank")
        pairs[m] = (a, b)
    return pairs


def merge_lora(model, params: dict[str, np.ndarray], scale: float) -> None:
    """Add scale · B A to the weight of each named linear module of ``model`` (in place)."""
    import torch

    for module, (a, b) in lora_pairs(params).items():
        try:
            weight = model.get_submodule(module).weight
        except AttributeError as e:
            raise ValueError(f"query tower module {module!r} is not in the base encoder ({e})") from None
        delta = scale * (torch.from_numpy(np.asarray(b, np.float32)) @ torch.from_numpy(np.asarray(a, np.float32)))
        if tuple(delta.shape) != tuple(weight.shape):
            raise ValueError(f"query tower module {module!r}: delta {tuple(delta.shape)} vs weight {tuple(weight.shape)}")
        with torch.no_grad():
            weight.copy_((weight.float() + delta.to(weight.device)).to(weight.dtype))


def attach_towers(operators: dict[str, Operator], encoder) -> None:
    """Give every ``encoder`` operator of ``operators`` its ``query_tower``, built on ``encoder``
    (an :class:`~.model.Encoder` of the tower's base: its weights fingerprint must match).

    Operators sharing a tower name share one merged model. Already attached operators are kept.
    """
    built: dict[str, object] = {}
    for op in operators.values():
        if op.kind != "encoder" or op.query_tower is not None:
            continue
        tower = op.info["tower"]
        base = encoder.identity["weights_sha256"]
        if tower["base"] != base:
            raise ValueError(f"relation {op.name!r} is a query encoder trained on encoder weights {tower['base']}, "
                             f"but this encoder's are {base}; use an index built with its base encoder")
        if tower["name"] not in built:
            variant = copy.copy(encoder)  # same tokenizer, batching and pooling; its own weights
            variant.model = copy.deepcopy(encoder.model)
            merge_lora(variant.model, op.params, float(tower["scale"]))
            variant.model.eval()
            built[tower["name"]] = variant
        op.query_tower = _encode_marked(built[tower["name"]], tower["marker"], op.name)


def _encode_marked(variant, template: str, relation: str):
    def encode(texts: list[str]) -> np.ndarray:
        return variant.encode(marked(template, relation, texts)).vectors

    return encode
