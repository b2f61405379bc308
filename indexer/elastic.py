"""Elasticsearch mirror of an index: connect, map, bulk-load, publish under an alias.

Documents are stored as ``{"id", "text", "vector", "norm", "metadata": {...}}``: ``vector`` is the
unit vector t̂ (a ``dense_vector`` with ``dot_product`` similarity, design.md §3), ``norm`` the raw
‖h‖, ``text`` analysed for BM25, and ``metadata`` holds keyword / numeric / boolean fields that
queries filter on (``metadata.<field>``). The read side lives in ``relsearch.retrieval.elastic``.

Credentials come from the environment or a JSON file, never from argv (design.md §7); they are
handed to the official client only and never logged or put in messages.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import logging
import math
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import numpy as np

from ..version import __version__

if TYPE_CHECKING:
    from elasticsearch import Elasticsearch

log = logging.getLogger(__name__)

ID_FIELD, TEXT_FIELD, VECTOR_FIELD, NORM_FIELD, METADATA_FIELD = "id", "text", "vector", "norm", "metadata"

ENV_API_KEY = "RELSEARCH_ES_API_KEY"
ENV_USER = "RELSEARCH_ES_USER"
ENV_PASSWORD = "RELSEARCH_ES_PASSWORD"
ENV_CREDENTIALS = "RELSEARCH_ES_CREDENTIALS"

SIMILARITIES = ("dot_product", "cosine")  # both score (1 + cos) / 2 on unit vectors
HNSW_TYPES = ("hnsw", "int8_hnsw", "int4_hnsw", "bbq_hnsw")
FLAT_TYPES = ("flat", "int8_flat", "int4_flat", "bbq_flat")
INDEX_TYPES = HNSW_TYPES + FLAT_TYPES
# 5xx and timeouts are retried by the transport; 429 is left to the bulk helper, which backs off.
TRANSPORT_RETRY_STATUS = (502, 503, 504)

_INDEX_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def _require_elasticsearch():
    try:
        import elasticsearch
    except ImportError as e:  # pragma: no cover - install-time problem
        raise ImportError("the Elasticsearch backend needs the official client: pip install 'elasticsearch>=8.12'") from e
    return elasticsearch


# --------------------------------------------------------------------------------------------
# Connection and credentials
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Credentials:
    kind: str  # "api_key" | "basic" | "none"
    source: str  # where they came from, for logs: an env var name or "credentials file"
    api_key: str | None = dataclasses.field(default=None, repr=False)
    user: str | None = dataclasses.field(default=None, repr=False)
    password: str | None = dataclasses.field(default=None, repr=False)


def _credentials_from_file(path: Path) -> _Credentials:
    try:
        mode = path.stat().st_mode
        raw = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"cannot read Elasticsearch credentials file {str(path)!r}: {e.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("Elasticsearch credentials file %s is readable by other users; chmod 600 it", path)
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        # `from None`: the decode error carries the file's text, which is the secret.
        raise ValueError(f"Elasticsearch credentials file {str(path)!r} is not valid JSON") from None
    if not isinstance(data, dict):
        raise ValueError(f"Elasticsearch credentials file {str(path)!r} must hold a JSON object")
    if data.get("api_key"):
        return _Credentials("api_key", "credentials file", api_key=str(data["api_key"]))
    user = data.get("username") or data.get("user")
    if user and data.get("password"):
        return _Credentials("basic", "credentials file", user=str(user), password=str(data["password"]))
    raise ValueError(
        f"Elasticsearch credentials file {str(path)!r} must hold either \"api_key\" or "
        f"\"username\" and \"password\" (keys found: {sorted(data)})"
    )


def resolve_credentials(credentials_file: str | os.PathLike | None = None,
                        environ: Mapping[str, str] | None = None) -> _Credentials:
    """Pick credentials, first found wins: ``credentials_file``; ``RELSEARCH_ES_API_KEY``;
    ``RELSEARCH_ES_USER`` + ``RELSEARCH_ES_PASSWORD``; the file named by ``RELSEARCH_ES_CREDENTIALS``;
    else none. The returned object's repr shows only the kind and the source."""
    env = os.environ if environ is None else environ
    if credentials_file is not None:
        return _credentials_from_file(Path(credentials_file))
    if env.get(ENV_API_KEY):
        return _Credentials("api_key", ENV_API_KEY, api_key=env[ENV_API_KEY])
    user, password = env.get(ENV_USER), env.get(ENV_PASSWORD)
    if user or password:
        if not (user and password):
            missing = ENV_PASSWORD if user else ENV_USER
            raise ValueError(f"{ENV_USER} and {ENV_PASSWORD} go together; {missing} is not set")
        return _Credentials("basic", ENV_USER, user=user, password=password)
    if env.get(ENV_CREDENTIALS):
        return _credentials_from_file(Path(env[ENV_CREDENTIALS]))
    return _Credentials("none", "no credentials")


