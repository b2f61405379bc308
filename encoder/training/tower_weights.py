"""The weights a query tower tunes (encoder/training/tower.py), and the LoRA pairs they are stored as.

A tower tunes the linear layers named :data:`LORA_TARGETS` in its top transformer layers: their
whole weights (:func:`tune_whole_weights`, kept as exact full-rank pairs by :func:`whole_deltas`)
or peft LoRA deltas (:func:`lora_state`). Either way the bundle holds ``<module>.lora_A`` /
``<module>.lora_B`` pairs, which encoder/tower.py merges when it serves the tower.
"""
from __future__ import annotations

import re

import numpy as np

LORA_TARGETS = ("query", "key", "value", "dense")  # BERT-family linear layers (attention and feed-forward)


def tuned_layers(model, layers: int | None) -> list[int] | None:
    """Indices of the top ``layers`` transformer layers of ``model``; None for all of them."""
    n = int(model.config.num_hidden_layers)
    return list(range(n - layers, n)) if layers and layers < n else None


def tune_whole_weights(model, layers: list[int] | None) -> dict[str, object]:
    """Freeze ``model`` except the weights of its ``LORA_TARGETS`` linear layers in transformer layers
    ``layers`` (None: all); returns those weights by module path. Biases and layer norms stay frozen:
    the tuned state is then exactly a set of weight deltas, which the bundle stores as LoRA pairs."""
    import torch

    for p in model.parameters():
        p.requires_grad_(False)
    out = {}
    for name, module in model.named_modules():
        index = re.search(r"\.layer\.(\d+)\.", name)
        if (isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in LORA_TARGETS and index
                and (layers is None or int(index.group(1)) in layers)):
            out[name] = module.weight.requires_grad_(True)
    return out


def whole_deltas(weights: dict[str, object], base: dict[str, object]) -> dict[str, np.ndarray]:
    """``weights`` − ``base`` per module as an exact LoRA pair of full rank, scale 1: ``B = ΔW, A = I``
    (or ``B = I, A = ΔW`` when the layer widens), so W + B A is the tuned weight."""
    out = {}
    for module, w in weights.items():
        delta = (w.detach().float() - base[module]).cpu().numpy()
        eye = np.eye(min(delta.shape), dtype=np.float32)
        a, b = (eye, delta) if delta.shape[1] <= delta.shape[0] else (delta, eye)
        out[f"{module}.lora_A"], out[f"{module}.lora_B"] = a, np.ascontiguousarray(b)
    return out


def lora_state(model) -> dict[str, object]:
    """``{"<module>.lora_A": (r, in), "<module>.lora_B": (out, r)}`` tensors of a peft LoRA model, named
    by the module's path in the base model (what encoder/tower.py merges)."""
    out = {}
    for name, p in model.named_parameters():
        if ".lora_A." in name or ".lora_B." in name:
            module, kind = name.split(".lora_")
            out[f"{module.removeprefix('base_model.model.')}.lora_{kind[0]}"] = p
    return out
