"""``relsearch lookup``: the batch lookup job (pipelines/lookup.py) as a command.

Registered in :mod:`relsearch.cli` with ``cli.add_command(lookup)``. Kept free of imports from
``relsearch.cli`` so that importing either module first works.
"""
from __future__ import annotations

import click

from relsearch.cli_query import FILTER_HELP, field_names, typed_filters
from relsearch.retrieval.inputs import MAX_K


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("input_file", metavar="INPUT.jsonl", type=click.Path(dir_okay=False))
@click.option("--index", "index_dir", required=True, type=click.Path(), help="Published index to search.")
@click.option("--relation", "-r", "relations", multiple=True, help="NAME or NAME=WEIGHT; repeat to mix.")
@click.option("-k", default=20, show_default=True, type=click.IntRange(min=1, max=MAX_K),
              help=f"Results per input, at most {MAX_K:,} (more than the index holds: all of them).")
@click.option("--filter", "filters", multiple=True, callback=typed_filters, help=FILTER_HELP)
@click.option("--same", "same", multiple=True,
              help="Keep only results whose FIELD equals the query document's; repeat = AND.")
@click.option("--collapse", "collapse_field", default=None, metavar="FIELD",
              help="At most one result per value of metadata FIELD (its best), none sharing the query's own "
                   "value: a company's other share class is not its peer. As `query --collapse`.")
@click.option("--no-collapse", "no_collapse", is_flag=True,
              help="Collapse on nothing, not even the index's recorded --collapse-field (share classes).")
@click.option("--field", "text_field", default=None, metavar="NAME",
              help="Search one named text field of an index of several (default: all, each document by its best).")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="Results JSONL (written atomically).")
@click.option("--format", "out_format", type=click.Choice(["jsonl", "csv"]), default="jsonl", show_default=True,
              help="Of --out: jsonl, or csv: a row per result, query (the query_id), rank, id, score, then each "
                   "metadata field kept as a column.")
@click.option("--with-text", is_flag=True, help="Include each result's text.")
@click.option("--fields", "fields", multiple=True, callback=field_names, metavar="F1,F2",
              help="Metadata fields each result carries (comma-separated or repeated); default: none.")
@click.option("--with-metadata", is_flag=True, help="Include every metadata field of each result.")
@click.option("--model", default=None, help="Relation bundle folder or model id (default: the one the index was built with).")
@click.option("--batch-size", default=256, show_default=True, type=click.IntRange(min=1),
              help="Queries per search call.")
@click.option("--workers", type=int, default=None, help="Local Beam worker processes (default: in-process).")
@click.pass_context
def lookup(ctx, input_file, index_dir, relations, k, filters, same, collapse_field, no_collapse, text_field, out,
           out_format, with_text, fields, with_metadata, model, batch_size, workers):
    """Answer every line of INPUT.jsonl with a Beam job: its top-k documents in --relation.

    A line is {"id": ...} (an indexed document) or {"id": ..., "text": ...} (new text; with --same it
    must carry the --same fields, and its --collapse value is the line's). The query document itself
    is never returned, nor with --collapse any result sharing its value of that field. Results go to --out
    in input order, one {"query_id", "results"} line per answered input, each result {"id", "score",
    "metadata"} with no metadata unless --fields or --with-metadata (and no text unless --with-text), or with
    --format csv one row per result;
    lines that cannot be answered go to OUT's .rejected.jsonl with line number and reason. Unknown options (--runner,
    --direct_num_workers, ...) pass through to Apache Beam.
    """
    from relsearch.encoder.relations import parse_relation_args
    from relsearch.pipelines.lookup import LookupInputError, LookupJob, run_lookup

    beam_args = list(ctx.args)
    if workers and workers > 1:
        beam_args += [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
    try:
        job = LookupJob(input=input_file, index=index_dir, out=out, relations=parse_relation_args(relations), k=k,
                        filters=filters, same=tuple(dict.fromkeys(same)), collapse=collapse_field, model=model,
                        no_collapse=no_collapse, field=text_field,
                        with_text=with_text, fields=tuple(fields or ()), with_metadata=with_metadata,
                        batch_size=batch_size, format=out_format)
        report = run_lookup(job, beam_args)
    except (LookupInputError, ValueError) as e:
        raise click.ClickException(str(e)) from e
    except OSError as e:  # e.g. a Dask scheduler that cannot be reached; --out is untouched
        raise click.ClickException(f"{e.strerror or e}; nothing was written") from None
    for line in report.warnings:  # a --filter operator that can never match
        click.echo(f"warning: {line}", err=True)
    click.echo(report.summary())
    click.echo(f"results: {report.out}")
    if report.rejected:
        click.echo(f"rejected lines: {report.rejected_path}")
    click.echo(f"throughput: {report.throughput()}")
