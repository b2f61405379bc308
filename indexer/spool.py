"""The spool file of ``relsearch index -``: standard input copied beside the index, never left behind.

The index job needs a file (it cuts its input into byte ranges for parallel workers and hashes it
to resume), so standard input is copied, block by block, to ``.NAME.stdin-XXXXXXXX.jsonl`` beside
the index ``NAME``. The file's owner holds an exclusive ``flock`` on it from before it has that name
(it is created as ``….jsonl.partial``, locked, then renamed) until it removes it:

- every exit path the process controls removes it: success, an error, a full disk while copying,
  Ctrl-C (KeyboardInterrupt), and SIGTERM / SIGHUP, which :func:`signals_exit` turns into an
  ordinary exit that runs ``finally`` blocks;
- a SIGKILL (or a power cut) cannot be handled; the lock dies with the process, so the next writer
  of the index (a build, ``--append``, ``delete``, ``compact``, ``rollback``, the HTTP API: every
  :func:`indexer.locking.writer_lock`, and every ``relsearch index`` before it reads its input)
  removes the spools that no live process holds (:func:`sweep`). A full disk caused by a spool
  therefore never blocks the next build.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

SUFFIX = ".jsonl"
PARTIAL = ".partial"
PARTIAL_GRACE_S = 60  # a .partial name lives for an instant between creation and lock


def prefix(target: str | os.PathLike) -> str:
    return f".{Path(target).absolute().name}.stdin-"


def sweep(target: str | os.PathLike) -> list[Path]:
    """Remove the spool files of ``target`` that no live process holds (their writer was killed);
    returns the ones removed."""
    target = Path(target).absolute()
    removed = []
    try:
        candidates = [p for p in target.parent.iterdir() if p.name.startswith(prefix(target))
                      and p.name.endswith((SUFFIX, SUFFIX + PARTIAL))]
    except OSError:  # no parent folder yet: nothing to sweep
        return removed
    for path in candidates:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # gone meanwhile, or a symlink / something that is no spool of ours
            continue
        try:
            if path.name.endswith(PARTIAL) and time.time() - os.fstat(fd).st_mtime < PARTIAL_GRACE_S:
                continue  # maybe created this instant, not yet locked by its owner
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.path.samestat(os.fstat(fd), os.lstat(path)):
                path.unlink()
                removed.append(path)
        except OSError:  # BlockingIOError: its owner is alive; else gone meanwhile
            pass
        finally:
            os.close(fd)
    return removed


@contextlib.contextmanager
def spooled(stream, target: str | os.PathLike, block: int = 1 << 20):
    """Copy the binary ``stream`` to a locked spool file beside ``target`` and yield its path; the
    file is removed when the block exits, however it exits (stale spools of dead writers first)."""
    target = Path(target).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep(target)
    fd, partial = tempfile.mkstemp(prefix=prefix(target), suffix=SUFFIX + PARTIAL, dir=target.parent)
    path = partial[:-len(PARTIAL)]
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until the file is gone: a sweep never takes a live spool
        os.rename(partial, path)
        partial = None
        with os.fdopen(os.dup(fd), "wb") as out:
            shutil.copyfileobj(stream, out, block)
        yield path
    finally:
        for name in (partial, path):
            if name is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name)
        os.close(fd)


class Terminated(SystemExit):
    """SIGTERM or SIGHUP arrived: leave through ``finally`` blocks, exit status 128 + signal."""


@contextlib.contextmanager
def signals_exit(signals=(signal.SIGTERM, signal.SIGHUP)):
    """While the block runs (in the main thread), SIGTERM and SIGHUP raise :class:`Terminated`
    instead of ending the process on the spot, so cleanup (the spool, a half-written generation)
    runs as for Ctrl-C. Elsewhere than the main thread it does nothing."""
    def handler(signum, frame):
        raise Terminated(128 + signum)

    try:
        previous = {s: signal.signal(s, handler) for s in signals}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
