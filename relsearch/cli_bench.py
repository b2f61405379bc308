"""``relsearch bench``: link prediction, aspect retrieval, STS and the whole suite (bench/).

Registered in :mod:`relsearch.cli` with ``cli.add_command(bench)``. Each command parses options,
calls one ``run_*`` function, prints its table and says where the JSON / PNG went.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import click

ARGV_KEY = "relsearch.bench.argv"


class _BenchGroup(click.Group):
    """Remembers the raw arguments after ``bench`` so the JSON records the exact command line."""

    def make_context(self, info_name, args, parent=None, **extra):
        raw = list(args)
        ctx = super().make_context(info_name, args, parent=parent, **extra)
        ctx.meta[ARGV_KEY] = raw
        return ctx


def _command_line() -> str:
    ctx = click.get_current_context()
    group = ctx.parent or ctx
    path = group.command_path.split() if group.parent is not None else ["relsearch", "bench"]
    return shlex.join([*path, *ctx.meta.get(ARGV_KEY, [])])


def _run(fn, job, json_out, plot_out):
    from relsearch.bench.report import BenchInputError
    from relsearch.retrieval.search import QueryError

    try:
        result = fn(job, json_out=json_out, plot_out=plot_out, command=_command_line())
    except (BenchInputError, QueryError, FileNotFoundError, ValueError) as e:
        raise click.ClickException(str(e)) from e
    except KeyError as e:  # unknown relation: the message lists the available ones
        raise click.ClickException(e.args[0]) from e
    click.echo(result.text())
    if json_out:
        click.echo(f"json: {json_out}")
    if plot_out:
        click.echo(f"plot: {plot_out}")


def _report(result: dict, table: str, json_out: str | None) -> None:
    """Print a bench's table; with ``--json``, write its numbers and this command line there."""
    result["command"] = _command_line()
    click.echo(table)
    if json_out:
        Path(json_out).write_text(json.dumps(result, indent=2) + "\n")
        click.echo(f"json: {json_out}")


json_option = click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None,
                           help="Write every number, the command line, data/model fingerprints and machine info here.")
plot_option = click.option("--plot", "plot_out", type=click.Path(dir_okay=False), default=None, help="Write a PNG figure.")
model_option = click.option("--model", default=None, help="Relation bundle folder (default: the index's bundle, "
                                                          "else the shipped relation pack).")
relation_option = click.option("--relation", "-r", "relations", multiple=True, help="Operator to evaluate; repeat.")
cache_option = click.option("--cache", "cache_dir", type=click.Path(file_okay=False), default=None,
                            help="Vector cache folder (default: $RELSEARCH_CACHE or ~/.cache/relsearch/vectors).")
quiet_option = click.option("--quiet", is_flag=True, help="No encoding progress bar.")
precision_option = click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16"]), default="auto",
                                show_default=True, help="Encoder precision; fp32 makes vectors (nearly) independent of batching.")


@click.group(cls=_BenchGroup)
def bench():
    """Benchmarks: link prediction, same-aspect retrieval, STS — always beside identity and BM25."""


@bench.command()
@click.argument("test", metavar="TEST.jsonl", type=click.Path(dir_okay=False))
@click.option("--index", "index_dir", type=click.Path(), default=None, help="Candidates = this index's documents.")
@click.option("--candidates", type=click.Path(dir_okay=False), default=None,
              help="Candidates = this JSONL (with --text-field) or text file, one per line; encoded here.")
@click.option("--known", multiple=True, type=click.Path(dir_okay=False),
              help="More true triples (train/dev) to filter; the test file always is. Repeat.")
@relation_option
@model_option
@click.option("--both-directions/--tail-only", default=None,
              help="Also predict heads (?, r, t) and report the mean of both directions, or predict tails only. "
                   "Default: both when the bundle has <r>^-1 for every relation scored (trained with --inverse).")
@click.option("--skip-missing", is_flag=True, help="Count and skip triples whose gold is not a candidate "
                                                   "(default: an error).")
