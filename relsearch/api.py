"""The Python API: open a published index, search it, add and delete documents.

``relsearch serve`` and the HTTP client are built on these functions; so can any application::

    import relsearch

    index = relsearch.open_index("demo-index")
    for hit in index.search("cloud software for enterprises", relations={"similar-company": 1.0}, k=5):
        print(hit.id, round(hit.score, 3), hit.metadata.get("sector"))
    index.add([{"id": "ACME", "text": "Acme makes anvils.", "sector": "Industrials"}])
    index.delete(["ACME"])

An :class:`Index` follows the index's ``current`` pointer: when a writer (this process or another) publishes
a new generation, the next call opens it, and a call already running finishes on the generation
it began with (its :class:`~relsearch.retrieval.search.Searcher` keeps that generation's files
open). The transformer loads once per :class:`Index` and is handed on to each new generation built
with the same encoder. Calls are thread-safe (one lock; the server batches queries instead of
running them side by side).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .encoder.threads import on_model_thread
from .indexer import mutations
from .indexer import records as rec
from .indexer import snapshots
from .indexer.filter_grammar import read_filters
from .retrieval import request as search_request
from .retrieval.inputs import MAX_K, MAX_RERANK_DEPTH, FilterValue, check_weights, is_utf8  # noqa: F401  (MAX_*: re-exported)
from .retrieval.paging import SearchStopped
from .retrieval.recipe import Recipe
from .retrieval.request import RequestError, SearchOptions, blame
from .retrieval.es_backend import EsQueryOptions, EsSearcher
from .retrieval.search import DEFAULT_WEIGHT, Example, Hit, Query, QueryError, Searcher, check_examples


@dataclass(frozen=True, kw_only=True)
class SearchRequest(SearchOptions):
    """One query: ``text`` or ``id`` (an indexed document, never returned itself), the relation
    mixture ``{name: weight}`` (default identity), and how to answer it: the options of
    :class:`~relsearch.retrieval.request.SearchOptions` (JSON types match exactly: ``true`` is not ``1``)."""

    text: str | None = None
    id: str | None = None
    relations: dict[str, float] = field(default_factory=lambda: {"identity": 1.0})
    like: Sequence[dict] = ()  # examples {"id": ...} or {"text": ...}, each with an optional "weight"
    unlike: Sequence[dict] = ()

    def query(self) -> Query:
        return Query(text=self.text, doc_id=self.id, relations=dict(self.relations), query_id=self.id,
                     like=examples(self.like, "like"), unlike=examples(self.unlike, "unlike"))

    def options(self) -> SearchOptions:
        return SearchOptions(**{f.name: getattr(self, f.name) for f in dataclasses.fields(SearchOptions)})


class Hits(list):
    """The hits of one search, a ``list`` of :class:`~relsearch.retrieval.search.Hit`, with
    ``warnings``: one line per filter operator that can never match in this index because its value's
    type never occurs in its field (``{"founded": {"gte": 1990}}`` where ``founded`` holds strings;
    negated, it keeps every document), with the quoted form to use (``Searcher.filter_warnings``);
    and one per part of a named relation that cannot apply to this query (retrieval/plan.py).
    ``mode`` and ``recipe``: what the query plan decided for this query's relation mixture
    (retrieval/plan.py ``Scoring``): ``dense``, ``recipe``, ``rrf`` or ``projection``, whose scale
    the scores are on, and the combined :class:`~relsearch.retrieval.recipe.Recipe` it ran (its
    ``mixture`` the dense query vector's operator weights)."""

    def __init__(self, hits: Iterable[Hit] = (), warnings: Iterable[str] = (), facets: dict | None = None, *,
                 mode: str | None = None, recipe: Recipe | None = None, why_not: dict | None = None):
        super().__init__(hits)
        self.warnings: list[str] = list(warnings)
        self.facets: dict[str, list[list]] = facets or {}  # field → [value, count] over the hits the facets count
        self.mode, self.recipe = mode, recipe
        self.why_not = why_not  # the request's why_not: retrieval/request.py Plan.why_not

    def warned(self, warnings: Iterable[str]) -> Hits:
        """These hits with ``warnings`` before their own."""
        return Hits(self, [*warnings, *self.warnings], self.facets, mode=self.mode, recipe=self.recipe,
                    why_not=self.why_not)


@dataclass(frozen=True)
class BatchAnswer:
    """What :meth:`Index.search_batch` returns: the generation that answered, and per request its
    hits or the exception that request alone raised: its :class:`RequestError`, a
    :class:`~relsearch.retrieval.paging.SearchStopped` (its deadline passed), or an unexpected
    error (the server answers 500 for that request only). Hits come as :class:`Hits`, whose
    ``warnings`` name filter operators that can never match."""

    generation: str
    results: list[list[Hit] | Exception]


def examples(items, name: str) -> tuple[Example, ...]:
    """``like`` / ``unlike`` examples from ``[{"id": ...} | {"text": ...}, "weight"?]`` (or
    :class:`Example` objects); a RequestError naming ``name`` for anything else."""
    if isinstance(items, (str, bytes, dict)) or not isinstance(items, Sequence):
        raise RequestError(name, f"{name} must be a list of examples {{\"id\": ...}} or {{\"text\": ...}}")
    out = []
    for item in items:
        if isinstance(item, Example):
            out.append(item)
            continue
        if not isinstance(item, dict) or set(item) - {"id", "text", "weight"} or ("id" in item) == ("text" in item):
            raise RequestError(name, f"each {name} example is {{\"id\": ...}} or {{\"text\": ...}}, with an "
                                     f"optional \"weight\"; got {str(item)[:60]!r}")
        weight = item.get("weight")
        out.append(Example(doc_id=item.get("id"), text=item.get("text"),
                           weight=DEFAULT_WEIGHT[name] if weight is None else weight))
    return tuple(out)


def check_request(req: SearchRequest) -> None:
    """Checks that need no index: exactly one of text / id / like examples, the options
    (retrieval/request.py), weights as ``relsearch query`` checks them (retrieval/inputs.py)."""
    if req.like or req.unlike:
        with blame("like"):
            check_examples(req.query())
    elif (req.text is None) == (req.id is None):
        raise RequestError("text", "give exactly one of 'text', 'id' or 'like' examples")
    if req.text is not None and not isinstance(req.text, str):
        raise RequestError("text", "'text' must be a string")
    if req.id is not None and (not isinstance(req.id, str) or not req.id):
        raise RequestError("id", "'id' must be a non-empty string")
    if req.id is not None and not is_utf8(req.id):
        raise RequestError("id", "query document id is not valid UTF-8")
    if req.text is not None and not req.text.strip():
        raise RequestError("text", "query text is empty")
    if req.text is not None and not is_utf8(req.text):
        raise RequestError("text", "query text is not valid UTF-8")
    SearchOptions.check(req)
    if not isinstance(req.relations, dict) or not req.relations:
        raise RequestError("relations", "give at least one relation, e.g. {\"identity\": 1}")
    if any(isinstance(w, bool) or not isinstance(w, (int, float)) for w in req.relations.values()):
        raise RequestError("relations", "relation weights must be numbers")
    with blame("relations"):
        check_weights(req.relations)


def validate_request(searcher, req: SearchRequest) -> None:
    """The one validation path of a search request, for ``relsearch query`` (TEXT or --id), the
    Python API and the server: :func:`check_request`, then against the opened index (relation
    names, filter and collapse fields, heads, a known ``id``). Raises :class:`RequestError` naming
    the request field; the CLI names the matching flag."""
    check_request(req)
    with blame("relations"):
        searcher.check(req.relations, {})
    SearchOptions.check_against(req, searcher)
    unknown = searcher.unknown_ids([req.query()])
    if unknown:
        field_name = "id" if req.id is not None else "like"
        raise RequestError(field_name, f"document id {sorted(unknown)[0][:80]!r} is not in the index", 404)


def check_score_texts(a, b) -> None:
    """``relsearch score``, :meth:`Index.score` and ``POST /score`` refuse alike: each text a
    non-empty, non-blank UTF-8 string (a RequestError naming ``a`` or ``b``)."""
    for name, text in (("a", a), ("b", b)):
        if not isinstance(text, str):
            raise RequestError(name, f"'{name}' must be a string")
        if not text.strip():
            raise RequestError(name, f"'{name}' is empty")
        if not is_utf8(text):
            raise RequestError(name, f"'{name}' is not valid UTF-8")


class Index:
    """A published index opened for search and updates (see the module docstring).

    ``model``: a bundle folder to query with (default: the index's own bundle); ``search_params``:
    FAISS search parameters overriding the ones tuned at build (indexer/ann.py). ``es``: searches
    answer from the index's Elasticsearch mirror (retrieval/es_backend.py; the local index still
    supplies the bundle, ``id`` vectors and stored documents), and writes re-mirror it.
    """

    def __init__(self, path: str | os.PathLike, model: str | None = None, *, search_params: dict | None = None,
                 es: EsQueryOptions | None = None):
        if es is not None and search_params:
            raise ValueError(f"search parameters {', '.join(sorted(search_params))} apply to the FAISS backend; "
                             "for Elasticsearch set num_candidates")
        self.path = os.fspath(path)
        self.model, self.search_params, self.es = model, search_params, es
        self._lock = threading.RLock()
        self._searcher: Searcher | None = None
        self._es_searcher: EsSearcher | None = None
        self.generations_opened = 0
        self.backend()  # a missing or damaged index fails here, not on the first query

    # ------------------------------------------------------------ generations

    def searcher(self) -> Searcher:
        """The Searcher of the generation ``path`` points to now (opened when it changed)."""
        with self._lock:
            current = self._searcher
            if current is not None and _published_root(self.path) == current.files.root:
                return current
            try:
                fresh = Searcher(self.path, self.model, search_params=self.search_params)
            except (OSError, ValueError) as e:
                if current is None:
                    raise
                # keep answering from the generation we have; the next call tries again
                import logging

                logging.getLogger(__name__).warning("cannot open the new generation of %s: %s", self.path, e)
                return current
            fresh.files.faiss  # noqa: B018 - load FAISS now, not inside the first query's latency
            if current is not None and current._encoder is not None and _encoder_of(current) == _encoder_of(fresh):
                fresh._encoder = current._encoder  # the model loads once per process, not per generation
            self._searcher = fresh
            self.generations_opened += 1
            return fresh

    def backend(self) -> Searcher | EsSearcher:
        """What searches answer from: :meth:`searcher`, or with ``es`` an EsSearcher over it (one per
        generation, sharing one Elasticsearch client)."""
        with self._lock:
            searcher = self.searcher()
            if self.es is None:
                return searcher
            if self._es_searcher is None or self._es_searcher.local is not searcher:
                client = None if self._es_searcher is None else self._es_searcher.client
                try:
                    self._es_searcher = EsSearcher(searcher, self.es, client=client)
                except QueryError as e:  # an index of several text fields
                    raise ValueError(str(e)) from None
            return self._es_searcher

    def _mirrors(self) -> tuple:
        """With ``es``, the mirror a write re-loads and swaps the alias of (indexer/es_mirror.py), in
        the index type the manifest recorded for it; else none."""
        if self.es is None:
            return ()
        from .indexer.es_mirror import EsTarget, mirrors_for

        recorded = self.searcher().files.manifest.backends.get("elasticsearch") or {}
        return mirrors_for(EsTarget(url=self.es.url, alias=self.es.index, credentials_file=self.es.credentials_file,
                                    ca_certs=self.es.ca_certs, index_type=recorded.get("index_type", "int8_hnsw")))

    @property
    def generation(self) -> str:
        """Name of the generation folder last opened (a newer one opens on the next call)."""
        return self._searcher.files.root.name

    @property
    def documents(self) -> int:
        """Live documents of that generation."""
        return self._searcher.files.manifest.counts.documents

    # ------------------------------------------------------------ reading

    def published(self) -> tuple[str, int]:
        """(generation, live documents) of the generation published now: the one the next search
        uses. Read from its manifest without waiting for a search in progress; the open one when
        the published one cannot be read (the next search keeps the open one then too)."""
        current = self._searcher
        root = _published_root(self.path)
        if current is not None and root == current.files.root:
            return current.files.root.name, current.files.manifest.counts.documents
        try:
            with open(os.path.join(root, "manifest.json"), "rb") as f:
                documents = json.loads(f.read(1 << 24))["counts"]["documents"]
            if isinstance(documents, int) and not isinstance(documents, bool):
                return os.path.basename(root), documents
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return self.generation, self.documents

    def search(self, text: str | None = None, *, id: str | None = None, relations: dict[str, float] | None = None,
               filters: dict[str, FilterValue | dict] | str | Sequence[str] | None = None, **options) -> Hits:
        """Hits for one query (see :class:`SearchRequest`), a list with ``warnings`` (:class:`Hits`:
        filter operators that can never match); raises :class:`RequestError`. ``options``: examples
        instead of text or id (``like=[{"id": ...} | {"text": ...}, "weight"?]`` and its other side,
        docs/how-a-query-runs.md, "Examples as a query") and the options
        :class:`~relsearch.retrieval.request.SearchOptions` declares, each with its default and help
        (``k``, ``offset``, ``collapse``: None collapses on the index's recorded
        ``--collapse-field``, False on nothing; ``facets``: counted into ``Hits.facets``; ...).
        ``filters``: the JSON form, or ``--filter`` text (a string, or a list AND-ed) read by the CLI's parser."""
        if isinstance(filters, (str, list, tuple)):
            with blame("filters"):
                filters = read_filters(filters)
        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(SearchRequest)})
        if unknown:
            raise RequestError(unknown[0], f"unknown search option {unknown[0]!r}; see SearchOptions")
        req = SearchRequest(text=text, id=id, relations=relations or {"identity": 1.0}, filters=filters or {}, **options)
        out = self.search_batch([req]).results[0]
        if isinstance(out, Exception):
            raise out
        return out

    def search_batch(self, requests: Sequence[SearchRequest], *,
                     deadlines: Sequence[float] | None = None) -> BatchAnswer:
        """Hits per request, or the exception of that request alone, all from one generation.

        Requests that share k + offset, collapse, filters, explain and re-ranking run as one
        ``Searcher.search`` call: one encoder pass for all their texts (micro-batching). A group
        that fails is answered again request by request, so a failure (a RequestError, or any
        other exception) stays with the request that raised it. ``deadlines`` (``time.monotonic()``
        per request): a request past its deadline is not searched, and a group stops between its
        collapse rounds once every request in it is past its deadline
        (:class:`~relsearch.retrieval.paging.SearchStopped` in its place). Runs on the process's
        model thread, whatever thread calls it (encoder/threads.py).
        """
        return on_model_thread(self._search_batch, requests, deadlines)

    def _search_batch(self, requests: Sequence[SearchRequest], deadlines: Sequence[float] | None) -> BatchAnswer:
        with self._lock:
            searcher = self.backend()  # every request of this batch runs on this generation
            out: list = [None] * len(requests)

            def late(i: int) -> bool:
                return deadlines is not None and time.monotonic() > deadlines[i]

            groups: dict[tuple, list[int]] = {}
            for i, req in enumerate(requests):
                try:
                    groups.setdefault(_group_key(searcher, req), []).append(i)
                except Exception as e:  # noqa: BLE001 - this request's own failure, answered alone
                    out[i] = _logged(e)
            for rows in groups.values():
                filters = requests[rows[0]].filters  # the group shares its filters
                warnings = _filter_warnings(searcher, filters)
                answers = self._answer(searcher, requests, rows, late)
                if filters and any(isinstance(r, list) and not r for r in answers):  # why a filtered answer is empty
                    warnings += _advice(searcher.no_match_warnings, filters)
                for i, result in zip(rows, answers):
                    out[i] = result if isinstance(result, Exception) else result.warned(warnings)
            return BatchAnswer(searcher.local.files.root.name, out)

    def filter_warnings(self, filters: dict | None) -> list[str]:
        """One line per operator of ``filters`` that can never match in the generation the next
        search uses (a value type its field never holds), with the quoted form to use; what
        :meth:`search` puts in ``Hits.warnings``. Raises :class:`RequestError` for an invalid filter."""
        with self._lock:
            searcher = self.searcher()
        with blame("filters"):
            return searcher.filter_warnings(filters)

    @staticmethod
    def _answer(searcher: Searcher, requests, rows: list[int], late) -> list:
        """The group ``rows``' results, each a hit list or that request's exception."""
        live = [i for i in rows if not late(i)]
        stopped = SearchStopped("the request's time ran out before it was searched")
        if not live:
            return [stopped] * len(rows)
        try:
            found = dict(zip(live, _run(searcher, [requests[i] for i in live],
                                        stop=lambda: all(late(i) for i in live))))
        except SearchStopped as e:
            return [e] * len(rows)
        except Exception:  # noqa: BLE001 - one request spoilt the group: answer each on its own
            found = {}
            for i in live:
                try:
                    found[i] = _run(searcher, [requests[i]], stop=lambda i=i: late(i))[0]
                except Exception as e:  # noqa: BLE001 - that request's failure alone
                    found[i] = _logged(e)
        return [found.get(i, stopped) for i in rows]

    def relations(self) -> list[dict]:
        """The bundle's relation operators and re-ranking heads: name, kind, description, metrics; an
        operator with a stored recipe (retrieval/recipe.py) also its ``recipe`` and ``whole_corpus``
        (dev/test MRR of the recipe, identity, BM25, hybrid and the operator alone), its ``transfer``
        figure when measured (bench/transfer.py) and ``losses``: where it scores below identity, BM25
        or the hybrid (retrieval/verdicts.py)."""
        from .retrieval.verdicts import relation_row

        bundle = self.searcher().bundle
        rows = [relation_row(n, op) for n, op in sorted(bundle.operators.items())]
        rows += [{"name": n, "kind": h.kind, "description": h.description, "metrics": h.info.get("metrics", {}),
                  "labels": list(h.labels), "positive": h.positive} for n, h in sorted(bundle.heads.items())]
        return rows

    def score(self, text_a: str, text_b: str) -> dict[str, float]:
        """cos(op(h_A), B) for every relation operator (``relsearch score``); a RequestError
        naming ``a`` or ``b`` for an empty text (:func:`check_score_texts`)."""
        from .retrieval.pair import score_pair

        check_score_texts(text_a, text_b)

        def scored():
            with self._lock:
                searcher = self.searcher()
                return score_pair(searcher.bundle, searcher.encoder, text_a, text_b)

        return on_model_thread(scored)

    def score_ids(self, a: str, b: str) -> dict[str, dict]:
        """How indexed document ``b`` stands to ``a`` under every relation of the bundle: per
        relation the whole score ``query --id a --relation R`` gives ``b`` (its parts in
        ``explain``), its ``rank`` among ``of`` hits, collapsing on nothing (Plan.why_not).
        A RequestError names ``ids`` for an unknown id or one asked of itself."""
        if not all(isinstance(i, str) and i for i in (a, b)) or a == b:
            raise RequestError("ids", "give two different document ids")
        names = sorted(self.searcher().bundle.operators)
        answer = self.search_batch([SearchRequest(id=a, relations={name: 1.0}, k=1, collapse=False, why_not=b)
                                    for name in names])
        out = {}
        for name, result in zip(names, answer.results):
            if isinstance(result, Exception):
                raise RequestError("ids", getattr(result, "message", str(result))) from None
            reason = result.why_not
            out[name] = {key: reason.get(key) for key in ("rank", "of", "score", "explain")}
        return out

    # ------------------------------------------------------------ writing

    def add(self, records: Iterable[dict], *, id_field: str = "id", text_field: str = "text",
            limits: rec.Limits = rec.DEFAULT_LIMITS) -> mutations.MutationReport:
        """Add documents (``{"id", "text", ...metadata}``); a known id replaces its document.

        All or nothing: one invalid record (the corpus rules of indexer/records.py) is a
        :class:`RequestError` naming it and nothing is written. The documents are encoded here and
        appended as one new generation, published atomically (indexer/mutations.py).
        """
        from .indexer.build import Block
        from .encoder.model import encode_texts

        # an index of several named texts (indexer/text_fields.py) reads each of them, as `relsearch index` did
        names = self.searcher().text_fields
        docs, parsed_docs, seen = [], [], set()
        for i, record in enumerate(records):
            parsed = _parse_record(i, record, id_field, text_field, limits, names if len(names) > 1 else ())
            if parsed.id in seen:
                raise RequestError(f"documents[{i}]", f"{rec.DUPLICATE_ID}: id {parsed.id[:80]!r} appears twice")
            seen.add(parsed.id)
            docs.append({"id": parsed.id, "text": parsed.text, "metadata": parsed.metadata})
            parsed_docs.append(parsed)
        if not docs:
            raise RequestError("documents", "no documents given")
        def encoded():  # with this process's model, on its thread; the writer lock serialises the publish
            with self._lock:
                encoder = self.searcher().encoder
                if len(names) > 1:
                    from .pipelines.index import encode_fields

                    first, extra, truncated = encode_fields(encoder, parsed_docs, names)
                    return encoder, Block(docs, first, tuple(extra)), truncated
                vectors, truncated = encode_texts(encoder, [d["text"] for d in docs])
                return encoder, Block(docs, vectors), truncated

        encoder, block, truncated = on_model_thread(encoded)
        run = {"read": len(docs), "indexed": len(docs), "rejected": 0, "truncated": truncated,
               "input": {"path": "relsearch API"}}
        try:  # the encoder is checked under the writer lock, against the generation appended to
            return mutations.append(self.path, [block], n=len(docs), run=run, encoder=encoder.identity,
                                    mirrors=self._mirrors())
        except mutations.EncoderMismatchError as e:
            raise RequestError("documents", str(e), 409) from None

    def delete(self, ids: Iterable[str]) -> mutations.MutationReport:
        """Delete documents by id as one new generation; unknown ids are reported, not an error."""
        ids = [str(i) for i in ids]
        if not ids:
            raise RequestError("ids", "no ids given")
        return mutations.delete(self.path, ids, mirrors=self._mirrors())

    def compact(self) -> mutations.MutationReport:
        """Rebuild from the live documents (drops tombstones); see ``relsearch compact``."""
        return mutations.compact(self.path, mirrors=self._mirrors())

    def snapshots(self, keep: int | None = None) -> list[snapshots.Snapshot]:
        """The retained generations, newest (the published one) first; see ``relsearch snapshots``.
        ``keep``: retain that many from now on (this index's later writes too; older ones go now)."""
        if keep is not None:
            snapshots.set_keep(self.path, keep)
        return snapshots.list_snapshots(self.path)

    def rollback(self, to: str | None = None) -> str:
        """Publish a retained generation again (default: the previous one); returns its name. Searches
        that began on the current generation finish on it; the next ones use the restored one."""
        return snapshots.rollback(self.path, to)[0]


