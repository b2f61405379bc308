"""``relsearch bench sts``: correlation of relational scores with graded gold similarity (STS-B, SICK-R).

Each pair {a, b, score} is scored by cos(op(h_a), b̂) — the relational score a search with
``--relation op`` would rank by — or, with ``symmetric``, by the mean of cos(op(h_a), b̂) and
cos(op(h_b), â). Reported: Spearman (the SentEval/SimCSE convention) and Pearson (the official
STS-B metric), from scipy, over all pairs and per value of ``by`` (e.g. ``year`` for STS12–16,
whose usual protocol is one Spearman per year). Pairs with a missing score or text are skipped
and counted. Methods: ``bm25`` (a as the query against every sentence of the file, IDF from those
sentences), ``identity`` and each operator.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..encoder.bundle import load_bundle
from ..encoder.relations import lookup, normalize
from ..indexer.lexical import BM25
from .linkpred import raw_vectors
from .report import BenchInputError, BenchResult, Table, file_fingerprint, finish, read_jsonl

PROTOCOL = ("score(a, b) = cos(op(h_a), b̂) (symmetric: mean with cos(op(h_b), â)); Spearman and Pearson "
            "(scipy.stats) against the gold score over all pairs with a score")


@dataclass(frozen=True, kw_only=True)
class STSJob:
    pairs: str
    relations: tuple[str, ...] = ()  # () → every operator of the bundle
    symmetric: bool = False
    by: str | None = None  # also report per value of this field
    a_field: str = "a"
    b_field: str = "b"
    score_field: str = "score"
    model: str | None = None
    cache_dir: str | None = None
    precision: str = "auto"
    progress: bool = False


def correlations(pred: np.ndarray, gold: np.ndarray) -> dict:
    """{"spearman", "pearson", "n"}; NaN when fewer than two pairs or a constant input."""
    from scipy import stats

    pred, gold = np.asarray(pred, np.float64), np.asarray(gold, np.float64)
    if len(pred) < 2 or np.ptp(pred) == 0 or np.ptp(gold) == 0:
        return {"spearman": float("nan"), "pearson": float("nan"), "n": len(pred)}
    return {"spearman": float(stats.spearmanr(pred, gold).statistic), "pearson": float(stats.pearsonr(pred, gold).statistic),
            "n": len(pred)}


def read_pairs(job: STSJob) -> tuple[list[dict], int]:
    rows, skipped = [], 0
    for r in read_jsonl(job.pairs):
        a, b, s = r.get(job.a_field), r.get(job.b_field), r.get(job.score_field)
        if isinstance(a, str) and a.strip() and isinstance(b, str) and b.strip() and isinstance(s, (int, float)):
            rows.append(r)
        else:
            skipped += 1
    if len(rows) < 2:
        raise BenchInputError(f"{job.pairs}: {len(rows)} usable pair(s) with string {job.a_field!r}, {job.b_field!r} "
                              f"and a numeric {job.score_field!r} ({skipped} skipped)")
    return rows, skipped


def pair_scores(bundle, names: list[str], a: list[str], b: list[str], h_a: np.ndarray, h_b: np.ndarray, *,
                symmetric: bool) -> dict[str, np.ndarray]:
    """method → (n,) score per pair."""
    bm25 = BM25(list(dict.fromkeys(a + b)))
    col = {t: i for i, t in enumerate(dict.fromkeys(a + b))}

    def lexical(q, d):
        out = np.zeros(len(q))
        for start in range(0, len(q), 512):
            cols = [col[y] for y in d[start:start + 512]]
            out[start:start + len(cols)] = bm25.scores(q[start:start + 512])[np.arange(len(cols)), cols]
        return out

    out = {"bm25": (lexical(a, b) + lexical(b, a)) / 2 if symmetric else lexical(a, b)}
    ua, ub = normalize(h_a), normalize(h_b)
    for name in names:
        op = lookup(bundle.operators, name)
        forward = (op.apply(h_a) * ub).sum(axis=1)
        out[name] = (forward + (op.apply(h_b) * ua).sum(axis=1)) / 2 if symmetric else forward
    return out


def run_sts(job: STSJob, *, json_out: str | None = None, plot_out: str | None = None, command: str | None = None,
            clock=time.perf_counter) -> BenchResult:
    started = clock()
    rows, skipped = read_pairs(job)
    bundle = load_bundle(job.model)
    names = list(dict.fromkeys(["identity", *(job.relations or sorted(n for n in bundle.operators if n != "identity"))]))
    a, b = [r[job.a_field] for r in rows], [r[job.b_field] for r in rows]
    distinct = list(dict.fromkeys(a + b))
    vecs = dict(zip(distinct, raw_vectors(bundle, distinct, cache_dir=job.cache_dir, progress=job.progress,
                                          precision=job.precision)))
    scores = pair_scores(bundle, names, a, b, np.stack([vecs[t] for t in a]), np.stack([vecs[t] for t in b]),
                         symmetric=job.symmetric)
    gold = np.array([float(r[job.score_field]) for r in rows])
    groups = {"all": np.arange(len(rows))}
    if job.by:
        values = [str(r.get(job.by)) for r in rows]
        groups.update({v: np.flatnonzero(np.array(values) == v) for v in sorted(set(values))})
    results = [{"group": g, "method": m, **correlations(s[idx], gold[idx])}
               for g, idx in groups.items() for m, s in scores.items()]
    payload = {"protocol": PROTOCOL, "symmetric": job.symmetric, "by": job.by, "counts": {"pairs": len(rows),
               "skipped": skipped}, "rows": results}
    ident = {r["group"]: r for r in results if r["method"] == "identity"}
    table = Table(f"STS: {job.pairs} ({'symmetric' if job.symmetric else 'a → b'})",
                  ["group", "method", "n", "Spearman", "Pearson", "ΔSpearman id"],
                  [[r["group"], r["method"], r["n"], r["spearman"], r["pearson"],
                    None if r["method"] == "identity" else r["spearman"] - ident[r["group"]]["spearman"]]
                   for r in results])
    res = finish("sts", payload, [table], inputs={"pairs": file_fingerprint(job.pairs)}, bundle=bundle,
                 command=command, started=started, clock=clock, json_out=json_out, precision=job.precision)
    if plot_out:
        from . import plots

        plots.bars_figure(results, [("spearman", "Spearman ρ")], plot_out, title=f"STS: {job.pairs}")
        res.plot = plot_out
    return res
