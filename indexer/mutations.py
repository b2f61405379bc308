"""Append, delete and compact a published index, each as one new generation published atomically.

A reader holds one generation; a mutation copies what changes into a new generation, hard-links
what does not, and publishes it with the same symlink swap as a build (indexer/store.py), under
the index's writer lock. Positions are never reused: an appended document takes the next free
position; a replaced or deleted document's position goes into ``deleted.npy``. FAISS types that
can remove vectors without renumbering (IVF) remove them; the others (Flat, HNSW) keep them as
tombstones that every search excludes with an ``IDSelector``, until ``compact`` rebuilds.

Cost per mutation (N = documents, n = documents touched), see docs/indexes.md:

- append: copies vectors.npy (O(N·d) bytes) and the docstore, reads and rewrites index.faiss,
  adds n vectors (no re-training; the tuned search parameters are kept);
- delete: hard-links vectors.npy; copies the docstore; IVF rewrites index.faiss, other types
  hard-link it;
- compact: a full rebuild of the live documents (training and tuning included).
"""
from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import faults
from . import store
from .build import Block, open_vectors, save_faiss, unit_rows, write_faiss
from .docstore import DocStore
from .faiss_index import FaissSpec, supports_removal
from .gpu import GpuFacts
from .tuning import AutoPolicy

MAX_RUNS_KEPT = 100
UNKNOWN_ID = "unknown-id"


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

    def summary(self) -> str:
        parts = {"append": f"added {self.added}, replaced {self.replaced}",
                 "delete": f"deleted {self.deleted}, not found {len(self.not_found)}",
                 "compact": f"kept {self.documents}, dropped {self.deleted} dead positions"}[self.op]
        return f"{parts}; index now holds {self.documents} documents ({self.tombstones} tombstones)"


def _mutate(target, work: Callable[[store.IndexFiles, Path], tuple[dict, MutationReport]], mirrors) -> MutationReport:
    """Lock, open the current generation, let ``work`` fill a new one, commit it; clean up on failure."""
    started = time.perf_counter()
    with store.writer_lock(target):
        src = store.open_index(target)
        gen = store.new_generation(target)
        try:
            manifest, report = work(src, gen)
            report.backends = store.commit(target, gen, manifest, mirrors)
        except BaseException as e:
            shutil.rmtree(gen, ignore_errors=True)
            store.raise_if_full(e, target)
            raise
        finally:
            src.docstore.close()
            src.close_faiss_fd()
    report.seconds = time.perf_counter() - started
    return report


def _manifest(src: store.IndexFiles, *, counts: dict, run: dict, faiss_info: dict | None = None,
              fields: Iterable[str] = ()) -> dict:
    # projected copies (write_projections) are not carried into the new generation: queries derive them
    manifest = {k: v for k, v in src.manifest.items() if k not in ("format", "version", "created_at", "projections")}
    manifest["counts"] = counts
    manifest["runs"] = (list(src.manifest.get("runs", [])) + [{**run, "at": store.utc_now()}])[-MAX_RUNS_KEPT:]
    if faiss_info is not None:
        manifest["faiss"] = faiss_info
    manifest["fields"] = {**src.manifest["fields"],
                          "metadata": sorted(set(src.manifest["fields"]["metadata"]) | set(fields))}
    return manifest


def _removable(src: store.IndexFiles) -> bool:
    recorded = src.manifest.get("faiss", {}).get("removal")
    return recorded == "remove_ids" if recorded else supports_removal(src.faiss)


def _write_deleted(gen: Path, deleted: np.ndarray) -> None:
    if len(deleted):
        np.save(gen / store.DELETED_FILE, np.unique(np.asarray(deleted, np.int64)))


def append(target: str, blocks: Iterable[Block], *, n: int, run: dict, rejected: list[dict] = (),
           mirrors=(), facts: GpuFacts | None = None) -> MutationReport:
    """Add ``n`` documents (``blocks``: unique ids among themselves) to the index at ``target``;
    a document whose id is already indexed replaces it (the old position is deleted).

    ``run``: the input's counts for the manifest's ``runs`` history; ``rejected``: the input
    lines refused (written to the new generation's rejected.jsonl).
    """

    def work(src: store.IndexFiles, gen: Path):
        start, d = src.positions, src.vectors.shape[1]
        out = open_vectors(gen, start + n, d)
        for i in range(0, start, 65_536):  # the old rows, block by block
            end = min(i + 65_536, start)
            out[i:end] = src.vectors[i:end]
        shutil.copyfile(src.root / store.DOCSTORE_FILE, gen / store.DOCSTORE_FILE)
        docstore = DocStore(str(gen / store.DOCSTORE_FILE), write=True)
        replaced, fields, pos = [], set(), start
        try:
            for block in blocks:
                if not block.docs:
                    continue
                if block.vectors.shape[1] != d:
                    raise ValueError(f"new vectors have {block.vectors.shape[1]} dims, the index has {d}")
                replaced += list(docstore.delete([doc["id"] for doc in block.docs]).values())
                unit, norms = unit_rows(block.vectors)
                out[pos:pos + len(unit)] = unit
                docstore.add((pos + i, doc["id"], doc["text"], doc["metadata"], norm)
                             for i, (doc, norm) in enumerate(zip(block.docs, norms)))
                fields.update(k for doc in block.docs for k in doc["metadata"])
                pos += len(unit)
            documents = docstore.count()
        finally:
            docstore.close()
        if pos != start + n:
            raise RuntimeError(f"expected {n} new documents, the blocks held {pos - start}")
        out.flush()
        index = src.faiss  # this writer's own copy, loaded from the old generation
        removable = supports_removal(index)
        new_ids = np.arange(start, start + n, dtype=np.int64)
        if removable:
            if replaced:
                index.remove_ids(np.asarray(replaced, np.int64))
            for i in range(0, n, 65_536):
                index.add_with_ids(np.ascontiguousarray(out[start + i:start + i + 65_536]), new_ids[i:i + 65_536])
        else:
            if index.ntotal != start:
                raise RuntimeError(f"index.faiss holds {index.ntotal} vectors but vectors.npy has {start} rows")
            for i in range(0, n, 65_536):
                index.add(np.ascontiguousarray(out[start + i:start + i + 65_536]))
        del out
        save_faiss(index, gen / store.FAISS_FILE)
        faults.point("append.faiss-written")
        deleted = np.concatenate([src.deleted, np.asarray(replaced, np.int64)])
        _write_deleted(gen, deleted)
        tombstones = src.manifest["counts"].get("tombstones", 0) + (0 if removable else len(replaced))
        _write_rejected(gen, rejected)
        counts = {"documents": documents, "positions": start + n, "deleted": int(len(np.unique(deleted))),
                  "tombstones": int(tombstones)}
        faiss_info = {**src.manifest["faiss"], "ntotal": int(index.ntotal)}
        run_record = {"op": "append", **run, "added": n - len(replaced), "replaced": len(replaced)}
        report = MutationReport("append", str(target), documents=documents, positions=start + n,
                                tombstones=int(tombstones), added=n - len(replaced), replaced=len(replaced))
        return _manifest(src, counts=counts, run=run_record, faiss_info=faiss_info, fields=fields), report

    return _mutate(target, work, mirrors)


