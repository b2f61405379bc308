"""The seam between a query plan and the store that answers it (docs/how-a-query-runs.md).

A backend provides candidates; it does not rank them. The plan (retrieval/plan.py) decides the
query vectors, the lists and their depths; the fusion code (retrieval/recipe.py,
retrieval/hybrid.py) ranks whatever lists a backend returns, so both backends rank alike:

- :class:`~.search.Searcher`: the local FAISS index, the docstore's filter table and the BM25 lists;
- :class:`~.es_backend.EsSearcher`: Elasticsearch's kNN and its own BM25 ``match``, hits mapped
  back to the local index's positions (the mirror holds the same documents).

Query vectors, stored documents and metadata always come from the local index (``local``): an
``--id`` query's raw vector and text, each hit's fields.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from ..indexer.ann import SearchResult
from .inputs import Filters


@runtime_checkable
class Backend(Protocol):
    @property
    def local(self):
        """The local :class:`~.search.Searcher`: bundle, encoder, docstore, stored vectors."""

    def candidates(self, qv: np.ndarray, texts: list[str] | None, n_dense: int, n_lexical: int,
                   filters: Filters | None, *, own: np.ndarray) -> tuple[SearchResult, SearchResult | None]:
        """(dense, lexical): each query's top ``n_dense`` positions by ⟨q, t̂⟩ for ``qv`` (n, d),
        and, when ``texts`` is given, its top ``n_lexical`` by BM25 on ``texts[i]``; both only
        among live documents matching ``filters``, -1 padded. ``own``: each query's document
        position (-1 for text), which the caller drops from both lists."""
