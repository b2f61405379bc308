"""File helpers every layer uses: one sha256 of a file, one write-aside-then-rename, bounded reads
of regular files inside a folder (crafted bundles and model folders).

Base layer (tests/cli_api/test_import_direction.py): imports nothing from relsearch.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from pathlib import Path


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def replaced_atomically(path: str | os.PathLike):
    """Yield a temporary path beside ``path``; when the block succeeds, rename it over ``path``
    (atomic on POSIX: readers see the old file or the new one, never half of one); when it fails,
    remove it. The temporary name starts with a dot and ends in ``.partial``, so globs for the
    final name never match it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def check_regular_file(path: str | os.PathLike, *, limit: int, what: str | None = None) -> int:
    """Size of ``path`` when it is a regular file (links followed) of at most ``limit`` bytes; else
    ValueError naming it (``what``): a FIFO, a device such as /dev/zero or a folder would hang or
    fill memory when read. Raises FileNotFoundError (an OSError) when it does not exist."""
    st = os.stat(path)
    what = what or str(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{what} is not a regular file; refusing to read it")
    if st.st_size > limit:
        raise ValueError(f"{what} is {st.st_size} bytes, more than the {limit} allowed; refusing to read it")
    return st.st_size


def read_regular_file(path: str | os.PathLike, *, limit: int, what: str | None = None) -> bytes:
    """The bytes of ``path``, only if it is a regular file of at most ``limit`` bytes (see
    :func:`check_regular_file`). Opened non-blocking, so a FIFO put in its place never hangs the
    open, and checked on the open descriptor, so a file swapped in after a check is caught too."""
    what = what or str(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{what} is not a regular file; refusing to read it")
        chunks, size = [], 0
        while size <= limit:
            block = os.read(fd, min(1 << 20, limit + 1 - size))
            if not block:
                break
            chunks.append(block)
            size += len(block)
        if size > limit:
            raise ValueError(f"{what} is more than {limit} bytes; refusing to read it")
        return b"".join(chunks)
    finally:
        os.close(fd)


def inside(root: str | os.PathLike, relative: object, *, what: str) -> Path:
    """``root / relative`` when ``relative`` is a relative path that stays inside ``root`` (no
    absolute path, no ``..`` climbing out); else ValueError naming ``what``."""
    if not isinstance(relative, str) or not relative or "\x00" in relative:
        raise ValueError(f"{what} must be a relative path inside {root}, got {relative!r}")
    norm = os.path.normpath(relative)
    if os.path.isabs(relative) or norm == ".." or norm.startswith(".." + os.sep):
        raise ValueError(f"{what} {relative!r} leaves {root}; refusing to read outside it")
    return Path(root) / norm
