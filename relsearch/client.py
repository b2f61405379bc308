"""A small HTTP client for ``relsearch serve`` (standard library only)::

    from relsearch.client import Client

    client = Client("http://127.0.0.1:8000")  # api_key=... or $RELSEARCH_API_KEY when the server wants one
    hits = client.search(text="cloud software", relations={"similar-company": 1.0}, k=5)
    print([(h["id"], h["score"]) for h in hits])
    print(hits.warnings)  # filter operators that can never match in this index, if any

Each method returns the server's JSON (hits are dicts: ``rank``, ``id``, ``score``, ``text``, the
metadata and, with ``explain``, ``explain``). ``search`` and ``search_batch`` return a list as
before, a :class:`Results` that also carries the answer's ``warnings``, ``generation`` and
``index``. A 4xx/5xx answer raises :class:`ClientError` carrying the status and the field the
server blamed. Bodies are sent as ``Content-Type: application/json`` (the server refuses any
other type). One keep-alive connection per client; not shared between threads (make one client
per thread).
"""
from __future__ import annotations

import http.client
import json
import os
import urllib.parse


class ClientError(RuntimeError):
    def __init__(self, status: int, field: str | None, message: str):
        super().__init__(f"HTTP {status}" + (f" ({field})" if field else "") + f": {message}")
        self.status, self.field, self.message = status, field, message


class Scores(dict):
    """``Client.score``'s answer: relation → score, with ``warnings``."""

    warnings: list[str] = []


class Results(list):
    """The hits of ``Client.search`` (or the per-query answers of ``search_batch``): a ``list``, so code
    that used the plain list keeps working, with the rest of the answer: ``warnings`` (one line per
    filter operator that can never match in this index, as ``relsearch.api.Hits.warnings``),
    ``generation`` and ``index`` (the generation and index that answered); for ``search``, ``mode``
    and ``recipe``: what the query plan ran (``dense``, ``recipe``, ``rrf`` or ``projection``, the
    scale of the scores; the combined recipe as a dict, as ``relsearch.api.Hits``); a batch's
    entries carry their own."""

    def __init__(self, items=(), *, warnings=(), generation: str | None = None, index: str | None = None,
                 facets: dict | None = None, mode: str | None = None, recipe: dict | None = None):
        super().__init__(items)
        self.warnings: list[str] = list(warnings)
        self.generation, self.index = generation, index
        self.facets: dict = facets or {}  # field → [[value, count], ...] when the search asked for facets
        self.mode, self.recipe = mode, recipe

    @classmethod
    def of(cls, answer: dict, key: str) -> Results:
        return cls(answer[key], warnings=answer.get("warnings", ()), generation=answer.get("generation"),
                   index=answer.get("index"), facets=answer.get("facets"), mode=answer.get("mode"),
                   recipe=answer.get("recipe"))


class Client:
    def __init__(self, url: str = "http://127.0.0.1:8000", *, api_key: str | None = None, timeout: float = 60.0,
                 index: str | None = None):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"expected an http(s):// URL, got {url!r}")
        self.scheme, self.host, self.port = parsed.scheme, parsed.hostname, parsed.port
        self.base = parsed.path.rstrip("/")
        self.timeout, self.index = timeout, index
        self.api_key = api_key if api_key is not None else os.environ.get("RELSEARCH_API_KEY")
        self._conn: http.client.HTTPConnection | None = None

    # ------------------------------------------------------------ endpoints

    def health(self) -> dict:
        return self.request("GET", "/health")

    def search(self, text: str | None = None, *, id: str | None = None, **options) -> Results:
        """Hits for one query, with the answer's ``warnings`` (:class:`Results`); ``options``:
        relations, k, offset, min_score, filters, explain, rerank, ..."""
        body = {"text": text, "id": id, **options}
        return Results.of(self.request("POST", "/search", self._with_index(body)), "results")

    def search_batch(self, queries: list[dict], **options) -> Results:
        """``queries``: ``{"text"}`` or ``{"id"}`` (optional ``relations``) each; per query
        ``{"results": [...], "mode": ..., "recipe": {...}}`` or ``{"error": {...}}``, with the batch's
        ``warnings`` (:class:`Results`)."""
        answer = self.request("POST", "/search/batch", self._with_index({"queries": queries, **options}))
        return Results.of(answer, "batch")

    def relations(self) -> list[dict]:
        path = "/relations" + (f"?index={urllib.parse.quote(self.index)}" if self.index else "")
        return self.request("GET", path)["relations"]

    def score(self, a: str, b: str) -> dict[str, float]:
        """relation → score of what ``--relation`` runs for a → b; ``.warnings`` names the recipe
        parts (BM25, bonuses) a pair of texts cannot give."""
        answer = self.request("POST", "/score", self._with_index({"a": a, "b": b}))
        scores = Scores(answer["scores"])
        scores.warnings = list(answer.get("warnings", ()))
        return scores

    def add(self, documents: list[dict]) -> dict:
        return self.request("POST", "/documents", self._with_index({"documents": documents}))

    def delete(self, ids: list[str]) -> dict:
        return self.request("POST", "/documents/delete", self._with_index({"ids": list(ids)}))

    def metrics(self) -> str:
        return self.request("GET", "/metrics", raw=True)

    # ------------------------------------------------------------ plumbing

    def _with_index(self, body: dict) -> dict:
        body = {k: v for k, v in body.items() if v is not None}
        return {"index": self.index, **body} if self.index else body

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
            self._conn = cls(self.host, self.port, timeout=self.timeout)
        return self._conn

    def request(self, method: str, path: str, body: dict | None = None, *, raw: bool = False):
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body, allow_nan=False).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        for attempt in (1, 2):  # a keep-alive connection the server closed is reopened once
            conn = self._connection()
            try:
                conn.request(method, self.base + path, body=data, headers=headers)
                response = conn.getresponse()
                payload = response.read()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if attempt == 2:
                    raise
        if response.status >= 400:
            try:
                error = json.loads(payload)["error"]
                raise ClientError(response.status, error.get("field"), error.get("message", ""))
            except (ValueError, KeyError, TypeError):
                raise ClientError(response.status, None, payload[:200].decode("utf-8", "replace")) from None
        return payload.decode("utf-8") if raw else json.loads(payload)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
