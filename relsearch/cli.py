"""Command line: parse options, call one public function, print."""
from __future__ import annotations

import json
import os

# Models come from local folders or installed packages unless the user opts into the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# transformers' warnings and progress bars are noise to a CLI user. Said through its environment, read
# when (and if) a command imports it: importing transformers here to say it cost an id query 1-2 s.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import importlib  # noqa: E402
import logging  # noqa: E402

import click  # noqa: E402

# Beam logs optional-dependency warnings (BigQuery, ...) at import; they are noise to a CLI user.
logging.getLogger().setLevel(logging.ERROR)


def _fail(message: str) -> None:
    raise click.ClickException(message)


class LazyGroup(click.Group):
    """A group whose subcommands live in other modules, imported when one is asked for (or when
    ``--help`` lists them): ``relsearch query`` never loads the Beam pipelines, the trainers or the server."""

    def __init__(self, *args, lazy: dict[str, str], **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = lazy  # command name → "module:attribute"

    def list_commands(self, ctx) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx, name: str):
        if name in self.lazy and name not in self.commands:
            module, attribute = self.lazy[name].split(":")
            self.add_command(getattr(importlib.import_module(module), attribute), name)
        return super().get_command(ctx, name)


LAZY_COMMANDS = {name: f"relsearch.{module}:{name}" for module, names in (
    ("cli_index", ("index", "delete", "compact", "snapshots", "rollback")), ("cli_query", ("query",)),
    ("cli_lookup", ("lookup",)), ("cli_train", ("train",)), ("cli_bench", ("bench",)), ("cli_serve", ("serve",)))
    for name in names}


@click.group(cls=LazyGroup, lazy=LAZY_COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="relsearch")
def cli():
    """relsearch: relational vector search.

    Index a JSONL corpus, then ask what stands in a relation to a text:
    `relsearch query "How do I reset my password?" --index idx --relation duplicate-question`.
    """


model_option = click.option(
    "--model", default=None,
    help="Relation bundle folder, or any Hugging Face model id/path (identity only). "
         "Default: the shipped relation pack on all-MiniLM-L6-v2.")


@cli.command()
@click.option("--index", "index_dir", default=None, type=click.Path(exists=True))
@model_option
@click.option("--json", "as_json", is_flag=True)
def relations(index_dir, model, as_json):
    """List the relation operators of a bundle (or of the bundle an index was built with)."""
    from relsearch.encoder.bundle import load_bundle, recorded_ref

    if index_dir and not model:
        from relsearch.indexer.reader import open_index

        try:
            model = recorded_ref(open_index(index_dir).manifest.bundle)
        except (ValueError, OSError) as e:  # a missing or damaged index: one line, no traceback
            raise click.ClickException(str(e)) from e
    try:
        bundle = load_bundle(model)
    except ValueError as e:  # a model that is not found, a damaged bundle
        raise click.ClickException(str(e)) from None
    from relsearch.retrieval.recipe import check_recipes

    try:  # one line naming the relation and the recipe key, as every query of the bundle says it
        check_recipes(bundle)
    except ValueError as e:
        raise click.ClickException(f"model {bundle.path or bundle.encoder.get('model')!r}: {e}") from None
    from relsearch.retrieval.verdicts import describe_transfer, relation_row

    rows = [relation_row(name, op) for name, op in sorted(bundle.operators.items())]
    for name, head in sorted(bundle.heads.items()):  # re-rankers (relsearch query --rerank NAME)
        rows.append({"name": name, "kind": head.kind, "description": head.description,
                     "metrics": head.info.get("metrics", {}), "labels": list(head.labels), "positive": head.positive})
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    click.echo(f"bundle: {bundle.path or bundle.encoder.get('model')}  encoder: {bundle.encoder.get('model')}")
    for row in rows:
        metrics = _format_metrics(row["metrics"])
        click.echo(f"  {row['name']:<20} {row['kind']:<12} {row['description']}" + (f"\n  {'':<20} {metrics}" if metrics else ""))
        if "recipe" in row:
            click.echo(f"  {'':<20} {_format_recipe(row['recipe'], row.get('whole_corpus', {}))}")
        elif _format_whole_corpus(row.get("whole_corpus")):  # no recipe: --relation runs the operator alone
            click.echo(f"  {'':<20} runs: the operator alone; {_format_whole_corpus(row['whole_corpus'])}")
        if describe_transfer(row.get("transfer")):
            click.echo(f"  {'':<20} {describe_transfer(row['transfer'])}")
        for line in row.get("losses", ()):  # where it scores below identity, BM25 or the hybrid
            click.echo(f"  {'':<20} ! {line}")


def _format_recipe(recipe: dict, whole_corpus: dict) -> str:
    """What ``--relation NAME`` runs, and its whole-corpus test MRR beside identity, BM25 and hybrid."""
    from relsearch.retrieval.recipe import Recipe

    line = f"runs: {Recipe.from_json(recipe).describe()}"  # checked at load (check_recipes)
    measured = _format_whole_corpus(whole_corpus)
    return f"{line}; {measured}" if measured else line


