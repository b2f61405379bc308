"""One search, the one way: the path every caller takes from queries to a page of hits.

``relsearch query``, the Python API (relsearch/api.py) and through it the server, lookup jobs and
the benchmarks build the same :class:`SearchOptions` and call :func:`plan` once: each query's
relation mixture resolved with ``hybrid`` into one scoring (retrieval/plan.py: dense, recipe or
rrf). :meth:`Plan.run` executes it: candidates from the backend, fusion and bonuses (re-scored by a
pair head when ``rerank``), collapsed on a metadata field, then the page
``offset…offset + k``, the ``min_score`` cut and the metadata each hit carries (``fields``). The result is one list of
:class:`~.search.Hit` per query, re-ranked or not.

Errors name the option at fault (:class:`RequestError`), never a command-line flag: the CLI
and the server say it in their own words.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .hybrid import METHODS as HYBRID_METHODS
from .hybrid import check as check_fusion
from .inputs import FACET_DEPTH, MAX_K, MAX_RERANK_DEPTH, Filters, check_filters
from .hits import HitColumns
from .paging import page, search_collapsed
from .plan import Scoring
from .search import Hit, Query, QueryError

MAX_FACETS = 16  # facet fields of one request


class RequestError(ValueError):
    """A request that cannot be answered as asked; ``field`` names the part at fault, ``status``
    is the HTTP status a server answers with (422 invalid, 404 unknown document)."""

    def __init__(self, field: str, message: str, status: int = 422):
        super().__init__(message)
        self.field, self.message, self.status = field, message, status


@contextlib.contextmanager
def blame(field_name: str):
    """Turn the search layer's errors (QueryError, a KeyError listing valid names, ValueError) into
    a RequestError naming the request field at fault."""
    try:
        yield
    except (QueryError, KeyError, ValueError) as e:
        if isinstance(e, RequestError):
            raise
        raise RequestError(field_name, e.args[0] if isinstance(e, KeyError) else str(e)) from None


def option(default=None, help: str = "", *, low=None, high=None, factory=None, flag: str | None = None):
    """A :class:`SearchOptions` field with what the interfaces derive from it: ``help`` (the CLI's
    help and the server's schema description), ``low``/``high`` bounds (a click range, pydantic's
    ge/le) and, where it differs from ``--name-with-dashes``, the CLI ``flag``."""
    meta = {"help": help, "low": low, "high": high, "flag": flag}
    return field(default_factory=factory, metadata=meta) if factory else field(default=default, metadata=meta)


def flag_of(name: str) -> str:
    """The CLI flag of option ``name``: its declared ``flag`` or ``--name-with-dashes``; another name as it is."""
    meta = {f.name: f.metadata for f in dataclasses.fields(SearchOptions)}.get(name)
    return name if meta is None else meta["flag"] or "--" + name.replace("_", "-")


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """How to answer a batch of queries: the page ``offset``…``offset + k`` after keeping the best
    hit per value of metadata field ``collapse`` (retrieval/paging.py), hits below ``min_score``
    dropped; metadata ``filters`` (indexer/filters.py: a value or ``{operator: value}`` per field,
    AND-ed); ``explain`` (every operator's own score); ``rerank`` (a pair head of the bundle) over
    ``rerank_depth`` ANN candidates; ``hybrid`` (``rrf`` | ``weighted``, fused with BM25 on the
    query text, retrieval/hybrid.py) with, for ``weighted``, ``hybrid_weight`` (the relational
    list's share in [0, 1], default 0.5). What each hit carries (Elasticsearch's ``_source``
    filtering, Qdrant's ``with_payload``): ``fields`` (metadata field names: only those, in that
    order; None: every field) and ``metadata`` (false: none, ``{}``); applied after collapse, so a
    collapse field need not be among them (:meth:`~.search.Hit.shaped`)."""

    # The one declaration of a search's options: the CLI's flags (relsearch/cli_query.py), the
    # Python API's keywords (relsearch/api.py) and the server's JSON body (relsearch/serve/models.py)
    # are made from these fields, their defaults, help and bounds.
    k: int = option(10, f"Hits per query, at most {MAX_K:,} (more than the index holds: all of them).",
                    low=1, high=MAX_K, flag="-k")
    offset: int = option(0, f"Skip this many hits (the next page: offset 10, k 10); offset + k at most {MAX_K:,}.",
                         low=0, high=MAX_K - 1)
    min_score: float | None = option(None, "Drop hits scoring below this.")
    collapse: str | None = option(None, "Keep only the best hit per value of this metadata field (default: the "
                                        "index's recorded collapse field, if any; false: none).")
    filters: Filters = option(help="Metadata filters, AND-ed (indexer/filters.py).", factory=dict)
    explain: bool = option(False, "Add every operator's own score for each hit; a mixture's weighted parts "
                                  "(mixture:NAME, summing to the relational score) or a recipe's parts come first; "
                                  "the CLI's table starts with the anchor (the --id document's texts and fields).")
    rerank: str | None = option(None, "A re-ranking head of the bundle, e.g. pu-head.")
    rerank_depth: int | None = option(None, "With a re-ranking head: ANN candidates fetched per query before "
                                            f"re-ranking (default 50, at least k, at most {MAX_RERANK_DEPTH:,}).",
                                      low=1, high=MAX_RERANK_DEPTH)
    hybrid: str | None = option(None, "Fuse BM25 on the query text with the relational search: rrf (reciprocal "
                                      "rank fusion) or weighted (min-max scores).")
    hybrid_weight: float | None = option(None, "With hybrid weighted: the relational list's share of the "
                                               "normalised scores, BM25 gets 1 - W (default 0.5).", low=0, high=1)
    fields: list[str] | tuple[str, ...] | None = option(
        None, "The metadata fields each hit carries, in this order (Elasticsearch's _source filtering); "
              "default: every field.")
    metadata: bool = option(True, 'Whether hits carry their metadata (--no-metadata, false: "metadata": {}).')
    facets: list[str] | tuple[str, ...] = option((), "Metadata fields whose values are counted over the first "
                                                     "facet-depth hits ({field: [[value, count], ...]}).")
    facet_depth: int = option(FACET_DEPTH, "Hits the facets count.", low=1, high=MAX_K)
    highlight: bool = option(False, "Mark the query's BM25 terms in each hit's text ([term] in the table, "
                                    "offsets in JSON).")
    # one named text field of an index of several (indexer/text_fields.py); None: all of them, fused
    # by each document's best score (retrieval/fields.py)
    field: str | None = option(None, "One named text field of an index of several (default: all, each document "
                                     "by its best field; each hit's field says which).")
    why_not: str | None = option(None, "An indexed document's id: its rank in this query's whole answer and the "
                                       "score parts that placed it there, beside the last hit shown's.")

    def check(self) -> None:
        """The checks that need no index; a :class:`RequestError` naming the option."""
        self.check_types()
        if not 1 <= self.k <= MAX_K:
            raise RequestError("k", f"k must be between 1 and {MAX_K:,}, got {self.k:,}")
        if not 0 <= self.offset <= MAX_K - self.k:
            raise RequestError("offset", f"offset + k must be at most {MAX_K:,}, got {self.offset:,} + {self.k:,}")
        if self.rerank_depth is not None and not 1 <= self.rerank_depth <= MAX_RERANK_DEPTH:
            raise RequestError("rerank_depth", f"rerank_depth must be between 1 and {MAX_RERANK_DEPTH:,}")
        if self.rerank_depth is not None and self.rerank is None:
            raise RequestError("rerank_depth", "rerank_depth needs rerank (a head name)")
        if self.hybrid is not None and self.hybrid not in HYBRID_METHODS:
            raise RequestError("hybrid", f"hybrid must be one of {', '.join(HYBRID_METHODS)}, "
                                         f"got {str(self.hybrid)[:40]!r}")
        if self.hybrid is not None and self.rerank is not None:
            raise RequestError("hybrid", "hybrid and rerank do not combine")
        with blame("hybrid_weight"):
            check_fusion(self.hybrid, self.hybrid_weight)
        with blame("filters"):
            check_filters(self.filters)
        if self.min_score is not None and not math.isfinite(self.min_score):
            raise RequestError("min_score", "min_score must be a finite number")
        if self.fields and not self.metadata:
            raise RequestError("fields", "fields chooses metadata fields, metadata false drops them all: give one")
        if not 1 <= self.facet_depth <= MAX_K:
            raise RequestError("facet_depth", f"facet_depth must be between 1 and {MAX_K:,}, got {self.facet_depth:,}")
        if len(self.facets) > MAX_FACETS:
            raise RequestError("facets", f"at most {MAX_FACETS} facet fields, got {len(self.facets)}")

    def check_types(self) -> None:
        """Each option has its JSON type, as the server's schema says (``true`` is not a number,
        ``"5"`` is not 5): a RequestError naming the option otherwise."""
        def number(value) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool)

        wanted = {"k": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
                  "offset": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
                  "rerank_depth": ("an integer", lambda v: v is None or isinstance(v, int) and not isinstance(v, bool)),
                  "min_score": ("a number", lambda v: v is None or number(v)),
                  "hybrid_weight": ("a number", lambda v: v is None or number(v)),
                  "explain": ("true or false", lambda v: isinstance(v, bool)),
                  "collapse": ("a field name or false", lambda v: v is None or v is False or isinstance(v, str) and v != ""),
                  "field": ("a text field name", lambda v: v is None or isinstance(v, str) and v != ""),
                  "why_not": ("a document id", lambda v: v is None or isinstance(v, str) and v != ""),
                  "rerank": ("a head name", lambda v: v is None or isinstance(v, str) and v != ""),
                  "hybrid": ("rrf or weighted", lambda v: v is None or isinstance(v, str)),
                  "filters": ("an object {field: value}", lambda v: isinstance(v, Mapping)),
                  "fields": ("a list of metadata field names", lambda v: v is None or isinstance(v, (list, tuple))
                             and all(isinstance(f, str) and f != "" for f in v)),
                  "metadata": ("true or false", lambda v: isinstance(v, bool)),
                  "facets": ("a list of metadata field names", lambda v: isinstance(v, (list, tuple))
                             and all(isinstance(f, str) and f != "" for f in v)),
                  "facet_depth": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
                  "highlight": ("true or false", lambda v: isinstance(v, bool))}
        for name, (kind, ok) in wanted.items():
            value = getattr(self, name)
            if not ok(value):
                shown = f" {str(value)[:40]!r}" if isinstance(value, (str, int, float)) else ""  # never a deep repr
                raise RequestError(name, f"{name} must be {kind}, got {type(value).__name__}{shown}")

    def check_against(self, searcher) -> None:
        """The checks against an opened index (its fields and heads); RequestError naming the option."""
        from .rerank import head_of

        with blame("filters"):
            searcher.check({}, self.filters)
        if self.field is not None and self.field not in searcher.text_fields:
            raise RequestError("field", f"unknown text field {self.field[:80]!r}; this index's text fields: "
                                        f"{', '.join(searcher.text_fields)}")
        if isinstance(self.collapse, str) and self.collapse not in searcher.metadata_fields:
            raise RequestError("collapse", f"unknown collapse field {self.collapse!r}; metadata fields: "
                                           f"{', '.join(searcher.metadata_fields) or '(none)'}")
        if self.rerank is not None:
            with blame("rerank"):
                head_of(searcher, self.rerank)
        for name in ("fields", "facets"):
            unknown = [f for f in getattr(self, name) or () if f not in searcher.metadata_fields]
            if unknown:
                raise RequestError(name, f"unknown field {unknown[0][:80]!r}; metadata fields: "
                                         f"{', '.join(searcher.metadata_fields) or '(none)'}")

    def shape(self, hits: list[Hit]) -> list[Hit]:
        """``hits`` carrying the metadata asked for (``fields``, ``metadata``): :meth:`~.search.Hit.shaped`."""
        if self.metadata and self.fields is None:
            return hits
        return [hit.shaped(self.fields, self.metadata) for hit in hits]

    def paged(self, hits: list[Hit]) -> list[Hit]:
        """This request's page of a ranked list: ``offset…offset + k``, the ``min_score`` cut, :meth:`shape`."""
        return self.shape(page(hits, offset=self.offset, k=self.k, min_score=self.min_score))

    @property
    def is_whole_list(self) -> bool:
        """Whether :meth:`paged` keeps a ranked list of ``k`` hits as it is."""
        return not (self.offset or self.fields) and self.min_score is None and self.metadata

    def shared(self) -> SearchOptions:
        """The search several requests can share: their common top ``k + offset``, unpaged and
        with every metadata field; each then takes its own :meth:`paged` of it."""
        return dataclasses.replace(self, k=self.k + self.offset, offset=0, min_score=None, fields=None, metadata=True)

    def group_key(self) -> tuple:
        """Requests with equal keys share one search (:meth:`shared`). Filters as JSON text, which
        keeps each value's type (True == 1 in Python, but the filters differ)."""
        shared = self.shared()
        return tuple(json.dumps(value, sort_keys=True) if f.name == "filters" else
                     tuple(value) if isinstance(value, list) else value
                     for f in dataclasses.fields(SearchOptions) for value in [getattr(shared, f.name)])


