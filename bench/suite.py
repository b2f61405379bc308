"""``relsearch bench all``: the default relation pack on the shared datasets, as one markdown report.

Every step is an ordinary ``bench linkpred|retrieval|sts|companies`` run; its JSON records the
equivalent standalone command, so any number in the report can be reproduced alone. Derived inputs
(candidate lists, filtered triples) are written to ``OUT/inputs/`` first. This is the only module
that knows relation and dataset names.

Only what the bundle ships is judged: a relation of :data:`PACK_RELATIONS` the bundle lacks gets no
step (SICK keeps the triples of the relations it has; EvalRank falls back to identity and BM25),
and the report names the absent ones. similar-company is judged where users query it: the
``companies`` step's competitors (gold = competitors the companies' own texts name, bench/peers.py).

Runtime: encoding ~62k distinct texts dominates; vectors are cached (``--cache``), so a re-run
mostly scores. See docs/benchmarks.md for measured times.
"""
from __future__ import annotations

import json
import os
import shlex
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from . import plots
from .companies import CompaniesJob, run_companies
from .linkpred import RECIPE, LinkPredJob, raw_vectors, run_linkpred
from .linkpred import table as linkpred_table
from .report import BenchInputError, Table, data_fingerprint, machine_info, model_fingerprint, package_versions, write_json
from .retrieval import RetrievalJob, run_retrieval
from .retrieval import table as retrieval_table
from .sts import STSJob, run_sts

DEFAULT_DATA = "../shared/data"  # the project's shared datasets, beside a checkout
# every relation the suite knows how to judge; a bundle may ship any subset (see shipped_relations)
PACK_RELATIONS = ("duplicate-question", "qa-entailment", "paraphrase", "same-caption", "entailment", "contradiction",
                  "similar-company", "aspect:sector", "aspect:industry")
SICK_RELATIONS = ("entailment", "contradiction")
# RSE README, same_sent relation, raw protocol (percent); see /work/shared/data/evalrank/README.md
EVALRANK_PUBLISHED = {
    "RSE-BERT-base-USEB": (68.61, 47.90, 87.47), "RSE-BERT-large-USEB": (68.17, 46.73, 87.18),
    "RSE-RoBERTa-base-USEB": (70.92, 50.52, 90.49), "RSE-RoBERTa-large-USEB": (70.48, 49.25, 90.97),
}
RUNNERS = {"linkpred": run_linkpred, "retrieval": run_retrieval, "sts": run_sts, "companies": run_companies}


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
    kind: str  # linkpred | retrieval | sts | companies
    dataset: str
    job: object
    note: str = ""
    result: dict = field(default_factory=dict)
    tables: list = field(default_factory=list)  # the runner's tables (the companies step shows them as they are)
    seconds: float = 0.0


