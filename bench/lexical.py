"""BM25 lexical baseline (bm25s): dense score matrices over a fixed candidate list.

Tokenisation: lower-cased ``\\w\\w+`` tokens, English stop words removed, no stemming
(bm25s's defaults without PyStemmer). Parameters: Lucene BM25, k1 = 1.5, b = 0.75. The IDF
statistics come from the candidate list itself, so a score depends on which candidates are in
the run, exactly like a BM25 index over that corpus.
"""
from __future__ import annotations

import numpy as np

from ..indexer import lexical


class BM25:
    """BM25 over ``candidates`` (n_c texts); :meth:`scores` gives (n_q, n_c) float32. The same
    tokenisation and parameters as the index's BM25 lists (indexer/lexical.py)."""

    def __init__(self, candidates: list[str], *, k1: float = lexical.K1, b: float = lexical.B):
        self.n = len(candidates)
        self._retriever = lexical.bm25s_module().BM25(k1=k1, b=b)
        self._retriever.index(lexical.tokenize(candidates), show_progress=False)

    def tokens(self, texts: list[str]) -> list[list[str]]:
        return lexical.tokenize(texts)

    def scores(self, queries: list[str]) -> np.ndarray:
        """(n_q, n_c) BM25 scores of every candidate for each query text (0 where no term matches)."""
        out = np.zeros((len(queries), self.n), dtype=np.float32)
        for i, toks in enumerate(self.tokens(queries)):
            if toks:  # a query of stop words only matches nothing
                out[i] = self._retriever.get_scores(toks)
        return out
