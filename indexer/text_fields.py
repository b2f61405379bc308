"""Documents with several named texts: where each text's vectors, FAISS index and BM25 lists live.

An index of one text field is stored as it always was. An index built with several
(``relsearch index C --text-field text --text-field text_wikipedia``; the manifest's
``fields.texts`` lists them in that order) keeps, per segment ``P`` (indexer/segments.py):

- field 0 in the segment's classic files (``P vectors.npy``, ``P index.faiss``, ``P bm25.npz``),
  so every reader of an index of one text reads it unchanged;
- field ``i`` ≥ 1 in the same files under the field tag ``t<i>-``: ``P t<i>-vectors.npy``,
  ``P t<i>-index.faiss``, ``P t<i>-bm25.npz`` (the first segment's trained IVF form as
  ``t<i>-trained.faiss``; its tuned parameters in the manifest's ``field_faiss``);
- ``P textnorms.npy``: (positions, F) float32, ‖h‖ of each document's text of each field, 0 where
  the document lacks that text. A lacking text's vector row is all zeros; searches of that field
  exclude the document (indexer/field_view.py), and its BM25 lists never hold it.

A field's files are a segment's files under another prefix, so appends, merges, deletes
(``deleted.npy`` covers every field), compaction, snapshots and checksums treat them as they treat
any segment file: one generation, published atomically.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from . import lexical, rowfile
from .docstore import DocStore
from .faiss_index import save_faiss, write_faiss
from .rowfile import unit_rows
from .segments import DOCSTORE, FAISS, TRAINED_FILE, VECTORS, SegmentSpec, segment_index

NORMS_FILE = "textnorms.npy"


def tag(i: int) -> str:
    """The file-name tag of text field ``i`` (0: none, the classic files)."""
    return "" if i == 0 else f"t{i}-"


def field_spec(spec: SegmentSpec, i: int) -> SegmentSpec:
    """Segment ``spec`` as the files of its text field ``i``: same positions, the field's prefix."""
    return spec if i == 0 else SegmentSpec(spec.prefix + tag(i), spec.start, spec.positions)


def names_of(manifest) -> tuple[str, ...]:
    """The index's text fields in order: ``fields.texts``, or the one ``fields.text``."""
    return tuple(manifest.fields.texts) or (manifest.fields.text,)


def segment_files(spec: SegmentSpec, count: int, *, bm25: bool = True) -> tuple[str, ...]:
    """The files fields 1… of segment ``spec`` add to it (none for an index of one text)."""
    if count < 2:
        return ()
    out = [spec.file(NORMS_FILE)]
    for i in range(1, count):
        fs = field_spec(spec, i)
        out += [fs.file(VECTORS), fs.file(FAISS)] + ([fs.file(lexical.FILE)] if bm25 else [])
    return tuple(out)


class FieldRows:
    """Writes one segment's rows of fields 1… (unit vectors) and every field's norms, block by
    block beside the classic rows (indexer/build.py ``write_rows``)."""

    def __init__(self, gen: Path, spec: SegmentSpec, count: int, d: int):
        self.gen, self.spec = gen, spec
        self.outs = [rowfile.NpyWriter(gen / field_spec(spec, i).file(VECTORS), spec.positions, d)
                     for i in range(1, count)]
        self.norms = np.zeros((spec.positions, count), np.float32)

    def add(self, row: int, norms0: np.ndarray, fields: tuple[np.ndarray, ...]) -> None:
        """Rows ``row…`` : field 0's norms ``norms0`` (m,) and fields 1…'s raw vectors (m, d) each."""
        if len(fields) != len(self.outs):
            raise ValueError(f"a block holds {len(fields)} extra text fields, the index has {len(self.outs)}")
        self.norms[row:row + len(norms0), 0] = norms0
        for i, (out, raw) in enumerate(zip(self.outs, fields), 1):
            unit, norms = unit_rows(raw)
            out[row:row + len(unit)] = unit
            self.norms[row:row + len(unit), i] = norms

    def close(self) -> None:
        for out in self.outs:
            out.close()
        np.save(self.gen / self.spec.file(NORMS_FILE), self.norms)


def copy_rows(gen: Path, spec: SegmentSpec, count: int, d: int, parts) -> None:
    """Write segment ``spec``'s field files 1… and norms from ``parts``: (row in spec, field vectors
    list [i] → (m, d) unit rows, norms (m, count)) tuples: what a merge or a compaction copies."""
    outs = [np.lib.format.open_memmap(gen / field_spec(spec, i).file(VECTORS), mode="w+", dtype=np.float32,
                                      shape=(spec.positions, d)) for i in range(1, count)]
    norms = np.zeros((spec.positions, count), np.float32)
    for row, vectors, part_norms in parts:
        m = len(part_norms)
        norms[row:row + m] = part_norms
        for out, rows in zip(outs, vectors):
            out[row:row + m] = rows
    for out in outs:
        out.flush()
    del outs
    np.save(gen / spec.file(NORMS_FILE), norms)


def write_indexes(gen: Path, spec: SegmentSpec, count: int, *, tuned=None, facts=None) -> dict:
    """FAISS of fields 1… of segment ``spec``: trained and tuned as a first segment is when ``tuned``
    (a FaissSpec) is given, returning ``{i: the faiss section}``; else filled into the trained
    empty form of each field (``t<i>-trained.faiss``) as an appended segment's is."""
    info = {}
    for i in range(1, count):
        fs = field_spec(spec, i)
        vectors = np.load(gen / fs.file(VECTORS), mmap_mode="r", allow_pickle=False)
        if tuned is not None:
            info[i] = write_faiss(gen, vectors, dataclasses.replace(tuned, fill=None), facts, prefix=tag(i))
        else:
            save_faiss(segment_index(vectors, gen / (tag(i) + TRAINED_FILE)), gen / fs.file(FAISS))
    return info


def write_lexical(gen: Path, spec: SegmentSpec, names: tuple[str, ...]) -> None:
    """Each field's ``bm25.npz`` for segment ``spec``, over the texts its documents have of that
    field: field 0's from the docstore's text, field i's from the metadata field of its name."""
    norms = np.load(gen / spec.file(NORMS_FILE), allow_pickle=False)
    docstore = DocStore(str(gen / spec.file(DOCSTORE)))
    try:
        rows = [(pos, text, meta) for batch in docstore.rows() for pos, _, text, meta, _ in batch]
    finally:
        docstore.close()
    for i, name in enumerate(names):
        kept = [(pos, text if i == 0 else meta.get(name)) for pos, text, meta in rows
                if norms[pos - spec.start, i] > 0]
        lexical.write(gen / field_spec(spec, i).file(lexical.FILE),
                      np.asarray([p for p, _ in kept], np.int64), [t for _, t in kept])