def _format_whole_corpus(whole_corpus) -> str:
    """The whole-corpus test MRR of what ``--relation NAME`` runs beside identity, BM25 and hybrid
    ("" when the bundle does not have all four)."""
    test = whole_corpus.get("test") if isinstance(whole_corpus, dict) else None
    if not isinstance(test, dict) or not all(isinstance(test.get(k), (int, float)) for k in ("recipe", "identity",
                                                                                             "bm25", "hybrid")):
        return ""
    where = f" on {test['dataset']}," if isinstance(test.get("dataset"), str) else ""
    return (f"whole-corpus test{where} MRR {test['recipe']:.3f} (identity {test['identity']:.3f}, BM25 "
            f"{test['bm25']:.3f}, hybrid {test['hybrid']:.3f})")


def _format_metrics(metrics: dict) -> str:
    """One line: the operator's main test metrics beside identity's, when the bundle has them."""
    if isinstance(metrics.get("accuracy"), (int, float)):  # a re-ranking head: pair classification
        return (f"test accuracy {metrics['accuracy']:.3f}, macro F1 {metrics.get('macro_f1', float('nan')):.3f}, "
                f"{int(metrics.get('pairs', 0))} pairs (re-ranker: --rerank)")
    trained, identity = metrics.get("trained", {}), metrics.get("identity", {})
    parts = [f"test {key} {trained[key]:.3f} (identity {identity.get(key, float('nan')):.3f})"
             for key in ("mrr", "hits@10", "p@10", "mrr@10", "spearman") if isinstance(trained.get(key), (int, float))]
    if parts and metrics.get("queries"):
        parts.append(f"{int(metrics['queries'])} queries, {int(metrics.get('candidates', 0))} candidates")
    return ", ".join(parts)


@cli.command()
@click.argument("text_a", required=False)
@click.argument("text_b", required=False)
@model_option
@click.option("--index", "index_dir", type=click.Path(), default=None, help="With --id: the index holding both.")
@click.option("--id", "ids", multiple=True, metavar="ID", help="Twice, instead of texts: two documents of --index.")
@click.option("--json", "as_json", is_flag=True)
def score(text_a, text_b, model, index_dir, ids, as_json):
    """Print every relation's score for the pair TEXT_A → TEXT_B: what --relation R runs, its
    recipe's dense part ⟨q_R(A), B⟩ (a warning names the BM25 share and bonuses it leaves out).
    With --index and --id A --id B: B's whole score in `query --id A --relation R`, its rank and parts."""
    from relsearch.api import RequestError, check_score_texts

    if ids or index_dir:
        return _score_ids(index_dir, ids, model, as_json, texts=text_a is not None)
    from relsearch.encoder.bundle import load_bundle
    from relsearch.encoder.model import Encoder
    from relsearch.retrieval.pair import score_pair

    try:  # the checks of Index.score and POST /score
        check_score_texts(text_a, text_b)
    except RequestError as e:
        raise click.ClickException(f"{'TEXT_A' if e.field == 'a' else 'TEXT_B'}: {e.message}") from None
    try:
        bundle = load_bundle(model)
    except ValueError as e:  # a model that is not found, a damaged bundle
        raise click.ClickException(str(e)) from None
    try:
        scores = score_pair(bundle, Encoder(bundle.encoder_config()), text_a, text_b)
    except (ValueError, RuntimeError) as e:  # a model folder or query tower that does not fit: one line
        raise click.ClickException(str(e)) from None
    for line in scores.warnings:
        click.echo(f"warning: {line}", err=True)
    if as_json:
        click.echo(json.dumps(scores))
        return
    for name, value in sorted(scores.items(), key=lambda kv: -kv[1]):
        click.echo(f"{value:8.4f}  {name}")


def _score_ids(index_dir, ids, model, as_json, *, texts: bool) -> None:
    """``relsearch score --index I --id A --id B`` (Index.score_ids)."""
    from relsearch.api import RequestError, open_index

    if texts or not index_dir or len(ids) != 2:
        _fail("give TEXT_A TEXT_B, or --index and --id A --id B")
    try:
        scores = open_index(index_dir, model).score_ids(*ids)
    except (RequestError, ValueError, FileNotFoundError, RuntimeError) as e:
        _fail(getattr(e, "message", None) or str(e))
    if as_json:
        click.echo(json.dumps(scores))
        return
    for name, s in sorted(scores.items(), key=lambda kv: (kv[1]["rank"] or float("inf"), kv[0])):  # modes' scales differ
        if s["rank"] is None:
            click.echo(f"{'-':>8}  {name}: {ids[1]} is not among the {s['of']:,} hits it can return")
            continue
        parts = "  ".join(f"{k}={v:.3f}" for k, v in s["explain"].items() if k.startswith(("recipe:", "mixture:")))
        click.echo(f"{s['score']:8.4f}  {name}  (rank {s['rank']:,} of {s['of']:,})" + (f"\n          {parts}" if parts else ""))


def main() -> None:
    cli(prog_name="relsearch")


if __name__ == "__main__":
    main()
