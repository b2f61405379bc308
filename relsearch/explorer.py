"""The relation explorer page (``/``, ``/ui``) and the offline API docs (``/docs``) of ``relsearch serve``.

Everything the browser loads comes from this server: the page is plain HTML, CSS and JavaScript
modules shipped in ``relsearch/ui/`` (no build step), Swagger UI's files come from the installed
``fastapi-offline`` package. The page calls the documented endpoints only; the two small ones it
needs beyond them are read-only, bounded and behind the API key like every other data endpoint:

- ``GET /fields``: the index's metadata fields with the value types stored in each, and for a text
  field with few distinct values those values (the filter builder's choices).
- ``GET /complete``: stored documents by the names people use (the id box's completion, relsearch/completion.py:
  "jp morgan" finds "JPMorgan Chase & Co.", "google" Alphabet by its texts), best match first.
- ``GET /document``: one stored document by id, its name, texts and metadata (the anchor card above
  an answer to a query by id: retrieval/export.stored_document).
- ``GET /relations/sources``: what each relation of the bundle was trained on, where the bundle says (the
  relations panel's and sliders' "trained on: ..." note: a relation trained on captions, on a company index).
- ``POST /filters/parse``: filter expressions in ``relsearch query --filter`` syntax → the JSON form the
  API takes, parsed by the CLI's own parser (so a filter in the page's URL means what it means to the
  CLI: ``A or B``, ``not ...``, typed values), each expression checked against the index's fields.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import FastAPI, Query
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field

from . import completion
from .indexer import mining
from .retrieval.export import stored_document

UI_DIR = Path(__file__).parent / "ui"
UI_ASSETS, DOCS_ASSETS = "/ui/assets", "/docs/assets"
PAGE_PATHS = frozenset({"/", "/ui", "/favicon.ico"})
OPEN_PREFIXES = (UI_ASSETS + "/", DOCS_ASSETS + "/")  # static files, no data behind them
# the page loads only from this server; it may fetch from it too (no inline script or style)
PAGE_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")

MAX_FIELDS = 200  # fields listed by /fields
MAX_VALUES = 50  # distinct text values listed per field (more: none listed)
MAX_COMPLETIONS = 50  # matches one /complete may ask for
MAX_PREFIX = 200  # characters of a /complete prefix
MAX_ID = 1_000  # characters of a /document id
MAX_FILTER_TEXTS = 64  # expressions one /filters/parse may read
MAX_FILTER_CHARS = 10_000  # characters of one expression
MAX_SOURCE_CHARS = 300  # characters of a relation's training source as /relations/sources gives it
SOURCE_KEYS = ("trained_on", "domain", "dataset")  # an operator's own words for what it was trained on, first found


def swagger_assets() -> Path:
    """Swagger UI's files (swagger-ui-bundle.js, swagger-ui.css, favicon.png) of the fastapi-offline package."""
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


def add_pages(app: FastAPI, *, title: str) -> None:
    """``/`` and ``/ui`` (the explorer), its assets, and ``/docs`` served without a CDN."""
    app.mount(UI_ASSETS, StaticFiles(directory=UI_DIR), name="ui-assets")
    app.mount(DOCS_ASSETS, StaticFiles(directory=swagger_assets()), name="docs-assets")

    @app.get("/", include_in_schema=False)
    @app.get("/ui", include_in_schema=False)
    async def page():
        return FileResponse(UI_DIR / "index.html", headers={"Content-Security-Policy": PAGE_CSP,
                                                            "Referrer-Policy": "no-referrer",
                                                            "Cache-Control": "no-cache"})

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon():
        return FileResponse(swagger_assets() / "favicon.png")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url, title=f"{title} - API docs",
                                   swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png",
                                   oauth2_redirect_url="/docs/oauth2-redirect",
                                   swagger_ui_parameters={"validatorUrl": None})  # no call to a validator service

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    async def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()


# ---------------------------------------------------------------- what the filter builder and completion read