@click.option("--text-field", default="text", show_default=True, help="Text field of a JSONL --candidates file.")
@click.option("--hybrid-weight", "fusion_weights", multiple=True, type=click.FloatRange(0, 1),
              help="Also report method hybrid-wW: the own operator and BM25 by weighted fusion, relational weight W "
                   "(as query --hybrid weighted --hybrid-weight W). Repeat to compare; choose W on a dev split.")
@cache_option
@precision_option
@json_option
@plot_option
@quiet_option
def linkpred(test, index_dir, candidates, known, relations, model, both_directions, skip_missing, text_field,
             fusion_weights, cache_dir, precision, json_out, plot_out, quiet):
    """Rank each triple's gold tail among all candidates: MRR, MR, Hits@1/3/10, filtered and raw.

    TEST.jsonl holds {"head", "relation", "tail"}. Each triple is scored with the operator named by
    its relation (or each --relation), identity and BM25, per relation and overall. With head
    prediction (a bundle trained with --inverse, or --both-directions) the last table gives, per
    method, tail MRR, head MRR and their mean, and Hits@1/3/10 the same way.
    """
    from relsearch.bench.linkpred import LinkPredJob, run_linkpred

    job = LinkPredJob(test=test, index=index_dir, candidates=candidates, known=tuple(known), relations=tuple(relations),
                      model=model, both_directions=both_directions, skip_missing=skip_missing, text_field=text_field,
                      cache_dir=cache_dir, precision=precision, progress=not quiet,
                      fusion_weights=tuple(fusion_weights))
    _run(run_linkpred, job, json_out, plot_out)


@bench.command()
@click.argument("corpus", metavar="CORPUS.jsonl", type=click.Path(dir_okay=False))
@click.option("--aspect", required=True, help="Label field: relevant = same value (null labels are skipped).")
@relation_option
@click.option("-k", default=10, show_default=True, type=click.IntRange(min=1))
@click.option("--split", default="test", show_default=True, help="Value of --split-field to use; 'all' = every document.")
@click.option("--split-field", default="split", show_default=True)
@click.option("--text-field", default="text", show_default=True)
@model_option
@cache_option
@precision_option
@json_option
@plot_option
@quiet_option
def retrieval(corpus, aspect, relations, k, split, split_field, text_field, model, cache_dir, precision, json_out,
              plot_out, quiet):
    """Same-aspect retrieval (AspectCSE): every document a seed; P@k, R@k, MRR@k, macro-averaged.

    Without --relation every operator of the bundle is evaluated.
    """
    from relsearch.bench.retrieval import RetrievalJob, run_retrieval

    job = RetrievalJob(corpus=corpus, aspect=aspect, relations=tuple(relations), k=k, split=split,
                       split_field=split_field, text_field=text_field, model=model, cache_dir=cache_dir,
                       precision=precision, progress=not quiet)
    _run(run_retrieval, job, json_out, plot_out)


@bench.command()
@click.argument("pairs", metavar="PAIRS.jsonl", type=click.Path(dir_okay=False))
@relation_option
@click.option("--symmetric", is_flag=True, help="Score = mean of cos(op(h_a), b̂) and cos(op(h_b), â).")
@click.option("--by", default=None, help="Also report per value of this field (e.g. year).")
@click.option("--a-field", default="a", show_default=True)
@click.option("--b-field", default="b", show_default=True)
@click.option("--score-field", default="score", show_default=True)
@model_option
@cache_option
@precision_option
@json_option
@plot_option
@quiet_option
def sts(pairs, relations, symmetric, by, a_field, b_field, score_field, model, cache_dir, precision, json_out, plot_out,
        quiet):
    """Spearman and Pearson between cos(op(h_a), b̂) and the gold "score" of each pair.

    Without --relation every operator of the bundle is evaluated.
    """
    from relsearch.bench.sts import STSJob, run_sts

    job = STSJob(pairs=pairs, relations=tuple(relations), symmetric=symmetric, by=by, a_field=a_field,
                 b_field=b_field, score_field=score_field, model=model, cache_dir=cache_dir, precision=precision,
                 progress=not quiet)
    _run(run_sts, job, json_out, plot_out)


