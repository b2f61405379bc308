"""``relsearch query --backend es``: the same queries and output as the FAISS backend, answered by
an Elasticsearch mirror (indexer/es_mirror.py) through ``retrieval.elastic.knn_search``.

The local index still supplies the bundle, the encoder check and, for ``--id`` queries, the stored
raw vector; the relational query vector q is computed exactly as for FAISS and sent normalised
(``dot_product`` needs unit vectors). Elasticsearch returns cos(q, t̂); multiplying by ‖q‖ gives
back the FAISS backend's score ⟨q, t̂⟩ (they differ only for relation mixtures, where q is not a
unit vector), so on an exact ES index both backends return the same ids and scores. ``--hybrid``
(rrf) fuses BM25 on the query text (an ``--id`` query's own text) with kNN by RRF; its scores are
RRF scores, not cosines. Recipes (and ``--hybrid weighted``) run here as on the local index: the
query plan takes kNN and BM25 candidates from :meth:`EsSearcher.candidates` and the same fusion code
ranks them (retrieval/backend.py); only the BM25 scores are Elasticsearch's own.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..indexer import ann
from ..indexer.ann import SearchResult
from .elastic import MAX_NUM_CANDIDATES, bm25_search, knn_search
from .inputs import Filters
from .search import Hit, Query, QueryError, Searcher, drop_own


@dataclass(frozen=True, kw_only=True)
class EsQueryOptions:
    url: str
    index: str  # alias (or index) name
    credentials_file: str | None = None
    ca_certs: str | None = None
    num_candidates: int | None = None
    hybrid: bool = False
    fusion: str = "server"


class EsSearcher:
    """Answers :meth:`Searcher.search` from Elasticsearch; delegates validation to ``searcher``."""

    def __init__(self, searcher: Searcher, options: EsQueryOptions, *, client=None):
        from ..indexer.elastic import connect

        self.searcher, self.options = searcher, options
        self.text_fields  # noqa: B018 - an index of several text fields is refused here, before a client opens
        self.client = client if client is not None else connect(
            options.url, credentials_file=options.credentials_file, ca_certs=options.ca_certs)
        self.metadata_fields = searcher.metadata_fields

    def check(self, relations: dict[str, float], filters: Filters) -> None:
        self.searcher.check(relations, filters)

    @property
    def live_count(self) -> int:
        return self.searcher.live_count

    def matching(self, filters: Filters) -> np.ndarray:
        """The local index's matches: the mirror holds the same documents."""
        return self.searcher.matching(filters)

    def filter_warnings(self, filters: Filters | None) -> list[str]:
        return self.searcher.filter_warnings(filters)

    def no_match_warnings(self, filters: Filters | None) -> list[str]:
        """The local index's: the mirror holds the same documents (:meth:`Searcher.no_match_warnings`)."""
        return self.searcher.no_match_warnings(filters)

    @property
    def text_fields(self) -> tuple[str, ...]:
        """The one text field the mirror holds; a QueryError for an index of several (the mirror has
        one dense field, and ``relsearch index`` refuses ``--es-url`` with several)."""
        names = self.searcher.text_fields
        if len(names) > 1:
            raise QueryError("the Elasticsearch backend searches an index of one text field; this index has "
                             f"{', '.join(names)}: query it with the local backend")
        return names

    def projection_of(self, queries: list[Query]) -> str | None:
        return self.searcher.projection_of(queries)

    def unknown_ids(self, queries: list[Query]) -> set[str]:
        return self.searcher.unknown_ids(queries)

    @property
    def local(self) -> Searcher:
        """The local index: bundle, encoder, stored vectors and documents (retrieval/backend.py)."""
        return self.searcher

    @property
    def operators(self):
        return self.searcher.operators

    def candidates(self, qv: np.ndarray, texts: list[str] | None, n_dense: int, n_lexical: int,
                   filters: Filters | None, *, own: np.ndarray) -> tuple[SearchResult, SearchResult | None]:
        """retrieval/backend.py: Elasticsearch's kNN (scores back on the FAISS scale ⟨q, t̂⟩) and its
        own BM25, each hit mapped to the local index's position (a hit the local index lacks is
        dropped: the mirror is stale); the kNN list's near-ties settled as the local index settles them."""
        from ..indexer.elastic import display_url, reported

        n_dense = min(n_dense, MAX_NUM_CANDIDATES - ann.TIE_MARGIN)
        with reported(f"search {self.options.index} at {display_url(self.options.url)}"):
            dense = self._knn(qv, n_dense, filters)
            lexical = None if texts is None else bm25_search(self.client, self.options.index, texts,
                                                             k=min(n_lexical, MAX_NUM_CANDIDATES), filters=filters or None)
        return (self._settled(dense, qv, n_dense),
                None if lexical is None else self._positions(lexical, n_lexical, np.ones(len(texts))))

    def _knn(self, qv: np.ndarray, k: int, filters: Filters | None):
        """Elasticsearch's kNN top ``k`` + ``TIE_MARGIN`` per query: a tied group at the cut seen whole."""
        width = k + ann.TIE_MARGIN
        return knn_search(self.client, self.options.index, qv, k=width,
                          num_candidates=max(self.options.num_candidates or 0, width), filters=filters or None)

    def _settled(self, rows: list[list[Hit]], qv: np.ndarray, k: int) -> SearchResult:
        """kNN hits as local positions with scores on the FAISS scale ⟨q, t̂⟩ (Elasticsearch's cosine
        times ‖q‖), near-ties scored again from the stored vectors and ranked by position, cut to k
        (indexer/ann.py ``settle_ties``): identical documents (GOOG, GOOGL) rank as on the local index."""
        result = self._positions(rows, k + ann.TIE_MARGIN, np.linalg.norm(qv, axis=1))
        return ann.settle_ties(result, qv, self.searcher.files.vectors, k)

    def _positions(self, rows: list[list[Hit]], width: int, scale: np.ndarray) -> SearchResult:
        found = self.searcher.files.docstore.positions([h.id for row in rows for h in row])
        positions = np.full((len(rows), width), -1, np.int64)
        scores = np.full((len(rows), width), -np.inf, np.float32)
        for i, row in enumerate(rows):
            kept = [(found[h.id], h.score * scale[i]) for h in row if h.id in found][:width]
            positions[i, :len(kept)] = [p for p, _ in kept]
            scores[i, :len(kept)] = [s for _, s in kept]
        return SearchResult(positions, scores)

    def search(self, queries: list[Query], *, k: int = 10, filters: Filters | None = None,
               explain: bool = False, params: dict | None = None, hybrid: str | None = None,
               checked: bool = False) -> list[list[Hit]]:
        """As :meth:`Searcher.search`; k is clipped to the local index's live documents. Filter values
        go to Elasticsearch typed, where each metadata field has the one type its mapping gave it.
        kNN hits are mapped to the local index's positions (one the local index lacks is dropped: the
        mirror is stale), their near-ties settled as there, and read from its docstore.
        ``hybrid="rrf"``: Elasticsearch's BM25 fused by RRF (the server's retriever or here,
        ``EsQueryOptions.fusion``); recipes and weighted fusion run through :meth:`candidates`. ``checked``:
        the queries and filters were checked already (a plan's run, :meth:`Searcher.check_queries`)."""
        if explain:
            raise QueryError("explain needs the FAISS backend (it reads the stored vectors)")
        if params:
            raise QueryError(f"search parameters {', '.join(sorted(params))} apply to the FAISS backend; "
                             "for Elasticsearch set num_candidates")
        if not queries:
            return []
        if self.searcher.projection_of(queries):
            raise QueryError("projection operators search their own projected index: use the FAISS backend")
        vectors = self.searcher.query_vectors(queries, filters, checked=checked)
        qv = vectors.q
        # k + 1 below: the query document may come back
        k = min(k, self.searcher.live_count, MAX_NUM_CANDIDATES - 1 - ann.TIE_MARGIN)
        texts = self._texts(queries) if hybrid == "rrf" or self.options.hybrid else None
        from ..indexer.elastic import display_url, reported

        with reported(f"search {self.options.index} at {display_url(self.options.url)}"):
            if texts is None:
                dense = self._knn(qv, k + 1, filters)
            else:
                raw = knn_search(self.client, self.options.index, qv, k=k + 1,
                                 num_candidates=self.options.num_candidates, filters=filters or None,
                                 hybrid_text=texts, fusion=self.options.fusion)
        if texts is None:  # the hits as the local index reads them (its fields), in its order of ties
            return self.searcher.hits(self._settled(dense, qv, k + 1), queries, k, own=vectors.own)
        # RRF scores, not cosines: Elasticsearch's (or rrf_fuse's) order
        return [[Hit(h.id, np.float32(h.score), h.text, h.metadata) for h in kept]
                for kept in drop_own(raw, [q.doc_id for q in queries], k, key=lambda hit: hit.id)]

    def _texts(self, queries: list[Query]) -> list[str]:
        store = self.searcher.files.docstore
        positions = store.positions([q.doc_id for q in queries if q.doc_id is not None])
        docs = store.get(list(positions.values()))
        return [q.text if q.text is not None else docs[positions[q.doc_id]]["text"] for q in queries]


def open_searcher(index_dir: str, model: str | None = None, *, backend: str = "faiss",
                  search_params: dict | None = None, es: EsQueryOptions | None = None):
    """A :class:`Searcher` (``backend="faiss"``) or an :class:`EsSearcher` over it (``"es"``)."""
    if backend == "faiss":
        return Searcher(index_dir, model, search_params=search_params)
    if backend != "es":
        raise QueryError(f"unknown backend {backend!r}; choose faiss or es")
    if es is None:
        raise QueryError("the Elasticsearch backend needs its URL and index (EsQueryOptions)")
    if search_params:
        raise QueryError(f"search parameters {', '.join(sorted(search_params))} apply to the FAISS backend; "
                         "for Elasticsearch set num_candidates")
    return EsSearcher(Searcher(index_dir, model), es)
