"""BM25 lexical baseline (bm25s): dense score matrices over a fixed candidate list.

Tokenisation: lower-cased ``\\w\\w+`` tokens, English stop words removed, no stemming
(bm25s's defaults without PyStemmer). Parameters: Lucene BM25, k1 = 1.5, b = 0.75. The IDF
statistics come from the candidate list itself, so a score depends on which candidates are in
the run, exactly like a BM25 index over that corpus.
"""
from __future__ import annotations

import numpy as np


def _bm25s():
    try:
        import bm25s
    except ImportError as e:
        raise ImportError("the BM25 baseline needs bm25s: pip install 'relsearch[bench]' (or pip install bm25s)") from e
    return bm25s


class BM25:
    """BM25 over ``candidates`` (n_c texts); :meth:`scores` gives (n_q, n_c) float32."""

    def __init__(self, candidates: list[str], *, k1: float = 1.5, b: float = 0.75):
        bm25s = _bm25s()
        self.n = len(candidates)
        self._retriever = bm25s.BM25(k1=k1, b=b)
        self._retriever.index(bm25s.tokenize(list(candidates), stopwords="en", show_progress=False), show_progress=False)

    def tokens(self, texts: list[str]) -> list[list[str]]:
        return _bm25s().tokenize(list(texts), stopwords="en", show_progress=False, return_ids=False)

    def scores(self, queries: list[str]) -> np.ndarray:
        """(n_q, n_c) BM25 scores of every candidate for each query text (0 where no term matches)."""
        out = np.zeros((len(queries), self.n), dtype=np.float32)
        for i, toks in enumerate(self.tokens(queries)):
            if toks:  # a query of stop words only matches nothing
                out[i] = self._retriever.get_scores(toks)
        return out