def open_index(path: str | os.PathLike, model: str | None = None, *, search_params: dict | None = None,
               es: EsQueryOptions | None = None) -> Index:
    """Open the published index at ``path`` (``relsearch index ... --index PATH``); ``es``: search
    its Elasticsearch mirror (:class:`Index`)."""
    return Index(path, model, search_params=search_params, es=es)


# ---------------------------------------------------------------- helpers


def _published_root(path: str) -> Path | None:
    """The generation folder ``path`` publishes now (its ``current`` pointer), None when unreadable."""
    from .indexer import store

    try:
        return store.current_generation(path)
    except (OSError, ValueError):
        return None


def _encoder_of(searcher: Searcher) -> tuple:
    enc = searcher.files.manifest.encoder
    return (searcher.bundle.encoder.get("model"), enc.get("weights_sha256"), enc.get("pooling"), enc.get("max_length"),
            searcher.files.manifest.precision)  # a generation encoded in another dtype gets its own encoder


def _group_key(searcher: Searcher, req: SearchRequest) -> tuple:
    """Validate ``req`` against the index; the key of the requests it can share a search with."""
    validate_request(searcher, req)
    with blame("relations"):
        projection = searcher.projection_of([req.query()])
    return (projection, *req.options().group_key())


def _filter_warnings(searcher: Searcher, filters) -> list[str]:
    """``Searcher.filter_warnings`` for a validated request (:func:`_advice`)."""
    return _advice(searcher.filter_warnings, filters)


