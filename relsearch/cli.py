"""Command line: parse options, call one public function, print."""
from __future__ import annotations

import json
import os
import sys

# Models come from local folders or installed packages unless the user opts into the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import logging  # noqa: E402

import click  # noqa: E402

# Beam logs optional-dependency warnings (BigQuery, ...) at import; they are noise to a CLI user.
logging.getLogger().setLevel(logging.ERROR)


def _fail(message: str) -> None:
    raise click.ClickException(message)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="relsearch")
def cli():
    """relsearch: relational vector search.

    Index a JSONL corpus, then ask what stands in a relation to a text:
    `relsearch query "How do I reset my password?" --index idx --relation duplicate-question`.
    """
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


model_option = click.option(
    "--model", default=None,
    help="Relation bundle folder, or any Hugging Face model id/path (identity only). "
         "Default: the shipped relation pack on all-MiniLM-L6-v2.")


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("corpus", type=click.Path(dir_okay=False))
@click.option("--index", "index_dir", required=True, type=click.Path(file_okay=True), help="Index folder to (re)build.")
@model_option
@click.option("--id-field", default="id", show_default=True)
@click.option("--text-field", default="text", show_default=True)
@click.option("--faiss-index", "faiss_factory", default="Flat", show_default=True,
              help="FAISS index-factory string, e.g. Flat, HNSW32, IVF1024,Flat.")
@click.option("--chunk-lines", default=2048, show_default=True,
              help="Lines per chunk: the unit of parallel work, progress and resumption.")
