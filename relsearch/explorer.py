"""The relation explorer page (``/``, ``/ui``) and the offline API docs (``/docs``) of ``relsearch serve``.

Everything the browser loads comes from this server: the page is plain HTML, CSS and JavaScript
modules shipped in ``relsearch/ui/`` (no build step), Swagger UI's files come from the installed
``fastapi-offline`` package. The page calls the documented endpoints only; the two small ones it
needs beyond them are read-only, bounded and behind the API key like every other data endpoint:

- ``GET /fields``: the index's metadata fields with the value types stored in each, and for a text
  field with few distinct values those values (the filter builder's choices).
- ``GET /complete``: stored documents whose id or name, or a word in it, starts with a prefix (the
  id box's completion: "coca" and "cola" find "The Coca-Cola Company"), best match first.
- ``GET /relations/sources``: what each relation of the bundle was trained on, where the bundle says (the
  relations panel's and sliders' "trained on: ..." note: a relation trained on captions, on a company index).
- ``POST /filters/parse``: filter expressions in ``relsearch query --filter`` syntax → the JSON form the
  API takes, parsed by the CLI's own parser (so a filter in the page's URL means what it means to the
  CLI: ``A or B``, ``not ...``, typed values), each expression checked against the index's fields.
"""
from __future__ import annotations

import json
import re
import threading
import unicodedata
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np

from fastapi import FastAPI, Query
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field

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
NAME_FIELDS = ("name", "title", "company", "security")  # the first present is what completion calls a name
# Completion holds a word-start index in memory for an index of at most this many documents, built
# at the first /complete of a generation (measured in complete()'s docstring); a bigger index
# completes prefixes of whole ids and names only (complete_by_scan), never building more: the build
# runs on the model thread, and at 100k documents it already takes ~2 s of CPU and ~120 MB at its peak.
COMPLETION_MAX_DOCS = 100_000
KEY_BYTES = 32  # UTF-8 bytes of a key (a name or id from a word start); a longer prefix is checked per match
MAX_WORD_STARTS = 16  # words of a name that completion finds (a title's 17th word does not complete)
MAX_CHECKED = 1_000  # matches per kind that a prefix longer than a key reads to check them whole
_SEPARATORS = re.compile(r"[\W_]+")  # what separates words: anything but a letter or digit
# in words(text) + " ": from each word start, the key's characters (one regex call, no Python loop)
_KEYS_FROM_WORD_STARTS = re.compile(f"(?<![^ ])(?=([^ ].{{0,{KEY_BYTES - 1}}}))", re.DOTALL)
_COMPLETIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a generation's docstore → Completions
_COMPLETIONS_LOCK = threading.Lock()
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
    """Up to ``limit`` live documents matching ``prefix``, best first: ``[{"id", "name"}]``. An id equal
    to it, then ids starting with it, then names (NAME_FIELDS) starting with it, then names or ids
    with a word starting with it ("coca" and "cola" find "The Coca-Cola Company"); ties go to the
    shorter name, then the id (no name: last). Case and accents never matter (:func:`fold`); in
    names a run of spaces or punctuation matches any other ("coca cola" finds "Coca-Cola", and
    "coca-" does not find "Cocaine"). The prefix is text, never a pattern: ``%`` and ``_`` are
    punctuation like any other, not wildcards.

    Answered from a word-start index held in memory per generation (:class:`Completions`), built at
    the first call. CPU time measured on 2 busy cores: the Russell 3000 (2,964 documents) builds in
    ~40 ms and holds ~1 MB, then a call takes 0.2-0.6 ms; 100k documents (its names repeated) build
    in ~2 s, hold 26 MB (~120 MB at the peak), then 0.3-4 ms a call (one letter: the most). A SQLite
    ``LIKE '% coca%'`` scan of the names instead costs ~1 ms a call at 3k documents, 8-36 ms at 100k,
    75 ms at 200k, every call. An index of more than COMPLETION_MAX_DOCS documents matches prefixes
    of whole ids and names only (:func:`complete_by_scan`): no call builds a structure the size of
    a huge index."""
    docs = searcher.files.docstore
    name_field = next((f for f in NAME_FIELDS if f in searcher.metadata_fields), None)
    if docs.total > COMPLETION_MAX_DOCS:
        return complete_by_scan(docs, name_field, prefix, limit)
    with _COMPLETIONS_LOCK:  # built once per generation, whichever thread asks first
        index = _COMPLETIONS.get(docs)
        if index is None:
            index = _COMPLETIONS[docs] = Completions.build(docs, name_field)
    # a prefix as long as a key may match a key's end but not the rest of the name: check each whole
    long = max(len(fold(prefix).encode()), len(words(prefix).encode())) >= KEY_BYTES - 1
    positions = index.best(prefix, MAX_CHECKED if long else limit)
    stored = docs.get(positions)
    found = [(d["id"], str(d["metadata"].get(name_field, "")) if name_field else "")
             for d in (stored[p] for p in positions if p in stored)]
    if long:
        tiers = {f: match_tier(prefix, *f) for f in found}
        found = sorted((f for f in found if tiers[f] is not None), key=lambda f: (tiers[f], not f[1], len(f[1]), f[0]))
    return [{"id": i, "name": name} for i, name in found[:limit]]


