"""``POST /search``, ``POST /search/batch``, ``GET /relations`` and ``POST /score``.

Searches go through the index's :class:`~relsearch.serve.batching.Batcher` (one encoder pass for
many requests), bounded in cost before they queue and in bytes as their hits are written.
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response
from starlette.exceptions import HTTPException

from ...api import RequestError, SearchRequest
from ...indexer.elastic import ElasticError
from ...retrieval.export import CSV_TYPE, JSONL_TYPE, csv_text, jsonl_lines, query_label
from ...retrieval.paging import SearchStopped, collapse_depth
from ..batching import request_cost
from ..errors import READ_ERRORS, SEARCH_ERRORS
from ..models import BatchBody, BatchSearchAnswer, ScoreBody, SearchAnswer, SearchBody
from ..served import Served


def head(name: str, generation: str) -> str:
    return json.dumps({"index": name, "generation": generation}, ensure_ascii=False)[:-1]


def warnings_json(results) -> str:
    """The filter warnings of these results (api.Hits.warnings: operators that can never match),
    each once: the queries of one request share their filters."""
    said = [w for result in results for w in getattr(result, "warnings", ())]
    return json.dumps(list(dict.fromkeys(said)), ensure_ascii=False)


def facets_json(result) -> str:
    """``,"facets":{...}`` when the request asked for facets (api.Hits.facets), else nothing."""
    facets = getattr(result, "facets", None)
    return ',"facets":' + json.dumps(facets, ensure_ascii=False, allow_nan=False) if facets else ""


def why_not_json(result) -> str:
    """``,"why_not":{...}`` when the request asked why a document is not higher (api.Hits.why_not)."""
    why_not = getattr(result, "why_not", None)
    return ',"why_not":' + json.dumps(why_not, ensure_ascii=False, allow_nan=False) if why_not else ""


def plan_json(result) -> str:
    """``,"mode":...,"recipe":{...}``: what the query plan decided (api.Hits.mode, api.Hits.recipe),
    so a client reads the score scale and the combined recipe instead of working them out."""
    return (',"mode":' + json.dumps(result.mode) + ',"recipe":'
            + json.dumps(result.recipe.to_json(), ensure_ascii=False, allow_nan=False))


EXPORTS = {"csv": CSV_TYPE, "jsonl": JSONL_TYPE}  # format= → the answer's content type


def exported(body: SearchBody, hits, fmt: str, max_bytes: int) -> Response:
    """The hits of one search as a CSV or JSONL download (retrieval/export.py): a row or line per hit,
    its ``query`` the body's id, text or examples; within ``max_bytes`` like a JSON answer."""
    answers = [(query_label(body.text, body.id, body.examples()), [hit.to_json(rank) for rank, hit in enumerate(hits, body.offset + 1)])]
    content = csv_text(answers) if fmt == "csv" else "".join(line + "\n" for line in jsonl_lines(answers))
    if len(content.encode("utf-8")) > max_bytes:
        raise RequestError("k", f"the response would be larger than {max_bytes:,} bytes (--max-response-bytes): "
                                "ask for fewer hits (k)")
    return Response(content, media_type=EXPORTS[fmt],
                    headers={"Content-Disposition": f'attachment; filename="relsearch-answer.{fmt}"'})


def costed(limits, requests: list[SearchRequest], field: str) -> list[SearchRequest]:
    """``requests``, or a RequestError naming ``field`` when together they may cost more than --max-hits."""
    cost = sum(map(request_cost, requests))
    if cost > limits.max_hits:
        raise RequestError(field, f"this request may cost {cost:,} hits (per query: k + offset candidates, "
                                  f"{collapse_depth(1)}x with collapse, at least rerank_depth with rerank, "
                                  f"x2 with explain), over the {limits.max_hits:,} a request may cost "
                                  f"(--max-hits): ask for fewer queries or a smaller k")
    return requests


async def searched(served: Served, name: str | None, requests: list[SearchRequest]):
    """(index name, generation, results) of ``requests`` on the served index ``name``, within --timeout."""
    limits = served.limits
    name, batcher = served.pick(name)
    deadline = time.monotonic() + limits.timeout_s  # past it the pass skips or stops this request's work
    try:
        generation, results = await asyncio.wait_for(batcher.search(requests, deadline), limits.timeout_s)
    except asyncio.TimeoutError:
        raise HTTPException(503, f"search did not finish within {limits.timeout_s} s") from None
    return name, generation, results


def hits_json(limits, hits, offset: int, budget: list[int]) -> str:
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


def answer_json(limits, result, offset: int, budget: list[int]) -> str:
    """One query's answer as JSON members after its hits: facets, why_not, the plan."""
    return ('"results":' + hits_json(limits, result, offset, budget) + facets_json(result) + why_not_json(result)
            + plan_json(result))


