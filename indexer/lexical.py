"""BM25 per segment: the lexical half of local hybrid search (retrieval/hybrid.py).

Each segment has ``{prefix}bm25.npz``, written with the segment: bm25s builds the BM25 index
(Lucene BM25, k1 = 1.5, b = 0.75; lower-cased ``\\w\\w+`` tokens, English stop words, no stemming:
the tokenisation of :class:`BM25`, the score matrices of benchmarks and recipe choice) and the file holds its per-term score
lists (CSC: for each term, the rows that contain it and their BM25 contribution), the vocabulary
and the global position of every row. A query's score for a row is the sum of its terms'
contributions, computed here over those lists, so deleted and filtered-out positions are masked
before the top k is taken.

Term statistics (IDF, average length) are per segment, as Elasticsearch's default
``query_then_fetch`` uses per-shard statistics: scores of documents in different segments are
comparable only approximately until ``compact`` makes one segment. Dense and lexical lists are
fused by rank (RRF) by default, which only needs each list's order.
"""
from __future__ import annotations

import functools
import itertools
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FILE = "bm25.npz"
K1, B = 1.5, 0.75


def bm25s_module():
    """bm25s, imported on first use; it sets its logger to DEBUG at import, which would print a
    line per build wherever logging has a handler (Beam installs one)."""
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


def stopwords() -> list[str]:
    """The English stop words :func:`tokenize` drops (bm25s's list; the Elasticsearch mirror's too)."""
    from bm25s.stopwords import STOPWORDS_EN

    return sorted(STOPWORDS_EN)


def tokenize(texts: list[str], *, ids: bool = False):
    """The index's tokens of each text (``ids``: as bm25s's ``Tokenized``, token ids and vocabulary)."""
    return bm25s_module().tokenize(list(texts), stopwords="en", show_progress=False, return_ids=ids)


@functools.cache
def _array_bm25() -> type:
    bm25s = bm25s_module()

    class ArrayBM25(bm25s.BM25):
        """bm25s's Lucene scores, computed over whole arrays instead of per document in Python
        (``build_index_from_ids`` is bm25s's documented override point): 2.5× faster over 20k
        short texts, where BM25 was the index job's largest cost past encoding, for the same
        float32 scores (tests/retrieval/test_hybrid.py checks them against bm25s's own)."""

        def build_index_from_ids(self, unique_token_ids, corpus_token_ids, show_progress=True, leave_progress=False):
            self.nonoccurrence_array = None  # Lucene's BM25 has no score for absent terms (BM25L and BM25+ do)
            n, n_terms = len(corpus_token_ids), len(unique_token_ids)
            lengths = np.fromiter(map(len, corpus_token_ids), np.int64, n)
            terms = np.fromiter(itertools.chain.from_iterable(corpus_token_ids), np.int64, int(lengths.sum()))
            # one entry per (term, document), sorted by term then document: the CSC order
            pairs, tf = np.unique(terms * n + np.repeat(np.arange(n, dtype=np.int64), lengths), return_counts=True)
            term, doc = np.divmod(pairs, n)
            df = np.bincount(term, minlength=n_terms)
            # the IDF with math.log, as bm25s computes it (numpy's vector log may differ in the last bit)
            values, of_term = np.unique(df, return_inverse=True)
            idf = np.array([math.log(1 + (n - d + 0.5) / (d + 0.5)) if d else 0.0 for d in values.tolist()],
                           np.float32)[of_term]
            tf = tf.astype(np.float64)
            tfc = tf / (self.k1 * ((1 - self.b) + self.b * lengths[doc] / lengths.mean()) + tf)
            indptr = np.zeros(n_terms + 1, np.int64)
            np.cumsum(df, out=indptr[1:])
            return {"data": (idf[term] * tfc).astype(np.float32), "indices": doc.astype(np.int32), "indptr": indptr,
                    "num_docs": n}

    return ArrayBM25


def build(texts: list[str]):
    """A bm25s ``BM25`` (Lucene, K1, B) indexed over ``texts``; its ``scores`` are None when no
    text has a term (texts of stop words and single letters only, which bm25s cannot index)."""
    retriever = _array_bm25()(k1=K1, b=B)
    tokenized = tokenize(texts, ids=True)
    if any(tokenized.ids):
        retriever.index(tokenized, show_progress=False)
    else:
        retriever.scores, retriever.vocab_dict = None, {}
    return retriever


