"""Which device and dtype an encoder runs in, and why.

``auto`` precision is fp16 on CUDA; on a CPU it is bf16 only where the CPU has bf16 instructions
and a short probe of the model's own matrix shapes confirms they are faster (:func:`bf16_choice`),
else fp32. An index records the dtype its vectors were encoded in, and its queries follow it
(:func:`query_precision`), slowly where this CPU lacks the instructions (:func:`slow_dtype_note`).
encoder/model.py's :class:`~relsearch.encoder.model.Encoder` and the trainers ask here once when built.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from .threads import in_passing

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
# the dtype an index records (manifest ``encoder.precision``, indexer/manifest.py) by its torch name
DTYPE_PRECISIONS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
log = logging.getLogger(__name__)


BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # CPU flags of bf16 dot-product / matrix instructions
DEFAULT_SHAPES = (384, 1536)  # hidden and feed-forward widths of the default all-MiniLM-L6-v2
BF16_MIN_SPEEDUP = 1.25  # bf16 must beat fp32 by this much on the probe (a near tie keeps fp32's exactness)
PROBE_ROWS = 256  # tokens per probe product: a few ms per product


@dataclass(frozen=True)
class Bf16Choice:
    """Whether this CPU runs the model faster in bf16, and why (``relsearch bench speed`` prints it)."""

    use: bool
    reason: str
    fp32_s: float | None = None  # probe seconds (best of its rounds), None when no probe ran
    bf16_s: float | None = None

    @property
    def speedup(self) -> float | None:
        return self.fp32_s / self.bf16_s if self.fp32_s and self.bf16_s else None


def cpu_bf16_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The bf16 instruction flags (:data:`BF16_FLAGS`) that ``cpuinfo`` lists for this CPU."""
    return cpu_flags(BF16_FLAGS, cpuinfo)


def cpu_flags(wanted, cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The flags among ``wanted`` that ``cpuinfo`` lists for this CPU."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(wanted) & frozenset(line.split())
    except OSError:
        pass
    return frozenset()


def matmul_probe(hidden: int, ffn: int, *, rows: int = PROBE_ROWS, rounds: int = 5,
                 max_seconds: float = 0.2) -> tuple[float, float]:
    """Best-of-rounds seconds of the model's feed-forward pair ((rows × hidden) → ffn → hidden,
    ``F.linear`` as the model calls it) in fp32 and in bf16. The two are timed in turn within each
    round (load from other jobs hits both alike) after one warm-up round; the probe stops after
    ``max_seconds`` once two rounds are done, so it costs a few hundred ms at most."""
    import time

    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, hidden, generator=gen)
    up, down = torch.randn(ffn, hidden, generator=gen), torch.randn(hidden, ffn, generator=gen)
    args = {torch.float32: (x, up, down), torch.bfloat16: tuple(t.to(torch.bfloat16) for t in (x, up, down))}
    best = {dtype: float("inf") for dtype in args}
    start = time.perf_counter()
    with torch.no_grad():
        for i in range(rounds + 1):
            for dtype, (xs, w1, w2) in args.items():
                t = time.perf_counter()
                F.linear(F.linear(xs, w1), w2)
                if i:  # round 0 warms up (kernel choice, caches)
                    best[dtype] = min(best[dtype], time.perf_counter() - t)
            if i >= 2 and time.perf_counter() - start > max_seconds:
                break
    return best[torch.float32], best[torch.bfloat16]


_BF16_CHOICES: dict[tuple, Bf16Choice] = {}


def bf16_choice(hidden: int = DEFAULT_SHAPES[0], ffn: int = DEFAULT_SHAPES[1], *, flags=None, probe=None) -> Bf16Choice:
    """bf16 or fp32 on this CPU for a model of widths ``hidden`` / ``ffn``: bf16 only on CPUs with
    ``avx512_bf16`` or ``amx_bf16`` and only where a short probe (:func:`matmul_probe`) of the
    model's own shapes runs at least :data:`BF16_MIN_SPEEDUP` × faster than fp32. Cached per
    process, shapes and thread count (never probed in a hot path: encoders and trainers ask once
    when built). ``flags`` / ``probe`` replace the CPU's flags and the timing (tests)."""
    import torch

    flags = cpu_bf16_flags() if flags is None else frozenset(flags)
    if not flags & set(BF16_FLAGS):
        return Bf16Choice(False, f"fp32: the CPU has no bf16 instructions ({' / '.join(BF16_FLAGS)})")
    key = (hidden, ffn, torch.get_num_threads(), flags, probe)
    if key not in _BF16_CHOICES:
        # in passing: a pool of kernel threads left on the caller's thread would slow every later
        # forward pass on another thread (encoder/threads.py)
        fp32_s, bf16_s = in_passing(probe or matmul_probe, hidden, ffn)
        speedup = fp32_s / bf16_s if bf16_s > 0 else float("inf")
        use = speedup >= BF16_MIN_SPEEDUP
        have = "+".join(sorted(flags))
        reason = (f"{'bf16' if use else 'fp32'}: {have}; the probe ({hidden}->{ffn}->{hidden} products) ran "
                  f"bf16 {speedup:.2f}x fp32's speed (bf16 needs >= {BF16_MIN_SPEEDUP}x)")
        _BF16_CHOICES[key] = Bf16Choice(use, reason, fp32_s, bf16_s)
    return _BF16_CHOICES[key]