@bench.command()
@click.argument("corpus", metavar="CORPUS.jsonl", required=False, type=click.Path(dir_okay=False))
@click.option("--model", "models", multiple=True,
              help="Bundle to evaluate (repeat to compare, e.g. the pack and a fine-tuned company bundle; "
                   "default: the shipped pack).")
@click.option("--split", default="test", show_default=True, help="Companies of this split are seeds and candidates.")
@click.option("--depth", default=50, show_default=True, type=click.IntRange(min=1),
              help="Identity hits a re-ranking head re-scores.")
@cache_option
@precision_option
@json_option
@plot_option
@quiet_option
def companies(corpus, models, split, depth, cache_dir, precision, json_out, plot_out, quiet):
    """Similar companies on held-out companies: same GICS industry / sector P@10, R@10, MRR@10 and
    cross-source lookups, for BM25, identity, every operator and re-ranking head.

    CORPUS defaults to russell3000_companies/corpus.jsonl in the datasets folder $RELSEARCH_DATA: the
    public Russell 3000 descriptions (Yahoo, Wikipedia, Bloomberg) with GICS codes, one company a line
    with fields text, text_wikipedia, text_bloomberg, gics_industry, gics_sector, split
    (docs/datasets.md).
    """
    import os

    from relsearch.bench.companies import CompaniesJob, run_companies

    if corpus is None:
        data = os.environ.get("RELSEARCH_DATA", os.path.join("..", "shared", "data"))
        corpus = os.path.join(data, "russell3000_companies", "corpus.jsonl")
        if not os.path.isfile(corpus):
            raise click.UsageError(f"no CORPUS given and {corpus} does not exist; give CORPUS or set "
                                   "RELSEARCH_DATA to the prepared datasets folder (docs/datasets.md)")
    job = CompaniesJob(corpus=corpus, models=tuple(models) or (None,), split=split, depth=depth, cache_dir=cache_dir,
                       precision=precision, progress=not quiet)
    _run(run_companies, job, json_out, plot_out)


@bench.command(name="all")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder for the report.")
@click.option("--data", "data_dir", default=None, type=click.Path(file_okay=False),
              help="Prepared datasets folder (default: $RELSEARCH_DATA; docs/datasets.md).")
@model_option
@cache_option
@precision_option
@quiet_option
def all_(out_dir, data_dir, model, cache_dir, precision, quiet):
    """Run the default pack's relations on the prepared public datasets (--data or $RELSEARCH_DATA);
    write OUT/REPORT.md, JSON and PNGs."""
    from relsearch.bench.report import BenchInputError
    from relsearch.bench.suite import SuiteJob, run_suite

    job = SuiteJob(out=out_dir, data=data_dir, model=model, cache_dir=cache_dir, precision=precision,
                   progress=not quiet)
    try:
        report = run_suite(job, command=_command_line(), echo=click.echo)
    except (BenchInputError, FileNotFoundError, ValueError) as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"report: {report}")


@bench.command()
@click.option("--sentences", "n_encode", default=5000, show_default=True, help="Real sentences to encode.")
@click.option("--documents", "n_index", default=20000, show_default=True, help="Documents for the index-vs-encode run.")
@click.option("--repeats", default=3, show_default=True, help="Timed repeats (the median is reported).")
@click.option("--device", default="cpu", show_default=True,
              help="Where the encoder runs: cpu, or cuda (cuda:N) for the GPU run; limits are measured there.")
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16"]), default="auto", show_default=True,
              help="The encoder's dtype: auto is what relsearch chooses here; fp32 on a bf16 CPU measures the path "
                   "a CPU without bf16 takes.")
