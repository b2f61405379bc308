"""The index job's last stage (pipelines/index.py): a build's encoded shards, their counts
checked, become a new published generation of the index (indexer/build.py, indexer/store.py), or
are appended to the published one (indexer/mutations.py)."""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from ..encoder.bundle import Bundle
from ..indexer import locking, mining, mutations, store
from ..indexer import records as rec
from ..indexer.build import write_generation, write_projections
from ..indexer.es_mirror import mirrors_for
from ..indexer.manifest import Fields, Manifest
from . import faiss_add, shardfs
from .assemble import (IndexInputError, ShardPlan, check_same_encoder, check_same_text_fields, keep_rejections,
                       plan_shards, shard_blocks)

ENCODER_FILE = "encoder.json"  # in the shard folder: which encoder wrote the shards


@dataclass
class IndexReport:
    index: str
    read: int
    indexed: int
    rejected: int
    truncated: int
    reasons: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    resumed_chunks: int = 0
    published: bool = False
    replaced: int = 0  # --append: indexed documents whose id was already in the index
    documents: int = 0  # live documents in the published index
    faiss: dict = field(default_factory=dict)  # the manifest's faiss section
    backends: dict = field(default_factory=dict)  # mirror counts, e.g. {"elasticsearch": {...}}
    encoder: str | None = None  # "cpu, float32 (why)": what the encoder ran in (model.settle_precision)
    misattributed: list = field(default_factory=list)  # "ID field: about NAME (ID): why", texts left out

    def summary(self) -> str:
        line = f"read {self.read}, indexed {self.indexed}, rejected {self.rejected}"
        if self.reasons:
            line += " (" + ", ".join(f"{r}: {n}" for r, n in self.reasons.most_common()) + ")"
        return line



def publish(build: str, job, bundle: Bundle, chunks: list, input_sha: str, *, options, threads: int | None,
            scratch: Path, misattributed: list[str] = ()) -> IndexReport:
    """Check the shards' counts, then build a new generation (or append) and publish it. ``job``:
    the :class:`~.index.IndexJob`; ``chunks``: its input's :class:`~.index.Chunk` list. A large
    IVF index is filled on the runner's workers (pipelines/faiss_add.py; ``options``: this job's,
    ``threads``: each worker's). ``misattributed``: the texts left out, reported and recorded in
    the manifest's run."""
    plan = plan_shards(build, chunks)
    report = _checked_report(plan, job, misattributed)
    encoder = json.loads(shardfs.read(shardfs.join(build, ENCODER_FILE)).decode("utf-8"))
    run = {"read": report.read, "indexed": report.indexed, "rejected": report.rejected, "truncated": report.truncated,
           "input": {"path": os.path.abspath(job.input), "sha256": input_sha},
           **({"misattributed": list(misattributed)} if misattributed else {})}
    mirrors = mirrors_for(job.es)
    # decided under the lock: an append to a missing index must not overwrite one another writer publishes meanwhile
    with locking.writer_lock(job.index):
        if job.append and store.is_published(job.index):
            return _append(build, job, chunks, plan, encoder, run, mirrors, report)
        fill = partial(_fill_generation, build=build, job=job, bundle=bundle, chunks=chunks, plan=plan,
                       encoder=encoder, run=run, options=options, threads=threads, scratch=scratch)
        written = store.publish_new(job.index, fill, mirrors)
    report.documents, report.faiss, report.backends = plan.kept, written.faiss, written.backends
    return report


