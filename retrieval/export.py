"""An answer outside its JSON: the anchor document a query starts from, and hits as CSV or JSONL.

The explorer page, ``POST /search?format=csv|jsonl``, ``relsearch query --format csv`` and
``relsearch lookup --format csv`` write through these functions, so a CSV row means the same
wherever it was made: one row per hit, ``query`` (the query's id or text), ``rank``, ``id``,
``score``, ``field`` (the text that matched, in a search over several) and ``text`` where the hits
carry them, then each metadata field as a column of its own (a list or object as its JSON text; a
field named like one of the columns before it as ``metadata.NAME``).
"""
from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Sequence
from typing import TextIO

from ..indexer.mining import NAME_FIELDS  # the first present is what a document is called
CSV_TYPE = "text/csv; charset=utf-8"
JSONL_TYPE = "application/x-ndjson; charset=utf-8"
HIT_COLUMNS = ("query", "rank", "id", "score")
OPTIONAL_COLUMNS = ("field", "text")  # present when any hit has one

# one query's answer: (its id or text, its hits as Hit.to_json dicts; a hit without "rank" is ranked by its place)
Answer = tuple[str, Sequence[dict]]


def stored_document(searcher, doc_id: str) -> dict | None:
    """``{"id", "name", "texts": {field: text}, "metadata": {...}}`` of the live stored document
    ``doc_id`` (the anchor of a query by id), or None when the index has no such document. ``name``
    is its first NAME_FIELDS value ("" without one); ``texts`` holds each named text it has, by field
    name (an index of several texts keeps texts 2… in the metadata); ``metadata`` every other field."""
    docs = searcher.files.docstore
    position = docs.positions([doc_id]).get(doc_id)  # deleted ids drop out; a replaced id: its newest row
    if position is None:
        return None
    doc = docs.get([position])[position]
    meta = doc["metadata"] if isinstance(doc["metadata"], dict) else {}
    names = tuple(searcher.text_fields) or ("text",)
    texts = {names[0]: doc["text"], **{n: meta[n] for n in names[1:] if isinstance(meta.get(n), str)}}
    name = next((meta[f] for f in NAME_FIELDS if isinstance(meta.get(f), str)), "")
    return {"id": doc["id"], "name": name, "texts": texts,
            "metadata": {k: v for k, v in meta.items() if k not in names[1:]}}


def columns(answers: Iterable[Answer]) -> list[str]:
    """The CSV header of ``answers``: HIT_COLUMNS, the OPTIONAL_COLUMNS some hit has, then every
    metadata field in the order first seen."""
    present: set[str] = set()
    fields: dict[str, None] = {}
    for _, hits in answers:
        for hit in hits:
            present.update(c for c in OPTIONAL_COLUMNS if hit.get(c) is not None)
            fields.update(dict.fromkeys(hit.get("metadata") or {}))
    fixed = [*HIT_COLUMNS, *(c for c in OPTIONAL_COLUMNS if c in present)]
    return fixed + [_field_column(f, fixed) for f in fields]


def _field_column(name: str, fixed: Sequence[str]) -> str:
    return f"metadata.{name}" if name in fixed or name.startswith("metadata.") else name


def _cell(value) -> str | int | float:
    if value is None:
        return ""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return value
    return json.dumps(value, ensure_ascii=False)  # a list, an object, true/false as JSON writes them


def write_csv(out: TextIO, answers: Callable[[], Iterable[Answer]]) -> int:
    """Write ``answers()`` to ``out`` as CSV (stdlib csv, a header, ``\\r\\n`` line ends) and return
    the rows written. ``answers`` is called twice, for the header and for the rows, so a file of
    answers is read twice rather than held in memory (``relsearch lookup --format csv``)."""
    header = columns(answers())
    fixed = [c for c in header if c in HIT_COLUMNS or c in OPTIONAL_COLUMNS]
    writer = csv.writer(out)
    writer.writerow(header)
    rows = 0
    for query, hits in answers():
        for place, hit in enumerate(hits, 1):
            values = {c: hit.get(c) for c in fixed}
            values.update(query=query, rank=hit.get("rank", place))
            values.update({_field_column(f, fixed): v for f, v in (hit.get("metadata") or {}).items()})
            writer.writerow([_cell(values.get(c)) for c in header])
            rows += 1
    return rows


def csv_text(answers: Sequence[Answer]) -> str:
    """``answers`` as one CSV text (:func:`write_csv`)."""
    out = io.StringIO()
    write_csv(out, lambda: answers)
    return out.getvalue()


def jsonl_lines(answers: Iterable[Answer]) -> Iterable[str]:
    """One JSON line per hit, ``{"query", "rank", ...the hit's Hit.to_json}``, without the newline."""
    for query, hits in answers:
        for place, hit in enumerate(hits, 1):
            yield json.dumps({"query": query, "rank": hit.get("rank", place), **hit}, ensure_ascii=False,
                             allow_nan=False)


def query_label(text: str | None = None, doc_id: str | None = None, examples: dict | None = None) -> str:
    """What the ``query`` column says: the id, else the text, else the examples by side, each side
    named as the request names it (``like A, B ×0.5``, then the other side the same way after ``;``; each
    an id or a text, as dicts ``{"id"|"text", "weight"?}``)."""
    if doc_id is not None:
        return doc_id
    if text is not None:
        return text
    said = lambda examples: ", ".join(str(e.get("id", e.get("text", ""))) + (  # noqa: E731
        f" ×{e['weight']:g}" if e.get("weight", 1) != 1 else "") for e in examples)
    return "; ".join(f"{side} {said(e)}" for side, e in (examples or {}).items() if e)
