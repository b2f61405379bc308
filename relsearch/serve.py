"""``relsearch serve``: the Python API (relsearch/api.py) over HTTP, with FastAPI and uvicorn.

One process holds one :class:`~relsearch.api.Index` per served index (the model loads once).
Concurrent search requests wait in an asyncio queue; one worker per index takes everything that
queued up while the previous batch ran (up to ``ServeLimits.micro_batch`` queries) and answers
it with one ``Index.search_batch`` call, so one encoder pass serves many clients. The torch work
of every index runs on the process's one model thread (encoder/threads.py), so the event loop keeps
accepting requests and the kernels keep one thread pool. Mutations run in a separate writer thread
(their encoding on the model thread) and publish a new generation; every batch re-checks the index symlink, so
generations published here or by another process are picked up without a restart.

Only this server's own names and pages may call it: a Host it does not answer to is 421 (DNS
rebinding), a request from a page of another origin 403 (Origin, Sec-Fetch-Site), a body not
declared ``application/json`` 415 (what a page may send without a CORS preflight); docs/guarantees.md
("Serving: who can call") has the threat model.

Errors are JSON ``{"error": {"field": ..., "message": ...}}`` with a 4xx status naming the
request field (or header) at fault; an unexpected failure is a 500 with no traceback (it is logged here). A
request's failure inside a micro-batch pass stays with that request: the others in the pass are
answered. Each request has a cost in hits (:func:`request_cost`), bounded per request and per pass;
a request whose time ran out is not searched further (its deadline is checked before the pass and
between collapse rounds), so a timeout stops the work, not only the answer.
"""
from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import os
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NamedTuple

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException

from . import explorer
from .api import MAX_K, MAX_RERANK_DEPTH, Index, RequestError, SearchRequest
from .encoder.threads import model_executor
from .retrieval.paging import SearchStopped, collapse_depth
from .retrieval.rerank import DEFAULT_DEPTH as RERANK_DEFAULT_DEPTH

log = logging.getLogger("relsearch.serve")
access_log = logging.getLogger("relsearch.access")

API_KEY_ENV = "RELSEARCH_API_KEY"
# no data behind them: the explorer page and its files ask for the key themselves (relsearch/explorer.py)
OPEN_PATHS = frozenset({"/health", "/docs", "/openapi.json", "/docs/oauth2-redirect", *explorer.PAGE_PATHS})


@dataclass(frozen=True, kw_only=True)
class ServeLimits:
    """Per-request limits; the defaults are documented in README ("Serve")."""

    max_body_bytes: int = 4 << 20  # request body (413 beyond)
    max_batch: int = 256  # queries in one /search/batch request
    max_documents: int = 1000  # documents in one /documents request
    max_text_chars: int = 100_000  # characters of a query text
    max_hits: int = 100_000  # cost of one request (request_cost: candidates x 2 with explain); 422 beyond
    max_response_bytes: int = 32 << 20  # JSON of one search response; 422 naming k beyond
    timeout_s: float = 30.0  # a search or score request waiting longer gets 503, and its work stops
    body_timeout_s: float = 10.0  # the whole body must arrive within this after the request starts (408)
    micro_batch: int = 64  # queries per encoder pass across concurrent requests
    batch_wait_ms: float = 0.0  # always wait this long for more requests before a pass (tests)
    # Wait up to this long for as many queries as the previous pass answered: clients that pass
    # answered are sending their next request, and without the wait the next pass would start with
    # the first of them alone (passes alternating between a few and many queries).
    refill_wait_ms: float = 5.0


FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Text = Annotated[str, Field(min_length=1, max_length=ServeLimits.max_text_chars)]


class _Body(BaseModel):
    # strict: JSON types as the Python API checks them ("k": true and "k": "5" are refused, not coerced)
    model_config = ConfigDict(extra="forbid", strict=True)


class ErrorDetail(BaseModel):
    field: str | None = Field(description="The request field at fault (null when none is).")
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


def _errors(*statuses: int) -> dict:
    """OpenAPI ``responses`` for these statuses, each with the real error body."""
    said = {400: "Invalid JSON", 401: "Missing or wrong API key", 404: "Unknown index or document id",
            403: "Sent by a page of another origin (Origin, Sec-Fetch-Site)",
            408: "The body did not arrive in time (--body-timeout)", 409: "Documents for another encoder",
            413: "Request body too large (--max-body-bytes)", 415: "The body is not declared application/json",
            421: "The Host header names another server (--allowed-host)",
            422: "Invalid request: the field at fault is named (types, ranges, unknown names, cost and response "
                 "bounds)", 503: "Timed out (--timeout); the work stopped"}
    return {s: {"model": ErrorBody, "description": said[s]} for s in statuses}


SEARCH_ERRORS = _errors(400, 401, 403, 404, 408, 413, 415, 421, 422, 503)
WRITE_ERRORS = _errors(400, 401, 403, 404, 408, 409, 413, 415, 421, 422)
READ_ERRORS = _errors(401, 403, 404, 421, 422)
ONE_OF_TEXT_OR_ID = {"oneOf": [{"required": ["text"]}, {"required": ["id"]}, {"required": ["like"]}]}
Document = Annotated[dict[str, Any], WithJsonSchema({
    "type": "object", "required": ["id", "text"], "additionalProperties": True,
    "description": "A document: id, text, and any other fields as metadata (the rules of relsearch index).",
    "properties": {"id": {"anyOf": [{"type": "string", "minLength": 1, "pattern": "\\S"}, {"type": "integer"}]},
                   "text": {"type": "string", "minLength": 1, "pattern": "\\S"}}})]

