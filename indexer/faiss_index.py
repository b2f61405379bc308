"""FAISS inner-product indexes over unit vectors: choose (``auto`` or a factory string), train on a
sample, add in blocks (GPU when present), tune search parameters, describe it for the manifest.

Memory during a build: the vectors are read block by block from ``vectors.npy`` with file reads
(indexer/rowfile.py: no mapped pages stay resident), so beyond the index itself a build holds one training sample (≤ ``train_cap`` rows), one add
block and the tuning queries' exact search blocks (~64 MiB).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import faults
from . import gpu, rowfile, sharded_add
from .gpu import GpuFacts
from .segments import FAISS, TRAINED_FILE
from .tuning import AutoPolicy, TuningConfig, choose_factory, exact_scores, tune

DEFAULT_FACTORY = "auto"


@dataclass(frozen=True, kw_only=True)
class FaissSpec:
    """How to build the FAISS index. ``factory``: ``auto`` or any FAISS index-factory string."""

    factory: str = DEFAULT_FACTORY
    recall_target: float = 0.95
    k: int = 10  # the k of the tuned recall@k
    tune_queries: int = 500
    seed: int = 0
    device: str = "auto"  # "auto": GPU when faiss-gpu sees a CUDA device, else CPU; "cpu": never GPU
    policy: AutoPolicy = field(default_factory=AutoPolicy)
    add_block: int = 65_536
    train_cap: int = 200_000
    # Fills a trained, empty bare IVF index with rows 0..n-1 of the vectors elsewhere than in this
    # process: fill(index, vectors) → the filled index. sharded_add.LocalAdd (processes over the
    # vectors.npy file) or pipelines/faiss_add.WorkerAdd (the Beam runner's workers). None: add here.
    fill: Callable | None = field(default=None, compare=False)

    def __post_init__(self):
        if not 0.0 < self.recall_target <= 1.0:
            raise ValueError(f"recall target must be in (0, 1], got {self.recall_target}")
        if self.device not in gpu.DEVICES:
            raise ValueError(f"device {self.device!r} is unknown; choose one of {', '.join(gpu.DEVICES)}")


def new_index(d: int, factory: str):
    import faiss

    try:
        index = faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        raise ValueError(f"invalid FAISS index-factory string {factory!r}: {e}") from e
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None and isinstance(faiss.downcast_index(ivf), faiss.IndexIVFPQ):
        ivf = faiss.downcast_index(ivf)
        ivf.do_polysemous_training = False  # Hamming filtering is unused with inner products; it costs minutes
    return index


def train_size(index, n: int, cap: int = 200_000) -> int:
    """Rows to train on: ~64 per IVF list (FAISS k-means uses at most 256), ≥ 65536 for PQ/SQ codebooks."""
    import faiss

    ivf = faiss.try_extract_index_ivf(index)
    wanted = max(64 * ivf.nlist, 65_536) if ivf is not None else 65_536
    return min(n, cap, wanted)


def _sample(vectors: np.ndarray, size: int, seed: int) -> np.ndarray:
    n = len(vectors)
    if size >= n:
        return np.ascontiguousarray(vectors, dtype=np.float32)
    rows = np.sort(np.random.default_rng(seed).choice(n, size, replace=False))  # sorted: sequential reads
    return rowfile.take(vectors, rows)


def blocks_of(vectors: np.ndarray, block: int):
    """A callable yielding contiguous float32 blocks of ``vectors`` (re-iterable, for GPU fallback)."""
    def gen():
        for _, rows in rowfile.blocks(vectors, block):  # file reads for a .npy memory map (rowfile.py)
            yield rows
    return gen


def build_faiss(vectors: np.ndarray, factory: str = "Flat", *, seed: int = 0, train_cap: int = 200_000,
                block: int = 65_536, device: str = "auto", facts: gpu.GpuFacts | None = None,
                fill: Callable | None = None):
    """(n, d) float32 unit vectors → (trained, filled FAISS index, device used: "gpu"/"cpu").

    ``factory`` is any FAISS index-factory string ("Flat", "HNSW32", "IVF1024,Flat", ...);
    ids are positions 0..n-1. Indexes that need training are trained on a seeded sample. With a
    ``fill`` (:class:`FaissSpec`), a CPU-built bare IVF index is trained here and filled by it,
    shard by shard; other indexes are added here as usual.
    """
    n, d = vectors.shape
    index = new_index(d, factory)
    sample = None if index.is_trained else _sample(vectors, train_size(index, n, train_cap), seed)
    facts = facts or gpu.detect()
    if fill is not None and sharded_add.shardable(index) and gpu.build_device(index, facts, device) == "cpu":
        index.train(sample)
        index = fill(index, vectors)
        if index.ntotal != n:
            raise RuntimeError(f"the sharded add filled {index.ntotal} of {n} vectors")
        return index, "cpu"
    try:
        return gpu.train_and_add(index, sample, blocks_of(vectors, block), facts=facts, device=device)
    except RuntimeError as e:
        raise ValueError(f"cannot build FAISS index {factory!r} on {n} vectors: {e}") from e


def supports_removal(index) -> bool:
    """Whether ``remove_ids`` deletes without renumbering the others (IVF: ids are stored)."""
    import faiss

    if isinstance(index, faiss.IndexPreTransform):
        return supports_removal(faiss.downcast_index(index.index))
    return isinstance(index, faiss.IndexIVF)


def trained_empty(index):
    """A copy of ``index`` that keeps what training learned (coarse quantizer, PQ/SQ codebooks,
    pre-transforms) and holds no vectors, for appended segments to fill (indexer/segments.py);
    None for index types without a trained part worth sharing (Flat, HNSW, refine wrappers).

    The inverted lists are swapped for empty ones while the copy is made, so the vectors are
    never copied (a clone followed by ``reset`` would briefly double the index in memory)."""
    import faiss

    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None or isinstance(index, faiss.IndexRefine):
        return None
    lists, owned, counts = ivf.invlists, ivf.own_invlists, (ivf.ntotal, index.ntotal)
    empty = faiss.ArrayInvertedLists(ivf.nlist, ivf.code_size)
    ivf.own_invlists = False  # replace_invlists would otherwise free the real lists
    ivf.replace_invlists(empty, False)
    ivf.ntotal = index.ntotal = 0
    try:
        return faiss.clone_index(index)
    finally:
        ivf.invlists, ivf.own_invlists = lists, owned
        ivf.ntotal, index.ntotal = counts


def build_index(vectors: np.ndarray, spec: FaissSpec = FaissSpec(), *, facts: gpu.GpuFacts | None = None):
    """Resolve ``spec.factory`` (``auto``), build, tune; returns (index, manifest ``faiss`` section).

    ``vectors`` (n, d) float32 unit vectors by position (a memory map is fine).
    """
    n, d = vectors.shape
    if spec.factory == "auto":
        choice = choose_factory(n, d, spec.policy)
        factory, tier, reason = choice.factory, choice.tier, choice.reason
    else:
        factory, tier, reason = spec.factory, "explicit", "given with --faiss-index"
    index, device = build_faiss(vectors, factory, seed=spec.seed, train_cap=spec.train_cap, block=spec.add_block,
                                device=spec.device, facts=facts, fill=spec.fill)
    tuning = tune(index, vectors, TuningConfig(recall_target=spec.recall_target, k=spec.k, queries=spec.tune_queries,
                                                seed=spec.seed))
    return index, describe(index, spec, factory, tier, reason, tuning.params, tuning.to_json(), device)


def describe(index, spec: FaissSpec, factory: str, tier: str, reason: str, params: dict, tuning: dict,
             device: str) -> dict:
    """The manifest's ``faiss`` section."""
    return {"requested": spec.factory, "factory": factory, "tier": tier, "reason": reason,
            "metric": "inner_product", "ntotal": int(index.ntotal), "exact_scores": exact_scores(index),
            "removal": "remove_ids" if supports_removal(index) else "tombstones",
            "search_params": params, "tuning": tuning, "device": {"build": device},
            "spec": {"recall_target": spec.recall_target, "k": spec.k, "tune_queries": spec.tune_queries,
                     "seed": spec.seed, "device": spec.device}}


# ---------------------------------------------------------------- writing

def save_faiss(index, path: Path) -> None:
    """``faiss.write_index`` through a Python file: FAISS's own writer only prints a failed close
    (a full disk) to stderr and returns, leaving a truncated file; this raises OSError."""
    import faiss

    with open(path, "wb") as f:
        faiss.write_index(index, faiss.PyCallbackIOWriter(f.write))


def write_faiss(gen: Path, vectors: np.ndarray, spec: FaissSpec, facts: GpuFacts | None = None,
                prefix: str = "") -> dict:
    """Build, tune and write ``{prefix}index.faiss`` from ``vectors`` (and, for IVF types, its trained
    empty form ``{prefix}trained.faiss``); returns the manifest's faiss section. ``prefix``: a text
    field's tag (indexer/text_fields.py)."""
    index, info = build_index(vectors, spec, facts=facts)
    save_faiss(index, gen / f"{prefix}{FAISS}")
    empty = trained_empty(index)
    if empty is not None:  # what appended segments fill, without training again (indexer/segments.py)
        save_faiss(empty, gen / f"{prefix}{TRAINED_FILE}")
    faults.point("build.faiss-written")
    return info
