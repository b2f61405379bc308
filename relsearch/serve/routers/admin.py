"""``GET /health`` (no API key needed) and ``GET /metrics`` (Prometheus)."""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from ..served import Served


def add_health(router: APIRouter, served: Served) -> None:
    @router.get("/health", summary="Liveness and the generation a search would use now (no API key needed)")
    async def health():
        now = {n: i.published() for n, i in served.indexes.items()}
        return {"status": "ok", "indexes": {n: {"generation": g, "documents": d} for n, (g, d) in now.items()}}


def add_metrics(router: APIRouter, served: Served) -> None:
    @router.get("/metrics", summary="Prometheus text format", response_class=PlainTextResponse)
    async def prometheus():
        return PlainTextResponse(served.metrics.render(served.indexes), media_type="text/plain; version=0.0.4")