@dataclass(frozen=True)
class Plan:
    """A batch of queries resolved once (retrieval/plan.py): each query's :class:`~.plan.Scoring`
    and the warnings of what they name that cannot contribute. :meth:`run` executes it."""

    backend: object
    queries: list[Query]
    options: SearchOptions
    scorings: list[Scoring]
    # an index of several text fields searched fused: each field's backend (retrieval/fields.py)
    fields: tuple = ()

    @property
    def warnings(self) -> list[str]:
        """Every query's :meth:`warnings_for`, each line once."""
        return list(dict.fromkeys(w for i in range(len(self.queries)) for w in self.warnings_for(i)))

    def warnings_for(self, i: int) -> list[str]:
        """What query ``i`` names that cannot contribute: its scoring's warnings, and a highlight
        asked of a search without a BM25 part."""
        unlit = self.options.highlight and not _lexical(self.scorings[i])
        return [*self.scorings[i].warnings, *([NO_HIGHLIGHTS] if unlit else [])]

    def run(self, stop: Callable[[], bool] | None = None) -> list[list[Hit]]:
        """Each query's page of hits (see the module docstring). ``stop()``: asked between collapse
        rounds; True ends the work with :class:`~.paging.SearchStopped` (the server's timeout)."""
        if not self.queries:
            return []
        options = self.options
        ranked = search_collapsed(self.top, need=options.offset + options.k, field=options.collapse,
                                  limit=self.backend.live_count, stop=stop, taken=self.own_groups())
        if isinstance(ranked, HitColumns) and options.is_whole_list and not options.highlight:
            return ranked  # already the page: its Hit objects are built when a row is read (retrieval/hits.py)
        pages = [options.paged(hits) for hits in ranked]
        return self.highlighted(pages) if options.highlight else pages

    def why_not(self, i: int, shown: int) -> dict | None:
        """Where ``options.why_not`` stands in query ``i``'s whole answer (Elasticsearch's explain API
        asked of a ranking): its ``rank`` (None when the query cannot return it: filtered out,
        collapsed under a better hit, the query's own document, or past the first MAX_K), ``of``
        the hits ranked, its ``score`` and ``explain`` parts, and ``cut``: the hit at rank ``shown``
        (the last one the answer showed) with its own, so the parts that kept it out can be read."""
        target = self.options.why_not
        if target is None:
            return None
        if not self.backend.local.files.docstore.positions([target]):
            raise RequestError("why_not", f"unknown document id {target[:80]!r}")
        whole = dataclasses.replace(self.options, k=min(self.backend.live_count, MAX_K), offset=0, min_score=None,
                                    explain=True, facets=(), highlight=False, fields=None, metadata=True)
        hits = Plan(self.backend, [self.queries[i]], whole, [self.scorings[i]], self.fields).run()[0]
        at = {hit.id: rank for rank, hit in enumerate(hits, 1)}
        def said(rank: int) -> dict:
            hit = hits[rank - 1].to_json()
            return {"rank": rank, "id": hit["id"], "score": hit["score"], "explain": hit["explain"]}

        rank = at.get(target)
        out = {"id": target, "of": len(hits), **(said(rank) if rank else {"rank": None})}
        return {**out, "cut": said(min(shown, len(hits)))} if hits and (rank is None or rank > shown) else out

    def highlighted(self, pages: list[list[Hit]]) -> list[list[Hit]]:
        """Each hit with the offsets of its query's BM25 terms in its text (retrieval/highlight.py), for
        the queries whose search has a BM25 part."""
        from .highlight import offsets, terms

        texts = self.backend.local.query_texts(self.queries)
        out = []
        for hits, text, scoring in zip(pages, texts, self.scorings):
            if _lexical(scoring):
                wanted = terms(text)
                hits = [dataclasses.replace(h, highlights=offsets(h.text, wanted)) for h in hits]
            out.append(hits)
        return out

    def facets(self) -> list[dict[str, list[list]]]:
        """Per query, per ``options.facets`` field, ``[value, count]`` over its first
        ``options.facet_depth`` hits (Elasticsearch's terms aggregation over the candidates, under
        the same filters), most frequent first, ties by value's JSON text; hits without the field
        are not counted."""
        import json
        from collections import Counter

        if not self.options.facets or not self.queries:
            return [{} for _ in self.queries]
        out = []
        for hits in self.ranked(self.options.facet_depth):
            counts = {}
            for name in self.options.facets:
                values = Counter(json.dumps(h.metadata[name], sort_keys=True, ensure_ascii=False)
                                 for h in hits if name in h.metadata)
                counts[name] = [[json.loads(v), n] for v, n in sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))]
            out.append(counts)
        return out

    def own_groups(self) -> list[list] | None:
        """Per query, the collapse values of its own document and of its liked examples: a collapsed
        answer never lists them (GOOG's peers collapsed on a company field list no GOOGL)."""
        field = self.options.collapse
        if field is None:
            return None
        ids = [[d for d in [q.doc_id, *(e.doc_id for e in q.like)] if d] for q in self.queries]
        store = self.backend.local.files.docstore
        positions = store.positions([d for row in ids for d in row])
        docs = store.get(sorted(set(positions.values()))) if positions else {}
        return [[docs[positions[d]]["metadata"][field] for d in row
                 if d in positions and field in docs[positions[d]]["metadata"]] for row in ids]

    def top(self, fetch: int) -> list[list[Hit]]:
        """Each query's first ``fetch`` hits, re-ranked by the head when the options name one."""
        if self.options.rerank is None:
            return self.ranked(fetch)
        from .rerank import DEFAULT_DEPTH, rerank

        candidates = self.ranked(max(fetch, self.options.rerank_depth or DEFAULT_DEPTH))
        return rerank(self.backend, self.options.rerank, self.backend.local.raw_vectors(self.queries), candidates,
                      fetch)

    def ranked(self, fetch: int, *, columns: bool = False) -> list[list[Hit]]:
        """Each query's first ``fetch`` hits under its scoring; over several text fields, each
        field's (:meth:`per_field`) fused by each document's best (retrieval/fields.py).
        ``columns``: a single batch's hits may come back as the search's columns (retrieval/hits.py),
        whatever the scoring, so that fusion builds the hits it keeps and no others."""
        per_backend = self.per_field(fetch, columns=columns)
        if not self.fields:
            return per_backend[0]
        from .fields import fuse_max

        return fuse_max(per_backend, [b.field for b in self.fields], fetch)

    def per_field(self, fetch: int, *, columns: bool = False) -> list:
        """Per backend searched (each text field's, or the one), each query's first ``fetch`` hits:
        queries sharing a scoring run as one batch; a recipe's lists over several text fields
        normalised on one scale (retrieval/recipe_search.py)."""
        backends = self.fields or (self.backend,)
        groups: dict[int, tuple[Scoring, list[int]]] = {}  # queries sharing a mixture share its Scoring object
        for i, scoring in enumerate(self.scorings):
            groups.setdefault(id(scoring), (scoring, []))[1].append(i)
        per_backend: list[list] = [[[] for _ in self.queries] for _ in backends]
        for scoring, rows in groups.values():
            lists, whole = self._group(scoring, [self.queries[i] for i in rows], backends, fetch)
            if len(groups) == 1 and (whole or columns or self.fields):
                return lists  # one batch in the queries' order: kept as columns, rows built when read
            for out, hits in zip(per_backend, lists):
                for i, row in zip(rows, hits):
                    out[i] = row
        return per_backend

    def _group(self, scoring: Scoring, part: list[Query], backends: tuple, fetch: int) -> tuple[list, bool]:
        """(each backend's hits for the queries ``part`` sharing ``scoring``, whether those are
        already the batch's columns as the search gave them)."""
        from . import recipe_search

        o = self.options
        if scoring.mode == "recipe":
            return recipe_search.search_fields(backends, part, scoring.recipe, k=fetch, filters=o.filters,
                                               explain=o.explain), False
        mix = dict(scoring.recipe.mixture)  # the mixture's operators, as the relations' recipes weigh them
        if scoring.mode != "projection":
            part = [_with_relations(q, mix) for q in part]
        hybrid = {"hybrid": "rrf"} if scoring.mode == "rrf" else {}
        examples = [{e.doc_id for e, _ in q.examples() if e.doc_id} for q in part] \
            if any(q.by_examples for q in part) else []
        more = max(map(len, examples), default=0)  # example documents come back first: fetch past them, drop them
        lists = [b.search(part, k=fetch + more, filters=o.filters, explain=o.explain, checked=True, **hybrid)
                 for b in backends]
        if not more:
            return lists, True
        return [[[h for h in row if h.id not in ids][:fetch] for row, ids in zip(hits, examples)]
                for hits in lists], False


