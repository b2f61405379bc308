"""Shaping a ranked hit list: collapse on a metadata field, then a page ``offset…offset + k``, then a
minimum score. Shared by ``relsearch query`` and the API (relsearch/api.py), so both page alike.

Collapsing keeps the best-scoring hit of each value of the field (GOOG and GOOGL share a
``company`` value: one slot, not two). Values compare with their JSON type (``true`` is not ``1``,
``1`` is ``1.0``);
a hit without the field, or whose value is a blank string, is a group of its own (the Russell
corpus's companies with an empty name are not one company); null is a value like any other. Because collapsing removes hits, the search is
repeated with a deeper candidate list (×4 each round) until the page is full, the index is exhausted
or the candidates reach :func:`collapse_depth` (``COLLAPSE_FACTOR`` × the hits asked for, at most
``MAX_COLLAPSE_CANDIDATES``): a field with fewer values than the page has slots gives a short page
after a bounded search, not a scan of the whole index.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TypeVar

H = TypeVar("H")  # a Hit or a re-ranked hit: anything with .score and .metadata

WIDEN = 4  # each retry fetches this many times more candidates
COLLAPSE_FACTOR = 64  # collapse examines at most this many candidates per hit asked for (three widenings)...
MAX_COLLAPSE_CANDIDATES = 10_000  # ...and never more than this many per query (MAX_K, MAX_RERANK_DEPTH)


class SearchStopped(Exception):
    """Raised between widening rounds when the caller's ``stop()`` says the answer is no longer
    wanted (the server's timeout): the work ends there instead of running on unobserved."""


def collapse_depth(need: int) -> int:
    """The most candidates a collapsed search of ``need`` hits per query examines."""
    return max(need, min(need * COLLAPSE_FACTOR, MAX_COLLAPSE_CANDIDATES))


def collapse(hits: Sequence[H], field: str, taken: Sequence = ()) -> list[H]:
    """``hits`` (best first) keeping the first hit of each value of ``metadata[field]``, and none
    whose value is among ``taken`` (the query document's own: GOOG's peers list no GOOGL)."""
    seen, out = {_key(v) for v in taken if has_value(v)}, []
    for hit in hits:
        if field in hit.metadata and has_value(hit.metadata[field]):
            key = _key(hit.metadata[field])
            if key in seen:
                continue
            seen.add(key)
        out.append(hit)
    return out


def has_value(value) -> bool:
    """Whether a collapse value groups hits: anything but a blank string, which names nothing."""
    return not (isinstance(value, str) and not value.strip())


def _key(value) -> str:
    """A collapse value as compared: its JSON text (``true`` is not ``1``), 1.0 as the number 1."""
    if isinstance(value, float) and value.is_integer():  # 1.0 is the number 1, as filters match it
        value = int(value)
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def search_collapsed(run: Callable[[int], list[list[H]]], *, need: int, field: str | None,
                     limit: int, stop: Callable[[], bool] | None = None,
                     taken: Sequence[Sequence] | None = None) -> list[list[H]]:
    """``run(fetch)``: the top ``fetch`` hits per query. Returns each query's hits collapsed on
    ``field`` (uncollapsed if None), at least ``need`` of them whenever that many groups exist
    among the first ``min(limit, collapse_depth(need))`` candidates (``limit``: the live
    documents): the fetch widens ×4 until they do. ``stop()`` is asked before each widening
    round; when it says True, :class:`SearchStopped` is raised. ``taken``: per query, the values
    its results never show (:func:`collapse`)."""
    limit = min(limit, collapse_depth(need)) if field is not None else limit
    fetch = need
    while True:
        if stop is not None and stop():
            raise SearchStopped("stopped before a collapse round: the request is no longer waiting")
        results = run(fetch)
        if field is None:
            return results
        collapsed = [collapse(hits, field, taken[i] if taken else ()) for i, hits in enumerate(results)]
        short = any(len(c) < need and len(h) >= fetch for c, h in zip(collapsed, results))
        if not short or fetch >= limit:
            return collapsed
        fetch = min(fetch * WIDEN, limit)


def page(hits: Sequence[H], *, offset: int = 0, k: int, min_score: float | None = None) -> list[H]:
    """Hits ``offset…offset + k`` of ``hits``, less those scoring below ``min_score``."""
    out = list(hits[offset:offset + k])
    return out if min_score is None else [h for h in out if h.score >= min_score]
