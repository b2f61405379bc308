"""Model cards and metric tables for trained bundles, whatever the objective.

Every trained operator carries ``info["metrics"]`` = ``{"split", "protocol", "metric" (the main
one, default "mrr"), "queries", "candidates", "trained": {...}, "identity": {...}}``; re-ranking
heads carry ``info["metrics"]`` with their classification scores. Distillation puts its STS
figures in ``bundle.info["metrics"]``. A bundle trained with ``--inverse`` also carries
``bundle.info["link_prediction"]``: tail, head and mean figures (:mod:`.directions`).
"""
from __future__ import annotations

import dataclasses

from .directions import direction_lines, direction_table
from .options import CONFIG_RUN_FIELDS

CARD = "MODEL_CARD.md"
# Shown, in this order, when an operator has them.
METRIC_ORDER = ("mrr", "hits@1", "hits@10", "mr", "p@10", "r@10", "mrr@10", "spearman")


def hyperparameters(config, **values) -> dict:
    """The hyperparameter record of a run: ``config`` (an objective's config dataclass) as a dict,
    updated with ``values`` (e.g. resolved learning rates, the base model, the data files), without
    the run options (:data:`.options.CONFIG_RUN_FIELDS`), tuples as lists.

    Bundles store it as ``info["config"]`` and each operator's ``info["hyperparameters"]``, the
    model card prints it, and checkpoints compare it so a rerun never resumes another run.
    """
    d = dataclasses.asdict(config)
    d.update(values)
    for k in CONFIG_RUN_FIELDS:
        d.pop(k, None)
    for k, v in d.items():
        if isinstance(v, tuple):
            d[k] = list(v)
    if "relations" in d and not d["relations"]:
        d["relations"] = None  # every relation of the training data
    return d


def fmt(x) -> str:
    return "–" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


def trained_operators(bundle) -> list:
    return [op for _, op in sorted(bundle.operators.items()) if op.info.get("metrics") or op.kind != "identity"]


def metric_keys(metrics: dict) -> list[str]:
    trained = metrics.get("trained", {})
    return [k for k in METRIC_ORDER if isinstance(trained.get(k), (int, float))]


def summary_lines(bundle) -> list[str]:
    """One line per trained operator / head: main test metrics beside identity's."""
    lines = []
    for op in trained_operators(bundle):
        m = op.info.get("metrics", {})
        keys = metric_keys(m)[:3]
        parts = [f"{k} {m['trained'][k]:.3f} (identity {m.get('identity', {}).get(k, float('nan')):.3f})" for k in keys]
        size = f", {m['queries']} queries" if m.get("queries") else ""
        if size and m.get("candidates"):  # what this figure ranks among: not the corpus a user indexes
            size += f" over {m['candidates']} texts (the trainer's candidate table, not the corpus you index)"
        lines.append(f"{op.name:<24} {op.kind:<12} " + (", ".join(parts) + size if parts else "no test metrics"))
    for name, head in sorted(getattr(bundle, "heads", {}).items()):
        m = head.info.get("metrics", {})
        shown = ", ".join(f"{k} {v:.3f}" for k, v in m.items() if isinstance(v, float))
        lines.append(f"{name:<24} {head.kind:<12} {shown or 'no test metrics'}")
    sts = bundle.info.get("metrics", {})
    if sts:
        lines.append("bundle metrics: " + ", ".join(f"{k} {fmt(v)}" for k, v in sts.items() if not isinstance(v, dict)))
    return lines + direction_lines(bundle.info.get("link_prediction")) + stop_lines(bundle)


def _records(bundle) -> list[tuple[list[str], dict]]:
    """(operator names, training record) per distinct training record (operators trained together share one)."""
    out: dict[str, tuple[list[str], dict]] = {}
    records = [(op.name, op.info.get("training")) for op in trained_operators(bundle)]
    if isinstance(bundle.info.get("training"), dict):
        records.append(("bundle", bundle.info["training"]))
    for name, tr in records:
        if isinstance(tr, dict) and tr:
            out.setdefault(repr(sorted((k, str(v)) for k, v in tr.items())), ([], tr))[0].append(name)
    return list(out.values())


