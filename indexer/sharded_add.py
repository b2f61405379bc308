"""Large IVF builds: train once, add shards of positions in parallel, merge.

The coarse quantizer and codebooks are trained once, on a sample, by the caller. Then each unit of
work fills a copy of the trained empty index with its rows (ids = global positions) and hands back
the filled shard; the caller merges the shards' inverted lists into the trained index in shard
order (``IndexIVF.merge_from``), so the result holds exactly the entries a single-process add
makes.

:func:`add_shard` is that unit: serialized trained index + blocks of (first position, rows) →
serialized shard, no files of its own, so any worker can run it wherever its rows come from. Two
callers: :func:`add_sharded` here (a local process pool over ranges of a ``vectors.npy``, read
with file reads by :func:`add_range`; ``spawn``: a forked child of a process that already ran
OpenMP can hang in libgomp; :class:`LocalAdd` is its ``FaissSpec.fill``), and the Beam index
job's add stage (pipelines/faiss_add.py: the runner's workers, rows read from the encoded shards
through Beam's FileSystems).

Memory, per worker: the trained empty index (nlist·d floats of centroids + the PQ codebooks), one
add block (``block``·d·4 bytes) and its shard's codes, (n/shards)·(code_size + 8) bytes, twice
while it is serialized. Rows are read with ``pread`` (indexer/rowfile.py), never memory-mapped, so
no file pages stay in the worker's resident set. The caller holds the final index,
n·(code_size + 8) bytes, plus one shard while merging it.
"""
from __future__ import annotations

import os
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from . import rowfile


def shardable(index) -> bool:
    """Only a bare IVF index (its inverted lists are everything added) merges shard by shard."""
    import faiss

    return isinstance(faiss.downcast_index(index), faiss.IndexIVF)


def shard_ranges(n: int, shards: int) -> list[tuple[int, int]]:
    """[start, end) ranges of about n/shards positions covering 0..n-1 in order."""
    bounds = np.linspace(0, n, shards + 1).astype(np.int64)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def add_shard(trained: bytes, blocks, *, threads: int | None = None) -> bytes:
    """Fill a copy of the serialized ``trained`` index with ``blocks`` of (first position, float32
    rows (m, d)), ids = positions; return the filled shard, serialized. ``threads``: FAISS's
    OpenMP threads for this process (None: leave as is)."""
    import faiss

    if threads is not None:
        faiss.omp_set_num_threads(threads)
    index = faiss.deserialize_index(np.frombuffer(trained, dtype=np.uint8))
    for first, rows in blocks:
        index.add_with_ids(np.ascontiguousarray(rows, dtype=np.float32),
                           np.arange(first, first + len(rows), dtype=np.int64))
    return faiss.serialize_index(index).tobytes()


def merge_shard(index, shard: bytes) -> None:
    """Append a filled shard's inverted lists to ``index`` (call in shard order)."""
    import faiss

    faiss.downcast_index(faiss.extract_index_ivf(index)).merge_from(
        faiss.deserialize_index(np.frombuffer(shard, dtype=np.uint8)), 0)


def serialize(index) -> bytes:
    import faiss

    return faiss.serialize_index(index).tobytes()


# Peak resident memory (MiB) of each local add worker of the last add_sharded call, for bench/scale.py.
# Measured inside the worker as VmHWM: getrusage's ru_maxrss of a spawned child starts from its
# parent's resident set at the fork before exec (Linux keeps it across exec), so it overstates workers.
last_worker_peaks_mib: list[float] = []


def _peak_kib() -> int:
    with open("/proc/self/status") as f:
        return next((int(line.split()[1]) for line in f if line.startswith("VmHWM:")), 0)


def add_range(trained_path: str, vectors_path: str, start: int, end: int, out_path: str, *, block: int = 65_536,
              threads: int = 1) -> tuple[str, int]:
    """Local worker: rows [start, end) of the ``.npy`` at ``vectors_path`` (file reads) into a copy of
    the trained index at ``trained_path``; writes the shard to ``out_path``; returns it and this
    process's peak resident memory in KiB."""
    shard = add_shard(Path(trained_path).read_bytes(), rowfile.blocks(vectors_path, block, start, end),
                      threads=threads)
    Path(out_path).write_bytes(shard)
    return out_path, _peak_kib()


def add_sharded(index, vectors_path: str, n: int, *, workers: int, shards: int | None = None,
                block: int = 65_536, tmp_dir: str | None = None):
    """Fill the trained, empty IVF ``index`` with positions 0..n-1 of ``vectors_path`` using
    ``workers`` processes over ``shards`` ranges (default: one per worker); returns ``index``."""
    if not index.is_trained or index.ntotal:
        raise ValueError("add_sharded needs a trained, empty index")
    ranges = shard_ranges(n, shards or workers)
    threads = max(1, (os.cpu_count() or 1) // workers)
    with tempfile.TemporaryDirectory(prefix="faiss-shards-", dir=tmp_dir) as tmp:
        trained = Path(tmp) / "trained.index"
        trained.write_bytes(serialize(index))
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            futures = [pool.submit(add_range, str(trained), vectors_path, a, b, str(Path(tmp) / f"shard-{i:04d}.index"),
                                   block=block, threads=threads) for i, (a, b) in enumerate(ranges)]
            last_worker_peaks_mib.clear()
            for future in futures:  # in shard order: the merged lists hold ids in the order one add would
                path, peak = future.result()
                merge_shard(index, Path(path).read_bytes())
                Path(path).unlink()
                last_worker_peaks_mib.append(round(peak / 1024, 1))
    return index


@dataclass(frozen=True)
class LocalAdd:
    """A ``FaissSpec.fill``: :func:`add_sharded` with ``workers`` processes over the ``.npy`` file
    that ``vectors`` maps."""

    workers: int
    block: int = 65_536

    def __call__(self, index, vectors):
        path = getattr(vectors, "filename", None)
        if path is None:
            raise ValueError("a sharded local add reads the vectors from their .npy file; got an array in memory")
        return add_sharded(index, str(path), len(vectors), workers=self.workers, block=self.block)
