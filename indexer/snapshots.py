"""Snapshots: the retained generations of an index, listed with their sizes, and rollback.

A publish keeps the last ``keep`` published generations (default 3, indexer/store.py's publish
history). Generations share unchanged files by hard link (segments, indexer/segments.py), so a
snapshot costs only the files it does not share. ``rollback`` publishes a retained generation
again, atomically and after verifying its files; the generation it replaces stays retained, so a
rollback can itself be undone with ``--to``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .. import faults
from . import integrity, store


class SnapshotError(ValueError):
    """A rollback or retention request that cannot be carried out (the message says why)."""


@dataclass(frozen=True)
class Snapshot:
    name: str
    current: bool
    created_at: str
    op: str  # the run that made it: build, append, delete, compact
    documents: int
    bytes: int  # all its files
    unique_bytes: int  # its files no other retained generation shares (what removing it would free)

    def as_json(self) -> dict:
        return dict(self.__dict__)


def list_snapshots(target: str | os.PathLike) -> list[Snapshot]:
    """The retained generations of ``target``, newest first (the published one first)."""
    gens = store.retained(target)
    if not gens:
        raise FileNotFoundError(f"no index at {target}")
    inodes = {gen: {_inode(p): p.stat().st_size for p in gen.iterdir() if p.is_file()} for gen in gens}
    out = []
    for i, gen in enumerate(gens):
        manifest = store.read_manifest(gen)
        others = set().union(*(inodes[g] for g in gens if g != gen))
        runs = manifest.get("runs") or [{}]
        out.append(Snapshot(gen.name, i == 0, manifest.get("created_at", ""), runs[-1].get("op", "build"),
                            int(manifest["counts"].get("documents", 0)), sum(inodes[gen].values()),
                            sum(size for ino, size in inodes[gen].items() if ino not in others)))
    return out


def set_keep(target: str | os.PathLike, keep: int) -> None:
    """Retain ``keep`` generations from now on (older ones are removed at once)."""
    if keep < 1:
        raise SnapshotError("keep must be at least 1 (the published generation)")
    with store.writer_lock(target):
        if not Path(target).is_symlink():
            raise FileNotFoundError(f"no index at {target}")
        history = store.read_history(target)
        store.write_history(target, {**history, "keep": keep})
        store.remove_stale_generations(Path(target).absolute())


def rollback(target: str | os.PathLike, to: str | None = None) -> tuple[str, dict]:
    """Publish retained generation ``to`` again (default: the one published before the current
    one); returns (its name, its manifest). Its files are verified first."""
    with store.writer_lock(target):
        gens = store.retained(target)
        if not gens:
            raise FileNotFoundError(f"no index at {target}")
        others = [g.name for g in gens[1:]]
        if to is None:
            if not others:
                raise SnapshotError(f"nothing to roll back to: {target} retains only its published generation "
                                    f"(keep {store.read_history(target)['keep']})")
            to = others[0]
        elif to == gens[0].name:
            raise SnapshotError(f"{to} is already the published generation of {target}")
        elif to not in others:
            raise SnapshotError(f"no retained generation {to!r}; retained: {', '.join(others) or '(none)'}")
        gen = store.generations_dir(Path(target).absolute()) / to
        manifest = store.read_manifest(gen)
        store.verify_generation(gen, manifest)
        faults.point("rollback.verified")
        store.publish(target, gen)
        integrity.remember(gen, manifest["files"])
    return to, manifest


def _inode(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino
