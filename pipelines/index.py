"""The index job: JSONL corpus → Beam (read, validate, encode) → FAISS + docstore.

The driver cuts the input into chunks of whole lines (byte ranges). Beam spreads the chunks over
workers; each worker parses its chunk, encodes the valid texts in token-sorted batches with one
model per process, and writes one shard per chunk. Shards live in a build folder keyed by the
job's inputs, so a killed run re-run with the same arguments skips the chunks already encoded.
The driver then assembles the shards in input order (positions are deterministic; a later line
with an already-seen id is rejected as a duplicate; pipelines/assemble.py), streams them into
vectors.npy and the docstore, builds and tunes FAISS (indexer/build.py; a large IVF index is
trained here and filled on the workers: pipelines/faiss_add.py), optionally mirrors the
generation into Elasticsearch, writes the manifest and publishes the generation atomically
(indexer/store.py). With ``append`` the documents are added to the published index instead
(indexer/mutations.py): new ids are added, known ids replaced.
"""
from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import threading
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from .. import faults
from ..files import sha256_file
from ..encoder.bundle import Bundle, load_bundle, recorded_ref
from ..encoder.model import Encoder, EncoderConfig, encode_texts, settle_precision
from ..indexer import integrity, locking, spool, store
from ..indexer import belonging
from ..indexer import records as rec
from ..indexer.es_mirror import EsTarget
from ..indexer.faiss_index import DEFAULT_FACTORY, FaissSpec
from ..indexer.tuning import AutoPolicy
from .assemble import IndexInputError
from . import shardfs
from .publish import ENCODER_FILE, IndexReport, publish
from .runners import freeze_long_lived, local_workers, new_pipeline, one_local_worker, pipeline_options, run_to_end

PROGRESS_SUFFIX = ".progress"
FLAGS_FILE = "misattributed.json"  # the driver's flags (indexer/belonging.py), by line, for the workers


@dataclass(frozen=True, kw_only=True)
class IndexJob:
    input: str
    index: str
    model: str | None = None  # bundle folder or encoder id/path; None = default relation pack
    id_field: str = "id"
    text_field: str = "text"
    # two or more named text fields (``--text-field A --text-field B``; indexer/text_fields.py), each
    # with its own vectors and BM25; text_field is then the first. () : the one text_field
    text_fields: tuple[str, ...] = ()
    collapse_field: str | None = None  # recorded in the manifest: queries collapse on it by default
    # False: a text about another record of the corpus (indexer/belonging.py; names from collapse_field
    # or "name") is left out of its record's vectors and reported; True: every text is indexed
    keep_misattributed: bool = False
    faiss_factory: str = DEFAULT_FACTORY  # "auto" or a FAISS index-factory string
    recall_target: float = 0.95  # recall@10 against exact search that the tuned parameters must reach
    faiss_device: str = "auto"  # "auto": GPU for FAISS when present; "cpu"
    auto_policy: AutoPolicy = field(default_factory=AutoPolicy)
    faiss_add_units: int = 0  # an IVF index is filled on the workers in this many units (0: one per 1M docs; 1: driver)
    append: bool = False  # add to / replace in the published index instead of rebuilding it
    max_segments: int | None = None  # append: merge threshold (None: the index's recorded one, default 10)
    es: EsTarget | None = None  # mirror the published corpus into Elasticsearch
    chunk_lines: int = 2048  # lines per chunk: the unit of work and of resumption (progress moves per batch)
    chunk_bytes: int = 32 * rec.MiB  # a chunk also ends once it holds this many bytes (bounds memory)
    limits: rec.Limits = rec.DEFAULT_LIMITS  # per-line size limits (indexer/records.py)
    precision: str = "auto"
    device: str = "auto"  # the encoder's: "auto" (CUDA when present), "cpu", "cuda", "cuda:N"
    max_length: int | None = None
    strict: bool = False
    progress: bool = True

    def faiss_spec(self, fill=None) -> FaissSpec:
        return FaissSpec(factory=self.faiss_factory, recall_target=self.recall_target, device=self.faiss_device,
                         policy=self.auto_policy, fill=fill)


@dataclass(frozen=True)
class Chunk:
    """Lines ``first_line`` … of the input, bytes [start, end)."""

    number: int
    start: int
    end: int
    first_line: int
    lines: int


