"""The lookup job: JSONL of document ids or new texts → Beam → one result line per answered input.

Graph (Beam does the parallel part; the driver merges and publishes)::

    chunks of input lines ─► Reshuffle ─► per chunk: parse ─► resolve ids (docstore, in batches)
        ─► group by the --same values ─► search in batches ─► result + rejected shard of the chunk

The driver cuts the input into chunks of whole lines as the index job does; a chunk is the unit
of parallel work, so the graph is the runner-neutral ``Create → Reshuffle → ParDo`` of
pipelines/runners.py and runs unchanged on the in-process runner, local worker processes or a
Dask cluster. One ``Searcher`` (index + bundle) is opened per worker process through Beam
``Shared``; each search batch is one ``Searcher.search`` call (matrix queries). Workers write
line-numbered shards named by chunk (a retried chunk overwrites its own) into a work folder beside
``--out``; the driver merges them in input-line order into temporary files and renames them into
place only when the counts reconcile, so a failed run never leaves a half-written results file.
"""
from __future__ import annotations

import heapq
import io
import json
import math
import os
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from ..indexer import records as rec
from ..indexer import store
from ..retrieval.export import write_csv
from ..retrieval.inputs import MAX_K, FilterValue, check_at_most
from .index import Chunk, IndexInputError, check_input, plan_chunks, read_numbered_lines
from . import shardfs
from .runners import freeze_long_lived, one_local_worker, pipeline_options, run_to_end

# Rejection reasons beyond indexer/records.py's (stable strings: they appear in the rejected file).
UNKNOWN_ID = "unknown-id"
MISSING_SAME_FIELD = "missing-same-field"

RESULTS_SUFFIX = ".results"
REJECTED_SUFFIX = ".rejected"
STATS_SUFFIX = ".stats.json"
MERGE_FAN_IN = 128  # shards merged at once (open files)


class LookupInputError(ValueError):
    """The job cannot run at all (missing input, unknown relation or field, bad options)."""


@dataclass(frozen=True, kw_only=True)
class LookupJob:
    """What to look up. ``relations``: name → weight (a mixture is one query vector);
    ``filters``: exact metadata matches for every query; ``same``: metadata fields whose value must
    equal the query document's own value; ``collapse``: a metadata field of which each input's
    results hold each value at most once (its best hit), and never the query document's own value
    (GOOG's peers, collapsed on a field naming the company, list no GOOGL: :func:`peers`). What
    each result carries: ``id`` and ``score``, ``text`` with ``with_text``, and ``metadata``: the
    named ``fields`` only, every field with ``with_metadata``, else none (``{}``: a company's
    metadata holds long texts)."""

    input: str
    index: str
    out: str
    relations: Mapping[str, float] = field(default_factory=lambda: {"identity": 1.0})
    k: int = 20
    filters: Mapping[str, FilterValue] = field(default_factory=dict)  # typed as retrieval/inputs.filter_value
    same: tuple[str, ...] = ()
    collapse: str | None = None  # None: the index's recorded collapse field (manifest ``collapse``), if any
    no_collapse: bool = False  # collapse on nothing, not even the recorded field
    field: str | None = None  # one named text field of an index of several (None: all, fused: retrieval/fields.py)
    model: str | None = None  # None: the bundle recorded in the index manifest
    with_text: bool = False
    fields: tuple[str, ...] = ()  # metadata fields each result keeps
    with_metadata: bool = False  # every metadata field (default: none unless ``fields``)
    batch_size: int = 256  # queries per Searcher.search call
    id_field: str = "id"
    text_field: str = "text"
    chunk_lines: int = 4096  # input lines per chunk: the unit of parallel work
    format: str = "jsonl"  # of ``out``; "csv": a row per result (retrieval/export.py), query = the query_id

    def __post_init__(self):
        try:
            check_at_most("k", self.k, MAX_K)
        except ValueError as e:
            raise LookupInputError(str(e)) from None
        if self.format not in ("jsonl", "csv"):
            raise LookupInputError(f"format must be jsonl or csv, got {self.format!r}")
        if self.batch_size < 1:
            raise LookupInputError(f"batch_size must be at least 1, got {self.batch_size}")
        if self.fields and self.with_metadata:
            raise LookupInputError("give --fields (those metadata fields) or --with-metadata (all), not both")
        both = sorted(set(self.same) & set(self.filters))
        if both:
            raise LookupInputError(f"--filter and --same both name {', '.join(both)}; use one of them per field")
        if self.collapse is not None and (not isinstance(self.collapse, str) or not self.collapse):
            raise LookupInputError(f"collapse must be a metadata field name, got {self.collapse!r}")
        if self.no_collapse and self.collapse is not None:
            raise LookupInputError("give --collapse FIELD or --no-collapse, not both")
        if self.collapse in self.same:  # every result would share the query's value, which collapse drops
            raise LookupInputError(f"--same and --collapse both name {self.collapse}: every result would share "
                                   "the query's value, and --collapse drops that value; use one of them")


