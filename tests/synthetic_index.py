"""Small indexes from synthetic vectors (no transformer), shared by the reliability tests.

The encoder identity is the default model's, so `Searcher` and `relsearch query` accept them.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

D = 384
RELSEARCH = shutil.which("relsearch") or str(Path(sys.executable).with_name("relsearch"))


def encoder_identity() -> dict:
    from relsearch.encoder.model import resolve_model_path, weights_fingerprint

    return {"model": "all-MiniLM-L6-v2", "weights_sha256": weights_fingerprint(resolve_model_path("all-MiniLM-L6-v2")),
            "pooling": "mean", "dim": D}


def raw_vectors(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(99).standard_normal((40, D)).astype(np.float32)
    return (centers[rng.integers(0, 40, n)] + 0.8 * rng.standard_normal((n, D)).astype(np.float32)) * 3.0


def block(ids: list[str], seed: int):
    from relsearch.indexer.build import Block

    return Block([{"id": i, "text": f"text of {i}", "metadata": {"group": int(i[1:]) % 5}} for i in ids],
                 raw_vectors(len(ids), seed))


def build(target: Path, n: int = 500, factory: str = "Flat", first: int = 0):
    from relsearch.indexer.build import build_published
    from relsearch.indexer.faiss_index import FaissSpec

    b = block([f"d{i}" for i in range(first, first + n)], seed=1)
    build_published(str(target), [b], n=n, d=D, encoder=encoder_identity(),
                    spec=FaissSpec(factory=factory, tune_queries=50))
    return b


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


QUERIES = unit(raw_vectors(12, seed=7))


def answers(target, k: int = 8, ids=("d1", "d2", "d3")) -> list[list[tuple[str, float]]]:
    """Top-k (id, score) for fixed query vectors plus --id queries of those of ``ids`` that are
    indexed: what "answers identically" compares. Opens the index afresh."""
    from relsearch.retrieval.search import Searcher

    s = Searcher(str(target))
    try:
        return searcher_answers(s, k, ids)
    finally:
        s.files.docstore.close()


def searcher_answers(s, k: int = 8, ids=("d1", "d2", "d3")) -> list[list[tuple[str, float]]]:
    """:func:`answers` from an open Searcher (one generation)."""
    from relsearch.retrieval.search import Query

    result = s.ann(QUERIES, k)
    docs = s.files.docstore.get(sorted({int(p) for p in result.positions.ravel() if p >= 0}))
    out = [[(docs[p]["id"], round(float(sc), 5)) for p, sc in zip(row, scores) if p >= 0]
           for row, scores in zip(result.positions, result.scores)]
    present = s.files.docstore.positions(list(ids))
    known = [d for d in ids if d in present]
    for hits in s.search([Query(doc_id=d) for d in known], k=k):
        out.append([(h.id, round(float(h.score), 5)) for h in hits])
    return out


def run_cli(*args, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([RELSEARCH, *map(str, args)], capture_output=True, text=True, env=full_env,
                          timeout=timeout)


def write_ids(path: Path, ids: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": i}) + "\n" for i in ids))
    return path
