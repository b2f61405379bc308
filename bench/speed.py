"""`relsearch bench speed`: encoding, indexing and query speed side by side, in one process.

Every ratio compares two things measured here, now, on the same texts, model and machine:
relsearch's encoder vs sentence-transformers ``encode``; ``relsearch index`` (Beam pipeline,
FAISS, docstore) vs pure encoding of the same texts; relsearch's batched query path vs raw FAISS
on the same index with the same query vectors. Figures are medians over ``repeats``.
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
    """``n`` distinct real sentences (STS-B and MSRP pairs), shuffled with ``seed``."""
    pool = set()
    for path in sorted(glob.glob(str(data_dir / "stsb" / "pairs" / "*.jsonl"))
                       + glob.glob(str(data_dir / "msrp" / "pairs" / "*.jsonl"))):
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                pool.update((row["a"], row["b"]))
    if len(pool) < n:
        raise ValueError(f"only {len(pool)} sentences under {data_dir}; ask for fewer")
    sentences = sorted(pool)
    random.Random(seed).shuffle(sentences)
    return sentences[:n]


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())


def encoding(texts: list[str], *, repeats: int = 3, st_batch_size: int = 32) -> dict:
    """relsearch Encoder (auto precision) vs sentence-transformers encode, same model and texts."""
    from sentence_transformers import SentenceTransformer

    from ..encoder.model import Encoder, EncoderConfig, resolve_model_path

    ours = Encoder(EncoderConfig())
    st = SentenceTransformer(resolve_model_path("all-MiniLM-L6-v2"), device="cpu")
    ours.encode(texts[:64])
    st.encode(texts[:64], batch_size=st_batch_size)  # warm both up
    st_s = _median_time(lambda: st.encode(texts, batch_size=st_batch_size), repeats)
    ours_s = _median_time(lambda: ours.encode(texts), repeats)
    reference = Encoder(EncoderConfig(precision="fp32")).encode(texts).vectors
    return {
        "texts": len(texts),
        "precision": str(ours.dtype).replace("torch.", ""),
        "sentence_transformers_per_s": len(texts) / st_s,
        "relsearch_per_s": len(texts) / ours_s,
        "ratio": st_s / ours_s,
        "min_cosine_to_fp32": _min_cosine(ours.encode(texts).vectors, reference),
    }


def indexing(texts: list[str], workdir: Path) -> dict:
    """Wall time of the whole index job vs pure encoding of the same texts."""
    from ..encoder.model import Encoder, EncoderConfig
    from ..pipelines.index import IndexJob, run_index

    corpus = workdir / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"s{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    encoder = Encoder(EncoderConfig())
    encoder.encode(texts[:64])
    t = time.perf_counter()
    encoder.encode(texts)
    encode_s = time.perf_counter() - t
    t = time.perf_counter()
    run_index(IndexJob(input=str(corpus), index=str(workdir / "idx"), progress=False))
    index_s = time.perf_counter() - t
    return {"documents": len(texts), "pure_encoding_s": encode_s, "index_wall_s": index_s,
            "index_over_encoding": index_s / encode_s}


def querying(index_dir: Path, queries: list[str], *, k: int = 10, repeats: int = 5) -> dict:
    """Single-query latency (text, with/without relation) and batched QPS vs raw FAISS."""
    from ..retrieval.search import Query, Searcher

    searcher = Searcher(str(index_dir))
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
    ids = [searcher.files.docstore.get([i])[i]["id"] for i in range(min(1000, len(searcher.files.vectors)))]
    batch = [Query(doc_id=i, relations={"identity": 1.0}) for i in ids]
    qv = np.ascontiguousarray(searcher.raw_vectors(batch))
    qv /= np.linalg.norm(qv, axis=1, keepdims=True)
    index = searcher.files.faiss
    ours_s = _median_time(lambda: searcher.search(batch, k=k), repeats)
    faiss_s = _median_time(lambda: index.search(qv, k + 1), repeats)
    out.update({"batch": len(batch), "relsearch_qps": len(batch) / ours_s, "raw_faiss_qps": len(batch) / faiss_s,
                "relsearch_over_faiss_qps": faiss_s / ours_s})
    return out


def run(*, n_encode: int = 5000, n_index: int = 20000, repeats: int = 3, data_dir: Path = DEFAULT_DATA) -> dict:
    texts = real_sentences(max(n_encode, n_index), data_dir=data_dir)
    result = {"machine": machine_info(), "encoding": encoding(texts[:n_encode], repeats=repeats)}
    with tempfile.TemporaryDirectory() as tmp:
        result["indexing"] = indexing(texts[:n_index], Path(tmp))
        result["querying"] = querying(Path(tmp) / "idx", texts[-500:])
    return result


def format_table(r: dict) -> str:
    e, i, q, m = r["encoding"], r["indexing"], r["querying"], r["machine"]
    return "\n".join([
        f"machine: {m['cpu']}, {m['usable_cpus']} usable CPUs, torch threads {m['torch_threads']}, "
        f"GPU {', '.join(m['gpu']) if m['gpu'] else 'none'}",
        f"encoding {e['texts']} sentences, all-MiniLM-L6-v2:",
        f"  sentence-transformers encode   {e['sentence_transformers_per_s']:8.1f} sentences/s",
        f"  relsearch encoder ({e['precision']:>8})  {e['relsearch_per_s']:8.1f} sentences/s   "
        f"ratio {e['ratio']:.2f}x   min cosine to fp32 {e['min_cosine_to_fp32']:.5f}",
        f"indexing {i['documents']} documents:",
        f"  pure encoding {i['pure_encoding_s']:.1f} s   relsearch index {i['index_wall_s']:.1f} s   "
        f"ratio {i['index_over_encoding']:.3f}",
        f"querying (k={q['k']}):",
        f"  single text query p50/p95: identity {q['latency_ms_identity_p50']:.1f}/{q['latency_ms_identity_p95']:.1f} ms, "
        f"{q['relation']} {q['latency_ms_relation_p50']:.1f}/{q['latency_ms_relation_p95']:.1f} ms",
        f"  batched ({q['batch']} queries): relsearch {q['relsearch_qps']:.0f} QPS, raw FAISS {q['raw_faiss_qps']:.0f} QPS, "
        f"ratio {q['relsearch_over_faiss_qps']:.3f}",
    ])
