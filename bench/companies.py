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

Competitors: each test company whose own Wikipedia / Bloomberg texts name competitors of the corpus
(bench/peers.py) queries every company, as ``--id`` queries of an index of the corpus would:
whole-corpus MRR, and MRR@10 and hits@10 as ``-k 10`` shows them, for identity, BM25, hybrid and
each operator alone and as its recipe (``similar-company``'s weights were chosen on train and dev
companies). Then, since a test split names few competitors, similar-company's recipe choice is
cross-validated over companies (``folds``): each fold's recipe chosen on the other folds' companies
(linked companies stay in one fold), measured on its own; mean and spread over folds, and pooled.
When a compared bundle's similar-company is a trained operator (a query tower trained on the train
companies' competitors), every bundle is cross-validated over the dev and test companies only.
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
COMPANY_FIELDS = ("gics_sub_industry_code", "gics_industry_code")  # bonuses a fold's recipe may choose
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
    folds: int = 5  # cross-validation of similar-company's recipe over companies (0: none)


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
    methods, views, bundles = _methods(job, texts, bm25)
    results = _aspect_rows(methods, labels)
    cross = [dict(c, method=(f"{ref or 'pack'}:" if len(bundles) > 1 and c["method"] != "bm25" else "") + c["method"])
             for ref, bundle in zip(job.models, bundles)
             for c in _cross_source(rows, bundle, bm25, job, with_bm25=bundle is bundles[0])]
    held_out, folded = _competitors(job, bundles)
    tables = [_aspect_table(job, rows, labels, results)] + _other_tables(job, cross, held_out, folded)
    payload = {"protocol": __doc__.split("\n\n")[1], "split": job.split, "companies": len(rows), "k": K,
               "rows": results, "cross_source": cross, "competitors": held_out, "competitors_cv": folded}
    res = finish("companies", payload, tables, inputs={"corpus": file_fingerprint(job.corpus)}, bundle=bundles[0],
                 command=command, started=started, clock=clock, json_out=json_out, precision=job.precision)
    if plot_out:
        res.plot = _plot(views, labels["sector"], plot_out)
    return res


def _methods(job: CompaniesJob, texts: list[str], bm25: BM25) -> tuple[list[tuple[str, np.ndarray]], dict, list]:
    """Every method the aspect table compares — BM25, each model's operators (query towers left
    to the competitor tables) and its re-ranking heads — as (name, seed × candidate scores); the
    operators' query vectors (for the plot) and the loaded bundles."""
    lexical = np.vstack([bm25.scores(texts[i:i + 256]) for i in range(0, len(texts), 256)])
    methods: list[tuple[str, np.ndarray]] = [("bm25", lexical)]
    views = {}  # for the plot: method → query vectors
    bundles = []
    for ref in job.models:
        bundle = load_bundle(ref)
        bundles.append(bundle)
        prefix = "" if len(job.models) == 1 else f"{ref or 'pack'}:"
        h = raw_vectors(bundle, texts, cache_dir=job.cache_dir, progress=job.progress, precision=job.precision)
        unit = normalize(h)
        for name, op in sorted(bundle.operators.items(), key=lambda kv: (kv[0] != "identity", kv[0])):
            if op.needs_text:  # a query tower reads the query's text: the competitor tables measure it
                continue
            q = op.apply(h)
            methods.append((prefix + name, q @ op.documents(unit).T))
            views[prefix + name] = q
        for name, head in sorted(bundle.heads.items()):
            methods.append((f"{prefix}{name} (re-ranks identity top {job.depth})",
                            _rerank_scores(head, h, unit @ unit.T, job.depth)))
    return methods, views, bundles


def _aspect_rows(methods: list[tuple[str, np.ndarray]], labels: dict[str, list[str]]) -> list[dict]:
    """Each method's P@K, R@K and MRR@K per aspect (same industry, same sector)."""
    results = []
    for method, scores in methods:
        row = {"method": method}
        for aspect, _ in ASPECTS:
            m = aspect_retrieval_metrics(lambda a, b, s=scores: s[a:b], labels[aspect], K)
            row[aspect] = {key: m[key] for key in (f"p@{K}", f"r@{K}", f"mrr@{K}", "seeds")}
        results.append(row)
    return results


