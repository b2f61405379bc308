"""An index on disk, written aside and published atomically.

``DIR`` is a symlink to one generation folder ``.DIR.generations/<gen>``, which holds::

    manifest.json   encoder identity, bundle, counts, FAISS spec, fields, input fingerprint
    index.faiss     inner-product FAISS index of unit vectors t̂
    vectors.npy     the same unit vectors, float32 (n, d), memory-mapped for exact re-scoring,
                    --id queries and filtered search
    docstore.sqlite id, text, metadata, ‖h‖ per position
    rejected.jsonl  input lines that were not indexed, with line number and reason

A build writes a new generation and then swaps the symlink with ``os.replace`` (atomic on POSIX):
readers see the old index or the new one, never a half-written one, and a killed build leaves the
previous index untouched.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import __version__
from .docstore import DocStore

FORMAT = "relsearch-index/1"
MANIFEST = "manifest.json"
FAISS_FILE = "index.faiss"
VECTORS_FILE = "vectors.npy"
DOCSTORE_FILE = "docstore.sqlite"
REJECTED_FILE = "rejected.jsonl"


def generations_dir(target: Path) -> Path:
    return target.parent / f".{target.name}.generations"


def new_generation(target: str | os.PathLike) -> Path:
    """Create an empty generation folder beside ``target`` (not yet visible to readers)."""
    target = Path(target).absolute()
    if target.exists() and not target.is_symlink():
        raise FileExistsError(f"{target} exists and is not a relsearch index; choose another --index")
    gens = generations_dir(target)
    gens.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    gen = gens / f"{stamp}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    gen.mkdir()
    return gen


def publish(target: str | os.PathLike, gen: Path) -> None:
    """Atomically point ``target`` at ``gen``, then remove generations nobody points to.

    Shards of interrupted builds (``build-*``) go too: a build can be resumed until another build
    of the same index succeeds.
    """
    target = Path(target).absolute()
    tmp_link = target.parent / f".{target.name}.link-{uuid.uuid4().hex[:8]}"
    os.symlink(os.path.relpath(gen, target.parent), tmp_link)
    os.replace(tmp_link, target)
    remove_stale_generations(target, keep=gen)


def remove_stale_generations(target: Path, *, keep: Path | None = None) -> None:
    """Delete generations other than the published one and ``keep`` whose writer is gone."""
    gens = generations_dir(target)
    current = Path(os.path.realpath(target)) if target.is_symlink() else None
    for gen in gens.glob("*") if gens.is_dir() else []:
        if gen in (current, keep):
            continue
        if gen.name.startswith("build-"):  # shards of an interrupted build: drop unless one is running
            if _unlocked(gen / "lock"):
                shutil.rmtree(gen, ignore_errors=True)
            continue
        try:
            pid = int(gen.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if pid != os.getpid() and _alive(pid):
            continue  # another build in progress
        shutil.rmtree(gen, ignore_errors=True)


def _unlocked(lock: Path) -> bool:
    import fcntl

    try:
        with open(lock, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_manifest(gen: Path, manifest: dict) -> None:
    manifest = {"format": FORMAT, "version": __version__,
                "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **manifest}
    (gen / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")


@dataclass
class IndexFiles:
    """A published index opened for reading (one consistent generation)."""

    root: Path
    manifest: dict
    vectors: np.ndarray  # (n, d) float32 unit vectors, memory-mapped
    docstore: DocStore
    _faiss = None

    @property
    def faiss(self):
        """The FAISS index, loaded on first use (``--id`` and filtered queries may not need it)."""
        if self._faiss is None:
            import faiss

            self._faiss = faiss.read_index(str(self.root / FAISS_FILE))
        return self._faiss


def open_index(path: str | os.PathLike) -> IndexFiles:
    """Open the generation ``path`` points to now; later swaps do not affect this reader."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no index at {path}; build one with `relsearch index CORPUS.jsonl --index {path}`")
    root = Path(os.path.realpath(path))
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{path} is not a relsearch index (no {MANIFEST})")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: unsupported index format {manifest.get('format')!r} (expected {FORMAT})")
    vectors = np.load(root / VECTORS_FILE, mmap_mode="r")
    return IndexFiles(root, manifest, vectors, DocStore(str(root / DOCSTORE_FILE)))
