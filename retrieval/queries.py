"""Read a ``relsearch query --queries FILE.jsonl`` file: every non-blank line becomes a Query or an
error naming its line; nothing in the file can make the reader raise.

Lines: ``{"id", "text"}`` or ``{"doc_id"}``, each optionally with ``"relation": "name"`` or
``{"name": weight}``. The same byte-level rules as the corpus reader apply (indexer/records.py:
UTF-8, strict JSON, a leading BOM ignored, ``max_line_bytes``).
"""
from __future__ import annotations

import math
from collections.abc import Collection

from ..indexer import records as rec
from .search import Query


def _utf8_ok(s: str) -> bool:
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _relations(value, default: dict[str, float]) -> dict[str, float] | str:
    """The line's relation mixture, or an error message."""
    if value is None:
        return default
    if isinstance(value, str) and value.strip() and _utf8_ok(value):
        return {value: 1.0}
    if isinstance(value, dict) and value:
        out = {}
        for name, weight in value.items():
            if not name.strip() or not _utf8_ok(name):
                return "a relation name is empty or not valid text"
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(float(weight)):
                return f"weight of relation {name[:50]!r} must be a finite number"
            out[name] = float(weight)
        return out
    return "'relation' must be a name or a non-empty {name: weight} object"


def parse_query_line(line_no: int, raw: bytes, default_relations: dict[str, float],
                     limits: rec.Limits = rec.DEFAULT_LIMITS,
                     known_relations: Collection[str] | None = None) -> Query | str | None:
    """One line → Query, an error message, or None for a blank line (skipped, not an error).
    ``known_relations``: when given, a line naming another relation is an error of its own
    (instead of failing the whole batch later)."""
    obj = rec.decode_line(line_no, raw, limits)
    if isinstance(obj, rec.Rejection):
        return None if obj.reason == rec.EMPTY_LINE else f"{obj.reason}: {obj.detail}"
    relations = _relations(obj.get("relation"), default_relations)
    if isinstance(relations, str):
        return relations
    unknown = sorted(set(relations) - set(known_relations)) if known_relations is not None else []
    if unknown:
        return f"unknown relation {unknown[0][:50]!r}; available: {', '.join(sorted(known_relations))}"
    qid = obj.get("id", obj.get("query_id", obj.get("doc_id", line_no)))
    doc_id, text = obj.get("doc_id"), obj.get("text")
    if isinstance(doc_id, (str, int)) and not isinstance(doc_id, bool) and str(doc_id).strip():
        if not _utf8_ok(str(doc_id)):
            return "'doc_id' holds a lone surrogate escape"
        return Query(doc_id=str(doc_id).strip(), relations=relations, query_id=qid)
    if isinstance(text, str) and text.strip():
        if not _utf8_ok(text):
            return "'text' holds a lone surrogate escape"
        if len(text.encode("utf-8")) > limits.max_text_bytes:
            return f"'text' is longer than {limits.max_text_bytes} bytes"
        return Query(text=text, relations=relations, query_id=qid)
    return "needs a non-empty 'text' or a 'doc_id'"


def read_queries(path: str, default_relations: dict[str, float], limits: rec.Limits = rec.DEFAULT_LIMITS,
                 known_relations: Collection[str] | None = None) -> tuple[list[Query], list[dict]]:
    """(queries, errors ``{"line", "error"}``); queries + errors = the file's non-blank lines.

    For ``relsearch query --queries``: ``read_queries(path, weights, known_relations=searcher.operators)``.
    """
    queries, errors = [], []
    for n, raw in rec.read_numbered_lines(path, max_bytes=limits.max_line_bytes):
        parsed = parse_query_line(n, raw, default_relations, limits, known_relations)
        if isinstance(parsed, Query):
            queries.append(parsed)
        elif parsed is not None:
            errors.append({"line": n, "error": parsed})
    return queries, errors
