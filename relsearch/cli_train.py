"""``relsearch train DATA --objective ... --out BUNDLE``: one command for the five objectives.

Registered in :mod:`relsearch.cli` with ``cli.add_command(train)``. Parses the options and hands
them to the objective's trainer in :data:`relsearch.encoder.training.registry.TRAINERS` (rse's
``--regime`` picks one of three). Options left unset take the objective's own defaults (its config
dataclass); an option that means nothing for the chosen objective is an error rather than
silently ignored. The bundle is written aside and swapped in
(a killed run never leaves half a bundle), with MODEL_CARD.md beside ``bundle.json``; the
checkpoint that lets an interrupted run resume (``OUT.checkpoint``) is removed once it is written.
With ``--dev`` or ``--test`` (rse), each relation's recipe is then chosen and reported by
:func:`relsearch.retrieval.recipe_fit.fit_bundle`; this module only echoes its lines.
"""
from __future__ import annotations

import shlex

import click

from .encoder.kinds import TRAINABLE
from .encoder.training.card import CARD, summary_lines

OBJECTIVES = ("rse", "aspect", "transition", "pu", "distill")
# Share of --time-budget left after training for recipe fitting (rse with --dev or --test); what
# fitting does not use of it is lost. Choosing the recipes of 102 query-tower relations of CoDEx-M
# (16,326 candidates, 8,913 dev triples both ways) took 229 s on 2 loaded cores (profiled; 80 %
# of it the tower encoding the dev queries): 7.6 % of a 50-minute budget.
FIT_SHARE = 0.1
# Which objectives accept each objective-specific option (checked after parsing).
ONLY_FOR = {
    "regime": ("rse", "aspect", "pu"),
    "operator": ("rse",), "negatives": ("rse",), "candidates": ("rse",), "relation_lr": ("rse",),
    "eval_every": ("rse",), "margin": ("rse",), "pre_batch": ("rse",), "lora_rank": ("rse",), "warmup": ("rse",),
    "chunk": ("rse",), "inverse": ("rse",), "layers": ("rse",), "keep_worse": ("rse",),
    "max_candidates": ("rse", "aspect"),
    "relations": ("rse", "transition"), "max_dev_queries": ("rse", "transition"),
    "aspects": ("aspect",), "combine": ("aspect",), "split_field": ("aspect",), "project": ("aspect",),
    "text_field": ("aspect", "distill"),
    "lambda_": ("transition",), "off_temperature": ("transition",), "group_field": ("transition",),
    "max_sentences": ("distill",),
    "label_fraction": ("pu",), "prior": ("pu",), "pu_weight": ("pu",), "positive": ("pu",),
    "teachers": ("distill",),
    "max_length": ("rse", "aspect", "pu", "distill"),
}


ARGV_KEY = "relsearch.train.argv"


class _TrainCommand(click.Command):
    """Remembers the arguments it was given, as typed, so the model card records the command
    exactly (``--dev``, ``--test``, ``--out`` and all), in a shell or in-process (CliRunner)."""

    def make_context(self, info_name, args, parent=None, **extra):
        raw = list(args)
        ctx = super().make_context(info_name, args, parent=parent, **extra)
        ctx.meta[ARGV_KEY] = raw
        return ctx


def command_line() -> str:
    """``relsearch train`` and the arguments of the running command, quoted for a shell."""
    return shlex.join(["relsearch", "train", *click.get_current_context().meta.get(ARGV_KEY, [])])


def _description_map(specs) -> dict[str, str]:
    out = {}
    for spec in specs:
        name, sep, text = spec.partition("=")
        if not sep:
            raise click.BadParameter(f"{spec!r} is not NAME=TEXT", param_hint="--description")
        out[name.strip()] = text.strip()
    return out


@click.command("train", cls=_TrainCommand)
@click.argument("data", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--objective", type=click.Choice(OBJECTIVES), default="rse", show_default=True,
              help="rse: relation operators from triples; aspect: same-label operators from a labelled corpus; "
                   "transition: transition matrix from paraphrase triples; pu: PAUSE pair classifier from "
                   "(partly) labelled pairs; distill: student of several teachers from unlabelled sentences")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="bundle folder to write")
