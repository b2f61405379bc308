"""An index generation as a list of immutable segments, read as one index.

A segment covers a contiguous range of positions ``[start, start + positions)`` and has its own
three files, named with the segment's prefix: ``{prefix}vectors.npy`` (unit vectors, local rows),
``{prefix}index.faiss`` (local FAISS ids 0…) and ``{prefix}docstore.sqlite`` (global positions).
The first segment has the empty prefix, so an index built before segments existed, or rebuilt by
``compact``, is one segment with the classic file names. An append writes one new segment
(``s<N>-``); every other file of the generation is a hard link to the previous one's, so an append
costs in proportion to its own size. A delete only rewrites ``deleted.npy``: segment files are
never modified, deleted positions are tombstones that every read path excludes.

When the first segment is an IVF index, an appended or merged segment's FAISS index is a copy of
its trained, empty form (``trained.faiss``, written by the build) filled with the segment's rows:
no training, and the tuned ``nprobe`` applies to it as to the first segment. All of them share the
first segment's coarse quantizer, so a query computes its coarse assignment once and each segment
scans only its share of the probed lists (indexer/ann.py ``search_segments``). Otherwise (Flat,
HNSW, refine wrappers) appended segments are exact ``Flat`` indexes.

The manifest's ``segments`` lists ``{"prefix", "start", "positions"}`` in position order (absent:
one segment holding every position). :class:`Vectors` and :class:`Documents` present the segments
as the single ``vectors.npy`` and docstore that readers used before, with deleted positions
excluded from every docstore answer.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .docstore import DocRows, DocStore, read_distinct

VECTORS = "vectors.npy"
FAISS = "index.faiss"
DOCSTORE = "docstore.sqlite"
TRAINED_FILE = "trained.faiss"  # the first segment's trained, empty IVF index (faiss_index.trained_empty)
# s<N>-: ASCII digits only (str.isdigit also takes "²", which int() refuses), at most 9 of them
PREFIX = re.compile(r"s[0-9]{1,9}-", re.ASCII)
MAX_SEGMENTS = 10  # default merge threshold: an append leaving more segments merges the smallest neighbours


@dataclass(frozen=True)
class SegmentSpec:
    """One segment as the manifest records it."""

    prefix: str
    start: int
    positions: int

    @property
    def stop(self) -> int:
        return self.start + self.positions

    def file(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def files(self) -> tuple[str, str, str]:
        return self.file(VECTORS), self.file(DOCSTORE), self.file(FAISS)

    def as_json(self) -> dict:
        return {"prefix": self.prefix, "start": self.start, "positions": self.positions}


def check_specs(segs: list[SegmentSpec], positions: int) -> str | None:
    """What is wrong with a segment list (None when the segments tile 0…positions in order)."""
    at = 0
    for s in segs:
        if not isinstance(s.prefix, str) or (s.prefix and not PREFIX.fullmatch(s.prefix)):
            return f"segment prefix {s.prefix[:40] if isinstance(s.prefix, str) else s.prefix!r} is not '' or s<N>-"
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (s.start, s.positions)):
            return f"segment {s.prefix!r} has a start or size that is not an integer"
        if s.start != at or s.positions < 0:
            return f"segment {s.prefix!r} starts at {s.start}, expected {at}"
        at = s.stop
    return None if at == positions else f"segments hold {at} positions, the counts say {positions}"


def next_prefix(segs: list[SegmentSpec]) -> str:
    numbers = [int(s.prefix[1:-1]) for s in segs if s.prefix]
    return f"s{max(numbers, default=0) + 1}-"


def segment_index(vectors: np.ndarray, trained_path) -> object:
    """The FAISS index of an appended or merged segment over ``vectors`` (local ids 0…): the
    build's trained, empty IVF index filled with them when there is one, else exact ``Flat``."""
    import faiss

    if trained_path is not None and os.path.exists(trained_path):
        index = faiss.read_index(str(trained_path))
    else:
        index = faiss.IndexFlatIP(vectors.shape[1])
    for i in range(0, len(vectors), 65_536):
        index.add(np.ascontiguousarray(vectors[i:i + 65_536], dtype=np.float32))
    return index


def merge_plan(segs: list[SegmentSpec], max_segments: int) -> tuple[int, int] | None:
    """The slice ``[i, j)`` of appended segments to merge so that at most ``max_segments`` remain,
    or None. The first segment (the trained, tuned index) is never merged here; ``compact`` does.

    Tiered like Lucene's policy in spirit: of the runs of adjacent appended segments that would
    bring the count down to ``max_segments``, the one with the fewest positions merges, so small
    recent appends combine first and the cost stays in proportion to what is merged.
    """
    excess = len(segs) - max(max_segments, 2)
    if excess <= 0:
        return None
    width = excess + 1
    runs = [(sum(s.positions for s in segs[i:i + width]), i) for i in range(1, len(segs) - width + 1)]
    if not runs:
        return None
    _, i = min(runs)
    return i, i + width


