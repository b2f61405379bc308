"""Answer relational queries against a published index.

Plan per query: raw vector h (encode the text, or t̂·‖h‖ for an indexed document) → relation
mixture q (encoder/relations.py) → FAISS search with the index's tuned parameters (or per-query
overrides), or an exact search over a selective filter's subset → drop the query document →
attach docstore fields → optional per-operator explanation. Deleted documents (tombstones) are
excluded by an id selector and never come back.
"""
from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import numpy as np

from ..encoder.bundle import Bundle, load_bundle, recorded_ref
from ..encoder.model import Encoder, resolve_model_path, weights_fingerprint
from ..encoder.precision import query_precision
from ..encoder.relations import lookup, mixture_query
from ..indexer import ann, gpu
from ..indexer import lexical as bm25
from ..indexer.ann import SearchResult
from ..indexer.build import projection_key
from ..indexer.filters import fields_in
from ..indexer.reader import IndexFiles, open_index
from . import hybrid as fusion
from .hits import Hit, HitColumns, keep_top  # noqa: F401  (Hit re-exported: callers import it from here)
from .inputs import MAX_WEIGHT, Filters, check_filters, check_weights, is_utf8

T = TypeVar("T")
EXACT_SUBSET_MAX = 10_000  # a filter matching at most this many documents is searched exactly


def drop_own(rows: Iterable[Sequence[T]], own: Sequence, k: int, key: Callable[[T], Any] = lambda x: x) -> list[list[T]]:
    """Self-exclusion, the one way: each row's first ``k`` candidates whose ``key`` is not that
    query's own document (``own[i]``: its id or position; None or -1 for a text query). Searches ask
    for ``k + 1`` candidates so that ``k`` remain."""
    return [[c for c in row if key(c) != mine][:k] for row, mine in zip(rows, own)]


class QueryError(ValueError):
    """A query that cannot be answered as asked (unknown relation, field or document id)."""


class QueryVectors(NamedTuple):
    """A batch of queries as vectors (:meth:`Searcher.query_vectors`), one row per query."""

    h: np.ndarray  # (n, d) raw vectors
    q: np.ndarray  # (n, d) relational query vectors
    own: np.ndarray  # (n,) an --id query's document position (the hit it never returns), -1 for a text query


@dataclass(frozen=True, kw_only=True)
class Example:
    """One example of a query by examples: an indexed document (``doc_id``) or a ``text``, weighted."""

    doc_id: str | None = None
    text: str | None = None
    weight: float = 1.0


# An example's weight when none is given. One unlike at 1 pushed the whole sector out with the copies it
# was meant to remove; 0.5 is the smallest weight that removes at least 3/4 of them (tools/unlike_weight.py).
DEFAULT_WEIGHT = {"like": 1.0, "unlike": 0.5}
MAX_EXAMPLES = 64  # likes and unlikes of one query


@dataclass(frozen=True, kw_only=True)
class Query:
    """One query: ``text``, ``doc_id`` (an indexed document) or examples — ``like`` and ``unlike``
    (Qdrant's recommend, Elasticsearch's more-like-this): each example is moved by the relation
    mixture, then q = Σ w · q(like) − Σ w · q(unlike), and no example document is ever a hit;
    relation weights, optional id and the line of the ``--queries`` file it came from."""

    text: str | None = None
    doc_id: str | None = None
    relations: dict[str, float] = field(default_factory=lambda: {"identity": 1.0})
    query_id: str | None = None
    line: int | None = None
    like: tuple[Example, ...] = ()
    unlike: tuple[Example, ...] = ()

    @property
    def by_examples(self) -> bool:
        return bool(self.like or self.unlike)

    def examples(self) -> list[tuple[Example, float]]:
        """Each example with its signed weight (unlikes negative)."""
        return [(e, e.weight) for e in self.like] + [(e, -e.weight) for e in self.unlike]