@json_option
def speed(n_encode, n_index, repeats, device, precision, json_out):
    """Encoding vs sentence-transformers and vs this machine's limits, index vs pure encoding,
    queries vs raw FAISS — one process."""
    from relsearch.bench import speed as speed_bench

    try:
        result = speed_bench.run(n_encode=n_encode, n_index=n_index, repeats=repeats, device=device,
                                  precision=precision)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    _report(result, speed_bench.format_table(result), json_out)


@bench.command(name="gpu-report")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder for REPORT.md.")
@click.option("--data", "data_dir", default=".device/report", show_default=True, type=click.Path(file_okay=False),
              help="The inputs folder `relsearch bench gpu-report-data` writes.")
@click.option("--device", default="cuda", show_default=True, help="cuda (cuda:N), or cpu for a dry run.")
@click.option("--tiny", is_flag=True, help="Small sizes: the CPU dry run of the test suite.")
@click.option("--tower-minutes", type=click.FloatRange(min=0.05), default=None,
              help="Query-tower time budget (default 3; --tiny 0.2).")
def gpu_report(out_dir, data_dir, device, tiny, tower_minutes):
    """The GPU figures in one device call: bench speed on DEVICE and a short query-tower run on a
    text knowledge graph, each in its own process; writes OUT/REPORT.md (docs/gpu-notes.md)."""
    from relsearch.bench import gpu_report as mod
    from relsearch.bench.speed import check_device

    try:
        check_device(device)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    if not (Path(data_dir) / "kg" / "train.tsv.gz").is_file():
        raise click.ClickException(f"{data_dir} holds no report inputs; build them with `make gpu-report-data` "
                                   "(relsearch bench gpu-report-data)")
    report = mod.run(device=device, data=Path(data_dir), out=Path(out_dir), tiny=tiny, tower_minutes=tower_minutes)
    click.echo(report.read_text(encoding="utf-8"))
    click.echo(f"report: {report}")


@bench.command(name="gpu-report-data")
@click.option("--out", "out_dir", default=".device/report", show_default=True, type=click.Path(file_okay=False))
@click.option("--data", "data_dir", default=None, type=click.Path(exists=True, file_okay=False),
              help="Datasets folder (default $RELSEARCH_DATA, else ../shared/data).")
@click.option("--kg", "kg_dir", default=None, type=click.Path(exists=True, file_okay=False),
              help="Text knowledge graph as tools/data/codex.py writes it (default DATA/codex_m).")
def gpu_report_data(out_dir, data_dir, kg_dir):
    """Build the folder `relsearch bench gpu-report` reads: bench speed's sentences and a text
    knowledge graph by ids (small enough to travel with one device call)."""
    from relsearch.bench.gpu_report import pack_data
    from relsearch.bench.speed import DEFAULT_DATA

    data = Path(data_dir) if data_dir else DEFAULT_DATA
    kg = Path(kg_dir) if kg_dir else data / "codex_m"
    if not (kg / "entities.jsonl").is_file():
        raise click.ClickException(f"no knowledge graph at {kg}: run tools/data/codex.py (docs/datasets.md) or "
                                   "pass --kg")
    counts = pack_data(data, kg, Path(out_dir))
    size = sum(f.stat().st_size for f in Path(out_dir).rglob("*") if f.is_file())
    click.echo(f"{out_dir}: {size / 2**20:.1f} MiB; triples {counts}")


@bench.command(name="train-speed")
@click.argument("train", metavar="[TRAIN.jsonl]", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--dev", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Dev triples the trainer evaluates on (default with no TRAIN: MSRP dev).")
@click.option("--regime", type=click.Choice(["encoder", "joint"]), default="encoder", show_default=True,
              help="Which fine-tuning trainer to measure: the query tower or joint RSE.")
@click.option("--triples", default=512, show_default=True, type=click.IntRange(min=2),
              help="Training triples (one epoch), the first of TRAIN.")
@click.option("--dev-triples", default=128, show_default=True, type=click.IntRange(min=0),
              help="Dev triples the trainer evaluates at the epoch's end (the first of --dev; 0: none).")
@click.option("--batch-size", type=click.IntRange(min=2), default=None,
              help="Triples per step, both sides (default: encoder 128, joint 64).")
