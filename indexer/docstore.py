"""SQLite document store: id, text, metadata JSON and raw norm ‖h‖ per FAISS position."""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable

SCHEMA = """
CREATE TABLE docs (
    pos INTEGER PRIMARY KEY,   -- row in the FAISS index and in vectors.npy
    id TEXT NOT NULL UNIQUE,
    text TEXT NOT NULL,
    meta TEXT NOT NULL,        -- JSON object of the record's other fields
    norm REAL NOT NULL         -- ‖h‖ of the raw pooled vector: h = t̂ · norm
);
"""


class DocStore:
    """``create``: a new file; ``write``: open an unpublished copy for a mutation; else read-only."""

    def __init__(self, path: str, *, create: bool = False, write: bool = False):
        if create:
            self.conn = sqlite3.connect(path)
            self.conn.executescript(SCHEMA)
        elif write:
            self.conn = sqlite3.connect(path)
        else:  # read-only: a reader never writes to a published index
            self.conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)

    def add(self, rows: Iterable[tuple[int, str, str, dict, float]]) -> None:
        """rows: (pos, id, text, metadata, norm)."""
        self.conn.executemany(
            "INSERT INTO docs VALUES (?, ?, ?, ?, ?)",
            ((p, i, t, json.dumps(m, ensure_ascii=False), float(n)) for p, i, t, m, n in rows),
        )
        self.conn.commit()

    def positions(self, ids: list[str]) -> dict[str, int]:
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

    def matching(self, filters: dict[str, str | bool | int | float]) -> list[int]:
        """Positions whose metadata equals every filter value, types included: a str matches only a
        JSON string, a bool only true/false, a number only a number (1 matches 1 and 1.0, never true).

        SQLite's json_extract turns JSON true into 1 and cannot tell "1" from 1 in a comparison, so
        each clause also checks json_type.
        """
        where, args = [], []
        for field, value in filters.items():
            path = '$."' + field.replace('"', '""') + '"'
            if isinstance(value, bool):
                where.append("json_type(meta, ?) = ?")
                args += [path, "true" if value else "false"]
            elif isinstance(value, (int, float)):
                where.append("json_type(meta, ?) IN ('integer', 'real') AND json_extract(meta, ?) = ?")
                args += [path, path, value if isinstance(value, float) or abs(value) < 2**63 else float(value)]
            elif isinstance(value, str):
                where.append("json_type(meta, ?) = 'text' AND json_extract(meta, ?) = ?")
                args += [path, path, value]
            else:
                raise TypeError(f"filter {field!r}: {value!r} is not a string, boolean or number")
        q = "SELECT pos FROM docs" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY pos"
        return [p for (p,) in self.conn.execute(q, args)]

    def delete(self, ids: list[str]) -> dict[str, int]:
        """Remove documents by id; returns id → the position each one had (absent ids are skipped)."""
        found = self.positions(ids)
        for chunk in _chunks(list(found), 500):
            self.conn.execute(f"DELETE FROM docs WHERE id IN ({','.join('?' * len(chunk))})", chunk)
        self.conn.commit()
        return found

    def rows(self, batch: int = 10_000):
        """Yield lists of (pos, id, text, metadata, norm) in position order."""
        cur = self.conn.execute("SELECT pos, id, text, meta, norm FROM docs ORDER BY pos")
        while rows := cur.fetchmany(batch):
            yield [(p, i, t, json.loads(m), n) for p, i, t, m, n in rows]

    def live_positions(self) -> list[int]:
        return [p for (p,) in self.conn.execute("SELECT pos FROM docs ORDER BY pos")]

    def metadata_fields(self) -> list[str]:
        """Sorted union of metadata keys over all documents."""
        q = "SELECT DISTINCT j.key FROM docs, json_each(docs.meta) AS j ORDER BY j.key"
        return [k for (k,) in self.conn.execute(q)]

    def count(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM docs").fetchone()[0]

    def close(self) -> None:
        self.conn.close()


def _chunks(xs: list, n: int):
    for i in range(0, len(xs), n):
        yield xs[i:i + n]