def complete_by_scan(docs, name_field: str | None, prefix: str, limit: int) -> list[dict]:
    """:func:`complete` on an index too big for a word-start index in memory: ids starting with
    ``prefix`` (as typed, or upper-cased), then names starting with it, any case; index range scans
    only (the docs table's unique id index and the side table's case-folded index)."""
    ids: list[str] = []
    for part in docs.parts:
        for start in dict.fromkeys((prefix, prefix.upper())):
            ids += [i for (i,) in part.conn.execute("SELECT id FROM docs WHERE id >= ? AND id < ? ORDER BY id LIMIT ?",
                                                    (start, start + "\U0010ffff", limit))]
        if name_field is not None:
            folded = prefix.casefold()
            q = ("SELECT d.id FROM fields f JOIN docs d ON d.pos = f.pos WHERE f.field = ? AND f.elem = 0 "
                 "AND f.folded >= ? AND f.folded < ? ORDER BY f.folded LIMIT ?")
            ids += [i for (i,) in part.conn.execute(q, (name_field, folded, folded + "\U0010ffff", limit))]
    live = docs.positions(list(dict.fromkeys(ids)))  # deleted ids drop out; a replaced id keeps its newest row
    wanted = [i for i in dict.fromkeys(ids) if i in live][:limit]
    stored = docs.get([live[i] for i in wanted])
    by_id = {d["id"]: d["metadata"] for d in stored.values()}
    return [{"id": i, "name": str(by_id.get(i, {}).get(name_field, "")) if name_field else ""} for i in wanted]


def fold(text: str) -> str:
    """``text`` as completion compares it: casefolded, then accents dropped ("Nestlé" → "nestle", "İ" → "i")."""
    if text.isascii():  # most ids and names: nothing to decompose (a third of the build time)
        return text.lower()
    return "".join(c for c in unicodedata.normalize("NFKD", text.casefold()) if not unicodedata.combining(c))


def words(text: str) -> str:
    """``fold(text)`` with each run of spaces and punctuation one space and none in front: "The
    Coca-Cola Company" → "the coca cola company". A separator the prefix ends with stays (one space:
    "coca-" finds "coca cola", not "cocaine"), which is why keys carry one after the last word."""
    return _SEPARATORS.sub(" ", fold(text)).lstrip()


def word_keys(text: str) -> list[str]:
    """``words(text)`` and a space, from each of its first MAX_WORD_STARTS word starts, at most
    KEY_BYTES characters each ("coca cola company ", "cola company ", "company "); none for a text
    without a letter or digit."""
    w = words(text).rstrip()
    return _KEYS_FROM_WORD_STARTS.findall(w + " ")[:MAX_WORD_STARTS] if w else []


def match_tier(prefix: str, doc_id: str, name: str) -> int | None:
    """How a document matches ``prefix``, 0 best: 0 its id is the prefix, 1 its id starts with it, 2
    its name starts with it, 3 a word of its name or id does; None: no match (:func:`complete`)."""
    p, w = fold(prefix), words(prefix)
    if fold(doc_id) == p:
        return 0
    if fold(doc_id).startswith(p):
        return 1
    if w and (words(name).rstrip() + " ").startswith(w):
        return 2
    if w and any((" " + words(t).rstrip() + " ").find(" " + w) >= 0 for t in (name, doc_id)):
        return 3
    return None


