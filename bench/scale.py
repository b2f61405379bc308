"""Scale check: a 200k-document auto index — recall@10 against exact search, and the QPS of
relsearch's query path against raw FAISS on the same index with the same parameters.

    python -m relsearch.bench.scale --corpus ../shared/data/flickr8k_captions/corpus.jsonl

Encoding 200k texts takes hours on a laptop CPU, so the corpus is synthesised from real vectors:
``--base`` real sentences (default 5000) are encoded with the default encoder, then each
synthetic document i is

    x_i = normalize(û_b + a·û_c + σ·g/√d),   raw h_i = x_i · ‖h_b‖

with b, c two random real sentences, a ~ U(0, 0.5), g ~ N(0, I_d) and σ = ``--noise`` (1.0):
a real sentence, pulled toward another one, plus isotropic noise. The tool prints the mean cosine
of each query's 1st and 10th exact neighbour so the difficulty can be judged. Queries are
``--queries`` fresh draws from the same generator (held out: not in the index).

The index is built by the library functions (indexer/build.py: streaming vectors.npy and
docstore, FAISS ``auto`` with build-time tuning to ``--recall-target``), not through Beam.

Timed paths, batched (all queries in one call), ``--repeats`` alternating rounds (11), median QPS:

- ``faiss``: ``index.search(q, k, params=SearchParameters(tuned))`` on the loaded index;
- ``relsearch``: identity relation on raw vectors (``Searcher.transform``) + ``Searcher.ann`` (tuned
  parameters, live-document selection, exact top-up for short rows, re-rank if any) — the
  query path below text encoding and above docstore lookups;
- ``relsearch+docs``: the same plus ``Searcher.hits`` (the hits as columns: docstore fetch of id,
  text, metadata in one ordered read per batch; retrieval/hits.py);
- ``faiss+docs``: ``faiss`` plus the read a FAISS user needs to show those hits: one SQL statement
  for id, text and metadata of the distinct positions (bench/speed.py ``raw_fetch``);
- the batch of ``relsearch bench speed``, at this size: ``--queries`` indexed documents as ``--id``
  queries through ``Searcher.search`` (``search``: validation, stored vectors, the query's own
  document dropped, the hits as columns with their documents) and through the query plan
  (``plan``: retrieval/request.py ``run``, what ``relsearch query``, the API, the server and
  lookup jobs call; its pages are ``Hit`` objects), against ``faiss_ids``: the same FAISS search
  of those documents' vectors (k + 1, tuned parameters: bench/speed.py ``raw_search``).

``ratio_relsearch_vs_faiss`` is median QPS over median QPS; ``ratio_paired_median`` is the median
of the per-round ratios, and ``ratio_cpu_time`` the ratio of median CPU seconds (all threads):
both are steadier than wall-clock QPS on a machine shared with other jobs.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

DEFAULT_CORPUS = "../shared/data/flickr8k_captions/corpus.jsonl"


def encode_base(corpus: str, n: int, cache: str | None):
    """(n, d) raw vectors of the first n texts of ``corpus`` and the encoder identity."""
    from relsearch.encoder.model import Encoder, EncoderConfig

    encoder = Encoder(EncoderConfig())
    if cache and os.path.exists(cache):
        return np.load(cache), encoder.identity
    texts = []
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            texts.append(json.loads(line)["text"])
            if len(texts) == n:
                break
    vectors = encoder.encode(texts).vectors.astype(np.float32)
    if cache:
        np.save(cache, vectors)
    return vectors, encoder.identity


def synthesise(base: np.ndarray, n: int, noise: float, seed: int, block: int = 20_000):
    """Yield (first index, raw vectors (m, d)) blocks of the generator in the module docstring."""
    rng = np.random.default_rng(seed)
    norms = np.linalg.norm(base, axis=1)
    unit = base / norms[:, None]
    d = base.shape[1]
    for start in range(0, n, block):
        m = min(block, n - start)
        b, c = rng.integers(0, len(base), m), rng.integers(0, len(base), m)
        a = rng.uniform(0.0, 0.5, m).astype(np.float32)[:, None]
        x = unit[b] + a * unit[c] + noise * rng.standard_normal((m, d), dtype=np.float32) / np.sqrt(d)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        yield start, (x * norms[b][:, None]).astype(np.float32), b


def build(target: str, base, identity, args) -> tuple[dict, float]:
    from relsearch.indexer import sharded_add
    from relsearch.indexer.build import Block, build_published
    from relsearch.indexer.faiss_index import FaissSpec

    def blocks():
        for start, raw, b in synthesise(base, args.n, args.noise, args.seed):
            docs = [{"id": f"s{start + i}", "text": f"synthetic document {start + i} (base sentence {int(j)})",
                     "metadata": {"shard": (start + i) % 10}} for i, j in enumerate(b)]
            yield Block(docs, raw)

    started = time.perf_counter()
    manifest = build_published(target, blocks(), n=args.n, d=base.shape[1], encoder=identity,
                               spec=FaissSpec(factory=args.factory, recall_target=args.recall_target,
                                              fill=sharded_add.LocalAdd(args.add_workers)
                                              if args.add_workers > 1 else None),
                               run={"synthetic": {"base": len(base), "noise": args.noise, "seed": args.seed}},
                               bm25=False)  # synthetic texts: BM25 lists would only cost build time
    return manifest, time.perf_counter() - started


def recall_at(found: np.ndarray, truth, vectors: np.ndarray, q: np.ndarray) -> float:
    """Share of found positions scoring at least the exact k-th score (ties count as hits)."""
    valid = found >= 0
    rows = np.asarray(vectors[np.where(valid, found, 0).ravel()], dtype=np.float32).reshape(*found.shape, -1)
    got = np.einsum("nd,nkd->nk", q, rows)
    return float((valid & (got >= truth.scores[:, -1:] - 1e-6)).sum() / truth.positions.size)


class AnonPeak:
    """The peak of this process's anonymous resident memory (``RssAnon``), sampled every 0.2 s.
    ``ru_maxrss`` also counts the file-backed pages of the memory-mapped vectors.npy it has read,
    which the kernel reclaims at will; the anonymous part is what a build really holds."""

    def __init__(self):
        import threading

        self.peak_kib, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self):
        while not self._stop.wait(0.2):
            try:
                with open("/proc/self/status") as f:
                    kib = next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))
            except (OSError, StopIteration):
                return
            self.peak_kib = max(self.peak_kib, kib)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return round(self.peak_kib / 1024, 1)


def run(args) -> dict:
    from relsearch.indexer import ann, sharded_add
    from relsearch.retrieval.search import Searcher

    anon = AnonPeak()
    base, identity = encode_base(args.corpus, args.base, args.cache)
    out = args.out or tempfile.mkdtemp(prefix="relsearch-scale-")
    target = os.path.join(out, "idx")
    manifest, build_s = build(target, base, identity, args)
    # the build alone, before searches re-rank from the memory-mapped vectors.npy (those pages count too)
    build_rss = {"peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                 "peak_rss_anon_mib": round(anon.peak_kib / 1024, 1)}
    searcher = Searcher(target)
    k = args.k
    _, h, _ = next(synthesise(base, args.queries, args.noise, args.seed + 1, block=args.queries))
    q = (h / np.linalg.norm(h, axis=1, keepdims=True)).astype(np.float32)
    vectors = searcher.files.vectors
    truth = ann.exact_search(vectors, q, k)
    paths = _paths(searcher, h, q, k, args.n)
    times, cpu = _timed(paths, args.repeats)
    report = {
        "n": args.n, "dim": int(base.shape[1]), "base_sentences": len(base), "noise": args.noise,
        "queries": len(q), "k": k, "faiss": {key: manifest.faiss[key] for key in ("factory", "tier", "search_params")},
        "tuning_validation_recall": manifest.faiss["tuning"]["validation_recall"],
        "build_seconds": round(build_s, 1),
        "exact_neighbour_cosine": {"1st": round(float(truth.scores[:, 0].mean()), 3),
                                   f"{k}th": round(float(truth.scores[:, -1].mean()), 3)},
        f"recall@{k}": _recall(searcher, paths, truth, h, q, k),
        **_speeds(times, cpu, len(q)),
        "build_peak_rss": build_rss,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "peak_rss_anon_mib": anon.stop(),
        # each FAISS add worker's own peak (VmHWM; --add-workers > 1): it reads its rows with pread
        "peak_rss_add_workers_mib": sharded_add.last_worker_peaks_mib,
        "vectors_npy_gib": round(args.n * base.shape[1] * 4 / 2**30, 2),
        "index_faiss_mib": round(os.path.getsize(searcher.files.root / "index.faiss") / 2**20, 1),  # the generation folder
        "threads": _threads(),
    }
    if not args.out and not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    return report


def _paths(searcher, h: np.ndarray, q: np.ndarray, k: int, n: int) -> dict:
    """name → a call answering the (b, d) raw queries ``h`` (``q``: unit) one way: raw FAISS and
    relsearch's ANN, each with and without the documents, and bench speed's batch of ``b`` indexed
    documents as --id queries (FAISS by ids, search, the query plan)."""
    from relsearch.bench.speed import raw_fetch, raw_search
    from relsearch.indexer import ann
    from relsearch.retrieval import request
    from relsearch.retrieval.search import Query

    index, params = searcher.files.faiss, dict(searcher.tuned_params)
    raw_params = ann.faiss_parameters(index, {p: v for p, v in params.items() if p != "rerank"})
    depth = params.get("rerank", 0)

    def raw_faiss():
        scores, positions = index.search(q, max(k, depth), params=raw_params)
        if depth:  # the same exact re-ranking a FAISS user would do from the stored vectors
            return ann.rescore(searcher.files.vectors, q, positions, k).positions
        return positions

    def relsearch_path():
        return searcher.ann(searcher.transform(h, {"identity": 1.0}), k).positions

    queries = [Query(doc_id=None, text="") for _ in range(len(h))]

    def relsearch_docs():
        return searcher.hits(searcher.ann(searcher.transform(h, {"identity": 1.0}), k), queries, k)

    conn = searcher.files.segments[0].docstore.conn

    def raw_faiss_docs():
        found = raw_faiss()
        raw_fetch(conn, found)  # the documents a FAISS user reads to show the hits: one SQL statement
        return found

    # bench speed's batch at this size: indexed documents as --id queries, spread over the index
    by_id = [Query(doc_id=i) for i in searcher.files.docstore.read(
        np.linspace(0, n - 1, len(q)).astype(np.int64).tolist()).ids]
    q_ids = np.ascontiguousarray(searcher.raw_vectors(by_id))
    q_ids /= np.linalg.norm(q_ids, axis=1, keepdims=True)
    options = request.SearchOptions(k=k)
    return {"faiss": raw_faiss, "relsearch": relsearch_path, "relsearch+docs": relsearch_docs,
            "faiss+docs": raw_faiss_docs, "faiss_ids": raw_search(searcher, q_ids, k + 1),
            "search": lambda: searcher.search(by_id, k=k), "plan": lambda: request.run(searcher, by_id, options)}


def _timed(paths: dict, repeats: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each path's wall and CPU seconds per round, after one warming call each; the paths of a
    round run back to back, so a round's timings share the machine's load."""
    for fn in paths.values():
        fn()  # warm: page cache, OpenMP threads
    times = {name: [] for name in paths}
    cpu = {name: [] for name in paths}
    for _ in range(repeats):
        for name, fn in paths.items():
            t, c = time.perf_counter(), time.process_time()
            fn()
            times[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
    return times, cpu


def _recall(searcher, paths: dict, truth, h: np.ndarray, q: np.ndarray, k: int) -> dict:
    """Recall@k of relsearch's and raw FAISS's answers, and of a search filtered to a tenth of the index."""
    from relsearch.indexer import ann

    vectors = searcher.files.vectors
    shard = np.asarray(searcher.files.docstore.matching({"shard": 3}), np.int64)
    filtered = searcher.ann(searcher.transform(h, {"identity": 1.0}), k, subset=shard)
    filtered_truth = ann.exact_search(vectors, q, k, shard)
    return {"relsearch": round(recall_at(paths["relsearch"](), truth, vectors, q), 4),
            "faiss": round(recall_at(paths["faiss"](), truth, vectors, q), 4),
            "filtered_10pct": round(recall_at(filtered.positions, filtered_truth, vectors, q), 4),
            "filtered_10pct_full_rows": bool((filtered.positions >= 0).all())}


def _paired(times: dict[str, list[float]], base: str, path: str) -> float:
    """The median over rounds of ``base``'s time over ``path``'s: the two timings of a round are
    adjacent, so load from other processes on a shared machine cancels out."""
    return round(statistics.median(f / r for f, r in zip(times[base], times[path])), 4)


def _speeds(times: dict[str, list[float]], cpu: dict[str, list[float]], queries: int) -> dict:
    """Queries per second of each path (median and best round) and relsearch's against FAISS's."""
    qps = {name: queries / statistics.median(ts) for name, ts in times.items()}
    best = {name: queries / min(ts) for name, ts in times.items()}
    return {
        "qps_median": {name: round(v, 1) for name, v in qps.items()},
        "qps_best": {name: round(v, 1) for name, v in best.items()},
        "ratio_relsearch_vs_faiss": round(qps["relsearch"] / qps["faiss"], 4),
        "ratio_paired_median": _paired(times, "faiss", "relsearch"),
        # CPU seconds of this process (all threads) per round: insensitive to other jobs' load
        "ratio_cpu_time": round(statistics.median(cpu["faiss"]) / statistics.median(cpu["relsearch"]), 4),
        "ratio_with_docs_vs_faiss": round(qps["relsearch+docs"] / qps["faiss"], 4),
        "ratio_with_docs_paired_median": _paired(times, "faiss", "relsearch+docs"),
        "ratio_with_docs_vs_faiss_with_docs": round(qps["relsearch+docs"] / qps["faiss+docs"], 4),
        "ratio_with_docs_vs_faiss_with_docs_paired_median": _paired(times, "faiss+docs", "relsearch+docs"),
        "ratio_search_vs_faiss_ids_paired_median": _paired(times, "faiss_ids", "search"),
        "ratio_plan_vs_faiss_ids_paired_median": _paired(times, "faiss_ids", "plan"),
    }


def _threads() -> int:
    import faiss

    return int(faiss.omp_get_max_threads())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m relsearch.bench.scale", description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", default=os.environ.get("RELSEARCH_BENCH_CORPUS", DEFAULT_CORPUS),
                        help="JSONL with a 'text' field: the real sentences to encode")
    parser.add_argument("--base", type=int, default=5000, help="real sentences encoded")
    parser.add_argument("--n", type=int, default=200_000, help="synthetic documents indexed")
    parser.add_argument("--noise", type=float, default=1.0, help="σ of the isotropic noise")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("-k", "--k", type=int, default=10)
    parser.add_argument("--recall-target", type=float, default=0.95)
    parser.add_argument("--factory", default="auto",
                        help="FAISS index-factory string, e.g. IVF1024,PQ48 (default: auto)")
    parser.add_argument("--add-workers", type=int, default=1,
                        help="processes filling an IVF index shard by shard (indexer/sharded_add.py)")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default=None, help="save/load the encoded base vectors (.npy)")
    parser.add_argument("--out", default=None, help="keep the index here (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary index")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    args = parser.parse_args(argv)
    if not Path(args.corpus).is_file():
        parser.error(f"--corpus {args.corpus} not found (any JSONL with a 'text' field will do)")
    report = run(args)
    if args.json:
        print(json.dumps(report))
        return
    for key, value in report.items():
        print(f"{key:>28}: {value}")


if __name__ == "__main__":
    main()
