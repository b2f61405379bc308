"""Snapshots: the retained generations of an index, listed with their sizes, and rollback.

A publish keeps the last ``keep`` published generations (default 3, indexer/store.py's publish
history). Generations share unchanged files by hard link (segments, indexer/segments.py), so a
snapshot costs only the files it does not share. ``rollback`` publishes a retained generation
again, atomically and after verifying its files; the generation it replaces stays retained, so a
rollback can itself be undone with ``--to``.

A mirror (Elasticsearch) cannot be rolled back: its old indices are deleted once the alias moves
on. ``rollback`` therefore rewrites the restored generation's ``backends`` before publishing it:
an entry whose index the alias no longer holds is marked ``"stale": true`` with ``alias_holds``
(the index the alias does hold), so the manifest never claims a mirror of contents it lacks.
Undoing a rollback restores a generation whose index the alias still holds: that entry is fresh
again. The next mutation with ``--es-url`` re-mirrors, as after any stale entry.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .. import faults
from . import integrity, locking, reader, store
from .manifest import Manifest
from .manifest import write as write_manifest


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
    damaged: str | None = None  # why its manifest cannot be read (it cannot be rolled back to)

    def as_json(self) -> dict:
        return dict(self.__dict__)


def list_snapshots(target: str | os.PathLike) -> list[Snapshot]:
    """The retained generations of ``target``, newest first (the published one first).

    Not under the writer lock (a long build would block it): a generation a concurrent publish
    removes while we read is left out."""
    gens = store.retained(target)
    if not gens:
        raise FileNotFoundError(f"no index at {target}")
    inodes = {gen: files for gen in gens if (files := _files(gen)) is not None}
    out = []
    for i, gen in enumerate(gens):
        if gen not in inodes:
            continue
        others = set().union(*(inodes[g] for g in inodes if g != gen))
        sizes = sum(inodes[gen].values()), sum(size for ino, size in inodes[gen].items() if ino not in others)
        try:
            manifest = store.read_manifest(gen)
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:  # IndexCorruptError is a ValueError: listed, not hidden
            out.append(Snapshot(gen.name, i == 0, "", "?", 0, *sizes, damaged=str(e)))
            continue
        last = manifest.runs[-1] if manifest.runs else {}
        out.append(Snapshot(gen.name, i == 0, manifest.created_at, last.get("op", "build"),
                            manifest.counts.documents, *sizes))
    return out


def retained_bytes(target: str | os.PathLike) -> int:
    """Bytes all retained generations hold together, each hard-linked file counted once."""
    files = {}
    for gen in store.retained(target):
        files.update(_files(gen) or {})
    return sum(files.values())


def keep_of(target: str | os.PathLike) -> int:
    """How many generations ``target`` retains (the published one included)."""
    return store.read_history(target)["keep"]


def set_keep(target: str | os.PathLike, keep: int) -> None:
    """Retain ``keep`` generations from now on (older ones are removed at once)."""
    if not 1 <= keep <= store.MAX_HISTORY:
        raise SnapshotError(f"keep must be between 1 (the published generation only) and {store.MAX_HISTORY}")
    with locking.writer_lock(target, create=False):
        if not store.is_published(target):
            raise FileNotFoundError(f"no index at {target}")
        history = store.read_history(target)
        store.write_history(target, {**history, "keep": keep})
        store.remove_stale_generations(Path(target).absolute())


def rollback(target: str | os.PathLike, to: str | None = None) -> tuple[str, Manifest]:
    """Publish retained generation ``to`` again (default: the one published before the current
    one); returns (its name, its manifest). Its files are verified first."""
    with locking.writer_lock(target, create=False):
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
        try:
            manifest = store.read_manifest(gen)
            reader.verify_generation(gen, manifest)
        except ValueError as e:  # IndexCorruptError, or a format this version cannot read
            rest = [n for n in others if n != to]
            raise e.__class__(f"cannot roll back to {to}: {e}. {target} still serves {gens[0].name}; other retained "
                              f"generations: {', '.join(rest) or '(none)'}") from None
        faults.point("rollback.verified")
        backends = mirrors_after_rollback(manifest.backends, _backends_of(gens[0]))
        if backends != manifest.backends:  # the files and their checksums stay
            manifest = manifest.replace(backends=backends)
            write_manifest(gen, manifest)
            faults.point("rollback.mirrors-marked")
        store.publish(target, gen, remove_builds=False)  # an interrupted build stays resumable
        integrity.remember(gen, manifest.files)
    return to, manifest


def mirrors_after_rollback(restored: dict, current: dict) -> dict:
    """The ``backends`` of a restored generation once it is published again.

    A rollback leaves each mirror's alias where it is: on the index the current generation's entry
    names, or, if a rollback marked that entry, on the one its ``alias_holds`` names (None: not
    known). The restored entry is fresh again only if that index is its own mirror (an entry
    written fresh, or marked ``own_index`` by a rollback); otherwise it is marked stale with
    ``alias_holds``. A mirror only the current generation records is added, stale.
    """
    out = {}
    for name in {**current, **restored}:
        now, entry = current.get(name, {}), restored.get(name)
        holds = now["alias_holds"] if "alias_holds" in now else now.get("index")
        if entry is None:  # the alias holds contents this generation never had
            entry, own = now, False
        else:
            own = entry.get("index") is not None and (not entry.get("stale") or entry.get("own_index") is True)
            if entry.get("alias") != now.get("alias"):
                holds = None  # another alias (or none): what it holds is not known here
        base = {k: v for k, v in entry.items() if k not in ("stale", "alias_holds", "own_index")}
        if own and entry["index"] == holds:
            out[name] = base
        else:
            out[name] = {**base, "stale": True, "alias_holds": holds, "own_index": own}
    return out


def _backends_of(gen: Path) -> dict:
    try:
        return store.read_manifest(gen).backends
    except (OSError, ValueError):  # a damaged current generation is what a rollback is for
        return {}


def _files(gen: Path) -> dict[tuple[int, int], int] | None:
    """``{(st_dev, st_ino): size}`` of a generation's files (hard links share an inode); None if gone."""
    try:
        return {(st.st_dev, st.st_ino): st.st_size
                for p in gen.iterdir() if p.is_file() and not p.is_symlink() for st in [p.stat()]}
    except FileNotFoundError:
        return None