def fields(searcher) -> dict:
    """``{"fields": [{"name", "types", "values"?, "min"?, "max"?}], "truncated"}``: each metadata
    field (at most MAX_FIELDS), the value types stored in it (indexer/filters.TYPES), the distinct
    text values when there are at most MAX_VALUES, the smallest and largest number when it holds
    numbers. Costs a few index seeks per field and segment, whatever the number of documents
    (values of deleted documents may still be listed: a choice that then matches nothing)."""
    parts = searcher.files.docstore.parts
    names = searcher.metadata_fields
    out = []
    for name in names[:MAX_FIELDS]:
        types = set().union(*(p.field_types(name) for p in parts))
        row: dict = {"name": name, "types": sorted(types)}
        if "text" in types:
            values = _distinct_texts(parts, name, MAX_VALUES + 1)
            if len(values) <= MAX_VALUES:
                row["values"] = values
        if "number" in types:
            ends = [_number_end(p, name, order) for p in parts for order in ("ASC", "DESC")]
            ends = [v for v in ends if v is not None]
            row["min"], row["max"] = min(ends), max(ends)
        out.append(row)
    # the named text fields of an index of several (indexer/text_fields.py): the page's field selector
    return {"fields": out, "truncated": len(names) > MAX_FIELDS, "texts": list(searcher.text_fields)}


def _distinct_texts(parts, field: str, limit: int) -> list[str]:
    """Up to ``limit`` distinct text values of ``field`` in code-point order, one index seek each
    (a skip scan over the side table's (field, type, value) key)."""
    first = "SELECT value FROM fields WHERE field = ? AND type = 'text' ORDER BY value LIMIT 1"
    after = "SELECT value FROM fields WHERE field = ? AND type = 'text' AND value > ? ORDER BY value LIMIT 1"
    found: set[str] = set()
    for part in parts:
        row, seen = part.conn.execute(first, (field,)).fetchone(), 0
        while row is not None and seen < limit:
            found.add(row[0])
            seen += 1
            row = part.conn.execute(after, (field, row[0])).fetchone()
    return sorted(found)[:limit]


def _number_end(part, field: str, order: str):
    row = part.conn.execute(f"SELECT value FROM fields WHERE field = ? AND type = 'number' ORDER BY value {order} "
                            "LIMIT 1", (field,)).fetchone()
    return None if row is None else row[0]


def complete(searcher, prefix: str, limit: int) -> list[dict]:
    """``GET /complete``: :func:`relsearch.completion.complete` over the searcher's docstore, its name
    field (indexer/mining.py NAME_FIELDS) and what its writer mined of its texts (aliases, prominence)."""
    return completion.complete(searcher.files.docstore, mining.name_field(searcher.metadata_fields),
                               mining.of_generation(searcher.files), prefix, limit)


def parse_filters(specs: list[str], metadata_fields=None) -> dict:
    """``{"filters", "errors"}``: ``specs`` (``relsearch query --filter`` expressions, AND-ed) in the API's
    JSON form, parsed as the CLI parses them (retrieval/inputs.parse_filter, merge_filters) and checked
    (indexer/filters.clauses: types and bounds); with ``metadata_fields``, every field named must be
    one of them. ``errors``: ``[{"field": "filters[i]" | "filters", "message"}]``, one per expression
    that cannot be read (``filters[i]``), or one for the expressions together (``filters``: the same
    operator given twice on a field, a bound passed); ``filters`` is null when there is any."""
    from .indexer.filters import clauses, fields_in
    from .retrieval.inputs import merge_filters, parse_filter

    errors, parsed = [], []
    for i, spec in enumerate(specs):
        try:
            one = parse_filter(spec)
            alone = merge_filters([one])
            clauses(alone)
        except ValueError as e:
            errors.append({"field": f"filters[{i}]", "message": str(e)})
            continue
        unknown = [f for f in fields_in(alone) if metadata_fields is not None and f not in metadata_fields]
        if unknown:
            errors.append({"field": f"filters[{i}]", "message": f"unknown filter field {unknown[0]!r}; metadata "
                                                                f"fields: {', '.join(metadata_fields) or '(none)'}"})
            continue
        parsed.append(one)
    if errors:
        return {"filters": None, "errors": errors}
    try:
        together = merge_filters(parsed)
        clauses(together)
    except ValueError as e:
        return {"filters": None, "errors": [{"field": "filters", "message": str(e)}]}
    return {"filters": together, "errors": []}


