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

from .hits import Hit


def fuse_max(per_field: Sequence[Sequence[Sequence[Hit]]], names: Sequence[str], fetch: int) -> list[list[Hit]]:
    """``per_field[f][i]``: query ``i``'s hits in text field ``names[f]``, best first → each
    query's first ``fetch`` documents by their best score over the fields, each hit carrying the
    field that gave it (``Hit.field``; ties: the field named first, then the better rank)."""
    out = []
    for rows in zip(*per_field):
        best: dict[str, Hit] = {}
        for name, hits in zip(names, rows):
            for hit in hits:
                held = best.get(hit.id)
                if held is None or hit.score > held.score:
                    best[hit.id] = dataclasses.replace(hit, field=name)
        out.append(sorted(best.values(), key=lambda h: -h.score)[:fetch])  # stable: first seen wins ties
    return out