def stop_lines(bundle) -> list[str]:
    """Why training ended (``stopped_by``: time budget, patience or epochs): for one shared run its
    steps, epochs, limit and best dev score (per direction when recorded); else a count per reason."""
    runs = [(names, tr) for names, tr in _records(bundle) if tr.get("stopped_by")]
    if len(runs) == 1:
        tr = runs[0][1]
        done = (f"{tr['steps']} steps" + (f" ({tr['epochs_run']:g} epochs)" if tr.get("epochs_run") is not None else "")
                if tr.get("steps") is not None else f"{tr.get('epochs_run', '–')} epochs")
        limit = (", no epoch limit (--time-budget without --epochs: the budget and dev patience decide)"
                 if "max_epochs" in tr and tr["max_epochs"] is None else
                 f", at most {tr['max_epochs']} epochs" if tr.get("max_epochs") else "")
        best = ""
        if isinstance(tr.get("dev_mrr"), (int, float)):
            point = next((h for h in tr.get("history", []) if h.get("step", h.get("epoch")) ==
                          tr.get("best_step", tr.get("best_epoch"))), {})
            sides = [f"{k[8:]} {point[k]:.3f}" for k in ("dev_mrr_tail", "dev_mrr_head") if k in point]
            se = f" ± {point['dev_mrr_se']:.3f}" if isinstance(point.get("dev_mrr_se"), (int, float)) else ""
            best = (f"; best dev MRR {tr['dev_mrr']:.3f}{se}" + (f" ({', '.join(sides)})" if sides else "")
                    + (f" at step {tr['best_step']}" if tr.get("best_step") is not None else ""))
        return [f"training stopped by {tr['stopped_by']}: {done}{limit}{best}"]
    if runs:
        counts: dict[str, int] = {}
        for names, tr in runs:
            counts[tr["stopped_by"]] = counts.get(tr["stopped_by"], 0) + len(names)
        return ["training stopped by " + ", ".join(f"{reason} ({n} operators)" for reason, n in sorted(counts.items()))]
    return []


def render_model_card(bundle, *, title: str = "relsearch bundle", notes: list[str] | tuple = ()) -> str:
    """Markdown: encoder, hyperparameters, operators with data and test metrics vs identity, heads, notes."""
    enc = bundle.encoder
    info = bundle.info
    fine_tuned = bool(enc.get("path"))
    lines = [f"# {title}", "", f"Trained by {info.get('trainer', 'relsearch train')}. Load with "
             "`relsearch.encoder.bundle.load_bundle(path)` or pass the folder as `--model`.", "", "## Encoder", "",
             f"`{enc.get('model')}` — pooling {enc.get('pooling')}, max length {enc.get('max_length')}, dim "
             f"{enc.get('dim')}, weights sha256 `{enc.get('weights_sha256')}`.", ""]
    lines.append("The encoder was **fine-tuned**; its weights are in `encoder/`. Corpora indexed with another encoder "
                 "must be re-indexed with this bundle (queries refuse a mismatched index)." if fine_tuned else
                 "The encoder is unchanged: indexes built with it stay valid; only the query side is transformed.")
    lines += ["", "## Hyperparameters", "", ", ".join(f"{k} = {v}" for k, v in info.get("config", {}).items()), ""]
    ops = trained_operators(bundle)
    lines += _operator_table(ops) + _tower_lines(ops)
    lines += direction_table(info.get("link_prediction"))
    runs = training_lines(bundle)
    if runs:
        lines += ["## Training runs", "", *runs, ""]
    lines += _head_lines(getattr(bundle, "heads", {}))
    if info.get("metrics"):
        lines += ["## Bundle metrics", "", "```", *(f"{k}: {v}" for k, v in info["metrics"].items()), "```", ""]
    sources = info.get("sources", {})
    if sources:
        lines += ["## Sources and licences", "",
                  "The operators are derived from these datasets; their licences constrain use of this bundle "
                  "(several are non-commercial).", "", "| relation | dataset | files | licence |", "|---|---|---|---|"]
        lines += [f"| {rel} | {s.get('dataset', '')} | {s.get('files', '')} | {s.get('licence', '')} |"
                  for rel, s in sources.items()]
        lines.append("")
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def _operator_table(ops: list) -> list[str]:
    """The card's table of the trained operators: data, best epoch, test metrics against identity
    (the main one in bold where the operator beats it), and the protocols measured by."""
    if not ops:
        return []
    lines = ["## Operators: test metrics vs identity", "",
             "Identity = plain cosine of the base encoder. Main metric in bold where the operator beats it.", "",
             "| operator | kind | description | data | best epoch | metrics (trained / identity) |",
             "|---|---|---|---|---|---|"]
    for op in ops:
        m, tr = op.info.get("metrics", {}), op.info.get("training", {})
        data = "; ".join(f"{s} {_size(v)}" for s, v in op.info.get("data", {}).items())
        main = m.get("metric", "mrr")
        cells = []
        for k in metric_keys(m):
            t, i = m["trained"][k], m.get("identity", {}).get(k)
            better = i is not None and (t < i if k == "mr" else t > i)
            cells.append(f"{k} " + (f"**{fmt(t)}**" if k == main and better else fmt(t)) + f" / {fmt(i)}")
        lines.append(f"| {op.name} | {op.kind} | {op.description} | {data} | {tr.get('best_epoch', '–')} | "
                     f"{'; '.join(cells) or 'no test data'} |")
    protocols = sorted({op.info["metrics"]["protocol"] for op in ops if op.info.get("metrics", {}).get("protocol")})
    return lines + [""] + [f"Protocol: {p}." for p in protocols] + [""]