_SCALAR = {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]}
_SCALARS = {"type": "array", "minItems": 1, "items": _SCALAR}
_OPERATORS = {"type": "object", "minProperties": 1, "additionalProperties": False, "properties": {
    **{op: _SCALAR for op in ("eq", "ieq", "gt", "gte", "lt", "lte", "has")}, "in": _SCALARS,
    "exists": {"type": "boolean"}, "null": {"type": "boolean", "description": "true: missing or null"},
    "not": {"type": "object", "description": "Operators, each negated (documents without the field included)."}}}
_FILTER_LIST = {"type": "array", "minItems": 1, "items": {"type": "object", "description": "A filter (this same form)."}}
# the JSON schema /docs shows: the grammar of indexer/filters.py (nesting of $any / $all is not spelt out)
Filters = Annotated[dict[str, Any], WithJsonSchema({
    "type": "object", "description": (
        'Metadata filters, AND-ed: {field: value} (exact; JSON types match exactly: true is not 1, "1" is not 1) or '
        '{field: {operator: value}} with eq, ieq, gt, gte, lt, lte, in (a list), has, exists, null (true: missing or '
        'null), not ({operator: value} negated); "$any": [filters] matches at least one of them, "$all": [filters] '
        'every one (see indexer/filters.py).'),
    "properties": {"$any": _FILTER_LIST, "$all": _FILTER_LIST},
    "additionalProperties": {"anyOf": [_SCALAR, _OPERATORS]},
    "examples": [{"gics_sector": {"in": ["Energy", "Utilities"]}, "founded": {"not": {"null": True}}},
                 {"$any": [{"gics_sector": "Energy"}, {"founded": {"lt": "1950"}}]}]})]


class ExampleBody(_Body):
    id: str | None = Field(None, min_length=1, description="An indexed document (never returned itself).")
    text: Text | None = Field(None, description="Or a text.")
    weight: FiniteFloat = Field(1.0, gt=0, description="The example's weight.")


_EXAMPLES = ("Query by examples instead of text or id (Qdrant's recommend): each example is moved by the relation "
             "mixture, then q = Σ w·q(like) − Σ w·q(unlike); the example documents never come back.")


class QueryOptions(_Body):
    index: str | None = Field(None, description="Served index name (default: the first --index).")
    relations: dict[str, FiniteFloat] = Field(default_factory=lambda: {"identity": 1.0},
                                              description="Relation mixture {name: weight}; see GET /relations.")
    k: int = Field(10, ge=1, le=MAX_K)
    offset: int = Field(0, ge=0, le=MAX_K - 1)
    min_score: FiniteFloat | None = Field(None, description="Drop hits scoring below this.")
    collapse: str | None = Field(None, min_length=1, description="Keep the best hit per value of this metadata field.")
    # typed here only as an object: its grammar ($any / $all lists, operator objects, "in" lists) is
    # checked once, by the API's validation (indexer/filters.py), as for relsearch query and Index.search
    filters: Filters = Field(default_factory=dict)
    explain: bool = Field(False, description="Add every operator's own score to each hit.")
    rerank: str | None = Field(None, description="A re-ranking head of the bundle, e.g. pu-head.")
    rerank_depth: int | None = Field(None, ge=1, le=MAX_RERANK_DEPTH)
    hybrid: Literal["rrf", "weighted"] | None = Field(None, description="Fuse with BM25 on the query text: "
                                                      "rrf (reciprocal rank fusion) or weighted.")
    hybrid_weight: FiniteFloat | None = Field(None, ge=0, le=1, description="With hybrid weighted: the relational "
                                        "list's share of the min-max normalised scores (BM25 gets the rest; 0.5).")
    fields: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None, max_length=1000, description="The metadata fields each hit carries, in this order (like Elasticsearch's "
        "_source filtering); default: every field.")
    metadata: bool = Field(True, description="false: hits carry no metadata (\"metadata\": {}).")

    def request(self, text: str | None, doc_id: str | None, relations: dict | None = None,
                like: list[ExampleBody] = (), unlike: list[ExampleBody] = ()) -> SearchRequest:
        return SearchRequest(text=text, id=doc_id, relations=relations or self.relations, k=self.k,
                             like=[e.model_dump(exclude_none=True) for e in like],
                             unlike=[e.model_dump(exclude_none=True) for e in unlike],
                             offset=self.offset, min_score=self.min_score, collapse=self.collapse,
                             filters=self.filters, explain=self.explain, rerank=self.rerank,
                             rerank_depth=self.rerank_depth, hybrid=self.hybrid, hybrid_weight=self.hybrid_weight,
                             fields=self.fields, metadata=self.metadata)


class SearchBody(QueryOptions):
    model_config = ConfigDict(json_schema_extra=ONE_OF_TEXT_OR_ID)
    text: Text | None = Field(None, description="Query text (or give id).")
    id: str | None = Field(None, min_length=1, description="An indexed document to query with.")
    like: list[ExampleBody] = Field(default_factory=list, max_length=64, description=_EXAMPLES)
    unlike: list[ExampleBody] = Field(default_factory=list, max_length=64, description="Examples to push away from.")


class BatchQuery(_Body):
    model_config = ConfigDict(json_schema_extra=ONE_OF_TEXT_OR_ID)
    text: Text | None = None
    id: str | None = Field(None, min_length=1)
    like: list[ExampleBody] = Field(default_factory=list, max_length=64, description=_EXAMPLES)
    unlike: list[ExampleBody] = Field(default_factory=list, max_length=64)
    relations: dict[str, FiniteFloat] | None = Field(None, description="Overrides the batch's relations.")


class BatchBody(QueryOptions):
    queries: list[BatchQuery] = Field(min_length=1, description="Queries sharing the other options.")