def connect(url: str, *, credentials_file: str | os.PathLike | None = None, ca_certs: str | None = None,
            retries: int = 3, retry_backoff: float = 0.5, request_timeout: float = 30.0,
            environ: Mapping[str, str] | None = None) -> Elasticsearch:
    """Open an ``elasticsearch.Elasticsearch`` client for ``url`` (``http[s]://host:port``).

    Credentials: see :func:`resolve_credentials` (``environ`` defaults to ``os.environ``). A URL
    that embeds ``user:password@`` is refused. The transport retries connection errors, timeouts
    and 502/503/504 up to ``retries`` times (jittered backoff based on ``retry_backoff`` seconds
    where the installed client supports it); 429 is not retried here: bulk loads back off in
    :func:`bulk_index`, searches opt in per request. Nothing is sent until the first call.
    """
    es = _require_elasticsearch()
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port that is not a number
    except ValueError:
        parts, port = None, None
    if parts is not None and (parts.username is not None or parts.password is not None):
        raise ValueError(f"the Elasticsearch URL must not embed credentials; set {ENV_API_KEY}, "
                         f"{ENV_USER}/{ENV_PASSWORD} or {ENV_CREDENTIALS} instead")
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise ValueError(f"Elasticsearch URL {display_url(url)!r} must look like https://host:9200")
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    creds = resolve_credentials(credentials_file, environ)
    kwargs: dict[str, Any] = dict(max_retries=retries, retry_on_status=TRANSPORT_RETRY_STATUS,
                                  retry_on_timeout=True, request_timeout=request_timeout)
    params = inspect.signature(es.Elasticsearch.__init__).parameters
    if retry_backoff > 0 and "retry_backoff_base" in params:  # elasticsearch-py >= 9.1
        kwargs.update(retry_backoff_base=retry_backoff, retry_backoff_cap=max(retry_backoff, 30.0))
    if ca_certs is not None:
        kwargs["ca_certs"] = ca_certs
    if creds.kind == "api_key":
        kwargs["api_key"] = creds.api_key
    elif creds.kind == "basic":
        kwargs["basic_auth"] = (creds.user, creds.password)
    if creds.kind != "none" and parts.scheme == "http":
        log.warning("sending Elasticsearch credentials over plain http to %s", parts.hostname)
    log.info("Elasticsearch client for %s (auth: %s from %s)", display_url(url), creds.kind, creds.source)
    try:
        return es.Elasticsearch(url, **kwargs)
    except ValueError as e:  # the client's messages quote the URL as given
        raise ValueError(str(e).replace(url, display_url(url))) from None