def choose_device_and_dtype(device: str, precision: str, *, cuda_available: bool, amx: bool):
    """Pick (device, torch dtype) for inference.

    ``auto`` precision: fp16 on CUDA; on CPU bf16 where ``amx`` says bf16 is faster there
    (:func:`bf16_choice`: bf16 instructions and a probe that confirms them; :func:`choose_precision`
    asks it), else fp32.
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


def choose_precision(device: str, precision: str, *, cuda_available: bool,
                     widths: tuple[int, int] = DEFAULT_SHAPES) -> tuple[str, object, str]:
    """(device, torch dtype, why) for inference on a model of ``widths`` (hidden, feed-forward):
    :func:`choose_device_and_dtype`, where the CPU is probed (:func:`bf16_choice`, on the model's
    own shapes) only when the choice is the CPU's to make — ``auto`` precision on a CPU device."""
    if precision == "auto" and (device == "cpu" or (device == "auto" and not cuda_available)):
        choice = bf16_choice(*widths)
        device, dtype = choose_device_and_dtype(device, precision, cuda_available=cuda_available, amx=choice.use)
        return device, dtype, choice.reason
    device, dtype = choose_device_and_dtype(device, precision, cuda_available=cuda_available, amx=False)
    return device, dtype, f"{precision}: asked for" if precision != "auto" else "fp16: the default on CUDA"


def model_widths(model_config) -> tuple[int, int]:
    """(hidden, feed-forward) widths of a transformers config: the shapes the bf16 probe times."""
    hidden = int(model_config.hidden_size)
    return hidden, int(getattr(model_config, "intermediate_size", 4 * hidden))


def precision_line(device: str, dtype, why: str) -> str:
    """The line `relsearch index` and `serve` log once: "cpu, float32 (why)"."""
    return f"{device}, {str(dtype).replace('torch.', '')} ({why})"


def precision_name(dtype) -> str:
    """"fp32", "bf16" or "fp16": the name an index records for torch ``dtype``."""
    return DTYPE_PRECISIONS[str(dtype).replace("torch.", "")]


def query_precision(recorded: str, asked: str | None = None) -> tuple[str, str]:
    """(precision, why) of the query encoder of an index whose vectors were encoded in ``recorded``
    (manifest ``encoder.precision``). ``asked`` None or ``auto``: the recorded one, on any machine.
    Another explicit precision is used as asked, with a warning: its query vectors differ from the
    recorded dtype's, so near-tied hits may swap against other processes that follow the index."""
    if asked in (None, "auto", recorded):
        return recorded, f"{recorded}: recorded in the index"
    if asked not in PRECISIONS:
        raise ValueError(f"unknown precision {asked!r}; choose one of {', '.join(PRECISIONS)}")
    log.warning("precision %s asked for, but the index was encoded in %s (its manifest): query scores will differ "
                "slightly from those of queries in %s, and near-tied hits may change places; leave the precision "
                "out (or auto) to follow the index", asked, recorded, recorded)
    return asked, f"{asked}: asked for (the index records {recorded})"


FP16_FLAGS = ("avx512_fp16", "amx_fp16")  # CPU flags of fp16 arithmetic / matrix instructions
_SLOW_SAID: set[str] = set()


def slow_dtype_note(device: str, dtype, *, flags=None) -> str | None:
    """The line said once per process (a warning on the ``relsearch.encoder.precision`` log, stderr when
    no logging is set up) when a 16-bit dtype runs on a CPU without instructions for it: an index
    that records bf16 (built where bf16 was faster) is still queried in bf16 there — PyTorch runs
    it on any CPU, slowly — rather than in another dtype that would move its answers. ``flags``
    replace this CPU's flags (tests). None when there is nothing to say."""
    if not str(device).startswith("cpu"):
        return None
    name = precision_name(dtype)
    wanted = {"bf16": BF16_FLAGS, "fp16": FP16_FLAGS}.get(name)
    if wanted is None:
        return None
    have = cpu_flags(wanted) if flags is None else frozenset(wanted) & frozenset(flags)
    if have:
        return None
    note = (f"the encoder runs in {name} on a CPU without {name} instructions ({' / '.join(wanted)}): it works, "
            f"but slowly ({name} was asked for or the index records it; another dtype would move the index's answers)")
    if note not in _SLOW_SAID:
        _SLOW_SAID.add(note)
        log.warning("%s", note)
    return note


def default_token_budget(device: str, dtype=None) -> int:
    """Padded tokens per forward pass. A GPU wants big batches. On CPU it depends on the matrix
    units, measured with all-MiniLM-L6-v2 on 2 cores: bf16 on AMX gains up to ~16k tokens, while
    fp32 on AVX2 (AMD EPYC) is fastest near 2k — 384 sentences/s vs 260/s at 16k, where the
    activations fall out of cache."""
    if device.startswith("cuda"):
        return 131072
    import torch

    return 16384 if dtype == torch.bfloat16 else 2048
