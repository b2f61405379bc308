"""What a search returns: :class:`Hit`, one result, and :class:`HitColumns`, a batch of results
kept as columns — positions and scores as arrays, the documents' fields read in one docstore
statement per batch, or found in memory — whose rows of :class:`Hit` are built only when a
caller reads them.

Why columns: a batch of 1,000 queries × 10 hits used to build 10,000 row dicts and 10,000 ``Hit``
objects inside the search call, which cost more than the FAISS search itself on a 20k index
(docs/performance.md). Now the search call holds arrays and three lists of strings; a caller
that shows one page builds the ``Hit`` objects of that page alone.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import MISSING, dataclass, fields, replace

import numpy as np

from ..indexer.ann import SearchResult
from ..indexer.docstore import DocRows


@dataclass(frozen=True)
class Hit:
    """One search result, whatever produced it. Re-ranked by a head (retrieval/rerank.py): ``score``
    is the head's P(positive), ``reranker`` the head's name, ``ann_score`` and ``ann_rank`` what the
    ANN search gave it."""

    id: str
    score: float
    text: str
    metadata: dict
    # operator name → cos(op(h), t); first, a mixture's parts ("mixture:NAME" → weight × cos, summing
    # to the relational score) or a recipe's ("recipe:dense", ...; retrieval/recipe.py)
    explain: dict | None = None
    reranker: str | None = None
    ann_score: float | None = None
    ann_rank: int | None = None
    highlights: list[list[int]] | None = None  # [start, end) of each query term in text (retrieval/highlight.py)
    field: str | None = None  # the text field whose score this is, in a search over several (retrieval/fields.py)

    def shaped(self, fields: Sequence[str] | None = None, metadata: bool = True) -> Hit:
        """This hit with only the metadata the caller asked for (Elasticsearch's ``_source``
        filtering, Qdrant's ``with_payload``): every field (``fields`` None, ``metadata`` true),
        none (``metadata`` false: ``{}``), or the named ``fields`` in that order (a field this
        document lacks is left out). The one place hits are shaped: the CLI, the API, the server and
        ``relsearch lookup`` call it."""
        if metadata and fields is None:
            return self
        chosen = {f: self.metadata[f] for f in (fields or ()) if f in self.metadata} if metadata else {}
        if not _FAST:
            return replace(self, metadata=chosen)
        hit = _new(Hit)  # replace() without __init__, as _hit builds hits: a lookup shapes every hit it writes
        _set(hit, "__dict__", {**self.__dict__, "metadata": chosen})
        return hit

    def to_json(self, rank: int | None = None) -> dict:
        """``{"rank"?, "id", "score", "text", "metadata": {...}, "explain"?, "ann_score"?, "ann_rank"?,
        "reranker"?, "highlights"?, "field"?}``: the document's own fields stay nested under "metadata", so none of them (an
        "id", a "score") can pose as the hit's."""
        out = {} if rank is None else {"rank": rank}
        out.update({"id": self.id, "score": round(float(self.score), 6), "text": self.text, "metadata": self.metadata})
        if self.explain is not None:
            out["explain"] = {k: round(float(v), 6) for k, v in self.explain.items()}
        if self.reranker is not None:
            out.update(ann_score=round(float(self.ann_score), 6), ann_rank=self.ann_rank, reranker=self.reranker)
        if self.highlights is not None:
            out["highlights"] = self.highlights
        if self.field is not None:
            out["field"] = self.field
        return out


_new, _set = object.__new__, object.__setattr__
_GIVEN = ("id", "score", "text", "metadata", "explain")  # what a search's row gives each hit
_DEFAULTS = {f.name: f.default for f in fields(Hit) if f.name not in _GIVEN}  # the others, at their defaults
_FAST = (tuple(f.name for f in fields(Hit))[:len(_GIVEN)] == _GIVEN
         and all(f.default is not MISSING for f in fields(Hit) if f.name not in _GIVEN))


def _hit(doc: tuple[str, str, str], score: float, metadata: dict, explain: dict | None,
         field: str | None = None) -> Hit:
    """``Hit(doc[0], score, doc[1], metadata, explain)``, every other field at its default: the same
    object (equal, hashed, printed, pickled and ``replace``-d alike; tests/indexer/
    test_docstore_memory.py), made with one dict instead of the frozen dataclass's ``__init__``,
    which sets each field through ``object.__setattr__``: 2.5 → 1.3 µs a hit, and a batch of 1,000
    queries that reads every row (a lookup job, the plan's pages) builds 10,000 of them. A field
    added to :class:`Hit` without a plain default (a ``default_factory``) takes ``__init__``.
    ``field``: the text field the hit was found in (a fused search, retrieval/fields.py)."""
    if not _FAST:
        return Hit(doc[0], score, doc[1], metadata, explain, field=field)
    hit = _new(Hit)
    _set(hit, "__dict__", {"id": doc[0], "score": score, "text": doc[1], "metadata": metadata, "explain": explain,
                           **_DEFAULTS})
    if field is not None:
        hit.__dict__["field"] = field
    return hit


