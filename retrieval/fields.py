"""A query over a document's several named texts, fused (indexer/text_fields.py).

The plan (retrieval/request.py) runs the query once per text field, each field searched as if it
were the index (indexer/field_view.py: its vectors, FAISS, BM25, its texts; documents lacking
it excluded), with the same scoring — dense, recipe or rrf — and the same filters; the lists are
then fused here by the **maximum** of a document's scores over the fields that found it.

Why the maximum: a document with one text competes with its one score, not with the two zeros of
the texts it lacks (a sum or a mean would bury the 93 Russell companies without a Yahoo text);
in the dense mode each field's score is a cosine, so the maximum keeps that scale. And it is
exact: a document in the fused top k is in the top k of the field that gave its score (every
document above it there also scores at least that much fused), so the union of the per-field top
``fetch`` lists holds the fused top ``fetch``, and pages do not move with k.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .hits import Hit, HitColumns


def fuse_max(per_field: Sequence[Sequence[Sequence[Hit]]], names: Sequence[str], fetch: int) -> list[list[Hit]]:
    """``per_field[f][i]``: query ``i``'s hits in text field ``names[f]``, best first → each
    query's first ``fetch`` documents by their best score over the fields, each hit carrying the
    field that gave it (``Hit.field``; a document's tie between fields: the field named first),
    ordered by score, then id.
    A field's hits given as columns (:class:`~.hits.HitColumns`) are compared by id and score
    alone, and only the kept ones are built: a lookup of peers over three texts built and decoded
    the metadata of three times the hits it kept."""
    out = []
    for i in range(len(per_field[0]) if per_field else 0):
        best: dict[str, tuple[float, int, int]] = {}  # id → its best score, that hit's field and rank
        for f, lists in enumerate(per_field):
            if isinstance(lists, HitColumns):
                n = int(lists.counts[i])
                ids, scores = lists.ids(i), lists.scores[i, :n].tolist()  # the scores its hits would carry
            else:
                ids, scores = [h.id for h in lists[i]], [h.score for h in lists[i]]
            for j, (doc, score) in enumerate(zip(ids, scores)):
                held = best.get(doc)
                if held is None or score > held[0]:
                    best[doc] = (score, f, j)
        # ties by id, never by which field listed a document first: that moved with fetch (a
        # document seen lower in an earlier field's longer list), so pages moved with k
        kept = [best[doc] for doc in sorted(best, key=lambda doc: (-best[doc][0], doc))[:fetch]]
        built: dict[tuple[int, int], Hit] = {}
        for f, lists in enumerate(per_field):
            ranks = [j for _, g, j in kept if g == f]
            if isinstance(lists, HitColumns):
                built.update(((f, j), hit) for j, hit in zip(ranks, lists.hits(i, ranks, field=names[f])))
            else:
                built.update(((f, j), dataclasses.replace(lists[i][j], field=names[f])) for j in ranks)
        out.append([built[f, j] for _, f, j in kept])
    return out
