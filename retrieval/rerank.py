"""Re-rank ANN hits with a bundle's pair head (``relsearch query --rerank HEAD``; encoder/heads.py).

Plan (retrieval/request.py ``Plan.top``): the query plan's first k' = max(k, depth) hits per query
(depth 50 by default) → raw query vector h_q
(encoded text, or t̂·‖h‖ of an indexed document) → raw document vectors of the hits → head score
P(positive | query, document) → sort by it (ANN order breaks ties) → keep k. Each hit keeps its ANN
score beside the head's.

Raw document vectors are rebuilt exactly from the index's stored unit vectors times the docstore's
norm (h = t̂ · ‖h‖, the same as ``--id`` queries); a hit the local index cannot supply (e.g. an
Elasticsearch mirror that holds more than the local generation) is re-encoded from its text.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..encoder.heads import PairHead, lookup_head
from .search import Hit, QueryError

DEFAULT_DEPTH = 50  # ANN candidates fetched per query before re-ranking (at least k)


def _base(searcher):
    """The FAISS :class:`~.search.Searcher` behind ``searcher`` (an EsSearcher wraps one)."""
    return getattr(searcher, "searcher", searcher)


def head_of(searcher, name: str) -> PairHead:
    """The bundle's head ``name``; a :class:`QueryError` naming the available heads otherwise."""
    bundle = _base(searcher).bundle
    try:
        return lookup_head(bundle.heads, name, where=f"model {bundle.path or bundle.encoder.get('model')!r}")
    except KeyError as e:
        raise QueryError(e.args[0]) from None


def document_vectors(searcher, hits: list[Hit]) -> np.ndarray:
    """(n, d) raw vectors of ``hits``: stored t̂ · ‖h‖ from the index, else re-encoded from their text."""
    base = _base(searcher)
    dim = base.files.manifest.dim
    out = np.zeros((len(hits), dim), dtype=np.float32)
    if not hits:
        return out
    store = base.files.docstore
    positions = store.positions([h.id for h in hits])
    docs = store.get(list(positions.values())) if positions else {}
    missing = []
    for i, hit in enumerate(hits):
        pos = positions.get(hit.id)
        if pos is None or pos not in docs or pos >= base.files.positions:
            missing.append(i)
            continue
        if hit.field is not None:  # a fused hit of an index of several texts: the vector of the text that matched
            out[i] = base.for_field(hit.field).files.raw_rows(np.asarray([pos]))[0]
            continue
        out[i] = np.asarray(base.files.vectors[pos], dtype=np.float32) * np.float32(docs[pos]["norm"])
    if missing:
        out[missing] = base.encoder.encode([hits[i].text for i in missing]).vectors
    return out


def rerank_hits(head: PairHead, h_query: np.ndarray, hits: list[Hit], doc_vectors: np.ndarray, k: int) -> list[Hit]:
    """Sort ``hits`` of one query by the head's score (stable: ANN order breaks ties); keep ``k``."""
    if not hits:
        return []
    scores = head.score(np.asarray(h_query, np.float32)[None], doc_vectors)
    order = np.argsort(-scores, kind="stable")[:k]
    return [dataclasses.replace(hits[j], score=float(scores[j]), reranker=head.name, ann_score=float(hits[j].score),
                                ann_rank=int(j) + 1) for j in order]


def rerank(searcher, head: PairHead | str, h: np.ndarray, results: list[list[Hit]], k: int) -> list[list[Hit]]:
    """Re-rank each query's ANN ``results`` with ``head``; ``h`` (n_queries, d) raw query vectors."""
    if isinstance(head, str):
        head = head_of(searcher, head)
    if len(h) != len(results):
        raise ValueError(f"{len(h)} query vectors for {len(results)} result lists")
    flat = [hit for hits in results for hit in hits]
    vectors = document_vectors(searcher, flat)  # one docstore fetch for the whole batch
    out, start = [], 0
    for i, hits in enumerate(results):
        out.append(rerank_hits(head, h[i], hits, vectors[start:start + len(hits)], k))
        start += len(hits)
    return out
