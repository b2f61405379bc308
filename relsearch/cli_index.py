"""``relsearch index``, ``delete`` and ``compact``: build, mutate and rebuild an index.

Registered in :mod:`relsearch.cli`; kept free of imports from it so either module can load first.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys

import click

from relsearch.indexer.records import DEFAULT_LIMITS


def es_options(f):
    """--es-url / --es-index / credentials options shared by the writing commands."""
    for decorator in reversed([
        click.option("--es-url", default=None, help="Also mirror the published corpus into this Elasticsearch "
                     "(credentials: RELSEARCH_ES_API_KEY, RELSEARCH_ES_USER/PASSWORD or --es-credentials)."),
        click.option("--es-index", default=None, help="Elasticsearch alias the mirror is published under."),
        click.option("--es-credentials", type=click.Path(exists=True, dir_okay=False), default=None,
                     help='JSON file {"api_key": ...} or {"username": ..., "password": ...}.'),
        click.option("--es-ca-certs", type=click.Path(exists=True, dir_okay=False), default=None),
        click.option("--es-index-type", default="int8_hnsw", show_default=True,
                     help="dense_vector index_options.type (hnsw, int8_hnsw, flat, ...)."),
        click.option("--es-keep-old", is_flag=True, help="Keep the Elasticsearch indices the alias leaves."),
    ]):
        f = decorator(f)
    return f


def es_target(es_url, es_index, es_credentials, es_ca_certs, es_index_type, es_keep_old):
    from relsearch.indexer.es_mirror import EsTarget

    if (es_url is None) != (es_index is None):
        raise click.UsageError("--es-url and --es-index go together")
    if es_url is None:
        return None
    try:
        return EsTarget(url=es_url, alias=es_index, credentials_file=es_credentials, ca_certs=es_ca_certs,
                        index_type=es_index_type, keep_old=es_keep_old)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--es-index") from None


def _echo_backends(backends: dict) -> None:
    es = backends.get("elasticsearch")
    if es and not es.get("stale"):
        click.echo(f"elasticsearch: {es['alias']} -> {es['index']}: read {es['read']}, indexed {es['indexed']}, "
                   f"rejected {es['rejected']}" + (f" (see {es['rejected_file']})" if es["rejected"] else ""))


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("corpus", type=click.Path(dir_okay=False))
@click.option("--index", "index_dir", required=True, type=click.Path(file_okay=True), help="Index folder to (re)build.")
@click.option("--model", default=None, help="Relation bundle folder, or any Hugging Face model id/path (identity "
              "only). Default: the shipped relation pack (with --append: the index's own bundle or model).")
@click.option("--id-field", default="id", show_default=True)
@click.option("--text-field", "text_fields", multiple=True, default=["text"], show_default=True,
              help="The field holding the text. Repeat it to index several named texts per document "
                   "(--text-field text --text-field text_wikipedia): each gets its own vectors and BM25, a record "
                   "with any of them is indexed, and queries search them fused or one with --field.")
@click.option("--collapse-field", default=None, help="A metadata field whose equal values are one issuer (share "
              "classes, e.g. name): recorded in the index, and queries collapse on it unless told --no-collapse.")
@click.option("--keep-misattributed", is_flag=True, help="Index every text. By default a text about another "
              "record of the corpus (its subject is another's name, or it copies another's text; names from "
              "--collapse-field or name) is left out of its record's vectors and reported.")
@click.option("--faiss-index", "faiss_factory", default="auto", show_default=True,
              help="auto (by corpus size: Flat, IVF, IVF-PQ + re-rank) or a FAISS index-factory string, "
                   "e.g. Flat, HNSW32, IVF1024,Flat.")
@click.option("--recall-target", type=click.FloatRange(0, 1, min_open=True), default=0.95, show_default=True,
              help="recall@10 against exact search that the build-time tuned search parameters must reach.")
@click.option("--faiss-device", type=click.Choice(["auto", "cpu"]), default="auto", show_default=True,
              help="auto: train and add on the GPU when faiss-gpu sees a CUDA device.")
@click.option("--faiss-add-units", type=click.IntRange(min=0), default=0, show_default=True,
              help="A CPU-built IVF index is trained once here and filled on the Beam workers in this many units, "
                   "then merged. 0: one unit per million documents; 1: the driver adds everything.")
@click.option("--append", is_flag=True, help="Add CORPUS to the published index as a new segment; a known id "
              "replaces its document.")
@click.option("--max-segments", type=click.IntRange(min=2), default=None,
              help="With --append: merge neighbouring appended segments when more than this many would remain "
                   "(recorded in the index; default 10).")
@click.option("--chunk-lines", default=2048, show_default=True,
              help="Lines per chunk: the unit of parallel work and resumption.")
@click.option("--max-length", type=click.IntRange(min=1), default=None, help="Token limit per text (default: the model's).")
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16"]), default="auto", show_default=True,
              help="Encoder dtype, decided once here and recorded in the index (manifest encoder.precision); every "
                   "query of the index encodes in it, on any machine. auto: fp16 on CUDA, bf16 on a CPU where a "
                   "probe finds it faster, else fp32. With --append: the index's recorded one (another is refused).")
@click.option("--workers", type=int, default=None, help="Local Beam worker processes (default: in-process).")
@click.option("--strict", is_flag=True, help="Exit non-zero (and keep the old index) if any line is rejected.")
@click.option("--max-line-bytes", type=click.IntRange(min=1), default=DEFAULT_LIMITS.max_line_bytes,
              show_default=True, help="Longer input lines are rejected (line-too-long) without being parsed.")
@click.option("--max-text-bytes", type=click.IntRange(min=1), default=DEFAULT_LIMITS.max_text_bytes,
              show_default=True, help="Longer texts are rejected (text-too-long). Texts longer than the model's "
              "window are truncated and counted, not rejected.")
@click.option("--max-metadata-bytes", type=click.IntRange(min=1), default=DEFAULT_LIMITS.max_metadata_bytes,
              show_default=True,
              help="Records whose other fields exceed this as JSON are rejected (metadata-too-large).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@es_options
@click.pass_context
def index(ctx, corpus, index_dir, model, id_field, text_fields, collapse_field, keep_misattributed, faiss_factory,
          recall_target, faiss_device, faiss_add_units, append, max_segments, chunk_lines, max_length, precision,
          workers, strict, max_line_bytes, max_text_bytes, max_metadata_bytes, quiet, **es):
    """Encode CORPUS (JSONL; - reads standard input) with a Beam pipeline into a FAISS index + docstore at --index.

    Unknown options (--runner, --direct_num_workers, ...) pass through to Apache Beam. The new
    index replaces the old one atomically, and only when the run succeeds.
    """
    from relsearch.indexer.records import Limits
    from relsearch.pipelines.index import IndexJob

    # a failing Beam step logs its traceback before the error reaches here; it is reported below in one line
    logging.getLogger("apache_beam.runners.common").setLevel(logging.CRITICAL)
    beam_args = list(ctx.args)
    if workers and workers > 1:
        beam_args += [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
    text_fields = tuple(text_fields)
    if len(set(text_fields)) != len(text_fields) or id_field in text_fields:
        raise click.BadParameter(f"{', '.join(text_fields)}: name each text field once, and not the id field",
                                 param_hint="--text-field")
    job = IndexJob(input=corpus, index=index_dir, model=model, id_field=id_field, text_field=text_fields[0],
                   text_fields=text_fields if len(text_fields) > 1 else (), collapse_field=collapse_field,
                   keep_misattributed=keep_misattributed,
                   faiss_factory=faiss_factory, recall_target=recall_target, faiss_device=faiss_device,
                   faiss_add_units=faiss_add_units, append=append, max_segments=max_segments, es=es_target(**es), chunk_lines=chunk_lines,
                   max_length=max_length, precision=precision, strict=strict, progress=not quiet,
                   limits=Limits(max_line_bytes, max_text_bytes, max_metadata_bytes))
    _echo_report(_run(job, beam_args), index_dir, append)


def _run(job, beam_args: list[str]):
    """Run the index job (its input copied from standard input first when it is ``-``); a failure
    is one line, with the spool's path said as stdin."""
    from relsearch.indexer.spool import signals_exit, spooled
    from relsearch.pipelines.index import IndexInputError, run_index

    spool = None
    try:  # SIGTERM / SIGHUP leave through the finally blocks (the spool, a half-written generation) as Ctrl-C does
        with signals_exit(), contextlib.ExitStack() as stack:
            if job.input == "-":
                spool = stack.enter_context(spooled(sys.stdin.buffer, job.index))
                job = dataclasses.replace(job, input=spool)
            return run_index(job, beam_args)
    except (IndexInputError, FileExistsError, ValueError, RuntimeError) as e:
        raise click.ClickException(str(e).replace(spool, "stdin") if spool else str(e)) from None
    except OSError as e:  # disk full, permissions: the previous index is untouched
        name = "stdin" if spool and e.filename == spool else e.filename
        raise click.ClickException(f"{e.strerror or e}{f': {name}' if name else ''}; "
                                   "nothing was published") from None