def shipped_relations(operators) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(shipped, absent): the relations of :data:`PACK_RELATIONS` the bundle has and lacks."""
    return (tuple(r for r in PACK_RELATIONS if r in operators), tuple(r for r in PACK_RELATIONS if r not in operators))


# ---------------------------------------------------------------- derived inputs

def _read(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _write(path: Path, rows) -> str:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _texts(rows, *keys) -> list[dict]:
    return [{"text": t} for t in dict.fromkeys(r[k] for r in rows for k in keys)]


def prepare_inputs(data: Path, inputs: Path, relations=PACK_RELATIONS) -> dict[str, str]:
    """Candidate lists and triples the datasets do not ship as such; returns name → path.

    ``relations``: those the bundle ships; when it lacks one of SICK's, ``sick_test`` holds only the
    test triples of the others."""
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
    sick = data / "sick/triples/test.jsonl"
    kept = [r for r in SICK_RELATIONS if r in relations]
    if kept == list(SICK_RELATIONS):
        out["sick_test"] = str(sick)
    elif kept:
        out["sick_test"] = _write(inputs / f"sick_test_{'_'.join(kept)}.jsonl",
                                  (t for t in _read(sick) if t["relation"] in kept))
    # dev splits: for choosing a setting (the weighted hybrid's weight) without looking at test
    out["trecqa_dev_candidates"] = _write(inputs / "trecqa_dev_sentences.jsonl", pair_texts("trecqa", "b", split="dev"))
    return out


def sp500_overlap(data: Path) -> tuple[int, int]:
    """(sp500 test companies, of which in russell3000's train/dev split — seen by similar-company)."""
    russell = {c["id"]: c["split"] for c in _read(data / "russell3000_companies/corpus.jsonl")}
    test = [c["id"] for c in _read(data / "sp500_companies/corpus.jsonl") if c["split"] == "test"]
    return len(test), sum(russell.get(t) in ("train", "dev") for t in test)


# ---------------------------------------------------------------- the plan

def plan(data: Path, inp: dict[str, str], job: SuiteJob, relations=PACK_RELATIONS) -> list[Step]:
    """The steps for a bundle shipping ``relations``: a relation it lacks gets no step of its own."""
    common = {"model": job.model, "cache_dir": job.cache_dir, "precision": job.precision, "progress": job.progress}
    steps = _linkpred_steps(data, inp, relations, common) + _company_steps(data, job, relations, common)
    if "same-caption" in relations:
        steps.append(Step("retrieval_flickr8k_image", "retrieval", "flickr8k_captions", RetrievalJob(
            corpus=str(data / "flickr8k_captions/corpus.jsonl"), aspect="image", relations=("same-caption",),
            **common), note="relevant = the other 4 captions of the same image"))
    for ds, by in (("stsb", None), ("sick", None), ("sts12_16", "year")):
        steps.append(Step(f"sts_{ds}", "sts", ds, STSJob(pairs=str(data / ds / "pairs/test.jsonl"), by=by, **common)))
    return steps


def _linkpred_steps(data: Path, inp: dict[str, str], relations, common: dict) -> list[Step]:
    """The link-prediction steps: each pair dataset of a shipped relation, SICK, and EvalRank
    (with the paraphrase operator when the bundle ships it, else identity and BM25 only)."""

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
    ]
    steps = [Step(f"linkpred_{ds}", "linkpred", ds, LinkPredJob(test=triples(ds, "test"), candidates=cands,
                                                                 known=known(ds), **common), note=f"{rel}: {note}")
             for rel, ds, cands, note in lp if rel in relations]
    sick = [r for r in SICK_RELATIONS if r in relations]
    if sick:
        steps.append(Step("linkpred_sick", "linkpred", "sick", LinkPredJob(
            test=inp.get("sick_test", triples("sick", "test")), candidates=inp["sick_candidates"], known=known("sick"),
            **common), note=f"{'+'.join(sick)}: {every_sentence}"
                            + ("" if len(sick) == len(SICK_RELATIONS) else f" ({sick[0]} test triples only)")))
    if "paraphrase" in relations:
        steps.append(Step("linkpred_evalrank", "linkpred", "evalrank", LinkPredJob(
            test=inp["evalrank_triples"], candidates=str(data / "evalrank/corpus.jsonl"), relations=("paraphrase",),
            **common), note="EvalRank positive pairs scored with the paraphrase operator (the pack's closest to RSE's "
                            "same_sent)"))
    else:
        steps.append(Step("linkpred_evalrank", "linkpred", "evalrank", LinkPredJob(
            test=inp["evalrank_triples"], candidates=str(data / "evalrank/corpus.jsonl"), relations=("identity",),
            **common), note="EvalRank positive pairs; the bundle ships no paraphrase operator, so identity and BM25 "
                            "only"))
    return steps


def _company_steps(data: Path, job: SuiteJob, relations, common: dict) -> list[Step]:
    """The company steps: competitors and GICS aspects on russell3000, and GICS sector on the S&P 500."""
    steps = []
    russell = str(data / "russell3000_companies/corpus.jsonl")
    if "similar-company" in relations:
        steps.append(Step("companies_russell3000", "companies", "russell3000_companies", CompaniesJob(
            corpus=russell, cache_dir=job.cache_dir, precision=job.precision, progress=job.progress),
            note="similar-company where users query it: each test company whose own texts name competitors queries "
                 "every company of the corpus (gold = those competitors, bench/peers.py); also same GICS industry / "
                 "sector among test companies and cross-source lookups"))
    company_ops = [r for r in ("similar-company", "aspect:sector", "aspect:industry") if r in relations]
    if company_ops:
        for aspect in ("gics_sector", "gics_industry", "gics_sub_industry_code"):
            steps.append(Step(f"retrieval_russell3000_{aspect}", "retrieval", "russell3000_companies", RetrievalJob(
                corpus=russell, aspect=aspect, relations=tuple(company_ops), **common)))
        n, seen = sp500_overlap(data)
        steps.append(Step("retrieval_sp500_gics_sector", "retrieval", "sp500_companies", RetrievalJob(
            corpus=str(data / "sp500_companies/corpus.jsonl"), aspect="gics_sector", relations=tuple(company_ops),
            **common), note=f"not leak-free: {seen} of these {n} test companies are russell3000 train/dev companies, "
                            f"seen by the company operators in training"))
    return steps