class BM25:
    """BM25 over ``candidates`` (n_c texts); :meth:`scores` gives (n_q, n_c) float32: the lexical
    baseline of the benchmarks and of recipe choice (retrieval/recipe.py). The tokenisation and
    parameters of the index's lists; IDF statistics from the candidates, as an index of them has."""

    def __init__(self, candidates: list[str]):
        self.n = len(candidates)
        self._retriever = build(candidates)

    def tokens(self, texts: list[str]) -> list[list[str]]:
        return tokenize(texts)

    def scores(self, queries: list[str]) -> np.ndarray:
        """(n_q, n_c) BM25 scores of every candidate for each query text (0 where no term matches)."""
        out = np.zeros((len(queries), self.n), dtype=np.float32)
        if self._retriever.scores is None:
            return out
        for i, toks in enumerate(self.tokens(queries)):
            if toks:  # a query of stop words only matches nothing
                # each distinct term once, as LexicalSegment.scores counts it: the index's scores
                out[i] = self._retriever.get_scores(list(dict.fromkeys(toks)))
        return out


def write(path: Path, positions: np.ndarray, texts: list[str]) -> None:
    """BM25 over ``texts`` (rows at global ``positions``) into ``path`` (one .npz, no pickles)."""
    retriever = build(texts)
    scores, vocab = retriever.scores, retriever.vocab_dict
    if scores is None:  # no document with a term: an empty segment (every document of a merge deleted), or
        # texts of stop words and single letters only ("it", "x")
        scores = {"data": np.zeros(0, np.float32), "indices": np.zeros(0, np.int32), "indptr": np.zeros(1, np.int64)}
    with open(path, "wb") as f:
        np.savez(f, data=np.asarray(scores["data"], np.float32), indices=np.asarray(scores["indices"], np.int64),
                 indptr=np.asarray(scores["indptr"], np.int64), positions=np.asarray(positions, np.int64),
                 vocab=np.frombuffer(json.dumps(vocab, ensure_ascii=False).encode("utf-8"), np.uint8))


@dataclass
class LexicalSegment:
    """One segment's BM25 lists, loaded from its ``bm25.npz``."""

    data: np.ndarray
    indices: np.ndarray  # row (0… within the segment) of each contribution
    indptr: np.ndarray  # term id → its slice of data / indices
    positions: np.ndarray  # row → global position
    vocab: dict[str, int]

    @classmethod
    def load(cls, path: Path) -> LexicalSegment:
        with np.load(path, allow_pickle=False) as z:
            return cls(z["data"], z["indices"], z["indptr"], z["positions"],
                       json.loads(z["vocab"].tobytes().decode("utf-8")))

    def scores(self, tokens: list[str]) -> np.ndarray:
        """BM25 score of every row for one tokenised query (0 where no term matches): each distinct
        term's contributions added in float32, in the order the terms first occur in the query (a
        set's order follows Python's per-process hash seed, and float32 sums follow the order: the
        same query scored differently from run to run), by one unbuffered ``np.add.at`` over
        the terms' slices laid end to end: one call per term took a tenth of a lookup of peers over
        three texts, whose queries are whole descriptions of a hundred terms and more."""
        out = np.zeros(len(self.positions), np.float32)
        found = [t for t in map(self.vocab.get, dict.fromkeys(tokens)) if t is not None and t + 1 < len(self.indptr)]
        if found:
            terms = np.asarray(found, np.int64)
            lo, lengths = self.indptr[terms], self.indptr[terms + 1] - self.indptr[terms]
            ends = np.cumsum(lengths)
            take = np.arange(ends[-1], dtype=np.int64) + np.repeat(lo - (ends - lengths), lengths)
            np.add.at(out, self.indices[take], self.data[take])
        return out


def search(segments: list[LexicalSegment], texts: list[str], k: int, allowed=None) -> tuple[np.ndarray, np.ndarray]:
    """Top-k global positions and BM25 scores (n, k) for query ``texts`` over all segments;
    ``allowed(positions) -> bool mask`` drops deleted or filtered-out positions. Rows with fewer
    than k matching documents are padded with (-1, -inf): a document no query term matches is not
    a lexical hit."""
    out_p = np.full((len(texts), k), -1, np.int64)
    out_s = np.full((len(texts), k), -np.inf, np.float32)
    positions = np.concatenate([s.positions for s in segments] or [np.zeros(0, np.int64)])
    usable = allowed(positions) if allowed is not None else np.ones(len(positions), bool)
    for i, tokens in enumerate(tokenize(texts)):
        scores = np.concatenate([s.scores(tokens) for s in segments] or [np.zeros(0, np.float32)])
        hit = np.flatnonzero((scores > 0) & usable)
        top = hit[np.lexsort((positions[hit], -scores[hit]))[:k]]
        out_p[i, :len(top)], out_s[i, :len(top)] = positions[top], scores[top]
    return out_p, out_s