class ScoreBody(_Body):
    index: str | None = None
    a: Text
    b: Text


class DocumentsBody(_Body):
    index: str | None = None
    documents: list[Document] = Field(min_length=1, description='{"id", "text", ...metadata} each.')


class DeleteBody(_Body):
    index: str | None = None
    ids: list[str] = Field(min_length=1)


# ---------------------------------------------------------------- micro-batching


def request_cost(req: SearchRequest) -> int:
    """What one query may cost, in hits: the candidates it can fetch (``k + offset``; with
    ``rerank`` at least ``rerank_depth``; with ``collapse`` the widened depth of
    retrieval/paging.py ``collapse_depth``), doubled with ``explain``. Bounded per request and per
    micro-batch pass by ``ServeLimits.max_hits``."""
    candidates = req.k + req.offset
    if req.collapse is not None:
        candidates = collapse_depth(candidates)
    if req.rerank is not None:
        candidates = max(candidates, req.rerank_depth or RERANK_DEFAULT_DEPTH)
    return candidates * (2 if req.explain else 1)


class Pending(NamedTuple):
    """One HTTP request's queries waiting for a pass."""

    requests: list[SearchRequest]
    future: asyncio.Future | None
    deadline: float = math.inf  # time.monotonic() after which nobody waits for the answer
    cost: int = 0  # Σ request_cost


class Batcher:
    """Queues search requests for one index and answers them in batches on the model thread."""

    def __init__(self, index: Index, limits: ServeLimits, metrics: Metrics):
        self.index, self.limits, self.metrics = index, limits, metrics
        self.queue: asyncio.Queue = asyncio.Queue()
        self.held: Pending | None = None  # an item over the last pass's budget: it starts the next pass
        self.thread = model_executor()  # torch, FAISS, SQLite reads: one thread for every index (encoder/threads.py)

    async def search(self, requests: list[SearchRequest], deadline: float = math.inf):
        future = asyncio.get_running_loop().create_future()
        await self.queue.put(Pending(requests, future, deadline, sum(map(request_cost, requests))))
        return await future

    async def call(self, fn: Callable, *args, deadline: float = math.inf):
        """Run ``fn`` on the model thread, after the batch in progress; not at
        all when ``deadline`` passed while it waited."""
        def when_wanted():
            if time.monotonic() > deadline:
                raise SearchStopped("the request's time ran out before it ran")
            return fn(*args)

        return await asyncio.get_running_loop().run_in_executor(self.thread, when_wanted)

    async def gather(self, expected: int) -> list[Pending]:
        """The queued items of the next pass: whatever queued up, and up to ``refill_wait_ms`` more
        waiting until ``expected`` queries are there; at most ``micro_batch`` queries and
        ``max_hits`` of cost (a first item above either still runs, alone)."""
        loop = asyncio.get_running_loop()
        items = [self.held if self.held is not None else await self.queue.get()]
        self.held = None
        if self.limits.batch_wait_ms > 0:
            await asyncio.sleep(self.limits.batch_wait_ms / 1000)
        size, cost = len(items[0].requests), items[0].cost
        deadline = loop.time() + self.limits.refill_wait_ms / 1000
        while size < self.limits.micro_batch:
            if not self.queue.empty():
                item = self.queue.get_nowait()
            elif size >= expected or loop.time() >= deadline:
                break
            else:
                try:
                    item = await asyncio.wait_for(self.queue.get(), deadline - loop.time())
                except asyncio.TimeoutError:
                    break
            if cost + item.cost > self.limits.max_hits:
                self.held = item
                break
            items.append(item)
            size += len(item.requests)
            cost += item.cost
        return items

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        expected = 1
        while True:
            items = await self.gather(expected)
            items = [item for item in items if item.future is None or not item.future.done()]
            if not items:
                continue
            flat = [r for item in items for r in item.requests]
            deadlines = [item.deadline for item in items for _ in item.requests]
            expected = len(flat)
            self.metrics.observe_batch(len(flat))
            try:
                answer = await loop.run_in_executor(
                    self.thread, functools.partial(self.index.search_batch, flat, deadlines=deadlines))
            except Exception as e:  # noqa: BLE001 - delivered to every waiting request (a 500 each)
                for item in items:
                    if not item.future.done():
                        item.future.set_exception(e)
                continue
            start = 0
            for item in items:
                if not item.future.done():  # a request that timed out is no longer waiting
                    item.future.set_result((answer.generation, answer.results[start:start + len(item.requests)]))
                start += len(item.requests)