@click.option("--max-length", default=32, show_default=True, type=click.IntRange(min=1))
@click.option("--threads", type=click.IntRange(min=1), default=None, help="torch CPU threads (default: torch's).")
@json_option
def train_speed(train, dev, regime, triples, dev_triples, batch_size, max_length, threads, json_out):
    """The project's trainer vs a minimal hand-written loop of the same model, batch, max length and
    dtype, in one process: triples/s of both and their ratio (design target >= 0.70).

    TRAIN defaults to msrp/triples/train.jsonl (with its dev split) in the datasets folder
    $RELSEARCH_DATA (docs/datasets.md)."""
    from relsearch.bench import train_speed as mod

    try:
        result = mod.run(regime=regime, train=train, dev=dev, triples=triples, dev_triples=dev_triples,
                         batch_size=batch_size,
                         max_length=max_length, threads=threads)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    _report(result, mod.format_table(result), json_out)


@bench.command(name="serve")
@click.option("--index", "index_dir", required=True, type=click.Path(exists=True), help="Published index to serve.")
@click.option("--requests", default=400, show_default=True, type=click.IntRange(min=1),
              help="Requests per concurrency level (at most).")
@click.option("--seconds", default=15.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds per concurrency level (at most).")
@click.option("--concurrency", default="1,8,32", show_default=True, help="Comma-separated client counts.")
@click.option("-k", default=10, show_default=True, type=click.IntRange(1, 1000))
@click.option("--no-txtai", is_flag=True, help="Skip the txtai API comparison.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="relsearch serve --threads.")
@json_option
def serve_bench(index_dir, requests, seconds, concurrency, k, no_txtai, threads, json_out):
    """Loopback load test: relsearch serve, the in-process API and txtai's API; p50/p99 latency and QPS."""
    from relsearch.bench import serve as serve_bench_mod

    try:
        levels = tuple(int(c) for c in concurrency.split(","))
        if not levels or min(levels) < 1:
            raise ValueError
    except ValueError:
        raise click.BadParameter(f"expects positive integers separated by commas, got {concurrency!r}",
                                 param_hint="--concurrency") from None
    job = serve_bench_mod.ServeBenchJob(index=index_dir, concurrency=levels, requests=requests, seconds=seconds, k=k,
                                        txtai=not no_txtai, threads=threads)
    try:
        result = serve_bench_mod.run(job, echo=click.echo)
    except (ValueError, OSError) as e:
        raise click.ClickException(str(e)) from None
    _report(result, serve_bench_mod.format_table(result), json_out)


@bench.command()
@click.option("--data", "data_dirs", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="A folder holding dataset folders; repeat to search several in order (default $RELSEARCH_DATA, "
                   "else ../shared/data).")
@model_option
@relation_option
@click.option("--work", "work_dir", type=click.Path(file_okay=False), default=None,
              help="Where the transfer sets are indexed, reused when their documents have not changed "
                   "(default: a temporary folder).")
@click.option("--write-pack", "write_pack", type=click.Path(exists=True, file_okay=False), default=None,
              help="Store each relation's figure as its `transfer` entry in this bundle folder (bundle.json and "
                   "MODEL_CARD.md).")
@precision_option
@json_option
@quiet_option
def transfer(data_dirs, model, relations, work_dir, write_pack, precision, json_out, quiet):
    """Each relation on a second dataset of its kind that its recipe never saw: whole-corpus MRR
    and hits@10 of --relation NAME (its recipe, through the query plan), identity, BM25 and the
    hybrid, over an index of the set (bench/transfer.py lists the sets)."""
    from relsearch.bench.transfer import TransferJob, run_transfer

    job = TransferJob(data=tuple(data_dirs), model=model, relations=tuple(relations), work=work_dir,
                      write_pack=write_pack, precision=precision, progress=not quiet)
    _run(run_transfer, job, json_out, None)
    if write_pack:
        click.echo(f"transfer figures written to {write_pack}")