def rejected_path(out: str) -> str:
    """``RESULTS.jsonl`` (or ``.csv``) → ``RESULTS.rejected.jsonl`` (any other name: ``NAME.rejected.jsonl``)."""
    stem = next((out[:-len(end)] for end in (".jsonl", ".csv") if out.endswith(end)), out)
    return stem + ".rejected.jsonl"


@dataclass
class LookupReport:
    out: str
    rejected_path: str
    read: int
    answered: int
    rejected: int
    reasons: Counter = field(default_factory=Counter)
    seconds: float = 0.0  # the whole run, wall clock (Beam start-up, parse, merge, write included)
    id_lookups: int = 0
    id_search_seconds: float = 0.0  # inside Searcher.search for id inputs, summed over batches and workers
    text_lookups: int = 0
    text_search_seconds: float = 0.0  # the same for new-text inputs: includes encoding the texts
    warnings: list[str] = field(default_factory=list)  # --filter operators that can never match (Searcher.filter_warnings)

    def summary(self) -> str:
        line = f"read {self.read}, answered {self.answered}, rejected {self.rejected}"
        if self.reasons:
            line += " (" + ", ".join(f"{r}: {n}" for r, n in self.reasons.most_common()) + ")"
        return line

    def throughput(self) -> str:
        parts = []
        if self.id_lookups:
            parts.append(f"{self.id_lookups / max(self.id_search_seconds, 1e-9):,.0f} id lookups/s "
                         f"({self.id_lookups} in {self.id_search_seconds:.3f} s of search, summed over workers)")
        if self.text_lookups:
            parts.append(f"{self.text_lookups / max(self.text_search_seconds, 1e-9):,.0f} new-text lookups/s "
                         f"({self.text_lookups} in {self.text_search_seconds:.3f} s, encoding included)")
        parts.append(f"end to end {self.answered / max(self.seconds, 1e-9):,.0f} lookups/s "
                     f"({self.answered} in {self.seconds:.2f} s wall, Beam start-up and I/O included)")
        return "; ".join(parts)


@dataclass(frozen=True)
class LookupInput:
    """One parsed input line. ``text`` None: look up the indexed document ``id``.
    ``same``: ((field, value), ...) for --same, from the line (new text) or the docstore (ids).
    ``group``: (value,) of the --collapse field, from the same place; () when it has none."""

    line: int
    id: str
    text: str | None = None
    same: tuple[tuple[str, FilterValue], ...] = ()
    group: tuple = ()


# ---------------------------------------------------------------- pure per-element functions

def parse_lookup_line(line_no: int, raw: bytes, *, id_field: str = "id", text_field: str = "text",
                      same: tuple[str, ...] = (), collapse: str | None = None) -> LookupInput | rec.Rejection:
    """One input line → LookupInput or Rejection; a line without text (or text null) names an indexed id.
    New text is a document of its own: its --same and --collapse values are the line's."""
    parsed = rec.parse_line(line_no, raw, id_field=id_field, text_field=text_field)
    if isinstance(parsed, rec.Record):
        values = same_values(parsed.metadata, same)
        if isinstance(values, str):
            return rec.Rejection(line_no, MISSING_SAME_FIELD, f"the line (new text) has {values}",
                                 raw[:500].decode("utf-8", "replace"))
        return LookupInput(line_no, parsed.id, parsed.text, values, own_group(parsed.metadata, collapse))
    if parsed.reason in (rec.MISSING_TEXT, rec.NULL_TEXT):  # id and JSON already validated by parse_line (BOM and all)
        return LookupInput(line_no, str(rec.decode_line(line_no, raw)[id_field]).strip())
    return parsed