def _echo_report(report, index_dir: str, append: bool) -> None:
    """Say what the index run did: resumed chunks, counts, encoder, truncations, rejections, texts
    left out, FAISS and its tuning, the mirrors, and where the index is."""
    if report.resumed_chunks:
        click.echo(f"resumed: {report.resumed_chunks} chunks were already encoded by an interrupted run")
    click.echo(report.summary() + (f" (replaced {report.replaced})" if append else ""))
    if report.encoder:
        click.echo(f"encoder: {report.encoder}")
    if report.truncated:
        click.echo(f"{report.truncated} texts were longer than the encoder's max length and were truncated")
    if report.rejected:
        click.echo(f"rejected lines: {os.path.join(index_dir, 'rejected.jsonl')}")
    if report.misattributed:
        shown = "; ".join(report.misattributed[:3]) + (" …" if len(report.misattributed) > 3 else "")
        click.echo(f"misattributed: {len(report.misattributed)} texts not about their record left out of its "
                   f"vectors (--keep-misattributed keeps them; all in the manifest's runs): {shown}")
    faiss = report.faiss
    tuning = faiss.get("tuning", {})
    click.echo(f"faiss: {faiss.get('factory')} ({faiss.get('tier')}), search params {faiss.get('search_params')}"
               + (f", recall@{tuning['config']['k']} {tuning['validation_recall']}" if tuning.get("validation_recall")
                  is not None and not append else ""))
    _echo_backends(report.backends)
    click.echo(f"index: {index_dir} ({report.documents} documents, {report.seconds:.1f} s)")


