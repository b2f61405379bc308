"""A recipe run over an index (retrieval/recipe.py says what a recipe is): each query's
candidates gathered from a backend (:func:`gather`), then ranked (:func:`rank`) — the pool fused
with its bonuses, then the dense list past the pool — so the ranking never moves with k or paging.

Two steps so that the texts of a document with several (indexer/text_fields.py) share one scale:
:func:`search_fields` gathers every text field's candidates first and normalises each list by the
bounds of all the fields' pools together (:class:`Scale`). Normalised field by field, the best
hit of every text scored exactly 1 and a multi-text answer was full of ties whose order moved
with k; on one scale, one document holds the query's best score, as a one-text index has.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..indexer.ann import SearchResult
from . import parts
from .backend import Backend
from .recipe import Recipe, _bounds, past_pool, title_vectors
from .search import Query


@dataclass(frozen=True)
class Gathered:
    """A batch's candidates under a recipe, before ranking: the raw and the recipe's query vectors
    (n, d), each query's own position (-1: a text query), the title vectors (when weighed), the
    query texts (when BM25 reads them) and the dense and BM25 lists without the query and example
    documents."""

    h: np.ndarray
    qv: np.ndarray
    own: np.ndarray
    titles: np.ndarray | None
    texts: list[str] | None
    dense: SearchResult
    lexical: SearchResult | None


@dataclass(frozen=True)
class Scale:
    """Per query, the (lo, span) each list's scores are min-max normalised with: ``dense`` and
    ``lexical`` (n, 2). :meth:`of` takes them from one field's pools, :meth:`shared` from several."""

    dense: np.ndarray
    lexical: np.ndarray

    @classmethod
    def of(cls, dense: SearchResult, lexical: SearchResult | None, depth: int) -> Scale:
        """The bounds of each query's pool: the top ``depth`` of its dense and BM25 lists."""
        bounds = _list_bounds(dense, depth)
        return cls(bounds, _list_bounds(lexical, depth) if lexical is not None else np.zeros_like(bounds))

    @classmethod
    def shared(cls, scales: Sequence[Scale]) -> Scale:
        """One scale over several fields' pools: the lowest lo and the highest lo + span of each query."""
        def merge(bounds: list[np.ndarray]) -> np.ndarray:
            lo = np.min([b[:, 0] for b in bounds], axis=0)
            hi = np.max([np.where(np.isfinite(b[:, 0]), b[:, 0] + b[:, 1], -np.inf) for b in bounds], axis=0)
            with np.errstate(invalid="ignore"):  # inf - inf where no field has a candidate: masked
                return np.stack([np.where(np.isfinite(lo), lo, 0.0), np.where(np.isfinite(lo), hi - lo, 0.0)], axis=1)

        return cls(merge([s.dense for s in scales]), merge([s.lexical for s in scales]))


def _list_bounds(result: SearchResult, depth: int) -> np.ndarray:
    """(n, 2): each row's lo and span over its first ``depth`` valid scores (lo inf where none)."""
    top = result.scores[:, :depth].astype(np.float64)
    valid = result.positions[:, :depth] >= 0
    lo = np.where(valid, top, np.inf).min(axis=1)
    hi = np.where(valid, top, -np.inf).max(axis=1)
    return np.stack([lo, np.where(np.isfinite(lo), hi - lo, 0.0)], axis=1)


def search(backend: Backend, queries: list[Query], recipe: Recipe, *, k: int, filters=None, explain: bool = False):
    """Top-k hits per query under ``recipe`` (retrieval/plan.py resolved it): :func:`gather`, then
    :func:`rank` on the pools' own scale."""
    k = min(k, backend.local.live_count)
    gathered = gather(backend, queries, recipe, k=k, filters=filters)
    scale = Scale.of(gathered.dense, gathered.lexical, recipe.depth)
    return rank(backend.local, queries, recipe, gathered, scale, k=k, explain=explain)


def search_fields(backends: Sequence[Backend], queries: list[Query], recipe: Recipe, *, k: int, filters=None,
                  explain: bool = False) -> list:
    """Per text field (``backends``: each field's searcher, indexer/field_view.py), each query's
    top k under ``recipe``, every field's lists normalised on one :meth:`Scale.shared` scale."""
    if len(backends) == 1:
        return [search(backends[0], queries, recipe, k=k, filters=filters, explain=explain)]
    k = min(k, backends[0].local.live_count)
    gathered = [gather(b, queries, recipe, k=k, filters=filters) for b in backends]
    scale = Scale.shared([Scale.of(g.dense, g.lexical, recipe.depth) for g in gathered])
    return [rank(b.local, queries, recipe, g, scale, k=k, explain=explain) for b, g in zip(backends, gathered)]


