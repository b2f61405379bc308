"""``relsearch bench companies``: similar-company retrieval on held-out companies (issue: company lookups).

On the test companies of a company corpus (default: Russell 3000, Yahoo descriptions, GICS labels,
splits by company), every company is a seed and the other test companies its candidates (AspectCSE
protocol, :func:`~relsearch.encoder.metrics.aspect_retrieval_metrics`). Relevant = same GICS
industry, then same GICS sector. Methods: BM25, and for every bundle given (default: the shipped
pack) identity and each operator (cos(op(h), t̂), query side), plus each re-ranking head applied to
the top ``depth`` hits of identity. A fine-tuned bundle (its own encoder) is scored with its own
document vectors — the index such a bundle needs.

Cross-source: the same companies described by Wikipedia and Bloomberg are used as queries against
the Yahoo descriptions: MRR@10 of the company's own Yahoo description ("finds itself in another
source's words") and P@10 of same-industry peers among the others.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..encoder.bundle import load_bundle
from ..encoder.metrics import aspect_retrieval_metrics
from ..encoder.relations import normalize
from ..indexer.lexical import BM25
from .linkpred import raw_vectors
from .report import BenchInputError, BenchResult, Table, file_fingerprint, finish, read_jsonl

ASPECTS = (("industry", "gics_industry"), ("sector", "gics_sector"))
OTHER_SOURCES = (("wikipedia", "text_wikipedia"), ("bloomberg", "text_bloomberg"))
K = 10


@dataclass(frozen=True, kw_only=True)
class CompaniesJob:
    corpus: str
    models: tuple[str | None, ...] = (None,)  # None = the shipped pack
    split: str = "test"
    depth: int = 50  # re-ranking heads re-score this many identity hits
    cache_dir: str | None = None
    precision: str = "auto"
    progress: bool = False


def _pool(rows: list[dict], split: str) -> list[dict]:
    seen, out = set(), []
    for r in rows:
        text = r.get("text")
        if r.get("split") == split and isinstance(text, str) and text.strip() and all(r.get(f) for _, f in ASPECTS):
            if text not in seen:
                seen.add(text)
                out.append(r)
    return out


def _rerank_scores(head, h: np.ndarray, base: np.ndarray, depth: int) -> np.ndarray:
    """Scores where each seed's top ``depth`` identity hits get head score + a tie-breaking trace of ``base``."""
    out = np.full(base.shape, -np.inf, dtype=np.float64)
    masked = base.copy()
    np.fill_diagonal(masked, -np.inf)
    top = np.argsort(-masked, axis=1)[:, :depth]
    for i, cols in enumerate(top):
        out[i, cols] = head.score(np.repeat(h[i:i + 1], len(cols), 0), h[cols]) + 1e-6 * base[i, cols]
    return out


