"""Highlights (Elasticsearch's highlighting): which query terms a hit's text matched, for the BM25
part of a search, as character offsets.

A term is what the BM25 lists index (indexer/lexical.py): a lower-cased run of two or more word
characters that is not an English stop word. A hit's highlights are the ``[start, end)`` offsets
in its text of every such run whose lower-cased form is one of the query's terms.
"""
from __future__ import annotations

import re
from functools import lru_cache

WORD = re.compile(r"\w\w+")  # bm25s's token pattern, without its \b: the same maximal runs


@lru_cache(maxsize=1)
def _stopwords() -> frozenset[str]:
    from ..indexer.lexical import stopwords

    return frozenset(stopwords())


def terms(text: str) -> frozenset[str]:
    """The BM25 terms of a query text."""
    stop = _stopwords()
    return frozenset(t for t in (m.group().lower() for m in WORD.finditer(text)) if t not in stop)


def offsets(text: str, wanted: frozenset[str]) -> list[list[int]]:
    """``[start, end)`` of each run of ``text`` that is one of the ``wanted`` terms, in order."""
    return [[m.start(), m.end()] for m in WORD.finditer(text) if m.group().lower() in wanted]
