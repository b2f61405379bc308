"""A small in-process stand-in for Elasticsearch, for tests that drive the official client over real HTTP.

It speaks just enough of the REST API: ``GET /`` (info, version 9.x), ``HEAD/PUT/DELETE /<index>``,
``GET /<index>/_mapping``, ``POST [/<index>]/_bulk`` (NDJSON), ``POST /<index>/_refresh``,
``GET|POST /<index>/_count``, ``GET|POST /<index>/_search`` (top-level ``knn``, ``query`` with
``match``/``bool``/``term``/``terms``, and the ``rrf`` retriever over ``standard`` and ``knn``
retrievers), ``POST /_aliases`` and ``GET /_alias/<name>``. Every response carries
``X-Elastic-Product: Elasticsearch`` (the client refuses servers without it).

Searches are exact: kNN scores every stored vector, ``(1 + dot) / 2`` like ``dot_product``;
``match`` is a plain BM25 over lower-cased word tokens, or over the tokens and with the k1 / b of
the text field's custom ``pattern`` analyzer, ``stop`` filter and BM25 ``similarity`` when the
index's settings define them; RRF is implemented here independently of
``relsearch``, so tests compare against it rather than against the code under test.

It records every request (method, path, query, headers, body) and can be scripted: whole-request
failures (``fail_next``: e.g. 429 for the first N bulk requests, 503 once on a search), per-item
bulk errors (``fail_item``), a required ``Authorization`` header (``require_auth``), and an
RRF licence refusal (``rrf_allowed = False``).

Bounded: binds 127.0.0.1 on an ephemeral port, caps request bodies and the request log, and a
watchdog shuts it down after ``lifetime_s`` even if a test forgets to.
"""
from __future__ import annotations

import json
import math
import re
import threading
from collections import Counter, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

MAX_BODY = 32 * 1024 * 1024
VERSION = "9.1.0"
_TOKEN = re.compile(r"\w+", re.UNICODE)


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-cased names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def ndjson(self) -> list[Any]:
        return [json.loads(line) for line in self.body.splitlines() if line.strip()]


@dataclass
class _Failure:
    method: str
    path: re.Pattern
    status: int
    times: int
    error_type: str
    reason: str


@dataclass
class _Index:
    mappings: dict[str, Any]
    settings: dict[str, Any]
    docs: dict[str, dict[str, Any]] = field(default_factory=dict)


class ApiError(Exception):
    def __init__(self, status: int, error_type: str, reason: str):
        super().__init__(reason)
        self.status, self.error_type, self.reason = status, error_type, reason

    def body(self) -> dict[str, Any]:
        cause = {"type": self.error_type, "reason": self.reason}
        return {"error": {"root_cause": [cause], **cause}, "status": self.status}


def _get_path(source: dict[str, Any], path: str) -> Any:
    value: Any = source
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _same(stored: Any, wanted: Any) -> bool:
    """Term equality with Elasticsearch-like coercion of the query value to the field's type."""
    if isinstance(stored, list):
        return any(_same(s, wanted) for s in stored)
    if isinstance(stored, bool):
        return str(wanted).lower() == str(stored).lower()
    if isinstance(stored, (int, float)):
        try:
            return float(wanted) == float(stored)
        except (TypeError, ValueError):
            return False
    return stored == wanted


_ANALYSIS = threading.local()  # the searched index's text analysis, set per request by _search


def _tokens(text: str) -> list[str]:
    pattern, stop = getattr(_ANALYSIS, "tokens", (_TOKEN, frozenset()))
    return [t for t in pattern.findall(str(text).lower()) if t not in stop]


def _analysis(settings: dict[str, Any], mappings: dict[str, Any]) -> tuple[tuple, tuple[float, float]]:
    """((token pattern, stop words), (k1, b)) of the text field: a custom analyzer of a ``pattern``
    tokenizer (group 0), ``lowercase`` and ``stop`` filters, and a BM25 ``similarity``, as
    relsearch's mirror sets them; the default \\w+ tokens and k1 = 1.2, b = 0.75 otherwise."""
    text = mappings.get("properties", {}).get("text", {})
    analysis = settings.get("analysis", {})
    analyzer = analysis.get("analyzer", {}).get(text.get("analyzer"))
    tokens = (_TOKEN, frozenset())
    if analyzer:
        tokenizer = analysis.get("tokenizer", {}).get(analyzer["tokenizer"], {})
        stop = {w for f in analyzer.get("filter", []) for w in analysis.get("filter", {}).get(f, {}).get("stopwords", [])}
        tokens = (re.compile(tokenizer.get("pattern", r"\w+"), re.UNICODE), frozenset(stop))
    similarity = settings.get("similarity", {}).get(text.get("similarity"), {})
    return tokens, (float(similarity.get("k1", 1.2)), float(similarity.get("b", 0.75)))