# ---------------------------------------------------------------- reading

# The bounded line reader lives with the parser (indexer/records.py); lookup imports it from here.
read_numbered_lines = rec.read_numbered_lines


def line_ends(f, piece: int = 1 << 20):
    """Yield the byte offset just past each line of binary file ``f`` (long lines read in pieces)."""
    pos, open_line = f.tell(), False
    while part := f.readline(piece):
        pos += len(part)
        open_line = not part.endswith(b"\n")
        if not open_line:
            yield pos
    if open_line:
        yield pos


def plan_chunks(path: str, chunk_lines: int, chunk_bytes: int | None = None) -> list[Chunk]:
    """Split the file into chunks of whole lines: at most ``chunk_lines`` lines, and a chunk stops
    after the line that reaches ``chunk_bytes`` bytes, so a worker's memory is bounded by bytes
    too, not only by a line count (one pass, never more than 1 MiB of a line in memory)."""
    chunks, start, line, count = [], 0, 1, 0
    with open(path, "rb") as f:
        for pos in line_ends(f):
            count += 1
            if count == chunk_lines or (chunk_bytes and pos - start >= chunk_bytes):
                chunks.append(Chunk(len(chunks), start, pos, line, count))
                start, line, count = pos, line + count, 0
    if count:
        chunks.append(Chunk(len(chunks), start, pos, line, count))
    return chunks


def check_input(path: str) -> int:
    """Raise IndexInputError unless ``path`` is a readable, non-empty file; return its line count."""
    if not os.path.exists(path):
        raise IndexInputError(f"input {path} does not exist")
    if not os.path.isfile(path):
        raise IndexInputError(f"input {path} is not a file")
    if not os.access(path, os.R_OK):
        raise IndexInputError(f"input {path} is not readable")
    if os.path.getsize(path) == 0:
        raise IndexInputError(f"input {path} is empty")
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            n, last = n + block.count(b"\n"), block[-1:]
    return n + (last != b"\n")


# ---------------------------------------------------------------- the per-chunk work (Beam DoFn body)

def encode_chunk(chunk: Chunk, *, path: str, job: IndexJob, encoder: Encoder, shard_dir: str,
                 root: str | None = None) -> None:
    """Parse, validate and encode one chunk into ``NNNNNN.jsonl`` + ``NNNNNN.npz`` in ``shard_dir``
    (a local folder or any Beam FileSystems location; ``path`` likewise). ``root``: the index folder
    when ``shard_dir`` is its build folder (:func:`still_inside` before each file).

    The ``.npz`` is written last and atomically: its presence marks the chunk complete. Until
    then ``NNNNNN.progress`` holds the chunk's lines done so far, rewritten after each encoded
    batch, so the progress bar moves within a chunk (:func:`lines_done`).
    """
    done = shardfs.join(shard_dir, f"{chunk.number:06d}.npz")  # shard_dir: str (or a local Path)
    if shardfs.exists(done):
        return
    flags = _read_flags(shard_dir)
    parsed = [belonging.parse_line(n, raw, flags.get(n), id_field=job.id_field, text_field=job.text_field,
                                   limits=job.limits, text_fields=job.text_fields)
              for n, raw in read_numbered_lines(path, chunk.start, chunk.end, chunk.first_line,
                                                job.limits.max_line_bytes, opener=shardfs.open_binary)]
    # an id repeated within the chunk is rejected before encoding (the first line wins): a corpus of
    # one id repeated costs one encoding per chunk, not per line; repeats across chunks are found by
    # the driver (assemble.plan_shards), which also words every duplicate's reason
    firsts: set = set()
    records, repeats = [], set()
    for r in parsed:
        if isinstance(r, rec.Record):
            if r.id in firsts:
                repeats.add(r.line)
            else:
                firsts.add(r.id)
                records.append(r)
    progress_file, lines = done[:-len(".npz")] + PROGRESS_SUFFIX, chunk.lines - len(records)  # rejections are done

    def progress(encoded: int) -> None:
        nonlocal lines
        lines += encoded
        still_inside(root, shard_dir)
        shardfs.write(progress_file, str(lines).encode())

    progress(0)
    fields: dict[str, np.ndarray] = {}
    if len(job.text_fields) > 1:
        vectors, extra, truncated = encode_fields(encoder, records, job.text_fields, progress)
        fields = {f"vectors_{i}": v for i, v in enumerate(extra, 1)}
    else:
        vectors, truncated = encode_texts(encoder, [r.text for r in records], progress=progress)
    rows = [{"line": r.line, "id": r.id, "text": r.text[:200], "duplicate": True} if r.line in repeats
            else {"line": r.line, "id": r.id, "text": r.text, "metadata": r.metadata}
            for r in parsed if isinstance(r, rec.Record)]
    rows += [{"rejected": r.to_json()} for r in parsed if isinstance(r, rec.Rejection)]
    still_inside(root, shard_dir)
    shardfs.write(shardfs.join(shard_dir, f"{chunk.number:06d}.jsonl"),
                  "".join(rec.json_text(row) + "\n" for row in rows).encode("utf-8"))
    still_inside(root, shard_dir)
    _save_npz(done, vectors=vectors, truncated=np.int64(truncated), lines=np.int64(chunk.lines), **fields)
    shardfs.remove([progress_file])
    faults.point("index.shard-written")


