"""A published index opened for reading: one consistent generation, verified, kept open.

:func:`open_index` reads the generation ``DIR/current`` names (indexer/store.py), checks every
file it will open against the manifest (sizes and sha256, indexer/integrity.py) and opens them:
each segment's vectors (memory-mapped), docstore, FAISS and BM25 files (the latter two by
descriptor, loaded on first use). A damaged file is a clear error naming it; every file opened is
a regular file of the generation listed in the manifest, never a symlink. A reader holds every
file of its generation open, so it keeps answering even after a later publish removes that
generation's folder; a writer does not remove a generation while a reader holds a shared lock on
its manifest, the moment it opens it.
"""
from __future__ import annotations

import fcntl
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import integrity, lexical, migration
from . import segments as seg
from . import text_fields as tf
from .docstore import DocStore
from .integrity import IndexCorruptError
from .manifest import FILE as MANIFEST
from .manifest import Manifest
from .manifest import parse as parse_manifest
from .store import CURRENT, DELETED_FILE, FAISS_FILE, current_generation, index_dir


def check_faiss_header(path, name, *, dim: int, most: int) -> None:
    """Refuse (IndexCorruptError) a FAISS file whose header claims another dimension, or more vectors
    than its segment has positions, before FAISS reads it: FAISS sizes its buffers from those
    claims, so a crafted file (even one whose checksum was recomputed) could make it allocate
    terabytes. Every FAISS index type relsearch writes starts with a fourcc, d (int32) and
    ntotal (int64)."""
    with open(path, "rb") as f:
        head = f.read(16)
    if len(head) < 16 or not head[:1] == b"I":
        raise IndexCorruptError(f"{name} is not a FAISS index file this version writes")
    d, ntotal = int.from_bytes(head[4:8], "little", signed=True), int.from_bytes(head[8:16], "little", signed=True)
    if d != dim or not 0 <= ntotal <= most:
        raise IndexCorruptError(f"{name} claims {ntotal:,} vectors of {d} dimensions; its segment has {most:,} "
                                f"positions of {dim}: the index is damaged")


class Segment:
    """One segment of an opened generation (indexer/segments.py): its vectors and docstore, and
    its FAISS index loaded on first use from a descriptor opened with the rest."""

    def __init__(self, spec: seg.SegmentSpec, root: Path, vectors: np.ndarray, docstore: DocStore, faiss_fd: int,
                 bm25_fd: int | None = None):
        self.spec, self.root, self.vectors, self.docstore = spec, root, vectors, docstore
        self._faiss_fd: int | None = faiss_fd
        self._faiss = None
        self._bm25_fd, self._bm25 = bm25_fd, None
        # several text fields (indexer/text_fields.py): this segment as each field's files (fields[0]
        # is itself) and each document's norm per field, 0 where it lacks that text
        self.fields: list[Segment] = [self]
        self.text_norms: np.ndarray | None = None

    @property
    def bm25(self) -> lexical.LexicalSegment | None:
        """The segment's BM25 lists (indexer/lexical.py), loaded on first use; None if it has none."""
        if self._bm25 is None and self._bm25_fd is not None:
            with os.fdopen(self._bm25_fd, "rb") as f:
                self._bm25_fd = None
                self._bm25 = lexical.LexicalSegment.load(f)
        return self._bm25

    @property
    def start(self) -> int:
        return self.spec.start

    @property
    def faiss(self):
        if self._faiss is None:
            import faiss

            name = self.root / self.spec.file(FAISS_FILE)
            path = str(name)
            if self._faiss_fd is not None and os.path.exists(f"/proc/self/fd/{self._faiss_fd}"):
                path = f"/proc/self/fd/{self._faiss_fd}"  # the generation may be gone by now
            try:
                check_faiss_header(path, name, dim=self.vectors.shape[1], most=self.spec.positions)
                self._faiss = faiss.read_index(path)
            except (RuntimeError, MemoryError) as e:
                raise IndexCorruptError(f"{name} cannot be read by FAISS: "
                                        f"{str(e).strip().splitlines()[-1][:200]}") from None
            finally:
                if self._faiss_fd is not None:
                    os.close(self._faiss_fd)
                    self._faiss_fd = None
        return self._faiss

    def close_faiss_fd(self) -> None:
        """Close the descriptors still held for lazy loading (the FAISS and BM25 files), every text field's."""
        for part in self.fields:
            for name in ("_faiss_fd", "_bm25_fd"):
                if getattr(part, name) is not None:
                    os.close(getattr(part, name))
                    setattr(part, name, None)