# ---------------------------------------------------------------- metrics

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    """Counters and histograms, rendered in the Prometheus text format (version 0.0.4)."""

    def __init__(self):
        self.requests: Counter = Counter()  # (path, status) → count
        self.latency: dict[str, list[int]] = defaultdict(lambda: [0] * (len(LATENCY_BUCKETS) + 1))
        self.latency_sum: Counter = Counter()
        self.batches = [0] * (len(BATCH_BUCKETS) + 1)
        self.batch_queries = 0

    def observe_request(self, path: str, status: int, seconds: float) -> None:
        self.requests[(path, status)] += 1
        self.latency[path][_bucket(LATENCY_BUCKETS, seconds)] += 1
        self.latency_sum[path] += seconds

    def observe_batch(self, size: int) -> None:
        self.batches[_bucket(BATCH_BUCKETS, size)] += 1
        self.batch_queries += size

    def render(self, indexes: dict[str, Index]) -> str:
        lines = ["# HELP relsearch_requests_total HTTP requests by path and status.",
                 "# TYPE relsearch_requests_total counter"]
        lines += [f'relsearch_requests_total{{path="{p}",status="{s}"}} {n}' for (p, s), n in sorted(self.requests.items())]
        lines += ["# HELP relsearch_request_seconds HTTP request latency.", "# TYPE relsearch_request_seconds histogram"]
        for path, counts in sorted(self.latency.items()):
            lines += _histogram("relsearch_request_seconds", f'path="{path}",', LATENCY_BUCKETS, counts,
                                self.latency_sum[path])
        lines += ["# HELP relsearch_batch_queries Queries answered per encoder pass (micro-batching).",
                  "# TYPE relsearch_batch_queries histogram"]
        lines += _histogram("relsearch_batch_queries", "", BATCH_BUCKETS, self.batches, self.batch_queries)
        lines += ["# HELP relsearch_index_documents Live documents of the generation served.",
                  "# TYPE relsearch_index_documents gauge"]
        lines += [f'relsearch_index_documents{{index="{n}",generation="{i.generation}"}} {i.documents}'
                  for n, i in indexes.items()]
        lines += ["# HELP relsearch_generations_opened_total Index generations opened since start.",
                  "# TYPE relsearch_generations_opened_total counter"]
        lines += [f'relsearch_generations_opened_total{{index="{n}"}} {i.generations_opened}' for n, i in indexes.items()]
        return "\n".join(lines) + "\n"


def _bucket(bounds: tuple, value: float) -> int:
    return next((i for i, b in enumerate(bounds) if value <= b), len(bounds))


def _histogram(name: str, labels: str, bounds: tuple, counts: list[int], total: float) -> list[str]:
    out, running = [], 0
    for bound, n in zip([*bounds, math.inf], counts):
        running += n
        out.append(f'{name}_bucket{{{labels}le="{"+Inf" if bound == math.inf else bound}"}} {running}')
    return out + [f"{name}_sum{{{labels.rstrip(',')}}} {total:.6f}", f"{name}_count{{{labels.rstrip(',')}}} {running}"]


# ---------------------------------------------------------------- who may call: Host, Origin, Content-Type

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
DEFAULT_PORTS = {"http": 80, "https": 443}