def encode_fields(encoder: Encoder, records: list, names: tuple[str, ...],
                  progress=None) -> tuple[np.ndarray, list[np.ndarray], int]:
    """Raw vectors of each record's named texts, all texts encoded as one batch (token-sorted
    together): (field 0's (n, d), [fields 1…'s (n, d)], texts truncated); a zero row where a record
    lacks a text. ``progress(records)`` moves in proportion to the texts encoded."""
    flat = [(row, f, r.texts[name]) for row, r in enumerate(records) for f, name in enumerate(names) if name in r.texts]
    done = reported = 0

    def texts_done(n: int) -> None:
        nonlocal done, reported
        done += n
        now = done * len(records) // max(len(flat), 1)
        if progress is not None and now > reported:
            progress(now - reported)
            reported = now

    vectors, truncated = encode_texts(encoder, [t for _, _, t in flat], progress=texts_done)
    d = vectors.shape[1] if vectors.ndim == 2 else 0
    out = [np.zeros((len(records), d), np.float32) for _ in names]
    for (row, f, _), v in zip(flat, vectors):
        out[f][row] = v
    return out[0], out[1:], truncated


def still_inside(root: str | None, folder: str) -> None:
    """Right before a file is written into the index's build folder ``folder``: ``root``, the index
    folder the driver resolved once, must still reach it through real folders only (else
    IndexCorruptError): ``generations`` swapped for a link to a folder elsewhere would lead the
    shards there, and Beam makes the missing folders of a path it writes. None: the shards live
    elsewhere (``--temp_location``)."""
    if root is not None:
        integrity.check_inside(root, folder)


def _read_flags(shard_dir: str) -> dict[int, list[belonging.Flag]]:
    path = shardfs.join(shard_dir, FLAGS_FILE)
    if not shardfs.exists(path):
        return {}
    return {int(n): [belonging.Flag(**f) for f in flags] for n, flags in json.loads(shardfs.read(path)).items()}


def _save_npz(path: str, **arrays) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    shardfs.write(path, buffer.getvalue())


class _Holder:  # Beam's Shared keeps only a weak reference to what it caches
    def __init__(self, value):
        self.value = value


encoders_loaded = 0  # in this process: one per worker process is the contract (checked on a Dask cluster)


def _load_encoder(config: EncoderConfig) -> _Holder:
    global encoders_loaded
    encoders_loaded += 1
    holder = _Holder(Encoder(config))
    freeze_long_lived()  # the libraries and the model are loaded: what the job allocates from now on is its own
    return holder


def _encode_chunks_dofn(path: str, job: IndexJob, encoder_config: EncoderConfig, shard_dir: str, root: str | None):
    import apache_beam as beam
    from apache_beam.utils import shared

    class EncodeChunks(beam.DoFn):
        """One encoder per worker process (Beam ``Shared``); one shard per chunk."""

        def __init__(self):
            self._shared = shared.Shared()

        def setup(self):
            self._holder = self._shared.acquire(partial(_load_encoder, encoder_config), tag=repr(encoder_config))
            identity = shardfs.join(shard_dir, ENCODER_FILE)  # tells the driver which encoder wrote the shards
            if not shardfs.exists(identity):  # and in which dtype: the manifest records it (encoder.precision)
                encoder = self._holder.value
                still_inside(root, shard_dir)
                shardfs.write(identity, json.dumps({**encoder.identity, "precision": encoder.precision}).encode("utf-8"))

        def process(self, chunk):
            encode_chunk(chunk, path=path, job=job, encoder=self._holder.value, shard_dir=shard_dir, root=root)

    return EncodeChunks()