def failed(limits, result: Exception) -> HTTPException | Exception:
    """What the server answers for a request's exception."""
    if isinstance(result, SearchStopped):
        return HTTPException(503, f"search did not finish within {limits.timeout_s} s")
    if isinstance(result, ElasticError):  # serve --backend es: what the cluster said (never credentials)
        return HTTPException(502, str(result))
    return result


def add_routes(router: APIRouter, served: Served) -> None:
    _add_search(router, served)
    _add_batch(router, served)
    _add_relations_and_score(router, served)


def _add_search(router: APIRouter, served: Served) -> None:
    limits = served.limits

    @router.post("/search", summary="Top-k documents standing in a relation to a text or an indexed document",
                 responses={200: {"model": SearchAnswer, "description": "The hits and what the query plan ran "
                                  "(format=csv or jsonl: the hits alone, as a file)",
                                  "content": {"text/csv": {}, "application/x-ndjson": {}}},
                            **SEARCH_ERRORS})
    async def search(body: SearchBody, fmt: Literal["json", "csv", "jsonl"] = Query(
            "json", alias="format", description="json (the answer below), or the hits alone as a download: csv (a row "
            "per hit: query, rank, id, score, text, each metadata field) or jsonl (a line per hit)")):
        requests = costed(limits, [body.request(body)], "k")
        name, generation, [result] = await searched(served, body.index, requests)
        if isinstance(result, Exception):
            raise failed(limits, result)
        if fmt != "json":
            return exported(body, result, fmt, limits.max_response_bytes)
        # written here, hit by hit, within max_response_bytes (FastAPI's generic encoder is not needed)
        content = (head(name, generation) + "," + answer_json(limits, result, body.offset, [limits.max_response_bytes])
                   + ',"warnings":' + warnings_json([result]) + "}")
        return Response(content, media_type="application/json")


def _add_batch(router: APIRouter, served: Served) -> None:
    limits = served.limits

    @router.post("/search/batch", summary="Several queries sharing k, filters and options; errors per query",
                 responses={200: {"model": BatchSearchAnswer, "description": "Per query its hits and plan, or its error"},
                            **SEARCH_ERRORS})
    async def search_batch(body: BatchBody):
        if len(body.queries) > limits.max_batch:
            raise RequestError("queries", f"at most {limits.max_batch} queries per batch, got {len(body.queries)}")
        requests = costed(limits, [body.request(q, q.relations) for q in body.queries], "queries")
        name, generation, results = await searched(served, body.index, requests)
        out, budget = [], [limits.max_response_bytes]
        for i, result in enumerate(results):
            if isinstance(result, SearchStopped):
                raise failed(limits, result)
            if isinstance(result, RequestError):
                error = {"field": f"queries[{i}].{result.field}", "message": result.message}
            elif isinstance(result, Exception):  # logged where it happened; this query alone failed
                error = {"field": f"queries[{i}]", "message": f"internal error ({type(result).__name__}); "
                                                               "see the server log"}
            else:
                out.append("{" + answer_json(limits, result, body.offset, budget) + "}")
                continue
            out.append(json.dumps({"error": error}, ensure_ascii=False))
        return Response(head(name, generation) + ',"batch":[' + ",".join(out) + '],"warnings":' + warnings_json(results)
                        + "}", media_type="application/json")


def _add_relations_and_score(router: APIRouter, served: Served) -> None:
    limits, pick = served.limits, served.pick

    @router.get("/relations", summary="The relation operators and re-ranking heads of an index's bundle",
                responses=READ_ERRORS)
    async def relations(index: str | None = None):
        name, batcher = pick(index)
        return {"index": name, "relations": batcher.index.relations()}

    @router.post("/score", summary="Every relation's score for a → b: what --relation runs, its recipe's dense part",
                 responses=SEARCH_ERRORS)
    async def score(body: ScoreBody):
        name, batcher = pick(body.index)
        deadline = time.monotonic() + limits.timeout_s
        try:
            if body.ids is not None and (body.a, body.b) == (None, None):
                scores = await asyncio.wait_for(batcher.call(batcher.index.score_ids, *body.ids, deadline=deadline),
                                                limits.timeout_s)
                return {"index": name, "scores": scores}
            if body.ids is not None:
                raise RequestError("ids", "give a and b, or ids")
            scores = await asyncio.wait_for(batcher.call(batcher.index.score, body.a, body.b, deadline=deadline),
                                            limits.timeout_s)
        except (asyncio.TimeoutError, SearchStopped):
            raise HTTPException(503, f"score did not finish within {limits.timeout_s} s") from None
        return {"index": name, "scores": dict(scores), "warnings": getattr(scores, "warnings", [])}