def run_companies(job: CompaniesJob, *, json_out: str | None = None, plot_out: str | None = None,
                  command: str | None = None, clock=time.perf_counter) -> BenchResult:
    started = clock()
    rows = _pool(read_jsonl(job.corpus), job.split)
    if len(rows) < 2:
        raise BenchInputError(f"{job.corpus}: fewer than 2 {job.split} companies with a text, a GICS industry and sector")
    texts = [r["text"] for r in rows]
    labels = {name: [str(r[field]) for r in rows] for name, field in ASPECTS}
    bm25 = BM25(texts)
    lexical = np.vstack([bm25.scores(texts[i:i + 256]) for i in range(0, len(texts), 256)])
    methods: list[tuple[str, np.ndarray]] = [("bm25", lexical)]  # (name, seed × candidate scores)
    views = {}  # for the plot: method → query vectors
    bundles = []
    for ref in job.models:
        bundle = load_bundle(ref)
        bundles.append(bundle)
        prefix = "" if len(job.models) == 1 else f"{ref or 'pack'}:"
        h = raw_vectors(bundle, texts, cache_dir=job.cache_dir, progress=job.progress, precision=job.precision)
        unit = normalize(h)
        for name, op in sorted(bundle.operators.items(), key=lambda kv: (kv[0] != "identity", kv[0])):
            q = op.apply(h)
            methods.append((prefix + name, q @ op.documents(unit).T))
            views[prefix + name] = q
        for name, head in sorted(bundle.heads.items()):
            methods.append((f"{prefix}{name} (re-ranks identity top {job.depth})",
                            _rerank_scores(head, h, unit @ unit.T, job.depth)))
    results = []
    for method, scores in methods:
        row = {"method": method}
        for aspect, _ in ASPECTS:
            m = aspect_retrieval_metrics(lambda a, b, s=scores: s[a:b], labels[aspect], K)
            row[aspect] = {key: m[key] for key in (f"p@{K}", f"r@{K}", f"mrr@{K}", "seeds")}
        results.append(row)
    cross = [dict(c, method=(f"{ref or 'pack'}:" if len(bundles) > 1 and c["method"] != "bm25" else "") + c["method"])
             for ref, bundle in zip(job.models, bundles)
             for c in _cross_source(rows, bundle, bm25, job, with_bm25=bundle is bundles[0])]
    peers = [dict(p, method=(f"{ref or 'pack'}:" if len(bundles) > 1 else "") + p["method"])
             for ref, bundle in zip(job.models, bundles) for competitors in (True, False)
             for p in _peers(job, bundle, competitors=competitors)]
    ident = next(r for r in results if r["method"].endswith("identity"))
    table_rows = [[r["method"]] + [r[a][key] for a, _ in ASPECTS for key in (f"p@{K}", f"r@{K}", f"mrr@{K}")]
                  + [r["industry"][f"p@{K}"] - ident["industry"][f"p@{K}"]] for r in results]
    title = (f"similar companies: {len(rows)} {job.split} companies of {job.corpus} — relevant = same GICS industry "
             f"({len(set(labels['industry']))} in the pool) / same GICS sector ({len(set(labels['sector']))})")
    tables = [Table(title, ["method", "ind P@10", "ind R@10", "ind MRR@10", "sec P@10", "sec R@10", "sec MRR@10",
                            "ΔP@10 ind vs id"], table_rows,
                    note="AspectCSE protocol: each company a seed, the other test companies its candidates; macro means")]
    if cross:
        tables.append(Table("cross-source: Wikipedia / Bloomberg text as the query, Yahoo descriptions as candidates",
                            ["query source", "method", "queries", "same company MRR@10", "same company H@1",
                             "industry P@10 (others)"],
                            [[c["source"], c["method"], c["queries"], c["self_mrr@10"], c["self_hits@1"],
                              c["industry_p@10"]] for c in cross]))
    if peers:
        tables.append(Table(f"competitors: {job.split} companies whose own texts name others of the corpus, as --id "
                            f"queries over every company (MRR, filtered)",
                            ["gold", "method", "MRR", "queries", "candidates"],
                            [[p["gold"], p["method"], p["mrr"], p["queries"], p["candidates"]] for p in peers],
                            note="competitors: named in a sentence about competition; named peers: any mention "
                                 "(relsearch/bench/peers.py); recipe = what --relation NAME runs"))
    payload = {"protocol": __doc__.split("\n\n")[1], "split": job.split, "companies": len(rows), "k": K,
               "rows": results, "cross_source": cross, "competitors": peers}
    res = finish("companies", payload, tables, inputs={"corpus": file_fingerprint(job.corpus)}, bundle=bundles[0],
                 command=command, started=started, clock=clock, json_out=json_out, precision=job.precision)
    if plot_out:
        from . import plots

        aspect_view = next((n for n in views if "sector" in n), None) or next((n for n in views if n != "identity"), None)
        shown = {"identity (generic)": normalize(views["identity"] if "identity" in views else next(iter(views.values())))}
        if aspect_view:
            shown[aspect_view] = views[aspect_view]
        res.plot = plots.embedding_figure(shown, labels["sector"], plot_out, title="test companies by GICS sector")
    return res