def build_pipeline(p, job: IndexJob, chunks: list[Chunk], encoder_config: EncoderConfig, shard_dir: str,
                   input_path: str | None = None, root: str | None = None):
    """Wire the Beam graph onto pipeline ``p``; its output is the shard files in ``shard_dir``. Workers
    read the input at ``input_path`` (default: ``job.input``, made absolute). ``root``: the index
    folder when ``shard_dir`` is its build folder (:func:`still_inside`)."""
    import apache_beam as beam

    pcoll = p | "Chunks" >> beam.Create(chunks)
    if not one_local_worker(p.options):  # one input file spreads over all workers
        pcoll = pcoll | "Spread" >> beam.Reshuffle()
    pcoll | "Encode" >> beam.ParDo(_encode_chunks_dofn(input_path or os.path.abspath(job.input), job, encoder_config,
                                                       shard_dir, root))


# ---------------------------------------------------------------- driver

def _build_dir(job: IndexJob, encoder_config: EncoderConfig, input_sha: str, flags: str = "") -> Path:
    """Where shards of this exact job live: same input and settings → same folder → resumable.
    ``flags``: the texts left out (FLAGS_FILE's contents; none: the key of before)."""
    encoder = {**asdict(encoder_config), "threads": None}  # thread count does not change the vectors
    text = list(job.text_fields) if len(job.text_fields) > 1 else job.text_field  # one field: the key of before
    left_out = {"misattributed": hashlib.sha256(flags.encode()).hexdigest()} if flags else {}
    key = hashlib.sha256(json.dumps({"input": input_sha, "encoder": encoder, "id": job.id_field, "text": text,
                                     "chunk_lines": job.chunk_lines, "chunk_bytes": job.chunk_bytes,
                                     "limits": asdict(job.limits), **left_out}, sort_keys=True).encode()).hexdigest()[:16]
    target = Path(job.index).absolute()
    return store.generations_dir(target) / f"build-{key}"


def _shard_dir(build: Path, options) -> str:
    """Where workers write shards: the local build folder, or under Beam's ``--temp_location`` (any
    FileSystems location: gs://, s3://, hdfs://, ...) so that workers need no shared mount."""
    temp = options.get_all_options().get("temp_location")
    if not temp:
        return str(build)
    owner = hashlib.sha256(str(build).encode()).hexdigest()[:8]  # the index path: two indexes never share shards
    return shardfs.join(temp, f"relsearch-{owner}-{build.name}")


def lines_done(shard_dir: str, finished: dict[str, int] | None = None) -> int:
    """Input lines done: all lines of finished shards, the progress so far of the others. Read
    from files, so it counts the work of any runner, worker processes and remote workers included.

    ``finished``: shard → its lines, kept by the caller between polls. A finished shard never
    changes, so its ``.npz`` is read once, not at every poll (a million-line corpus has ~500 of
    them, 1.5 GB of vectors)."""
    finished = {} if finished is None else finished
    for p in shardfs.names(shard_dir, ".npz"):
        stem = p[:-len(".npz")]
        if stem not in finished:
            try:
                with np.load(io.BytesIO(shardfs.read(p)), allow_pickle=False) as data:
                    finished[stem] = int(data["lines"])
            except (OSError, ValueError, KeyError):
                pass
    n = sum(finished.values())
    for p in shardfs.names(shard_dir, PROGRESS_SUFFIX):
        try:
            stem = p[:-len(PROGRESS_SUFFIX)]
            n += 0 if stem in finished or shardfs.exists(stem + ".npz") else int(shardfs.read(p))  # counted once
        except (OSError, ValueError):  # removed as its shard finished
            pass
    return n