def split_host(value: str) -> tuple[str, int | None] | None:
    """A Host header or ``--allowed-host`` value → (name lower-cased, IPv6 in brackets; port or
    None); None when it is not ``NAME``, ``NAME:PORT``, ``[IPV6]`` or ``[IPV6]:PORT``."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]") + 1
        name, rest = value[:end], value[end:] if end else ""
    else:
        colon = value.find(":")
        name, rest = (value, "") if colon < 0 else (value[:colon], value[colon:])
    port = rest[1:] if rest.startswith(":") else None
    if (not name.strip("[]") or any(c in name for c in "/@?#\\ ") or (rest and port is None)
            or (port is not None and not (port.isascii() and port.isdigit() and int(port) <= 65535))):
        return None
    return name, None if port is None else int(port)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
        return True
    except ValueError:
        return False


OWN_PORT = -1  # in Hosts: the port the request came in on (create_app does not know the port it will get)


@dataclass(frozen=True)
class Hosts:
    """The names a request's ``Host`` may give. A browser page on attacker.example whose name is
    made to resolve to this machine (DNS rebinding) sends ``Host: attacker.example``: refusing
    names the server does not answer to keeps such a page from reading or writing the indexes.
    ``names``: (name, port; None: any port, OWN_PORT: the server's own). ``any_ip_port``: with a
    wildcard bind (0.0.0.0, ::), any IP address literal on this port is accepted too: the machine's
    own addresses are not listed, and a literal address is never a rebound name (the browser
    connects to that very address)."""

    names: frozenset[tuple[str, int | None]]
    any_ip_port: int | None = None  # None: no address literal beyond the names

    @classmethod
    def bound(cls, host: str, port: int | None, allowed: Iterable[str] = ()) -> Hosts:
        """The names of a server bound to ``host:port`` (port None: the port it gets), plus
        ``allowed`` (``--allowed-host NAME``, any port, or ``NAME:PORT``: e.g. the name a reverse
        proxy forwards, or a tunnel's local port)."""
        host, port = host.strip().lower(), OWN_PORT if port is None else port
        wildcard = host in ("0.0.0.0", "::", "")
        if wildcard or host == "localhost" or _is_ip(host) and ipaddress.ip_address(host).is_loopback:
            names = set(LOOPBACK_NAMES)  # a loopback (or every) address: the names that reach it from here
        else:
            names = {f"[{host}]" if ":" in host else host}
        out = {(name, port) for name in names}
        for entry in allowed:
            bare_ipv6 = entry.count(":") > 1 and not entry.strip().startswith("[")
            parsed = split_host(f"[{entry.strip()}]" if bare_ipv6 else entry)
            if parsed is None:
                raise ValueError(f"--allowed-host {entry!r} is not NAME or NAME:PORT (IPv6 as [ADDRESS])")
            out.add(parsed)
        return cls(frozenset(out), port if wildcard else None)

    @classmethod
    def loopback(cls) -> Hosts:
        """create_app's default: the loopback names, on the port the server listens on."""
        return cls.bound("127.0.0.1", None)

    def named(self, name: str, port: int, own: int | None = None) -> bool:
        """True when ``name:port`` is one of the names (not merely an address literal); ``own``:
        the port the server listens on (None: unknown, any)."""
        return any(n == name and _port_matches(p, port, own) for n, p in self.names)

    def accepts(self, name: str, port: int, own: int | None = None) -> bool:
        return self.named(name, port, own) or (self.any_ip_port is not None and _is_ip(name)
                                               and _port_matches(self.any_ip_port, port, own))

    def describe(self, own: int | None = None) -> str:
        def shown(name, port):
            port = own if port == OWN_PORT else port
            return f"{name}:{port}" if port is not None else name

        return ", ".join(sorted(shown(n, p) for n, p in self.names)) + (
            f", any IP address on port {own if self.any_ip_port == OWN_PORT else self.any_ip_port}"
            if self.any_ip_port is not None else "")


def _port_matches(wanted: int | None, port: int, own: int | None) -> bool:
    return wanted is None or wanted == port or (wanted == OWN_PORT and own in (None, port))


def _refuse_host(scope, headers: list[tuple[bytes, bytes]], hosts: Hosts) -> JSONResponse | None:
    """421 unless every Host header names this server (none at all: an HTTP/1.0 client, never a browser)."""
    default = DEFAULT_PORTS.get(scope.get("scheme", "http"), 80)
    own = (scope.get("server") or (None, None))[1]
    for key, value in headers:
        if key != b"host":
            continue
        text = value.decode("latin-1")
        parsed = split_host(text)
        if parsed is None or not hosts.accepts(parsed[0], parsed[1] or default, own):
            return _error(421, "host", f"Host {_printable(text, 100)!r} is not a name this server answers to "
                                       f"({hosts.describe(own)}); name it with relsearch serve --allowed-host")
    return None


def _refuse_cross_site(scope, headers: dict[bytes, bytes], hosts: Hosts) -> JSONResponse | None:
    """403 for a request a page of another origin made: its ``Origin`` is not this server's, or,
    without one, its ``Sec-Fetch-Site`` is cross-site or same-site (another port or subdomain is
    another origin). The explorer page's own requests are same-origin; a link followed from
    another site (a GET navigation) still opens a page."""
    origin = headers.get(b"origin", b"").decode("latin-1")
    if b"origin" in headers and not _own_origin(scope, origin, headers.get(b"host", b"").decode("latin-1"), hosts):
        return _error(403, "origin", f"Origin {_printable(origin, 100)!r} is not this server's: pages of other "
                                     "origins may not call this API")
    site = headers.get(b"sec-fetch-site", b"").decode("latin-1").lower()
    navigation = headers.get(b"sec-fetch-mode", b"").lower() == b"navigate" and scope["method"] in ("GET", "HEAD")
    if site in ("cross-site", "same-site") and not navigation:
        return _error(403, "sec-fetch-site", f"a {site} request (Sec-Fetch-Site): pages of other origins may not "
                                             "call this API")
    return None


def _own_origin(scope, origin: str, host: str, hosts: Hosts) -> bool:
    """True when ``origin`` (scheme://host[:port], as browsers send it) is this server: the host the
    request names (the same netloc; a TLS proxy in front changes the scheme, not the name), or a
    name it is bound to or allowed (a proxy that rewrites Host). "null" (a sandboxed or file: page) never is."""
    scheme, sep, netloc = origin.strip().lower().partition("://")
    if not sep or scheme not in DEFAULT_PORTS or not netloc:
        return False
    if netloc == host.strip().lower():
        return True
    parsed = split_host(netloc)
    own = (scope.get("server") or (None, None))[1]
    return parsed is not None and hosts.named(parsed[0], parsed[1] or DEFAULT_PORTS[scheme], own)


def _refuse_media_type(value: bytes | None) -> JSONResponse | None:
    """415 unless the body is declared ``application/json`` (optionally ``; charset=utf-8``). A
    page of another origin can send text/plain or a form without asking (no CORS preflight),
    never application/json: reading every body as JSON would let it write."""
    text = (value or b"").decode("latin-1")
    media, *params = [part.strip() for part in text.split(";")]
    if media.lower() != "application/json":
        return _error(415, "content-type", f"request bodies are JSON: send Content-Type: application/json, got "
                                           f"{_printable(text, 80)!r}" if text else
                                           "request bodies are JSON: send Content-Type: application/json")
    for param in params:
        name, _, charset = param.partition("=")
        if name.strip().lower() == "charset" and charset.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return _error(415, "content-type", f"JSON bodies are UTF-8, got charset {_printable(charset, 40)!r}")
    return None


_INLINE_SCRIPT = re.compile(rb"<script(?![^>]*\bsrc=)[^>]*>(.*?)</script>", re.S | re.I)


def page_csp(html: bytes) -> str:
    """The Content-Security-Policy of an HTML page that sets none itself (/docs and its OAuth2
    redirect: Swagger UI from this server): scripts from here and the page's own inline scripts
    (by their hashes, so no other inline script runs), styles from here and inline (Swagger UI
    styles elements inline), images from here or data: URLs (its CSS icons), requests to here
    only, never in a frame."""
    hashes = "".join(f" 'sha256-{base64.b64encode(hashlib.sha256(script).digest()).decode()}'"
                     for script in _INLINE_SCRIPT.findall(html))
    return (f"default-src 'self'; script-src 'self'{hashes}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


class Headed:
    """``send`` with this server's response headers: ``X-Content-Type-Options: nosniff`` on every
    response (no JSON answer is ever run as a script or styled as CSS); an HTML page without a
    Content-Security-Policy of its own gets :func:`page_csp` of its body, and every page
    ``X-Frame-Options: DENY`` (frame-ancestors for browsers without CSP level 2)."""

    def __init__(self, send, status: list[int]):
        self.send, self.status = send, status
        self.held: dict | None = None  # the start of an HTML page waiting for its body
        self.body = b""

    async def __call__(self, message):
        if message["type"] == "http.response.start":
            self.status[0] = message["status"]
            headers = MutableHeaders(scope=message)
            headers.setdefault("X-Content-Type-Options", "nosniff")
            if headers.get("content-type", "").startswith("text/html"):
                headers.setdefault("X-Frame-Options", "DENY")
                if "content-security-policy" not in headers:
                    self.held = message
                    return
        elif message["type"] == "http.response.body" and self.held is not None:
            self.body += message.get("body", b"")
            if message.get("more_body", False):
                return
            MutableHeaders(scope=self.held).append("Content-Security-Policy", page_csp(self.body))
            await self.send(self.held)
            message, self.held = {**message, "body": self.body}, None
        await self.send(message)


# ---------------------------------------------------------------- the app


def _error(status: int, field: str | None, message: str) -> JSONResponse:
    return JSONResponse({"error": {"field": field, "message": message}}, status_code=status)


class Guard:
    """ASGI middleware: who may call (Host, Origin, Sec-Fetch-Site), API key, request body type, size
    and arrival time, response headers, request metrics and the access log."""

    def __init__(self, app, *, api_key: str | None, limits: ServeLimits, metrics: Metrics, paths: set[str],
                 json_paths: set[str] = frozenset(), hosts: Hosts | None = None, access: bool = True):
        self.app, self.api_key, self.limits, self.metrics, self.paths = app, api_key, limits, metrics, paths
        self.json_paths, self.hosts, self.access = json_paths, hosts or Hosts.loopback(), access

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), [500]
        send_headed = Headed(send, status)
        try:
            response = self._refuse(scope)
            if response is not None:
                return await response(scope, receive, send_headed)
            await self.app(scope, self._limited(receive), send_headed)
        finally:
            seconds = time.perf_counter() - started
            path = scope["path"] if scope["path"] in self.paths else "other"  # bounded label values
            self.metrics.observe_request(path, status[0], seconds)
            if self.access:  # method, path, status, latency: never a body, a query string or a header
                access_log.info("%s %s %d %.1fms", _printable(scope.get("method", "?"), 16),
                                _printable(scope.get("raw_path", b"").decode("latin-1") or scope["path"], 200),
                                status[0], seconds * 1000)

    def _refuse(self, scope) -> JSONResponse | None:
        """The first refusal that applies, in this order: Host (421), another origin (403), the key
        (401), the body's size (413), its type (415)."""
        headers = dict(scope["headers"])
        refused = _refuse_host(scope, scope["headers"], self.hosts) or _refuse_cross_site(scope, headers, self.hosts)
        if refused is not None:
            return refused
        if (self.api_key is not None and scope["path"] not in OPEN_PATHS
                and not scope["path"].startswith(explorer.OPEN_PREFIXES)):
            given = headers.get(b"x-api-key")
            auth = headers.get(b"authorization", b"")
            if given is None and auth[:7].lower() == b"bearer ":
                given = auth[7:].strip()
            # compare as bytes in constant time; a missing key compares against an empty string
            if not hmac.compare_digest(given or b"", self.api_key.encode("utf-8")):
                return _error(401, "authorization", "missing or wrong API key (Authorization: Bearer KEY or X-API-Key)")
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limits.max_body_bytes):
            return _error(413, "body", f"request body larger than {self.limits.max_body_bytes} bytes")
        if scope["method"] == "POST" and scope["path"] in self.json_paths:
            return _refuse_media_type(headers.get(b"content-type"))
        return None

    def _limited(self, receive):
        seen, complete = 0, False
        deadline = time.monotonic() + self.limits.body_timeout_s

        async def receive_limited():
            nonlocal seen, complete
            if complete:  # after the body: waiting for a disconnect, unbounded
                return await receive()
            try:  # a client that sends fewer bytes than its Content-Length is cut off here
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.001))
            except asyncio.TimeoutError:
                raise HTTPException(408, f"request body not received within {self.limits.body_timeout_s:g} s "
                                         f"(fewer bytes than Content-Length?)",
                                    headers={"Connection": "close"}) from None  # and the connection is closed
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            seen += len(message.get("body", b""))
            if seen > self.limits.max_body_bytes:  # chunked bodies carry no Content-Length
                raise HTTPException(413, f"request body larger than {self.limits.max_body_bytes} bytes")
            return message

        return receive_limited