def same_values(metadata: dict, fields: tuple[str, ...]) -> tuple[tuple[str, FilterValue], ...] | str:
    """((field, value), ...) to filter on (matched with its JSON type), or a message naming the first
    unusable field."""
    out = []
    for f in fields:
        v = metadata.get(f)
        if v is None:
            return f"no value for {f!r} (--same {f})"
        if isinstance(v, (dict, list)):
            return f"a {type(v).__name__} for {f!r}, not a single value (--same {f})"
        out.append((f, v))
    return tuple(out)


def own_group(metadata: dict, collapse: str | None) -> tuple:
    """(the value of ``collapse`` in ``metadata``,), or () without one (a document lacking the field
    is a group of its own, as collapse has it: retrieval/paging.py)."""
    return (metadata[collapse],) if collapse is not None and collapse in metadata else ()


def resolve_batch(batch: list[LookupInput], searcher, same: tuple[str, ...], collapse: str | None = None):
    """Reject unknown ids; fill ``same`` and ``group`` of id inputs from the docstore. Yields inputs or Rejections."""
    ids = [x.id for x in batch if x.text is None]
    positions = searcher.files.docstore.positions(ids) if ids else {}
    wanted = same or collapse is not None
    docs = searcher.files.docstore.get(list(positions.values())) if wanted and positions else {}
    for x in batch:
        if x.text is None:
            if x.id not in positions:
                yield rec.Rejection(x.line, UNKNOWN_ID,
                                    f"id {x.id!r} is not in the index; give a 'text' to look up new text")
                continue
            if same:
                values = same_values(docs[positions[x.id]]["metadata"], same)
                if isinstance(values, str):
                    yield rec.Rejection(x.line, MISSING_SAME_FIELD, f"indexed document {x.id!r} has {values}")
                    continue
                x = replace(x, same=values)
            if collapse is not None:
                x = replace(x, group=own_group(docs[positions[x.id]]["metadata"], collapse))
        yield x


def search_batch(batch: list[LookupInput], searcher, job: LookupJob, clock=time.perf_counter):
    """Answer a batch whose inputs share ``same`` values: one search for the id inputs, one for the
    new texts (a relation alone runs its recipe, as ``relsearch query`` does; :func:`peers`).
    Returns ((line, result JSON line) rows, stats counts)."""
    from ..retrieval.search import Query

    filters = {**job.filters, **dict(batch[0].same)}
    relations = dict(job.relations)
    by_id = [x for x in batch if x.text is None]
    by_text = [x for x in batch if x.text is not None]
    stats = {"id_lookups": len(by_id), "id_seconds": 0.0, "text_lookups": len(by_text), "text_seconds": 0.0}
    rows = []
    if by_id:
        started = clock()
        hits = peers(searcher, by_id, [Query(doc_id=x.id, relations=relations, query_id=x.id) for x in by_id],
                     job, filters)
        stats["id_seconds"] = clock() - started
        rows += zip(by_id, hits)
    if by_text:
        searcher.encoder  # load the transformer (once per process) outside the timed search
        started = clock()
        hits = peers(searcher, by_text, [Query(text=x.text, relations=relations, query_id=x.id) for x in by_text],
                     job, filters)
        stats["text_seconds"] = clock() - started
        rows += zip(by_text, hits)
    return [(x.line, json.dumps({"query_id": x.id, "results": [_hit_json(h, job) for h in hits]},
                                ensure_ascii=False)) for x, hits in rows], stats


@dataclass(frozen=True)
class _OwnGroup:
    """A stand-in for the query document, put ahead of its hits: collapse (retrieval/paging.py) keeps
    it as its value's one hit, so every real hit sharing the query's value drops out, the values
    compared as collapse compares them (JSON types). :func:`peers` removes it afterwards."""

    metadata: dict
    score: float = math.inf


