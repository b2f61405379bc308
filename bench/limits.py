"""What the hardware allows for the encoder, measured in the same run as the encoder itself.

Two limits, so `bench speed` can say how far relsearch is from each:

- **the matrix limit**: FLOP/s of the model's largest matrix product (tokens × d @ d × ffn, the
  feed-forward layer, at the encoder's batch size) in the encoder's dtype and, for reference, in
  bf16 — what the cores (AMX, AVX) or the GPU's tensor cores deliver on this model's shapes. The
  encoder's useful work is :func:`model_flops` (real tokens only, padding not counted), so
  achieved FLOP/s ÷ this limit is the share of the machine's matrix rate that relsearch turns
  into sentences.
- **the model alone**: sentences/s of the same model fed pre-tokenised, length-sorted batches
  already on its device — what is left when tokenising, copying and pooling cost nothing.
"""
from __future__ import annotations

import time

import numpy as np

PROBE_ROWS = 4096  # rows of the probe's matrix product: the shape of a full CPU batch, cheap in slow dtypes


def model_flops(config, lengths: np.ndarray) -> float:
    """FLOPs (2 per multiply-add) of one forward of a BERT-style encoder over sequences of these
    token ``lengths`` (no padding): per layer and token 8·d² (Q, K, V, output) + 4·d·ffn
    (feed-forward), plus 4·L·d per token for attention scores and their weighted sum."""
    d, ffn, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    n = np.asarray(lengths, dtype=np.float64)
    return float(layers * (n * (8 * d * d + 4 * d * ffn) + 4 * n * n * d).sum())


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def matrix_limit(device: str, dtype, *, d: int, ffn: int, rows: int = PROBE_ROWS, seconds: float = 0.5,
                 rounds: int = 3) -> float:
    """Best FLOP/s over ``rounds`` of (rows × d) @ (d × ffn) products in ``dtype`` on ``device``."""
    import torch

    a = torch.randn(rows, d, device=device).to(dtype)
    b = torch.randn(d, ffn, device=device).to(dtype)
    flops = 2.0 * rows * d * ffn
    best = 0.0
    with torch.inference_mode():
        a @ b  # warm: kernel selection, thread pool
        _sync(device)
        for _ in range(rounds):
            count, started = 0, time.perf_counter()
            while count == 0 or time.perf_counter() - started < seconds:
                a @ b
                count += 1
                if count % 8 == 0:
                    _sync(device)
            _sync(device)
            best = max(best, count * flops / (time.perf_counter() - started))
    return best


def model_only(encoder, texts: list[str]):
    """A function running the model alone over ``texts``: tokenised, batched and copied to the
    device here, beforehand; what it runs (and a caller times) is the forward passes and pooling."""
    import torch

    batches = []
    for batch in encoder.batches(texts):  # the encoder's own batching
        _, tensors = encoder.host_tensors(batch)
        batches.append(({k: v.to(encoder.device) for k, v in tensors.items()}, len(batch.rows)))

    def run():
        with torch.inference_mode():
            for tensors, n in batches:
                encoder.forward(tensors, n)
        _sync(encoder.device)

    run()  # warm
    return run


def token_lengths(encoder, texts: list[str]) -> np.ndarray:
    """Tokens per text as the encoder sees them (special tokens included, cut at max_length)."""
    return encoder.tokenize(list(texts))[1]
