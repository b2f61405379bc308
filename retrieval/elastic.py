"""kNN, filtered and hybrid (BM25 + kNN, reciprocal rank fusion) search over an Elasticsearch index
written by ``relsearch.indexer.elastic``.

Scores. Pure kNN hits carry the cosine ⟨q, t̂⟩, the same number the FAISS inner-product backend
returns: Elasticsearch scores ``dot_product`` (and ``cosine``) as (1 + dot) / 2, which is converted
back with 2·score − 1. With a quantised ``index_type`` (int8/int4/bbq) that score comes from the
quantised vectors, so it is close to, not equal to, the exact cosine; re-score exactly downstream
where it matters. Hybrid hits carry the RRF score Σ 1 / (rank_constant + rank), which is not a
cosine and only orders the hits of one query.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from relsearch.indexer.elastic import ID_FIELD, METADATA_FIELD, NORM_FIELD, TEXT_FIELD, VECTOR_FIELD
from relsearch.indexer.filters import ALL, ANY
from relsearch.indexer.filters import clauses as typed_clauses

FUSIONS = ("server", "client")
MAX_NUM_CANDIDATES = 10_000  # Elasticsearch's limit on num_candidates
SEARCH_RETRY_STATUS = (429, 502, 503, 504)  # searches are idempotent: retry rejections too


@dataclass(frozen=True, kw_only=True)
class Hit:
    """One search hit. ``score``: cosine for kNN, RRF score for hybrid search (module docstring)."""

    id: str
    score: float
    text: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    norm: float | None = None


def filter_clauses(filters: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """``{field: condition}`` → ES filter clauses on ``metadata.<field>``, all of which must match.

    A scalar value is an exact ``term`` match (Elasticsearch coerces "2020" to a numeric field's
    type); a list/tuple/set is a ``terms`` match on any of its values; an object of operators
    (indexer/filters.py) maps to ``term`` (eq, has; ieq with ``case_insensitive``), ``range``,
    ``terms`` (in), ``exists`` (``exists`` and ``null``: Elasticsearch's own ``exists`` skips null,
    so there ``exists`` also skips it), ``bool.must_not`` for ``not``, ``bool.should`` for ``$any``.
    Elasticsearch cannot tell an
    array from a scalar, so ``has`` there also matches a field equal to the value.
    """
    clauses: list[dict[str, Any]] = []
    for name, value in sorted((filters or {}).items()):
        if name in (ANY, ALL):  # typed_clauses checks the shape and the bounds
            typed_clauses({name: value})
            subs = [{"bool": {"filter": filter_clauses(f)}} for f in value]
            clauses += ([{"bool": {"should": subs, "minimum_should_match": 1}}] if name == ANY
                        else [c for sub in subs for c in sub["bool"]["filter"]])
            continue
        if not isinstance(name, str) or not name or "." in name:
            raise ValueError(f"filter field {name!r} must be a metadata field name (non-empty, no '.')")
        path = f"{METADATA_FIELD}.{name}"
        if isinstance(value, (list, tuple, set, frozenset)):
            values = sorted(value, key=str) if isinstance(value, (set, frozenset)) else list(value)
            if not values or any(v is None for v in values):
                raise ValueError(f"filter {name!r}: give at least one value and no None")
            clauses.append({"terms": {path: values}})
        elif value is None:
            raise ValueError(f"filter {name!r} has no value; filters match exact values")
        elif isinstance(value, Mapping):
            for c in typed_clauses({name: value}):
                es = _es_clause(path, c)
                clauses.append({"bool": {"must_not": [es]}} if c.negate else es)
        else:
            clauses.append({"term": {path: value.item() if isinstance(value, np.generic) else value}})
    return clauses


def _es_clause(path: str, c) -> dict[str, Any]:
    if c.op == "exists":
        return {"exists": {"field": path}}
    if c.op == "notnull":  # Elasticsearch's exists: a value other than null (there, [] is no value either)
        return {"exists": {"field": path}}
    if c.op == "in":
        return {"terms": {path: list(c.value)}}
    if c.op == "ieq":
        return {"term": {path: {"value": c.value, "case_insensitive": True}}}
    if c.op in ("gt", "gte", "lt", "lte"):
        return {"range": {path: {c.op: c.value}}}
    return {"term": {path: c.value}}  # eq, has


def rrf_fuse(rankings: Sequence[Sequence[str]], *, rank_constant: int = 60,
             rank_window_size: int | None = None, top_k: int | None = None) -> list[tuple[str, float]]:
    """Reciprocal rank fusion of ranked id lists (best first), as Elasticsearch's ``rrf`` retriever.

    score(d) = Σ_lists 1 / (rank_constant + rank(d)), rank from 1, over the first
    ``rank_window_size`` ids of each list (all if None); a repeated id in one list counts once, at
    its best rank. Returns ``[(id, score)]``, best first, at most ``top_k``. Ties are broken by the
    best single rank, then by first appearance (list order, then position), so output is
    deterministic.
    """
    if rank_constant < 1:
        raise ValueError(f"rank_constant must be >= 1, got {rank_constant}")
    if rank_window_size is not None and rank_window_size < 1:
        raise ValueError(f"rank_window_size must be >= 1, got {rank_window_size}")
    scores: dict[str, float] = {}
    best: dict[str, int] = {}
    order: dict[str, int] = {}
    for ranking in rankings:
        seen: set[str] = set()
        window = ranking if rank_window_size is None else ranking[:rank_window_size]
        for rank, doc_id in enumerate(window, start=1):
            if doc_id in seen:
                continue
            seen.add(doc_id)
            scores[doc_id] = scores.get(doc_id, 0.0) + 1.0 / (rank_constant + rank)
            best[doc_id] = min(best.get(doc_id, rank), rank)
            order.setdefault(doc_id, len(order))
    fused = sorted(scores.items(), key=lambda kv: (-kv[1], best[kv[0]], order[kv[0]]))
    return fused if top_k is None else fused[:top_k]


def _unit_rows(query_vectors: np.ndarray) -> np.ndarray:
    q = np.asarray(query_vectors, dtype=np.float64)
    if q.ndim == 1:
        q = q[None, :]
    if q.ndim != 2 or q.shape[1] == 0:
        raise ValueError(f"query_vectors must be (n, d), got shape {np.shape(query_vectors)}")
    if not np.all(np.isfinite(q)):
        raise ValueError("query_vectors has NaN or infinite values")
    norms = np.linalg.norm(q, axis=1, keepdims=True)
    zero = np.flatnonzero(norms[:, 0] == 0)
    if zero.size:
        raise ValueError(f"query vector rows {zero.tolist()} are all zeros and cannot be normalised")
    return (q / norms).astype(np.float32)


def _hit(raw: Mapping[str, Any], score: float) -> Hit:
    source = raw.get("_source") or {}
    norm = source.get(NORM_FIELD)
    return Hit(id=str(source.get(ID_FIELD, raw["_id"])), score=float(score), text=source.get(TEXT_FIELD, ""),
               metadata=dict(source.get(METADATA_FIELD) or {}), norm=None if norm is None else float(norm))


def knn_search(client, name: str, query_vectors: np.ndarray, *, k: int = 10, num_candidates: int | None = None,
               filters: Mapping[str, Any] | None = None, hybrid_text: str | Sequence[str] | None = None,
               fusion: str = "server", rank_constant: int = 60, rank_window_size: int | None = None,
               rescore_oversample: float | None = None) -> list[list[Hit]]:
    """Top-``k`` hits per query row from index (or alias) ``name``.

    query_vectors: (n, d) or (d,) float — the relational query vectors q (design.md §3); each row
    is normalised here because ``dot_product`` needs unit vectors. ``num_candidates`` (per shard,
    default max(100, 2k) up to 10000) trades recall for speed. ``filters``: see
    :func:`filter_clauses`; applied inside the kNN clause, so each query still gets up to k hits.
    ``rescore_oversample``: ES >= 8.18 ``rescore_vector`` for quantised indexes.

    ``hybrid_text`` (one string per row; a str for one row): BM25 ``match`` on ``text`` fused with
    the kNN hits by RRF over the top ``rank_window_size`` (default ``num_candidates``) of each.
    ``fusion="server"`` uses the ``rrf`` retriever (Elasticsearch 8.16+ / 9.x, and a licence that
    includes RRF); ``fusion="client"`` runs the two searches and fuses them with :func:`rrf_fuse`.

    Returns one list of :class:`Hit` per row, best first.
    """
    candidates = _candidates(k, num_candidates, fusion, rescore_oversample)
    q = _unit_rows(query_vectors)
    texts: list[str] | None = None
    if hybrid_text is not None:
        texts = [hybrid_text] if isinstance(hybrid_text, str) else list(hybrid_text)
        if len(texts) != len(q):
            raise ValueError(f"hybrid_text has {len(texts)} texts for {len(q)} query vectors")
    window = candidates if rank_window_size is None else rank_window_size
    if not k <= window <= MAX_NUM_CANDIDATES:
        raise ValueError(f"rank_window_size must be in [k={k}, {MAX_NUM_CANDIDATES}], got {window}")
    clauses = filter_clauses(filters)
    es = client.options(retry_on_status=SEARCH_RETRY_STATUS)
    source = {"excludes": [VECTOR_FIELD]}
    knn = partial(_knn_clause, candidates=candidates, clauses=clauses, rescore_oversample=rescore_oversample)
    results: list[list[Hit]] = []
    for i, vec in enumerate(q):
        if texts is None:
            resp = es.search(index=name, knn=knn(vec, k), size=k, source=source)
            results.append([_hit(h, 2.0 * h["_score"] - 1.0) for h in resp["hits"]["hits"]])
        elif fusion == "server":
            results.append(_server_hybrid(es, name, knn(vec, window), texts[i], clauses, k=k, window=window,
                                          rank_constant=rank_constant, source=source))
        else:
            results.append(_client_hybrid(es, name, knn(vec, window), texts[i], clauses, k=k, window=window,
                                          rank_constant=rank_constant, source=source))
    return results


def _candidates(k, num_candidates: int | None, fusion: str, rescore_oversample: float | None) -> int:
    """The kNN candidates per shard (default max(100, 2k) up to the most Elasticsearch takes);
    an unknown fusion, a k that is no positive integer or an oversample below 1 is refused."""
    if fusion not in FUSIONS:
        raise ValueError(f"fusion {fusion!r} is unknown; choose one of {', '.join(FUSIONS)}")
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    candidates = min(max(100, 2 * k), MAX_NUM_CANDIDATES) if num_candidates is None else num_candidates
    if not k <= candidates <= MAX_NUM_CANDIDATES:
        raise ValueError(f"num_candidates must be in [k={k}, {MAX_NUM_CANDIDATES}], got {candidates}")
    if rescore_oversample is not None and rescore_oversample < 1:
        raise ValueError(f"rescore_oversample must be >= 1, got {rescore_oversample}")
    return candidates


def _knn_clause(vec: np.ndarray, kk: int, *, candidates: int, clauses: list[dict[str, Any]],
                rescore_oversample: float | None) -> dict[str, Any]:
    """The ``knn`` clause of one unit query vector: its top ``kk``, filtered inside the clause."""
    clause: dict[str, Any] = {"field": VECTOR_FIELD, "query_vector": vec.tolist(), "k": kk,
                              "num_candidates": max(candidates, kk)}
    if clauses:
        clause["filter"] = clauses
    if rescore_oversample is not None:
        clause["rescore_vector"] = {"oversample": rescore_oversample}
    return clause


def _server_hybrid(es, name: str, knn: dict[str, Any], text: str, clauses: list[dict[str, Any]], *, k: int,
                   window: int, rank_constant: int, source: dict[str, Any]) -> list[Hit]:
    """One hybrid query fused by Elasticsearch's ``rrf`` retriever: BM25 ``match`` and ``knn``."""
    standard: dict[str, Any] = {"query": {"match": {TEXT_FIELD: {"query": text}}}}
    if clauses:
        standard["filter"] = clauses
    retriever = {"rrf": {"retrievers": [{"standard": standard}, {"knn": knn}],
                         "rank_constant": rank_constant, "rank_window_size": window}}
    resp = _rrf_search(es, name, retriever, k, source)
    return [_hit(h, h["_score"]) for h in resp["hits"]["hits"]]


