"""Stream the rows of a ``vectors.npy`` with ordinary file reads and writes, not a memory map.

A memory map is the easy way to walk a large ``.npy``, but every page it touches stays mapped into
the process and counts in its resident set until the kernel needs the memory back: the 5M-vector
run in docs/scale.md peaked at 8.5 GiB (bench process) and 7.9 GiB per add worker, almost all of it
file-backed pages of the 7 GiB ``vectors.npy`` (``madvise(MADV_DONTNEED)`` did not shrink it).
Rows read with ``pread`` into a fresh array, or written with ``pwrite``, pass through the page
cache without ever being mapped, so a pass over all rows costs one block of anonymous memory.

Functions here take either a path or an array; an array that is a whole ``.npy`` memory map (what
``np.load(..., mmap_mode="r")`` returns) is read from its file, any other array by slicing.
"""
from __future__ import annotations

import os

import numpy as np

ROW_DTYPE = np.dtype("<f4")


class NpyWriter:
    """An (n, d) float32 ``.npy`` written by ``pwrite``: the same file ``np.lib.format.open_memmap``
    makes, but written pages never enter this process's resident set. Supports what a writer of
    rows needs: ``len``, ``shape``, ``writer[a:b] = rows`` (contiguous slices), ``flush``, ``close``.
    Disk space is reserved up front, so a full disk is an OSError here, not later."""

    def __init__(self, path: str | os.PathLike, n: int, d: int):
        self.shape = (n, d)
        self._f = open(path, "w+b")
        try:
            np.lib.format.write_array_header_1_0(
                self._f, {"descr": np.lib.format.dtype_to_descr(ROW_DTYPE), "fortran_order": False, "shape": (n, d)})
            self._f.flush()
            self.offset = self._f.tell()
            os.posix_fallocate(self._f.fileno(), 0, self.offset + n * d * ROW_DTYPE.itemsize)
        except BaseException:
            self._f.close()
            raise

    def __len__(self) -> int:
        return self.shape[0]

    def __setitem__(self, key: slice, rows) -> None:
        start, stop, step = key.indices(self.shape[0]) if isinstance(key, slice) else (None, None, None)
        if step != 1:
            raise TypeError("NpyWriter takes contiguous row slices only")
        rows = np.ascontiguousarray(rows, dtype=ROW_DTYPE)
        if rows.shape != (stop - start, self.shape[1]):
            raise ValueError(f"rows {rows.shape} do not fit slice [{start}:{stop}] of {self.shape}")
        view, at = memoryview(rows).cast("B"), self.offset + start * self.shape[1] * ROW_DTYPE.itemsize
        while view:  # pwrite may write less than asked
            done = os.pwrite(self._f.fileno(), view, at)
            view, at = view[done:], at + done

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def source(vectors) -> tuple[str, int, int, int] | None:
    """(file path, data offset, rows, dim) when ``vectors`` is a path to a float32 ``.npy`` or a
    whole memory map of one; None for any other array (then callers slice it)."""
    if isinstance(vectors, (str, os.PathLike)):
        mapped = np.load(vectors, mmap_mode="r", allow_pickle=False)  # reads the header; maps, touches no row
        if mapped.dtype != ROW_DTYPE or mapped.ndim != 2 or not mapped.flags.c_contiguous:
            raise ValueError(f"{vectors}: expected a C-order float32 (n, d) .npy, got {mapped.dtype} {mapped.shape}")
        return os.fspath(vectors), int(mapped.offset), *mapped.shape
    filename = getattr(vectors, "filename", None)
    if (not isinstance(vectors, np.memmap) or not filename or vectors.ndim != 2 or vectors.dtype != ROW_DTYPE
            or not vectors.flags.c_contiguous):
        return None
    try:  # a view of part of the map carries the same filename and offset: only the whole file qualifies
        whole = os.path.getsize(filename) == vectors.offset + vectors.nbytes
    except OSError:
        return None
    return (str(filename), int(vectors.offset), *vectors.shape) if whole else None


def _pread_into(fd: int, out: np.ndarray, at: int) -> None:
    view = memoryview(out).cast("B")
    while view:
        got = os.preadv(fd, [view], at)
        if got == 0:
            raise EOFError(f"file ends {len(view)} bytes early")
        view, at = view[got:], at + got


def read_rows(vectors, start: int, end: int) -> np.ndarray:
    """Rows [start, end) as a new float32 array."""
    src = source(vectors)
    if src is None:
        return np.ascontiguousarray(vectors[start:end], dtype=np.float32)
    path, offset, n, d = src
    end = min(end, n)
    out = np.empty((max(0, end - start), d), dtype=ROW_DTYPE)
    fd = os.open(path, os.O_RDONLY)
    try:
        _pread_into(fd, out, offset + start * d * ROW_DTYPE.itemsize)
    finally:
        os.close(fd)
    return out


def blocks(vectors, block: int, start: int = 0, end: int | None = None):
    """Yield (first row, float32 rows) for rows [start, end) in blocks of ``block`` rows; each block is
    a new array, so a consumer may keep it."""
    src = source(vectors)
    n = src[2] if src else len(vectors)
    end = n if end is None else min(end, n)
    for a in range(start, end, block):
        yield a, read_rows(vectors, a, min(a + block, end))


def take(vectors, rows: np.ndarray, *, window_bytes: int = 32 << 20, span_factor: int = 8) -> np.ndarray:
    """Rows ``rows`` (sorted ascending, int) as a new float32 array. From a file, rows are taken window
    by window (``window_bytes`` of the file): a window holding at least 1/``span_factor`` of its rows
    is read whole and picked from, a sparser one row by row."""
    rows = np.asarray(rows, dtype=np.int64)
    src = source(vectors)
    if src is None or not len(rows):
        return np.ascontiguousarray(vectors[rows], dtype=np.float32)
    path, offset, n, d = src
    row_bytes = d * ROW_DTYPE.itemsize
    window = max(1, window_bytes // row_bytes)
    out = np.empty((len(rows), d), dtype=ROW_DTYPE)
    fd = os.open(path, os.O_RDONLY)
    try:
        i = 0
        while i < len(rows):
            first = int(rows[i])
            j = int(np.searchsorted(rows, first + window, side="left"))
            if (j - i) * span_factor >= window or j - i > 1 and (int(rows[j - 1]) - first + 1) <= span_factor * (j - i):
                span = np.empty((int(rows[j - 1]) - first + 1, d), dtype=ROW_DTYPE)
                _pread_into(fd, span, offset + first * row_bytes)
                out[i:j] = span[rows[i:j] - first]
            else:
                for k in range(i, j):
                    _pread_into(fd, out[k], offset + int(rows[k]) * row_bytes)
            i = j
    finally:
        os.close(fd)
    return out


def unit_rows(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(m, d) raw vectors → (unit vectors float32, norms ‖h‖)."""
    raw = np.asarray(raw, dtype=np.float32)
    norms = np.linalg.norm(raw, axis=1)
    return (raw / np.maximum(norms, 1e-12)[:, None]).astype(np.float32), norms