def cli_command(step: Step, out: Path) -> str:
    """The standalone ``relsearch bench`` command equivalent to ``step``."""
    argv = ["relsearch", "bench", step.kind]
    job = step.job
    positional = {"linkpred": "test", "retrieval": "corpus", "sts": "pairs", "companies": "corpus"}[step.kind]
    argv.append(getattr(job, positional))
    defaults = {f.name: f.default for f in fields(job)}
    for f in fields(job):
        value = getattr(job, f.name)
        if f.name in (positional, "progress", "chunk") or value == defaults[f.name]:
            continue
        flag = {"relations": "--relation", "models": "--model", "cache_dir": "--cache"}.get(f.name, "--" + f.name.replace("_", "-"))
        if isinstance(value, bool):
            argv.append(flag)
        elif isinstance(value, tuple):
            for v in value:
                if v is not None:
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
    shipped, absent = shipped_relations(bundle.operators)
    if not shipped:
        raise BenchInputError(f"the bundle {bundle.path or bundle.encoder.get('model')} ships none of the relations "
                              f"the suite judges ({', '.join(PACK_RELATIONS)}); pass --model or build the default "
                              f"pack (make pack)")
    if absent:
        echo(f"the bundle ships no {', '.join(absent)}: those get no step")
    out = Path(job.out)
    out.mkdir(parents=True, exist_ok=True)
    inputs = prepare_inputs(data, out / "inputs", shipped)
    steps = plan(data, inputs, job, shipped)
    for i, step in enumerate(steps, 1):
        echo(f"[{i}/{len(steps)}] {step.kind} {step.dataset} …")
        t0 = clock()
        res = RUNNERS[step.kind](step.job, json_out=str(out / f"{step.name}.json"), plot_out=str(out / f"{step.name}.png"),
                     command=cli_command(step, out))
        step.result, step.tables, step.seconds = res.payload, res.tables, clock() - t0
        echo(f"      {step.seconds:.0f} s")
    extra = _figures(steps, bundle, out, job)
    total = clock() - started
    meta = {"command": command, "seconds": round(total, 1), "model": model_fingerprint(bundle, job.precision),
            "relations": {"shipped": list(shipped), "absent": list(absent)}, "recipe_checks": recipe_checks(bundle, steps),
            "environment": {"packages": package_versions(), "machine": machine_info()},
            "data": {"root": str(data), "sha256": data_fingerprint(
                {s.name: {"sha256": s.result["data"]["sha256"]} for s in steps})},
            "steps": [{"name": s.name, "kind": s.kind, "dataset": s.dataset, "seconds": round(s.seconds, 1),
                       "json": f"{s.name}.json", "command": s.result["command"]} for s in steps]}
    write_json(out / "suite.json", meta)
    report = out / "REPORT.md"
    report.write_text(render(steps, meta, extra), encoding="utf-8")
    echo(main_table(steps).text())
    echo("\n".join(recipe_lines(meta["recipe_checks"])))
    companies = next((s for s in steps if s.kind == "companies"), None)
    if companies and companies_table(companies).rows:
        echo("\n" + companies_table(companies).text())
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


def _linkpred_rows(step: Step) -> dict:
    return {(r["relation"], r["method"]): r for r in step.result["rows"] if r["direction"] == "tail" and r.get("available")}