# --------------------------------------------------------------------------------------------
# Mapping
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class EsIndexConfig:
    """How the ``vector`` field and the index are built.

    ``index_type`` is the ``dense_vector`` ``index_options.type``: HNSW graphs ``hnsw``,
    ``int8_hnsw`` (default: 4x smaller, scores from int8-quantised vectors), ``int4_hnsw``,
    ``bbq_hnsw`` (binary, dims >= 64); or brute force ``flat``, ``int8_flat``, ``int4_flat``,
    ``bbq_flat``. ``m`` / ``ef_construction`` apply to HNSW types only (None: server default,
    16 / 100); ``confidence_interval`` to int8/int4 types. ``shards`` / ``replicas`` None: server
    default. ``similarity`` is ``dot_product`` (documents and queries are unit vectors).
    """

    dims: int
    similarity: str = "dot_product"
    index_type: str = "int8_hnsw"
    m: int | None = None
    ef_construction: int | None = None
    confidence_interval: float | None = None
    text_analyzer: str = "relsearch"  # the local BM25's tokens (text_analysis), so both backends rank alike
    shards: int | None = None
    replicas: int | None = None

    def __post_init__(self):
        if not isinstance(self.dims, int) or not 1 <= self.dims <= 4096:
            raise ValueError(f"dims must be an int in 1..4096, got {self.dims!r}")
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"similarity {self.similarity!r} is not supported; choose one of {', '.join(SIMILARITIES)}")
        if self.index_type not in INDEX_TYPES:
            raise ValueError(f"index_type {self.index_type!r} is unknown; choose one of {', '.join(INDEX_TYPES)}")
        if self.index_type.startswith("bbq") and self.dims < 64:
            raise ValueError(f"index_type {self.index_type!r} needs dims >= 64, got {self.dims}")
        if self.index_type.startswith("int4") and self.dims % 2:
            raise ValueError(f"index_type {self.index_type!r} needs an even dims, got {self.dims}")
        for name in ("m", "ef_construction"):
            value = getattr(self, name)
            if value is not None and self.index_type not in HNSW_TYPES:
                raise ValueError(f"{name} applies to HNSW index types ({', '.join(HNSW_TYPES)}), "
                                 f"not {self.index_type!r}")
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.confidence_interval is not None and not self.index_type.startswith(("int8", "int4")):
            raise ValueError(f"confidence_interval applies to int8/int4 index types, not {self.index_type!r}")
        for name in ("shards", "replicas"):
            value = getattr(self, name)
            if value is not None and value < (1 if name == "shards" else 0):
                raise ValueError(f"{name} must be >= {1 if name == 'shards' else 0}, got {value}")

    def vector_mapping(self) -> dict[str, Any]:
        options: dict[str, Any] = {"type": self.index_type}
        for name in ("m", "ef_construction", "confidence_interval"):
            if getattr(self, name) is not None:
                options[name] = getattr(self, name)
        return {"type": "dense_vector", "dims": self.dims, "index": True,
                "similarity": self.similarity, "index_options": options}


def metadata_types(sample: Mapping[str, Any] | None) -> dict[str, str]:
    """Field → ES type from example values: str → ``keyword``, bool → ``boolean``, int → ``long``,
    float → ``double``; a list takes its first element's type; None values are skipped (a later
    string field still maps to keyword through the index's dynamic template)."""
    types: dict[str, str] = {}
    for field, value in (sample or {}).items():
        if field in ("", None) or "." in str(field):
            raise ValueError(f"metadata field name {field!r} must be non-empty and contain no '.'")
        if isinstance(value, (list, tuple)):
            value = next((v for v in value if v is not None), None)
        if value is None:
            continue
        if isinstance(value, (bool, np.bool_)):
            types[field] = "boolean"
        elif isinstance(value, (int, np.integer)):
            types[field] = "long"
        elif isinstance(value, (float, np.floating)):
            types[field] = "double"
        elif isinstance(value, str):
            types[field] = "keyword"
        else:
            raise ValueError(f"metadata field {field!r}: values of type {type(value).__name__} cannot be "
                             "mapped; use str, int, float, bool or a list of them")
    return types


