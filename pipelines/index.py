"""The index job: JSONL corpus → Beam (read, validate, dedupe, encode) → FAISS + docstore.

Beam does the parallel part and writes encoded shards into the new index generation; the driver
then assembles them in input order (so positions are deterministic), builds FAISS and the docstore,
writes the manifest and publishes the generation atomically (indexer/store.py).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..encoder.bundle import Bundle, load_bundle
from ..encoder.model import Encoder, EncoderConfig
from ..indexer import records as rec
from ..indexer import store
from ..indexer.docstore import DocStore
from ..indexer.faiss_index import DEFAULT_FACTORY, build_faiss

SHARDS = "shards"
ENCODER_FILE = "encoder.json"


class IndexInputError(ValueError):
    """The input cannot be indexed at all (missing, unreadable, empty, nothing valid)."""


@dataclass(frozen=True, kw_only=True)
class IndexJob:
    input: str
    index: str
    model: str | None = None  # bundle folder or encoder id/path; None = default relation pack
    id_field: str = "id"
    text_field: str = "text"
    faiss_factory: str = DEFAULT_FACTORY
    batch_size: int = 1024  # records per Beam bundle handed to the encoder (sorted inside)
    precision: str = "auto"
    max_length: int | None = None
    strict: bool = False
    progress: bool = True


@dataclass
class IndexReport:
    index: str
    read: int
    indexed: int
    rejected: int
    truncated: int
    reasons: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    published: bool = False

    def summary(self) -> str:
        line = f"read {self.read}, indexed {self.indexed}, rejected {self.rejected}"
        if self.reasons:
            line += " (" + ", ".join(f"{r}: {n}" for r, n in self.reasons.most_common()) + ")"
        return line


# ---------------------------------------------------------------- Beam transforms (pure, per element)

def read_numbered_lines(path: str):
    """Yield (line_number, raw bytes without the newline); line numbers start at 1."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            yield number, line.rstrip(b"\r\n")


def _keep_first_by_line(item, ):
    """(id, [Record...]) → the earliest line wins; later lines with the same id are rejected."""
    import apache_beam as beam

    _, group = item
    group = sorted(group, key=lambda r: r.line)
    yield group[0]
    for dup in group[1:]:
        yield beam.pvalue.TaggedOutput(
            "rejected", rec.Rejection(dup.line, rec.DUPLICATE_ID, f"id {dup.id!r} first seen on line {group[0].line}",
                                      dup.text[:200]))


def _split_parsed(result):
    import apache_beam as beam

    if isinstance(result, rec.Rejection):
        yield beam.pvalue.TaggedOutput("rejected", result)
    else:
        yield result


