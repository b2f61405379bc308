"""The one error shape of ``relsearch serve``: ``{"error": {"field": ..., "message": ...}}``.

Its schema in OpenAPI (each route lists the statuses it can answer, with this body), the response,
and the app's exception handlers: a 4xx names the request field (or header) at fault; an
unexpected failure is a 500 with no traceback (the traceback goes to the server log).
"""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from ..api import RequestError

log = logging.getLogger("relsearch.serve")


class ErrorDetail(BaseModel):
    field: str | None = Field(description="The request field at fault (null when none is).")
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


def error_response(status: int, field: str | None, message: str) -> JSONResponse:
    return JSONResponse({"error": {"field": field, "message": message}}, status_code=status)


def _errors(*statuses: int) -> dict:
    """OpenAPI ``responses`` for these statuses, each with the real error body."""
    said = {400: "Invalid JSON", 401: "Missing or wrong API key", 404: "Unknown index or document id",
            403: "Sent by a page of another origin (Origin, Sec-Fetch-Site)",
            408: "The body did not arrive in time (--body-timeout)", 409: "Documents for another encoder",
            413: "Request body too large (--max-body-bytes)", 415: "The body is not declared application/json",
            421: "The Host header names another server (--allowed-host)",
            422: "Invalid request: the field at fault is named (types, ranges, unknown names, cost and response "
                 "bounds)", 502: "The Elasticsearch cluster refused or could not be reached (serve --backend es)",
            503: "Timed out (--timeout); the work stopped"}
    return {s: {"model": ErrorBody, "description": said[s]} for s in statuses}


SEARCH_ERRORS = _errors(400, 401, 403, 404, 408, 413, 415, 421, 422, 502, 503)
WRITE_ERRORS = _errors(400, 401, 403, 404, 408, 409, 413, 415, 421, 422)
READ_ERRORS = _errors(401, 403, 404, 421, 422)


def add_error_handlers(app: FastAPI) -> None:
    """Every failure a route raises, answered in the one error shape."""

    @app.exception_handler(RequestError)
    async def request_error(request: Request, e: RequestError):
        return error_response(e.status, e.field, e.message)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        first = e.errors()[0]
        if first.get("type") == "json_invalid":
            return error_response(400, "body", f"invalid JSON: {first.get('ctx', {}).get('error', 'decode error')}")
        loc = [str(x) for x in first.get("loc", ())]
        field = ".".join(loc[1:] if loc[:1] in (["body"], ["query"]) else loc) or "body"
        return error_response(422, field, first.get("msg", "invalid value"))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        response = error_response(e.status_code, "body" if e.status_code in (408, 413) else None, str(e.detail))
        response.headers.update(e.headers or {})  # 405: Allow
        return response

    @app.exception_handler(Exception)
    async def crash(request: Request, e: Exception):
        log.exception("%s %s failed", request.method, request.url.path)  # the traceback stays in the server log
        return error_response(500, None, f"internal error ({type(e).__name__}); see the server log")
