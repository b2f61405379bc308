"""``POST /documents`` (add; a known id replaces its document) and ``POST /documents/delete``: each
request one new generation, written on the app's one writer thread."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter

from ...api import RequestError
from ..errors import WRITE_ERRORS
from ..models import DeleteBody, DocumentsBody
from ..served import Served


def published_generation(path: str) -> str:
    """The generation the index at ``path`` publishes now (its ``current`` pointer)."""
    from ...indexer.store import current_generation

    return current_generation(path).name


def add_routes(router: APIRouter, served: Served) -> None:
    limits, pick = served.limits, served.pick

    async def mutate(fn, *args) -> dict:
        report = await asyncio.get_running_loop().run_in_executor(served.writer, fn, *args)
        return {"op": report.op, "documents": report.documents, "added": report.added, "replaced": report.replaced,
                "deleted": report.deleted, "not_found": report.not_found, "tombstones": report.tombstones,
                "published": report.published, "seconds": round(report.seconds, 3), "generation": published_generation(report.index)}

    @router.post("/documents", summary="Add documents (a known id replaces its document); one new generation",
                 responses=WRITE_ERRORS)
    async def add(body: DocumentsBody):
        if len(body.documents) > limits.max_documents:
            raise RequestError("documents", f"at most {limits.max_documents} documents per request")
        name, batcher = pick(body.index)
        return {"index": name, **await mutate(batcher.index.add, body.documents)}

    @router.post("/documents/delete", summary="Delete documents by id; one new generation", responses=WRITE_ERRORS)
    async def delete(body: DeleteBody):
        if len(body.ids) > limits.max_documents:
            raise RequestError("ids", f"at most {limits.max_documents} ids per request")
        name, batcher = pick(body.index)
        return {"index": name, **await mutate(batcher.index.delete, body.ids)}