def peers(searcher, inputs: list[LookupInput], queries: list, job: LookupJob, filters: dict) -> list[list]:
    """Each input's top ``job.k`` hits for its query (one plan, retrieval/request.py), never the input's
    own id: an indexed document is never its own hit, and new text sent under an indexed id must not
    get that document back (dropped before collapsing, so it hides no other hit of its group). With
    ``job.collapse``: one hit per value of that field, none sharing the input's own value
    (``group``), the search widening as ``relsearch query --collapse`` widens (paging.search_collapsed)."""
    from ..retrieval.paging import search_collapsed
    from ..retrieval.request import SearchOptions, plan

    found = plan(searcher, queries, SearchOptions(k=job.k, filters=filters, field=job.field, collapse=False))
    own_id = any(x.text is not None for x in inputs)  # one extra hit fetched, in case it is the input's own

    def fetch(n: int) -> list[list]:
        ranked = found.top(n + 1) if own_id else found.top(n)
        ranked = [[h for h in hits if h.id != x.id][:n] for x, hits in zip(inputs, ranked)] if own_id else ranked
        if job.collapse is None:
            return ranked
        return [([_OwnGroup({job.collapse: x.group[0]})] if x.group else []) + hits for x, hits in zip(inputs, ranked)]

    if job.collapse is None:
        return fetch(job.k)
    # one group more than k: the stand-in's, when the input has a value
    ranked = search_collapsed(fetch, need=job.k + 1, field=job.collapse, limit=searcher.live_count)
    return [[h for h in hits if not isinstance(h, _OwnGroup)][:job.k] for hits in ranked]


def _hit_json(hit, job: LookupJob) -> dict:
    out = hit.shaped(job.fields or None, metadata=bool(job.fields) or job.with_metadata).to_json()
    if not job.with_text:
        out.pop("text", None)
    return out