class Vectors:
    """Read-only (positions, d) float32 rows over several segments' memory maps: the slicing and
    fancy indexing the search paths use on ``vectors.npy``, by global position."""

    dtype = np.dtype(np.float32)
    ndim = 2

    def __init__(self, parts: list[np.ndarray], starts: list[int]):
        self.parts, self.starts = parts, np.asarray(starts, np.int64)
        self.shape = (int(self.starts[-1] + len(parts[-1])), int(parts[0].shape[1]))

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype=None, copy=None):
        return self[0:len(self)].astype(dtype or np.float32, copy=False)

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            key = int(key) + (len(self) if key < 0 else 0)
            i = int(np.searchsorted(self.starts, key, side="right") - 1)
            return self.parts[i][key - self.starts[i]]
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                return self[np.arange(start, stop, step)]
            pieces = [np.asarray(p[max(start - s, 0):max(stop - s, 0)]) for p, s in zip(self.parts, self.starts)]
            return np.concatenate(pieces) if pieces else np.zeros((0, self.shape[1]), np.float32)
        idx = np.asarray(key, dtype=np.int64)
        out = np.empty((*idx.shape, self.shape[1]), np.float32)
        which = np.searchsorted(self.starts, idx, side="right") - 1
        for i in np.unique(which):
            at = which == i
            out[at] = self.parts[i][idx[at] - self.starts[i]]
        return out


class Documents:
    """The docstore of a generation: one SQLite file per segment, read as one, deleted positions
    excluded (segment files are immutable, so a delete leaves its rows there as tombstones)."""

    def __init__(self, parts: list[DocStore], deleted: np.ndarray, positions: int, starts: list[int] | None = None):
        self.parts = parts
        self.starts = np.asarray([0] if starts is None else starts, np.int64)  # each part's first position
        self.deleted = np.asarray(deleted, np.int64)
        self.total = positions
        self._dead: np.ndarray | None = None

    def _is_dead(self, positions: np.ndarray) -> np.ndarray:
        if not len(self.deleted):
            return np.zeros(len(positions), bool)
        if self._dead is None:
            self._dead = np.zeros(self.total, bool)
            self._dead[self.deleted] = True
        return self._dead[positions]

    def positions(self, ids: list[str]) -> dict[str, int]:
        """id → live position (a replaced id's newest, live row; deleted ids are absent)."""
        out: dict[str, int] = {}
        for part in self.parts:
            found = part.positions(ids)
            if found and len(self.deleted):
                dead = self._is_dead(np.fromiter(found.values(), np.int64, len(found)))
                found = {i: p for (i, p), d in zip(found.items(), dead) if not d}
            out.update(found)
        return out

    def get(self, positions: list[int]) -> dict[int, dict]:
        if len(self.parts) == 1:
            return self.parts[0].get(positions)
        out: dict[int, dict] = {}
        for part in self.parts:
            out.update(part.get(positions))
        return out

    def read(self, positions: Sequence[int]) -> DocRows:
        """id, text and metadata JSON of ``positions`` (sorted, distinct), in that order
        (:meth:`DocStore.read`): one read per segment holding some of them."""
        parts = self._per_segment(positions, DocStore.read)
        return DocRows.concat(parts) if parts else DocRows([])

    def read_at(self, positions: np.ndarray) -> tuple[DocRows, np.ndarray]:
        """The documents at ``positions`` (any shape, -1 for none) and each one's row among them
        (:meth:`DocStore.read_at`)."""
        if len(self.parts) == 1:
            return self.parts[0].read_at(positions)
        return read_distinct(self.read, np.asarray(positions, np.int64))

    def norms(self, positions: Sequence[int]) -> np.ndarray:
        """‖h‖ of each of ``positions`` (any order, repeats allowed): one read per segment holding some."""
        if len(self.parts) == 1:
            return self.parts[0].norms(positions)
        distinct, inverse = np.unique(np.asarray(positions, np.int64), return_inverse=True)
        return np.concatenate([np.zeros(0)] + self._per_segment(distinct, DocStore.norms))[inverse]

    def _per_segment(self, positions: Sequence[int], read) -> list:
        """``read(part, its share of positions)`` for each segment holding some of the sorted ``positions``."""
        if len(self.parts) == 1:
            return [read(self.parts[0], positions)] if len(positions) else []
        cuts = np.searchsorted(np.asarray(positions, np.int64), self.starts[1:]).tolist()
        return [read(part, positions[a:b]) for part, a, b in zip(self.parts, [0] + cuts, cuts + [len(positions)])
                if b > a]

    def matching(self, filters) -> list[int]:
        found = np.concatenate([np.asarray(p.matching(filters), np.int64) for p in self.parts])
        return found[~self._is_dead(found)].tolist()

    def filter_warnings(self, filters) -> list[str]:
        """Operators of ``filters`` that can never match in any segment (indexer/filters.warnings)."""
        from . import filters as flt

        return flt.warnings(flt.clauses(filters), lambda f: set().union(*(p.field_types(f) for p in self.parts)))

    def rows(self, batch: int = 10_000):
        """Live (pos, id, text, metadata, norm) rows in position order, in lists of at most ``batch``."""
        for part in self.parts:
            for rows in part.rows(batch):
                dead = self._is_dead(np.fromiter((r[0] for r in rows), np.int64, len(rows)))
                kept = [r for r, d in zip(rows, dead) if not d]
                if kept:
                    yield kept

    def count(self) -> int:
        """Live documents: every row minus the deleted positions that still have one."""
        dead = json.dumps(self.deleted.tolist())
        q = "SELECT COUNT(*) FROM docs WHERE pos IN (SELECT value FROM json_each(?))"
        return sum(part.count() - part.conn.execute(q, (dead,)).fetchone()[0] for part in self.parts)

    def close(self) -> None:
        for part in self.parts:
            part.close()