def main_table(steps: list[Step]) -> Table:
    """One line per relation: filtered MRR of BM25 / identity / operator / hybrid / recipe, operator Hits@1/10, raw MRR."""
    rows = []
    for s in steps:
        if s.kind != "linkpred" or s.dataset == "evalrank":
            continue
        by = _linkpred_rows(s)
        for rel in sorted({r for r, _ in by} - {"overall"}):
            b, i, o = by[(rel, "bm25")], by[(rel, "identity")], by[(rel, "relation")]
            hy, rc = by.get((rel, "hybrid")), by.get((rel, RECIPE))
            rows.append([rel, s.dataset, o["queries"], s.result["counts"]["candidates"], b["filtered"]["mrr"],
                         i["filtered"]["mrr"], o["filtered"]["mrr"], hy["filtered"]["mrr"] if hy else None,
                         rc["filtered"]["mrr"] if rc else None, o["filtered"]["mrr"] - i["filtered"]["mrr"],
                         o["filtered"]["hits@1"], o["filtered"]["hits@10"], i["filtered"]["hits@10"], o["raw"]["mrr"]])
    return Table("Link prediction, default pack (filtered, realistic ranks; tail prediction)",
                 ["relation", "dataset", "triples", "candidates", "BM25 MRR", "identity MRR", "operator MRR",
                  "hybrid MRR", "recipe MRR", "Δ op vs id", "op H@1", "op H@10", "id H@10", "op raw MRR"], rows,
                 note="recipe = the relation as `--relation NAME` runs it (its stored recipe, metadata bonuses left out)")


def _competitors(step: Step) -> dict[str, dict[str, dict]]:
    """gold → method → row of the companies step's competitor retrieval; the recipe row keyed ``recipe``."""
    out: dict[str, dict[str, dict]] = {}
    for p in step.result.get("competitors", []):
        method = p["method"]
        if method.startswith("similar-company (recipe"):
            method = RECIPE
        elif method.startswith("similar-company (operator"):
            method = "operator"
        out.setdefault(p["gold"], {})[method] = p
    return out


def companies_table(step: Step) -> Table:
    """Competitor retrieval MRR (filtered) of identity, BM25, hybrid and the similar-company recipe."""
    rows = []
    for gold, by in _competitors(step).items():
        def mrr(method, by=by):
            return by[method]["mrr"] if method in by else None
        any_row = next(iter(by.values()))
        rows.append([gold, any_row["queries"], any_row["candidates"], mrr("identity"), mrr("bm25"), mrr("hybrid"),
                     mrr(RECIPE), (mrr(RECIPE) - mrr("identity")) if RECIPE in by and "identity" in by else None])
    return Table("similar-company: competitor retrieval over every company (MRR, filtered)",
                 ["gold", "queries", "candidates", "identity MRR", "BM25 MRR", "hybrid MRR", "recipe MRR",
                  "Δ recipe vs id"], rows,
                 note="competitors: companies named in a sentence about competition in the query company's own texts; "
                      "named peers: any company they name (bench/peers.py). recipe = what --relation similar-company "
                      "runs")


def recipe_checks(bundle, steps: list[Step]) -> list[dict]:
    """Per relation with a stored recipe: its whole-corpus test check (stored with the operator by
    retrieval/recipe_fit.py) and, where this suite measured it, this run's recipe and identity MRR."""
    from ..retrieval.recipe import recipe_of

    measured = {}
    for s in steps:
        if s.kind == "linkpred" and s.dataset != "evalrank":
            by = _linkpred_rows(s)
            for rel in {r for r, _ in by} - {"overall"}:
                if (rel, RECIPE) in by:
                    measured[rel] = {"recipe": by[(rel, RECIPE)]["filtered"]["mrr"],
                                     "identity": by[(rel, "identity")]["filtered"]["mrr"], "where": s.name}
        elif s.kind == "companies":
            by = _competitors(s).get("competitors", {})
            if RECIPE in by and "identity" in by:
                measured["similar-company"] = {"recipe": by[RECIPE]["mrr"], "identity": by["identity"]["mrr"],
                                               "where": f"{s.name} competitors"}
    out = []
    for name, op in sorted(bundle.operators.items()):
        if not recipe_of(op):
            continue
        test = (op.info.get("whole_corpus") or {}).get("test")
        stored = {k: test[k] for k in ("recipe", "identity", "queries", "candidates") if k in test} if test else None
        out.append({"relation": name, "recipe": op.info["recipe"], "whole_corpus_test": stored,
                    "beats_identity": stored["recipe"] > stored["identity"] if stored else None,
                    "this_run": measured.get(name)})
    return out


