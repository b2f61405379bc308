"""Large IVF builds: train once, add shards of positions in parallel worker processes, merge.

The coarse quantizer and codebooks are trained once, on a sample, in the caller. Then each worker
process reads the trained empty index from a file, opens ``vectors.npy`` as a memory map, adds its
range of positions block by block (ids = positions) and writes its filled shard to a file; the
caller merges the shards' inverted lists into the trained index in shard order
(``IndexIVF.merge_from``), so the result holds exactly the entries a single-process add makes.

:func:`add_shard` is a pure function of paths, the unit a cluster worker would run; here a local
process pool runs it (``spawn``: a forked child of a process that already ran OpenMP can hang in
libgomp).

Memory, per worker: the trained empty index (nlist·d floats of centroids + the PQ codebooks), one
add block (``block``·d·4 bytes) and its shard's codes, (n/shards)·(code_size + 8) bytes; the pages
of ``vectors.npy`` it reads are file-backed (reclaimable) and it asks the kernel to drop them after
each block, which the 5M run in docs/scale.md shows did not keep its resident set down. The caller holds the
final index, n·(code_size + 8) bytes, plus one shard while merging it.
"""
from __future__ import annotations

import mmap
import os
import tempfile
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np


def shardable(index) -> bool:
    """Only a bare IVF index (its inverted lists are everything added) merges shard by shard."""
    import faiss

    return isinstance(faiss.downcast_index(index), faiss.IndexIVF)


def shard_ranges(n: int, shards: int) -> list[tuple[int, int]]:
    """[start, end) ranges of about n/shards positions covering 0..n-1 in order."""
    bounds = np.linspace(0, n, shards + 1).astype(np.int64)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _drop_pages(vectors: np.memmap) -> None:
    """Release the file-backed pages read so far from this process's resident set (the page cache keeps them)."""
    mm = getattr(vectors, "_mmap", None)
    if mm is not None and hasattr(mm, "madvise"):
        mm.madvise(mmap.MADV_DONTNEED)


def add_shard(trained_path: str, vectors_path: str, start: int, end: int, out_path: str, *, block: int = 65_536,
              threads: int = 1) -> str:
    """Add positions [start, end) of the ``.npy`` at ``vectors_path`` to a copy of the trained index
    at ``trained_path`` (ids = positions); write it to ``out_path``; return ``out_path``."""
    import faiss

    faiss.omp_set_num_threads(threads)
    index = faiss.read_index(trained_path)
    vectors = np.load(vectors_path, mmap_mode="r", allow_pickle=False)
    for a in range(start, end, block):
        b = min(a + block, end)
        index.add_with_ids(np.ascontiguousarray(vectors[a:b], dtype=np.float32), np.arange(a, b, dtype=np.int64))
        _drop_pages(vectors)
    faiss.write_index(index, out_path)
    return out_path


def add_sharded(index, vectors_path: str, n: int, *, workers: int, shards: int | None = None,
                block: int = 65_536, tmp_dir: str | None = None):
    """Fill the trained, empty IVF ``index`` with positions 0..n-1 of ``vectors_path`` using
    ``workers`` processes over ``shards`` ranges (default: one per worker); returns ``index``."""
    import faiss

    if not index.is_trained or index.ntotal:
        raise ValueError("add_sharded needs a trained, empty index")
    ranges = shard_ranges(n, shards or workers)
    threads = max(1, (os.cpu_count() or 1) // workers)
    with tempfile.TemporaryDirectory(prefix="faiss-shards-", dir=tmp_dir) as tmp:
        trained = str(Path(tmp) / "trained.index")
        faiss.write_index(index, trained)
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            futures = [pool.submit(add_shard, trained, vectors_path, a, b, str(Path(tmp) / f"shard-{i:04d}.index"),
                                   block=block, threads=threads) for i, (a, b) in enumerate(ranges)]
            ivf = faiss.downcast_index(index)
            for future in futures:  # in shard order: the merged lists hold ids in the order one add would
                path = future.result()
                ivf.merge_from(faiss.read_index(path), 0)
                os.unlink(path)
    return index