@dataclass
class IndexFiles:
    """A published index opened for reading (one consistent generation)."""

    root: Path
    manifest: Manifest
    segments: list[Segment]
    deleted: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # sorted dead positions
    _live = None

    def __post_init__(self):
        parts = [s.vectors for s in self.segments]
        # one segment: the memory map itself, so single-segment reads cost what they always did
        self.vectors = parts[0] if len(parts) == 1 else seg.Vectors(parts, [s.start for s in self.segments])
        self.docstore = seg.Documents([s.docstore for s in self.segments], self.deleted, self.positions,
                                      [s.start for s in self.segments])

    @property
    def faiss(self):
        """The first segment's FAISS index (the trained, tuned one), loaded on first use."""
        return self.segments[0].faiss

    def close_faiss_fd(self) -> None:
        for s in self.segments:
            s.close_faiss_fd()

    @property
    def positions(self) -> int:
        """Rows of vectors.npy (live and deleted)."""
        return int(sum(len(s.vectors) for s in self.segments))

    @property
    def text_fields(self) -> tuple[str, ...]:
        """The index's named text fields, in order (one for an index of one text)."""
        return tf.names_of(self.manifest)

    def raw_rows(self, positions: np.ndarray) -> np.ndarray:
        """(m, d) raw vectors h = t̂·‖h‖ of the documents at ``positions``: what an ``--id`` query starts from."""
        rows = np.asarray(self.vectors[positions], np.float32)  # indexing by an array copies: scaled in place
        rows *= self.docstore.norms(positions).astype(np.float32)[:, None]
        return rows

    def live(self):
        """An :class:`~relsearch.indexer.ann.Selection` of live positions, or None when all are live."""
        if not len(self.deleted):
            return None
        if self._live is None:
            from .ann import Selection

            mask = np.ones(self.positions, dtype=bool)
            mask[self.deleted] = False
            self._live = Selection(mask, use_selector=self.deleted_rows_in_faiss)
        return self._live

    @property
    def deleted_rows_in_faiss(self) -> bool:
        """Whether FAISS still holds rows of non-live positions (tombstones), so a search must select."""
        return self.manifest.counts.tombstones > 0


def open_index(path: str | os.PathLike) -> IndexFiles:
    """Open the generation ``path`` publishes now (``path/current``; or the generation an index of
    the old layout links to; or ``path`` itself when it is a generation folder), after checking its
    files against the manifest; later publishes do not affect this reader."""
    path = index_dir(path)
    for attempt in range(5):
        root = _pointed(path)
        try:
            return _open(path, root)
        except (OSError, IndexCorruptError, sqlite3.Error):
            # a writer may have published and removed this generation between reading the pointer and
            # opening it (or be migrating an old-layout index): then the pointer names another one now
            if attempt < 4 and _pointed(path) != root:
                continue
            if attempt < 4 and (root is None or not root.is_dir()) and migration.in_progress(path.absolute()):
                time.sleep(0.01 * (attempt + 1))
                continue
            raise
    raise AssertionError("unreachable")


def _pointed(path: Path) -> Path | None:
    try:
        return current_generation(path)
    except (OSError, IndexCorruptError):
        return None


def _open(path: Path, root: Path | None) -> IndexFiles:
    if root is None:
        root = current_generation(path)  # raises for a damaged pointer
    if root is None or not os.path.lexists(root):
        if root is not None and os.path.lexists(path / CURRENT):
            raise IndexCorruptError(f"{path / CURRENT} names generation {root.name}, which is missing from "
                                    f"{root.parent}; the index is damaged (`relsearch rollback --index {path}` "
                                    "publishes a retained one)")
        raise FileNotFoundError(f"no index at {path}; build one with `relsearch index CORPUS.jsonl --index {path}`")
    manifest_path = root / MANIFEST
    if not os.path.lexists(manifest_path):
        raise FileNotFoundError(f"{path} is not a relsearch index (no {MANIFEST})")
    with os.fdopen(integrity.open_regular(manifest_path), "rb") as guard:
        fcntl.flock(guard, fcntl.LOCK_SH)  # writers do not remove a generation while a reader opens it
        return _open_locked(root, parse_manifest(guard.read(), manifest_path))


def _segment_specs(root: Path, manifest: Manifest) -> list[seg.SegmentSpec]:
    specs = manifest.segment_specs
    problem = seg.check_specs(specs, manifest.counts.positions)
    if problem:
        raise IndexCorruptError(f"{root / MANIFEST}: {problem}; the index is damaged")
    return specs


def _open_locked(root: Path, manifest: Manifest) -> IndexFiles:
    verify_generation(root, manifest)
    return open_generation(root, manifest)


