"""``relsearch bench all``: the default relation pack on the shared datasets, as one markdown report.

Every step is an ordinary ``bench linkpred|retrieval|sts`` run; its JSON records the equivalent
standalone command, so any number in the report can be reproduced alone. Derived inputs (candidate
lists, company triples) are written to ``OUT/inputs/`` first. This is the only module that knows
relation and dataset names.

Runtime: encoding ~62k distinct texts dominates; vectors are cached (``--cache``), so a re-run
mostly scores. See docs/benchmarks.md for measured times.
"""
from __future__ import annotations

import json
import os
import shlex
import time
from collections import defaultdict
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from . import plots
from .linkpred import LinkPredJob, raw_vectors, run_linkpred
from .linkpred import table as linkpred_table
from .report import BenchInputError, Table, data_fingerprint, machine_info, model_fingerprint, package_versions, write_json
from .retrieval import RetrievalJob, run_retrieval
from .retrieval import table as retrieval_table
from .sts import STSJob, run_sts

DEFAULT_DATA = "../shared/data"  # the project's shared datasets, beside a checkout
PACK_RELATIONS = ("duplicate-question", "qa-entailment", "paraphrase", "same-caption", "entailment", "contradiction",
                  "similar-company")
# RSE README, same_sent relation, raw protocol (percent); see /work/shared/data/evalrank/README.md
EVALRANK_PUBLISHED = {
    "RSE-BERT-base-USEB": (68.61, 47.90, 87.47), "RSE-BERT-large-USEB": (68.17, 46.73, 87.18),
    "RSE-RoBERTa-base-USEB": (70.92, 50.52, 90.49), "RSE-RoBERTa-large-USEB": (70.48, 49.25, 90.97),
}
RUNNERS = {"linkpred": run_linkpred, "retrieval": run_retrieval, "sts": run_sts}


@dataclass(frozen=True, kw_only=True)
class SuiteJob:
    out: str
    data: str | None = None  # default: $RELSEARCH_DATA or ../shared/data
    model: str | None = None
    cache_dir: str | None = None
    precision: str = "auto"
    progress: bool = False


@dataclass
class Step:
    name: str  # file stem of its JSON / PNG
    kind: str  # linkpred | retrieval | sts
    dataset: str
    job: object
    note: str = ""
    result: dict = field(default_factory=dict)
    seconds: float = 0.0


# ---------------------------------------------------------------- derived inputs

