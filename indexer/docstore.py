"""SQLite document store: id, text, metadata JSON and raw norm ‖h‖ per FAISS position, and the
indexed side table that answers metadata filters (indexer/filters.py)."""
from __future__ import annotations

import json
import os
import sqlite3
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from . import filters as flt
from .records import json_text

SCHEMA = """
CREATE TABLE docs (
    pos INTEGER PRIMARY KEY,   -- row in the FAISS index and in vectors.npy
    id TEXT NOT NULL UNIQUE,
    text TEXT NOT NULL,
    meta TEXT NOT NULL,        -- JSON object of the record's other fields
    norm REAL NOT NULL         -- ‖h‖ of the raw pooled vector: h = t̂ · norm
);
"""
# One row per metadata field of a document and per scalar element of an array field
# (filters.fields_of). Clustered on (field, type, value) so that an equality, range or IN filter
# is an index range scan that reads only its matches.
FIELDS_SCHEMA = """
CREATE TABLE fields (
    field TEXT NOT NULL,
    type TEXT NOT NULL,        -- text | number | bool (0/1) | null | array | object
    value NOT NULL,            -- no affinity: numbers stay numbers, strings strings ('' for null/array/object)
    folded TEXT,               -- casefold(value) of text values, for case-insensitive matches
    elem INTEGER NOT NULL,     -- 1: an element of an array field; 0: the field's own value
    pos INTEGER NOT NULL,
    PRIMARY KEY (field, type, value, elem, pos)
) WITHOUT ROWID;
"""
MMAP_BYTES = 1 << 30  # of a read-only docstore mapped at most (address space, not memory)
# A read-only docstore loads its documents into memory at its first batch-sized lookup (MEMORY_AT ids
# or positions) when they fit what is left of MEMORY_BUDGET: the bytes that all the docstores of this
# process may hold in memory together, counted before loading as the UTF-8 size of each document's
# id, text and metadata JSON plus ROW_BYTES for its Python objects (the row tuple, three string
# headers, the id → position entry, the norm). A 200k-document store of short texts (64 bytes a
# document) holds 76 MiB, measured with tracemalloc, against 77 estimated; loaded at ~0.1 s per 20k
# documents, with at most one 65,536-row chunk of SQL rows beside it while it loads. A batch of
# 1,000 queries then reads its 10,000 hits in ~1 ms instead of ~10 ms of SQL, which cost more than
# half of what FAISS takes to find them (20k flat index). Pages of a few hits stay on SQL and load
# nothing; a store too big for the budget stays on SQL for good, one that finds the budget held by
# other stores (an older generation still open) asks again at its next batch-sized lookup. The bytes
# are given back when the store is closed or collected.
MEMORY_AT = 64
ROW_BYTES = 340
LOAD_CHUNK = 1 << 16


