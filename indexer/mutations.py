"""Append, delete and compact a published index, each as one new generation published atomically.

A reader holds one generation; a mutation hard-links the files that do not change into a new
generation, writes what does, and publishes it with the same symlink swap as a build
(indexer/store.py), under the index's writer lock. A generation is a list of immutable segments
(indexer/segments.py). Positions are never reused: an appended document takes the next free
position; a replaced or deleted document's position goes into ``deleted.npy``, and every search
excludes it (a tombstone) until ``compact`` rebuilds.

Cost per mutation (N = documents, n = documents touched), see docs/indexes.md:

- append: writes one new segment for the n documents (vectors, a FAISS index filled without
  training, docstore rows), O(n); when more than ``max_segments`` segments result, the smallest run of neighbouring
  appended segments is merged into one, O(size merged);
- delete: rewrites ``deleted.npy`` only, O(deleted);
- compact: a full rebuild of the live documents into one segment (training and tuning included).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import faults
from . import segments as seg
from . import locking, mining, reader, store
from . import text_fields as tf
from .build import Block, open_memmap, open_vectors, write_lexical, write_rows
from .faiss_index import save_faiss, write_faiss
from .docstore import DocStore
from .faiss_index import FaissSpec
from .gpu import GpuFacts
from .lexical import FILE as LEXICAL_FILE
from .manifest import Counts, Manifest
from .tuning import AutoPolicy

MAX_RUNS_KEPT = 100
UNKNOWN_ID = "unknown-id"
ENCODER_KEY = ("weights_sha256", "pooling")  # what makes two encoders' vectors comparable


class EncoderMismatchError(ValueError):
    """Vectors from another encoder than the index's: refused, under the writer lock, by every writer."""


def check_encoder(target, have: dict, encoder: dict) -> None:
    """Raise EncoderMismatchError unless ``encoder`` (the identity of the model that encoded the new
    documents) is the one the index (manifest ``encoder``: ``have``) was built with."""
    if tuple(have.get(k) for k in ENCODER_KEY) != tuple(encoder.get(k) for k in ENCODER_KEY):
        raise EncoderMismatchError(
            f"{target} was built with encoder {have.get('model')!r} (weights {have.get('weights_sha256')}, "
            f"pooling {have.get('pooling')}) but these documents were encoded with {encoder.get('model')!r} "
            f"(weights {encoder.get('weights_sha256')}, pooling {encoder.get('pooling')}); append with the "
            "index's model or rebuild the index")


@dataclass
class MutationReport:
    op: str  # "append" | "delete" | "compact"
    index: str
    documents: int = 0  # live documents after the mutation
    positions: int = 0
    tombstones: int = 0
    added: int = 0
    replaced: int = 0
    deleted: int = 0
    not_found: list[str] = field(default_factory=list)
    backends: dict = field(default_factory=dict)
    seconds: float = 0.0
    published: bool = True  # False: nothing changed, so no generation was published (a delete of no live id)

    def summary(self) -> str:
        parts = {"append": f"added {self.added}, replaced {self.replaced}",
                 "delete": f"deleted {self.deleted}, not found {len(self.not_found)}",
                 "compact": f"kept {self.documents}, dropped {self.deleted} dead positions"}[self.op]
        if not self.published:
            return f"{parts}; nothing changed, no new generation published; index holds {self.documents} documents"
        return f"{parts}; index now holds {self.documents} documents ({self.tombstones} tombstones)"


