"""Highlights (Elasticsearch's highlighting): which query terms a hit's text matched, for the BM25
part of a search, as character offsets.

A term is what the BM25 lists index (indexer/lexical.py): a lower-cased run of two or more word
characters that is not an English stop word. A hit's highlights are the ``[start, end)`` offsets
in its text of such runs whose lower-cased form is one of the query's terms: the first
:data:`MAX_HIGHLIGHTS`, within the first :data:`MAX_ANALYZED` characters (Elasticsearch's
``max_analyzed_offset`` is the same million), so a hit's highlighting costs at most one bounded scan
however long its text: three 390,000-word documents cost a query 1 s of highlighting before.
"""
from __future__ import annotations

import re
from functools import lru_cache
from itertools import islice

WORD = re.compile(r"\w\w+")  # bm25s's token pattern, without its \b: the same maximal runs
MAX_HIGHLIGHTS = 100  # offsets per hit
MAX_ANALYZED = 1_000_000  # characters of a hit's text scanned


@lru_cache(maxsize=1)
def _stopwords() -> frozenset[str]:
    from ..indexer.lexical import stopwords

    return frozenset(stopwords())


def terms(text: str) -> frozenset[str]:
    """The BM25 terms of a query text."""
    stop = _stopwords()
    return frozenset(t for t in (m.group().lower() for m in WORD.finditer(text)) if t not in stop)


def offsets(text: str, wanted: frozenset[str]) -> list[list[int]]:
    """``[start, end)`` of each run of ``text`` that is one of the ``wanted`` terms, in order: the
    first :data:`MAX_HIGHLIGHTS` within its first :data:`MAX_ANALYZED` characters."""
    found = ([m.start(), m.end()] for m in WORD.finditer(text, 0, MAX_ANALYZED) if m.group().lower() in wanted)
    return list(islice(found, MAX_HIGHLIGHTS))