def _default_budget() -> int:
    """256 MiB, or 1/16 of the machine's memory where that is less."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        ram = 0
    return min(256 << 20, ram // 16) if ram > 0 else 256 << 20


MEMORY_BUDGET = _default_budget()
FIELDS_INDEXES = """
CREATE INDEX fields_folded ON fields(field, folded) WHERE folded IS NOT NULL;
"""


@dataclass(frozen=True)
class DocRows:
    """Some documents as read, in the order they were asked for: ``rows`` of (id, text, metadata JSON
    as stored). The metadata is decoded only when asked, by :meth:`metadata`: a results page that is
    never shown costs no JSON decoding, and the rows are kept as sqlite3 returns them, uncopied."""

    rows: list[tuple[str, str, str]]

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def ids(self) -> list[str]:
        return [r[0] for r in self.rows]

    def metadata(self, rows: Sequence[int]) -> list[dict]:
        """The decoded metadata of ``rows`` (indexes into :attr:`rows`), one JSON decode for all."""
        return json.loads("[" + ",".join([self.rows[r][2] for r in rows]) + "]") if len(rows) else []

    @classmethod
    def concat(cls, parts: Sequence[DocRows]) -> DocRows:
        return parts[0] if len(parts) == 1 else cls([r for p in parts for r in p.rows])


def read_distinct(read, positions: np.ndarray) -> tuple[DocRows, np.ndarray]:
    """``read`` (a docstore's :meth:`DocStore.read`) of the distinct positions among ``positions``
    (any shape, -1 for none), and each position's row in what it returned (-1 for none)."""
    distinct, slots = np.unique(positions, return_inverse=True)
    slots = slots.reshape(positions.shape)
    if len(distinct) and distinct[0] < 0:  # padding: the smallest value, not a document
        distinct, slots = distinct[1:], slots - 1
    return read(distinct.tolist()), slots


class _Budget:
    """The bytes of documents this process's docstores hold in memory (:data:`MEMORY_BUDGET`)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.used = 0

    def take(self, n: int) -> bool:
        with self._lock:
            if self.used + n > MEMORY_BUDGET:
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n


BUDGET = _Budget()


@dataclass(frozen=True)
class _InMemory:
    """Every document of a read-only docstore whose positions run ``first``, ``first`` + 1, …"""

    first: int
    rows: list[tuple[str, str, str]]  # (id, text, metadata JSON), as DocRows holds them
    position: dict[str, int]  # id → position
    norms: np.ndarray

    def slots(self, positions: Sequence[int]) -> np.ndarray | None:
        """Row of each position; None when one has no document here."""
        slots = np.asarray(positions, np.int64) - self.first
        return slots if not len(slots) or (slots.min() >= 0 and slots.max() < len(self.rows)) else None


class DocStore:
    """``create``: a new file (a new segment's, written once); else read-only. Segment docstores are
    never modified after their generation is published: deletes are tombstones (indexer/segments.py),
    so a read-only one may hold its documents in memory (:data:`MEMORY_BUDGET`)."""

    def __init__(self, path: str, *, create: bool = False):
        self._indexes_pending = False
        self._memory: _InMemory | None = None
        self._memory_lock = threading.Lock()
        self._memory_tried = create  # decided: loaded, or never will be (a store being written never loads)
        self._memory_bytes: int | None = None  # the estimate, once counted
        self._memory_release = None  # gives the bytes back to BUDGET: on close() or when collected
        if create:
            self.conn = sqlite3.connect(path)
            # no fsync per commit: a new file is read by nobody until its generation is published,
            # and the publish fsyncs every file first (store.fsync_generation); a crash before
            # then leaves a generation that is never published. 20k documents: 0.10 -> 0.09 s
            self.conn.execute("PRAGMA synchronous = OFF")
            self.conn.executescript(SCHEMA + FIELDS_SCHEMA)
            self._indexes_pending = True  # built once by close(): cheaper than growing them row by row
        else:  # read-only: a reader never writes to a published index
            self.conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
            # memory-mapped pages: a results page reads thousands of random rows, and through the
            # default 2 MB page cache each miss was a read() and a copy (a 200k docstore's 10k-row
            # read: 16 → 13 ms). Safe here: a published segment file is never written again.
            self.conn.execute(f"PRAGMA mmap_size = {MMAP_BYTES}")

    def add(self, rows: Iterable[tuple[int, str, str, dict, float]]) -> None:
        """rows: (pos, id, text, metadata, norm)."""
        rows = list(rows)
        self.conn.executemany(
            "INSERT INTO docs VALUES (?, ?, ?, ?, ?)",
            ((p, i, t, json_text(m), float(n)) for p, i, t, m, n in rows),
        )
        self._add_fields([rows])
        self.conn.commit()

    def _add_fields(self, batches) -> None:
        for rows in batches:
            self.conn.executemany("INSERT INTO fields VALUES (?, ?, ?, ?, ?, ?)",
                                  (r + (p,) for p, _, _, m, _ in rows for r in flt.fields_of(m)))

    def has_fields_table(self) -> bool:
        q = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'fields'"
        return self.conn.execute(q).fetchone() is not None

    def _in_memory(self, wanted: int) -> _InMemory | None:
        """The documents in memory, loaded now if ``wanted`` (ids or positions asked for at once)
        is batch-sized and they fit the budget (:data:`MEMORY_BUDGET`); else None."""
        if self._memory_tried or wanted < MEMORY_AT:  # loaded, or too big / gapped, or not asked yet
            return self._memory
        with self._memory_lock:
            if not self._memory_tried:
                self._memory_tried = self._try_load()
        return self._memory

    def memory_bytes(self) -> int:
        """What this store's documents take in memory, estimated as :data:`MEMORY_BUDGET` counts
        them (one SQL pass over the documents, counted once; no pass when their count alone
        exceeds the budget)."""
        if self._memory_bytes is None:
            rows = self.count()
            if rows * ROW_BYTES > MEMORY_BUDGET:
                return rows * ROW_BYTES  # a lower bound, enough to refuse
            q = ("SELECT TOTAL(LENGTH(CAST(id AS BLOB)) + LENGTH(CAST(text AS BLOB)) + LENGTH(CAST(meta AS BLOB))) "
                 "FROM docs")
            self._memory_bytes = int(self.conn.execute(q).fetchone()[0]) + rows * ROW_BYTES
        return self._memory_bytes

    def _try_load(self) -> bool:
        """Load the documents if they fit what is left of the budget; True once decided for good
        (loaded, larger than the whole budget, or positions with gaps), False while other stores
        hold the budget (asked again at the next batch-sized lookup)."""
        size = self.memory_bytes()
        if size > MEMORY_BUDGET:
            return True
        if not BUDGET.take(size):
            return False
        try:
            self._memory = self._load()
        finally:
            if self._memory is None:
                BUDGET.give(size)
        if self._memory is not None:
            self._memory_release = weakref.finalize(self, BUDGET.give, size)
        return True

    def _load(self) -> _InMemory | None:
        rows: list[tuple[str, str, str]] = []
        position: dict[str, int] = {}
        norms: list[float] = []
        first = last = None
        cur = self.conn.execute("SELECT pos, id, text, meta, norm FROM docs ORDER BY pos")
        while chunk := cur.fetchmany(LOAD_CHUNK):  # SQL rows one chunk at a time beside the copy
            rows += [(i, t, m) for _, i, t, m, _ in chunk]
            position.update({i: p for p, i, _, _, _ in chunk})
            norms += [n for *_, n in chunk]
            first = chunk[0][0] if first is None else first
            last = chunk[-1][0]
        if not rows or last - first != len(rows) - 1:  # positions not consecutive: stay on SQL
            return None
        return _InMemory(first, rows, position, np.asarray(norms, np.float64))

    def positions(self, ids: list[str]) -> dict[str, int]:
        memory = self._in_memory(len(ids))
        if memory is not None:
            get = memory.position.get
            return {i: p for i in ids if (p := get(i)) is not None}
        out = {}
        for chunk in _chunks(ids, 500):
            q = f"SELECT id, pos FROM docs WHERE id IN ({','.join('?' * len(chunk))})"
            out.update(self.conn.execute(q, chunk).fetchall())
        return out

    def get(self, positions: list[int]) -> dict[int, dict]:
        """pos → {"id", "text", "norm", "metadata"} for the given positions (absent ones are skipped).

        One statement (the positions travel as one JSON array) and one JSON decode for all the
        metadata: the per-row cost is what bounds a results page, so it is kept to the minimum.
        """
        wanted = json.dumps([int(p) for p in positions])
        q = "SELECT pos, id, text, meta, norm FROM docs WHERE pos IN (SELECT value FROM json_each(?))"
        rows = self.conn.execute(q, (wanted,)).fetchall()
        metas = json.loads("[" + ",".join(r[3] for r in rows) + "]") if rows else []
        return {pos: {"id": doc_id, "text": text, "norm": norm, "metadata": meta}
                for (pos, doc_id, text, _, norm), meta in zip(rows, metas)}

    def read(self, positions: Sequence[int]) -> DocRows:
        """The id, text and stored metadata JSON of ``positions`` (sorted, distinct), in that order:
        one statement whose rows come back in primary-key order, so the B-tree is walked
        forward once and no row needs matching up afterwards. LookupError names a position without a
        document (a damaged index: every position a search returns has one)."""
        if not len(positions):
            return DocRows([])
        memory = self._in_memory(len(positions))
        if memory is not None and (slots := memory.slots(positions)) is not None:
            return DocRows([memory.rows[s] for s in slots.tolist()])
        q = "SELECT id, text, meta FROM docs WHERE pos IN (SELECT value FROM json_each(?)) ORDER BY pos"
        rows = self.conn.execute(q, (json.dumps([int(p) for p in positions]),)).fetchall()
        if len(rows) != len(positions):
            found = set(self.get(list(positions)))
            missing = [int(p) for p in positions if int(p) not in found]
            raise LookupError(f"no document at position(s) {', '.join(map(str, missing[:5]))} of the docstore")
        return DocRows(rows)

    def read_at(self, positions: np.ndarray) -> tuple[DocRows, np.ndarray]:
        """The documents at ``positions`` (an array of any shape, -1 for none, repeats allowed) and
        each position's row among them (-1 for none), as :func:`read_distinct`. With the documents in
        memory, the rows are all of them, uncopied, and a position's row is found by subtraction: a
        batch's hits need no sort and no list built per hit."""
        positions = np.asarray(positions, np.int64)
        memory = self._in_memory(positions.size)
        found = positions >= 0
        if memory is not None and memory.slots(positions[found]) is not None:  # each one has a document here
            return DocRows(memory.rows), np.where(found, positions - memory.first, -1)
        return read_distinct(self.read, positions)

    def norms(self, positions: Sequence[int]) -> np.ndarray:
        """‖h‖ of each of ``positions`` (any order, repeats allowed): what an ``--id`` query needs of its
        document, without reading its text and metadata (LookupError as :meth:`read`)."""
        positions = np.asarray(positions, np.int64)
        memory = self._in_memory(len(positions))
        if memory is not None and (slots := memory.slots(positions)) is not None:
            return memory.norms[slots]
        distinct, inverse = np.unique(positions, return_inverse=True)
        q = "SELECT norm FROM docs WHERE pos IN (SELECT value FROM json_each(?)) ORDER BY pos"
        rows = self.conn.execute(q, (json.dumps(distinct.tolist()),)).fetchall()
        if len(rows) != len(distinct):
            self.read(distinct)  # names the missing positions
        return np.asarray([n for (n,) in rows], np.float64)[inverse]

    def matching(self, filters: Mapping[str, object]) -> list[int]:
        """Sorted positions whose metadata satisfies ``filters`` (the typed JSON form of
        indexer/filters.py; FilterError if invalid), answered from the indexed side table."""
        if not self.has_fields_table():
            raise flt.FilterError("this index predates typed filters (no filter table in its docstore): "
                                  "run `relsearch compact --index DIR` once to add it")
        sql, args = flt.matching_sql(flt.clauses(filters))
        return [p for (p,) in self.conn.execute(sql, args)]

    def field_types(self, field: str) -> set[str]:
        """The side-table types (filters.TYPES) that occur in ``field``, elements of arrays included:
        one index seek per type, whatever the number of documents."""
        if not self.has_fields_table():
            return set(flt.TYPES)  # unknown: never warn
        q = "SELECT 1 FROM fields WHERE field = ? AND type = ? LIMIT 1"
        return {t for t in flt.TYPES if self.conn.execute(q, (field, t)).fetchone()}

    def filter_warnings(self, filters: Mapping[str, object]) -> list[str]:
        """Lines for the operators of ``filters`` that can never match here (filters.warnings)."""
        return flt.warnings(flt.clauses(filters), self.field_types)

    def rows(self, batch: int = 10_000):
        """Yield lists of (pos, id, text, metadata, norm) in position order."""
        cur = self.conn.execute("SELECT pos, id, text, meta, norm FROM docs ORDER BY pos")
        while rows := cur.fetchmany(batch):
            yield [(p, i, t, json.loads(m), n) for p, i, t, m, n in rows]

    def texts(self) -> tuple[np.ndarray, list[str]]:
        """(positions, texts) of every document in position order: what BM25 lists need, without
        the metadata JSON that :meth:`rows` decodes (a third of a 20k index's BM25 build)."""
        rows = self.conn.execute("SELECT pos, text FROM docs ORDER BY pos").fetchall()
        return np.fromiter((p for p, _ in rows), np.int64, len(rows)), [t for _, t in rows]

    def metadata_fields(self) -> list[str]:
        """Sorted union of metadata keys over all documents."""
        q = "SELECT DISTINCT j.key FROM docs, json_each(docs.meta) AS j ORDER BY j.key"
        return [k for (k,) in self.conn.execute(q)]

    def count(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM docs").fetchone()[0]

    def close(self) -> None:
        if self._indexes_pending:
            self.conn.executescript(FIELDS_INDEXES)
            self.conn.commit()
            self._indexes_pending = False
        self.conn.close()
        with self._memory_lock:
            self._memory, self._memory_tried = None, True
            if self._memory_release is not None:
                self._memory_release()  # once: a finalizer runs at most once


def _chunks(xs: list, n: int):
    for i in range(0, len(xs), n):
        yield xs[i:i + n]