def _competitors(job: CompaniesJob, bundles: list) -> tuple[list[dict], list[dict]]:
    """Every bundle's competitor and named-peer rows: those measured on the held-out split, and
    those cross-validated over companies (when some bundle trained a similar-company operator)."""
    # a trained similar-company operator (a query tower) has seen the training companies' competitors:
    # then every bundle's recipe is cross-validated over the other companies only, so the rows compare
    trained = any(b.operators.get("similar-company") is not None and b.operators["similar-company"].kind != "identity"
                  for b in bundles)
    peers = [dict(p, method=(f"{ref or 'pack'}:" if len(bundles) > 1 else "") + p["method"])
             for ref, bundle in zip(job.models, bundles) for competitors in (True, False)
             for p in _peers(job, bundle, competitors=competitors, cv_splits=("dev", "test") if trained else None)]
    return [p for p in peers if "folds" not in p], [p for p in peers if "folds" in p]


def _aspect_table(job: CompaniesJob, rows: list[dict], labels: dict[str, list[str]], results: list[dict]) -> Table:
    """The similar-companies table: each method's industry and sector figures, and its gain over identity."""
    ident = next(r for r in results if r["method"].endswith("identity"))
    table_rows = [[r["method"]] + [r[a][key] for a, _ in ASPECTS for key in (f"p@{K}", f"r@{K}", f"mrr@{K}")]
                  + [r["industry"][f"p@{K}"] - ident["industry"][f"p@{K}"]] for r in results]
    title = (f"similar companies: {len(rows)} {job.split} companies of {job.corpus} — relevant = same GICS industry "
             f"({len(set(labels['industry']))} in the pool) / same GICS sector ({len(set(labels['sector']))})")
    return Table(title, ["method", "ind P@10", "ind R@10", "ind MRR@10", "sec P@10", "sec R@10", "sec MRR@10",
                         "ΔP@10 ind vs id"], table_rows,
                 note="AspectCSE protocol: each company a seed, the other test companies its candidates; macro means")


def _other_tables(job: CompaniesJob, cross: list[dict], held_out: list[dict], folded: list[dict]) -> list[Table]:
    """The cross-source, competitor and cross-validated competitor tables, each when it has rows."""
    tables = []
    if cross:
        tables.append(Table("cross-source: Wikipedia / Bloomberg text as the query, Yahoo descriptions as candidates",
                            ["query source", "method", "queries", "same company MRR@10", "same company H@1",
                             "industry P@10 (others)"],
                            [[c["source"], c["method"], c["queries"], c["self_mrr@10"], c["self_hits@1"],
                              c["industry_p@10"]] for c in cross]))
    if held_out:
        tables.append(Table(f"competitors: {job.split} companies whose own texts name others of the corpus, as --id "
                            f"queries over every company (filtered; MRR@10 and hits@10 as -k 10 shows them)",
                            ["gold", "method", "MRR", f"MRR@{K}", f"hits@{K}", "queries", "pairs", "candidates"],
                            [[p["gold"], p["method"], p["mrr"], p.get(f"mrr@{K}"), p.get(f"hits@{K}"), p["queries"],
                              p.get("pairs"), p["candidates"]] for p in held_out],
                            note="competitors: named in a sentence about competition, a ranking or a shared market; "
                                 "named peers: any mention (relsearch/bench/peers.py); recipe = what --relation NAME "
                                 "runs, its weights chosen on train and dev companies"))
    if folded:
        tables.append(Table(f"competitors, cross-validated over companies: each fold's similar-company recipe chosen on "
                            f"the other folds' companies, measured on its own (MRR@{K} and hits@{K}: mean ± spread "
                            f"over folds, and every held-out pair pooled)",
                            ["method", "companies of", "folds", "queries", f"MRR@{K} mean", f"MRR@{K} sd",
                             f"MRR@{K} pooled", f"hits@{K} mean", f"hits@{K} sd", f"hits@{K} pooled"],
                            [[p["method"], p["companies"], p["folds"], p["queries"]]
                             + [p[key][stat] for key in (f"mrr@{K}", f"hits@{K}") for stat in ("mean", "std", "pooled")]
                             for p in folded],
                            note="folds: connected groups of companies (a company and those it names, or that name it, "
                                 "stay in one fold: retrieval/recipe_fit.py query_folds); sd = sample standard "
                                 "deviation over folds"))
    return tables


