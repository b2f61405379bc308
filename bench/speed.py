"""`relsearch bench speed`: encoding, indexing and query speed side by side, in one process.

Every ratio compares two things measured here, now, on the same texts, model and machine:
relsearch's encoder vs sentence-transformers ``encode``; ``relsearch index`` (Beam pipeline,
FAISS, docstore) vs pure encoding of the same texts; relsearch's batched query path vs raw FAISS
on the same index with the same query vectors; beside the encoder, this machine's limits for the
model, measured in the same run (bench/limits.py). Figures are medians over ``repeats`` rounds, and the
things compared are timed in turn within each round (load from other jobs hits them alike).
"""
from __future__ import annotations

import glob
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from .report import machine_info

DEFAULT_DATA = Path(os.environ.get("RELSEARCH_DATA", "../shared/data"))


def real_sentences(n: int, *, data_dir: Path = DEFAULT_DATA, seed: int = 0) -> list[str]:
    """``n`` real sentences, shuffled with ``seed``: distinct STS-B and MSRP sentences first (about
    23k; every CPU run stays within them), then flickr8k captions and the EvalRank pool (about
    88k distinct in all); a GPU-sized run past those repeats the list (nothing is cached, so a
    rate does not depend on it; indexed documents keep distinct ids)."""
    first = set()
    for path in sorted(glob.glob(str(data_dir / "stsb" / "pairs" / "*.jsonl"))
                       + glob.glob(str(data_dir / "msrp" / "pairs" / "*.jsonl"))):
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                first.update((row["a"], row["b"]))
    sentences = sorted(first)
    random.Random(seed).shuffle(sentences)
    if len(sentences) < n:
        more = set()
        for path in (data_dir / "flickr8k_captions" / "corpus.jsonl", data_dir / "evalrank" / "corpus.jsonl"):
            if path.is_file():
                with open(path) as f:
                    more.update(json.loads(line)["text"] for line in f)
        extra = sorted(more - first)
        random.Random(seed).shuffle(extra)
        sentences += extra
    if not sentences:
        raise ValueError(f"no STS-B or MSRP sentences under {data_dir}; set RELSEARCH_DATA to the shared data folder")
    return (sentences * -(-n // len(sentences)))[:n]


def _interleaved_medians(fns: list, repeats: int) -> list[float]:
    """Median seconds of each function, timed in turn within each of ``repeats`` rounds."""
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return [statistics.median(ts) for ts in times]


def _min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())


def encoding(texts: list[str], *, repeats: int = 3, st_batch_size: int = 32, device: str = "cpu",
             precision: str = "auto") -> dict:
    """relsearch Encoder (in ``precision``) vs sentence-transformers encode, same model, texts and
    device; beside them the machine's limits for this model, measured now (bench/limits.py)."""
    import torch
    from sentence_transformers import SentenceTransformer

    from ..encoder.model import Encoder, EncoderConfig, resolve_model_path
    from . import limits

    ours = Encoder(EncoderConfig(device=device, precision=precision))
    st = SentenceTransformer(resolve_model_path("all-MiniLM-L6-v2"), device=device)
    ours.encode(texts[:64])
    st.encode(texts[:64], batch_size=st_batch_size)  # warm both up
    # interleaved rounds: on a shared machine, load that comes and goes hits all three alike
    st_s, ours_s, model_s = _interleaved_medians([
        lambda: st.encode(texts, batch_size=st_batch_size), lambda: ours.encode(texts),
        limits.model_only(ours, texts)], repeats)
    cfg = ours.model.config
    shape = {"d": cfg.hidden_size, "ffn": cfg.intermediate_size}
    # both dtypes' matrix rate, whichever the encoder runs; bf16 with a small probe where it is not
    # chosen, since without bf16 units (AVX2-only CPUs) one full-size product takes seconds
    matrix = {"float32": limits.matrix_limit(ours.device, torch.float32, **shape),
              "bfloat16": limits.matrix_limit(ours.device, torch.bfloat16, **shape) if ours.dtype == torch.bfloat16
              else limits.matrix_limit(ours.device, torch.bfloat16, rows=512, rounds=1, **shape)}
    flops = limits.model_flops(cfg, limits.token_lengths(ours, texts))
    fp32_encoder = Encoder(EncoderConfig(device=device, precision="fp32"))
    t = time.perf_counter()
    reference = fp32_encoder.encode(texts).vectors
    fp32_s = time.perf_counter() - t
    return {
        "texts": len(texts),
        "device": ours.device,
        "precision": _dtype_name(ours.dtype),
        "precision_asked": precision,
        "precision_reason": ours.precision_reason,
        "attention": getattr(cfg, "_attn_implementation", None),
        "sentence_transformers_per_s": len(texts) / st_s,
        "relsearch_per_s": len(texts) / ours_s,
        "ratio": st_s / ours_s,
        "min_cosine_to_fp32": _min_cosine(ours.encode(texts).vectors, reference),
        "model_only_per_s": len(texts) / model_s,
        "relsearch_over_model_only": model_s / ours_s,
        "model_flops_per_sentence": flops / len(texts),
        "relsearch_flop_per_s": flops / ours_s,
        "fp32_per_s": len(texts) / fp32_s,  # one run, beside the chosen dtype's median
        "matrix_limit_flop_per_s": matrix,
        "relsearch_over_matrix_limit": flops / ours_s / matrix[_dtype_name(ours.dtype)],
        "probe": f"({limits.PROBE_ROWS} x {shape['d']}) @ ({shape['d']} x {shape['ffn']})",
    }


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def indexing(texts: list[str], workdir: Path, *, device: str = "auto", repeats: int = 3,
             precision: str = "auto") -> dict:
    """Wall time of the whole index job vs pure encoding of the same texts: medians of ``repeats``
    rounds, each timing one pure encoding then one index job (a fresh index each). On a shared VM
    the pace drifts and jumps by 10 % within minutes (2026-11-26, AMX Xeon: two single rounds
    minutes apart gave 1.14 and 1.02), more than the index job's own overhead."""
    from ..encoder.model import Encoder, EncoderConfig
    from ..pipelines.index import IndexJob, run_index

    corpus = workdir / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"s{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    encoder = Encoder(EncoderConfig(device=device, precision=precision))
    encoder.encode(texts[:64])
    t = time.perf_counter()
    import apache_beam  # noqa: F401 - once per process, whatever the corpus size: reported apart
    beam_import_s = time.perf_counter() - t
    rounds = iter(range(repeats))

    def index_job() -> None:
        run_index(IndexJob(input=str(corpus), index=str(workdir / f"idx{next(rounds)}"), device=device,
                           precision=precision, progress=False))

    encode_s, index_s = _interleaved_medians([lambda: encoder.encode(texts), index_job], repeats)
    return {"documents": len(texts), "rounds": repeats, "pure_encoding_s": encode_s, "index_wall_s": index_s,
            "index_over_encoding": index_s / encode_s, "beam_import_s": beam_import_s,
            "index_with_import_over_encoding": (index_s + beam_import_s) / encode_s}


def raw_search(searcher, qv: np.ndarray, k: int):
    """What a FAISS user runs for the ``k`` best of ``qv``: ``index.search`` with the search parameters
    the index was tuned to at build (an IVF's nprobe: FAISS's own default, the one stored in the
    file, is 1) and the same exact re-ranking from the stored vectors when they include one, so
    that both sides do the same search work. Returns a function giving the (n, k) positions."""
    from ..indexer import ann

    index, params = searcher.files.faiss, searcher.effective_params()
    depth = int(params.get("rerank", 0))
    tuned = {p: v for p, v in params.items() if p != "rerank"}
    faiss_params = ann.faiss_parameters(index, tuned) if tuned else None

    def run() -> np.ndarray:
        _, positions = index.search(qv, max(k, depth), params=faiss_params)
        return ann.rescore(searcher.files.vectors, qv, positions, k).positions if depth else positions

    return run


def querying(index_dir: Path, queries: list[str], *, k: int = 10, repeats: int = 15, precision: str = "auto") -> dict:
    """Single-query latency (text, with/without relation) and batched QPS: relsearch's hits with their
    documents vs raw FAISS search alone (:func:`raw_search`: the same tuned search parameters) and vs
    raw FAISS plus the same documents read in one SQL statement (:func:`raw_fetch`: what a FAISS user
    needs to show a hit); beside them, relsearch when the caller builds every hit's ``Hit`` object,
    and the same queries through the query plan (retrieval/request.py ``run``: what ``relsearch
    query``, the API, the server and lookup jobs call; its pages are ``Hit`` objects). ``repeats``
    interleaved rounds (cheap: ~0.1 s each)."""
    from ..retrieval import request
    from ..retrieval.search import Query, Searcher

    searcher = Searcher(str(index_dir), precision=precision)
    relation = next((n for n in sorted(searcher.operators) if n != "identity"), "identity")
    out = {"relation": relation, "k": k}
    for name, rel in (("identity", "identity"), ("relation", relation)):
        searcher.search([Query(text=queries[0], relations={rel: 1.0})], k=k)  # warm
        lat = []
        for q in queries[:200]:
            t = time.perf_counter()
            searcher.search([Query(text=q, relations={rel: 1.0})], k=k)
            lat.append(time.perf_counter() - t)
        out[f"latency_ms_{name}_p50"] = 1000 * float(np.percentile(lat, 50))
        out[f"latency_ms_{name}_p95"] = 1000 * float(np.percentile(lat, 95))
    # batched search: the same raw vectors through relsearch's path and through FAISS directly
    ids = searcher.files.docstore.read(list(range(min(1000, len(searcher.files.vectors))))).ids
    batch = [Query(doc_id=i, relations={"identity": 1.0}) for i in ids]
    qv = np.ascontiguousarray(searcher.raw_vectors(batch))
    qv /= np.linalg.norm(qv, axis=1, keepdims=True)
    raw = raw_search(searcher, qv, k + 1)
    conn = searcher.files.segments[0].docstore.conn
    options = request.SearchOptions(k=k)

    def every_hit_built():  # a caller that reads every row as Hit objects (the CLI and the API read a page)
        return [row for row in searcher.search(batch, k=k)]

    ours_s, faiss_s, fetch_s, built_s, plan_s = _interleaved_medians([
        lambda: searcher.search(batch, k=k), raw, lambda: raw_fetch(conn, raw()), every_hit_built,
        lambda: request.run(searcher, batch, options)], repeats)
    out.update({"batch": len(batch), "faiss": searcher.files.manifest.faiss.get("factory"),
                "search_params": searcher.effective_params(),
                "relsearch_qps": len(batch) / ours_s, "raw_faiss_qps": len(batch) / faiss_s,
                "relsearch_over_faiss_qps": faiss_s / ours_s,
                "raw_faiss_with_docs_qps": len(batch) / fetch_s, "relsearch_over_faiss_with_docs_qps": fetch_s / ours_s,
                "relsearch_every_hit_built_qps": len(batch) / built_s,
                "plan_qps": len(batch) / plan_s, "plan_over_faiss_qps": faiss_s / plan_s,
                "plan_over_every_hit_built_qps": built_s / plan_s})
    return out


def raw_fetch(conn, positions: np.ndarray) -> list[tuple]:
    """What a raw-FAISS user runs to show the hits of a batch: one SQL statement reading id, text and
    metadata JSON of the distinct positions found (``positions``: FAISS's (n, k) labels, -1 pads)
    from the same SQLite docstore; rows as sqlite3 returns them, nothing decoded."""
    wanted = np.unique(positions[positions >= 0]).tolist()
    q = "SELECT pos, id, text, meta FROM docs WHERE pos IN (SELECT value FROM json_each(?))"
    return conn.execute(q, (json.dumps(wanted),)).fetchall()


def run(*, n_encode: int = 5000, n_index: int = 20000, repeats: int = 3, device: str = "cpu",
        precision: str = "auto", data_dir: Path = DEFAULT_DATA) -> dict:
    """Every measurement of `relsearch bench speed` on ``device`` ("cpu" or "cuda[:N]"), the encoder
    in ``precision`` (``auto``: what relsearch chooses there; ``fp32`` on a bf16 CPU measures the
    path a CPU without bf16 takes)."""
    check_device(device)
    texts = real_sentences(max(n_encode, n_index), data_dir=data_dir)
    result = {"machine": machine_info(),
              "encoding": encoding(texts[:n_encode], repeats=repeats, device=device, precision=precision)}
    with tempfile.TemporaryDirectory() as tmp:
        result["indexing"] = indexing(texts[:n_index], Path(tmp), device=device, repeats=repeats, precision=precision)
        result["querying"] = querying(Path(tmp) / "idx0", texts[-500:], precision=precision)
    return result


def check_device(device: str) -> None:
    """Raise ValueError (one line) for a device this machine does not have."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA device here (torch {torch.__version__} sees none); "
                         "use --device cpu")
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"--device {device!r}: choose cpu or cuda (cuda:N)")


def _g(flop_per_s: float) -> str:
    return f"{flop_per_s / 1e9:.1f} GFLOP/s" if flop_per_s < 1e12 else f"{flop_per_s / 1e12:.1f} TFLOP/s"


def query_lines(q: dict) -> list[str]:
    """The querying part of :func:`format_table`."""
    return [
        f"querying (k={q['k']}):",
        f"  single text query p50/p95: identity {q['latency_ms_identity_p50']:.1f}/{q['latency_ms_identity_p95']:.1f} ms, "
        f"{q['relation']} {q['latency_ms_relation_p50']:.1f}/{q['latency_ms_relation_p95']:.1f} ms",
        f"  batched ({q['batch']} queries, hits with their documents; {q.get('faiss') or 'FAISS'}"
        f"{' ' + json.dumps(q['search_params']) if q.get('search_params') else ''} on both sides): "
        f"relsearch {q['relsearch_qps']:.0f} QPS",
        f"    vs raw FAISS search alone {q['raw_faiss_qps']:.0f} QPS: ratio {q['relsearch_over_faiss_qps']:.3f}",
        f"    vs raw FAISS + the same documents in one SQL read {q['raw_faiss_with_docs_qps']:.0f} QPS: "
        f"ratio {q['relsearch_over_faiss_with_docs_qps']:.3f}",
        f"    relsearch with every hit built as a Hit object: {q['relsearch_every_hit_built_qps']:.0f} QPS",
        f"    through the query plan (request.run: pages of Hit objects, what query/API/serve/lookup call): "
        f"{q['plan_qps']:.0f} QPS, ratio {q['plan_over_faiss_qps']:.3f} of raw FAISS, "
        f"{q['plan_over_every_hit_built_qps']:.3f} of every hit built",
    ]


def format_table(r: dict) -> str:
    e, i, q, m = r["encoding"], r["indexing"], r["querying"], r["machine"]
    return "\n".join([
        f"machine: {m['cpu']}, {m['usable_cpus']} usable CPUs, torch threads {m['torch_threads']}, "
        f"GPU {', '.join(m['gpu']) if m['gpu'] else 'none'}",
        f"encoding {e['texts']} sentences on {e['device']}, all-MiniLM-L6-v2 ({e['attention']} attention):",
        f"  sentence-transformers encode   {e['sentence_transformers_per_s']:8.1f} sentences/s",
        f"  relsearch encoder ({e['precision']:>8})  {e['relsearch_per_s']:8.1f} sentences/s   "
        f"ratio {e['ratio']:.2f}x   min cosine to fp32 {e['min_cosine_to_fp32']:.5f}",
        f"  precision: {e['precision']}, " + (f"chosen by `auto`: {e['precision_reason']}"
                                               if e.get("precision_asked", "auto") == "auto" else "asked for"),
        f"  relsearch encoder in float32 (one run, the cosine reference): {e['fp32_per_s']:.1f} sentences/s",
        f"  limits, measured now: model alone (pre-tokenised batches on the device) {e['model_only_per_s']:.1f} "
        f"sentences/s -> relsearch at {100 * e['relsearch_over_model_only']:.0f}% of it",
        f"    matrix product {e['probe']}: "
        + ", ".join(f"{dtype} {_g(rate)}" for dtype, rate in e["matrix_limit_flop_per_s"].items()),
        f"    relsearch does {e['model_flops_per_sentence'] / 1e6:.1f} MFLOP/sentence x {e['relsearch_per_s']:.1f}/s "
        f"= {_g(e['relsearch_flop_per_s'])} -> {100 * e['relsearch_over_matrix_limit']:.0f}% of the "
        f"{e['precision']} matrix limit",
        f"indexing {i['documents']} documents (medians of {i['rounds']} interleaved rounds):",
        f"  pure encoding {i['pure_encoding_s']:.1f} s   relsearch index {i['index_wall_s']:.1f} s   "
        f"ratio {i['index_over_encoding']:.3f}   ({i['index_with_import_over_encoding']:.3f} counting "
        f"{i['beam_import_s']:.1f} s of importing Beam, once per process)",
    ] + query_lines(q))


def main(argv=None) -> None:
    """``python -m relsearch.bench.speed --index DIR``: the querying part of ``relsearch bench speed``
    alone, on an index already built (bench speed builds its own from ``--documents`` real
    sentences, which takes minutes of encoding on a CPU); the single-query texts are the last 500
    of those sentences, as bench speed takes them."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m relsearch.bench.speed", description=main.__doc__.split("\n")[0])
    parser.add_argument("--index", required=True, help="a published index")
    parser.add_argument("--documents", type=int, default=20000, help="bench speed's --documents (picks the texts)")
    parser.add_argument("--repeats", type=int, default=15, help="interleaved rounds of the batched comparison")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args(argv)
    texts = real_sentences(max(5000, args.documents))[-500:]
    q = querying(Path(args.index), texts, repeats=args.repeats, precision=args.precision)
    m = machine_info()
    print(json.dumps({"machine": m, "querying": q}) if args.json else "\n".join(
        [f"machine: {m['cpu']}, {m['usable_cpus']} usable CPUs, torch threads {m['torch_threads']}"] + query_lines(q)))


if __name__ == "__main__":
    main()
