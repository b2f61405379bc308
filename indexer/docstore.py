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
    def __init__(self, path: str, *, create: bool = False):
        if create:
            self.conn = sqlite3.connect(path)
            self.conn.executescript(SCHEMA)
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
        """pos → {"id", "text", "norm", "metadata"} for the given positions."""
        out = {}
        for chunk in _chunks([int(p) for p in positions], 500):
            q = f"SELECT pos, id, text, meta, norm FROM docs WHERE pos IN ({','.join('?' * len(chunk))})"
            for pos, doc_id, text, meta, norm in self.conn.execute(q, chunk):
                out[pos] = {"id": doc_id, "text": text, "norm": norm, "metadata": json.loads(meta)}
        return out

    def matching(self, filters: dict[str, str]) -> list[int]:
        """Positions whose metadata equals every filter value (string or JSON-literal match)."""
        where, args = [], []
        for field, value in filters.items():
            path = '$."' + field.replace('"', '""') + '"'
            alternatives = [value]
            try:
                literal = json.loads(value)
                if not isinstance(literal, (dict, list)) and literal != value:
                    alternatives.append(literal)
            except ValueError:
                pass
            where.append(f"json_extract(meta, ?) IN ({','.join('?' * len(alternatives))})")
            args += [path, *alternatives]
        q = "SELECT pos FROM docs" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY pos"
        return [p for (p,) in self.conn.execute(q, args)]

    def count(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM docs").fetchone()[0]

    def close(self) -> None:
        self.conn.close()


def _chunks(xs: list, n: int):
    for i in range(0, len(xs), n):
        yield xs[i:i + n]
