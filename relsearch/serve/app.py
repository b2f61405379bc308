"""The app: :func:`create_app` assembles the feature routes (relsearch/serve/routers/), the explorer's,
the error handlers and the :class:`~relsearch.serve.security.Guard`; :func:`serve` binds a socket
and runs it with uvicorn."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from fastapi import FastAPI

from .. import explorer
from ..api import Index
from ..version import __version__
from .errors import READ_ERRORS, add_error_handlers
from .metrics import Metrics
from .models import ServeLimits
from .routers import admin, documents, search
from .security import Guard, Hosts
from .served import Served

log = logging.getLogger("relsearch.serve")


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
    served = Served(indexes, limits, metrics)

    async def lifespan(app):
        tasks = [asyncio.create_task(batcher.run()) for batcher in served.start()]
        log.info("started: %s", ", ".join(f"{n} (generation {i.generation}, {i.documents} documents)"
                                          for n, i in indexes.items()))
        yield
        for task in tasks:
            task.cancel()
        log.info("stopped after %d requests", sum(metrics.requests.values()))

    app = FastAPI(title="relsearch", version=__version__, lifespan=lifespan, docs_url=None,
                  description="Relational vector search over HTTP. Errors: `{\"error\": {\"field\", \"message\"}}`.")
    # Each feature adds its routes to the app's own APIRouter (as explorer.add_routes does), in this
    # order: the order of the paths in /openapi.json and on /docs. Not include_router: in FastAPI 0.165
    # an included router is one lazy branch of app.routes, which the path lists below read route by route.
    admin.add_health(app.router, served)
    search.add_routes(app.router, served)
    explorer.add_routes(app, served.on_search_thread, errors=READ_ERRORS)
    documents.add_routes(app.router, served)
    admin.add_metrics(app.router, served)
    add_error_handlers(app)
    explorer.add_pages(app, title=app.title)
    paths = {route.path for route in app.routes}
    json_paths = {route.path for route in app.routes if "POST" in (getattr(route, "methods", None) or ())}
    app.add_middleware(Guard, api_key=api_key, limits=limits, metrics=metrics, paths=paths, json_paths=json_paths,
                       hosts=hosts, access=access_log)
    return app


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