def _tower_lines(ops: list) -> list[str]:
    """The card's list of query towers (operators of kind ``encoder``): what each trains, who uses it, how it went."""
    towers = {op.info["tower"]["name"]: op for op in ops if op.kind == "encoder"}
    if not towers:
        return []
    lines = ["## Query towers (operators of kind `encoder`)", ""]
    for name, op in sorted(towers.items()):
        t, tr = op.info["tower"], op.info.get("training", {})
        users = ", ".join(sorted(o.name for o in ops if o.kind == "encoder" and o.info["tower"]["name"] == name))
        what = f"LoRA rank {t['rank']}" if t.get("rank") else "whole weights"
        where = f"layers {', '.join(map(str, t['layers']))}" if t.get("layers") else "all layers"
        lines.append(f"- `{name}`: {what} of {', '.join(t.get('targets', []))} in {where} of the encoder "
                     f"above, reading `{t['marker']}`; used by {users}. Trained {tr.get('steps')} steps in "
                     f"{tr.get('train_seconds')} s on {tr.get('device')} "
                     f"({tr.get('triples_per_second')} triples/s); "
                     f"best step {tr.get('best_step')}, learned temperature {tr.get('temperature')}.")
    return lines + [""]


def _head_lines(heads: dict) -> list[str]:
    """The card's list of re-ranking heads with their scalar metrics."""
    if not heads:
        return []
    lines = ["## Re-ranking heads (`relsearch query --rerank NAME`)", ""]
    for name, head in sorted(heads.items()):
        m = head.info.get("metrics", {})
        lines.append(f"- `{name}` ({head.kind}): " + ", ".join(f"{k} {fmt(v)}" for k, v in m.items()
                                                              if not isinstance(v, (dict, list))))
    return lines + [""]


