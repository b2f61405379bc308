"""``GET /health`` (no API key needed) and ``GET /metrics`` (Prometheus)."""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

from ..served import Served


def on_disk_problem(path) -> str | None:
    """Why the generation the index at ``path`` publishes now could not be opened from disk (no
    generation, its folder or manifest gone, a file it lists missing, of another size or a symlink),
    as one line; None when it could. A running server answers from the files it holds open, so only
    this check, or a restart, finds a generation removed under it. Sizes only: no file is hashed."""
    from ...indexer import integrity, store

    try:
        gen = store.current_generation(path)
        if gen is None:
            return f"{path} publishes no generation"
        integrity.verify(gen, store.read_manifest(gen).files, mode="size")
    except (OSError, ValueError) as e:
        return str(e) if isinstance(e, ValueError) else f"{e.strerror or e}: {e.filename or path}"
    return None


def add_health(router: APIRouter, served: Served) -> None:
    @router.get("/health", summary="Liveness, the generation a search would use now and whether its files are on disk "
                                   "(no API key needed)",
                responses={503: {"description": "a served index's published generation is not (all) on disk: "
                                                "status \"degraded\", and that index's \"problem\""}})
    def health():  # a thread of the pool, not the event loop: it stats every file of each generation
        indexes = {}
        for name, index in served.indexes.items():
            generation, documents = index.published()
            indexes[name] = {"generation": generation, "documents": documents}
            if (problem := on_disk_problem(index.path)) is not None:
                indexes[name]["problem"] = problem
        problems = [f"{n}: {i['problem']}" for n, i in indexes.items() if "problem" in i]
        if problems:  # "error" as every error body has it, so that a client (the explorer page) shows the reason
            return JSONResponse({"status": "degraded", "indexes": indexes,
                                 "error": {"field": "index", "message": problems[0]}}, status_code=503)
        return {"status": "ok", "indexes": indexes}


def add_metrics(router: APIRouter, served: Served) -> None:
    @router.get("/metrics", summary="Prometheus text format", response_class=PlainTextResponse)
    async def prometheus():
        return PlainTextResponse(served.metrics.render(served.indexes), media_type="text/plain; version=0.0.4")
