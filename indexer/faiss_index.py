"""FAISS inner-product indexes over unit vectors, built from an index-factory string."""
from __future__ import annotations

import numpy as np

DEFAULT_FACTORY = "Flat"


def build_faiss(vectors: np.ndarray, factory: str = DEFAULT_FACTORY, *, seed: int = 0,
                train_sample: int = 200_000):
    """(n, d) float32 unit vectors → a trained, filled FAISS index with inner-product metric.

    ``factory`` is any FAISS index-factory string ("Flat", "HNSW32", "IVF1024,Flat", ...).
    Indexes that need training are trained on a seeded sample of at most ``train_sample`` rows.
    """
    import faiss

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n, d = vectors.shape
    try:
        index = faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        raise ValueError(f"invalid FAISS index-factory string {factory!r}: {e}") from e
    if not index.is_trained:
        rng = np.random.default_rng(seed)
        sample = vectors if n <= train_sample else vectors[rng.choice(n, train_sample, replace=False)]
        try:
            index.train(sample)
        except RuntimeError as e:
            raise ValueError(f"cannot train FAISS index {factory!r} on {len(sample)} vectors: {e}") from e
    index.add(vectors)
    return index