def _client_hybrid(es, name: str, knn: dict[str, Any], text: str, clauses: list[dict[str, Any]], *, k: int,
                   window: int, rank_constant: int, source: dict[str, Any]) -> list[Hit]:
    """One hybrid query as two searches (``knn``, then BM25 ``match``) fused here by :func:`rrf_fuse`."""
    vec_hits = es.search(index=name, knn=knn, size=window, source=source)["hits"]["hits"]
    bm25 = {"bool": {"must": [{"match": {TEXT_FIELD: {"query": text}}}], "filter": clauses}}
    txt_hits = es.search(index=name, query=bm25, size=window, source=source)["hits"]["hits"]
    by_id = {h["_id"]: h for h in txt_hits + vec_hits}
    fused = rrf_fuse([[h["_id"] for h in vec_hits], [h["_id"] for h in txt_hits]],
                     rank_constant=rank_constant, rank_window_size=window, top_k=k)
    return [_hit(by_id[doc_id], score) for doc_id, score in fused]


def bm25_search(client, name: str, texts: Sequence[str], *, k: int,
                filters: Mapping[str, Any] | None = None) -> list[list[Hit]]:
    """Top-``k`` hits per text by Elasticsearch's own BM25 (``match`` on ``text``) under
    ``filters``: the lexical list of a recipe on this backend (retrieval/backend.py)."""
    if not 1 <= k <= MAX_NUM_CANDIDATES:
        raise ValueError(f"k must be in [1, {MAX_NUM_CANDIDATES}], got {k!r}")
    es = client.options(retry_on_status=SEARCH_RETRY_STATUS)
    clauses = filter_clauses(filters)
    out = []
    for text in texts:
        query = {"bool": {"must": [{"match": {TEXT_FIELD: {"query": text}}}], "filter": clauses}}
        hits = es.search(index=name, query=query, size=k, source={"excludes": [VECTOR_FIELD]})["hits"]["hits"]
        out.append([_hit(h, h["_score"]) for h in hits])
    return out


def _rrf_search(es, name: str, retriever: dict[str, Any], k: int, source: dict[str, Any]):
    from elasticsearch import ApiError

    try:
        return es.search(index=name, retriever=retriever, size=k, source=source)
    except ApiError as e:
        if e.status_code in (400, 403):
            raise RuntimeError(f"Elasticsearch refused the rrf retriever on {name!r} ({e.status_code} {e.error}: "
                               f"{e.message}); it needs Elasticsearch 8.16+ and a licence with RRF — "
                               "pass fusion='client' to fuse on the client instead") from e
        raise
