"""A trainable encoder for the objectives that fine-tune weights (RSE joint, PU, distillation).

:class:`TrainableEncoder` is the inference :class:`~relsearch.encoder.model.Encoder`'s model and
pooling with gradients, weights in fp32, autocast to fp16 / bf16 on CUDA and to bf16 on CPUs where
bf16 is faster (``avx512_bf16`` or ``amx_bf16``, confirmed by a short probe on the model's own
shapes: :func:`~relsearch.encoder.precision.bf16_choice`), fp32 elsewhere.
:func:`chunked_backward` is gradient caching (Gao et al., 2021): the embeddings of a large batch
are computed without graphs, the loss is back-propagated to the embeddings only, then each chunk
is re-encoded with a graph and receives its slice of the embedding gradient — a batch of any size
in the memory of one chunk, with the same gradient as the full batch (dropout replayed exactly).
A batch whose texts fit in one chunk skips the replay (one forward with graphs, one backward).
:meth:`TrainableEncoder.save` writes a folder the inference ``Encoder`` loads (safetensors weights,
tokenizer, pooling and max length), which a bundle keeps under ``encoder/``.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np

from ..model import _local_or_hub_folder, _read_st_folder, resolve_model_path, weights_fingerprint
from ..precision import bf16_choice, choose_device_and_dtype

ENCODER_DIR = "encoder"  # inside a bundle


class TrainableEncoder:
    """Transformer + mean/CLS pooling with gradients. ``model_ref``: model id, path, or a bundle's encoder."""

    def __init__(self, model_ref: str, *, pooling: str | None = None, max_length: int | None = 32,
                 device: str = "auto", precision: str = "auto"):
        import torch
        from transformers import AutoModel, AutoTokenizer

        path = resolve_model_path(model_ref)
        folder = _local_or_hub_folder(path)
        st_pooling, st_max_len = _read_st_folder(folder) if folder else (None, None)
        self.model_ref, self.pooling = model_ref, pooling or st_pooling or "mean"
        self.device, _ = choose_device_and_dtype(device, "fp32", cuda_available=torch.cuda.is_available(), amx=False)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path, dtype=torch.float32).to(self.device)
        limit = min(self.tokenizer.model_max_length, self.model.config.max_position_embeddings)
        self.max_length = min(max_length or st_max_len or limit, limit)
        self.dim = int(self.model.config.hidden_size)
        cpu_bf16 = None
        if self.device == "cpu" and precision == "auto":  # the probe runs once per process and shapes
            cpu_bf16 = bf16_choice(self.dim, int(getattr(self.model.config, "intermediate_size", 4 * self.dim)))
        _, self.autocast_dtype = choose_device_and_dtype(self.device, precision, cuda_available=self.device != "cpu",
                                                         amx=bool(cpu_bf16 and cpu_bf16.use))
        self.precision_reason = cpu_bf16.reason if cpu_bf16 else f"precision {precision} on {self.device}"

    @property
    def precision(self) -> str:
        """The dtype the forward passes run in: ``fp32``, ``bf16`` or ``fp16``."""
        return str(self.autocast_dtype).replace("torch.", "").replace("float32", "fp32").replace(
            "bfloat16", "bf16").replace("float16", "fp16")

    def parameters(self):
        return self.model.parameters()

    def train(self, mode: bool = True):
        self.model.train(mode)
        return self

    def tokenize(self, texts: list[str], max_length: int | None = None) -> dict:
        return self.tokenizer(list(texts), padding=True, truncation=True, max_length=max_length or self.max_length,
                              return_tensors="pt")

    def autocast(self):
        import torch

        if self.autocast_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type="cuda" if self.device.startswith("cuda") else "cpu",
                              dtype=self.autocast_dtype)

    def forward(self, texts: list[str], max_length: int | None = None):
        """Raw pooled vectors (b, d) float32, with a graph when grad is enabled; texts are cut at
        ``max_length`` tokens (default: the training length)."""
        batch = {k: v.to(self.device) for k, v in self.tokenize(texts, max_length).items()}
        with self.autocast():
            hidden = self.model(**batch).last_hidden_state
        hidden = hidden.float()
        if self.pooling == "cls":
            return hidden[:, 0]
        m = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)

    __call__ = forward

    def embed(self, texts: list[str], *, batch_size: int = 128, max_length: int | None = None) -> np.ndarray:
        """Raw vectors without gradients, in eval mode (for dev metrics), cut at ``max_length`` tokens
        (default: the training length; pass the serving length to score what an index will see)."""
        import torch

        was_training = self.model.training
        self.model.eval()
        out = []
        with torch.inference_mode():
            order = np.argsort([len(t) for t in texts])  # similar lengths together: less padding
            for start in range(0, len(texts), batch_size):
                idx = order[start:start + batch_size]
                out.append((idx, self.forward([texts[i] for i in idx], max_length).cpu().numpy()))
        self.model.train(was_training)
        vecs = np.empty((len(texts), self.dim), dtype=np.float32)
        for idx, v in out:
            vecs[idx] = v
        return vecs

    def state_dict(self) -> dict:
        return self.model.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state)

    def save(self, folder: str | Path) -> None:
        """A folder :class:`Encoder` loads: safetensors weights, tokenizer, pooling and max length."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(folder, safe_serialization=True)
        self.tokenizer.save_pretrained(folder)
        (folder / "1_Pooling").mkdir(exist_ok=True)
        (folder / "1_Pooling" / "config.json").write_text(json.dumps({
            "word_embedding_dimension": self.dim,
            "pooling_mode_cls_token": self.pooling == "cls",
            "pooling_mode_mean_tokens": self.pooling == "mean"}))
        (folder / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": self.max_length}))


def adamw(params: list, **kw):
    """``torch.optim.AdamW``, fused where torch supports it (CPU and CUDA): one kernel over every
    parameter instead of a Python loop of small ops per tensor — for a full MiniLM fine-tune on 2
    CPU cores, about 0.1 s per step instead of about 3 s. ``params``: a list (tensors or groups)."""
    import torch

    try:
        return torch.optim.AdamW(params, fused=True, **kw)
    except (RuntimeError, TypeError, ValueError):  # an older torch, or a device without the fused kernel
        return torch.optim.AdamW(params, **kw)


def encoder_identity(folder: str | Path, encoder: TrainableEncoder) -> dict:
    """The bundle's ``encoder`` entry for ``encoder`` saved at ``BUNDLE/encoder`` (what indexes must match)."""
    return {"model": ENCODER_DIR, "path": ENCODER_DIR, "pooling": encoder.pooling, "max_length": encoder.max_length,
            "dim": encoder.dim, "weights_sha256": weights_fingerprint(str(folder)), "base": encoder.model_ref}