def check_examples(q: Query) -> None:
    """A QueryError naming what is wrong with an example query: it has likes, no text or doc_id
    beside them, at most MAX_EXAMPLES, each one doc_id or non-empty text with a finite weight > 0."""
    if q.text is not None or q.doc_id is not None:
        raise QueryError("a query by examples (like / unlike) takes no text or doc_id of its own")
    if not q.like:
        raise QueryError("a query by examples needs at least one like example (unlike only pushes results down)")
    examples = q.examples()
    if len(examples) > MAX_EXAMPLES:
        raise QueryError(f"at most {MAX_EXAMPLES} like and unlike examples, got {len(examples)}")
    for e, _ in examples:
        if not isinstance(e, Example) or (e.text is None) == (e.doc_id is None):
            raise QueryError("each example needs exactly one of doc_id or text")
        if e.text is not None and (not isinstance(e.text, str) or not e.text.strip() or not is_utf8(e.text)):
            raise QueryError("an example text is empty or not valid UTF-8")
        if e.doc_id is not None and (not isinstance(e.doc_id, str) or not e.doc_id or not is_utf8(e.doc_id)):
            raise QueryError("an example doc_id must be a non-empty UTF-8 string")
        w = e.weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not (0 < w <= MAX_WEIGHT) or not math.isfinite(w):
            raise QueryError(f"example weights must be numbers in (0, {MAX_WEIGHT:g}], got {str(w)[:40]!r}")


def _encoder_key(encoder: dict) -> tuple:
    sha = encoder.get("weights_sha256") or weights_fingerprint(resolve_model_path(encoder["model"]))
    return sha, encoder.get("pooling") or "mean"