def _cross_source(rows: list[dict], bundle, bm25: BM25, job: CompaniesJob, *, with_bm25: bool = True) -> list[dict]:
    """Queries: another source's description; candidates: every pool company's Yahoo description."""
    texts = [r["text"] for r in rows]
    industry = np.array([str(r["gics_industry"]) for r in rows])
    h_docs = raw_vectors(bundle, texts, cache_dir=job.cache_dir, progress=job.progress, precision=job.precision)
    unit = normalize(h_docs)
    ops = {"identity": bundle.operators["identity"]}
    ops.update({n: op for n, op in bundle.operators.items() if n in ("similar-company",) or n.startswith("aspect:")})
    out = []
    for source, field in OTHER_SOURCES:
        idx = [i for i, r in enumerate(rows) if isinstance(r.get(field), str) and r[field].strip()]
        if not idx:
            continue
        queries = [rows[i][field] for i in idx]
        h_q = raw_vectors(bundle, queries, cache_dir=job.cache_dir, progress=job.progress, precision=job.precision)
        scorers = {"bm25": np.vstack([bm25.scores(queries[s:s + 256]) for s in range(0, len(queries), 256)])} \
            if with_bm25 else {}
        scorers.update({name: op.apply(h_q) @ op.documents(unit).T for name, op in ops.items()})
        for method, scores in scorers.items():
            own = scores[np.arange(len(idx)), idx]
            rank = 1 + (scores > own[:, None]).sum(axis=1)  # optimistic ties: BM25 zeros rarely tie the gold
            others = scores.copy()
            others[np.arange(len(idx)), idx] = -np.inf
            top = np.argsort(-others, axis=1)[:, :K]
            p = (industry[top] == industry[idx][:, None]).mean()
            out.append({"source": source, "method": method, "queries": len(idx),
                        "self_mrr@10": float(np.where(rank <= K, 1.0 / rank, 0.0).mean()),
                        "self_hits@1": float((rank == 1).mean()), "industry_p@10": float(p)})
    return out


def _peers(job: CompaniesJob, bundle, *, competitors: bool) -> list[dict]:
    """Competitor retrieval: each ``job.split`` company whose own texts name companies of the corpus
    (bench/peers.py; ``competitors``: in a sentence about competition) queries the whole corpus;
    identity, BM25, hybrid, and every company operator alone and as its recipe."""
    from ..retrieval.recipe import recipe_of
    from ..retrieval.recipe_fit import Corpus, baselines, measure, tables
    from .peers import mine_peers

    rows = list({r["text"]: r for r in read_jsonl(job.corpus) if isinstance(r.get("text"), str) and r["text"].strip()
                 }.values())
    position = {r["id"]: i for i, r in enumerate(rows)}
    gold: dict[int, set[int]] = {}
    for a, b in mine_peers(rows, competitors=competitors):
        if rows[position[a]].get("split") == job.split:
            gold.setdefault(position[a], set()).add(position[b])
    if not gold:
        return []
    ops = [op for name, op in sorted(bundle.operators.items())
           if name == "similar-company" or name.startswith("aspect:") and not op.both_sides]
    fields = {f for op in ops if recipe_of(op) for f in recipe_of(op).same}  # the metadata bonuses need
    heads = sorted(gold)
    corpus = Corpus([r["text"] for r in rows], heads, [gold[h] for h in heads],
                    {f: [r.get(f) for r in rows] for f in sorted(fields)})

    def encode(texts):
        return raw_vectors(bundle, texts, cache_dir=job.cache_dir, progress=job.progress, precision=job.precision)

    out = []
    for op in ops:
        recipe = recipe_of(op)
        scores = measure(recipe, op, corpus, encode) if recipe else baselines(tables(corpus, op, encode), op.name)
        if not out:
            out += [{"method": m, "mrr": scores[m]} for m in ("identity", "bm25", "hybrid")]
        out.append({"method": f"{op.name} (operator alone)", "mrr": scores["operator"]})
        if recipe:
            out.append({"method": f"{op.name} (recipe: {recipe.describe()})", "mrr": scores["recipe"]})
    for row in out:
        row.update(gold="competitors" if competitors else "named peers", queries=len(heads), candidates=len(rows))
    return out