def gather(backend: Backend, queries: list[Query], recipe: Recipe, *, k: int, filters=None) -> Gathered:
    """One dense search of the recipe's mixture vector (plus its title's), BM25 when the recipe
    uses it, both from ``backend`` (retrieval/backend.py) under ``filters``; the query document and
    any example document leave both lists before they are cut to ``recipe.depth`` (the dense one to
    max(depth, k)), as :func:`~.recipe.score_matrix` cuts them."""
    searcher = backend.local
    mixed = [replace(q, relations=dict(recipe.mixture)) for q in queries]
    h, qv, own = searcher.query_vectors(mixed, filters, checked=True)  # as request.plan checked them
    titles = None
    if recipe.title:
        from ..encoder.model import encode_texts

        titles = title_vectors(lambda texts: encode_texts(searcher.encoder, texts)[0], searcher.query_texts(queries), h)
        qv = qv + recipe.title * titles
    depth = recipe.depth
    texts = searcher.query_texts(queries) if recipe.bm25 else None
    excluded = [{int(p)} - {-1} | examples for p, examples in zip(own, searcher.example_positions(queries))]
    more = max(map(len, excluded))  # one extra candidate per excluded document
    dense, lexical = backend.candidates(qv, texts if recipe.bm25 else None, max(depth, k) + more, depth + more,
                                        filters, own=own)
    return Gathered(h, qv, own, titles, texts, _without(dense, excluded, max(depth, k)),
                    None if lexical is None else _without(lexical, excluded, depth))


def rank(searcher, queries: list[Query], recipe: Recipe, gathered: Gathered, scale: Scale, *, k: int,
         explain: bool = False):
    """Each query's top k of ``gathered`` as hits: the pool (each list's top ``recipe.depth``)
    normalised on ``scale`` and fused with the additive parts (retrieval/parts.py), then the dense
    list past the pool (:func:`~.recipe.past_pool`). ``explain`` adds each part (``recipe:dense``,
    ``recipe:bm25``, ``recipe:same:FIELD``, ``recipe:prior:RELATION``, ``recipe:neighbours``,
    ``recipe:prominence``, ``recipe:mentions``, ``recipe:past-pool``: they add up to the score)
    beside every operator's own score."""
    g = gathered
    # each non-zero part's scorer, what it reads of the batch built once, here
    scorers, read = parts.scorers(recipe, parts.Batch(searcher, queries, g.own, g.texts))
    rows_p, rows_s, explained = [], [], []
    pooled = [_pooled(recipe, g.dense, g.lexical, i, scale) for i in range(len(queries))]
    for rows, docs in _pool_documents(searcher, [pool for pool, _ in pooled], read=read):
        for i in rows:
            ranked, row_parts = _rank_row(recipe, g.dense, i, *pooled[i], docs, scorers, k, explain)
            rows_p.append([p for p, _ in ranked] + [-1] * (k - len(ranked)))
            rows_s.append([s for _, s in ranked] + [-np.inf] * (k - len(ranked)))
            explained.append(row_parts)
    result = SearchResult(np.asarray(rows_p, np.int64).reshape(len(queries), k),
                          np.asarray(rows_s, np.float32).reshape(len(queries), k))
    # explained without mixture:NAME parts: a recipe's parts are its own (below)
    hits = searcher.hits(result, [replace(q, relations={}) for q in queries], k, g.h if explain else None, own=g.own)
    if not explain:
        return hits
    out = []
    for i, row in enumerate(hits):
        order = [p for p in rows_p[i] if p >= 0]
        vectors = np.asarray(searcher.files.vectors[order]) if order else None
        # the title's own cosine beside every operator's (its weighted share is inside recipe:dense)
        title = {} if g.titles is None or not order else dict(zip(order, vectors @ g.titles[i]))
        # the raw dense score ⟨q, t̂⟩ each hit's recipe:dense part normalises (what `relsearch score` shows)
        dense_score = dict(zip(order, vectors @ g.qv[i])) if order else {}
        out.append([replace(hit, explain={**explained[i][p], "dense": float(dense_score[p]),
                                          **({"title": float(title[p])} if title else {}),
                                          **(hit.explain or {})}) for hit, p in zip(row, order)])
    return out


def _pooled(recipe: Recipe, dense: SearchResult, lexical: SearchResult | None, i: int,
            scale: Scale) -> tuple[set[int], dict[str, dict[int, float]]]:
    """Query ``i``'s pool — the top ``recipe.depth`` of its dense list and its BM25 list — and each
    list's part: position → its share of the score min-max normalised on ``scale``."""
    row_p, row_s = dense.positions[i], dense.scores[i]
    valid = row_p >= 0
    pooled_p, pooled_s = row_p[valid][:recipe.depth], row_s[valid][:recipe.depth].astype(np.float64)
    contributions = {"recipe:dense": _normalised(pooled_p, pooled_s, 1.0 - recipe.bm25, *scale.dense[i])}
    if lexical is not None:
        lex_valid = lexical.positions[i] >= 0
        contributions["recipe:bm25"] = _normalised(lexical.positions[i][lex_valid],
                                                   lexical.scores[i][lex_valid].astype(np.float64), recipe.bm25,
                                                   *scale.lexical[i])
    return set().union(*contributions.values()), contributions