def delete(target: str, ids: list[str], *, mirrors=()) -> MutationReport:
    """Remove documents by id; ids not in the index are reported (``not_found``), not an error."""

    def work(src: store.IndexFiles, gen: Path):
        store.link_or_copy(src.root / store.VECTORS_FILE, gen / store.VECTORS_FILE)
        shutil.copyfile(src.root / store.DOCSTORE_FILE, gen / store.DOCSTORE_FILE)
        docstore = DocStore(str(gen / store.DOCSTORE_FILE), write=True)
        try:
            found = docstore.delete(list(dict.fromkeys(ids)))
            documents = docstore.count()
        finally:
            docstore.close()
        faults.point("delete.docstore-written")
        gone = np.asarray(sorted(found.values()), np.int64)
        removable = _removable(src)
        if removable and len(gone):
            index = src.faiss
            index.remove_ids(gone)
            save_faiss(index, gen / store.FAISS_FILE)
            ntotal = int(index.ntotal)
        else:
            store.link_or_copy(src.root / store.FAISS_FILE, gen / store.FAISS_FILE)
            ntotal = int(src.manifest["faiss"]["ntotal"])
        deleted = np.concatenate([src.deleted, gone])
        _write_deleted(gen, deleted)
        missing = [i for i in dict.fromkeys(ids) if i not in found]
        _write_rejected(gen, [{"line": n, "reason": UNKNOWN_ID, "detail": "id is not in the index", "raw": i}
                              for n, i in enumerate(ids, 1) if i not in found])
        tombstones = src.manifest["counts"].get("tombstones", 0) + (0 if removable else len(gone))
        counts = {"documents": documents, "positions": src.positions, "deleted": int(len(np.unique(deleted))),
                  "tombstones": int(tombstones)}
        run = {"op": "delete", "read": len(ids), "deleted": len(gone), "not_found": len(missing)}
        report = MutationReport("delete", str(target), documents=documents, positions=src.positions,
                                tombstones=int(tombstones), deleted=len(gone), not_found=missing)
        return _manifest(src, counts=counts, run=run, faiss_info={**src.manifest["faiss"], "ntotal": ntotal}), report

    return _mutate(target, work, mirrors)


def compact(target: str, *, spec: FaissSpec | None = None, mirrors=(), facts: GpuFacts | None = None) -> MutationReport:
    """Rebuild the index from its live documents: positions 0..N-1, no tombstones, FAISS trained
    and tuned again (``spec`` None: the recorded request, e.g. ``auto`` re-picks by the new size)."""

    def work(src: store.IndexFiles, gen: Path):
        recorded = src.manifest["faiss"]
        use = spec or FaissSpec(factory=recorded.get("requested", recorded["factory"]),
                                recall_target=recorded.get("spec", {}).get("recall_target", 0.95),
                                k=recorded.get("spec", {}).get("k", 10), policy=AutoPolicy())
        n, d = src.docstore.count(), src.vectors.shape[1]
        out = open_vectors(gen, n, d)
        docstore = DocStore(str(gen / store.DOCSTORE_FILE), create=True)
        new = 0
        try:
            for rows in src.docstore.rows():
                old = np.asarray([r[0] for r in rows], np.int64)
                out[new:new + len(rows)] = src.vectors[old]
                docstore.add((new + i, doc_id, text, meta, norm) for i, (_, doc_id, text, meta, norm) in enumerate(rows))
                new += len(rows)
        finally:
            docstore.close()
        out.flush()
        del out
        faults.point("compact.rows-copied")
        info = write_faiss(gen, np.load(gen / store.VECTORS_FILE, mmap_mode="r", allow_pickle=False), use, facts)
        _write_rejected(gen, [])
        counts = {"documents": n, "positions": n, "deleted": 0, "tombstones": 0}
        run = {"op": "compact", "kept": n, "dropped_positions": src.positions - n}
        report = MutationReport("compact", str(target), documents=n, positions=n, deleted=src.positions - n)
        return _manifest(src, counts=counts, run=run, faiss_info=info), report

    return _mutate(target, work, mirrors)


def _write_rejected(gen: Path, rejected: Iterable[dict]) -> None:
    import json

    with open(gen / store.REJECTED_FILE, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rejected)