class EsTestServer:
    """Start with ``EsTestServer()`` (or as a context manager); ``url``; ``close()``."""

    def __init__(self, *, lifetime_s: float = 120.0, max_requests_logged: int = 10_000):
        self.indices: dict[str, _Index] = {}
        self.aliases: dict[str, set[str]] = {}  # alias → indices
        self.requests: deque[Recorded] = deque(maxlen=max_requests_logged)
        self.required_auth: str | None = None
        self.rrf_allowed = True
        self._failures: list[_Failure] = []
        self._item_failures: dict[str, list] = {}
        self._lock = threading.RLock()
        handler = type("Handler", (_Handler,), {"es": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="es-test-server", daemon=True)
        self._thread.start()
        self._watchdog = threading.Timer(lifetime_s, self.close)
        self._watchdog.daemon = True
        self._watchdog.start()
        self._closed = False

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._watchdog.cancel()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> EsTestServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- scripting ----------------------------------------------------------------------

    def fail_next(self, method: str, path_regex: str, status: int, *, times: int = 1,
                  error_type: str | None = None, reason: str = "scripted failure") -> None:
        """The next ``times`` requests matching method and path (``re.fullmatch``) get ``status``."""
        default_type = {429: "es_rejected_execution_exception", 503: "unavailable_shards_exception"}
        with self._lock:
            self._failures.append(_Failure(method.upper(), re.compile(path_regex), status, times,
                                           error_type or default_type.get(status, "exception"), reason))

    def fail_item(self, doc_id: str, status: int = 400, *, times: int | None = None,
                  error_type: str = "document_parsing_exception", reason: str = "scripted item failure") -> None:
        """Bulk items for ``doc_id`` fail with ``status`` (``times`` None: always)."""
        with self._lock:
            self._item_failures[doc_id] = [status, times, error_type, reason]

    def require_auth(self, authorization: str | None) -> None:
        """Answer 401 unless the ``Authorization`` header equals this value (None: no check)."""
        self.required_auth = authorization

    def recorded(self, method: str | None = None, path_regex: str | None = None) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if (method is None or r.method == method.upper())
                    and (path_regex is None or re.fullmatch(path_regex, r.path))]

    # ---- dispatch -----------------------------------------------------------------------

    def handle(self, rec: Recorded) -> tuple[int, Any]:
        with self._lock:
            self.requests.append(rec)
            if self.required_auth is not None and rec.headers.get("authorization") != self.required_auth:
                raise ApiError(401, "security_exception", "unable to authenticate user for REST request")
            for failure in self._failures:
                if failure.times > 0 and failure.method == rec.method and failure.path.fullmatch(rec.path):
                    failure.times -= 1
                    raise ApiError(failure.status, failure.error_type, failure.reason)
            parts = [unquote(p) for p in rec.path.strip("/").split("/") if p]
            body = rec.body
            m = rec.method
            if not parts:
                if m in ("GET", "HEAD"):
                    return 200, self._info()
            elif parts == ["_bulk"] or (len(parts) == 2 and parts[1] == "_bulk"):
                if m in ("POST", "PUT"):
                    return 200, self._bulk(rec.ndjson(), parts[0] if len(parts) == 2 else None)
            elif parts == ["_aliases"] and m == "POST":
                return 200, self._update_aliases(json.loads(body))
            elif len(parts) == 2 and parts[0] == "_alias" and m == "GET":
                return self._get_alias(parts[1])
            elif len(parts) == 1:
                if m == "HEAD":
                    return (200 if self._resolve(parts[0], missing_ok=True) else 404), None
                if m == "PUT":
                    return 200, self._create(parts[0], json.loads(body) if body else {})
                if m == "DELETE":
                    return 200, self._delete(parts[0])
            elif len(parts) == 2 and parts[1] == "_refresh" and m in ("POST", "GET"):
                self._resolve(parts[0])
                return 200, {"_shards": {"total": 1, "successful": 1, "failed": 0}}
            elif len(parts) == 2 and parts[1] == "_mapping" and m == "GET":
                return 200, {i: {"mappings": self.indices[i].mappings} for i in self._resolve(parts[0])}
            elif len(parts) == 2 and parts[1] == "_count" and m in ("GET", "POST"):
                return 200, {"count": sum(len(self.indices[i].docs) for i in self._resolve(parts[0]))}
            elif len(parts) == 2 and parts[1] == "_search" and m in ("GET", "POST"):
                return 200, self._search(parts[0], json.loads(body) if body else {}, rec.query)
            raise ApiError(405 if parts else 400, "illegal_argument_exception",
                           f"test server: unsupported {m} /{'/'.join(parts)}")

    def _info(self) -> dict[str, Any]:
        return {"name": "es-test", "cluster_name": "relsearch-tests", "cluster_uuid": "test",
                "version": {"number": VERSION, "build_flavor": "default", "build_type": "docker",
                            "lucene_version": "10.2.2", "minimum_wire_compatibility_version": "8.19.0",
                            "minimum_index_compatibility_version": "8.0.0"},
                "tagline": "You Know, for Search"}

    def _resolve(self, name: str, *, missing_ok: bool = False) -> list[str]:
        if name in self.indices:
            return [name]
        if name in self.aliases:
            return sorted(self.aliases[name])
        if missing_ok:
            return []
        raise ApiError(404, "index_not_found_exception", f"no such index [{name}]")

    def _create(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        if name in self.indices or name in self.aliases:
            raise ApiError(400, "resource_already_exists_exception", f"index [{name}] already exists")
        self.indices[name] = _Index(mappings=body.get("mappings", {}), settings=body.get("settings", {}))
        return {"acknowledged": True, "shards_acknowledged": True, "index": name}

    def _delete(self, name: str) -> dict[str, Any]:
        if name not in self.indices:
            raise ApiError(404, "index_not_found_exception", f"no such index [{name}]")
        del self.indices[name]
        for members in self.aliases.values():
            members.discard(name)
        return {"acknowledged": True}

    def _update_aliases(self, body: dict[str, Any]) -> dict[str, Any]:
        new = {a: set(m) for a, m in self.aliases.items()}
        for action in body.get("actions", []):
            (kind, spec), = action.items()
            index, alias = spec["index"], spec["alias"]
            if index not in self.indices:
                raise ApiError(404, "index_not_found_exception", f"no such index [{index}]")
            if kind == "add":
                if alias in self.indices:
                    raise ApiError(400, "invalid_alias_name_exception",
                                   f"an index or data stream exists with the same name as the alias [{alias}]")
                new.setdefault(alias, set()).add(index)
            elif kind == "remove":
                if index not in new.get(alias, set()):
                    raise ApiError(404, "aliases_not_found_exception", f"aliases [{alias}] missing")
                new[alias].discard(index)
        self.aliases = {a: m for a, m in new.items() if m}  # all actions apply, or none
        return {"acknowledged": True, "errors": False}

    def _get_alias(self, alias: str) -> tuple[int, Any]:
        if alias not in self.aliases:
            return 404, {"error": f"alias [{alias}] missing", "status": 404}
        return 200, {i: {"aliases": {alias: {}}} for i in sorted(self.aliases[alias])}

    # ---- bulk -----------------------------------------------------------------------------

    def _bulk(self, lines: list[Any], default_index: str | None) -> dict[str, Any]:
        items = []
        i = 0
        while i < len(lines):
            (op, meta), = lines[i].items()
            i += 1
            source = None
            if op in ("index", "create", "update"):
                source, i = lines[i], i + 1
            index = meta.get("_index", default_index)
            doc_id = str(meta.get("_id"))
            try:
                items.append({op: self._bulk_item(op, index, doc_id, source)})
            except ApiError as e:
                items.append({op: {"_index": index, "_id": doc_id, "status": e.status,
                                   "error": {"type": e.error_type, "reason": e.reason}}})
        return {"took": 1, "errors": any("error" in next(iter(it.values())) for it in items), "items": items}

    def _bulk_item(self, op: str, index: str | None, doc_id: str, source: Any) -> dict[str, Any]:
        scripted = self._item_failures.get(doc_id)
        if scripted is not None and (scripted[1] is None or scripted[1] > 0):
            if scripted[1] is not None:
                scripted[1] -= 1
            raise ApiError(scripted[0], scripted[2], scripted[3])
        if index is None or index not in self.indices:
            raise ApiError(404, "index_not_found_exception", f"no such index [{index}]")
        idx = self.indices[index]
        if op == "delete":
            found = idx.docs.pop(doc_id, None) is not None
            return {"_index": index, "_id": doc_id, "status": 200 if found else 404,
                    "result": "deleted" if found else "not_found"}
        if op not in ("index", "create"):
            raise ApiError(400, "illegal_argument_exception", f"test server: bulk op [{op}] unsupported")
        if op == "create" and doc_id in idx.docs:
            raise ApiError(409, "version_conflict_engine_exception", f"[{doc_id}]: document already exists")
        self._validate(idx.mappings, source, doc_id)
        created = doc_id not in idx.docs
        idx.docs[doc_id] = source
        return {"_index": index, "_id": doc_id, "_version": 1, "result": "created" if created else "updated",
                "status": 201 if created else 200}

    def _validate(self, mappings: dict[str, Any], source: dict[str, Any], doc_id: str) -> None:
        props = mappings.get("properties", {})
        if mappings.get("dynamic") == "strict":
            for key in source:
                if key not in props:
                    raise ApiError(400, "strict_dynamic_mapping_exception",
                                   f"[1:1] mapping set to strict, dynamic introduction of [{key}] within [_doc] "
                                   "is not allowed")
        for key, spec in props.items():
            value = source.get(key)
            if value is None:
                continue
            kind = spec.get("type")
            if kind == "dense_vector":
                if not isinstance(value, list) or len(value) != spec["dims"]:
                    got = len(value) if isinstance(value, list) else "?"
                    raise ApiError(400, "document_parsing_exception",
                                   f"The [dense_vector] field [{key}] in doc [{doc_id}] has a different number "
                                   f"of dimensions [{got}] than defined in the mapping [{spec['dims']}]")
                if spec.get("similarity") == "dot_product" and abs(sum(v * v for v in value) - 1) > 1e-4:
                    raise ApiError(400, "document_parsing_exception",
                                   "The [dot_product] similarity can only be used with unit-length vectors.")
            elif kind == "object" and isinstance(value, dict):
                for sub, sub_value in value.items():
                    sub_kind = spec.get("properties", {}).get(sub, {}).get("type")
                    if sub_kind in ("long", "double", "float") and not all(map(_numeric, _as_list(sub_value))):
                        raise ApiError(400, "document_parsing_exception",
                                       f"failed to parse field [{key}.{sub}] of type [{sub_kind}] in document "
                                       f"with id '{doc_id}'")

    # ---- search ---------------------------------------------------------------------------

    def _search(self, name: str, body: dict[str, Any], query: dict[str, list[str]]) -> dict[str, Any]:
        indices = self._resolve(name)
        docs = [(i, doc_id, src) for i in indices for doc_id, src in self.indices[i].docs.items()]
        size = int(body.get("size", 10))
        if indices:
            _ANALYSIS.tokens, _ANALYSIS.bm25 = _analysis(self.indices[indices[0]].settings, self.indices[indices[0]].mappings)
        if "retriever" in body:
            ranked = self._retriever(body["retriever"], docs, indices, size)
        elif "knn" in body:
            if "query" in body:
                raise ApiError(400, "illegal_argument_exception", "test server: knn + query is unsupported")
            ranked = self._knn(body["knn"], docs, indices)[:size]
        else:
            ranked = self._query(body.get("query", {"match_all": {}}), docs)[:size]
        excludes = set(body.get("_source", {}).get("excludes", [])) if isinstance(body.get("_source"), dict) else set()
        excludes |= {e for v in query.get("_source_excludes", []) for e in v.split(",")}
        hits = [{"_index": i, "_id": doc_id, "_score": score,
                 "_source": {k: v for k, v in src.items() if k not in excludes}}
                for score, i, doc_id, src in ranked]
        return {"took": 1, "timed_out": False, "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0},
                "hits": {"total": {"value": len(hits), "relation": "eq"},
                         "max_score": hits[0]["_score"] if hits else None, "hits": hits}}

    def _vector_spec(self, indices: list[str], field_name: str) -> dict[str, Any]:
        for i in indices:
            spec = self.indices[i].mappings.get("properties", {}).get(field_name)
            if spec and spec.get("type") == "dense_vector":
                return spec
        raise ApiError(400, "illegal_argument_exception", f"field [{field_name}] is not a dense_vector")

    def _knn(self, knn: dict[str, Any], docs, indices) -> list[tuple]:
        if isinstance(knn, list):
            raise ApiError(400, "illegal_argument_exception", "test server: only one knn clause is supported")
        spec = self._vector_spec(indices, knn["field"])
        qv, k, nc = knn["query_vector"], int(knn["k"]), int(knn["num_candidates"])
        if nc < k:
            raise ApiError(400, "illegal_argument_exception",
                           f"[num_candidates] cannot be less than [k]; num_candidates={nc}, k={k}")
        if nc > 10_000:
            raise ApiError(400, "illegal_argument_exception", "[num_candidates] cannot exceed [10000]")
        if len(qv) != spec["dims"]:
            raise ApiError(400, "illegal_argument_exception",
                           f"The query vector has a different number of dimensions [{len(qv)}] than the "
                           f"document vectors [{spec['dims']}].")
        qnorm = math.sqrt(sum(v * v for v in qv))
        if spec.get("similarity") == "dot_product" and abs(qnorm * qnorm - 1) > 1e-4:
            raise ApiError(400, "illegal_argument_exception",
                           "The [dot_product] similarity can only be used with unit-length vectors.")
        filters = knn.get("filter", [])
        scored = []
        for i, doc_id, src in docs:
            vec = src.get(knn["field"])
            if vec is None or not self._filter(filters, src):
                continue
            dot = sum(a * b for a, b in zip(qv, vec))
            if spec.get("similarity") == "cosine":
                dot /= max(qnorm * math.sqrt(sum(v * v for v in vec)), 1e-12)
            scored.append(((1.0 + dot) / 2.0, i, doc_id, src))
        scored.sort(key=lambda t: (-t[0], t[2]))
        return scored[:k]

    def _filter(self, filters: Any, src: dict[str, Any]) -> bool:
        clauses = filters if isinstance(filters, list) else [filters]
        return all(self._matches(c, src) for c in clauses)

    def _matches(self, clause: dict[str, Any], src: dict[str, Any]) -> bool:
        (kind, spec), = clause.items()
        if kind == "match_all":
            return True
        if kind == "term":
            (path, value), = spec.items()
            value = value["value"] if isinstance(value, dict) else value
            return _same(_get_path(src, path), value)
        if kind == "terms":
            (path, values), = spec.items()
            return any(_same(_get_path(src, path), v) for v in values)
        if kind == "bool":
            for key in ("must", "filter"):
                if not self._filter(spec.get(key, []), src):
                    return False
            return not any(self._matches(c, src) for c in _as_list(spec.get("must_not", [])))
        if kind == "match":
            (path, text), = spec.items()
            text = text["query"] if isinstance(text, dict) else text
            return bool(set(_tokens(text)) & set(_tokens(_get_path(src, path) or "")))
        raise ApiError(400, "parsing_exception", f"test server: unknown query [{kind}]")

    def _query(self, query: dict[str, Any], docs) -> list[tuple]:
        """Scores a ``match``, or a ``bool`` with ``match`` in must and filters, by BM25."""
        (kind, spec), = query.items()
        filters: list = []
        if kind == "bool":
            musts = [c for c in _as_list(spec.get("must", [])) if "match" in c]
            filters = [c for c in _as_list(spec.get("must", [])) if "match" not in c] + _as_list(spec.get("filter", []))
            if len(musts) != 1:
                raise ApiError(400, "parsing_exception", "test server: bool needs exactly one match in must")
            match = musts[0]["match"]
        elif kind == "match":
            match = spec
        elif kind == "match_all":
            return [(1.0, i, d, s) for i, d, s in sorted(docs, key=lambda t: t[1])]
        else:
            raise ApiError(400, "parsing_exception", f"test server: unknown query [{kind}]")
        (path, _), = match.items()
        df: Counter = Counter()
        lengths = []
        for _, _, src in docs:
            toks = _tokens(_get_path(src, path) or "")
            lengths.append(len(toks))
            df.update(set(toks))
        avgdl = (sum(lengths) / len(lengths)) if lengths else 1.0
        scored = []
        for i, doc_id, src in docs:
            if not self._filter(filters, src):
                continue
            score = self._match_score(match, src, df, len(docs), avgdl)
            if score > 0:
                scored.append((score, i, doc_id, src))
        scored.sort(key=lambda t: (-t[0], t[2]))
        return scored

    @staticmethod
    def _match_score(match: dict[str, Any], src: dict[str, Any], df: Counter, n: int, avgdl: float = 1.0) -> float:
        (path, spec), = match.items()
        text = spec["query"] if isinstance(spec, dict) else spec
        toks = _tokens(_get_path(src, path) or "")
        tf = Counter(toks)
        score = 0.0
        for term in set(_tokens(text)):
            if tf[term]:
                idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
                k1, b = getattr(_ANALYSIS, "bm25", (1.2, 0.75))
                score += idf * tf[term] * (k1 + 1) / (tf[term] + k1 * (1 - b + b * len(toks) / max(avgdl, 1e-9)))
        return score

    def _retriever(self, retriever: dict[str, Any], docs, indices, size: int) -> list[tuple]:
        (kind, spec), = retriever.items()
        if kind == "standard":
            filters = _as_list(spec.get("filter", []))
            ranked = self._query(spec.get("query", {"match_all": {}}), docs)
            return [r for r in ranked if self._filter(filters, r[3])][:size]
        if kind == "knn":
            return self._knn(spec, docs, indices)[:size]
        if kind != "rrf":
            raise ApiError(400, "parsing_exception", f"test server: unknown retriever [{kind}]")
        if not self.rrf_allowed:
            raise ApiError(403, "security_exception",
                           "current license is non-compliant for [Reciprocal Rank Fusion (RRF)]")
        window = int(spec.get("rank_window_size", 10))
        constant = int(spec.get("rank_constant", 60))
        if window < size:
            raise ApiError(400, "illegal_argument_exception", "[rank_window_size] must be >= [size]")
        fused: dict[str, list] = {}
        for child in spec["retrievers"]:
            for rank, (_, i, doc_id, src) in enumerate(self._retriever(child, docs, indices, window), start=1):
                entry = fused.setdefault(doc_id, [0.0, i, doc_id, src])
                entry[0] += 1.0 / (constant + rank)
        ranked = sorted((tuple(e) for e in fused.values()), key=lambda t: (-t[0], t[2]))
        return ranked[:size]


def _numeric(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


class _Handler(BaseHTTPRequestHandler):
    es: EsTestServer
    protocol_version = "HTTP/1.1"
    timeout = 10  # an idle keep-alive connection releases its thread
    disable_nagle_algorithm = True  # headers and body go out in two writes; avoid 40 ms stalls

    def log_message(self, format, *args):  # keep test output quiet
        pass

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._reply(413, ApiError(413, "request_entity_too_large", "body too large").body())
            self.close_connection = True
            return
        body = self.rfile.read(length) if length else b""
        split = urlsplit(self.path)
        rec = Recorded(self.command, split.path, parse_qs(split.query),
                       {k.lower(): v for k, v in self.headers.items()}, body)
        try:
            status, payload = self.es.handle(rec)
        except ApiError as e:
            status, payload = e.status, e.body()
        except (ValueError, KeyError, TypeError) as e:
            status, payload = 400, ApiError(400, "parsing_exception", f"test server: {type(e).__name__}: {e}").body()
        self._reply(status, payload)

    def _reply(self, status: int, payload: Any) -> None:
        data = b"" if payload is None or self.command == "HEAD" else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("X-Elastic-Product", "Elasticsearch")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data:
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _serve
