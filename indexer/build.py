"""Write a new generation's data files from a stream of document blocks.

Used by the index pipeline (a fresh build), by mutations (append, compact) and by the scale
benchmark. Blocks go straight to ``vectors.npy`` (written with file writes, so the rows never sit
in this process's resident set: indexer/rowfile.py) and to the docstore; FAISS is then built from
the file, block by block. Peak memory is therefore the
FAISS index itself plus one block, one training sample and the tuning buffers, not the corpus:
see docs/indexes.md for the numbers.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import faults
from . import lexical, locking, mining, rowfile, store
from .docstore import DocStore
from .faiss_index import FaissSpec, write_faiss
from .rowfile import unit_rows
from .gpu import GpuFacts
from .manifest import NO_BUNDLE, Counts, Fields, Manifest


@dataclass(frozen=True)
class Block:
    """Documents in position order and their raw pooled vectors h (m, d) float32."""

    docs: list[dict]  # {"id", "text", "metadata"}
    vectors: np.ndarray  # the first text field's; zero rows for documents without it (several text fields)
    fields: tuple[np.ndarray, ...] = ()  # raw vectors (m, d) of text fields 1… (indexer/text_fields.py), zero rows where absent


def write_rows(vectors_out, docstore: DocStore, blocks: Iterable[Block],
               first_position: int = 0, field_rows=None) -> tuple[int, set]:
    """Write blocks into rows 0… of ``vectors_out`` (an (n, d) array or memory map, or a
    :class:`~relsearch.indexer.rowfile.NpyWriter`) and into ``docstore`` at positions
    ``first_position``… (a segment's rows are local, its docstore positions global); returns
    (rows written, metadata field names seen). ``field_rows``: a
    :class:`~relsearch.indexer.text_fields.FieldRows` taking the blocks' other text fields."""
    row, fields = 0, set()
    for block in blocks:
        if not block.docs:
            continue
        unit, norms = unit_rows(block.vectors)
        if row + len(unit) > len(vectors_out):
            raise RuntimeError(f"expected {len(vectors_out)} documents, the blocks held more")
        vectors_out[row:row + len(unit)] = unit
        if field_rows is not None:
            field_rows.add(row, norms, block.fields)
        docstore.add((first_position + row + i, d["id"], d["text"], d["metadata"], n)
                     for i, (d, n) in enumerate(zip(block.docs, norms)))
        for d in block.docs:
            fields.update(d["metadata"])
        row += len(unit)
    return row, fields


def open_memmap(path: Path, n: int, d: int) -> np.ndarray:
    """A writable (n, d) float32 ``.npy`` memory map whose disk space is reserved up front: on a full
    disk this is an OSError, not a SIGBUS at the first write into a hole of a sparse file."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, d))
    with open(path, "r+b") as f:
        os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)
    return out


def open_vectors(gen: Path, n: int, d: int) -> np.ndarray:
    """A writable (n, d) float32 ``vectors.npy`` memory map in ``gen``."""
    return open_memmap(gen / store.VECTORS_FILE, n, d)


def projection_key(P: np.ndarray) -> str:
    """Identifies a projection's weights, so a stored projected index is only used with the same P."""
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(P, dtype=np.float32).tobytes()).hexdigest()[:16]


def write_projections(gen: Path, vectors: np.ndarray, projections: dict[str, np.ndarray], *,
                      block: int = 65536) -> dict:
    """``projection-<i>.npy`` = normalize(t̂ Pᵀ) for each projection operator (design.md §3: a map on
    both sides needs its own index); returns the manifest's ``projections`` section."""
    out = {}
    for i, (name, P) in enumerate(sorted(projections.items())):
        fname = f"projection-{i}.npy"
        proj = open_memmap(gen / fname, len(vectors), P.shape[0])
        for start in range(0, len(vectors), block):
            rows = np.asarray(vectors[start:start + block], dtype=np.float32) @ P.T
            proj[start:start + block] = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        proj.flush()
        del proj
        out[name] = {"file": fname, "key": projection_key(P)}
    return out