def _mutate(target, work: Callable[[reader.IndexFiles, Path], tuple[Manifest, MutationReport]], mirrors,
            unchanged: Callable[[reader.IndexFiles], MutationReport | None] | None = None) -> MutationReport:
    """Lock, open the current generation, let ``work`` fill a new one, publish it (store.publish_new).
    ``unchanged(src)``: a report when the write would change nothing; then nothing is published
    (the report says so: ``published`` False)."""
    started = time.perf_counter()
    reports: list[MutationReport] = []

    def fill(gen: Path) -> Manifest:
        manifest, report = work(src, gen)
        reports.append(report)
        mining.write(gen, manifest)
        return manifest

    with locking.writer_lock(target, create=False):
        src = reader.open_index(target)
        try:
            if unchanged is not None and (report := unchanged(src)) is not None:
                report.published, report.seconds = False, time.perf_counter() - started
                return report
            written = store.publish_new(target, fill, mirrors, previous=(src.root, src.manifest.files))
        finally:
            src.docstore.close()
            src.close_faiss_fd()
    report = reports[0]
    report.backends, report.seconds = written.backends, time.perf_counter() - started
    return report


def _manifest(src: reader.IndexFiles, *, counts: Counts, run: dict, segments: list[seg.SegmentSpec],
              faiss_info: dict | None = None, fields: Iterable[str] = ()) -> Manifest:
    old = src.manifest
    return old.replace(
        counts=counts, segments=tuple(segments),
        runs=(old.runs + ({**run, "at": store.utc_now()},))[-MAX_RUNS_KEPT:],
        faiss=old.faiss if faiss_info is None else faiss_info,
        fields=dataclasses.replace(old.fields, metadata=tuple(sorted(set(old.fields.metadata) | set(fields)))),
        projections={})  # projected copies (write_projections) are not carried: queries derive them


# written anew by every mutation (or, for projections, derived again by queries): never linked
NOT_CARRIED = {store.MANIFEST, store.REJECTED_FILE, store.DELETED_FILE, store.ES_REJECTED_FILE, mining.FILE}


def _link_unchanged(src: reader.IndexFiles, gen: Path) -> None:
    """Hard-link every data file of ``src`` into ``gen`` (free): segments are immutable."""
    projections = set(src.manifest.projection_files)
    for name in src.manifest.files:
        if name not in NOT_CARRIED and name not in projections:
            store.link_or_copy(src.root / name, gen / name)


def _write_deleted(gen: Path, deleted: np.ndarray) -> None:
    if len(deleted):
        np.save(gen / store.DELETED_FILE, np.unique(np.asarray(deleted, np.int64)))


def _has_lexical(src: reader.IndexFiles) -> bool:
    """Whether the index keeps BM25 lists (built with them); then every new segment gets its own."""
    return f"{src.manifest.segment_specs[0].prefix}{LEXICAL_FILE}" in src.manifest.files


def _write_segment_faiss(gen: Path, spec: seg.SegmentSpec, vectors: np.ndarray) -> None:
    save_faiss(seg.segment_index(vectors, gen / seg.TRAINED_FILE), gen / spec.file(seg.FAISS))


def _noting_replaced(blocks: Iterable[Block], docs: seg.Documents, d: int, replaced: list[int]):
    """``blocks`` as they stream by, checked for dimension; live positions of ids they replace go to ``replaced``."""
    for block in blocks:
        if not block.docs:
            continue
        if block.vectors.shape[1] != d:
            raise ValueError(f"new vectors have {block.vectors.shape[1]} dims, the index has {d}")
        replaced.extend(docs.positions([doc["id"] for doc in block.docs]).values())
        yield block