POOL_DOCUMENTS = 4096  # documents of several queries' pools read (and their metadata decoded) at once


def _pool_documents(searcher, pools: list[set[int]], *, read: bool) -> Iterator[tuple[list[int], dict[int, dict]]]:
    """(queries, their pools' documents) in query order: one docstore read for the pools of as
    many queries as share at most :data:`POOL_DOCUMENTS` documents, not one per query — a batch of
    peers within one sector pools the same few hundred companies, and each read decoded every
    pooled document's metadata (their long texts, for an index of several: 38% of a fused lookup
    with one read per query, per text field). No read unless ``read`` (a part reads documents)."""
    if not read:
        yield list(range(len(pools))), {}
        return
    rows: list[int] = []
    held: set[int] = set()
    for i, pool in enumerate(pools):
        grown = held | pool
        if rows and len(grown) > POOL_DOCUMENTS:
            yield rows, searcher.files.docstore.get(sorted(held))
            rows, grown = [], set(pool)
        rows.append(i)
        held = grown
    if rows:
        yield rows, searcher.files.docstore.get(sorted(held))


def _rank_row(recipe: Recipe, dense: SearchResult, i: int, pool: set[int], contributions: dict[str, dict[int, float]],
              docs: dict[int, dict], scorers: list, k: int, explain: bool = True
              ) -> tuple[list[tuple[int, float]], dict[int, dict]]:
    """Query ``i``'s top k as (position, score) and, with ``explain``, each hit's parts: the pool
    (:func:`_pooled`) by fused score (ties to the smaller position), then the dense list past the
    pool in its order. ``docs``: position → document, for every pooled one when a part reads them;
    ``scorers``: (label, scorer) of each additive part (:func:`~.parts.scorers`)."""
    contributions = dict(contributions)
    for label, score in scorers:
        contributions[label] = score(i, pool, docs)
    # each position's parts added in the parts' order, as sum() adds them (a part without it adds 0.0)
    total = dict.fromkeys(pool, 0)
    for part in contributions.values():
        for p, value in part.items():
            total[p] += value
    ranked = sorted(total.items(), key=lambda item: (-item[1], item[0]))[:k]
    explained = {p: {name: part.get(p, 0.0) for name, part in contributions.items()} for p, _ in ranked} if explain else {}
    row_p, row_s = dense.positions[i], dense.scores[i].astype(np.float64)
    valid = row_p >= 0
    row_p, row_s = row_p[valid], row_s[valid]
    pooled_s = row_s[:recipe.depth]
    if len(ranked) < k and len(row_p) > len(pooled_s):  # past the pool: the dense order goes on
        lo, span = _bounds(pooled_s[None], np.ones((1, len(pooled_s)), bool))
        rest = [j for j in range(len(pooled_s), len(row_p)) if int(row_p[j]) not in pool][:k - len(ranked)]
        scores = past_pool(recipe, row_s[rest], lo[0, 0], span[0, 0])
        for j, score in zip(rest, scores):
            p = int(row_p[j])
            ranked.append((p, float(score)))
            explained[p] = {"recipe:dense": float(score) + 1.0, "recipe:past-pool": -1.0}
    return ranked, explained


def _normalised(positions: np.ndarray, scores: np.ndarray, weight: float, lo: float, span: float) -> dict[int, float]:
    """position → ``weight`` · its score min-max normalised by ``lo`` and ``span`` (1 where span is 0)."""
    if not len(scores):
        return {}
    normalised = (scores - lo) / span if span > 0 else np.ones_like(scores)
    return dict(zip(np.asarray(positions, np.int64).tolist(), (weight * normalised).tolist()))  # float64 products


def _without(result: SearchResult, excluded: list[set[int]], depth: int) -> SearchResult:
    """Each row without its ``excluded`` positions (and -1 pads), cut to ``depth``; -1 pads again."""
    positions = np.full((len(excluded), depth), -1, np.int64)
    scores = np.full((len(excluded), depth), -np.inf, np.float32)
    for i, (row, row_scores) in enumerate(zip(result.positions, result.scores)):
        keep = row >= 0
        for p in excluded[i]:  # the query document, and a query by examples' few documents
            keep &= row != p
        kept_p, kept_s = row[keep][:depth], row_scores[keep][:depth]
        positions[i, :len(kept_p)], scores[i, :len(kept_s)] = kept_p, kept_s
    return SearchResult(positions, scores)