def read_ids(path: str) -> list[str]:
    """One id per line; a JSON object line gives its "id"; blank lines are skipped.

    Never fails on content: bytes that are not UTF-8 (and JSON escapes of lone surrogates) become
    U+FFFD, so such a line matches no document and is reported as not found; a line longer than
    the default --max-line-bytes is cut there.
    """
    from relsearch.indexer.records import BOM, read_numbered_lines

    ids = []
    for _, raw in read_numbered_lines(path):
        line = raw.removeprefix(BOM).decode("utf-8", errors="replace").strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                obj = None
            if isinstance(obj, dict) and obj.get("id") is not None:
                line = str(obj["id"]).strip()
        if line:
            ids.append(line.encode("utf-8", errors="replace").decode("utf-8"))  # lone surrogates → "?"
    return ids


@click.command()
@click.option("--index", "index_dir", required=True, type=click.Path(), help="Published index to delete from.")
@click.option("--ids", "ids_file", required=True, type=click.Path(exists=True, dir_okay=False),
              help="File with one document id per line (or JSONL with an \"id\" field).")
@es_options
def delete(index_dir, ids_file, **es):
    """Remove documents by id, as one new generation published atomically."""
    from relsearch.indexer import mutations
    from relsearch.indexer.es_mirror import mirrors_for

    try:
        report = mutations.delete(index_dir, read_ids(ids_file), mirrors=mirrors_for(es_target(**es)))
    except (OSError, ValueError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
    _report_mutation(report, index_dir)


@click.command()
@click.option("--index", "index_dir", required=True, type=click.Path(), help="Published index to compact.")
@es_options
def compact(index_dir, **es):
    """Rebuild the index from its live documents: drops tombstones, renumbers, re-tunes."""
    from relsearch.indexer import mutations
    from relsearch.indexer.es_mirror import mirrors_for

    try:
        report = mutations.compact(index_dir, mirrors=mirrors_for(es_target(**es)))
    except (OSError, ValueError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
    _report_mutation(report, index_dir)


@click.command()
@click.option("--index", "index_dir", required=True, type=click.Path(), help="Published index.")
@click.option("--keep", type=int, default=None,
              help="Retain this many generations from now on (1-100, the published one included; default 3); "
              "kept for this index's later writes, older ones removed at once.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per generation.")
def snapshots(index_dir, keep, as_json):
    """List the retained generations of an index (newest first) with their sizes on disk."""
    from relsearch.indexer import snapshots as snaps

    try:
        if keep is not None:
            snaps.set_keep(index_dir, keep)
        listed = snaps.list_snapshots(index_dir)
    except (OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    for s in listed:
        if as_json:
            click.echo(json.dumps(s.as_json()))
        else:
            what = f"damaged: {s.damaged}" if s.damaged else f"{s.created_at}  {s.op:<8} {s.documents:>9} documents"
            click.echo(f"{'*' if s.current else ' '} {s.name}  {what}  "
                       f"{_size(s.bytes):>10} ({_size(s.unique_bytes)} its own)")
    if not as_json:
        click.echo(f"{len(listed)} generations retained (keep {snaps.keep_of(index_dir)}), "
                   f"{_size(snaps.retained_bytes(index_dir))} on disk (hard links counted once)")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


@click.command()
@click.option("--index", "index_dir", required=True, type=click.Path(), help="Published index.")
@click.option("--to", "to", default=None, help="Generation to publish again (default: the previous one); "
              "see `relsearch snapshots`.")
def rollback(index_dir, to):
    """Publish a retained generation again, atomically, after verifying its files."""
    from relsearch.indexer import snapshots as snaps

    try:
        name, manifest = snaps.rollback(index_dir, to)
    except (OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"{index_dir} now serves generation {name} ({manifest.counts.documents} documents)")
    es = manifest.backends.get("elasticsearch")
    if es and es.get("stale"):
        holds = f"index {es['alias_holds']}" if es.get("alias_holds") else "an index this command does not know"
        click.echo(f"warning: Elasticsearch is not rolled back: alias {es.get('alias')} still holds {holds}, not this "
                   "generation's contents (its manifest entry is marked stale). To mirror this generation: "
                   f"relsearch compact --index {index_dir} --es-url URL --es-index {es.get('alias')}", err=True)
    elif es:
        click.echo(f"elasticsearch: alias {es.get('alias')} still holds this generation's mirror ({es.get('index')})")


def _report_mutation(report, index_dir: str) -> None:
    click.echo(report.summary())
    if report.not_found:
        shown = ", ".join(report.not_found[:5]) + (" …" if len(report.not_found) > 5 else "")
        listed = f" (added to {os.path.join(index_dir, 'rejected.jsonl')})" if report.published else ""
        click.echo(f"ids not in the index: {shown}{listed}")
    if report.positions and report.tombstones / report.positions > 0.2:
        click.echo(f"{report.tombstones} of {report.positions} positions are tombstones: "
                   f"run `relsearch compact --index {index_dir}`")
    _echo_backends(report.backends)
    click.echo(f"index: {index_dir} ({report.seconds:.1f} s)")