def _advice(warnings, filters) -> list[str]:
    """``warnings(filters)``; advice only, so a failure here is no warning (the search itself
    reports a bad filter)."""
    try:
        return warnings(filters)
    except Exception:  # noqa: BLE001
        logging.getLogger(__name__).debug("filter warnings failed", exc_info=True)
        return []


def _logged(e: Exception) -> Exception:
    """``e`` as a request's answer; an unexpected one (not a RequestError or a stop) is logged with
    its traceback here, since only its type reaches the client."""
    if not isinstance(e, (RequestError, SearchStopped)):
        logging.getLogger(__name__).error("a search request failed", exc_info=e)
    return e


def _run(searcher: Searcher, requests: list[SearchRequest], stop=None) -> list[list[Hit]]:
    """One search for requests sharing a group key (SearchOptions.shared), each then its own page."""
    with blame("query"):
        plan = search_request.plan(searcher, [r.query() for r in requests], requests[0].options().shared())
        ranked = plan.run(stop=stop)
        facets = plan.facets()
        reasons = [plan.why_not(i, r.offset + r.k) for i, r in enumerate(requests)]
    return [Hits(r.options().paged(hits), plan.warnings_for(i), counts, mode=scoring.mode, recipe=scoring.recipe,
                 why_not=why_not)
            for i, (r, hits, counts, scoring, why_not) in enumerate(zip(requests, ranked, facets, plan.scorings, reasons))]


def _parse_record(i: int, record, id_field: str, text_field: str, limits: rec.Limits,
                  text_fields: tuple[str, ...] = ()) -> rec.Record:
    """A request's document → Record through the corpus parser, so the API accepts what `relsearch index` does."""
    if not isinstance(record, dict):
        raise RequestError(f"documents[{i}]", f"{rec.NOT_OBJECT}: a document is a JSON object")
    try:
        raw = json.dumps(record, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (ValueError, UnicodeEncodeError) as e:
        raise RequestError(f"documents[{i}]", f"{rec.INVALID_JSON}: {e}") from None
    parsed = rec.parse_line(i + 1, raw, id_field=id_field, text_field=text_field, limits=limits, text_fields=text_fields)
    if isinstance(parsed, rec.Rejection):
        raise RequestError(f"documents[{i}]", f"{parsed.reason}: {parsed.detail}")
    return parsed
