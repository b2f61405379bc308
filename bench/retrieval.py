"""``relsearch bench retrieval``: same-aspect retrieval, the AspectCSE protocol (design.md §5).

Documents of one split (``--split``; ``all`` = every document) with a non-empty text and a
non-null aspect label form the pool. Every pool document is a seed; its neighbours are the rest of
the pool (the seed excluded); relevant = same label. Per seed, for the top k:

- P@k   = relevant retrieved / k (k even when the pool has fewer than k other documents);
- R@k   = relevant retrieved / *all* relevant documents of the seed (not capped at k);
- MRR@k = 1 / rank of the first relevant hit within k, else 0;

macro-averaged over seeds. Seeds whose label no other pool document shares have nothing to find
and are left out (counted). Ties are explicit: every metric is its expectation under uniform random
tie-breaking (BM25 gives many equal scores), so a constant scorer scores exactly at chance.
Exact-duplicate texts are dropped (the first is kept): an identical copy is a trivially relevant hit.

Methods: ``bm25`` (seed text against the pool), ``identity`` (cos(ĥ, t̂)) and each relation
operator cos(op(h), t̂) — the operator on the query side only, as the index serves it.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass


from ..encoder.bundle import load_bundle
from ..encoder.metrics import aspect_retrieval_metrics as evaluate
from ..encoder.relations import lookup, normalize
from ..indexer.lexical import BM25
from .linkpred import raw_vectors
from .report import BenchInputError, BenchResult, Table, file_fingerprint, finish, read_jsonl

PROTOCOL = ("AspectCSE: every document of the split is a seed; neighbours = the split minus the seed; relevant = same "
            "aspect label; P@k = relevant in top k / k; R@k = relevant in top k / all relevant; MRR@k = 1/rank of the "
            "first relevant hit within k else 0; macro mean over seeds with at least one relevant document; "
            "expectation under random tie-breaking; documents with a null label or empty text and exact-duplicate "
            "texts are not in the pool")


@dataclass(frozen=True, kw_only=True)
class RetrievalJob:
    corpus: str
    aspect: str
    relations: tuple[str, ...] = ()  # () → every operator of the bundle
    k: int = 10
    split: str = "test"  # "all" → every document
    split_field: str = "split"
    text_field: str = "text"
    model: str | None = None
    cache_dir: str | None = None
    precision: str = "auto"
    progress: bool = False
    chunk: int = 1024


def label_key(value) -> str | None:
    """A comparable label (JSON for non-strings); None for null, empty or missing labels."""
    if value is None or value == "" or value == []:
        return None
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def select_pool(rows: list[dict], job: RetrievalJob) -> tuple[list[str], list[str], dict]:
    """(texts, labels, counts) of the documents that take part (see module doc)."""
    if job.split != "all":
        splits = {r.get(job.split_field) for r in rows}
        rows = [r for r in rows if r.get(job.split_field) == job.split]
        if not rows:
            raise BenchInputError(f"no documents with {job.split_field}={job.split!r} in {job.corpus}; values: "
                                  f"{', '.join(sorted(map(str, splits)))} (or --split all)")
    if not any(job.aspect in r for r in rows):
        fields = sorted({f for r in rows for f in r})
        raise BenchInputError(f"no document has the aspect field {job.aspect!r}; fields: {', '.join(fields)}")
    counts = {"documents": len(rows), "no_text": 0, "no_label": 0, "duplicate_text": 0}
    texts, labels, seen = [], [], set()
    for r in rows:
        text, label = r.get(job.text_field), label_key(r.get(job.aspect))
        if not isinstance(text, str) or not text.strip():
            counts["no_text"] += 1
        elif label is None:
            counts["no_label"] += 1
        elif text in seen:
            counts["duplicate_text"] += 1
        else:
            seen.add(text)
            texts.append(text)
            labels.append(label)
    counts["pool"], counts["labels"] = len(texts), len(set(labels))
    if len(texts) < 2:
        raise BenchInputError(f"only {len(texts)} usable document(s) in {job.corpus} (split {job.split}): "
                              f"{json.dumps(counts)}")
    return texts, labels, counts


def table(rows: list[dict], k: int, title: str) -> Table:
    ident = next((r for r in rows if r["method"] == "identity"), None)
    out = [[r["method"], r["seeds"], r[f"p@{k}"], r[f"r@{k}"], r[f"mrr@{k}"],
            None if r["method"] == "identity" or ident is None else r[f"p@{k}"] - ident[f"p@{k}"]] for r in rows]
    return Table(title, ["method", "seeds", f"P@{k}", f"R@{k}", f"MRR@{k}", f"ΔP@{k} id"], out,
                 note="macro means over seeds; expectation under random tie-breaking")


def run_retrieval(job: RetrievalJob, *, json_out: str | None = None, plot_out: str | None = None,
                  command: str | None = None, clock=time.perf_counter) -> BenchResult:
    started = clock()
    if job.k < 1:
        raise BenchInputError(f"-k must be at least 1, got {job.k}")
    texts, labels, counts = select_pool(read_jsonl(job.corpus), job)
    bundle = load_bundle(job.model)
    names = list(job.relations) or sorted(n for n in bundle.operators if n != "identity")
    ops = {name: lookup(bundle.operators, name) for name in dict.fromkeys(["identity", *names])}
    h = raw_vectors(bundle, texts, cache_dir=job.cache_dir, progress=job.progress, precision=job.precision)
    unit = normalize(h)
    bm25 = BM25(texts)
    rows = [dict(method="bm25", **evaluate(lambda a, b: bm25.scores(texts[a:b]), labels, job.k, chunk=job.chunk))]
    for name, op in ops.items():
        q, docs = op.apply(h), op.documents(unit)
        rows.append(dict(method=name, **evaluate(lambda a, b, q=q, docs=docs: q[a:b] @ docs.T, labels, job.k, chunk=job.chunk)))
    payload = {"protocol": PROTOCOL, "aspect": job.aspect, "split": job.split, "k": job.k, "counts": counts,
               "rows": rows}
    title = f"same-{job.aspect} retrieval: {job.corpus} (split {job.split}, {counts['pool']} documents)"
    res = finish("retrieval", payload, [table(rows, job.k, title)], inputs={"corpus": file_fingerprint(job.corpus)},
                 bundle=bundle, command=command, started=started, clock=clock, json_out=json_out,
                 precision=job.precision)
    if plot_out:
        from . import plots

        shown = [n for n in ops if n != "identity"][:1]
        plots.retrieval_figure(rows, unit, {n: ops[n].apply(h) for n in shown}, labels, plot_out,
                               aspect=job.aspect, k=job.k)
        res.plot = plot_out
    return res