class FilterTexts(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    index: str | None = Field(None, description="Served index name (default: the first --index).")
    filters: list[Annotated[str, Field(max_length=MAX_FILTER_CHARS)]] = Field(
        max_length=MAX_FILTER_TEXTS, description="Expressions in `relsearch query --filter` syntax, AND-ed, e.g. "
        '["gics_sector=Energy or founded<1950", "not ceo exists"].')


# ---------------------------------------------------------------- what each relation was trained on


def sources(searcher) -> dict:
    """``{"relations": {name: {"trained_on", "dataset"}}}``: what each relation of the bundle (operators
    and re-ranking heads) was trained or fitted on, for those whose bundle entry says: the entry's own
    ``trained_on``, ``domain`` or ``dataset`` (a string), else the bundle's ``info.sources[name].dataset``
    (pack/bundle.json: "flickr8k_captions — Flickr8k captions (Hodosh, …)"). ``dataset`` is that text,
    ``trained_on`` its short form: the words after " — " and before " (" ("Flickr8k captions").
    Strings only, each at most MAX_SOURCE_CHARS: a bundle is data, a field of another type is left out."""
    bundle = searcher.bundle
    listed = bundle.info.get("sources") if isinstance(bundle.info, dict) else None
    listed = listed if isinstance(listed, dict) else {}
    out: dict[str, dict] = {}
    for name, entry in [*bundle.operators.items(), *bundle.heads.items()]:
        info = entry.info if isinstance(entry.info, dict) else {}
        said = next((info[k] for k in SOURCE_KEYS if isinstance(info.get(k), str) and info[k].strip()), None)
        if said is None and isinstance(listed.get(name), dict) and isinstance(listed[name].get("dataset"), str):
            said = listed[name]["dataset"]
        if said and said.strip():
            out[name] = {"trained_on": short_source(said)[:MAX_SOURCE_CHARS], "dataset": said.strip()[:MAX_SOURCE_CHARS]}
    return {"relations": out}


def short_source(text: str) -> str:
    """A dataset's own name for its texts: "flickr8k_captions — Flickr8k captions (Hodosh, …)" → "Flickr8k
    captions"; a text without " — " is kept, up to " (" (its citation)."""
    text = text.strip()
    words = text.split(" — ", 1)[1] if " — " in text else text
    return (words.split(" (", 1)[0].strip() or text).rstrip(".;, ")


def add_routes(app: FastAPI, run, *, errors: dict) -> None:
    """``GET /fields``, ``GET /relations/sources``, ``GET /complete``, ``GET /document`` and ``POST /filters/parse``; ``run(index, fn, *args)`` answers
    ``fn(searcher, *args)`` on the model thread as ``(name, answer)``."""

    @app.get("/fields", summary="Metadata fields of an index, their value types and (few) text values",
             responses=errors)
    async def list_fields(index: str | None = None):
        name, answer = await run(index, fields)
        return {"index": name, **answer}

    @app.get("/relations/sources", summary="What each relation of an index's bundle was trained on, where the "
             "bundle says", responses=errors)
    async def relation_sources(index: str | None = None):
        name, answer = await run(index, sources)
        return {"index": name, **answer}

    @app.get("/complete", summary="Documents whose id or name, or a word in it, starts with a prefix (at most 50)", responses=errors)
    async def completions(prefix: str = Query(min_length=1, max_length=MAX_PREFIX), index: str | None = None,
                          limit: int = Query(10, ge=1, le=MAX_COMPLETIONS)):
        name, answer = await run(index, complete, prefix, limit)
        return {"index": name, "matches": answer}

    @app.get("/document", summary="A stored document by id: its name, texts and metadata (the explorer's anchor card)",
             responses=errors)
    async def document(id: str = Query(min_length=1, max_length=MAX_ID), index: str | None = None):
        from .api import RequestError

        name, answer = await run(index, stored_document, id)
        if answer is None:
            raise RequestError("id", f"document id {id[:80]!r} is not in the index", 404)
        return {"index": name, "document": answer}

    @app.post("/filters/parse", summary="Filter expressions in `relsearch query --filter` syntax → the JSON form of "
              "`filters`; errors per expression", responses=errors)
    async def filters_parse(body: FilterTexts):
        name, answer = await run(body.index, lambda searcher: parse_filters(body.filters, searcher.metadata_fields))
        return {"index": name, **answer}