class Searcher:
    """Opens one index generation and a bundle whose encoder matches the index's."""

    def __init__(self, index_dir: str, model: str | None = None, *, precision: str = "auto",
                 search_params: dict | None = None, exact_subset_max: int = EXACT_SUBSET_MAX,
                 gpu_facts: gpu.GpuFacts | None = None):
        self.files: IndexFiles = open_index(index_dir)
        manifest = self.files.manifest
        model = model or recorded_ref(manifest.bundle)
        self.bundle: Bundle = load_bundle(model, dim=manifest.dim)
        index_encoder = manifest.encoder
        if _encoder_key(self.bundle.encoder) != _encoder_key(index_encoder):
            raise QueryError(
                f"index {index_dir} was built with encoder {index_encoder['model']!r} "
                f"(weights {index_encoder.get('weights_sha256')}, {index_encoder.get('pooling')} pooling) but the "
                f"model {self.bundle.path or self.bundle.encoder['model']!r} uses another encoder; re-index the corpus "
                f"with this model or query with a bundle built on the index's encoder"
            )
        from .recipe import check_recipes

        try:  # once per bundle: a malformed recipe is named here, not in the middle of a query
            self.graph = check_recipes(self.bundle)  # the training graph a neighbours bonus reads
        except ValueError as e:
            raise QueryError(f"model {self.bundle.path or self.bundle.encoder['model']!r}: {e}") from None
        self.precision = precision
        self._encoder: Encoder | None = None
        self.metadata_fields: list[str] = list(manifest.fields.metadata)
        self.tuned_params: dict = dict(manifest.faiss.get("search_params", {}))
        self.params: dict = ann.parse_params(search_params or {})
        if self.params:  # refuse a parameter this index type ignores, naming the valid ones
            ann.parse_params(self.params, self.files.faiss)
        self.exact_subset_max = exact_subset_max
        ann.blas_from_batches(manifest.dim)
        self.gpu_facts = gpu_facts if gpu_facts is not None else gpu.detect()
        self._may_use_gpu = self.gpu_facts.available  # decided once: a CPU-only machine never asks per search
        self._gpu = None
        self._projected: dict[str, np.ndarray] = {}  # projection operator → its projected document vectors
        self._shared_quantizer: bool | None = None  # segments share one coarse assignment (ann.shares_quantizer)
        # several text fields: each field's Searcher (for_field) refers to this one, the index's
        self._owner: Searcher | None = None
        self._field: str | None = None
        self._field_searchers: dict[str, Searcher] = {}
        self._last_encoded: tuple[list[str], np.ndarray] | None = None

    @property
    def encoder(self) -> Encoder:
        if self._owner is not None:  # one transformer for every field's searches
            return self._owner.encoder
        if self._encoder is None:  # only text queries need the transformer
            enc = self.files.manifest.encoder  # as the index was encoded (the bundle's weights: checked above)
            # in the dtype the index records, on any machine (another precision asked for: used, with a warning)
            precision, why = query_precision(self.files.manifest.precision, self.precision)
            self._encoder = Encoder(self.bundle.encoder_config(pooling=enc.get("pooling"),
                                                               max_length=enc.get("max_length"),
                                                               precision=precision))
            self._encoder.precision_reason = why
        return self._encoder

    @property
    def operators(self):
        return self.bundle.operators

    def check(self, relations: dict[str, float], filters: Filters) -> None:
        """Raise (KeyError / QueryError naming the valid choices) for an unknown relation or filter
        field, a weight that is not finite, too large or all zero, or an invalid filter."""
        for name in relations:
            lookup(self.operators, name)  # raises KeyError naming the available ones
        try:
            check_weights(relations)
            check_filters(filters)
        except ValueError as e:
            raise QueryError(str(e)) from None
        for f in fields_in(filters):
            if f not in self.metadata_fields:
                raise QueryError(f"unknown filter field {f!r}; metadata fields: {', '.join(self.metadata_fields) or '(none)'}")

    @property
    def live_count(self) -> int:
        """Documents a search can return (deleted ones excluded)."""
        return self.files.positions - len(self.files.deleted)

    def unknown_ids(self, queries: list[Query]) -> set[str]:
        """doc_ids among ``queries`` (their examples' too) that are not in the index."""
        wanted = [d for q in queries for d in [q.doc_id, *(e.doc_id for e, _ in q.examples())] if d is not None]
        return set(wanted) - set(self.files.docstore.positions(wanted))

    def example_positions(self, queries: list[Query]) -> list[set[int]]:
        """Per query, the positions of its example documents: never hits."""
        found = self.files.docstore.positions([e.doc_id for q in queries for e, _ in q.examples() if e.doc_id])
        return [{found[e.doc_id] for e, _ in q.examples() if e.doc_id in found} for q in queries]

    def raw_vectors(self, queries: list[Query], own: np.ndarray | None = None) -> np.ndarray:
        """(n, d) raw query vectors: encoded text, or stored t̂·‖h‖ for doc_id queries, or the
        signed weighted sum of an example query's. ``own``: the queries' document positions
        (:meth:`own_positions`), looked up when not given."""
        if any(q.by_examples for q in queries):
            return self._by_examples(queries, lambda sub: self.raw_vectors(sub))
        own = self.own_positions(queries) if own is None else own
        out = np.empty((len(queries), self.files.manifest.dim), dtype=np.float32)  # every row is written below
        by_id = np.flatnonzero(np.fromiter((q.doc_id is not None for q in queries), bool, len(queries)))
        if len(by_id):
            missing = by_id[own[by_id] < 0]
            if len(missing):
                named = ", ".join(str(queries[i].doc_id) for i in missing[:5])
                raise QueryError(f"document id(s) not in the index: {named}")
            # one gather of the rows and one read of their norms, not a docstore row per query
            rows = self.files.raw_rows(own[by_id])
            if len(by_id) == len(queries):
                return rows
            out[by_id] = rows
        by_text = [i for i, q in enumerate(queries) if q.doc_id is None]
        if by_text:
            out[by_text] = self._encoded([queries[i].text for i in by_text])
        return out

    def _encoded(self, texts: list[str]) -> np.ndarray:
        """Raw vectors of ``texts``; the last batch's kept by the index's Searcher, so the field
        searches of one fused query (retrieval/fields.py) encode its text once."""
        from ..encoder.model import encode_texts  # cuts huge texts before tokenizing, as indexing does

        owner = self._owner or self
        if owner._last_encoded is None or owner._last_encoded[0] != texts:
            owner._last_encoded = (list(texts), encode_texts(self.encoder, texts)[0])
        return owner._last_encoded[1]

    @property
    def text_fields(self) -> tuple[str, ...]:
        """The index's named text fields, in order (one for an index of one text)."""
        return (self._owner or self).files.text_fields

    @property
    def field(self) -> str | None:
        """The text field this Searcher searches alone (:meth:`for_field`); None: the index as built."""
        return self._field

    def for_field(self, name: str) -> Searcher:
        """This Searcher on text field ``name`` alone (indexer/field_view.py): its vectors, FAISS, BM25
        and texts, documents lacking it excluded; itself for an index of one text. QueryError naming
        the index's text fields for an unknown name."""
        from ..indexer.field_view import field_view

        owner = self._owner or self
        try:
            files = field_view(owner.files, name)
        except KeyError as e:
            raise QueryError(e.args[0]) from None
        if files is owner.files:
            return owner
        if name not in owner._field_searchers:
            view = copy.copy(owner)
            view.files, view._owner, view._field = files, owner, name
            view._gpu, view._projected, view._shared_quantizer, view._field_searchers = None, {}, None, {}
            i = owner.text_fields.index(name)
            if i:  # fields 1… were tuned on their own vectors at build (manifest field_faiss)
                view.tuned_params = dict(owner.files.manifest.field_faiss.get(name, {}).get("search_params", {}))
            owner._field_searchers[name] = view
        return owner._field_searchers[name]

    def check_queries(self, queries: list[Query], filters: Filters | None = None) -> None:
        """Every check of a search's ``queries`` and ``filters``, made before it runs (by :func:`~.request.plan`
        and :meth:`search`): :func:`check_examples`, one UTF-8, non-empty text or doc_id, and per relation
        mixture :meth:`check`. QueryError (KeyError for an unknown relation) naming the bad value."""
        filters, mixtures = filters or {}, set()  # each relation mixture checked once
        for q in queries:
            if q.by_examples:
                check_examples(q)
            elif (q.text is None) == (q.doc_id is None):
                raise QueryError("each query needs exactly one of text, doc_id or like examples")
            elif not is_utf8(q.text if q.doc_id is None else q.doc_id):  # undecodable argv bytes arrive as surrogates
                raise QueryError(f"query {'text' if q.doc_id is None else 'document id'} is not valid UTF-8")
            elif q.text is not None and not q.text.strip():  # encodes to some vector: hits, but meaningless ones
                raise QueryError("query text is empty")
            try:
                known = tuple(sorted(q.relations.items())) in mixtures
            except TypeError:  # a name that is not a string, an unhashable weight: check() names it
                self.check(q.relations, filters)
                raise
            if not known:
                self.check(q.relations, filters)
                mixtures.add(tuple(sorted(q.relations.items())))

    def query_vectors(self, queries: list[Query], filters: Filters | None = None, *,
                      checked: bool = False) -> QueryVectors:
        """Raw vectors h, relational query vectors q and own positions (:class:`QueryVectors`) of ``queries``,
        checked first (:meth:`check_queries`) unless ``checked`` (a plan's run); queries sharing a relation mixture
        are transformed as one batch, q not renormalised (design.md §3: a mixture's ⟨q, t̂⟩ is Σ w·cos)."""
        if not checked:
            self.check_queries(queries, filters)
        if any(q.by_examples for q in queries):
            return QueryVectors(self.raw_vectors(queries),
                                self._by_examples(queries, lambda sub: self.query_vectors(sub, checked=True).q),
                                np.full(len(queries), -1, np.int64))
        groups: dict[tuple, list[int]] = {}  # relation mixture → its queries, transformed as one batch
        for i, q in enumerate(queries):
            groups.setdefault(tuple(sorted(q.relations.items())), []).append(i)
        own = self.own_positions(queries)
        h = self.raw_vectors(queries, own)
        texts = self.query_texts(queries) if self.reads_text({n for key in groups for n, _ in key}) else None
        if len(groups) == 1:  # the whole batch shares one mixture: no gathering and scattering of rows
            key = next(iter(groups))
            return QueryVectors(h, self.transform(h, dict(key), texts), own)
        qv = np.zeros_like(h)
        for key, rows in groups.items():
            qv[rows] = self.transform(h[rows], dict(key), None if texts is None else [texts[i] for i in rows])
        return QueryVectors(h, qv, own)

    def _by_examples(self, queries: list[Query], vectors) -> np.ndarray:
        """(n, d): ``vectors(queries)`` for plain queries, and for an example query Σ_e w_e ·
        ``vectors`` of its example e (an unlike's weight negative), each example as a query of the
        same relation mixture: the relation moves each example before they are combined."""
        rows: list[Query] = []
        spans = []
        for q in queries:
            start = len(rows)
            if q.by_examples:
                rows += [Query(text=e.text, doc_id=e.doc_id, relations=q.relations) for e, _ in q.examples()]
            else:
                rows.append(q)
            spans.append((start, len(rows)))
        got = vectors(rows)
        out = np.empty((len(queries), got.shape[1]), np.float32)
        for i, (q, (a, b)) in enumerate(zip(queries, spans)):
            weights = np.asarray([w for _, w in q.examples()] if q.by_examples else [1.0], np.float32)
            out[i] = weights @ got[a:b]
        return out

    def reads_text(self, names) -> bool:
        """True when a relation among ``names`` is a query encoder (kind ``encoder``): its tower is
        then attached to this Searcher's transformer, and queries need their text."""
        if not any(lookup(self.operators, n).needs_text for n in names):
            return False
        from ..encoder.tower import attach_towers

        attach_towers(self.operators, self.encoder)
        return True

    def query_texts(self, queries: list[Query]) -> list[str]:
        """Each query's text: its own, or the stored text of its document (``--id``: re-encoded by
        query towers); an example query's liked texts, one per line (its BM25 query)."""
        if any(q.by_examples for q in queries):
            flat = [Query(text=e.text, doc_id=e.doc_id) for q in queries for e in q.like]
            texts = iter(self.query_texts(flat))
            return ["\n".join(next(texts) for _ in q.like) if q.by_examples else self.query_texts([q])[0]
                    for q in queries]
        positions = self.files.docstore.positions([q.doc_id for q in queries if q.doc_id is not None])
        docs = self.files.docstore.get(list(positions.values())) if positions else {}
        return [q.text if q.doc_id is None else docs[positions[q.doc_id]]["text"] for q in queries]

    def transform(self, h: np.ndarray, relations: dict[str, float], texts: list[str] | None = None) -> np.ndarray:
        """Relational query vectors (n, d) for raw vectors ``h`` (n, d) under one relation mixture;
        ``texts`` (n): the query texts, for query encoders (see :meth:`reads_text`)."""
        if len(relations) == 1 and next(iter(relations.values())) == 1.0:
            return lookup(self.operators, next(iter(relations))).apply(h, texts)  # = the mixture, minus its sum
        return mixture_query(self.operators, h, relations, texts)

    @property
    def local(self) -> Searcher:
        """The local index itself (retrieval/backend.py)."""
        return self

    def candidates(self, qv: np.ndarray, texts: list[str] | None, n_dense: int, n_lexical: int,
                   filters: Filters | None, *, own: np.ndarray) -> tuple[SearchResult, SearchResult | None]:
        """retrieval/backend.py: FAISS (or an exact search of a selective filter's subset) and the
        BM25 lists, under one docstore match of ``filters``."""
        subset = self.matching(filters) if filters else None
        dense = self.ann(qv, n_dense, subset=subset)
        return dense, None if texts is None else self.lexical_search(texts, n_lexical, subset)

    def search(self, queries: list[Query], *, k: int = 10, filters: Filters | None = None,
               explain: bool = False, params: dict | None = None, hybrid: str | None = None,
               checked: bool = False) -> HitColumns:
        """Top-k hits per query by ⟨q, t̂⟩ of its relation mixture's vector (never the query document itself), as
        columns (retrieval/hits.py): the plan's ``dense`` and ``projection`` modes, and ``rrf`` with ``hybrid="rrf"``
        (retrieval/plan.py; retrieval/request.py runs recipes). ``params`` overrides the index's tuned search
        parameters for this call (indexer/ann.py). ``filters``: field → a value or ``{operator: value}``, typed
        (indexer/filters.py). k above the number of live documents is clipped to it. Queries and filters are
        checked first (:meth:`check_queries`) unless ``checked`` (a plan's run)."""
        k = min(k, self.live_count)
        if hybrid not in (None, "rrf"):
            raise QueryError(f"Searcher.search fuses by rrf only, got hybrid={hybrid!r} (weighted runs as a recipe)")
        projection = self.projection_of(queries)
        h, qv, own = self.query_vectors(queries, filters, checked=checked)
        subset = self.matching(filters) if filters else None
        # one extra candidate per query so that dropping the query document still leaves k
        if projection:
            result = self.projected_search(projection, qv, k + 1, subset)
        else:
            result = self.ann(qv, max(k, fusion.HYBRID_DEPTH if hybrid else 0) + 1, subset=subset, params=params)
        if hybrid:
            lexical = self.lexical_search(self.query_texts(queries), fusion.HYBRID_DEPTH + 1, subset)
            result = fusion.fuse_rrf(result, lexical, k + 1, depth=fusion.HYBRID_DEPTH, exclude=own)
        return self.hits(result, queries, k, h if explain else None, own=own)

    def own_positions(self, queries: list[Query]) -> np.ndarray:
        """Each ``--id`` query's live position, -1 for a text query (n,)."""
        found = self.files.docstore.positions([q.doc_id for q in queries if q.doc_id is not None])
        return np.asarray([-1 if q.doc_id is None else found.get(q.doc_id, -1) for q in queries], np.int64)

    def lexical_search(self, texts: list[str], k: int, subset: np.ndarray | None = None) -> SearchResult:
        """BM25 top-k positions and scores for ``texts`` over every segment (indexer/lexical.py);
        deleted positions never, and only ``subset`` when given."""
        parts = [s.bm25 for s in self.files.segments]
        if any(p is None for p in parts):
            raise QueryError("this index has no BM25 lists for every segment (built before hybrid search, or "
                             "appended to since): run `relsearch compact --index DIR` once to add them")
        allowed = np.ones(self.files.positions, bool)
        allowed[self.files.deleted] = False
        if subset is not None:
            chosen = np.zeros_like(allowed)
            chosen[subset] = True
            allowed &= chosen
        positions, scores = bm25.search(parts, texts, k, allowed=lambda p: allowed[p])
        return SearchResult(positions, scores)

    def matching(self, filters: Filters) -> np.ndarray:
        """Sorted live positions whose metadata satisfies ``filters`` (the docstore's indexed filter table)."""
        try:
            return np.asarray(self.files.docstore.matching(filters), dtype=np.int64)
        except ValueError as e:
            raise QueryError(str(e)) from None

    def filter_warnings(self, filters: Filters | None) -> list[str]:
        """One line per operator of ``filters`` that can never match in this index because the type
        of its value never occurs in its field (e.g. ``founded>=1990`` where ``founded`` holds strings;
        negated, it keeps every document), with the quoted form to use: for ``relsearch query``'s
        stderr and the ``warnings`` of API / HTTP answers. Costs a few index seeks per field."""
        if not filters:
            return []
        try:
            return self.files.docstore.filter_warnings(filters)
        except ValueError as e:
            raise QueryError(str(e)) from None

    def no_match_warnings(self, filters: Filters | None) -> list[str]:
        """When no live document matches ``filters``: one line saying so, and for each string
        equality that another case of the value would match, the stored spelling and the
        case-insensitive form (``gics_sector=energy`` where the index holds ``Energy``). For
        ``relsearch query``'s stderr and the ``warnings`` of API / HTTP answers with no hits."""
        if not filters or len(self.matching(filters)):
            return []
        out = [f"no document matches the filter {json.dumps(filters, ensure_ascii=False)[:300]}"]
        for name, value in filters.items():
            if isinstance(value, str) and name in self.metadata_fields:
                alike = self.matching({name: {"ieq": value}})
                if len(alike):
                    stored = self.files.docstore.get([int(alike[0])])[int(alike[0])]["metadata"].get(name)
                    out.append(f"{name}={value!r} matches no document but {name}={stored!r} does: values compare "
                               f'case-sensitively; {name}~={value} (API: {{"{name}": {{"ieq": {json.dumps(value)}}}}}) '
                               "ignores case")
        return out

    def projection_of(self, queries: list[Query]) -> str | None:
        """The projection operator these queries search with (each alone), or None."""
        asked = dict.fromkeys(n for q in queries for n in q.relations)  # each name looked up once, in order
        names = {n for n in asked if lookup(self.operators, n).both_sides}
        if not names:
            return None
        if len(names) > 1 or any(set(q.relations) != names for q in queries):
            raise QueryError(f"{', '.join(sorted(names))}: a projection maps documents too and is searched in its "
                             "own projected index, so query it alone, not mixed with other relations")
        return names.pop()

    def projected_search(self, name: str, qv: np.ndarray, k: int, subset: np.ndarray | None = None) -> SearchResult:
        """Exact search of normalize(P h_q) among normalize(P t̂) for projection operator ``name``.

        The projected copy of the index is built in memory from the stored unit vectors on first
        use (n × d × d operations), then reused; deleted documents never come back.
        """
        if name not in self._projected:
            self._projected[name] = self._projected_vectors(name)
        if subset is None:
            live = self.files.live()
            subset = None if live is None else np.flatnonzero(live.mask)
        else:
            subset = np.setdiff1d(subset, self.files.deleted)
        return ann.exact_search(self._projected[name], qv, k, subset)

    def _projected_vectors(self, name: str) -> np.ndarray:
        """normalize(t̂ Pᵀ) for every stored t̂: the copy `relsearch index` wrote for this P, else built here."""
        op, vectors = lookup(self.operators, name), self.files.vectors
        # the stored projected copy is of the first text field's vectors: another field's is built here
        stored = self.files.manifest.projections.get(name, {}) if self._field in (None, self.text_fields[0]) else {}
        if stored.get("key") == projection_key(op.params["P"]) and re.fullmatch(r"projection-\d+\.npy",
                                                                               stored.get("file", "")):
            return np.load(self.files.root / stored["file"], mmap_mode="r", allow_pickle=False)
        return np.concatenate([op.documents(np.asarray(vectors[i:i + 65536])) for i in range(0, len(vectors), 65536)]
                              or [np.zeros((0, op.dim), np.float32)])

    def hits(self, result: SearchResult, queries: list[Query], k: int, h: np.ndarray | None = None, *,
             own: np.ndarray | None = None) -> HitColumns:
        """``result`` as each query's hits (retrieval/hits.py): its own document (``own``: its
        position per query, :meth:`own_positions`) and padding dropped, k kept, the documents' fields
        read in one ordered docstore statement per batch or found in memory (indexer/docstore.py
        ``read_at``); ``Hit`` objects are built when a row is read. ``h`` given: every operator's
        score per hit (``--explain``)."""
        own = self.own_positions(queries) if own is None else own
        hits = HitColumns.read(keep_top(result, own, k), self.files.docstore)
        if h is None:
            return hits
        reads = self.reads_text(self.operators)
        texts = self.query_texts(queries) if reads else None
        explained = []
        for i, q in enumerate(queries):
            positions = hits.positions[i, :hits.counts[i]].tolist()
            if q.by_examples:  # each example moved by each operator, then combined: as its query vector
                rows = [Query(text=e.text, doc_id=e.doc_id) for e, _ in q.examples()]
                weights = np.asarray([w for _, w in q.examples()], np.float32)
                explained.append(self._explain(self.raw_vectors(rows), weights, positions,
                                               self.query_texts(rows) if reads else [None] * len(rows), q.relations))
            else:
                explained.append(self._explain(h[i][None], np.ones(1, np.float32), positions,
                                               [None if texts is None else texts[i]], q.relations))
        return hits.with_explain(explained)

    def effective_params(self, params: dict | None = None) -> dict:
        """Tuned parameters from the manifest, then the Searcher's overrides, then ``params``."""
        return {**self.tuned_params, **self.params, **(ann.parse_params(params) if params else {})}

    def ann(self, qv: np.ndarray, k: int, *, subset: np.ndarray | None = None,
            params: dict | None = None) -> SearchResult:
        """Positions and scores (n, k) for query vectors ``qv`` (n, d); -1 pads.

        ``subset``: the positions allowed (a docstore filter). A selective filter (at most
        ``exact_subset_max`` matches) is searched exactly; a broad one through FAISS with an
        IDSelector, widened and topped up exactly so k hits come back whenever k match.
        Deleted positions never come back. Near-tied scores are settled (:func:`~relsearch.indexer.ann.settle_ties`):
        identical documents tie exactly and rank by position, in a batch as alone.
        """
        qv = np.ascontiguousarray(qv, dtype=np.float32)
        with ann.threads_for(len(qv)):
            found = self._ann(qv, k + ann.TIE_MARGIN, subset, params)
        return ann.settle_ties(found, qv, self.files.vectors, k)

    def _ann(self, qv: np.ndarray, k: int, subset: np.ndarray | None, params: dict | None) -> SearchResult:
        if subset is not None and len(subset) <= self.exact_subset_max:
            return ann.exact_search(self.files.vectors, qv, k, subset)
        selection = self.files.live() if subset is None else ann.Selection.of(subset, self.files.positions)
        if len(self.files.segments) > 1:  # appended segments: each searched, the top k of all kept
            indexes = [s.faiss for s in self.files.segments]
            if self._shared_quantizer is None:
                self._shared_quantizer = ann.shares_quantizer(indexes)
            return ann.search_segments([(s.start, s.faiss, s.vectors) for s in self.files.segments], qv, k,
                                       params=self.effective_params(params), selection=selection,
                                       vectors=self.files.vectors, shared_quantizer=self._shared_quantizer)
        index = self.files.faiss
        filtered = selection is not None and selection.use_selector
        if self._may_use_gpu and gpu.search_device(index, len(qv), self.gpu_facts, filtered=filtered) == "gpu":
            result = self._gpu_search(qv, k, self.effective_params(params), selection)
            if result is not None:
                return result
        return ann.search(index, qv, k, params=self.effective_params(params), vectors=self.files.vectors,
                          selection=selection)

    def _gpu_search(self, qv, k, params, selection) -> SearchResult | None:
        """Search a GPU copy of the index; None (→ CPU) when the copy cannot be made."""
        if self._gpu is None:
            try:
                self._gpu = gpu.GpuSearch(self.files.faiss)
            except Exception as e:  # noqa: BLE001 - any GPU failure: stay on the CPU from now on
                self.gpu_facts, self._may_use_gpu = gpu.GpuFacts(False, 0), False
                gpu.log.warning("FAISS GPU search unavailable (%s: %s); searching on the CPU", type(e).__name__, e)
                return None
        return self._gpu.search(qv, k, params, vectors=self.files.vectors, selection=selection)

    def _explain(self, h: np.ndarray, weights: np.ndarray, positions: list[int], texts: list,
                 relations: dict[str, float] | None = None) -> list[dict]:
        """Per hit at ``positions``, every operator's own score Σ_e w_e cos(op(h_e), t) over the
        query's raw vectors ``h`` (m, d) with ``weights`` (m,) — one row of weight 1, or an
        example query's examples; for a mixture (several relations, or one weighted other than 1)
        its parts first: ``mixture:NAME`` = weight × that score, which sum to the relational score
        (the hit's score unless fused with BM25 or re-ranked)."""
        t = np.asarray(self.files.vectors[positions]) if positions else np.zeros((0, h.shape[1]), np.float32)
        per_op = {name: weights @ (op.apply(h, texts) @ op.documents(t).T) for name, op in sorted(self.operators.items())}
        mixed = bool(relations) and (len(relations) > 1 or list(relations.values()) != [1.0])
        parts = {f"mixture:{name}": (float(w), per_op[name]) for name, w in relations.items()} if mixed else {}
        return [{**{key: w * float(s[j]) for key, (w, s) in parts.items()}, **{name: s[j] for name, s in per_op.items()}}
                for j in range(len(positions))]