def keep_top(result: SearchResult, own: np.ndarray, k: int) -> SearchResult:
    """Each row's first ``k`` candidates that are neither padding (-1) nor the query's own document
    (``own[i]``: its position, -1 for a text query), moved to the front in their order; -1 and
    -inf pad the rest. (n, m) → (n, min(k, m)). Searches ask for ``k + 1`` so that ``k`` remain."""
    positions, scores = np.asarray(result.positions), np.asarray(result.scores)
    keep = (positions >= 0) & (positions != np.asarray(own, np.int64)[:, None])
    kept_so_far = np.cumsum(keep, axis=1)
    keep &= kept_so_far <= k
    if kept_so_far.shape[1] and k and (kept_so_far[:, -1] >= k).all():  # every row keeps k: the usual case
        return SearchResult(positions[keep].reshape(-1, k), scores[keep].reshape(-1, k))
    order = np.argsort(~keep, axis=1, kind="stable")[:, :k]  # kept candidates first, in rank order
    kept = np.take_along_axis(keep, order, axis=1)
    return SearchResult(np.where(kept, np.take_along_axis(positions, order, axis=1), -1),
                        np.where(kept, np.take_along_axis(scores, order, axis=1), -np.inf).astype(scores.dtype))


class HitColumns(Sequence):
    """Each query's hits, best first, as columns; a sequence of ``n`` lists of :class:`Hit`.

    ``positions``, ``scores``: (n, k), a row's hits first, then -1 / -inf. ``docs``: (id, text,
    metadata JSON) rows holding every document hit (those read for the batch, or all of a docstore
    held in memory: see :meth:`read`); ``slots`` (n, k): each hit's row in ``docs``, -1 for
    padding. ``explain``: per query, per hit, the operator scores of ``--explain`` (or None).
    Reading row ``i`` builds that row's ``Hit`` objects then (a new list each time); ``ids(i)``
    and the arrays cost nothing more.
    """

    __slots__ = ("positions", "scores", "docs", "slots", "counts", "explain")
    __hash__ = None  # compared by value, as the list of lists it stands for

    def __init__(self, positions: np.ndarray, scores: np.ndarray, docs: DocRows, slots: np.ndarray,
                 explain: list[list[dict]] | None = None):
        self.positions, self.scores, self.docs, self.slots, self.explain = positions, scores, docs, slots, explain
        self.counts = (positions >= 0).sum(axis=1)  # hits per query: every row is packed to the front

    @classmethod
    def read(cls, result: SearchResult, docstore) -> HitColumns:
        """``result`` (packed rows, -1 pads: :func:`keep_top`) with the documents' fields: from memory,
        or one ordered read of ``docstore`` for its distinct positions (indexer/docstore.py ``read_at``)."""
        positions = np.asarray(result.positions, np.int64)
        docs, slots = docstore.read_at(positions)
        return cls(positions, np.asarray(result.scores), docs, slots)

    def with_explain(self, explain: list[list[dict]]) -> HitColumns:
        return HitColumns(self.positions, self.scores, self.docs, self.slots, explain)

    def ids(self, i: int) -> list[str]:
        """Query ``i``'s hit ids, best first, without building its hits."""
        rows = self.docs.rows
        return [rows[s][0] for s in self.slots[i, :self.counts[i]].tolist()]

    def row(self, i: int) -> list[Hit]:
        """Query ``i``'s hits, built now (:func:`_hit`)."""
        n = int(self.counts[i])
        slots = self.slots[i, :n].tolist()
        rows = self.docs.rows
        explain = self.explain[i] if self.explain is not None else [None] * n
        return [_hit(rows[s], score, meta, e) for s, score, meta, e in
                zip(slots, self.scores[i, :n].tolist(), self.docs.metadata(slots), explain)]

    def hits(self, i: int, ranks: Sequence[int], field: str | None = None) -> list[Hit]:
        """Query ``i``'s hits at ``ranks`` (0: its best) alone, as :meth:`row` builds them, each
        carrying ``field`` (retrieval/fields.py keeps a few of each text field's hits)."""
        slots = self.slots[i, list(ranks)].tolist()
        scores = self.scores[i, list(ranks)].tolist()
        explain = [self.explain[i][j] for j in ranks] if self.explain is not None else [None] * len(slots)
        rows = self.docs.rows
        return [_hit(rows[s], score, meta, e, field) for s, score, meta, e in
                zip(slots, scores, self.docs.metadata(slots), explain)]

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.row(j) for j in range(len(self))[i]]
        if not -len(self) <= i < len(self):
            raise IndexError(f"query {i} of {len(self)}")
        return self.row(i % len(self))

    def __iter__(self) -> Iterator[list[Hit]]:
        return (self.row(i) for i in range(len(self)))

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return list(self) == list(other)

    def __repr__(self) -> str:
        return f"HitColumns({len(self)} queries, {int(self.counts.sum())} hits)"