def _plot(views: dict[str, np.ndarray], sectors: list[str], plot_out: str):
    """The companies by sector, as generic vectors and as an aspect operator's (a sector one first)."""
    from . import plots

    aspect_view = next((n for n in views if "sector" in n), None) or next((n for n in views if n != "identity"), None)
    shown = {"identity (generic)": normalize(views["identity"] if "identity" in views else next(iter(views.values())))}
    if aspect_view:
        shown[aspect_view] = views[aspect_view]
    return plots.embedding_figure(shown, sectors, plot_out, title="test companies by GICS sector")


def _cross_source(rows: list[dict], bundle, bm25: BM25, job: CompaniesJob, *, with_bm25: bool = True) -> list[dict]:
    """Queries: another source's description; candidates: every pool company's Yahoo description."""
    texts = [r["text"] for r in rows]
    industry = np.array([str(r["gics_industry"]) for r in rows])
    h_docs = raw_vectors(bundle, texts, cache_dir=job.cache_dir, progress=job.progress, precision=job.precision)
    unit = normalize(h_docs)
    ops = {"identity": bundle.operators["identity"]}
    ops.update({n: op for n, op in bundle.operators.items()
                if (n in ("similar-company",) or n.startswith("aspect:")) and not op.needs_text})
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


def _peers(job: CompaniesJob, bundle, *, competitors: bool, cv_splits: tuple[str, ...] | None = None) -> list[dict]:
    """Competitor retrieval: each ``job.split`` company whose own texts name companies of the corpus
    (bench/peers.py; ``competitors``: in a sentence about competition) queries the whole corpus;
    identity, BM25, hybrid, and every company operator alone and as its recipe: whole-corpus MRR
    and, at ``-k 10``, MRR@10 and hits@10. With ``competitors``, also the recipe choice cross-validated
    over companies (:func:`_cross_validated`), rows with ``"folds"``."""
    from ..retrieval.recipe import Recipe, recipe_of
    from ..retrieval.recipe_fit import measure

    rows = distinct(read_jsonl(job.corpus))
    ops = [op for name, op in sorted(bundle.operators.items())
           if name == "similar-company" or name.startswith("aspect:") and not op.both_sides]
    corpus = competitor_corpus(rows, ops, competitors=competitors, splits=(job.split,))
    if not corpus.heads:
        return []
    encode = _encoder(job, bundle, ops)
    out = []
    for op in ops:
        recipe = recipe_of(op)
        # an operator without a recipe is measured as the recipe of itself alone (its "operator" row)
        scores = measure(recipe or Recipe(mixture={op.name: 1.0}), op, corpus, encode, k=K)
        at = scores["at_k"]
        if not out:
            out += [{"method": m, "mrr": scores[m], **at.get(m, {})} for m in ("identity", "bm25", "hybrid")]
        out.append({"method": f"{op.name} (operator alone)", "mrr": scores["operator"], **at.get("operator", {})})
        if recipe:
            out.append({"method": f"{op.name} (recipe: {recipe.describe()})", "mrr": scores["recipe"],
                        **at.get("recipe", {})})
    if competitors:
        out += _cross_validated(job, bundle, rows, encode, cv_splits)
    for row in out:
        row.update(gold="competitors" if competitors else "named peers", candidates=len(rows))
        row.setdefault("queries", len(corpus.heads))
    return out


def distinct(rows: list[dict]) -> list[dict]:
    """One company per distinct description (what an index of the corpus holds)."""
    return list({r["text"]: r for r in rows if isinstance(r.get("text"), str) and r["text"].strip()}.values())