def _checked_report(plan: ShardPlan, job, misattributed: list[str]) -> IndexReport:
    """The shards' counts, refused when they do not add up (a bug), when nothing is valid, or with
    ``--strict`` when a line was rejected."""
    report = IndexReport(index=job.index, read=plan.read, indexed=plan.kept, rejected=len(plan.rejected),
                         truncated=plan.truncated, reasons=Counter(r["reason"] for r in plan.rejected),
                         misattributed=list(misattributed))
    if report.indexed + report.rejected != report.read:  # a bug, never user error: refuse to publish
        raise RuntimeError(f"counts do not reconcile: {report.summary()}")
    if report.indexed == 0:
        hint = rec.missing_field_hint(job.input, report.reasons, id_field=job.id_field, text_field=job.text_field)
        raise IndexInputError(f"no valid records in {job.input}: {report.summary()}" + (f"; {hint}" if hint else ""))
    if job.strict and report.rejected:
        raise IndexInputError(f"--strict: {report.summary()}; nothing published, "
                              f"rejected lines in {keep_rejections(plan.rejected, job.index)}")
    return report


def _append(build: str, job, chunks: list, plan: ShardPlan, encoder: dict, run: dict, mirrors,
            report: IndexReport) -> IndexReport:
    """Append the shards to the published index (under its writer lock), refused when its encoder,
    text fields or precision differ from the shards'."""
    check_same_encoder(job.index, encoder)
    check_same_text_fields(job.index, job.text_fields or (job.text_field,))
    recorded = store.read_manifest(store.current_generation(job.index)).precision
    if encoder.get("precision", recorded) != recorded:  # the index was rebuilt meanwhile
        raise IndexInputError(f"--append: {job.index} is now encoded in {recorded}, these documents in "
                              f"{encoder['precision']}; run the append again")
    done = mutations.append(job.index, shard_blocks(build, chunks, plan), n=plan.kept, run=run, encoder=encoder,
                            rejected=plan.rejected, mirrors=mirrors, max_segments=job.max_segments)
    report.replaced, report.documents, report.backends = done.replaced, done.documents, done.backends
    report.faiss = store.read_manifest(store.current_generation(job.index)).faiss
    return report


def _fill_generation(gen: Path, *, build: str, job, bundle: Bundle, chunks: list, plan: ShardPlan, encoder: dict,
                     run: dict, options, threads: int | None, scratch: Path) -> Manifest:
    """Write a new generation folder ``gen`` from the shards (rejected lines, vectors, docstore,
    FAISS, the bundle's projections) and return its manifest."""
    with open(gen / store.REJECTED_FILE, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in plan.rejected)
    units = faiss_add.units_for(plan.kept, job.faiss_add_units)
    fill = faiss_add.WorkerAdd(build, scratch, tuple(faiss_add.plan_units(chunks, plan.keep, units)), options,
                               threads=threads) if units > 1 else None
    texts = tuple(job.text_fields) if len(job.text_fields) > 1 else ()
    parts = write_generation(gen, shard_blocks(build, chunks, plan), n=plan.kept, d=plan.dim,
                             spec=job.faiss_spec(fill), text_fields=texts)
    if job.collapse_field is not None and job.collapse_field not in parts.metadata_fields:
        raise IndexInputError(f"--collapse-field {job.collapse_field!r} is not a metadata field of the "
                              f"documents; fields: {', '.join(parts.metadata_fields) or '(none)'}")
    manifest = Manifest(
        encoder=encoder, dim=parts.dim, counts=parts.counts, faiss=parts.faiss,
        field_faiss=parts.field_faiss or {}, collapse=job.collapse_field,
        fields=Fields(job.id_field, texts[0] if texts else job.text_field, parts.metadata_fields, texts),
        bundle={"path": os.path.abspath(bundle.path) if bundle.path else None, "ref": bundle.ref,
                "fingerprint": bundle.fingerprint, "operators": sorted(bundle.operators)},
        runs=({"op": "build", **run, "at": store.utc_now()},), input=run["input"])
    projections = {n: op.params["P"] for n, op in bundle.operators.items() if op.both_sides}
    if projections:  # the bundle's both-sides operators get their projected copy of the index
        vectors = np.load(gen / store.VECTORS_FILE, mmap_mode="r", allow_pickle=False)
        manifest = manifest.replace(projections=write_projections(gen, vectors, projections))
    mining.write(gen, manifest)
    return manifest
