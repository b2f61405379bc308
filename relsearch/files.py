"""File helpers every layer uses: one sha256 of a file, one write-aside-then-rename.

Base layer (tests/cli_api/test_import_direction.py): imports nothing from relsearch.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
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
