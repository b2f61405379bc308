"""Shard and scratch files through Beam's FileSystems, so workers and the driver need no shared
POSIX mount.

Paths are strings (a local ``Path`` is accepted too): local paths, or any scheme Beam's FileSystems knows (``gs://``, ``s3://``,
``hdfs://``, ``azfs://`` once apache-beam's extra for it is installed). Only whole, bounded files
are written and read (a shard is one chunk: at most ``--chunk-lines`` lines and 32 MiB of input,
plus its vectors). A file appears complete or not at all: written under a temporary name and
renamed (local paths, HDFS), or uploaded as one object (object stores show an object only once its
upload is closed).
"""
from __future__ import annotations

import os
import uuid

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

OBJECT_STORES = ("gs", "s3", "azfs")
_RAW = CompressionTypes.UNCOMPRESSED  # never guess a codec from a file name


def is_local(path: str | os.PathLike) -> bool:
    return FileSystems.get_scheme(os.fspath(path)) in (None, "file")


def join(base: str | os.PathLike, *names: str) -> str:
    return FileSystems.join(os.fspath(base), *names)


def exists(path: str | os.PathLike) -> bool:
    return FileSystems.exists(os.fspath(path))


def _put(path: str, blocks) -> None:
    """Write the byte ``blocks`` to ``path`` so that readers see the whole file or none of it."""
    # a temporary name of its own: workers that write the same file (each writes encoder.json) must
    # not rename one another's half-written copy
    target = path if FileSystems.get_scheme(path) in OBJECT_STORES else f"{path}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        with FileSystems.create(target, compression_type=_RAW) as f:
            for block in blocks:
                f.write(block)
    except OSError as e:
        if e.filename:
            raise
        raise OSError(e.errno, e.strerror or str(e), target) from e  # name the file (a full disk says which)
    if target != path:
        FileSystems.rename([target], [path])


def write(path: str, data: bytes) -> None:
    _put(path, [data])


def read(path: str) -> bytes:
    with FileSystems.open(path, compression_type=_RAW) as f:
        return f.read()


def open_binary(path: str, mode: str = "rb"):
    """A seekable binary reader; ``open``'s signature, for callers that take an opener (``mode`` must be "rb")."""
    if mode != "rb":
        raise ValueError(f"open_binary reads only, got mode {mode!r}")
    return FileSystems.open(path, compression_type=_RAW)


def names(folder: str | os.PathLike, suffix: str) -> list[str]:
    """Paths of the files directly in ``folder`` whose name ends in ``suffix``, sorted."""
    found = FileSystems.match([join(folder, "*" + suffix)])[0].metadata_list
    return sorted(m.path for m in found)


def remove(paths: list[str]) -> None:
    """Delete files or folders (recursively); missing ones are fine."""
    present = [p for p in paths if exists(p)]
    if present:
        FileSystems.delete(present)


def copy_in(local_path: str, dest: str) -> None:
    """Stage a local file at ``dest`` (skipped when a file of the same size is already there)."""
    if exists(dest) and FileSystems.match([dest])[0].metadata_list[0].size_in_bytes == os.path.getsize(local_path):
        return
    with open(local_path, "rb") as src:
        _put(dest, iter(lambda: src.read(1 << 24), b""))
