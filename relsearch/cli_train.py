"""``relsearch train``: learn relation operators on a frozen encoder, write a bundle + model card.

Registered in :mod:`relsearch.cli` with ``cli.add_command(train)``.
"""
from __future__ import annotations

import click

CARD = "MODEL_CARD.md"


def _fmt(x) -> str:
    return "–" if x is None else f"{x:.3f}"


def _trained_ops(bundle):
    return [op for name, op in sorted(bundle.operators.items()) if op.kind != "identity"]


def metrics_rows(bundle) -> list[dict]:
    """One row per trained operator: name, kind, test size, trained and identity metrics (may be empty)."""
    rows = []
    for op in _trained_ops(bundle):
        m = op.info.get("metrics", {})
        rows.append({"relation": op.name, "kind": op.kind, "queries": m.get("queries"),
                     "candidates": m.get("candidates"), "trained": m.get("trained", {}),
                     "identity": m.get("identity", {})})
    return rows


def print_metrics_table(bundle, echo=click.echo) -> None:
    """Per-relation test MRR / Hits@10, trained operator vs identity."""
    rows = metrics_rows(bundle)
    width = max([len(r["relation"]) for r in rows] + [8])
    echo(f"{'relation':<{width}}  {'queries':>7}  {'cands':>6}  {'MRR':>6}  {'id MRR':>6}  {'H@10':>6}  {'id H@10':>7}")
    for r in rows:
        t, i = r["trained"], r["identity"]
        echo(f"{r['relation']:<{width}}  {r['queries'] or 0:>7}  {r['candidates'] or 0:>6}  {_fmt(t.get('mrr')):>6}  "
             f"{_fmt(i.get('mrr')):>6}  {_fmt(t.get('hits@10')):>6}  {_fmt(i.get('hits@10')):>7}")


