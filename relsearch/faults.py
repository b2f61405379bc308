"""Test-only fault injection: die by SIGKILL at a named point of a write.

``RELSEARCH_FAULT=POINT`` (or ``POINT:N`` for the N-th time the process reaches it) makes the
process send itself SIGKILL there: no ``finally`` block, no ``atexit``, no flush, exactly what a
kill -9, an OOM kill or a power cut does to the process. tests/indexer/test_kill_points.py uses it to
prove that every write either happens completely or leaves the previous index answering.
``POINT:N:stop`` stops the process there (SIGSTOP) instead, so that a test can wait for that
moment (``waitpid`` with ``WUNTRACED``) and kill it from outside, with no guess at timing.

Never set it in production. Unset (the normal case), :func:`point` costs one dictionary lookup.
The points are listed in :data:`POINTS` (documented in docs/guarantees.md).
"""
from __future__ import annotations

import os
import signal
import threading
from collections import Counter

ENV = "RELSEARCH_FAULT"

POINTS = (
    "index.shard-written",      # a chunk's shard is complete (use :N for "after N shards")
    "build.rows-written",       # a new build's vectors.npy and docstore.sqlite are written
    "index.faiss-unit-written",  # the workers' IVF add: a filled unit is written (:N for "after N units")
    "build.faiss-written",      # ... its index.faiss (build, compact)
    "append.faiss-written",     # append: the new generation's data files are written
    "append.segments-merged",   # append: neighbouring segments merged into one in the new generation
    "delete.tombstones-written",  # delete: the new generation's deleted.npy is written
    "compact.rows-copied",      # compact: live rows copied into the new generation
    "commit.mirrors-loaded",    # Elasticsearch holds the new index, the manifest is not written
    "commit.manifest-written",  # the generation is complete, not yet published
    "publish.link-created",     # the new symlink exists under a temporary name
    "publish.swapped",          # the index points at the new generation; old ones not yet removed
    "commit.published",         # published; the Elasticsearch alias not yet swapped
    "rollback.verified",        # rollback: the retained generation's files are verified, not yet published
    "rollback.mirrors-marked",  # rollback: its manifest marks the Elasticsearch entry stale, not yet published
    "train.checkpoint-saved",   # train: a checkpoint (epoch / relation / evaluation) is complete
    "train.bundle-set-aside",   # train: the previous bundle is renamed aside, the new one not yet in place
)

_hits: Counter = Counter()
_lock = threading.Lock()


def point(name: str) -> None:
    """SIGKILL this process if ``RELSEARCH_FAULT`` names ``name`` (and this is the N-th arrival)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    wanted, _, rest = spec.partition(":")
    if wanted != name:
        return
    nth, _, action = rest.partition(":")
    with _lock:
        _hits[name] += 1
        arrived = _hits[name]
    if arrived >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGSTOP if action == "stop" else signal.SIGKILL)