NO_HIGHLIGHTS = ("highlight marks the BM25 terms a hit matched: this search has no BM25 part (name a relation "
                 "whose recipe fuses BM25, or add hybrid)")


def _lexical(scoring: Scoring) -> bool:
    """Whether a scoring ranks with BM25 (rrf, or a recipe with a BM25 share)."""
    return scoring.mode == "rrf" or scoring.recipe.bm25 > 0


def plan(backend, queries: list[Query], options: SearchOptions) -> Plan:
    """Resolve each query's relation mixture with ``options`` once (retrieval/plan.py); a
    :class:`RequestError` naming ``relations`` or ``hybrid`` for a refused combination. The queries
    and filters are checked here (:meth:`~.search.Searcher.check_queries`: a QueryError or KeyError
    naming the bad value), so that :meth:`Plan.run` checks nothing again."""
    from .plan import PlanError, resolve

    searcher = backend.local
    resolved: dict[tuple, Scoring] = {}
    scorings = []
    for q in queries:
        key = (tuple(sorted(q.relations.items())), q.doc_id is None and not any(e.doc_id for e in q.like))
        if key not in resolved:
            try:
                resolved[key] = resolve(searcher.operators, q.relations, hybrid=options.hybrid,
                                        relational_share=options.hybrid_weight,
                                        metadata_fields=searcher.metadata_fields, text_query=key[1])
            except PlanError as e:
                raise RequestError("hybrid" if str(e).startswith("hybrid") else "relations", str(e)) from None
            except KeyError as e:
                raise RequestError("relations", e.args[0]) from None
        scorings.append(resolved[key])
    if options.rerank is not None and any(s.mode == "rrf" for s in scorings):
        raise RequestError("hybrid", "hybrid and rerank do not combine")
    options, backend, fields = _text_fields(backend, options)
    # each query as the run searches it (its scoring's operator mixture), checked here once: the run checks nothing
    searcher.check_queries([_with_relations(q, s.recipe.mixture) for q, s in zip(queries, scorings)], options.filters)
    return Plan(backend, list(queries), options, scorings, fields)