def render_model_card(bundle, *, title: str = "relsearch relation operators", notes: list[str] | tuple = ()) -> str:
    """Markdown model card: encoder, data, hyperparameters, test metrics vs identity, sources and licences."""
    enc = bundle.encoder
    ops = _trained_ops(bundle)
    config = bundle.info.get("config", {})
    sources = bundle.info.get("sources", {})
    lines = [f"# {title}", "",
             f"Relation operators trained by `relsearch train` (adapter regime: frozen encoder, RSE contrastive "
             f"loss). Load with `relsearch.encoder.bundle.load_bundle(path)`.", "",
             "## Encoder", "",
             f"`{enc.get('model')}` — pooling {enc.get('pooling')}, max length {enc.get('max_length')}, "
             f"dim {enc.get('dim')}, weights sha256 `{enc.get('weights_sha256')}`. Documents are indexed with this "
             "encoder unchanged; only the query side is transformed.", "",
             "## Hyperparameters", "",
             ", ".join(f"{k} = {v}" for k, v in config.items()), "",
             "## Operators and data", "",
             "| relation | kind | description | train triples | hard negatives | dev triples | test triples | best epoch | dev MRR |",
             "|---|---|---|---|---|---|---|---|---|"]
    for op in ops:
        data, tr = op.info.get("data", {}), op.info.get("training", {})
        lines.append(f"| {op.name} | {op.kind} | {op.description} | {data.get('train', {}).get('triples', 0)} | "
                     f"{data.get('train', {}).get('hard_negatives', 0)} | {data.get('dev', {}).get('triples', 0)} | "
                     f"{data.get('test', {}).get('triples', 0)} | {tr.get('best_epoch')} | {_fmt(tr.get('dev_mrr'))} |")
    if not sources:  # without a sources table, name the triples files themselves
        lines += ["", "Files: " + "; ".join(
            f"{op.name}: " + ", ".join(f"{s} = {', '.join(v.get('files', [])) or '—'}"
                                       for s, v in op.info.get("data", {}).items()) for op in ops)]
    lines += ["", "## Test metrics vs identity", "",
        "MRR in bold where the operator beats identity.", "",
        "| relation | queries | candidates | MRR | MRR (identity) | Hits@1 | Hits@1 (id) | Hits@10 | Hits@10 (id) | MR | MR (id) |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in metrics_rows(bundle):
        t, i = r["trained"], r["identity"]
        if not t:
            lines.append(f"| {r['relation']} | no test triples | | | | | | | | | |")
            continue
        mrr = f"**{_fmt(t['mrr'])}**" if t["mrr"] > i["mrr"] else _fmt(t["mrr"])
        lines.append(f"| {r['relation']} | {r['queries']} | {r['candidates']} | {mrr} | {_fmt(i['mrr'])} | "
                     f"{_fmt(t['hits@1'])} | {_fmt(i['hits@1'])} | {_fmt(t['hits@10'])} | {_fmt(i['hits@10'])} | "
                     f"{t['mr']:.1f} | {i['mr']:.1f} |")
    protocol = next((op.info["metrics"]["protocol"] for op in ops if "protocol" in op.info.get("metrics", {})), "")
    lines += ["", f"Protocol: {protocol}. Identity = plain cosine of the same encoder.", ""]
    if sources:
        lines += ["## Sources and licences", "",
                  "The operators are derived from these datasets; their licences constrain use of this pack "
                  "(several are non-commercial).", "", "| relation | dataset | files | licence |", "|---|---|---|---|"]
        lines += [f"| {rel} | {s.get('dataset', '')} | {s.get('files', '')} | {s.get('licence', '')} |"
                  for rel, s in sources.items()]
        lines.append("")
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


@click.command("train")
@click.argument("triples", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="bundle folder to write")
@click.option("--dev", "dev_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="dev triples (early stopping on MRR); repeatable")
@click.option("--test", "test_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="test triples (metrics vs identity in the bundle and card); repeatable")
@click.option("--operator", type=click.Choice(["linear", "translation"]), default="linear", show_default=True)
@click.option("--model", default=None, help="encoder model id or path (default: all-MiniLM-L6-v2)")
@click.option("--epochs", type=int, default=30, show_default=True, help="maximum epochs")
@click.option("--patience", type=int, default=4, show_default=True, help="epochs without dev gain before stopping")
@click.option("--batch-size", type=int, default=256, show_default=True)
@click.option("--lr", type=float, default=None, help="default 3e-3 (linear) / 1e-2 (translation)")
@click.option("--temperature", type=float, default=0.05, show_default=True)
@click.option("--negatives", type=click.Choice(["all", "batch"]), default="all", show_default=True,
              help="all: every training text of the relation; batch: in-batch tails + one hard negative")
@click.option("--max-candidates", type=int, default=8192, show_default=True,
              help="negatives=all: above this many texts, sample this many per batch")
@click.option("--threads", type=int, default=None, help="torch CPU threads while training")
@click.option("--seed", type=int, default=13, show_default=True)
@click.option("--relation", "relations", multiple=True, help="train only these relations (repeatable)")
@click.option("--description", "descriptions", multiple=True, metavar="NAME=TEXT", help="operator description")
@click.option("--card-note", "card_notes", multiple=True,
              help="line for the model card's Notes (e.g. the data's licence); repeatable")
@click.option("--cache-dir", default=None, help="vector cache (default ~/.cache/relsearch/vectors)")
@click.option("--quiet", is_flag=True, help="no progress bars")
def train(triples, out, dev_files, test_files, operator, model, epochs, patience, batch_size, lr, temperature,
          negatives, max_candidates, threads, seed, relations, descriptions, card_notes, cache_dir, quiet):
    """Learn one relation operator per relation in TRIPLES (JSONL: head, relation, tail[, negative][, group]).

    The encoder stays frozen; its vectors are cached on disk, so a rerun on the same texts encodes
    nothing. With --dev, training stops when dev MRR has not improved for --patience epochs and keeps
    the best epoch; without it, all --epochs run and the last is kept. With --test, the bundle and
    MODEL_CARD.md report test link prediction of each operator against identity.
    """
    from pathlib import Path

    from .encoder.model import Encoder, EncoderConfig
    from .encoder.training import TrainConfig, train_adapter

    desc = {}
    for spec in descriptions:
        name, sep, text = spec.partition("=")
        if not sep:
            raise click.BadParameter(f"{spec!r} is not NAME=TEXT", param_hint="--description")
        desc[name.strip()] = text.strip()
    try:
        config = TrainConfig(operator=operator, epochs=epochs, patience=patience, batch_size=batch_size, lr=lr,
                             temperature=temperature, negatives=negatives, seed=seed,
                             max_candidates=max_candidates, threads=threads,
                             relations=tuple(relations) or None, cache_dir=cache_dir, progress=not quiet)
        encoder = Encoder(EncoderConfig(model=model) if model else EncoderConfig())
        bundle = train_adapter(list(triples), dev_files=list(dev_files), test_files=list(test_files),
                               config=config, encoder=encoder, descriptions=desc)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        raise click.ClickException(str(e)) from e
    path = bundle.save(out)
    notes = [f"Trained with `relsearch train {' '.join(triples)}`."] + list(card_notes)
    (Path(path) / CARD).write_text(render_model_card(bundle, notes=notes))
    print_metrics_table(bundle)
    click.echo(f"bundle written to {path} (operators: {', '.join(op.name for op in _trained_ops(bundle))})")