def _batches(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def lookup_chunk(chunk: Chunk, searcher, job: LookupJob, work_dir: str) -> None:
    """Answer one chunk of input lines into ``NNNNNN.results`` / ``.rejected`` / ``.stats.json`` in ``work_dir``:
    parse, resolve ids in batches, then search in batches of inputs sharing their --same values (each
    batch one exact search within its matching subset)."""
    parsed = [parse_lookup_line(n, raw, id_field=job.id_field, text_field=job.text_field, same=job.same,
                                collapse=job.collapse)
              for n, raw in read_numbered_lines(job.input, chunk.start, chunk.end, chunk.first_line,
                                                opener=shardfs.open_binary)]
    rejected = [x for x in parsed if isinstance(x, rec.Rejection)]
    groups: dict[tuple, list[LookupInput]] = {}
    for batch in _batches([x for x in parsed if isinstance(x, LookupInput)], job.batch_size):
        for x in resolve_batch(batch, searcher, job.same, job.collapse):
            if isinstance(x, rec.Rejection):
                rejected.append(x)
            else:
                groups.setdefault(x.same, []).append(x)
    rows, stats = [], Counter()
    for group in groups.values():
        for batch in _batches(group, job.batch_size):
            found, counts = search_batch(batch, searcher, job)
            rows += found
            stats.update(counts)
    name = f"{chunk.number:06d}"
    _write_shard(work_dir, name + RESULTS_SUFFIX, rows)
    _write_shard(work_dir, name + REJECTED_SUFFIX,
                 [(r.line, json.dumps(r.to_json(), ensure_ascii=False)) for r in rejected])
    shardfs.write(shardfs.join(work_dir, name + STATS_SUFFIX), json.dumps(dict(stats)).encode())


def _write_shard(work_dir: str, name: str, rows: list[tuple[int, str]]) -> None:
    """Rows (line number, one JSON line) sorted by line, as ``LINE<TAB>JSON`` (JSON escapes tabs)."""
    if rows:
        rows.sort(key=lambda r: r[0])
        shardfs.write(shardfs.join(work_dir, name), "".join(f"{n}\t{s}\n" for n, s in rows).encode("utf-8"))


def open_searcher(index: str, model: str | None, *, warm_faiss: bool):
    """A Searcher on one index generation; ``warm_faiss`` loads FAISS now rather than in the first search."""
    from ..retrieval.search import Searcher

    searcher = Searcher(index, model)
    if warm_faiss:
        searcher.files.faiss  # noqa: B018 (a lazy property)
    return searcher


class _Holder:  # Shared keeps only a weak reference: the DoFn holds this object strongly
    def __init__(self, value):
        self.value = value


def _lookup_dofn(handle, opener, tag: str, job: LookupJob, work_dir: str):
    """A DoFn answering chunks with one Searcher per worker process (Beam ``Shared``)."""
    import apache_beam as beam

    class LookupChunks(beam.DoFn):
        def setup(self):
            self._holder = handle.acquire(lambda: _Holder(opener()), tag=tag)

        def process(self, chunk):
            lookup_chunk(chunk, self._holder.value, job, work_dir)

    return LookupChunks()


def build_pipeline(p, job: LookupJob, chunks: list[Chunk], work_dir: str, *, handle, opener, tag: str) -> None:
    """Wire the Beam graph onto ``p``; outputs are shard files in ``work_dir``."""
    import apache_beam as beam

    pcoll = p | "Chunks" >> beam.Create(chunks)
    if not one_local_worker(p.options):  # spread one input file across workers
        pcoll = pcoll | "Spread" >> beam.Reshuffle()
    pcoll | "Lookup" >> beam.ParDo(_lookup_dofn(handle, opener, tag, job, work_dir))


# ---------------------------------------------------------------- driver

def run_lookup(job: LookupJob, beam_args: Iterable[str] = (), *, clock=time.perf_counter) -> LookupReport:
    """Run the lookup job; write ``job.out`` and its rejected file atomically, in input-line order.

    ``beam_args`` pass through to Beam (``--runner``, ``--direct_num_workers``, ...); without ``--runner``
    the in-process FnApiRunner runs it. Raises LookupInputError (nothing written) when the job cannot run:
    missing/empty input, no index, unknown relation, unknown --filter/--same/--fields/--collapse field.
    """
    from apache_beam.utils import shared

    started = clock()
    job, total = _checked_input(job)
    # every worker reads this generation folder, even if the index is rebuilt meanwhile
    generation = str(store.current_generation(job.index) or job.index)
    opener = partial(open_searcher, generation, job.model, warm_faiss=not (job.filters or job.same))
    searcher, job, warnings = _open_checked(job, opener)
    handle, tag = shared.Shared(), repr((generation, job.model))
    # in-process runners find this Searcher in the Shared cache instead of opening another
    holder = handle.acquire(lambda: _Holder(searcher), tag=tag)
    try:
        report = _run_pipeline(job, total, beam_args, handle=handle, opener=opener, tag=tag)
    finally:
        del holder
    report.seconds = clock() - started
    report.warnings = warnings
    return report


def _checked_input(job: LookupJob) -> tuple[LookupJob, int]:
    """``job`` with absolute input and model paths (workers of a cluster do not share our working
    directory) and its input's line count; missing or empty input, or no index, is refused."""
    job = replace(job, input=os.path.abspath(job.input),
                  model=os.path.abspath(job.model) if job.model and os.path.exists(job.model) else job.model)
    try:
        total = check_input(job.input)
    except IndexInputError as e:
        raise LookupInputError(str(e)) from e
    if not os.path.exists(job.index):
        raise LookupInputError(f"no index at {job.index}; build one with `relsearch index CORPUS.jsonl --index {job.index}`")
    return job, total


def _open_checked(job: LookupJob, opener) -> tuple[object, LookupJob, list[str]]:
    """The driver's searcher, opened once, with ``job`` checked against its index (relations,
    filters, --field, --same, --fields, --collapse), the index's recorded collapse field filled in,
    and the filters' warnings. Raises LookupInputError for what the index does not have."""
    from ..retrieval.search import QueryError

    try:
        searcher = opener()
        freeze_long_lived()  # the index and its libraries are loaded: what the job allocates from now on is its own
        searcher.check(dict(job.relations), dict(job.filters))
        if job.field is not None:
            searcher.for_field(job.field)  # QueryError listing the index's text fields for another name
        recorded = searcher.files.manifest.collapse  # share classes of one issuer (relsearch index --collapse-field)
        if job.collapse is None and not job.no_collapse and recorded and recorded not in job.same:
            job = replace(job, collapse=recorded)
        warnings = searcher.filter_warnings(dict(job.filters))
        collapse = (job.collapse,) if job.collapse is not None else ()
        for option, names in (("--same", job.same), ("--fields", job.fields), ("--collapse", collapse)):
            unknown = [f for f in names if f not in searcher.metadata_fields]
            if unknown:
                raise QueryError(f"unknown {option} field {unknown[0]!r}; metadata fields: "
                                 f"{', '.join(searcher.metadata_fields) or '(none)'}")
    except KeyError as e:
        raise LookupInputError(e.args[0]) from e
    except (QueryError, FileNotFoundError, ValueError) as e:
        raise LookupInputError(str(e)) from e
    return searcher, job, warnings


def _run_pipeline(job: LookupJob, total: int, beam_args: Iterable[str], *, handle, opener, tag: str) -> LookupReport:
    """Run the Beam pipeline over ``job``'s input and assemble its shards into ``job.out``; the
    work folder beside it and the shards are removed whatever happens."""
    import apache_beam as beam

    out = Path(job.out).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.parent / f".{out.name}.work-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    options = pipeline_options(list(beam_args))
    temp = options.get_all_options().get("temp_location")
    # shards where the workers can write them: beside --out, or under Beam's --temp_location (gs://, s3://, ...)
    shards = shardfs.join(temp, f"relsearch-lookup-{work.name[-8:]}") if temp else str(work)
    try:
        chunks = plan_chunks(job.input, job.chunk_lines)
        if not shardfs.is_local(shards):  # remote workers read the input from beside the shards
            staged = shardfs.join(shards, "input.jsonl")
            shardfs.copy_in(job.input, staged)
            job = replace(job, input=staged)
        p = beam.Pipeline(options=options)
        build_pipeline(p, job, chunks, shards, handle=handle, opener=opener, tag=tag)
        run_to_end(p)
        return _assemble(work, shards, job, total)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if shards != str(work):
            shardfs.remove([shards])


def _assemble(work: Path, shards: str, job: LookupJob, total: int) -> LookupReport:
    """Merge the shards in ``shards`` by line number into temp files in ``work``; rename into place if
    counts reconcile."""
    report = LookupReport(out=job.out, rejected_path=rejected_path(job.out), read=total, answered=0, rejected=0)
    with open(work / "rejected.jsonl", "w", encoding="utf-8", newline="\n") as f:
        for _, row in _merged(_fan_in(shardfs.names(shards, REJECTED_SUFFIX), work)):
            f.write(row + "\n")
            report.rejected += 1
            report.reasons[json.loads(row)["reason"]] += 1
    with open(work / "results.jsonl", "w", encoding="utf-8", newline="\n") as f:
        for _, row in _merged(_fan_in(shardfs.names(shards, RESULTS_SUFFIX), work)):
            f.write(row + "\n")
            report.answered += 1
    for p in shardfs.names(shards, STATS_SUFFIX):
        stats = json.loads(shardfs.read(p))
        report.id_lookups += stats.get("id_lookups", 0)  # a chunk without a search has no counts
        report.id_search_seconds += stats.get("id_seconds", 0.0)
        report.text_lookups += stats.get("text_lookups", 0)
        report.text_search_seconds += stats.get("text_seconds", 0.0)
    if report.answered + report.rejected != report.read:  # a bug, never user error: write nothing
        raise RuntimeError(f"counts do not reconcile: {report.summary()}")
    os.replace(work / "rejected.jsonl", report.rejected_path)
    os.replace(_as_csv(work / "results.jsonl") if job.format == "csv" else work / "results.jsonl", job.out)
    return report


def _as_csv(path: Path) -> Path:
    """The merged results at ``path`` as CSV beside it: read twice (header, rows), never held whole."""
    def answers() -> Iterator[tuple[str, list[dict]]]:
        with open(path, encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                yield row["query_id"], row["results"]

    out = path.with_suffix(".csv")
    with open(out, "w", encoding="utf-8", newline="") as f:
        write_csv(f, answers)
    return out


def _read_shard(path: str) -> Iterator[tuple[int, str]]:
    with io.TextIOWrapper(shardfs.open_binary(str(path)), encoding="utf-8", newline="\n") as f:
        for line in f:
            n, _, row = line.rstrip("\n").partition("\t")
            yield int(n), row


def _merged(paths: list[Path]) -> Iterator[tuple[int, str]]:
    """Line-sorted shards → one stream in line order; a line written twice (a retried bundle) counts once."""
    last = None
    for n, row in heapq.merge(*(_read_shard(p) for p in paths), key=lambda r: r[0]):
        if n != last:
            yield n, row
            last = n


def _fan_in(paths: list[Path], work: Path) -> list[Path]:
    """Pre-merge groups of shards until at most MERGE_FAN_IN remain (bounded open files)."""
    while len(paths) > MERGE_FAN_IN:
        merged = []
        for i in range(0, len(paths), MERGE_FAN_IN):
            dest = work / f"merge-{uuid.uuid4().hex}"
            with open(dest, "w", encoding="utf-8", newline="\n") as f:
                f.writelines(f"{n}\t{row}\n" for n, row in _merged(paths[i:i + MERGE_FAN_IN]))
            merged.append(dest)
        paths = merged
    return paths
