"""The writer lock of an index: one writer of an index at a time.

``DIR/lock`` is taken exclusively (``flock``) by every writer (build, append, delete, compact,
rollback) before it reads the published generation it starts from, and held until it has
published (indexer/store.py :func:`~.store.publish_new`): two writers never both start from the same
generation. Taking it first moves an index of the old layout into one folder (indexer/migration.py)
and removes the standard-input copies of killed runs (indexer/spool.py).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import threading

from . import spool, store
from .migration import migrate


_held = threading.local()  # the targets whose writer lock this thread holds


@contextlib.contextmanager
def writer_lock(target: str | os.PathLike, *, create: bool = True):
    """Exclusive lock for writers of ``target`` (blocks until the other writer publishes); the lock
    file is ``DIR/lock``. An index of the old layout is migrated first (:func:`~.migration.migrate`).
    ``create``: make the index folder when it is absent (a first build); else FileNotFoundError.
    Re-entrant within a thread: the index job decides under the lock whether to build or append,
    and the append takes it again."""
    target = store.index_dir(target)
    held = _held.__dict__.setdefault("targets", set())
    if target in held:
        yield
        return
    migrate(target)
    if not store._ours(target):
        raise FileExistsError(f"{target} exists and is not a relsearch index; choose another --index")
    if not create and not target.is_dir():
        raise FileNotFoundError(f"no index at {target}; build one with `relsearch index CORPUS.jsonl --index {target}`")
    target.mkdir(parents=True, exist_ok=True)
    with os.fdopen(store.open_lock_file(target / store.LOCK), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        held.add(target)
        try:
            spool.sweep(target)  # standard-input copies of killed `relsearch index -` runs
            yield
        finally:
            held.discard(target)
            fcntl.flock(f, fcntl.LOCK_UN)
