"""An index of the old layout moved into one folder, by its next writer.

Before one-folder indexes, ``DIR`` was a symlink to ``.DIR.generations/<gen>``, with
``.DIR.history.json`` and ``.DIR.lock`` beside it. Such an index opens as it is (indexer/store.py
reads either layout); :func:`~relsearch.indexer.locking.writer_lock` calls :func:`migrate` before
a writer changes it. The move hard-links every generation (copies across file systems) into a new
folder beside ``DIR``, ``.DIR.migrating-<id>``, with its ``current`` pointer and history, which
then takes the symlink's place in one atomic exchange; a writer killed on the way leaves a state
the next one finishes or starts again from.
"""
from __future__ import annotations

import ctypes
import datetime as _dt
import fcntl
import json
import os
import shutil
import uuid
from pathlib import Path

from .. import faults
from .store import (CURRENT, GENERATION_NAME, GENERATIONS, HISTORY, fsync_dir, fsync_generation, index_dir, legacy,
                    legacy_path, link_or_copy, open_lock_file, read_history, show_rejected)


def migrate(target: str | os.PathLike) -> bool:
    """Move an index of the old layout (``DIR`` a symlink to ``.DIR.generations/<gen>``, with
    ``.DIR.history.json`` and ``.DIR.lock`` beside it) into one folder: every generation and build
    folder is hard-linked (copied across file systems) into a new folder with its ``current``
    pointer and history, which then takes the symlink's place in one atomic exchange
    (``renameat2(RENAME_EXCHANGE)``; where that is missing, the link is removed and the folder renamed
    in its place, and a writer killed between the two finishes the move next time). The old
    folders go last. Under the old lock, so old writers and other migrators wait; readers that
    opened a generation keep their open files, and an open racing the exchange retries.
    Returns True when it migrated (or finished a killed migration)."""
    target = index_dir(target)
    old_lock = legacy_path(target, "lock")
    if not legacy(target) and not (not os.path.lexists(target) and in_progress(target)):
        return False
    with os.fdopen(open_lock_file(old_lock), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        done = False
        if legacy(target):
            _move(target)
            done = True
        elif not os.path.lexists(target):  # killed between removing the link and renaming the folder
            done = _finish_killed(target)
        fsync_dir(target.parent)
        if os.path.lexists(target) and not legacy(target):
            _remove_old(target)
            old_lock.unlink(missing_ok=True)  # a writer waiting on it sees the new layout and takes DIR/lock
        return done


def in_progress(target: Path) -> bool:
    """A migration of ``target`` was started and not cleaned up (its ``.DIR.migrating-*`` folder is there)."""
    return bool(_migrations(target))


def _migrations(target: Path) -> list[Path]:
    return list(target.parent.glob(f".{target.name}.migrating-*"))


def _move(target: Path) -> None:
    """Build the one-folder index beside the old-layout ``target`` and put it in the symlink's place."""
    for stale in _migrations(target):  # a migration killed before its exchange
        shutil.rmtree(stale, ignore_errors=True)
    tmp = legacy_path(target, f"migrating-{uuid.uuid4().hex[:8]}")
    (tmp / GENERATIONS).mkdir(parents=True)
    name = _copy_generations(target, tmp / GENERATIONS)
    (tmp / HISTORY).write_text(json.dumps(read_history(target)) + "\n", encoding="utf-8")
    (tmp / CURRENT).write_text(name + "\n", encoding="utf-8")
    fsync_generation(tmp)
    if _exchange(tmp, target):
        os.unlink(tmp)  # the old symlink, now under the temporary name
    else:
        os.unlink(target)
        faults.point("migrate.link-removed")
        os.rename(tmp, target)
    show_rejected(target, target / GENERATIONS / name)


def _copy_generations(target: Path, gens: Path) -> str:
    """Link every generation and build folder of the old-layout ``target`` into ``gens``; returns
    the name of the published one there (a folder the link names outside ``.DIR.generations`` is
    copied in too, under a name a writer gives, so that retention can remove it one day)."""
    published = Path(os.path.realpath(target))
    name = published.name
    old_gens = legacy_path(target, "generations")
    for entry in sorted(old_gens.iterdir()) if old_gens.is_dir() else []:
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, gens / entry.name, symlinks=True, copy_function=link_or_copy)
    if published.parent != old_gens.resolve() and published.is_dir():  # a link to a folder elsewhere
        if not GENERATION_NAME.fullmatch(name) or (gens / name).exists():
            name = f"{_dt.datetime.now(_dt.timezone.utc):%Y%m%dT%H%M%S}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        shutil.copytree(published, gens / name, symlinks=True, copy_function=link_or_copy)
    return name


def _finish_killed(target: Path) -> bool:
    """Rename a complete migrated folder into the place of ``target``, whose link a killed
    migration removed; True when one was."""
    done = False
    for tmp in _migrations(target):
        if (tmp / CURRENT).is_file() and not os.path.lexists(target):
            os.rename(tmp, target)
            done = True
    return done


def _remove_old(target: Path) -> None:
    """Remove what the old layout left beside the migrated ``target``: unfinished migration
    folders, ``.DIR.generations``, ``.DIR.history.json`` and the old publish's temporary links."""
    for stale in _migrations(target):
        if stale.is_symlink() or stale.is_file():
            stale.unlink(missing_ok=True)
        else:
            shutil.rmtree(stale, ignore_errors=True)
    shutil.rmtree(legacy_path(target, "generations"), ignore_errors=True)
    legacy_path(target, "history.json").unlink(missing_ok=True)
    for link in target.parent.glob(f".{target.name}.link-*"):  # temporary links of the old publish
        if link.is_symlink():
            link.unlink(missing_ok=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` atomically (Linux ``renameat2`` with ``RENAME_EXCHANGE``);
    False where the system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0