def _write_atomically(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def _encode_and_write_shard(batch: list, encoder: Encoder, shard_dir: str) -> None:
    texts = [r.text for r in batch]
    result = encoder.encode(texts)
    name = f"{uuid.uuid4().hex}-{len(batch)}"
    shard = Path(shard_dir)
    _write_atomically(shard / f"{name}.jsonl", lambda p: p.write_text(
        "".join(json.dumps({"line": r.line, "id": r.id, "text": r.text, "metadata": r.metadata},
                           ensure_ascii=False) + "\n" for r in batch)))
    _write_atomically(shard / f"{name}.npz", lambda p: np.savez(
        open(p, "wb"), vectors=result.vectors, truncated=np.int64(result.truncated)))


class EncodeShards:
    """DoFn factory: one encoder per worker process (Beam ``Shared``), one shard per batch."""

    def __new__(cls, encoder_config: EncoderConfig, shard_dir: str):
        import apache_beam as beam
        from apache_beam.utils import shared

        class _EncodeShards(beam.DoFn):
            def __init__(self):
                self._shared = shared.Shared()

            def setup(self):
                # keep the holder: Shared only weakly references it, and dropping it reloads the model
                self._holder = self._shared.acquire(lambda: _Holder(Encoder(encoder_config)), tag=repr(encoder_config))
                self._encoder = self._holder.value
                identity = Path(shard_dir) / ENCODER_FILE
                if not identity.exists():  # tells the driver exactly which encoder wrote the shards
                    _write_atomically(identity, lambda p: p.write_text(json.dumps(self._encoder.identity)))

            def process(self, batch):
                _encode_and_write_shard(batch, self._encoder, shard_dir)

        return _EncodeShards()


class _Holder:  # Shared needs a weak-referenceable object
    def __init__(self, value):
        self.value = value


def _write_rejections(batch: list, shard_dir: str) -> None:
    path = Path(shard_dir) / f"{uuid.uuid4().hex}.rejected.jsonl"
    _write_atomically(path, lambda p: p.write_text("".join(json.dumps(r.to_json(), ensure_ascii=False) + "\n" for r in batch)))


def build_pipeline(p, job: IndexJob, encoder_config: EncoderConfig, shard_dir: str, *, reshuffle: bool):
    """Wire the Beam graph onto pipeline ``p``; outputs are shard files in ``shard_dir``."""
    import apache_beam as beam

    lines = p | "Input" >> beam.Create([job.input]) | "ReadLines" >> beam.FlatMap(read_numbered_lines)
    if reshuffle:  # spread one input file across workers
        lines = lines | beam.Reshuffle()
    parsed = (
        lines
        | "Parse" >> beam.Map(lambda item, i=job.id_field, t=job.text_field: rec.parse_line(*item, id_field=i, text_field=t))
        | "Split" >> beam.FlatMap(_split_parsed).with_outputs("rejected", main="records")
    )
    unique = (
        parsed.records
        | "KeyById" >> beam.Map(lambda r: (r.id, r))
        | "GroupById" >> beam.GroupByKey()
        | "Dedupe" >> beam.FlatMap(_keep_first_by_line).with_outputs("rejected", main="records")
    )
    (
        unique.records
        | "Batch" >> beam.BatchElements(min_batch_size=job.batch_size, max_batch_size=job.batch_size)
        | "Encode" >> beam.ParDo(EncodeShards(encoder_config, shard_dir))
    )
    (
        (parsed.rejected, unique.rejected)
        | "AllRejected" >> beam.Flatten()
        | "BatchRejected" >> beam.BatchElements(min_batch_size=1000, max_batch_size=10000)
        | "WriteRejected" >> beam.Map(_write_rejections, shard_dir)
    )


def pipeline_options(beam_args: list[str]):
    """Beam options from pass-through args; without ``--runner`` use the in-process FnApiRunner
    (the DirectRunner would first try to download the Prism runner, which fails offline)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    args = list(beam_args)
    if not any(a == "--runner" or a.startswith("--runner=") for a in args):
        args.append("--runner=FnApiRunner")
    return PipelineOptions(args)


# ---------------------------------------------------------------- driver

def count_lines(path: str) -> int:
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_input(path: str) -> int:
    if not os.path.exists(path):
        raise IndexInputError(f"input {path} does not exist")
    if not os.path.isfile(path):
        raise IndexInputError(f"input {path} is not a file")
    if not os.access(path, os.R_OK):
        raise IndexInputError(f"input {path} is not readable")
    n = count_lines(path)
    if n == 0:
        raise IndexInputError(f"input {path} is empty")
    return n


def _watch_progress(shard_dir: Path, total: int, stop: threading.Event, enabled: bool) -> None:
    """Show encoding progress by counting rows in finished shards (works for any local runner)."""
    from tqdm import tqdm

    with tqdm(total=total, unit="doc", desc="encoding", disable=not enabled, mininterval=1.0) as bar:
        while True:
            done = sum(int(p.stem.rsplit("-", 1)[1]) for p in shard_dir.glob("*.npz"))
            bar.update(done - bar.n)
            if stop.wait(0.5):
                done = sum(int(p.stem.rsplit("-", 1)[1]) for p in shard_dir.glob("*.npz"))
                bar.update(done - bar.n)
                return


def run_index(job: IndexJob, beam_args: list[str] = (), *, bundle: Bundle | None = None) -> IndexReport:
    """Run the whole index job; publish the new index only if it is complete and valid.

    Raises IndexInputError (nothing written) for missing/empty/unusable input.
    """
    import apache_beam as beam

    started = time.perf_counter()
    total_lines = _check_input(job.input)
    bundle = bundle or load_bundle(job.model)
    encoder_config = EncoderConfig(model=bundle.encoder["model"], pooling=bundle.encoder.get("pooling"),
                                   max_length=job.max_length or bundle.encoder.get("max_length"),
                                   precision=job.precision)
    gen = store.new_generation(job.index)
    shard_dir = gen / SHARDS
    shard_dir.mkdir()
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_progress, args=(shard_dir, total_lines, stop, job.progress), daemon=True)
    watcher.start()
    options = pipeline_options(list(beam_args))
    try:
        workers = options.get_all_options().get("direct_num_workers") or 1
        try:
            with beam.Pipeline(options=options) as p:
                build_pipeline(p, job, encoder_config, str(shard_dir), reshuffle=workers != 1)
        finally:
            stop.set()
            watcher.join()
        report = _assemble(gen, job, bundle, total_lines)
        report.seconds = time.perf_counter() - started
        if report.indexed == 0:
            raise IndexInputError(f"no valid records in {job.input}: {report.summary()}")
        if job.strict and report.rejected:
            raise IndexInputError(f"--strict: {report.summary()}; nothing published, "
                                  f"rejected lines in {_keep_rejections(gen, job.index)}")
    except BaseException:
        shutil.rmtree(gen, ignore_errors=True)  # the published index, if any, is untouched
        raise
    store.publish(job.index, gen)
    report.published = True
    return report


def _keep_rejections(gen: Path, target: str) -> str:
    """Copy a refused run's rejected.jsonl beside the index so the user can read it."""
    dest = f"{os.path.abspath(target)}.rejected.jsonl"
    shutil.copyfile(gen / store.REJECTED_FILE, dest)
    return dest


def _assemble(gen: Path, job: IndexJob, bundle: Bundle, total_lines: int) -> IndexReport:
    """Merge shards in input-line order into vectors.npy, index.faiss, docstore and manifest."""
    shard_dir = gen / SHARDS
    docs, vector_parts, truncated = [], [], 0
    for npz in sorted(shard_dir.glob("*.npz")):
        with np.load(npz) as data:
            vector_parts.append(data["vectors"])
            truncated += int(data["truncated"])
        docs += [json.loads(line) for line in npz.with_suffix(".jsonl").read_text().splitlines()]
    rejected = [json.loads(line) for p in sorted(shard_dir.glob("*.rejected.jsonl"))
                for line in p.read_text().splitlines()]
    rejected.sort(key=lambda r: r["line"])
    with open(gen / store.REJECTED_FILE, "w") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rejected)

    raw = np.concatenate(vector_parts) if vector_parts else np.zeros((0, bundle.encoder.get("dim") or 0), np.float32)
    order = np.argsort([d["line"] for d in docs], kind="stable")
    docs = [docs[i] for i in order]
    raw = raw[order]
    norms = np.linalg.norm(raw, axis=1)
    unit = (raw / np.maximum(norms, 1e-12)[:, None]).astype(np.float32)
    report = IndexReport(index=job.index, read=total_lines, indexed=len(docs), rejected=len(rejected),
                         truncated=truncated, reasons=Counter(r["reason"] for r in rejected))
    if report.indexed + report.rejected != report.read:  # a bug, never user error: refuse to publish
        raise RuntimeError(f"counts do not reconcile: {report.summary()}")
    if not docs:
        return report

    import faiss

    np.save(gen / store.VECTORS_FILE, unit)
    faiss.write_index(build_faiss(unit, job.faiss_factory), str(gen / store.FAISS_FILE))
    docstore = DocStore(str(gen / store.DOCSTORE_FILE), create=True)
    docstore.add((pos, d["id"], d["text"], d["metadata"], n) for pos, (d, n) in enumerate(zip(docs, norms)))
    docstore.close()
    metadata_fields = sorted({k for d in docs for k in d["metadata"]})
    encoder_identity = json.loads((shard_dir / ENCODER_FILE).read_text())
    store.write_manifest(gen, {
        "encoder": encoder_identity,
        "bundle": {"path": os.path.abspath(bundle.path) if bundle.path else None, "fingerprint": bundle.fingerprint,
                   "operators": sorted(bundle.operators)},
        "counts": {"read": report.read, "indexed": report.indexed, "rejected": report.rejected,
                   "truncated": truncated},
        "faiss": {"factory": job.faiss_factory, "metric": "inner_product", "ntotal": len(docs)},
        "fields": {"id": job.id_field, "text": job.text_field, "metadata": metadata_fields},
        "input": {"path": os.path.abspath(job.input), "sha256": file_sha256(job.input)},
        "dim": int(unit.shape[1]),
    })
    shutil.rmtree(shard_dir)
    return report