def _with_relations(query: Query, mixture) -> Query:
    """``query`` searching ``mixture``: itself when it already does (a batch of thousands copies nothing)."""
    return query if query.relations == mixture else dataclasses.replace(query, relations=dict(mixture))


def _text_fields(backend, options: SearchOptions) -> tuple[SearchOptions, object, tuple]:
    """The index's recorded collapse field applied (``collapse`` None: the manifest's ``collapse``,
    share classes of one issuer; False: none), and which text fields the plan searches: ``field``
    alone (its backend), or, on an index of several, every one fused (their backends)."""
    searcher = backend.local
    recorded = searcher.files.manifest.collapse
    if options.collapse is None and recorded and recorded in searcher.metadata_fields:
        options = dataclasses.replace(options, collapse=recorded)
    elif options.collapse is False:
        options = dataclasses.replace(options, collapse=None)
    names = searcher.text_fields
    if len(names) == 1:
        if options.field is not None:
            with blame("field"):
                searcher.for_field(options.field)  # another name: the error lists the index's one
        return options, backend, ()
    if backend is not searcher:
        raise RequestError("field", "the Elasticsearch backend searches an index of one text field; this index "
                                    f"has {', '.join(names)}: query it with the local backend")
    if options.field is not None:
        with blame("field"):
            return options, searcher.for_field(options.field), ()
    return options, backend, tuple(searcher.for_field(name) for name in names)


def run(backend, queries: list[Query], options: SearchOptions, *,
        stop: Callable[[], bool] | None = None) -> list[list[Hit]]:
    """:func:`plan`, then :meth:`Plan.run`. ``backend``: a FAISS :class:`~.search.Searcher` or an
    Elasticsearch one (retrieval/es_backend.py)."""
    return plan(backend, queries, options).run(stop)
