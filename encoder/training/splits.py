"""Triples of one relation as arrays of text ids: the data shape the triple trainers share.

:mod:`.rse` (adapter), :mod:`.rse_joint` and :mod:`.transition` all read triples JSONL, give every
distinct text an id (:func:`text_ids`), cut each split into one :class:`RelationSplit` per relation
(:func:`split_triples`) and filter link prediction with every known true tail
(:func:`true_tails`); :mod:`.linkpred` evaluates on these splits.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .data import Triple


@dataclass
class RelationSplit:
    """One relation's triples of one split (train, dev or test) as text-id arrays."""

    head: np.ndarray  # text ids
    tail: np.ndarray
    neg: np.ndarray  # text id or −1
    group: np.ndarray  # group id or −1
    files: list[str] = field(default_factory=list)
    dropped_self: int = 0  # triples with head == tail (trivial) dropped
    query_rows: np.ndarray | None = None  # evaluate only these triples (candidates: still all of the split)

    def __len__(self):
        return len(self.head)


def text_ids(loaded: dict[str, list[Triple]], relations=None, *, negatives: bool = True,
             extra=()) -> dict[str, int]:
    """Text → id, in first-seen order over the splits' heads, tails (and hard negatives), then ``extra``.

    ``relations``: only triples of these relations count (None: all of ``loaded``).
    """
    ids: dict[str, int] = {}
    for split in loaded.values():
        for t in split:
            if relations is None or t.relation in relations:
                for x in (t.head, t.tail, t.negative) if negatives else (t.head, t.tail):
                    if x is not None:
                        ids.setdefault(x, len(ids))
    for x in extra or ():
        ids.setdefault(x, len(ids))
    return ids


def split_triples(triples: list[Triple], ids: dict[str, int], groups: dict[str, int]) -> RelationSplit:
    """Triples (of one relation) → :class:`RelationSplit`; ``groups`` maps group names to ids and grows.

    Triples whose head is their tail are dropped (counted); a repeated (head, tail) counts once,
    keeping the first one's negative.
    """
    seen, rows, dropped = set(), [], 0
    for t in triples:
        if t.head == t.tail:
            dropped += 1
            continue
        key = (t.head, t.tail)
        if key in seen:
            continue
        seen.add(key)
        neg = ids[t.negative] if t.negative and t.negative not in (t.head, t.tail) else -1
        grp = groups.setdefault(t.group, len(groups)) if t.group is not None else -1
        rows.append((ids[t.head], ids[t.tail], neg, grp))
    a = np.array(rows, dtype=np.int64).reshape(-1, 4)
    files = sorted({t.where.rsplit(":", 1)[0] for t in triples})
    return RelationSplit(a[:, 0], a[:, 1], a[:, 2], a[:, 3], files, dropped)


def relation_splits(loaded: dict[str, list[Triple]], name: str, ids: dict[str, int]) -> dict[str, RelationSplit]:
    """``{"train", "dev", "test"}`` splits of relation ``name`` (group ids shared across the splits)."""
    groups: dict[str, int] = {}
    return {k: split_triples([t for t in v if t.relation == name], ids, groups) for k, v in loaded.items()}


def true_tails(*splits: RelationSplit) -> dict[int, set[int]]:
    """Head id → every tail id it has in ``splits`` (what filtered ranking removes)."""
    known: dict[int, set[int]] = {}
    for s in splits:
        for h, t in zip(s.head.tolist(), s.tail.tolist()):
            known.setdefault(h, set()).add(t)
    return known


def sample_queries(split: RelationSplit, n: int | None, rng: np.random.Generator) -> RelationSplit:
    """``split`` scoring only a seeded sample of ``n`` of its triples as queries (candidates stay all).

    Draws from ``rng`` only when there is something to sample (``n`` set and smaller than the split).
    """
    if not n or len(split) <= n:
        return split
    keep = np.sort(rng.choice(len(split), n, replace=False))
    return replace(split, query_rows=keep)


def subsample(split: RelationSplit, n: int | None, seed) -> RelationSplit:
    """A seeded subsample of ``n`` triples (all of them when ``n`` is None or not smaller)."""
    if n is None or len(split) <= n:
        return split
    keep = np.sort(np.random.default_rng(seed).choice(len(split), n, replace=False))
    return replace(split, head=split.head[keep], tail=split.tail[keep], neg=split.neg[keep],
                   group=split.group[keep], query_rows=None)