def _printable(text: str, limit: int) -> str:
    """``text`` for a log line: printable ASCII, the rest escaped, at most ``limit`` characters."""
    out = "".join(c if " " < c < "\x7f" else f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}" for c in text[:limit])
    return out + ("..." if len(text) > limit else "")


def create_app(indexes: dict[str, Index], *, api_key: str | None = None, limits: ServeLimits = ServeLimits(),
               access_log: bool = True, hosts: Hosts | None = None) -> FastAPI:
    """The ASGI app serving ``indexes`` (name → opened Index; the first is the default).
    ``access_log``: one line per request on the ``relsearch.access`` logger (INFO). ``hosts``: the
    Host names requests may give (default :meth:`Hosts.loopback`; ``serve`` passes the bound ones)."""
    if not indexes:
        raise ValueError("serve at least one index")
    if api_key is not None and not api_key.strip():
        raise ValueError("the API key is empty: give a key, or none to serve without one")
    metrics = Metrics()
    batchers: dict[str, Batcher] = {}
    writer = ThreadPoolExecutor(1, thread_name_prefix="relsearch-writer")  # one mutation at a time

    async def lifespan(app):
        tasks = []
        for name, index in indexes.items():
            batchers[name] = Batcher(index, limits, metrics)
            tasks.append(asyncio.create_task(batchers[name].run()))
        log.info("started: %s", ", ".join(f"{n} (generation {i.generation}, {i.documents} documents)"
                                          for n, i in indexes.items()))
        yield
        for task in tasks:
            task.cancel()
        log.info("stopped after %d requests", sum(metrics.requests.values()))

    app = FastAPI(title="relsearch", version=__import__("relsearch").__version__, lifespan=lifespan, docs_url=None,
                  description="Relational vector search over HTTP. Errors: `{\"error\": {\"field\", \"message\"}}`.")

    def pick(name: str | None) -> tuple[str, Batcher]:
        name = name or next(iter(indexes))
        if name not in batchers:
            raise RequestError("index", f"no index {name[:80]!r}; served: {', '.join(indexes)}", 404)
        return name, batchers[name]

    def costed(requests: list[SearchRequest], field: str) -> list[SearchRequest]:
        cost = sum(map(request_cost, requests))
        if cost > limits.max_hits:
            raise RequestError(field, f"this request may cost {cost:,} hits (per query: k + offset candidates, "
                                      f"{collapse_depth(1)}x with collapse, at least rerank_depth with rerank, "
                                      f"x2 with explain), over the {limits.max_hits:,} a request may cost "
                                      f"(--max-hits): ask for fewer queries or a smaller k")
        return requests

    async def searched(name: str | None, requests: list[SearchRequest]):
        name, batcher = pick(name)
        deadline = time.monotonic() + limits.timeout_s  # past it the pass skips or stops this request's work
        try:
            generation, results = await asyncio.wait_for(batcher.search(requests, deadline), limits.timeout_s)
        except asyncio.TimeoutError:
            raise HTTPException(503, f"search did not finish within {limits.timeout_s} s") from None
        return name, generation, results

    def hits_json(hits, offset: int, budget: list[int]) -> str:
        """The hits as a JSON array, charged to ``budget[0]`` (bytes left in this response)."""
        parts = []
        for rank, hit in enumerate(hits, offset + 1):
            part = json.dumps(hit.to_json(rank), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
            budget[0] -= len(part.encode("utf-8")) + 1
            if budget[0] < 0:
                raise RequestError("k", f"the response would be larger than {limits.max_response_bytes:,} bytes "
                                        "(--max-response-bytes): ask for fewer hits (k) or fewer queries")
            parts.append(part)
        return "[" + ",".join(parts) + "]"

    def head(name: str, generation: str) -> str:
        return json.dumps({"index": name, "generation": generation}, ensure_ascii=False)[:-1]

    def warnings_json(results) -> str:
        """The filter warnings of these results (api.Hits.warnings: operators that can never match),
        each once: the queries of one request share their filters."""
        said = [w for result in results for w in getattr(result, "warnings", ())]
        return json.dumps(list(dict.fromkeys(said)), ensure_ascii=False)

    def failed(result: Exception) -> HTTPException | Exception:
        if isinstance(result, SearchStopped):
            return HTTPException(503, f"search did not finish within {limits.timeout_s} s")
        return result

    @app.get("/health", summary="Liveness and the generation a search would use now (no API key needed)")
    async def health():
        now = {n: i.published() for n, i in indexes.items()}
        return {"status": "ok", "indexes": {n: {"generation": g, "documents": d} for n, (g, d) in now.items()}}

    @app.post("/search", summary="Top-k documents standing in a relation to a text or an indexed document",
              responses=SEARCH_ERRORS)
    async def search(body: SearchBody):
        requests = costed([body.request(body.text, body.id, like=body.like, unlike=body.unlike)], "k")
        name, generation, [result] = await searched(body.index, requests)
        if isinstance(result, Exception):
            raise failed(result)
        # written here, hit by hit, within max_response_bytes (FastAPI's generic encoder is not needed)
        content = (head(name, generation) + ',"results":' + hits_json(result, body.offset, [limits.max_response_bytes])
                   + ',"warnings":' + warnings_json([result]) + "}")
        return Response(content, media_type="application/json")

    @app.post("/search/batch", summary="Several queries sharing k, filters and options; errors per query",
              responses=SEARCH_ERRORS)
    async def search_batch(body: BatchBody):
        if len(body.queries) > limits.max_batch:
            raise RequestError("queries", f"at most {limits.max_batch} queries per batch, got {len(body.queries)}")
        requests = costed([body.request(q.text, q.id, q.relations, q.like, q.unlike) for q in body.queries], "queries")
        name, generation, results = await searched(body.index, requests)
        out, budget = [], [limits.max_response_bytes]
        for i, result in enumerate(results):
            if isinstance(result, SearchStopped):
                raise failed(result)
            if isinstance(result, RequestError):
                error = {"field": f"queries[{i}].{result.field}", "message": result.message}
            elif isinstance(result, Exception):  # logged where it happened; this query alone failed
                error = {"field": f"queries[{i}]", "message": f"internal error ({type(result).__name__}); "
                                                               "see the server log"}
            else:
                out.append('{"results":' + hits_json(result, body.offset, budget) + "}")
                continue
            out.append(json.dumps({"error": error}, ensure_ascii=False))
        return Response(head(name, generation) + ',"batch":[' + ",".join(out) + '],"warnings":' + warnings_json(results)
                        + "}", media_type="application/json")

    @app.get("/relations", summary="The relation operators and re-ranking heads of an index's bundle",
             responses=READ_ERRORS)
    async def relations(index: str | None = None):
        name, batcher = pick(index)
        return {"index": name, "relations": batcher.index.relations()}

    @app.post("/score", summary="Every relation's score for a → b: what --relation runs, its recipe's dense part",
              responses=SEARCH_ERRORS)
    async def score(body: ScoreBody):
        name, batcher = pick(body.index)
        deadline = time.monotonic() + limits.timeout_s
        try:
            scores = await asyncio.wait_for(batcher.call(batcher.index.score, body.a, body.b, deadline=deadline),
                                            limits.timeout_s)
        except (asyncio.TimeoutError, SearchStopped):
            raise HTTPException(503, f"score did not finish within {limits.timeout_s} s") from None
        return {"index": name, "scores": dict(scores), "warnings": getattr(scores, "warnings", [])}

    async def on_search_thread(index: str | None, fn: Callable, *args):
        """``fn(searcher, *args)`` on the model thread (the generation a search uses now)."""
        name, batcher = pick(index)
        deadline = time.monotonic() + limits.timeout_s
        try:
            answer = await asyncio.wait_for(batcher.call(lambda: fn(batcher.index.searcher(), *args), deadline=deadline),
                                            limits.timeout_s)
        except (asyncio.TimeoutError, SearchStopped):
            raise HTTPException(503, f"the request did not finish within {limits.timeout_s} s") from None
        return name, answer

    explorer.add_routes(app, on_search_thread, errors=READ_ERRORS)

    def published_generation(path: str) -> str:
        """The generation the index at ``path`` publishes now (its ``current`` pointer)."""
        from .indexer.store import current_generation

        return current_generation(path).name

    async def mutate(fn, *args) -> dict:
        report = await asyncio.get_running_loop().run_in_executor(writer, fn, *args)
        return {"op": report.op, "documents": report.documents, "added": report.added, "replaced": report.replaced,
                "deleted": report.deleted, "not_found": report.not_found, "tombstones": report.tombstones,
                "published": report.published, "seconds": round(report.seconds, 3), "generation": published_generation(report.index)}

    @app.post("/documents", summary="Add documents (a known id replaces its document); one new generation",
              responses=WRITE_ERRORS)
    async def add(body: DocumentsBody):
        if len(body.documents) > limits.max_documents:
            raise RequestError("documents", f"at most {limits.max_documents} documents per request")
        name, batcher = pick(body.index)
        return {"index": name, **await mutate(batcher.index.add, body.documents)}

    @app.post("/documents/delete", summary="Delete documents by id; one new generation", responses=WRITE_ERRORS)
    async def delete(body: DeleteBody):
        if len(body.ids) > limits.max_documents:
            raise RequestError("ids", f"at most {limits.max_documents} ids per request")
        name, batcher = pick(body.index)
        return {"index": name, **await mutate(batcher.index.delete, body.ids)}

    @app.get("/metrics", summary="Prometheus text format", response_class=PlainTextResponse)
    async def prometheus():
        return PlainTextResponse(metrics.render(indexes), media_type="text/plain; version=0.0.4")

    @app.exception_handler(RequestError)
    async def request_error(request: Request, e: RequestError):
        return _error(e.status, e.field, e.message)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        first = e.errors()[0]
        if first.get("type") == "json_invalid":
            return _error(400, "body", f"invalid JSON: {first.get('ctx', {}).get('error', 'decode error')}")
        loc = [str(x) for x in first.get("loc", ())]
        field = ".".join(loc[1:] if loc[:1] in (["body"], ["query"]) else loc) or "body"
        return _error(422, field, first.get("msg", "invalid value"))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        response = _error(e.status_code, "body" if e.status_code in (408, 413) else None, str(e.detail))
        response.headers.update(e.headers or {})  # 405: Allow
        return response

    @app.exception_handler(Exception)
    async def crash(request: Request, e: Exception):
        log.exception("%s %s failed", request.method, request.url.path)  # the traceback stays in the server log
        return _error(500, None, f"internal error ({type(e).__name__}); see the server log")

    explorer.add_pages(app, title=app.title)
    paths = {route.path for route in app.routes}
    json_paths = {route.path for route in app.routes if "POST" in (getattr(route, "methods", None) or ())}
    app.add_middleware(Guard, api_key=api_key, limits=limits, metrics=metrics, paths=paths, json_paths=json_paths,
                       hosts=hosts, access=access_log)
    return app


def read_api_key(key_file: str | None) -> str | None:
    """The API key from ``key_file`` (first line), else ``$RELSEARCH_API_KEY``; None: no key. An
    empty key (a blank first line, ``RELSEARCH_API_KEY=""``) is a ValueError, never "no key"."""
    if key_file:
        with open(key_file, encoding="utf-8") as f:
            key = f.readline().strip()
        if not key:
            raise ValueError(f"{key_file} holds no API key")
        return key
    key = os.environ.get(API_KEY_ENV)
    if key is not None and not key.strip():
        raise ValueError(f"{API_KEY_ENV} is set but empty: set it to a key, or unset it to serve without one")
    return key


def listen(host: str, port: int):
    """A listening TCP socket for uvicorn; from here on connections wait in its backlog."""
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # connections accepted from a socket handed to uvicorn inherit its options and get no TCP_NODELAY
    # of their own: without it a response written in two parts waits ~40 ms for the client's delayed ACK
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def serve(indexes: dict[str, Index], *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          limits: ServeLimits = ServeLimits(), ready: Callable[[str], None] | None = None,
          access_log: bool = True, allowed_hosts: Iterable[str] = ()) -> None:
    """Bind ``host:port`` (0: a free port), call ``ready(url)``, serve until interrupted. Requests
    must name the bound host and port in ``Host`` (:meth:`Hosts.bound`), or one of ``allowed_hosts``."""
    import uvicorn

    hosts = Hosts.bound(host, port or None, allowed_hosts)  # a bad --allowed-host fails before the bind
    sock = listen(host, port)
    bound = sock.getsockname()[1]
    hosts = Hosts.bound(host, bound, allowed_hosts)
    config = uvicorn.Config(create_app(indexes, api_key=api_key, limits=limits, access_log=access_log, hosts=hosts),
                            log_level="warning", access_log=False, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    if ready is not None:
        ready(f"http://{host if ':' not in host else f'[{host}]'}:{bound}")
    server.run(sockets=[sock])