def append(target: str, blocks: Iterable[Block], *, n: int, run: dict, encoder: dict | None = None, rejected: list[dict] = (),
           mirrors=(), facts: GpuFacts | None = None, max_segments: int | None = None) -> MutationReport:
    """Add ``n`` documents (``blocks``: unique ids among themselves) to the index at ``target`` as
    one new segment; a document whose id is already indexed replaces it (the old position is deleted).

    ``run``: the input's counts for the manifest's ``runs`` history; ``rejected``: the input
    lines refused (written to the new generation's rejected.jsonl). ``max_segments``: the merge
    threshold (default: the index's recorded one, else segments.MAX_SEGMENTS); it is recorded.
    ``encoder``: the identity of the model that encoded ``blocks`` (``Encoder.identity``), checked
    against the generation the append starts from, under the writer lock, so that a rebuild with
    another model published meanwhile is never mixed with these vectors (EncoderMismatchError).
    None skips the check: for vectors whose origin the caller vouches for (synthetic ones in tests
    and benchmarks); every writer of encoded text (API, server, CLI, pipelines) passes it.
    """

    def work(src: reader.IndexFiles, gen: Path):
        if encoder is not None:
            check_encoder(target, src.manifest.encoder, encoder)
        limit = max_segments or src.manifest.max_segments or seg.MAX_SEGMENTS
        specs, d = src.manifest.segment_specs, src.vectors.shape[1]
        names = tf.names_of(src.manifest)
        _link_unchanged(src, gen)
        replaced: list[int] = []
        fields: set = set()
        if n:
            new, fields = _write_segment(src, gen, blocks, n, seg.next_prefix(specs), names, replaced)
            specs = specs + [new]
        faults.point("append.faiss-written")
        deleted = np.unique(np.concatenate([src.deleted, np.asarray(replaced, np.int64)]))
        _write_deleted(gen, deleted)
        specs = _merge(gen, specs, deleted, limit, d, lexical=_has_lexical(src), names=names)
        _write_rejected(src, gen, "append", rejected)
        documents = src.manifest.counts.documents + n - len(replaced)
        tombstones = src.manifest.counts.tombstones + len(replaced)
        counts = Counts(documents, src.positions + n, int(len(deleted)), int(tombstones))
        run_record = {"op": "append", **run, "added": n - len(replaced), "replaced": len(replaced),
                      "segments": len(specs)}
        report = MutationReport("append", str(target), documents=documents, positions=src.positions + n,
                                tombstones=int(tombstones), added=n - len(replaced), replaced=len(replaced))
        manifest = _manifest(src, counts=counts, run=run_record, segments=specs, fields=fields)
        return manifest.replace(max_segments=int(limit)), report

    return _mutate(target, work, mirrors)


def _write_segment(src: reader.IndexFiles, gen: Path, blocks: Iterable[Block], n: int, prefix: str,
                   names: tuple[str, ...], replaced: list[int]) -> tuple[seg.SegmentSpec, set]:
    """Write the ``n`` documents of ``blocks`` into generation ``gen`` as a new segment named
    ``prefix`` (vectors, docstore, FAISS, per-field indexes, the lexical index when ``src`` has one),
    noting in ``replaced`` the positions of ids already indexed. Returns the segment and the
    metadata fields its documents hold."""
    d = src.vectors.shape[1]
    new = seg.SegmentSpec(prefix, src.positions, n)
    out = open_memmap(gen / new.file(seg.VECTORS), n, d)
    docstore = DocStore(str(gen / new.file(seg.DOCSTORE)), create=True)
    field_rows = tf.FieldRows(gen, new, len(names), d) if len(names) > 1 else None
    try:
        new_blocks = _noting_replaced(blocks, src.docstore, d, replaced)
        written, fields = write_rows(out, docstore, new_blocks, new.start, field_rows=field_rows)
    finally:
        docstore.close()
        if field_rows is not None:
            field_rows.close()
    if written != n:
        raise RuntimeError(f"expected {n} new documents, the blocks held {written}")
    out.flush()
    _write_segment_faiss(gen, new, out)
    del out
    tf.write_indexes(gen, new, len(names))
    if _has_lexical(src):
        _write_segment_lexical(gen, new, names)
    return new, fields


def _write_segment_lexical(gen: Path, spec: seg.SegmentSpec, names: tuple[str, ...]) -> None:
    """The BM25 lists of a new segment: of its one text, or of each of its text fields."""
    if len(names) > 1:
        tf.write_lexical(gen, spec, names)
    else:
        write_lexical(gen, spec.prefix)