@click.option("--base", "--model", "base", default=None,
              help="encoder or bundle to start from (default: the shipped pack's all-MiniLM-L6-v2)")
@click.option("--dev", "dev_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="dev data for early stopping (same format as DATA); repeatable")
@click.option("--test", "test_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="test data: metrics vs identity go into the bundle and its card; repeatable")
@click.option("--regime", type=click.Choice(["adapter", "joint", "encoder"]), default=None,
              help="adapter: frozen encoder, operators only (default); joint: fine-tune the encoder too "
                   "(the corpus must then be re-indexed with the bundle); encoder: a relation-conditioned query "
                   "encoder (LoRA) over frozen documents: any index of the base encoder serves it")
@click.option("--operator", type=click.Choice(sorted(TRAINABLE)), default=None, help="rse operator kind")
@click.option("--negatives", type=click.Choice(["all", "batch", "table"]), default=None,
              help="rse adapter: all training texts of the relation (all), or in-batch tails + one hard negative "
                   "(batch); rse encoder: the whole text table (table, default) or in-batch tails and heads (batch)")
@click.option("--margin", type=float, default=None, help="rse encoder: additive margin on the gold cosine (0.02)")
@click.option("--pre-batch", type=int, default=None,
              help="rse encoder --negatives batch: tails of this many earlier batches are negatives too")
@click.option("--lora-rank", type=click.IntRange(min=0), default=None,
              help="rse encoder: rank of the query tower's LoRA deltas; 0 (default) tunes the whole weights")
@click.option("--layers", type=click.IntRange(min=0), default=None,
              help="rse encoder: top transformer layers tuned, the rest frozen (3; 0 = all)")
@click.option("--warmup", type=float, default=None, help="rse encoder: fraction of steps of linear warm-up (0.1)")
@click.option("--chunk", type=int, default=None, help="rse joint/encoder: texts per gradient-cache chunk")
@click.option("--inverse", is_flag=True, default=None,
              help="rse: also train <relation>^-1 on reversed triples, for head prediction (?, r, t)")
@click.option("--max-candidates", type=int, default=None, help="sampled softmax above this many texts")
@click.option("--relation", "relations", multiple=True, help="train only these relations (repeatable)")
@click.option("--candidates", type=click.Path(exists=True, dir_okay=False), default=None,
              help="rse: the corpus you index, JSONL ({\"text\"}) or text lines (e.g. all entity descriptions of a "
                   "knowledge graph): every relation's softmax also contrasts against it, and recipes are chosen and "
                   "judged on it (without it, on each split's own texts, and the report warns)")
@click.option("--keep-worse", is_flag=True, default=None,
              help="rse with --test: keep a recipe that ranks below identity on the test split (by more than 0.005), "
                   "with a warning, instead of shipping the relation as identity")
@click.option("--aspect", "aspects", multiple=True, help="aspect: label field (repeatable)")
@click.option("--combine", type=click.Choice(["separate", "union", "intersection"]), default=None,
              help="aspect: one operator per field, or one for sharing any / all of them")
@click.option("--split-field", default=None, help="aspect: field of DATA naming each row's split (train/dev/test)")
@click.option("--project", is_flag=True, default=None,
              help="aspect: learn a both-sides projection (documents projected too; searched in its own index)")
@click.option("--text-field", default=None, help="aspect/distill: the text field of DATA (default text)")
@click.option("--lambda", "lambda_", type=float, default=None, help="transition: weight of the diagonal term")
@click.option("--off-temperature", type=float, default=None,
              help="transition: soft-max temperature of the off-diagonal term (0 = its plain mean)")
@click.option("--group-field", default=None, help="transition: field naming each pair's meaning group (default group)")
@click.option("--max-sentences", type=int, default=None, help="distill: seeded subsample of the corpus sentences")
@click.option("--label-fraction", type=float, default=None, help="pu: keep labels on this fraction of pairs")
@click.option("--prior", type=float, default=None, help="pu: class prior π of the positive class")
@click.option("--pu-weight", type=float, default=None, help="pu: weight of the PU risk (0 = cross-entropy only)")
@click.option("--positive-label", "positive", default=None, help="pu: the label treated as positive")
@click.option("--teachers", default=None, help="distill: comma-separated teacher bundles or models")
@click.option("--epochs", type=int, default=None,
              help="maximum epochs (early stopping on --dev); with --time-budget and no --epochs, rse joint and "
                   "encoder train until the budget is spent or dev patience stops them")
@click.option("--patience", type=int, default=None,
              help="evaluations clearly below the best dev score (by 2 standard errors where the objective has "
                   "them: rse joint and encoder, pu, aspect joint) before stopping")
@click.option("--max-dev-queries", type=click.IntRange(min=1), default=None,
              help="rse, transition: dev queries scored per evaluation (a seeded sample; default 1000, adapter and "
                   "transition 2000); the dev MRR's standard error shrinks as 1/√N")
@click.option("--batch-size", type=int, default=None)
@click.option("--lr", type=float, default=None, help="learning rate (joint: the encoder's)")
@click.option("--relation-lr", type=float, default=None, help="rse joint: learning rate of the relation operators")
@click.option("--eval-every", type=int, default=None, help="rse joint: steps between dev evaluations")
@click.option("--temperature", type=float, default=None)
@click.option("--max-length", type=click.IntRange(min=1), default=None, help="tokens per text while fine-tuning")
@click.option("--threads", type=int, default=None, help="torch CPU threads while training")
@click.option("--time-budget", type=click.FloatRange(min=0, min_open=True), default=None, metavar="MINUTES",
              help="wall time of the whole command: training stops early enough (evaluations included, keeping "
                   "the best dev state) to leave a tenth for choosing recipes on --dev / --test, and relations "
                   "not fitted in time keep their operator alone; a resumed run counts the time already spent. "
                   "Without --epochs, rse joint and encoder ignore their default epoch count: the budget and dev "
                   "patience end training (the report says which)")
@click.option("--seed", type=int, default=None, help="runs with the same seed and data give the same bundle")
@click.option("--description", "descriptions", multiple=True, metavar="NAME=TEXT", help="operator description")
@click.option("--card-note", "card_notes", multiple=True, help="line for the model card's Notes; repeatable")
@click.option("--cache-dir", default=None, help="frozen-vector cache (default ~/.cache/relsearch/vectors)")
@click.option("--quiet", is_flag=True, help="no progress bars")
def train(data, objective, out, base, dev_files, test_files, card_notes, descriptions, quiet, **options):
    """Train OBJECTIVE on DATA and write a bundle that query / relations / score / lookup use.

    \b
    DATA formats (JSONL):
      rse, transition  {"head", "relation", "tail"[, "negative"][, "group"]}
      aspect           {"text", FIELD: label or [labels], ...}    (--aspect FIELD)
      pu               {"a", "b"[, "label"]}   no label = unlabelled
      distill          {"text"} or pairs {"a","b"} or triples: sentences only, no labels

    An interrupted run resumes from OUT.checkpoint when rerun with the same settings.
    """
    from pathlib import Path

    from .encoder.training import loop
    from .encoder.training.loop import Checkpoint, write_bundle
    from .encoder.training.options import RunOptions
    from .encoder.training.registry import trainer_for

    started = loop.clock()  # --time-budget covers the whole command: training, recipe fitting and writing
    given, minutes, keep_worse = _checked_options(objective, options, bool(test_files))
    fits = objective == "rse" and bool(dev_files or test_files)  # recipes are chosen after training
    run = RunOptions(base=base, out=out, threads=given.pop("threads", None), cache_dir=given.pop("cache_dir", None),
                     progress=not quiet)
    trainer = trainer_for(objective, given.pop("regime", None) if objective == "rse" else None)
    if trainer.name == "rse" and "max_length" in given:
        raise click.UsageError("--max-length applies to fine-tuning (--regime joint or encoder); the adapter regime "
                               "encodes with the base encoder's own maximum")
    try:
        data = _data(objective, data, dev_files, test_files, given)
        run = _budgeted(run, minutes, fits, started, epochs=given.get("epochs"))
        t_train = loop.clock()
        result = trainer.train(data, run, _config(trainer, given))
        training_seconds = loop.clock() - t_train
        _describe(result.bundle, _description_map(descriptions))
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        raise click.ClickException(str(e)) from e
    notes = [f"Trained with `{command_line()}`."] + list(card_notes)
    earlier = _record_budget(result.bundle, minutes, run, training_seconds)

    def card(bundle):
        return trainer.card(bundle, notes=notes) + budget_section(bundle)

    t_write = loop.clock()
    path = write_bundle(result.bundle, out, encoder=result.encoder, card=card(result.bundle))
    Checkpoint(out, {}).clear()
    for line in summary_lines(result.bundle):
        click.echo(line)
    if fits:
        # fitting must end in time for the bundle to be written again (as long as the first write took)
        deadline = started - earlier + 60 * minutes - (loop.clock() - t_write) if minutes else None
        _fit_recipes(path, data, run, card, deadline, command_started=started - earlier, keep_worse=keep_worse)
    elif trainer.name.startswith("rse"):
        click.echo("note: without --dev or --test the relations were not compared with identity, BM25 or hybrid "
                   "on a whole corpus, and --relation NAME runs the operator alone", err=True)
    if result.encoder is not None:
        click.echo("the encoder was fine-tuned: re-index your corpus with --model " + str(path))
    click.echo(f"bundle written to {path} (card: {Path(path) / CARD})")


def _checked_options(objective: str, options: dict, has_test: bool) -> tuple[dict, float | None, bool]:
    """The options the user gave (None and empty left out), less ``--time-budget`` and ``--keep-worse``,
    returned beside them; an option of another objective, or --keep-worse without --test, is refused."""
    given = {k: v for k, v in options.items() if v not in (None, ())}
    for key, allowed in ONLY_FOR.items():
        if key in given and objective not in allowed:
            raise click.UsageError(f"{_flag(key)} does not apply to --objective {objective} "
                                   f"(only {', '.join(allowed)})")
    minutes = given.pop("time_budget", None)
    keep_worse = bool(given.pop("keep_worse", False))
    if keep_worse and not has_test:
        raise click.UsageError("--keep-worse applies with --test: the split that judges a recipe against identity")
    return given, minutes, keep_worse


def _budgeted(run, minutes: float | None, fits: bool, started: float, *, epochs: int | None):
    """``run`` with the trainer's share of ``--time-budget`` (``minutes``): the budget less what is
    gone and what recipe fitting needs. Without --epochs (``epochs``: typed by the user), the budget
    and dev patience end the run (trainers whose config has until_budget)."""
    from dataclasses import replace

    from .encoder.training import loop

    if not minutes:
        return run
    share = 60 * minutes * (1 - FIT_SHARE if fits else 1) - (loop.clock() - started)
    return replace(run, time_budget=max(share, 1.0) / 60, until_budget=True if epochs is None else None)


def _record_budget(bundle, minutes: float | None, run, training_seconds: float) -> float:
    """Record how ``--time-budget`` went (bundle.json and the card); returns the training time of a
    resumed run's earlier sessions (0 without a budget)."""
    if not minutes:
        return 0.0
    earlier = max(0.0, _training_elapsed(bundle) - training_seconds)
    bundle.info["time_budget"] = {"minutes": minutes, "training_minutes": round(run.time_budget, 2),
                                  "training_seconds": round(training_seconds + earlier, 1)}
    return earlier


def _describe(bundle, descriptions: dict[str, str]) -> None:
    """Give the trained operators their ``--description``; one naming an operator not trained is refused."""
    for name, text in descriptions.items():
        if name not in bundle.operators:
            raise ValueError(f"--description names {name!r}, which this run did not train; trained: "
                             f"{', '.join(sorted(bundle.operators))}")
        bundle.operators[name].description = text


def _fit_recipes(path, data, run, card, deadline: float | None = None, command_started: float | None = None,
                 keep_worse: bool = False) -> None:
    """Choose and report each trained relation's recipe (:func:`retrieval.recipe_fit.fit_bundle`),
    its lines echoed here; a figure over a split's own candidates (no ``--candidates``) names the
    commands that measure it on the corpus a user indexes. A recipe that loses to identity on test
    ships as identity unless ``keep_worse``."""
    from .retrieval.recipe_fit import fit_bundle

    def remeasure(split: str) -> str:
        files = data.test if split == "test" else data.dev
        bench = shlex.join(["relsearch", "bench", "linkpred", files[0] if len(files) == 1 else "TEST.jsonl",
                            "--candidates", "CORPUS", "--model", str(path)])
        return f"`{bench}`, or train with the corpus as candidates: `{command_line()} --candidates CORPUS`"

    fit_bundle(path, data.dev, data.test, train=data.train, card=card, candidates=data.candidates,
               cache_dir=run.cache_dir, deadline=deadline, command_started=command_started, remeasure=remeasure,
               keep_worse=keep_worse, say=lambda line, err: click.echo(line, err=err))


def budget_section(bundle) -> str:
    """Markdown for the model card: how ``--time-budget`` was spent (bundle.info["time_budget"])."""
    spent = bundle.info.get("time_budget")
    if not spent:
        return ""
    line = (f"`--time-budget {spent['minutes']:g}` covers the whole `relsearch train` command: training was given "
            f"{spent['training_minutes']:g} min and used {spent['training_seconds']:g} s")
    if "fitting_seconds" in spent:
        late = spent["relations_not_fitted"]
        line += (f"; choosing recipes took {spent['fitting_seconds']:g} s for {spent['relations_fitted']} relations"
                 + (f", and {len(late)} more were not fitted in time (they run their operator alone: "
                    f"{', '.join(late)})" if late else "")
                 + f"; {spent['seconds_to_last_write']:g} s from the start to the bundle's last write")
    return "\n## Time budget\n\n" + line + ".\n"


def _training_elapsed(bundle) -> float:
    """Seconds the trainer's own budget recorded (earlier sessions of a resumed run included); 0 if none."""
    return max([float(op.info.get("training", {}).get("elapsed_seconds") or 0.0) for op in bundle.operators.values()]
               + [float((bundle.info.get("training") or {}).get("elapsed_seconds") or 0.0)])


def _data(objective, train, dev, test, given: dict):
    """The run's files plus the objective's extra inputs (taken out of ``given``)."""
    from .encoder.training.options import TrainData

    candidates = given.pop("candidates", None)
    if candidates:
        from .bench.linkpred import read_texts

        candidates = read_texts(candidates)
    teachers = ()
    if objective == "distill":
        teachers = tuple(t.strip() for t in given.pop("teachers", "").split(",") if t.strip())
        if not teachers:
            raise click.UsageError("--objective distill needs --teachers A,B,...")
    return TrainData(train=train, dev=dev, test=test, candidates=candidates, teachers=teachers)


def _config(trainer, given: dict):
    """The trainer's config from the options; an option its config lacks is a usage error."""
    from .encoder.training.registry import UnknownOptions

    try:
        return trainer.config(given)
    except UnknownOptions as e:
        raise click.UsageError(f"{', '.join(_flag(k) for k in e.names)} not supported by {e.config_cls.__name__}") \
            from None


def _flag(name: str) -> str:
    """The command-line spelling of option ``name`` (e.g. aspects → --aspect)."""
    params = click.get_current_context().command.params
    return next((p.opts[0] for p in params if p.name == name), "--" + name.replace("_", "-"))