def _read(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _write(path: Path, rows) -> str:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _texts(rows, *keys) -> list[dict]:
    return [{"text": t} for t in dict.fromkeys(r[k] for r in rows for k in keys)]


def prepare_inputs(data: Path, inputs: Path) -> dict[str, str]:
    """Candidate lists and triples the datasets do not ship as such; returns name → path."""
    inputs.mkdir(parents=True, exist_ok=True)
    def pair_texts(name, *keys, split="test"):
        return _texts(_read(data / name / f"pairs/{split}.jsonl"), *keys)

    flickr_test = [r for r in _read(data / "flickr8k_captions/corpus.jsonl") if r["split"] == "test"]
    out = {
        "trecqa_candidates": _write(inputs / "trecqa_test_sentences.jsonl", pair_texts("trecqa", "b")),
        "msrp_candidates": _write(inputs / "msrp_test_sentences.jsonl", pair_texts("msrp", "a", "b")),
        "sick_candidates": _write(inputs / "sick_test_sentences.jsonl", pair_texts("sick", "a", "b")),
        "flickr_candidates": _write(inputs / "flickr8k_test_captions.jsonl", _texts(flickr_test, "text")),
        "evalrank_triples": _write(inputs / "evalrank_test_triples.jsonl", (
            {"head": q["query"], "relation": "same_sent", "tail": q["positive"]}
            for q in _read(data / "evalrank/queries/test.jsonl"))),
    }
    # dev splits: for choosing a setting (the weighted hybrid's weight) without looking at test
    out["trecqa_dev_candidates"] = _write(inputs / "trecqa_dev_sentences.jsonl", pair_texts("trecqa", "b", split="dev"))
    for split, suffix in (("test", ""), ("dev", "_dev")):
        companies = [c for c in _read(data / "russell3000_companies/corpus.jsonl")
                     if c["split"] == split and c.get("text") and c.get("gics_sub_industry_code")]
        groups = defaultdict(list)
        for c in companies:
            groups[c["gics_sub_industry_code"]].append(c["text"])
        out[f"company_triples{suffix}"] = _write(inputs / f"russell3000_similar_company_{split}.jsonl", (
            {"head": a, "relation": "similar-company", "tail": b} for texts in groups.values()
            for a in texts for b in texts if a != b))
        out[f"company_candidates{suffix}"] = _write(inputs / f"russell3000_{split}_companies.jsonl",
                                                    _texts(companies, "text"))
    return out


def sp500_overlap(data: Path) -> tuple[int, int]:
    """(sp500 test companies, of which in russell3000's train/dev split — seen by similar-company)."""
    russell = {c["id"]: c["split"] for c in _read(data / "russell3000_companies/corpus.jsonl")}
    test = [c["id"] for c in _read(data / "sp500_companies/corpus.jsonl") if c["split"] == "test"]
    return len(test), sum(russell.get(t) in ("train", "dev") for t in test)


# ---------------------------------------------------------------- the plan

def plan(data: Path, inp: dict[str, str], job: SuiteJob) -> list[Step]:
    common = {"model": job.model, "cache_dir": job.cache_dir, "precision": job.precision, "progress": job.progress}

    def triples(name, split):
        return str(data / name / "triples" / f"{split}.jsonl")

    def known(name):
        return (triples(name, "train"), triples(name, "dev"))

    every_sentence = "candidates = every sentence of the test pairs"
    lp = [
        ("duplicate-question", "meta_se_dupq", str(data / "meta_se_dupq/corpus.jsonl"), "candidates = all 1,875 questions"),
        ("qa-entailment", "trecqa", inp["trecqa_candidates"],
         "candidates = every test answer sentence (questions are not candidates)"),
        ("paraphrase", "msrp", inp["msrp_candidates"], every_sentence),
        ("same-caption", "flickr8k_captions", inp["flickr_candidates"], "candidates = the 5,000 test captions"),
        ("entailment+contradiction", "sick", inp["sick_candidates"], every_sentence),
    ]
    steps = [Step(f"linkpred_{ds}", "linkpred", ds, LinkPredJob(test=triples(ds, "test"), candidates=cands,
                                                                 known=known(ds), **common), note=f"{rel}: {note}")
             for rel, ds, cands, note in lp]
    steps.append(Step("linkpred_russell3000", "linkpred", "russell3000_companies", LinkPredJob(
        test=inp["company_triples"], candidates=inp["company_candidates"], **common),
        note="similar-company: ordered pairs of test-split companies sharing a GICS sub-industry; "
             "candidates = all test companies"))
    steps.append(Step("linkpred_evalrank", "linkpred", "evalrank", LinkPredJob(
        test=inp["evalrank_triples"], candidates=str(data / "evalrank/corpus.jsonl"), relations=("paraphrase",),
        **common), note="EvalRank positive pairs scored with the paraphrase operator (the pack's closest to RSE's "
                        "same_sent)"))
    russell = str(data / "russell3000_companies/corpus.jsonl")
    for aspect in ("gics_sector", "gics_industry", "gics_sub_industry_code"):
        steps.append(Step(f"retrieval_russell3000_{aspect}", "retrieval", "russell3000_companies", RetrievalJob(
            corpus=russell, aspect=aspect, relations=("similar-company",), **common)))
    n, seen = sp500_overlap(data)
    steps.append(Step("retrieval_sp500_gics_sector", "retrieval", "sp500_companies", RetrievalJob(
        corpus=str(data / "sp500_companies/corpus.jsonl"), aspect="gics_sector", relations=("similar-company",), **common),
        note=f"not leak-free: {seen} of these {n} test companies are russell3000 train/dev companies, "
             f"seen by similar-company in training"))
    steps.append(Step("retrieval_flickr8k_image", "retrieval", "flickr8k_captions", RetrievalJob(
        corpus=str(data / "flickr8k_captions/corpus.jsonl"), aspect="image", relations=("same-caption",), **common),
        note="relevant = the other 4 captions of the same image"))
    for ds, by in (("stsb", None), ("sick", None), ("sts12_16", "year")):
        steps.append(Step(f"sts_{ds}", "sts", ds, STSJob(pairs=str(data / ds / "pairs/test.jsonl"), by=by, **common)))
    return steps


def cli_command(step: Step, out: Path) -> str:
    """The standalone ``relsearch bench`` command equivalent to ``step``."""
    argv = ["relsearch", "bench", step.kind]
    job = step.job
    positional = {"linkpred": "test", "retrieval": "corpus", "sts": "pairs"}[step.kind]
    argv.append(getattr(job, positional))
    defaults = {f.name: f.default for f in fields(job)}
    for f in fields(job):
        value = getattr(job, f.name)
        if f.name in (positional, "progress", "chunk") or value == defaults[f.name]:
            continue
        flag = {"relations": "--relation", "cache_dir": "--cache"}.get(f.name, "--" + f.name.replace("_", "-"))
        if isinstance(value, bool):
            argv.append(flag)
        elif isinstance(value, tuple):
            for v in value:
                argv += [flag, str(v)]
        else:
            argv += [flag, str(value)]
    argv += ["--json", str(out / f"{step.name}.json"), "--plot", str(out / f"{step.name}.png")]
    return shlex.join(argv)


# ---------------------------------------------------------------- running and reporting

def run_suite(job: SuiteJob, *, command: str | None = None, echo=print, clock=time.perf_counter) -> str:
    """Run every step, write OUT/<step>.json|png, OUT/suite.json and OUT/REPORT.md; return the report path."""
    from ..encoder.bundle import load_bundle

    started = clock()
    data = Path(job.data or os.environ.get("RELSEARCH_DATA") or DEFAULT_DATA)
    if not data.is_dir():
        raise BenchInputError(f"no shared data folder at {data}; pass --data DIR")
    bundle = load_bundle(job.model)
    missing = [r for r in PACK_RELATIONS if r not in bundle.operators]
    if missing:
        raise BenchInputError(f"the bundle {bundle.path or bundle.encoder.get('model')} lacks {', '.join(missing)}; "
                              f"build the default pack (make pack) or pass --model")
    out = Path(job.out)
    out.mkdir(parents=True, exist_ok=True)
    inputs = prepare_inputs(data, out / "inputs")
    steps = plan(data, inputs, job)
    for i, step in enumerate(steps, 1):
        echo(f"[{i}/{len(steps)}] {step.kind} {step.dataset} …")
        t0 = clock()
        res = RUNNERS[step.kind](step.job, json_out=str(out / f"{step.name}.json"), plot_out=str(out / f"{step.name}.png"),
                     command=cli_command(step, out))
        step.result, step.seconds = res.payload, clock() - t0
        echo(f"      {step.seconds:.0f} s")
    extra = _figures(steps, bundle, out, job)
    total = clock() - started
    meta = {"command": command, "seconds": round(total, 1), "model": model_fingerprint(bundle, job.precision),
            "environment": {"packages": package_versions(), "machine": machine_info()},
            "data": {"root": str(data), "sha256": data_fingerprint(
                {s.name: {"sha256": s.result["data"]["sha256"]} for s in steps})},
            "steps": [{"name": s.name, "kind": s.kind, "dataset": s.dataset, "seconds": round(s.seconds, 1),
                       "json": f"{s.name}.json", "command": s.result["command"]} for s in steps]}
    write_json(out / "suite.json", meta)
    report = out / "REPORT.md"
    report.write_text(render(steps, meta, extra), encoding="utf-8")
    echo(main_table(steps).text())
    evalrank = [s for s in steps if s.dataset == "evalrank"]
    if evalrank:
        echo("\n" + evalrank_table(evalrank[0]).text())
    return str(report)


def _figures(steps: list[Step], bundle, out: Path, job: SuiteJob) -> dict:
    """Cross-run figures: per-relation MRR vs identity and BM25; operator similarity."""
    bars = [{"group": r["relation"], "method": "relation operator" if r["method"] == "relation" else r["method"],
             "value": r["filtered"]["mrr"]}
            for s in steps if s.kind == "linkpred" and s.dataset != "evalrank"
            for r in s.result["rows"] if r["relation"] != "overall" and r.get("available")]
    fig, axes = plots.figure(1, width=9)
    groups, series = plots.grouped(bars, lambda r: r["value"])
    plots.metric_bars(axes[0], groups, series, ylabel="MRR (filtered, realistic)",
                      title="link prediction: relation operator vs identity vs BM25")
    plots.save(fig, str(out / "linkpred_mrr.png"))
    rng = np.random.default_rng(13)
    texts = []
    for s in steps:
        if s.kind == "linkpred":
            heads = list(dict.fromkeys(json.loads(line)["head"] for line in open(s.job.test, encoding="utf-8")))
            texts += [heads[i] for i in rng.choice(len(heads), min(300, len(heads)), replace=False)]
    names, sim = plots.operator_similarity(bundle.operators, raw_vectors(bundle, texts, cache_dir=job.cache_dir,
                                                                       precision=job.precision))
    fig, axes = plots.figure(1, width=7, height=6)
    plots.heatmap(axes[0], names, sim, f"operator similarity over {len(texts)} test heads: cos of shifts op(h) − ĥ")
    plots.save(fig, str(out / "operators.png"))
    return {"linkpred_mrr": "linkpred_mrr.png", "operators": "operators.png",
            "operator_similarity": {"names": names, "matrix": sim.round(4).tolist()}}


def main_table(steps: list[Step]) -> Table:
    """One line per relation: filtered MRR of BM25 / identity / operator, operator Hits@1/10, raw MRR."""
    rows = []
    for s in steps:
        if s.kind != "linkpred" or s.dataset == "evalrank":
            continue
        by = {(r["relation"], r["method"]): r for r in s.result["rows"] if r["direction"] == "tail" and r.get("available")}
        for rel in sorted({r for r, _ in by} - {"overall"}):
            b, i, o = by[(rel, "bm25")], by[(rel, "identity")], by[(rel, "relation")]
            hy = by.get((rel, "hybrid"))
            rows.append([rel, s.dataset, o["queries"], s.result["counts"]["candidates"], b["filtered"]["mrr"],
                         i["filtered"]["mrr"], o["filtered"]["mrr"], hy["filtered"]["mrr"] if hy else None,
                         o["filtered"]["mrr"] - i["filtered"]["mrr"],
                         o["filtered"]["hits@1"], o["filtered"]["hits@10"], i["filtered"]["hits@10"], o["raw"]["mrr"]])
    return Table("Link prediction, default pack (filtered, realistic ranks; tail prediction)",
                 ["relation", "dataset", "triples", "candidates", "BM25 MRR", "identity MRR", "operator MRR",
                  "hybrid MRR", "Δ vs id", "op H@1", "op H@10", "id H@10", "op raw MRR"], rows)


def evalrank_table(step: Step) -> Table:
    by = {r["method"]: r for r in step.result["rows"] if r["relation"] == "overall" and r["direction"] == "tail"}
    rows = [[name, "published (RSE README)", *vals] for name, vals in EVALRANK_PUBLISHED.items()]
    for method, label in (("identity", "all-MiniLM-L6-v2, plain cosine"), ("paraphrase", "pack: paraphrase operator"),
                          ("bm25", "BM25")):
        for setting, rank in (("raw", "raw, optimistic (≈ RSE protocol)"), ("filtered", "filtered, realistic")):
            m = by[method][setting]
            rows.append([label, rank, 100 * m["mrr"], 100 * m["hits@1"], 100 * m["hits@3"]])
    return Table("EvalRank (6,989 positive pairs, 24,957 candidate sentences), percent",
                 ["model", "protocol", "MRR", "Hits@1", "Hits@3"], rows)


def render(steps: list[Step], meta: dict, extra: dict) -> str:
    mach, model = meta["environment"]["machine"], meta["model"]
    lines = ["# relsearch benchmark report", "",
             f"Command: `{meta['command']}`  ", f"Total time: {meta['seconds'] / 60:.1f} min on {mach['cpu']} "
             f"({mach['usable_cpus']} usable CPUs, torch threads {mach['torch_threads']}, GPU {mach['gpu'] or 'none'})  ",
             f"Bundle: `{model['bundle']}` fingerprint `{model['fingerprint']}`; encoder `{model['encoder'].get('model')}` "
             f"weights `{model['encoder'].get('weights_sha256')}`  ", f"Data: `{meta['data']['root']}` combined sha256 "
             f"`{meta['data']['sha256'][:16]}…` (per-input hashes in each JSON)", "",
             "Protocols: docs/benchmarks.md. Every number below is in the step's JSON, which also records the "
             "standalone command that reproduces it.", "",
             main_table(steps).markdown(), "", f"![per-relation MRR]({extra['linkpred_mrr']})", "",
             f"![operator similarity]({extra['operators']})", ""]
    evalrank = next((s for s in steps if s.dataset == "evalrank"), None)
    if evalrank:
        lines += ["## EvalRank next to RSE's published numbers", "", evalrank_table(evalrank).markdown(), "",
                  "Protocol difference: RSE ranks the positive among a pool that *contains the query* and counts pool "
                  "sentences scoring strictly higher (0 → 1). With plain cosine the query always outranks, so that is our "
                  "raw optimistic rank with the query excluded; with a relation operator the query need not outrank, and "
                  "RSE would count it while we exclude it. RSE does not filter a query's other positives (our filtered "
                  "column does). RSE's models are jointly fine-tuned BERT/RoBERTa with the same_sent relation; ours is the "
                  "frozen MiniLM encoder (identity) and a query-side adapter (paraphrase).", ""]
    for kind, heading in (("linkpred", "Link prediction, all rows"), ("retrieval", "Same-aspect retrieval"),
                          ("sts", "STS")):
        lines += [f"## {heading}", ""]
        for s in (s for s in steps if s.kind == kind):
            if kind == "linkpred":
                t = linkpred_table(s.result["rows"], s.name)
            elif kind == "retrieval":
                t = retrieval_table(s.result["rows"], s.result["k"], f"{s.name} ({s.result['counts']['pool']} documents)")
            else:
                t = Table(s.name, ["group", "method", "n", "Spearman", "Pearson"],
                          [[r["group"], r["method"], r["n"], r["spearman"], r["pearson"]] for r in s.result["rows"]])
            lines += [f"### {s.dataset}: {s.name}", ""]
            if s.note:
                lines += [f"_{s.note}_", ""]
            lines += [t.markdown(), "", f"`{s.result['command']}` ({s.seconds:.0f} s)", "",
                      f"![{s.name}]({s.name}.png)", ""]
    lines += ["## Environment", "", "```", json.dumps(meta["environment"], indent=1), "```", ""]
    return "\n".join(lines)