def write_lexical(gen: Path, prefix: str = "") -> None:
    """``{prefix}bm25.npz`` over the texts of the segment's docstore (indexer/lexical.py), read back in
    position order: the BM25 half of hybrid search, written with every segment."""
    docstore = DocStore(str(gen / f"{prefix}{store.DOCSTORE_FILE}"))
    try:
        positions, texts = docstore.texts()
    finally:
        docstore.close()
    lexical.write(gen / f"{prefix}{lexical.FILE}", positions, texts)


@dataclass(frozen=True)
class Written:
    """What :func:`write_generation` wrote, for the manifest."""

    counts: Counts
    faiss: dict  # the manifest's faiss section
    metadata_fields: tuple[str, ...]
    dim: int
    field_faiss: dict | None = None  # text field name → its faiss section (fields 1… of several)


def write_generation(gen: Path, blocks: Iterable[Block], *, n: int, d: int, spec: FaissSpec = FaissSpec(),
                     facts: GpuFacts | None = None, bm25: bool = True, text_fields: tuple[str, ...] = ()) -> Written:
    """``vectors.npy`` + ``docstore.sqlite`` + ``index.faiss`` (+ ``bm25.npz`` unless ``bm25`` is
    False) for exactly ``n`` documents; with two or more ``text_fields`` (names, in order) each
    field's files too (indexer/text_fields.py)."""
    from . import text_fields as tf
    from .segments import SegmentSpec

    first = SegmentSpec("", 0, n)
    out = rowfile.NpyWriter(gen / store.VECTORS_FILE, n, d)
    field_rows = tf.FieldRows(gen, first, len(text_fields), d) if len(text_fields) > 1 else None
    docstore = DocStore(str(gen / store.DOCSTORE_FILE), create=True)
    try:
        written, fields = write_rows(out, docstore, blocks, field_rows=field_rows)
    finally:
        docstore.close()
        out.close()
        if field_rows is not None:
            field_rows.close()
    if written != n:
        raise RuntimeError(f"expected {n} documents, the blocks held {written}")
    faults.point("build.rows-written")
    vectors = np.load(gen / store.VECTORS_FILE, mmap_mode="r", allow_pickle=False)
    info = write_faiss(gen, vectors, spec, facts)
    field_faiss = None
    if field_rows is not None:
        built = tf.write_indexes(gen, first, len(text_fields), tuned=spec, facts=facts)
        field_faiss = {text_fields[i]: section for i, section in built.items()}
    if bm25 and field_rows is not None:
        tf.write_lexical(gen, first, tuple(text_fields))
    elif bm25:
        write_lexical(gen)
    return Written(Counts(n, n), info, tuple(sorted(fields)), d, field_faiss)


def build_published(target: str, blocks: Iterable[Block], *, n: int, d: int, encoder: dict,
                    bundle: dict | None = None, spec: FaissSpec = FaissSpec(), fields: dict | None = None,
                    run: dict | None = None, mirrors=(), facts: GpuFacts | None = None, bm25: bool = True) -> Manifest:
    """Build and publish an index at ``target`` from precomputed vectors (no Beam, no encoding).

    ``encoder``: the identity of the encoder that produced the vectors (``Encoder.identity``:
    model, weights_sha256, pooling, ...), checked by queries; ``bundle``: the manifest's bundle
    entry; ``fields``: the id and text field names. Returns the manifest written.
    """

    def fill(gen: Path) -> Manifest:
        (gen / store.REJECTED_FILE).write_text("")
        parts = write_generation(gen, blocks, n=n, d=d, spec=spec, facts=facts, bm25=bm25)
        manifest = Manifest(encoder=encoder, dim=d, counts=parts.counts, faiss=parts.faiss,
                            fields=Fields(**(fields or {}), metadata=parts.metadata_fields),
                            bundle=bundle or dict(NO_BUNDLE),
                            runs=({"op": "build", "read": n, "indexed": n, "rejected": 0, **(run or {}),
                                   "at": store.utc_now()},))
        mining.write(gen, manifest)
        return manifest

    with locking.writer_lock(target):
        return store.publish_new(target, fill, mirrors)