def recipe_lines(checks: list[dict]) -> list[str]:
    lines = []
    for c in checks:
        stored, run = c["whole_corpus_test"], c["this_run"]
        if stored:
            verdict = "beats" if c["beats_identity"] else "does not beat"
            line = (f"- {c['relation']}: the recipe {verdict} identity on its whole-corpus test check (MRR "
                    f"{stored['recipe']:.3f} vs {stored['identity']:.3f}; {stored.get('queries', '?')} queries, "
                    f"{stored.get('candidates', '?')} candidates)")
        else:
            line = f"- {c['relation']}: no whole-corpus check stored with its recipe"
        if run:
            line += f"; this run ({run['where']}): recipe {run['recipe']:.3f} vs identity {run['identity']:.3f}"
        lines.append(line)
    return lines


def evalrank_table(step: Step) -> Table:
    by = {r["method"]: r for r in step.result["rows"] if r["relation"] == "overall" and r["direction"] == "tail"
          and r.get("available", True)}
    rows = [[name, "published (RSE README)", *vals] for name, vals in EVALRANK_PUBLISHED.items()]
    for method, label in (("identity", "all-MiniLM-L6-v2, plain cosine"), ("paraphrase", "pack: paraphrase operator"),
                          ("bm25", "BM25")):
        if method not in by:  # a bundle without paraphrase: identity and BM25 only
            continue
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
             ]
    rel = meta.get("relations", {})
    if rel.get("shipped"):
        lines += [f"Relations judged (shipped by the bundle): {', '.join(rel['shipped'])}.  ",
                  f"Absent from the bundle, so not judged: {', '.join(rel['absent']) or 'none'}.", ""]
    lines += [main_table(steps).markdown(), ""]
    checks = recipe_lines(meta.get("recipe_checks", []))
    if checks:
        lines += ["Recipes (what `--relation NAME` runs) against identity, on the whole-corpus test check stored with "
                  "each operator:", "", *checks, ""]
    companies = next((s for s in steps if s.kind == "companies"), None)
    if companies and companies_table(companies).rows:
        lines += [companies_table(companies).markdown(), ""]
    lines += [f"![per-relation MRR]({extra['linkpred_mrr']})", "", f"![operator similarity]({extra['operators']})", ""]
    evalrank = next((s for s in steps if s.dataset == "evalrank"), None)
    if evalrank:
        lines += ["## EvalRank next to RSE's published numbers", "", evalrank_table(evalrank).markdown(), "",
                  "Protocol difference: RSE ranks the positive among a pool that *contains the query* and counts pool "
                  "sentences scoring strictly higher (0 → 1). With plain cosine the query always outranks, so that is our "
                  "raw optimistic rank with the query excluded; with a relation operator the query need not outrank, and "
                  "RSE would count it while we exclude it. RSE does not filter a query's other positives (our filtered "
                  "column does). RSE's models are jointly fine-tuned BERT/RoBERTa with the same_sent relation; ours is the "
                  "frozen MiniLM encoder (identity)" + (" and a query-side adapter (paraphrase)." if "paraphrase"
                  in evalrank.job.relations else "; the bundle ships no paraphrase operator."), ""]
    for kind, heading in (("linkpred", "Link prediction, all rows"), ("companies", "Companies"),
                          ("retrieval", "Same-aspect retrieval"), ("sts", "STS")):
        shown = [s for s in steps if s.kind == kind]
        if not shown:
            continue
        lines += [f"## {heading}", ""]
        for s in shown:
            if kind == "companies":  # the runner's own tables
                body = "\n\n".join(t.markdown() for t in s.tables)
            elif kind == "linkpred":
                body = linkpred_table(s.result["rows"], s.name).markdown()
            elif kind == "retrieval":
                body = retrieval_table(s.result["rows"], s.result["k"],
                                       f"{s.name} ({s.result['counts']['pool']} documents)").markdown()
            else:
                body = Table(s.name, ["group", "method", "n", "Spearman", "Pearson"],
                             [[r["group"], r["method"], r["n"], r["spearman"], r["pearson"]]
                              for r in s.result["rows"]]).markdown()
            lines += [f"### {s.dataset}: {s.name}", ""]
            if s.note:
                lines += [f"_{s.note}_", ""]
            lines += [body, "", f"`{s.result['command']}` ({s.seconds:.0f} s)", "",
                      f"![{s.name}]({s.name}.png)", ""]
    lines += ["## Environment", "", "```", json.dumps(meta["environment"], indent=1), "```", ""]
    return "\n".join(lines)