def index_body(config: EsIndexConfig, metadata_sample: Mapping[str, Any] | None = None,
               meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``{"settings", "mappings"}`` body :func:`create_index` sends (pure; for tests and manifests)."""
    es = _require_elasticsearch()
    mappings = {
        "dynamic": "strict",  # a stray top-level field is a per-document error, not a silent mapping
        "_meta": {"relsearch": {"config": dataclasses.asdict(config), "version": __version__,
                                "client": es.__versionstr__,
                                **dict(meta or {})}},
        "dynamic_templates": [{"metadata_strings": {
            "path_match": f"{METADATA_FIELD}.*", "match_mapping_type": "string",
            "mapping": {"type": "keyword"}}}],
        "properties": {
            ID_FIELD: {"type": "keyword"},
            TEXT_FIELD: {"type": "text", "analyzer": config.text_analyzer, "similarity": "relsearch_bm25"},
            VECTOR_FIELD: config.vector_mapping(),
            NORM_FIELD: {"type": "float"},
            METADATA_FIELD: {"type": "object", "dynamic": True, "properties": {
                field: {"type": t} for field, t in metadata_types(metadata_sample).items()}},
        },
    }
    settings: dict[str, Any] = text_analysis()
    if config.shards is not None:
        settings["number_of_shards"] = config.shards
    if config.replicas is not None:
        settings["number_of_replicas"] = config.replicas
    return {"settings": settings, "mappings": mappings}


def text_analysis() -> dict[str, Any]:
    """Index settings that make Elasticsearch's BM25 the local one (indexer/lexical.py): lower-cased
    ``\\w\\w+`` tokens (Unicode word characters), bm25s's English stop words, Lucene BM25 with the
    same k1 and b. Recipes fuse min-max normalised BM25 scores (retrieval/recipe.py), so with the
    same tokens and parameters both backends rank a recipe's candidates alike (Lucene's one-byte
    length norms aside)."""
    from .lexical import B, K1, stopwords

    return {"analysis": {"tokenizer": {"relsearch_words": {"type": "pattern", "pattern": "\\w\\w+", "group": 0,
                                                           "flags": "UNICODE_CHARACTER_CLASS"}},
                         "filter": {"relsearch_stop": {"type": "stop", "stopwords": stopwords()}},
                         "analyzer": {"relsearch": {"type": "custom", "tokenizer": "relsearch_words",
                                                    "filter": ["lowercase", "relsearch_stop"]}}},
            "similarity": {"relsearch_bm25": {"type": "BM25", "k1": K1, "b": B}}}


_HTTP_ISH = re.compile(r"(?:https?:?/*)?", re.IGNORECASE)  # http://, https://, and typos: http//, http:/


def display_url(url: str) -> str:
    """What a message or log may show of a user-given URL: ``scheme://host:port`` when ``url``
    parses as one (never a path, query or user info). A malformed URL is shown as typed, less its
    user info: everything before the last '@' (``http//user:pw@host``, ``user:pw@host``) and a port
    that is not a number (``http://user:pw``) become ``***``. The one place URLs are redacted."""
    try:
        parts = urlsplit(url)
        if parts.scheme in ("http", "https") and parts.hostname:
            return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    except ValueError:  # a port that is not a number, a broken IPv6 literal
        pass
    scheme = _HTTP_ISH.match(url).group()
    rest = url[len(scheme):]
    if "@" in rest:
        rest = "***@" + rest.rpartition("@")[2]
    host, colon, port = rest.partition(":")
    if colon and not port.split("/")[0].isdigit():
        rest = f"{host}:***"
    return scheme + rest


class ElasticError(RuntimeError):
    """Elasticsearch refused a request or could not be reached. The message names the action and
    the server's answer; it never holds credentials (they travel in headers, never in URLs)."""


@contextlib.contextmanager
def reported(action: str):
    """Turn the client's exceptions into an :class:`ElasticError` saying what failed, so a command
    ends with one clear line instead of a client traceback."""
    es = _require_elasticsearch()
    import elastic_transport

    try:
        yield
    except es.ApiError as e:
        raise ElasticError(f"Elasticsearch refused to {action}: {e.meta.status} {_api_reason(e)}") from None
    except elastic_transport.TransportError as e:
        raise ElasticError(f"cannot {action}: {e.message}") from None


def _api_reason(e) -> str:
    body = getattr(e, "body", None)
    error = body.get("error") if isinstance(body, dict) else body
    if isinstance(error, dict):
        return f"{error.get('type', 'error')}: {error.get('reason', '')}"[:300]
    if error:
        return str(error)[:300]
    return type(e).__name__  # HEAD requests carry no body: AuthenticationException, ...


def check_index_name(name: str) -> str:
    if not isinstance(name, str) or not _INDEX_NAME.match(name) or len(name.encode()) > 255:
        raise ValueError(f"Elasticsearch index name {name!r} is invalid: use lowercase letters, digits, "
                         "'.', '_' and '-', starting with a letter or digit")
    return name


def create_index(client, name: str, config: EsIndexConfig, metadata_sample: Mapping[str, Any] | None = None,
                 *, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Create index ``name`` (which must not exist) and return the body sent.

    ``metadata_sample`` is one record's metadata (field → value) used to type the metadata
    fields; ``meta`` (e.g. the model bundle's name and digest) is stored in the mapping's
    ``_meta.relsearch`` beside the config, and read back by :func:`index_meta`.
    """
    check_index_name(name)
    if client.indices.exists(index=name):
        raise FileExistsError(f"Elasticsearch index or alias {name!r} already exists; pick a new name "
                              "or delete it with delete_index()")
    body = index_body(config, metadata_sample, meta)
    client.indices.create(index=name, mappings=body["mappings"], settings=body["settings"] or None)
    log.info("created Elasticsearch index %s (dims %d, %s, %s)", name, config.dims, config.similarity,
             config.index_type)
    return body


def delete_index(client, name: str, *, missing_ok: bool = True) -> bool:
    """Delete index ``name``; returns whether it existed."""
    es = _require_elasticsearch()
    try:
        client.indices.delete(index=check_index_name(name))
    except es.NotFoundError:
        if not missing_ok:
            raise
        return False
    return True


def index_meta(client, name: str) -> dict[str, Any]:
    """The ``_meta.relsearch`` dict written by :func:`create_index` (``name`` may be an alias)."""
    mappings = client.indices.get_mapping(index=name).body
    for index in sorted(mappings):
        meta = mappings[index].get("mappings", {}).get("_meta", {}).get("relsearch")
        if meta is not None:
            return meta
    raise ValueError(f"Elasticsearch index {name!r} was not created by relsearch (no _meta.relsearch)")


def swap_alias(client, alias: str, index: str) -> list[str]:
    """Point ``alias`` at ``index`` only, in one atomic ``_aliases`` call (design.md §7: write
    aside, then switch). Returns the indices the alias left; deleting them is the caller's call."""
    es = _require_elasticsearch()
    check_index_name(alias)
    try:
        current = sorted(client.indices.get_alias(name=alias).body)
    except es.NotFoundError:
        current = []
    old = [i for i in current if i != index]
    actions = [{"remove": {"index": i, "alias": alias}} for i in old]
    actions.append({"add": {"index": index, "alias": alias}})
    client.indices.update_aliases(actions=actions)
    log.info("alias %s -> %s (was %s)", alias, index, ", ".join(old) or "unset")
    return old


# --------------------------------------------------------------------------------------------
# Bulk loading
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class BulkCounts:
    """``read`` documents consumed = ``indexed`` + ``failed`` (rejected locally or by the server)."""

    read: int
    indexed: int
    failed: int

    @property
    def reconciles(self) -> bool:
        return self.read == self.indexed + self.failed


class BulkAborted(RuntimeError):
    """A request-level failure (after retries) stopped a bulk load. ``counts`` so far;
    ``unresolved`` documents were read but neither confirmed nor rejected."""

    def __init__(self, message: str, counts: BulkCounts):
        super().__init__(message)
        self.counts = counts
        self.unresolved = counts.read - counts.indexed - counts.failed


def _log_rejected(doc_id: str | None, reason: str) -> None:
    log.warning("rejected document %s: %s", doc_id, reason)


def _source(doc: Mapping[str, Any], dims: int | None) -> tuple[str, dict[str, Any]]:
    """Validate one input document; returns (id, ES source). Raises ValueError with the reason."""
    doc_id = doc.get(ID_FIELD)
    if doc_id is None or (isinstance(doc_id, str) and not doc_id) or isinstance(doc_id, bool):
        raise ValueError("missing id")
    if not isinstance(doc_id, (str, int, np.integer)):
        raise ValueError(f"id must be a string or an integer, got {type(doc_id).__name__}")
    doc_id = str(doc_id)
    if VECTOR_FIELD not in doc:
        raise ValueError("missing vector")
    vec = np.asarray(doc[VECTOR_FIELD], dtype=np.float64)
    if vec.ndim != 1 or vec.size == 0:
        raise ValueError(f"vector must be 1-D, got shape {vec.shape}")
    if dims is not None and vec.size != dims:
        raise ValueError(f"vector has {vec.size} dims, the index has {dims}")
    if not np.all(np.isfinite(vec)):
        raise ValueError("vector has NaN or infinite values")
    length = float(np.linalg.norm(vec))
    if length == 0.0:
        raise ValueError("vector is all zeros")
    # Re-normalise in float64: dot_product rejects vectors whose length strays from 1.
    source: dict[str, Any] = {ID_FIELD: doc_id, VECTOR_FIELD: (vec / length).astype(np.float32).tolist()}
    text = doc.get(TEXT_FIELD)
    if text is not None:
        source[TEXT_FIELD] = str(text)
    norm = doc.get(NORM_FIELD)
    if norm is not None:
        norm = float(norm)
        if not math.isfinite(norm):
            raise ValueError("norm is not finite")
        source[NORM_FIELD] = norm
    metadata = dict(doc.get(METADATA_FIELD) or {})
    for key, value in doc.items():
        if key not in (ID_FIELD, TEXT_FIELD, VECTOR_FIELD, NORM_FIELD, METADATA_FIELD):
            metadata[key] = value
    if metadata:
        source[METADATA_FIELD] = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in metadata.items()}
    return doc_id, source


def _reason(info: Mapping[str, Any]) -> str:
    status, error = info.get("status"), info.get("error")
    if isinstance(error, Mapping):
        text = f"{error.get('type', 'error')}: {error.get('reason', '')}"
        cause = error.get("caused_by")
        if isinstance(cause, Mapping) and cause.get("reason"):
            text += f" (caused by {cause.get('type', 'error')}: {cause['reason']})"
    else:
        text = str(error)
    return f"{status} {text}"


def bulk_index(client, name: str, docs: Iterable[Mapping[str, Any]], *, chunk_size: int = 500,
               max_retries: int = 5, initial_backoff: float = 2.0, max_backoff: float = 60.0,
               rejected_sink: Callable[[str | None, str], None] | None = None, dims: int | None = None,
               refresh: bool = True) -> BulkCounts:
    """Index ``docs`` into ``name`` with ``helpers.streaming_bulk``; returns reconciled counts.

    Each doc is a mapping ``{"id", "vector", "text"?, "norm"?, "metadata"?: {...}, ...}``: ``vector``
    a (d,) float array or list (re-normalised to unit length before sending), ``norm`` the raw ‖h‖,
    and any other keys are merged into ``metadata``. The ``index`` op overwrites a document with the
    same id, so a re-run is idempotent.

    Every document ends up indexed or passed to ``rejected_sink(doc_id, reason)`` (default: a
    warning log): local validation failures (missing id, bad vector, wrong ``dims``) and per-item
    server errors. Per-item and whole-request 429s are retried ``max_retries`` times with
    exponential backoff from ``initial_backoff`` s (capped at ``max_backoff``); 5xx and connection
    errors are retried by the transport (see :func:`connect`). A request-level failure left after
    that raises :class:`BulkAborted` carrying the counts so far.
    """
    es = _require_elasticsearch()
    from elasticsearch import helpers

    check_index_name(name)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    sink = rejected_sink or _log_rejected
    actions = _Actions(name, docs, dims, sink)
    indexed = refused = 0  # by the server
    try:
        for ok, item in helpers.streaming_bulk(
                client, actions, chunk_size=chunk_size, max_retries=max_retries,
                initial_backoff=initial_backoff, max_backoff=max_backoff,
                raise_on_error=False, raise_on_exception=True, yield_ok=True):
            info = next(iter(item.values()))
            if ok:
                indexed += 1
            else:
                refused += 1
                sink(info.get("_id"), _reason(info))
    except (es.ApiError, es.TransportError) as e:
        raise _aborted(name, e, BulkCounts(read=actions.read, indexed=indexed, failed=actions.failed + refused)) from e
    if refresh:
        client.indices.refresh(index=name)
    read, failed = actions.read, actions.failed + refused
    counts = BulkCounts(read=read, indexed=indexed, failed=failed)
    log.info("bulk into %s: read %d, indexed %d, rejected %d", name, read, indexed, failed)
    return counts


class _Actions:
    """The bulk ``index`` actions of ``docs`` into ``name``, counting the documents ``read`` and
    those that ``failed`` local validation (each passed to ``sink(doc_id, reason)``)."""

    def __init__(self, name: str, docs: Iterable[Mapping[str, Any]], dims: int | None,
                 sink: Callable[[str | None, str], None]):
        self.name, self.docs, self.dims, self.sink = name, docs, dims, sink
        self.read = self.failed = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for position, doc in enumerate(self.docs):
            self.read += 1
            try:
                if not isinstance(doc, Mapping):
                    raise ValueError(f"expected a mapping, got {type(doc).__name__}")
                doc_id, source = _source(doc, self.dims)
            except (ValueError, TypeError) as e:
                self.failed += 1
                raw_id = doc.get(ID_FIELD) if isinstance(doc, Mapping) else None
                self.sink(None if raw_id is None else str(raw_id), f"input #{position}: {e}")
                continue
            yield {"_op_type": "index", "_index": self.name, "_id": doc_id, "_source": source}


def _aborted(name: str, e: Exception, counts: BulkCounts) -> BulkAborted:
    """The error of a bulk request that failed after its retries, with the counts so far."""
    status = getattr(e, "status_code", None) or getattr(e, "status", None)
    return BulkAborted(f"bulk indexing into {name!r} stopped ({type(e).__name__}"
                       f"{f', status {status}' if status else ''}: {getattr(e, 'message', e)}); "
                       f"read {counts.read}, indexed {counts.indexed}, rejected {counts.failed}, "
                       f"{counts.read - counts.indexed - counts.failed} unresolved", counts)