@click.option("--max-length", type=int, default=None, help="Token limit per text (default: the model's).")
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16"]), default="auto", show_default=True)
@click.option("--workers", type=int, default=None, help="Local Beam worker processes (default: in-process).")
@click.option("--strict", is_flag=True, help="Exit non-zero (and keep the old index) if any line is rejected.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.pass_context
def index(ctx, corpus, index_dir, model, id_field, text_field, faiss_factory, chunk_lines, max_length, precision,
          workers, strict, quiet):
    """Encode CORPUS (JSONL) with a Beam pipeline into a FAISS index + docstore at --index.

    Unknown options (--runner, --direct_num_workers, ...) pass through to Apache Beam. The new
    index replaces the old one atomically, and only when the run succeeds.
    """
    from relsearch.pipelines.index import IndexInputError, IndexJob, run_index

    beam_args = list(ctx.args)
    if workers and workers > 1:
        beam_args += [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
    job = IndexJob(input=corpus, index=index_dir, model=model, id_field=id_field, text_field=text_field,
                   faiss_factory=faiss_factory, chunk_lines=chunk_lines, max_length=max_length,
                   precision=precision, strict=strict, progress=not quiet)
    try:
        report = run_index(job, beam_args)
    except (IndexInputError, FileExistsError, ValueError) as e:
        _fail(str(e))
    if report.resumed_chunks:
        click.echo(f"resumed: {report.resumed_chunks} chunks were already encoded by an interrupted run")
    click.echo(report.summary())
    if report.truncated:
        click.echo(f"{report.truncated} texts were longer than the encoder's max length and were truncated")
    if report.rejected:
        click.echo(f"rejected lines: {os.path.join(index_dir, 'rejected.jsonl')}")
    click.echo(f"index: {index_dir} ({report.seconds:.1f} s)")


def _parse_filters(specs) -> dict[str, str]:
    out = {}
    for spec in specs:
        field, sep, value = spec.partition("=")
        if not sep or not field:
            _fail(f"--filter expects FIELD=VALUE, got {spec!r}")
        out[field] = value
    return out


def _read_queries(path: str, default_relations: dict[str, float]):
    from relsearch.retrieval.search import Query

    queries, errors = [], []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                if not isinstance(obj, dict):
                    raise ValueError("not a JSON object")
                qid = obj.get("id", obj.get("query_id", obj.get("doc_id", n)))
                rel = obj.get("relation")
                relations = ({rel: 1.0} if isinstance(rel, str) else
                             {str(k): float(v) for k, v in rel.items()} if isinstance(rel, dict) else default_relations)
                if isinstance(obj.get("doc_id"), (str, int)):
                    queries.append(Query(doc_id=str(obj["doc_id"]), relations=relations, query_id=qid))
                elif isinstance(obj.get("text"), str) and obj["text"].strip():
                    queries.append(Query(text=obj["text"], relations=relations, query_id=qid))
                else:
                    raise ValueError("needs a non-empty 'text' or a 'doc_id'")
            except (ValueError, AttributeError) as e:
                errors.append({"line": n, "error": str(e)})
    return queries, errors


@cli.command()
@click.argument("text", required=False)
@click.option("--index", "index_dir", required=True, type=click.Path())
@click.option("--id", "doc_id", default=None, help="Query with an indexed document (never returned itself).")
@click.option("--queries", "queries_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help='JSONL of {"id", "text"} or {"doc_id"}, optional "relation" (name or {name: weight}).')
@click.option("--relation", "-r", "relations", multiple=True, help="NAME or NAME=WEIGHT; repeat to mix.")
@click.option("-k", default=10, show_default=True, type=click.IntRange(min=1))
@click.option("--filter", "filters", multiple=True, help="FIELD=VALUE exact metadata match; repeat = AND.")
@click.option("--json", "as_json", is_flag=True, help="JSON lines output.")
@click.option("--explain", is_flag=True, help="Add every operator's own score for each hit.")
@model_option
def query(text, index_dir, doc_id, queries_file, relations, k, filters, as_json, explain, model):
    """Find documents standing in --relation to TEXT (or to --id, or to each line of --queries)."""
    from relsearch.encoder.relations import parse_relation_args
    from relsearch.retrieval.search import Query, QueryError, Searcher

    if sum(x is not None for x in (text, doc_id, queries_file)) != 1:
        _fail("give exactly one of TEXT, --id or --queries")
    try:
        weights = parse_relation_args(relations)
        searcher = Searcher(index_dir, model)
        filt = _parse_filters(filters)
        searcher.check(weights, filt)
        if queries_file:
            queries, errors = _read_queries(queries_file, weights)
            unknown = searcher.unknown_ids(queries)
            errors += [{"line": q.query_id, "error": f"doc_id {q.doc_id!r} is not in the index"}
                       for q in queries if q.doc_id in unknown]
            queries = [q for q in queries if q.doc_id not in unknown]
        else:
            queries, errors = [Query(text=text, doc_id=doc_id, relations=weights, query_id=doc_id)], []
        results = searcher.search(queries, k=k, filters=filt, explain=explain) if queries else []
    except (QueryError, KeyError, ValueError, FileNotFoundError) as e:
        _fail(e.args[0] if isinstance(e, KeyError) else str(e))
    if queries_file:
        for q, hits in zip(queries, results):
            payload = {"query_id": q.query_id, "results": [h.to_json() for h in hits]}
            click.echo(json.dumps(payload, ensure_ascii=False) if as_json else _table(hits, title=f"query {q.query_id}"))
        for err in errors:
            click.echo(f"{queries_file}:{err['line']}: {err['error']}", err=True)
        if errors:
            sys.exit(1)
        return
    hits = results[0]
    if as_json:
        for rank, hit in enumerate(hits, 1):
            click.echo(json.dumps(hit.to_json(rank), ensure_ascii=False))
    else:
        click.echo(_table(hits))


def _table(hits, title: str | None = None) -> str:
    lines = [title] if title else []
    lines.append(f"{'rank':>4}  {'score':>7}  {'id':<16}  text")
    for rank, h in enumerate(hits, 1):
        snippet = " ".join(h.text.split())
        snippet = snippet[:90] + ("…" if len(snippet) > 90 else "")
        lines.append(f"{rank:>4}  {h.score:7.4f}  {str(h.id)[:16]:<16}  {snippet}")
        if h.explain:
            lines.append("      " + "  ".join(f"{n}={v:.3f}" for n, v in h.explain.items()))
    if not hits:
        lines.append("  (no results)")
    return "\n".join(lines)


@cli.command()
@click.option("--index", "index_dir", default=None, type=click.Path(exists=True))
@model_option
@click.option("--json", "as_json", is_flag=True)
def relations(index_dir, model, as_json):
    """List the relation operators of a bundle (or of the bundle an index was built with)."""
    from relsearch.encoder.bundle import load_bundle

    if index_dir and not model:
        from relsearch.indexer.store import open_index

        model = open_index(index_dir).manifest.get("bundle", {}).get("path")
    bundle = load_bundle(model)
    rows = []
    for name, op in sorted(bundle.operators.items()):
        rows.append({"name": name, "kind": op.kind, "description": op.description, "metrics": op.info.get("metrics", {})})
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    click.echo(f"bundle: {bundle.path or bundle.encoder.get('model')}  encoder: {bundle.encoder.get('model')}")
    for row in rows:
        metrics = _format_metrics(row["metrics"])
        click.echo(f"  {row['name']:<20} {row['kind']:<12} {row['description']}" + (f"\n  {'':<20} {metrics}" if metrics else ""))


def _format_metrics(metrics: dict) -> str:
    flat = []
    for key, value in metrics.items():
        if isinstance(value, dict):
            flat += [f"{key}.{k}={v:.3f}" for k, v in value.items() if isinstance(v, (int, float))]
        elif isinstance(value, (int, float)):
            flat.append(f"{key}={value:.3f}")
    return "  ".join(flat[:8])


@cli.command()
@click.argument("text_a")
@click.argument("text_b")
@model_option
@click.option("--json", "as_json", is_flag=True)
def score(text_a, text_b, model, as_json):
    """Print every relation's score cos(op(h_A), B) for the pair TEXT_A → TEXT_B."""
    from relsearch.encoder.bundle import load_bundle
    from relsearch.encoder.model import Encoder, EncoderConfig
    from relsearch.retrieval.search import score_pair

    bundle = load_bundle(model)
    enc = Encoder(EncoderConfig(model=bundle.encoder["model"], pooling=bundle.encoder.get("pooling")))
    scores = score_pair(bundle, enc, text_a, text_b)
    if as_json:
        click.echo(json.dumps(scores))
        return
    for name, value in sorted(scores.items(), key=lambda kv: -kv[1]):
        click.echo(f"{value:8.4f}  {name}")


from relsearch.cli_lookup import lookup  # noqa: E402  (commands with many options live in their own module)
from relsearch.cli_train import train  # noqa: E402

cli.add_command(lookup)
cli.add_command(train)


def main() -> None:
    cli(prog_name="relsearch")


if __name__ == "__main__":
    main()