def verify_generation(root: Path, manifest: Manifest) -> None:
    """Check every file of generation ``root`` against ``manifest`` (IndexCorruptError naming the first
    that is damaged, missing or not the generation's own)."""
    specs = _segment_specs(root, manifest)
    count = len(tf.names_of(manifest))
    bm25 = lexical.FILE in manifest.files
    integrity.verify(root, manifest.files, required=tuple(name for s in specs
                                                          for name in s.files() + tf.segment_files(s, count, bm25=bm25)))
    # verify() checked every listed file; any other a reader opens must be listed too, so that none is
    # read through a symlink or from outside the generation
    for name in manifest.projection_files + ([DELETED_FILE] if os.path.lexists(root / DELETED_FILE) else []):
        if not (isinstance(name, str) and name in manifest.files):
            raise IndexCorruptError(f"{root / MANIFEST} does not list {name!r}, a file the index opens; "
                                    "the index is damaged")


def open_generation(root: Path, manifest: Manifest) -> IndexFiles:
    """Open the data files of generation ``root`` as ``manifest`` describes them, without checking
    them: :func:`open_index` verifies first; a writer opens its own unpublished generation."""
    specs = _segment_specs(root, manifest)
    positions = manifest.counts.positions
    deleted = np.zeros(0, np.int64)
    if os.path.lexists(root / DELETED_FILE):
        deleted = np.asarray(_load_npy(root / DELETED_FILE), np.int64)
        if deleted.ndim != 1 or (len(deleted) and (deleted.min() < 0 or deleted.max() >= positions)):
            raise IndexCorruptError(f"{root / DELETED_FILE} holds positions outside the index")
    opened: list[Segment] = []
    try:
        for spec in specs:
            opened.append(_open_segment(root, spec, manifest.dim, spec.file(lexical.FILE) in manifest.files,
                                        len(tf.names_of(manifest))))
    except BaseException:
        for s in opened:
            s.docstore.close()
            s.close_faiss_fd()
        raise
    return IndexFiles(root, manifest, opened, deleted)


def _open_segment(root: Path, spec: seg.SegmentSpec, dim: int, bm25: bool, text_fields: int = 1) -> Segment:
    vectors_name, docstore_name, faiss_name = spec.files()
    vectors = _segment_vectors(root / vectors_name, spec, dim)
    try:
        docstore = DocStore(str(root / docstore_name))
        docstore.conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()  # binds the file now, and checks it
    except sqlite3.DatabaseError as e:
        raise IndexCorruptError(f"{root / docstore_name} cannot be read as SQLite ({e})") from None
    segment = Segment(spec, root, vectors, docstore, integrity.open_regular(root / faiss_name),
                      integrity.open_regular(root / spec.file(lexical.FILE)) if bm25 else None)
    if text_fields > 1:  # indexer/text_fields.py: each further field's files, under its tag
        try:
            norms = _load_npy(root / spec.file(tf.NORMS_FILE), mmap_mode="r")
            if norms.dtype != np.float32 or norms.shape != (spec.positions, text_fields):
                raise IndexCorruptError(f"{root / spec.file(tf.NORMS_FILE)} holds {norms.dtype} {norms.shape}, the "
                                        f"manifest says float32 ({spec.positions}, {text_fields})")
            segment.text_norms = norms
            for i in range(1, text_fields):
                fs = tf.field_spec(spec, i)
                segment.fields.append(Segment(
                    fs, root, _segment_vectors(root / fs.file(seg.VECTORS), spec, dim), docstore,
                    integrity.open_regular(root / fs.file(FAISS_FILE)),
                    integrity.open_regular(root / fs.file(lexical.FILE)) if bm25 else None))
        except BaseException:
            segment.close_faiss_fd()
            docstore.close()
            raise
    return segment


def _segment_vectors(path: Path, spec: seg.SegmentSpec, dim: int) -> np.ndarray:
    vectors = _load_npy(path, mmap_mode="r")
    if vectors.dtype != np.float32 or vectors.ndim != 2 or vectors.shape != (spec.positions, dim or vectors.shape[1]):
        raise IndexCorruptError(f"{path} holds {vectors.dtype} {vectors.shape}, the manifest says "
                                f"float32 ({spec.positions}, {dim})")
    return vectors


def _load_npy(path: Path, **kw) -> np.ndarray:
    """np.load without pickles: an object array in an index is damage or an attack, never data."""
    try:
        return np.load(path, allow_pickle=False, **kw)
    except ValueError as e:
        raise IndexCorruptError(f"{path} is not a plain numeric .npy file ({e})") from None