def _watch_progress(shard_dir: str, total: int, already: int, stop: threading.Event, model: str | None = None) -> None:
    """Show progress (lines, updated per encoded batch) until ``stop`` is set. Until the first
    lines are done the bar says it is loading the model (~10 s on a CPU, the bar at 0% otherwise
    looks stuck), naming ``model``."""
    from tqdm import tqdm

    loading = f"loading the model {os.path.basename(str(model).rstrip('/'))} …" if model else "loading the model …"
    finished: dict[str, int] = {}
    with tqdm(total=total, initial=already, unit="line", desc=loading if already < total else "indexing",
              mininterval=0.5, smoothing=0.1) as bar:
        while True:
            stopped = stop.wait(0.5)
            n = lines_done(shard_dir, finished)
            if (n > already or stopped) and bar.desc != "indexing":
                bar.set_description_str("indexing", refresh=False)
            bar.update(n - bar.n)
            if stopped:
                break


def _threads_per_worker(options) -> int | None:
    """Local worker processes share the cores instead of oversubscribing them (None: one worker,
    or remote workers: the library's default)."""
    workers = local_workers(options)
    return max(1, (os.cpu_count() or 1) // workers) if workers > 1 else None


def run_index(job: IndexJob, beam_args: list[str] = (), *, bundle: Bundle | None = None) -> IndexReport:
    """Run the whole index job; publish the new index only if it is complete and valid.

    Raises IndexInputError (nothing published) for missing/empty/unusable input, and
    NoSpaceError (nothing published; the encoded shards kept to resume) when the disk fills up.
    """
    started = time.perf_counter()
    _check_job(job)
    bundle = bundle or _recorded_bundle(job) or load_bundle(job.model)
    options = pipeline_options(list(beam_args))
    encoder_config = EncoderConfig(model=bundle.encoder["model"], pooling=bundle.encoder.get("pooling"),
                                   max_length=job.max_length or bundle.encoder.get("max_length"),
                                   precision=job.precision, device=job.device, threads=_threads_per_worker(options))
    input_sha = sha256_file(job.input)
    # the dtype is decided here once (an append: the index's own), recorded in the manifest and run by
    # every worker and every query encoder of the index: no process probes the CPU for itself
    encoder_config, precision = settle_precision(encoder_config, recorded=_recorded_precision(job))
    chunks = plan_chunks(job.input, job.chunk_lines, job.chunk_bytes)
    flags = {} if job.keep_misattributed else belonging.check_corpus(
        job.input, id_field=job.id_field, text_field=job.text_field, text_fields=job.text_fields, limits=job.limits,
        name_field=job.collapse_field)
    flags_json = json.dumps({n: [asdict(f) for f in fs] for n, fs in flags.items()}, sort_keys=True) if flags else ""
    if not store.is_published(job.index) and not store._ours(Path(job.index).absolute()):
        raise FileExistsError(f"{job.index} exists and is not a relsearch index; choose another --index")
    root = store.index_dir(job.index)  # resolved once: every write of this run stays in it
    build = _build_dir(job, encoder_config, input_sha, flags_json)
    store.remove_stale_builds(job.index, keep=build)  # shards of other input: never let them fill the disk
    integrity.make_inside(root, build)
    with open(build / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise IndexInputError(f"another `relsearch index` is building {job.index} from the same input") from None
        shards = _shard_dir(build, options)
        resumed = [c for c in chunks if shardfs.exists(shardfs.join(shards, f"{c.number:06d}.npz"))]
        _encode_missing(job, chunks, resumed, encoder_config, options, root=root, build=build, shards=shards,
                        flags_json=flags_json)
        report = _publish_shards(job, bundle, chunks, input_sha, options, root=root, build=build, shards=shards,
                                 misattributed=[f"{f.id} {f.reason()}" for fs in flags.values() for f in fs])
        report.seconds, report.resumed_chunks, report.encoder = time.perf_counter() - started, len(resumed), precision
    shardfs.remove([shards])  # done: the shards are in the published index now
    _remove_build(root, build)
    report.published = True
    return report


def _check_job(job: IndexJob) -> None:
    """Refuse a job that cannot run, before any work: several text fields with the Elasticsearch
    mirror, unusable input. Also clears what killed runs left and upgrades an old layout."""
    if job.es is not None and len(job.text_fields) > 1:  # the mirror has one dense field; a lacking text is a zero vector
        raise IndexInputError("the Elasticsearch mirror holds an index of one text field; index several "
                              f"({', '.join(job.text_fields)}) without --es-url")
    spool.sweep(job.index)  # standard-input copies of killed runs: never let them fill the disk this run needs
    check_input(job.input)
    if store.legacy(job.index):  # an index of the old layout becomes one folder before its build folder is chosen
        with locking.writer_lock(job.index):
            pass


def _recorded_bundle(job: IndexJob) -> Bundle | None:
    """The bundle an append without --model encodes with: the one the published index records (None: none)."""
    if job.model is None and job.append and store.is_published(job.index):
        recorded = recorded_ref(store.read_manifest(store.current_generation(job.index)).bundle)
        return load_bundle(recorded) if recorded else None
    return None


def _encode_missing(job: IndexJob, chunks: list[Chunk], resumed: list[Chunk], encoder_config: EncoderConfig, options,
                    *, root: Path, build: Path, shards: str, flags_json: str) -> None:
    """Encode with Beam every chunk not ``resumed`` into ``shards``, with a progress bar when the
    job asks for one. A failure stopped by a link put in the way, or a full disk, says so in one line."""
    stop = threading.Event()  # no bar asked for (--quiet, the API): nothing polls the shard files
    watcher = threading.Thread(target=_watch_progress, daemon=True, args=(
        shards, sum(c.lines for c in chunks), sum(c.lines for c in resumed), stop, encoder_config.model))
    if job.progress:
        watcher.start()
    try:
        todo = [c for c in chunks if c not in resumed]
        if todo:  # a resumed run with every chunk encoded has nothing for Beam to do
            inside = str(root) if shards == str(build) else None  # shards in the index: kept inside it
            if flags_json:  # the workers leave these texts out
                still_inside(inside, shards)
                shardfs.write(shardfs.join(shards, FLAGS_FILE), flags_json.encode("utf-8"))
            staged = None
            if not shardfs.is_local(shards):  # remote workers read the input from beside the shards
                staged = shardfs.join(shards, "input.jsonl")
                shardfs.copy_in(job.input, staged)
            p = new_pipeline(options, build)
            build_pipeline(p, job, todo, encoder_config, shards, staged, inside)
            run_to_end(p)
    except Exception as e:
        integrity.check_inside(root, build)  # a worker stopped by a link put in the way: that, in one line
        store.raise_if_full(e, job.index, kept=build)
        raise
    finally:
        stop.set()
        if job.progress:
            watcher.join()


def _publish_shards(job: IndexJob, bundle: Bundle, chunks: list[Chunk], input_sha: str, options, *, root: Path,
                    build: Path, shards: str, misattributed: list[str]) -> IndexReport:
    """Publish the encoded ``shards`` (pipelines/publish.py). Input the same run would refuse again
    removes the shards and the build folder (nothing worth resuming); a full disk keeps them."""
    try:
        return publish(shards, job, bundle, chunks, input_sha, options=options, threads=_threads_per_worker(options),
                       scratch=build, misattributed=misattributed)
    except IndexInputError:  # the same input would fail the same way: nothing worth resuming
        shardfs.remove([shards])
        _remove_build(root, build)
        store.remove_if_empty(job.index)  # a first build of unusable input leaves no folder
        raise
    except Exception as e:
        store.raise_if_full(e, job.index, kept=build)
        raise


def _remove_build(root: Path, build: Path) -> None:
    """Remove the build folder, unless a link put in its way meanwhile leads out of the index (then
    it is left where it is: removing through the link could delete someone else's folder)."""
    try:
        integrity.check_inside(root, build)
    except integrity.IndexCorruptError:
        return
    shutil.rmtree(build, ignore_errors=True)


def _recorded_precision(job: IndexJob) -> str | None:
    """The precision an append encodes in: the one the published index records (manifest
    ``encoder.precision``; fp32 for an index built before it was recorded), whatever ``auto``
    would choose on this machine. Another explicit one is refused: one index, one dtype. None for
    a build (and an append to an index not published yet)."""
    if not (job.append and store.is_published(job.index)):
        return None
    recorded = store.read_manifest(store.current_generation(job.index)).precision
    if job.precision not in ("auto", recorded):
        raise IndexInputError(f"--append: {job.index} is encoded in {recorded} (its manifest's encoder.precision); "
                              f"--precision {job.precision} would mix two dtypes in one index. Leave --precision "
                              "out, or rebuild the index in the new precision")
    return recorded