def training_lines(bundle) -> list[str]:
    """One line per distinct training record that has speed and budget figures (the fine-tuning
    regimes, and any objective run under ``--time-budget``): steps, speed, dtype, the budget and
    what stopped the run, and the dev curve (step, seconds since the start, dev metric)."""
    seen, lines = set(), []
    records = [(op.name, op.info.get("training", {})) for op in trained_operators(bundle)]
    if isinstance(bundle.info.get("training"), dict):
        records.append(("bundle", bundle.info["training"]))
    for name, tr in records:
        if not isinstance(tr, dict) or not ("stopped_by" in tr or tr.get("time_budget_minutes")):
            continue
        key = repr(sorted((k, str(v)) for k, v in tr.items()))
        if key in seen:  # operators trained together share one record
            continue
        seen.add(key)
        users = [n for n, t in records if t is tr or repr(sorted((k, str(v)) for k, v in t.items())) == key]
        budget = tr.get("time_budget_minutes")
        parts = [f"{tr['steps']} steps" + (f" ({tr['epochs_run']:g} epochs)" if tr.get("epochs_run") is not None else "")
                 if tr.get("steps") is not None else f"{tr.get('epochs_run', '–')} epochs"]
        if "max_epochs" in tr:
            parts.append("no epoch limit (the time budget and dev patience decide)" if tr["max_epochs"] is None
                         else f"at most {tr['max_epochs']} epochs")
        if tr.get("triples_per_second"):
            parts.append(f"{tr['triples_per_second']} triples/s")
        if tr.get("precision"):
            parts.append(f"{tr['precision']} ({tr.get('precision_reason', '')})")
        parts.append(f"time budget {budget} min" if budget else "no time budget")
        parts.append(f"{tr.get('elapsed_seconds', tr.get('seconds', '–'))} s used")
        parts.append(f"stopped by {tr.get('stopped_by', 'the time budget' if tr.get('stopped_by_time_budget') else 'epochs')}")
        curve = [_curve_point(h) for h in tr.get("history", [])]
        lines.append(f"- {', '.join(users)}: " + "; ".join(parts) + "."
                     + (f" Dev curve (step or epoch @ seconds: score): {', '.join(c for c in curve if c)}." if curve else ""))
    return lines


def _curve_point(h: dict) -> str:
    at = h.get("step", h.get("epoch"))
    score = next((v for k, v in h.items() if k.startswith("dev_") and isinstance(v, (int, float))), None)
    if at is None or score is None:
        return ""
    return f"{at}" + (f" @ {h['seconds']} s" if h.get("seconds") is not None else "") + f": {score:.4f}"


def _size(v: dict) -> str:
    for key in ("triples", "documents", "pairs", "sentences"):
        if key in v:
            return f"{v[key]} {key}"
    return ""


def distill_card(bundle, *, notes=()) -> str:
    """Markdown model card of a distilled student: teachers, data, hyperparameters, test Spearman."""
    info = bundle.info
    m, tr, data = info.get("metrics"), info.get("training", {}), info.get("data", {})

    lines = ["# relsearch distilled encoder", "",
             "A student encoder trained by `relsearch train --objective distill`: MSE to the mean of its teachers' "
             "raw mean-pooled embeddings on unlabelled sentences. Its weights are in `encoder/`; indexes built "
             "with another encoder must be rebuilt.", "",
             f"- Base (start of the student): `{info.get('base')}`",
             "- Teachers: " + ", ".join(f"`{t}`" for t in info.get("teachers", [])),
             f"- Corpus: {data.get('corpus', {}).get('sentences', 0)} sentences from "
             + ", ".join(data.get("corpus", {}).get("files", [])),
             "- Hyperparameters: " + ", ".join(f"{k} = {v}" for k, v in info.get("config", {}).items()),
             f"- Training: {tr.get('epochs_run')} epoch(s), best epoch {tr.get('best_epoch')} on dev "
             f"{tr.get('dev_metric') or '(none: last epoch kept)'} {_fmt4(tr.get('dev_best'))}", ""]
    if m:
        lines += ["## Test (STS, Spearman of cosine vs score)", "", f"{m['pairs']} pairs: {', '.join(m['files'])}", "",
                  "| model | Spearman |", "|---|---|"]
        lines += [f"| teacher `{t}` | {_fmt4(v)} |" for t, v in m["teachers"].items()]
        lines += [f"| mean of the teachers | {_fmt4(m['teachers_mean'])} |",
                  f"| ensemble (teachers' mean embedding) | {_fmt4(m['ensemble'])} |",
                  f"| base, before distillation | {_fmt4(m.get('base'))} |",
                  f"| **student** | **{_fmt4(m['student'])}** |", ""]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def _fmt4(x) -> str:
    return "–" if x is None else f"{x:.4f}"