def chunked_backward(encoder: TrainableEncoder, inputs: list[list[str]], loss_fn, *, chunk: int = 32) -> float:
    """Gradient-cached backward of ``loss_fn(*embeddings)`` over text lists ``inputs``; returns the loss.

    Each list in ``inputs`` (e.g. queries, candidates) is embedded in chunks of ``chunk`` texts
    without graphs; ``loss_fn`` gets one (n_i, d) tensor per list. Gradients accumulate in the
    encoder's parameters (call ``optimizer.step()`` afterwards) and in any tensors ``loss_fn``
    closes over (e.g. relation vectors), which see the full-batch loss directly.

    When all the texts together fit in one chunk, there is nothing to cache: each list is embedded
    once with its graph and the loss back-propagated directly (the same gradient, one forward
    fewer than the replay).
    """
    import torch

    if sum(len(texts) for texts in inputs) <= chunk:
        loss = loss_fn(*(encoder(texts) for texts in inputs))
        loss.backward()
        return float(loss.detach())

    def rng_state():
        return (torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)

    def set_rng_state(state):
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state_all(state[1])

    reps, states = [], []
    with torch.no_grad():
        for texts in inputs:
            parts, part_states = [], []
            for start in range(0, len(texts), chunk):
                part_states.append(rng_state())  # replay the same dropout masks in the second pass
                parts.append(encoder(texts[start:start + chunk]))
            reps.append(torch.cat(parts).detach().requires_grad_())
            states.append(part_states)
    loss = loss_fn(*reps)
    loss.backward()
    after = rng_state()
    for texts, rep, part_states in zip(inputs, reps, states):
        for i, start in enumerate(range(0, len(texts), chunk)):
            set_rng_state(part_states[i])
            encoder(texts[start:start + chunk]).backward(rep.grad[start:start + chunk])
    set_rng_state(after)
    return float(loss.detach())
