"""``relsearch serve``: the Python API (relsearch/api.py) over HTTP, with FastAPI and uvicorn.

One process holds one :class:`~relsearch.api.Index` per served index (the model loads once).
Concurrent search requests wait in an asyncio queue; one worker per index takes everything that
queued up while the previous batch ran (up to ``ServeLimits.micro_batch`` queries) and answers
it with one ``Index.search_batch`` call, so one encoder pass serves many clients. The torch work
runs in a dedicated thread, so the event loop keeps accepting requests. Mutations run in a
separate writer thread and publish a new generation; every batch re-checks the index symlink, so
generations published here or by another process are picked up without a restart.

Errors are JSON ``{"error": {"field": ..., "message": ...}}`` with a 4xx status naming the
request field at fault; an unexpected failure is a 500 with no traceback (it is logged here).
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import math
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from starlette.exceptions import HTTPException

from .api import MAX_K, MAX_RERANK_DEPTH, Index, RequestError, SearchRequest

log = logging.getLogger("relsearch.serve")

API_KEY_ENV = "RELSEARCH_API_KEY"
OPEN_PATHS = frozenset({"/health", "/docs", "/openapi.json", "/docs/oauth2-redirect"})  # no data behind them


@dataclass(frozen=True, kw_only=True)
class ServeLimits:
    """Per-request limits; the defaults are documented in README ("Serve")."""

    max_body_bytes: int = 4 << 20  # request body (413 beyond)
    max_batch: int = 256  # queries in one /search/batch request
    max_documents: int = 1000  # documents in one /documents request
    max_text_chars: int = 100_000  # characters of a query text
    timeout_s: float = 30.0  # a search or score request waiting longer gets 503
    micro_batch: int = 64  # queries per encoder pass across concurrent requests
    batch_wait_ms: float = 0.0  # always wait this long for more requests before a pass (tests)
    # Wait up to this long for as many queries as the previous pass answered: clients that pass
    # answered are sending their next request, and without the wait the next pass would start with
    # the first of them alone (passes alternating between a few and many queries).
    refill_wait_ms: float = 5.0


FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Text = Annotated[str, Field(min_length=1, max_length=ServeLimits.max_text_chars)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class QueryOptions(_Body):
    index: str | None = Field(None, description="Served index name (default: the first --index).")
    relations: dict[str, FiniteFloat] = Field(default_factory=lambda: {"identity": 1.0},
                                              description="Relation mixture {name: weight}; see GET /relations.")
    k: int = Field(10, ge=1, le=MAX_K)
    offset: int = Field(0, ge=0, le=MAX_K - 1)
    min_score: FiniteFloat | None = Field(None, description="Drop hits scoring below this.")
    collapse: str | None = Field(None, min_length=1, description="Keep the best hit per value of this metadata field.")
    filters: dict[str, StrictStr | StrictBool | StrictInt | FiniteFloat | dict[str, Any]] = Field(
        default_factory=dict, description='Metadata filters, AND-ed: {field: value} (exact; JSON types match exactly, '
        'true is not 1, "1" is not 1) or {field: {operator: value}} with eq, ieq, gt, gte, lt, lte, in, has, exists, '
        'not (see indexer/filters.py).')
    explain: bool = Field(False, description="Add every operator's own score to each hit.")
    rerank: str | None = Field(None, description="A re-ranking head of the bundle, e.g. pu-head.")
    rerank_depth: int | None = Field(None, ge=1, le=MAX_RERANK_DEPTH)
    hybrid: Literal["rrf", "weighted"] | None = Field(None, description="Fuse with BM25 on the query text: "
                                                      "rrf (reciprocal rank fusion) or weighted.")
    hybrid_weight: FiniteFloat | None = Field(None, ge=0, le=1, description="With hybrid weighted: the relational "
                                        "list's share of the min-max normalised scores (BM25 gets the rest; 0.5).")

    def request(self, text: str | None, doc_id: str | None, relations: dict | None = None) -> SearchRequest:
        return SearchRequest(text=text, id=doc_id, relations=relations or self.relations, k=self.k,
                             offset=self.offset, min_score=self.min_score, collapse=self.collapse,
                             filters=self.filters, explain=self.explain, rerank=self.rerank,
                             rerank_depth=self.rerank_depth, hybrid=self.hybrid, hybrid_weight=self.hybrid_weight)


class SearchBody(QueryOptions):
    text: Text | None = Field(None, description="Query text (or give id).")
    id: str | None = Field(None, min_length=1, description="An indexed document to query with.")


class BatchQuery(_Body):
    text: Text | None = None
    id: str | None = Field(None, min_length=1)
    relations: dict[str, FiniteFloat] | None = Field(None, description="Overrides the batch's relations.")


class BatchBody(QueryOptions):
    queries: list[BatchQuery] = Field(min_length=1, description="Queries sharing the other options.")


class ScoreBody(_Body):
    index: str | None = None
    a: Text
    b: Text


class DocumentsBody(_Body):
    index: str | None = None
    documents: list[dict[str, Any]] = Field(min_length=1, description='{"id", "text", ...metadata} each.')


class DeleteBody(_Body):
    index: str | None = None
    ids: list[str] = Field(min_length=1)


# ---------------------------------------------------------------- micro-batching


class Batcher:
    """Queues search requests for one index and answers them in batches on one thread."""

    def __init__(self, index: Index, limits: ServeLimits, metrics: Metrics):
        self.index, self.limits, self.metrics = index, limits, metrics
        self.queue: asyncio.Queue = asyncio.Queue()
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="relsearch-search")  # torch, FAISS, SQLite reads

    async def search(self, requests: list[SearchRequest]):
        future = asyncio.get_running_loop().create_future()
        await self.queue.put((requests, future))
        return await future

    async def call(self, fn: Callable, *args):
        """Run ``fn`` on the search thread (it uses the model), after the batch in progress."""
        return await asyncio.get_running_loop().run_in_executor(self.thread, fn, *args)

    async def gather(self, expected: int) -> list:
        """The queued (requests, future) items of the next pass: whatever queued up, and up to
        ``refill_wait_ms`` more waiting until ``expected`` queries are there (at most ``micro_batch``)."""
        loop = asyncio.get_running_loop()
        items = [await self.queue.get()]
        if self.limits.batch_wait_ms > 0:
            await asyncio.sleep(self.limits.batch_wait_ms / 1000)
        size, deadline = len(items[0][0]), loop.time() + self.limits.refill_wait_ms / 1000
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
            items.append(item)
            size += len(item[0])
        return items

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        expected = 1
        while True:
            items = await self.gather(expected)
            flat = [r for requests, _ in items for r in requests]
            expected = len(flat)
            self.metrics.observe_batch(len(flat))
            try:
                answer = await loop.run_in_executor(self.thread, self.index.search_batch, flat)
            except Exception as e:  # noqa: BLE001 - delivered to every waiting request (a 500 each)
                for _, future in items:
                    if not future.done():
                        future.set_exception(e)
                continue
            start = 0
            for requests, future in items:
                if not future.done():  # a request that timed out is no longer waiting
                    future.set_result((answer.generation, answer.results[start:start + len(requests)]))
                start += len(requests)


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


# ---------------------------------------------------------------- the app


def _error(status: int, field: str | None, message: str) -> JSONResponse:
    return JSONResponse({"error": {"field": field, "message": message}}, status_code=status)


class Guard:
    """ASGI middleware: API key, request body size, and request metrics."""

    def __init__(self, app, *, api_key: str | None, limits: ServeLimits, metrics: Metrics, paths: set[str]):
        self.app, self.api_key, self.limits, self.metrics, self.paths = app, api_key, limits, metrics, paths

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), [500]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            response = self._refuse(scope)
            if response is not None:
                return await response(scope, receive, send_status)
            await self.app(_as_json(scope), self._limited(receive), send_status)
        finally:
            path = scope["path"] if scope["path"] in self.paths else "other"  # bounded label values
            self.metrics.observe_request(path, status[0], time.perf_counter() - started)

    def _refuse(self, scope) -> JSONResponse | None:
        headers = dict(scope["headers"])
        if self.api_key is not None and scope["path"] not in OPEN_PATHS:
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
        return None

    def _limited(self, receive):
        seen = 0

        async def receive_limited():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limits.max_body_bytes:  # chunked bodies carry no Content-Length
                raise HTTPException(413, f"request body larger than {self.limits.max_body_bytes} bytes")
            return message

        return receive_limited


def _as_json(scope):
    """Every body is read as JSON, whatever its Content-Type says (``curl -d`` sends a form type)."""
    headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
    return {**scope, "headers": [*headers, (b"content-type", b"application/json")]}


def create_app(indexes: dict[str, Index], *, api_key: str | None = None, limits: ServeLimits = ServeLimits()) -> FastAPI:
    """The ASGI app serving ``indexes`` (name → opened Index; the first is the default)."""
    if not indexes:
        raise ValueError("serve at least one index")
    metrics = Metrics()
    batchers: dict[str, Batcher] = {}
    writer = ThreadPoolExecutor(1, thread_name_prefix="relsearch-writer")  # one mutation at a time

    async def lifespan(app):
        tasks = []
        for name, index in indexes.items():
            batchers[name] = Batcher(index, limits, metrics)
            tasks.append(asyncio.create_task(batchers[name].run()))
        yield
        for task in tasks:
            task.cancel()

    app = FastAPI(title="relsearch", version=__import__("relsearch").__version__, lifespan=lifespan,
                  description="Relational vector search over HTTP. Errors: `{\"error\": {\"field\", \"message\"}}`.")

    def pick(name: str | None) -> tuple[str, Batcher]:
        name = name or next(iter(indexes))
        if name not in batchers:
            raise RequestError("index", f"no index {name[:80]!r}; served: {', '.join(indexes)}", 404)
        return name, batchers[name]

    async def searched(name: str | None, requests: list[SearchRequest]):
        name, batcher = pick(name)
        try:
            generation, results = await asyncio.wait_for(batcher.search(requests), limits.timeout_s)
        except asyncio.TimeoutError:
            raise HTTPException(503, f"search did not finish within {limits.timeout_s} s") from None
        return name, generation, results

    @app.get("/health", summary="Liveness and the generation each index serves (no API key needed)")
    async def health():
        return {"status": "ok", "indexes": {n: {"generation": i.generation, "documents": i.documents} for n, i in indexes.items()}}

    @app.post("/search", summary="Top-k documents standing in a relation to a text or an indexed document")
    async def search(body: SearchBody):
        name, generation, [result] = await searched(body.index, [body.request(body.text, body.id)])
        if isinstance(result, RequestError):
            raise result
        # a JSONResponse skips FastAPI's generic encoder: the hits are plain JSON values already
        return JSONResponse({"index": name, "generation": generation,
                             "results": [hit.to_json(body.offset + rank) for rank, hit in enumerate(result, 1)]})

    @app.post("/search/batch", summary="Several queries sharing k, filters and options; errors per query")
    async def search_batch(body: BatchBody):
        if len(body.queries) > limits.max_batch:
            raise RequestError("queries", f"at most {limits.max_batch} queries per batch, got {len(body.queries)}")
        name, generation, results = await searched(body.index, [body.request(q.text, q.id, q.relations)
                                                                for q in body.queries])
        out = []
        for i, result in enumerate(results):
            if isinstance(result, RequestError):
                out.append({"error": {"field": f"queries[{i}].{result.field}", "message": result.message}})
            else:
                out.append({"results": [hit.to_json(body.offset + rank) for rank, hit in enumerate(result, 1)]})
        return JSONResponse({"index": name, "generation": generation, "batch": out})

    @app.get("/relations", summary="The relation operators and re-ranking heads of an index's bundle")
    async def relations(index: str | None = None):
        name, batcher = pick(index)
        return {"index": name, "relations": batcher.index.relations()}

    @app.post("/score", summary="Every relation's score cos(op(h_a), b) for the pair a → b")
    async def score(body: ScoreBody):
        name, batcher = pick(body.index)
        try:
            scores = await asyncio.wait_for(batcher.call(batcher.index.score, body.a, body.b), limits.timeout_s)
        except asyncio.TimeoutError:
            raise HTTPException(503, f"score did not finish within {limits.timeout_s} s") from None
        return {"index": name, "scores": scores}

    async def mutate(fn, *args) -> dict:
        report = await asyncio.get_running_loop().run_in_executor(writer, fn, *args)
        return {"op": report.op, "documents": report.documents, "added": report.added, "replaced": report.replaced,
                "deleted": report.deleted, "not_found": report.not_found, "tombstones": report.tombstones,
                "seconds": round(report.seconds, 3), "generation": os.path.basename(os.path.realpath(report.index))}

    @app.post("/documents", summary="Add documents (a known id replaces its document); one new generation")
    async def add(body: DocumentsBody):
        if len(body.documents) > limits.max_documents:
            raise RequestError("documents", f"at most {limits.max_documents} documents per request")
        name, batcher = pick(body.index)
        return {"index": name, **await mutate(batcher.index.add, body.documents)}

    @app.post("/documents/delete", summary="Delete documents by id; one new generation")
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
        return _error(e.status_code, "body" if e.status_code == 413 else None, str(e.detail))

    @app.exception_handler(Exception)
    async def crash(request: Request, e: Exception):
        log.exception("%s %s failed", request.method, request.url.path)  # the traceback stays in the server log
        return _error(500, None, f"internal error ({type(e).__name__}); see the server log")

    paths = {route.path for route in app.routes}
    app.add_middleware(Guard, api_key=api_key, limits=limits, metrics=metrics, paths=paths)
    return app


def read_api_key(key_file: str | None) -> str | None:
    """The API key from ``key_file`` (first line), else ``$RELSEARCH_API_KEY``; None: no key."""
    if key_file:
        with open(key_file, encoding="utf-8") as f:
            key = f.readline().strip()
        if not key:
            raise ValueError(f"{key_file} holds no API key")
        return key
    return os.environ.get(API_KEY_ENV) or None


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
          limits: ServeLimits = ServeLimits(), ready: Callable[[str], None] | None = None) -> None:
    """Bind ``host:port`` (0: a free port), call ``ready(url)``, serve until interrupted."""
    import uvicorn

    sock = listen(host, port)
    bound = sock.getsockname()[1]
    config = uvicorn.Config(create_app(indexes, api_key=api_key, limits=limits), log_level="warning",
                            access_log=False, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    if ready is not None:
        ready(f"http://{host if ':' not in host else f'[{host}]'}:{bound}")
    server.run(sockets=[sock])
