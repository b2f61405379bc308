"""Storage that scales with change: what an append and a delete cost against the build, and what
segments cost a query.

    python -m relsearch.bench.segments --n 1000000 --cache base.npy

On an index of ``--n`` documents synthesised from real encoded sentences (the generator of
bench/scale.py; built with the library functions, FAISS ``auto``, tuned), in one run:

- ``build_seconds``: the build (rows, docstore, FAISS training, filling, tuning);
- ``append_seconds`` / ``delete_seconds``: one append of ``--batch`` new documents (a new segment)
  and one delete of ``--batch`` ids, each a full published generation (lock, write, checksums,
  fsync, swap); ``*_vs_build`` divides by the build time (the issue asks for < 5 %);
- ``qps``: batched queries (``--queries`` in one call) through ``Searcher.ann`` with one segment
  and, after ``--appends`` appends in all, with that many + 1 segments (the merge threshold is
  raised so none merge); median over ``--repeats`` rounds, and the ratio;
- ``latency_ms``: single ``Searcher.search`` calls by stored id (no text encoding): p50/p99 of
  unfiltered, 10 %-selective (``shard=3``: FAISS with an id selector) and 0.1 %-selective
  (``bucket=7``: exact over the matches) filters, and hybrid (RRF with BM25 on the stored text),
  on the segmented index;
- ``recall@10`` of the segmented index against exact search over its live documents.

Vectors are synthetic, so no encoding is timed: an append's encoding cost is the encoder's, the
same per document as in a build.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from . import scale

# a small vocabulary, so BM25 lists have the long postings of real text (texts are synthetic)
WORDS = ["oil", "gas", "bank", "loan", "chip", "cloud", "drug", "trial", "retail", "store", "power", "grid", "rail",
         "freight", "media", "film", "water", "steel", "mine", "gold", "bond", "fund", "ship", "port", "farm"]


def _blocks(base, n: int, first: int, seed: int, noise: float):
    from relsearch.indexer.build import Block

    for start, raw, _ in scale.synthesise(base, n, noise, seed):
        ids = range(first + start, first + start + len(raw))
        yield Block([{"id": f"s{i}", "text": f"synthetic document {i} about {WORDS[i % 97 % len(WORDS)]} and "
                      f"{WORDS[i % 89 % len(WORDS)]}", "metadata": {"shard": i % 10, "bucket": i % 1000}}
                     for i in ids], raw)


def _build(target: str, base, identity, args) -> float:
    from relsearch.indexer.build import build_published
    from relsearch.indexer.faiss_index import FaissSpec

    started = time.perf_counter()
    build_published(target, _blocks(base, args.n, 0, args.seed, args.noise), n=args.n, d=base.shape[1],
                    encoder=identity, spec=FaissSpec(factory=args.factory, recall_target=args.recall_target))
    return time.perf_counter() - started


def _qps(searcher, q: np.ndarray, k: int, repeats: int) -> float:
    searcher.ann(q, k)  # warm: FAISS loaded, pages cached
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        searcher.ann(q, k)
        times.append(time.perf_counter() - started)
    return len(q) / statistics.median(times)


def _latency(searcher, ids: list[str], k: int, filters: dict | None, hybrid: str | None = None) -> dict:
    from relsearch.retrieval.search import Query

    searcher.search([Query(doc_id=ids[0])], k=k, filters=filters, hybrid=hybrid)
    times = []
    for doc_id in ids:
        started = time.perf_counter()
        searcher.search([Query(doc_id=doc_id)], k=k, filters=filters, hybrid=hybrid)
        times.append((time.perf_counter() - started) * 1000)
    return {"p50": round(float(np.percentile(times, 50)), 2), "p99": round(float(np.percentile(times, 99)), 2)}


def run(args) -> dict:
    from relsearch.indexer import ann, mutations
    from relsearch.retrieval.search import Searcher

    base, identity = scale.encode_base(args.corpus, args.base, args.cache)
    out = args.out or tempfile.mkdtemp(prefix="relsearch-segments-")
    target = os.path.join(out, "idx")
    k = args.k
    _, h, _ = next(scale.synthesise(base, args.queries, args.noise, args.seed + 1, block=args.queries))
    q = (h / np.linalg.norm(h, axis=1, keepdims=True)).astype(np.float32)
    report: dict = {"n": args.n, "batch": args.batch}
    try:
        build_s = _build(target, base, identity, args)
        one = Searcher(target)
        qps_one = _qps(one, q, k, args.repeats)
        report["faiss"] = {key: one.files.manifest.faiss[key] for key in ("factory", "tier", "search_params")}
        report["build_seconds"] = round(build_s, 1)

        appends = []
        for i in range(args.appends):
            first = args.n + i * args.batch
            started = time.perf_counter()
            mutations.append(target, _blocks(base, args.batch, first, args.seed + 10 + i, args.noise), n=args.batch,
                             run={"read": args.batch}, max_segments=args.appends + 1)
            appends.append(time.perf_counter() - started)
            if i == 0:
                started = time.perf_counter()
                mutations.delete(target, [f"s{j}" for j in range(0, args.n, max(args.n // args.batch, 1))][:args.batch])
                delete_s = time.perf_counter() - started
        report["append_seconds"] = round(appends[0], 2)
        report["append_seconds_median"] = round(statistics.median(appends), 2)
        report["delete_seconds"] = round(delete_s, 2)
        report["append_vs_build"] = round(appends[0] / build_s, 4)
        report["delete_vs_build"] = round(delete_s / build_s, 4)

        many = Searcher(target)
        qps_many = _qps(many, q, k, args.repeats)
        segments = len(many.files.segments)
        report["qps"] = {"1 segment": round(qps_one, 1), f"{segments} segments": round(qps_many, 1),
                         "ratio": round(qps_many / qps_one, 3)}
        truth = ann.exact_search(many.files.vectors, q, k, np.flatnonzero(many.files.live().mask))
        report[f"recall@{k}"] = round(scale.recall_at(many.ann(q, k).positions, truth, many.files.vectors, q), 4)
        ids = [f"s{i}" for i in range(1, args.n, max(args.n // args.latency_queries, 1))][:args.latency_queries]
        report["latency_ms"] = {"unfiltered": _latency(many, ids, k, None),
                                "shard=3 (10%)": _latency(many, ids, k, {"shard": 3}),
                                "bucket=7 (0.1%)": _latency(many, ids, k, {"bucket": 7}),
                                "hybrid rrf": _latency(many, ids, k, None, "rrf")}
        report["threads"] = scale._threads()
    finally:
        if not args.out and not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    return report


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m relsearch.bench.segments", description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", default=os.environ.get("RELSEARCH_BENCH_CORPUS", scale.DEFAULT_CORPUS),
                        help="JSONL with a 'text' field: the real sentences to encode")
    parser.add_argument("--base", type=int, default=5000, help="real sentences encoded")
    parser.add_argument("--n", type=int, default=1_000_000, help="synthetic documents in the build")
    parser.add_argument("--batch", type=int, default=1000, help="documents per append, ids per delete")
    parser.add_argument("--appends", type=int, default=9, help="appends in all (segments = appends + 1)")
    parser.add_argument("--noise", type=float, default=1.0)
    parser.add_argument("--queries", type=int, default=1000, help="batched queries for QPS")
    parser.add_argument("--latency-queries", type=int, default=200, help="single queries for latency")
    parser.add_argument("-k", "--k", type=int, default=10)
    parser.add_argument("--recall-target", type=float, default=0.95)
    parser.add_argument("--factory", default="auto")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default=None, help="save/load the encoded base vectors (.npy)")
    parser.add_argument("--out", default=None, help="keep the index here (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    args = parser.parse_args(argv)
    if not Path(args.corpus).is_file():
        parser.error(f"--corpus {args.corpus} not found (any JSONL with a 'text' field will do)")
    report = run(args)
    print(json.dumps(report) if args.json else "\n".join(f"{k:>22}: {v}" for k, v in report.items()))


if __name__ == "__main__":
    main()
