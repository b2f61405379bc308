"""Where FAISS work runs: GPU when faiss-gpu and a CUDA device are present and the index type
has a GPU implementation, else CPU; any GPU failure falls back to CPU.

The decisions are pure functions of :class:`GpuFacts`, so tests inject "a GPU is present"
on a CPU-only machine; the transfers (``to_gpu`` / ``to_cpu``) are injectable too.

- Build (train + add): GPU for Flat and IVF with Flat / SQ / PQ codes (GPU k-means and adds are
  where the time goes). HNSW graphs, refine wrappers and pre-transforms build on the CPU.
- Search: GPU only for large unfiltered batches (``min_batch`` queries) on those same types; a
  filtered or tombstoned search needs FAISS's CPU ``IDSelector`` and stays on the CPU.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

DEVICES = ("auto", "cpu")
GPU_PQ_BYTES = (1, 2, 3, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 96)  # GpuIndexIVFPQ code sizes


@dataclass(frozen=True)
class GpuFacts:
    """What the machine offers: faiss built with GPU support, and how many CUDA devices it sees."""

    gpu_module: bool
    devices: int

    @property
    def available(self) -> bool:
        return self.gpu_module and self.devices > 0


def detect() -> GpuFacts:
    import faiss

    module = hasattr(faiss, "StandardGpuResources") and hasattr(faiss, "index_cpu_to_gpu")
    try:
        devices = int(faiss.get_num_gpus()) if module else 0
    except Exception:  # noqa: BLE001 - a broken CUDA install means "no GPU"
        devices = 0
    return GpuFacts(module, devices)


def gpu_kind(index) -> str | None:
    """"flat" / "ivf" when ``index`` has a GPU implementation, else None."""
    import faiss

    if type(index) in (faiss.IndexFlat, faiss.IndexFlatIP, faiss.IndexFlatL2):
        return "flat"
    if isinstance(index, (faiss.IndexIVFFlat, faiss.IndexIVFScalarQuantizer)):
        return "ivf"
    if isinstance(index, faiss.IndexIVFPQ) and index.pq.code_size in GPU_PQ_BYTES and index.pq.nbits == 8:
        return "ivf"
    return None


def build_device(index, facts: GpuFacts, device: str = "auto") -> str:
    """"gpu" or "cpu" for training and adding to ``index``."""
    if device not in DEVICES:
        raise ValueError(f"device {device!r} is unknown; choose one of {', '.join(DEVICES)}")
    return "gpu" if device == "auto" and facts.available and gpu_kind(index) else "cpu"


def search_device(index, n_queries: int, facts: GpuFacts, *, filtered: bool, min_batch: int = 256,
                  device: str = "auto") -> str:
    """"gpu" or "cpu" for one search batch (GPU pays only for big, unfiltered batches)."""
    if device != "auto" or filtered or n_queries < min_batch or not facts.available:
        return "cpu"
    return "gpu" if gpu_kind(index) else "cpu"


_resources = None


def default_to_gpu(index):
    import faiss

    global _resources
    if _resources is None:
        _resources = faiss.StandardGpuResources()
    options = faiss.GpuClonerOptions()
    options.useFloat16 = isinstance(index, faiss.IndexIVFPQ)  # fp16 lookup tables: large PQ code sizes fit
    return faiss.index_cpu_to_gpu(_resources, 0, index, options)


def default_to_cpu(index):
    import faiss

    return faiss.index_gpu_to_cpu(index)


def train_and_add(index, train_sample, blocks: Callable, *, facts: GpuFacts, device: str = "auto",
                  to_gpu: Callable = default_to_gpu, to_cpu: Callable = default_to_cpu) -> tuple[object, str]:
    """Train ``index`` (if it needs it) on ``train_sample`` (m, d) and add every block that
    ``blocks()`` yields (an array, or ``(array, ids)`` to add with explicit ids), on the GPU when
    :func:`build_device` says so; returns (CPU index, device used).

    The CPU index passed in is only touched on the CPU path, so a GPU failure (out of memory,
    unsupported parameters) restarts cleanly on the CPU.
    """
    if build_device(index, facts, device) == "gpu":
        try:
            import faiss

            on_gpu = to_gpu(faiss.clone_index(index))
            if not on_gpu.is_trained:
                on_gpu.train(train_sample)
            for block in blocks():
                _add(on_gpu, block)
            return to_cpu(on_gpu), "gpu"
        except Exception as e:  # noqa: BLE001 - any GPU failure: log it and build on the CPU
            log.warning("FAISS GPU build failed (%s: %s); building on the CPU", type(e).__name__, e)
    if not index.is_trained:
        index.train(train_sample)
    for block in blocks():
        _add(index, block)
    return index, "cpu"


def _add(index, block) -> None:
    if isinstance(block, tuple):
        index.add_with_ids(*block)
    else:
        index.add(block)


def _gpu_set_param(index, key: str, value) -> None:
    import faiss

    faiss.GpuParameterSpace().set_index_parameter(index, key, value)


class GpuSearch:
    """A GPU copy of a CPU index for big unfiltered batches (see :func:`search_device`).
    Parameters go through ``GpuParameterSpace`` (GPU indexes take no CPU ``SearchParameters``)."""

    def __init__(self, index, *, to_gpu: Callable = default_to_gpu, set_param: Callable | None = None):
        self.cpu = index
        self.index = to_gpu(index)
        self.set_param = set_param or _gpu_set_param
        self._set: dict = {}

    def _run(self, q, fetch: int, params: dict):
        for key in ("nprobe",):
            if key in params and self._set.get(key) != params[key]:
                self.set_param(self.index, key, params[key])
                self._set[key] = params[key]
        return self.index.search(q, fetch)

    def search(self, q, k: int, params: dict, *, vectors, selection=None):
        from . import ann

        return ann.search(self.cpu, q, k, params=params, vectors=vectors, selection=selection, run=self._run)