def competitor_corpus(rows: list[dict], ops=(), *, competitors: bool = True, splits: tuple[str, ...] | None,
                      mentions: bool = False):
    """The whole corpus (``rows``: one company per distinct text, :func:`distinct`) as queries of the
    companies of ``splits`` (None: every split) whose own texts name others (bench/peers.py), those
    others their gold; the GICS codes (:data:`COMPANY_FIELDS`) and other metadata fields the recipes'
    bonuses read; each company's prominence (indexer/mining.py) mined from the Yahoo texts alone, as an
    index of them mines it, and, with ``mentions`` (the cross-validation, and tools/build_pack.py
    choosing the pack's recipe) or when a recipe of ``ops`` weighs them, which companies name which
    from every text but the judge's sentences: the sentences that name the gold are never read for either."""
    from ..indexer.mining import mentions_of, prominence_of
    from ..retrieval.recipe import recipe_of
    from ..retrieval.recipe_fit import Corpus
    from .peers import MENTIONING, mine_peers, without_cues

    position = {r["id"]: i for i, r in enumerate(rows)}
    gold: dict[int, set[int]] = {}
    for a, b in mine_peers(rows, competitors=competitors):
        if splits is None or rows[position[a]].get("split") in splits:
            gold.setdefault(position[a], set()).add(position[b])
    fields = {f for op in ops if recipe_of(op) for f in recipe_of(op).same}  # the metadata bonuses need
    heads = sorted(gold)
    return Corpus([r["text"] for r in rows], heads, [gold[h] for h in heads],
                  {f: [r.get(f) for r in rows] for f in dict.fromkeys([*COMPANY_FIELDS, *sorted(fields)])},
                  prominence=prominence_of([[r["text"]] for r in rows], [r.get("name") for r in rows]),
                  mentions=mentions_of([[r["text"], *(without_cues(r.get(f)) for f in MENTIONING)] for r in rows],
                                       [r.get("name") for r in rows])
                  if mentions or any(recipe_of(op) and recipe_of(op).mentions for op in ops) else None)


def _encoder(job: CompaniesJob, bundle, ops):
    """texts → raw vectors of ``bundle``'s encoder; query towers among ``ops`` attached to it."""
    if any(op.needs_text for op in ops):
        from ..encoder.model import Encoder
        from ..encoder.tower import attach_towers

        attach_towers({op.name: op for op in ops}, Encoder(bundle.encoder_config()))

    def encode(texts):
        return raw_vectors(bundle, texts, cache_dir=job.cache_dir, progress=job.progress, precision=job.precision)
    return encode


def _cross_validated(job: CompaniesJob, bundle, rows: list[dict], encode, cv_splits) -> list[dict]:
    """similar-company's recipe choice cross-validated over companies: the companies of ``cv_splits``
    (None: every split) with competitors their texts name, in ``job.folds`` folds of linked companies
    (:func:`~relsearch.retrieval.recipe_fit.query_folds`); each fold's recipe chosen on the other
    folds (as tools/build_pack.py chooses the shipped one on train and dev), measured on the fold,
    beside identity, BM25 and hybrid: MRR@10 and hits@10, mean and spread over folds, and pooled."""
    from ..retrieval.recipe_fit import cross_validate, query_folds

    op = bundle.operators.get("similar-company")
    if op is None or not job.folds:
        return []
    corpus = competitor_corpus(rows, [op], competitors=True, splits=cv_splits, mentions=True)
    try:
        folds = query_folds(corpus, job.folds)
    except ValueError:  # fewer groups of linked companies than folds (a small corpus): nothing to cross-validate
        return []
    cv = cross_validate(op, corpus, folds, encode, k=K)
    methods = ["identity", "bm25", "hybrid"] + (["operator"] if op.kind != "identity" else []) + ["recipe"]
    names = {"operator": "similar-company (operator alone)",
             "recipe": "similar-company (recipe chosen on the other folds)"}
    where = "every split" if cv_splits is None else "/".join(cv_splits)
    return [{"method": names.get(m, m), "folds": job.folds, "companies": where, "queries": len(corpus.heads),
             **{key: cv["summary"][m][key] for key in (f"mrr@{K}", f"hits@{K}")},
             "per_fold": [f[m][f"mrr@{K}"] for f in cv["folds"]],
             **({"fold_recipes": [f["chosen"] for f in cv["folds"]]} if m == "recipe" else {})} for m in methods]
