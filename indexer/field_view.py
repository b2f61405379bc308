"""One text field of an index of several, read as if it were the index (indexer/text_fields.py).

:func:`field_view` gives an :class:`~.reader.IndexFiles` whose segments are the field's files
(vectors, FAISS, BM25) and whose dead positions are the deleted ones plus those of documents
lacking that text, so every search path — FAISS with its selector, exact filtered search, BM25,
recipes, collapse — runs on it unchanged and never returns a document for a text it does not
have. Its docstore answers with the field's text as each document's ``text`` (what a hit shows
and highlights mark), and an ``--id`` query of a document lacking the field starts from the
mean of the raw vectors of the texts it has, so every document can ask every field.
"""
from __future__ import annotations

import json

import numpy as np

from . import segments as seg
from .docstore import DocRows
from .reader import IndexFiles


class FieldDocuments:
    """The generation's docstore (:class:`~.segments.Documents`) as field ``i``'s searches read it."""

    def __init__(self, docs: seg.Documents, i: int, name: str, norms: np.ndarray):
        self._docs, self.i, self.name, self._norms = docs, i, name, norms
        self._present = norms[:, i] > 0

    def __getattr__(self, attr):  # everything else is the generation's docstore's
        return getattr(self._docs, attr)

    def norms(self, positions) -> np.ndarray:
        return self._norms[np.asarray(positions, np.int64), self.i].astype(np.float64)

    def matching(self, filters) -> list[int]:
        found = np.asarray(self._docs.matching(filters), np.int64)
        return found[self._present[found]].tolist() if len(found) else []

    def _text(self, text: str, meta) -> str:
        if self.i == 0:  # the docstore's text is field 0's wherever the document has it
            return text
        value = (json.loads(meta) if isinstance(meta, str) else meta).get(self.name)
        return value if isinstance(value, str) and value.strip() else text

    def read(self, positions) -> DocRows:
        rows = self._docs.read(positions)
        return rows if self.i == 0 else DocRows([(d, self._text(t, m), m) for d, t, m in rows.rows])

    def read_at(self, positions) -> tuple[DocRows, np.ndarray]:
        rows, slots = self._docs.read_at(positions)
        if self.i == 0:
            return rows, slots
        # only the rows hit: a docstore held in memory answers with all of its rows
        used, inverse = np.unique(slots[slots >= 0], return_inverse=True)
        out = np.full(slots.shape, -1, np.int64)
        out[slots >= 0] = inverse
        return DocRows([(d, self._text(t, m), m) for d, t, m in (rows.rows[j] for j in used.tolist())]), out

    def get(self, positions) -> dict[int, dict]:
        docs = self._docs.get(positions)
        for pos, doc in docs.items():
            doc["text"] = self._text(doc["text"], doc["metadata"])
            doc["norm"] = float(self._norms[pos, self.i])  # this field's ‖h‖ (the docstore holds field 0's)
        return docs


class FieldFiles(IndexFiles):
    """An opened generation as field ``i`` alone: see the module docstring."""

    field_index: int = 0
    parent: IndexFiles | None = None

    @property
    def deleted_rows_in_faiss(self) -> bool:
        return True  # documents lacking this text are zero rows in its FAISS index: always select

    def raw_rows(self, positions) -> np.ndarray:
        """Raw vectors of field ``i`` at ``positions``; a document lacking it: the mean of the raw
        vectors of the texts it has (so an ``--id`` query of any document searches every field)."""
        positions = np.asarray(positions, np.int64)
        norms = all_norms(self.parent)[positions]
        out = vectors_of(self.parent, self.field_index)[positions] * norms[:, self.field_index, None]
        lacking = np.flatnonzero(norms[:, self.field_index] == 0)
        if len(lacking):
            mean = np.zeros((len(lacking), out.shape[1]), np.float32)
            for j in range(norms.shape[1]):
                mean += vectors_of(self.parent, j)[positions[lacking]] * norms[lacking, j, None]
            out[lacking] = mean / np.maximum((norms[lacking] > 0).sum(axis=1), 1)[:, None]
        return out.astype(np.float32)


def all_norms(files: IndexFiles) -> np.ndarray:
    """(positions, F) norms of every document's text of every field (0: lacking), all segments."""
    cached = files.__dict__.get("_text_norms")
    if cached is None:
        cached = np.concatenate([np.asarray(s.text_norms) for s in files.segments])
        files.__dict__["_text_norms"] = cached
    return cached


def vectors_of(files: IndexFiles, i: int):
    """Field ``i``'s unit vectors of every position, read as one array (segments.Vectors)."""
    parts = [s.fields[i].vectors for s in files.segments]
    return parts[0] if len(parts) == 1 else seg.Vectors(parts, [s.start for s in files.segments])


def field_view(files: IndexFiles, name: str) -> IndexFiles:
    """``files`` as its text field ``name`` alone (the same object for an index of one text);
    KeyError naming the index's text fields for another name."""
    names = files.text_fields
    if name not in names:
        raise KeyError(f"unknown text field {name!r}; this index's text fields: {', '.join(names)}")
    if len(names) == 1:
        return files
    views = files.__dict__.setdefault("_field_views", {})
    if name not in views:
        i = names.index(name)
        norms = all_norms(files)
        lacking = np.flatnonzero(norms[:, i] == 0)
        view = FieldFiles(files.root, files.manifest, [s.fields[i] for s in files.segments],
                          np.union1d(files.deleted, lacking).astype(np.int64))
        view.docstore = FieldDocuments(files.docstore, i, name, norms)
        view.field_index, view.parent = i, files
        views[name] = view
    return views[name]