def _merge(gen: Path, specs: list[seg.SegmentSpec], deleted: np.ndarray, limit: int, d: int, *,
           lexical: bool, names: tuple[str, ...] = ("text",)) -> list[seg.SegmentSpec]:
    """Merge neighbouring appended segments (segments.merge_plan) into one new segment of ``gen``:
    their rows stay at their positions; deleted documents' docstore rows are dropped. Returns the
    new segment list."""
    plan = seg.merge_plan(specs, limit)
    if plan is None:
        return specs
    i, j = plan
    parts = specs[i:j]
    merged = seg.SegmentSpec(seg.next_prefix(specs), parts[0].start, sum(p.positions for p in parts))
    out = open_memmap(gen / merged.file(seg.VECTORS), merged.positions, d)
    docstore = DocStore(str(gen / merged.file(seg.DOCSTORE)), create=True)
    dead = set(deleted.tolist())
    try:
        for part in parts:
            at = part.start - merged.start
            out[at:at + part.positions] = np.load(gen / part.file(seg.VECTORS), mmap_mode="r", allow_pickle=False)
            source = DocStore(str(gen / part.file(seg.DOCSTORE)))
            try:
                for rows in source.rows():
                    docstore.add(r for r in rows if r[0] not in dead)
            finally:
                source.close()
    finally:
        docstore.close()
    out.flush()
    _write_segment_faiss(gen, merged, out)
    del out
    if len(names) > 1:  # each text field's rows keep their positions too
        tf.copy_rows(gen, merged, len(names), d, (
            (part.start - merged.start,
             [np.load(gen / tf.field_spec(part, i).file(seg.VECTORS), mmap_mode="r", allow_pickle=False)
              for i in range(1, len(names))],
             np.load(gen / part.file(tf.NORMS_FILE), allow_pickle=False)) for part in parts))
        tf.write_indexes(gen, merged, len(names))
    if lexical:
        _write_segment_lexical(gen, merged, names)
    for part in parts:  # this generation's links only: older generations keep theirs
        for name in (part.files() + ((part.file(LEXICAL_FILE),) if lexical else ())
                     + tf.segment_files(part, len(names), bm25=lexical)):
            (gen / name).unlink(missing_ok=True)
    faults.point("append.segments-merged")
    return specs[:i] + [merged] + specs[j:]


def delete(target: str, ids: list[str], *, mirrors=()) -> MutationReport:
    """Remove documents by id (tombstones: only ``deleted.npy`` is written); ids not in the
    index are reported (``not_found``), not an error, and added to ``rejected.jsonl``. When no
    live document has one of the ids (and no mirror is given), nothing is published: the report's
    ``published`` is False."""

    def work(src: reader.IndexFiles, gen: Path):
        _link_unchanged(src, gen)
        wanted = list(dict.fromkeys(ids))
        found = src.docstore.positions(wanted)
        gone = np.asarray(sorted(found.values()), np.int64)
        deleted = np.unique(np.concatenate([src.deleted, gone]))
        _write_deleted(gen, deleted)
        faults.point("delete.tombstones-written")
        missing = [i for i in wanted if i not in found]
        _write_rejected(src, gen, "delete", [{"line": n, "reason": UNKNOWN_ID, "detail": "id is not in the index",
                                              "raw": i} for n, i in enumerate(ids, 1) if i not in found])
        documents = src.manifest.counts.documents - len(gone)
        tombstones = src.manifest.counts.tombstones + len(gone)
        counts = Counts(documents, src.positions, int(len(deleted)), int(tombstones))
        run = {"op": "delete", "read": len(ids), "deleted": len(gone), "not_found": len(missing)}
        report = MutationReport("delete", str(target), documents=documents, positions=src.positions,
                                tombstones=int(tombstones), deleted=len(gone), not_found=missing)
        return _manifest(src, counts=counts, run=run, segments=src.manifest.segment_specs), report

    def unchanged(src: reader.IndexFiles) -> MutationReport | None:
        wanted = list(dict.fromkeys(ids))
        if mirrors or src.docstore.positions(wanted):  # a mirror may have to catch up (a run killed before its alias swap)
            return None
        return MutationReport("delete", str(target), documents=src.manifest.counts.documents,
                              positions=src.positions, tombstones=src.manifest.counts.tombstones, not_found=wanted)

    return _mutate(target, work, mirrors, unchanged)