class _Keys:
    """Sorted keys (UTF-8, cut to KEY_BYTES), each with the row of the document it belongs to: a
    prefix is a range found by bisection. Held as numpy arrays, not a Python string per key:
    KEY_BYTES + 4 bytes a key."""

    def __init__(self, keys: list[bytes], rows: list[int]):
        raw = np.array(keys, dtype=f"S{KEY_BYTES}")
        order = np.argsort(raw, kind="stable")
        self.keys, self.rows = raw[order], np.asarray(rows, np.int32)[order]

    def starting(self, prefix: str) -> np.ndarray:
        """Rows of the keys starting with ``prefix`` (its first KEY_BYTES - 1 bytes: 0xff, which
        UTF-8 never holds, must fit after them as the range's end)."""
        p = prefix.encode()[:KEY_BYTES - 1]
        return self.rows[np.searchsorted(self.keys, p):np.searchsorted(self.keys, p + b"\xff")]

    def equal(self, key: str) -> np.ndarray:
        k = key.encode()[:KEY_BYTES]
        return self.rows[np.searchsorted(self.keys, k):np.searchsorted(self.keys, k, "right")]


@dataclass(frozen=True)
class Completions:
    """The live documents of one generation, for :func:`complete`. A document's row is its rank among
    equals (shorter name first, then id; no name last), so the best rows of a match are its smallest."""

    positions: np.ndarray  # row → position in the docstore
    ids: _Keys  # fold(id)
    names: _Keys  # words(name) + " "
    inner: _Keys  # words(name) from its second word start on, words(id) from each

    @classmethod
    def build(cls, docs, name_field: str | None) -> Completions:
        live: dict[str, tuple[int, str]] = {}
        dead = set(docs.deleted.tolist())
        for part in docs.parts:  # as Documents.positions: a later segment's live row of an id is its newest
            names = _names(part, name_field)
            live.update((i, (p, names.get(p, ""))) for p, i in part.conn.execute("SELECT pos, id FROM docs")
                        if p not in dead)
        ranked = sorted((not name, len(name), doc_id, pos, name) for doc_id, (pos, name) in live.items())
        del live
        ids, names, inner = ([], []), ([], []), ([], [])  # (UTF-8 keys, rows), encoded as made: half the peak
        for row, (*_, doc_id, _, name) in enumerate(ranked):
            keys = word_keys(name)
            for (out, rows), found in ((ids, [fold(doc_id)]), (names, keys[:1]), (inner, keys[1:] + word_keys(doc_id))):
                out.extend([k.encode() for k in found])
                rows.extend([row] * len(found))
        return cls(np.fromiter((r[3] for r in ranked), np.int64, len(ranked)), _Keys(*ids), _Keys(*names),
                   _Keys(*inner))

    def best(self, prefix: str, limit: int) -> list[int]:
        """Positions of the best ``limit`` matches of ``prefix``, best first (:func:`complete`)."""
        p, w = fold(prefix), words(prefix)
        tiers = [self.ids.equal(p), self.ids.starting(p)]
        if w:  # a prefix of punctuation alone names no word
            tiers += [self.names.starting(w), self.inner.starting(w)]
        taken = np.zeros(0, np.int32)
        for rows in tiers:
            fresh = np.setdiff1d(rows, taken)  # sorted: best first
            taken = np.concatenate([taken, fresh[:limit - len(taken)]])
            if len(taken) >= limit:
                break
        return self.positions[taken].tolist()


def _names(part, name_field: str | None) -> dict[int, str]:
    """position → text value of ``name_field`` in one segment: one range scan of the side table
    (or, in an index that predates it, the stored metadata)."""
    if name_field is None:
        return {}
    if part.has_fields_table():
        q = "SELECT pos, value FROM fields WHERE field = ? AND type = 'text' AND elem = 0"
        return dict(part.conn.execute(q, (name_field,)))
    q = "SELECT pos, json_extract(meta, ?) FROM docs"
    return {p: v for p, v in part.conn.execute(q, ("$." + json.dumps(name_field),)) if isinstance(v, str)}


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
    """``GET /fields``, ``GET /relations/sources``, ``GET /complete`` and ``POST /filters/parse``; ``run(index, fn, *args)`` answers
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

    @app.post("/filters/parse", summary="Filter expressions in `relsearch query --filter` syntax → the JSON form of "
              "`filters`; errors per expression", responses=errors)
    async def filters_parse(body: FilterTexts):
        name, answer = await run(body.index, lambda searcher: parse_filters(body.filters, searcher.metadata_fields))
        return {"index": name, **answer}
