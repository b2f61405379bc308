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

The modules, each importing only those above it (tests/cli_api/test_import_direction.py):

- ``models``: ``ServeLimits``, the request bodies and the search answers' schema (pydantic)
- ``errors``: the error body, its OpenAPI ``responses``, the exception handlers
- ``metrics``: ``Metrics`` (Prometheus text format)
- ``batching``: micro-batching (``Batcher``, ``Pending``, ``request_cost``)
- ``security``: who may call (``Hosts``, the Host / Origin / Content-Type refusals, the API key),
  the response headers (``nosniff``, CSP), and ``Guard``, the middleware doing it all
- ``served``: the indexes an app serves and their batchers, as the routers read them
- ``routers``: the routes, one module per feature, each adding its own to the app's APIRouter: ``search``
  (search, search/batch, relations, score), ``documents`` (add, delete), ``admin`` (health, metrics);
  the explorer's stay in relsearch/explorer.py
- ``app``: ``create_app`` (assembles the above) and ``serve``

Every name is importable from ``relsearch.serve`` itself.
"""
from .app import create_app, listen, serve
from .batching import Batcher, Pending, request_cost
from .errors import READ_ERRORS, SEARCH_ERRORS, WRITE_ERRORS, ErrorBody, ErrorDetail, error_response
from .metrics import BATCH_BUCKETS, LATENCY_BUCKETS, Metrics
from .models import (ONE_OF_TEXT_OR_ID, BatchBody, BatchEntry, BatchQuery, BatchSearchAnswer, DeleteBody, Document,
                     DocumentsBody, ExampleBody, Filters, FiniteFloat, QueryOptions, RecipeParts, ScoreBody, SearchAnswer,
                     SearchBody, ServeLimits, Text)
from .security import (API_KEY_ENV, DEFAULT_PORTS, LOOPBACK_NAMES, OPEN_PATHS, OWN_PORT, Guard, Headed, Hosts,
                       page_csp, read_api_key, split_host)
from .served import Served

__all__ = [
    "API_KEY_ENV", "BATCH_BUCKETS", "DEFAULT_PORTS", "LATENCY_BUCKETS", "LOOPBACK_NAMES", "ONE_OF_TEXT_OR_ID",
    "OPEN_PATHS", "OWN_PORT", "READ_ERRORS", "SEARCH_ERRORS", "WRITE_ERRORS", "BatchBody", "BatchEntry", "BatchQuery",
    "BatchSearchAnswer", "Batcher", "DeleteBody", "Document", "DocumentsBody", "ErrorBody", "ErrorDetail",
    "ExampleBody", "Filters", "FiniteFloat", "Guard", "Headed", "Hosts", "Metrics", "Pending", "QueryOptions",
    "RecipeParts", "ScoreBody", "SearchAnswer", "SearchBody", "ServeLimits",
    "Served", "Text", "create_app", "error_response", "listen", "page_csp", "read_api_key", "request_cost", "serve",
    "split_host",
]