def compact(target: str, *, spec: FaissSpec | None = None, mirrors=(), facts: GpuFacts | None = None) -> MutationReport:
    """Rebuild the index from its live documents as one segment: positions 0..N-1, no tombstones,
    FAISS trained and tuned again (``spec`` None: the recorded request, e.g. ``auto`` re-picks by
    the new size)."""

    def work(src: reader.IndexFiles, gen: Path):
        recorded = src.manifest.faiss
        use = spec or FaissSpec(factory=recorded.get("requested", recorded["factory"]),
                                recall_target=recorded.get("spec", {}).get("recall_target", 0.95),
                                k=recorded.get("spec", {}).get("k", 10), policy=AutoPolicy())
        n, d = src.docstore.count(), src.vectors.shape[1]
        names = tf.names_of(src.manifest)
        out = open_vectors(gen, n, d)
        docstore = DocStore(str(gen / store.DOCSTORE_FILE), create=True)
        new, kept = 0, []
        try:
            for rows in src.docstore.rows():
                old = np.asarray([r[0] for r in rows], np.int64)
                kept.append(old)
                out[new:new + len(rows)] = src.vectors[old]
                docstore.add((new + i, doc_id, text, meta, norm) for i, (_, doc_id, text, meta, norm) in enumerate(rows))
                new += len(rows)
        finally:
            docstore.close()
        out.flush()
        del out
        faults.point("compact.rows-copied")
        info = write_faiss(gen, np.load(gen / store.VECTORS_FILE, mmap_mode="r", allow_pickle=False), use, facts)
        whole = seg.SegmentSpec("", 0, n)
        field_faiss = src.manifest.field_faiss
        if len(names) > 1:  # each text field's live rows, renumbered as the documents are
            from .field_view import all_norms, vectors_of

            at = np.cumsum([0] + [len(o) for o in kept])
            tf.copy_rows(gen, whole, len(names), d, ((int(a), [vectors_of(src, i)[o] for i in range(1, len(names))],
                                                      all_norms(src)[o]) for a, o in zip(at, kept)))
            built = tf.write_indexes(gen, whole, len(names), tuned=use, facts=facts)
            field_faiss = {names[i]: section for i, section in built.items()}
        _write_segment_lexical(gen, whole, names)
        _write_rejected(src, gen, "compact", [])
        counts = Counts(n, n)
        run = {"op": "compact", "kept": n, "dropped_positions": src.positions - n}
        report = MutationReport("compact", str(target), documents=n, positions=n, deleted=src.positions - n)
        manifest = _manifest(src, counts=counts, run=run, segments=[whole], faiss_info=info)
        return manifest.replace(field_faiss=field_faiss), report

    return _mutate(target, work, mirrors)


def _write_rejected(src: reader.IndexFiles, gen: Path, op: str, rejected: Iterable[dict]) -> None:
    """``rejected.jsonl`` accumulates: the previous generation's lines (the build's, then every later
    operation's), then this operation's, each tagged ``"op"`` and ``"at"`` (lines without ``op`` are the
    build's). With nothing new the file is a hard link of the previous one (free); otherwise the
    copy costs in proportion to the rejections kept so far."""
    rejected = list(rejected)
    previous = src.root / store.REJECTED_FILE
    if not rejected and store.REJECTED_FILE in src.manifest.files:
        store.link_or_copy(previous, gen / store.REJECTED_FILE)
        return
    at = store.utc_now()
    with open(gen / store.REJECTED_FILE, "wb") as f:
        if store.REJECTED_FILE in src.manifest.files:
            with open(previous, "rb") as old:
                shutil.copyfileobj(old, f)
            if f.tell() and not _ends_with_newline(previous):
                f.write(b"\n")
        f.writelines((json.dumps({"op": op, "at": at, **r}, ensure_ascii=False) + "\n").encode("utf-8")
                     for r in rejected)


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1) == b"\n"
