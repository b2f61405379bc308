"""Read a ``relsearch query --queries FILE.jsonl`` file: every non-blank line becomes a Query or an
error naming its line; nothing in the file can make the reader raise.

Lines: ``{"id", "text"}`` or ``{"doc_id"}``, each optionally with ``"relation": "name"`` or
``{"name": weight}``. The same byte-level rules as the corpus reader apply (indexer/records.py:
UTF-8, strict JSON, a leading BOM ignored, ``max_line_bytes``).
"""
from __future__ import annotations

from collections.abc import Collection

from ..indexer import records as rec
from .inputs import MAX_WEIGHT, check_weights, is_utf8
from .search import Query

ID_KEYS = ("id", "query_id", "doc_id")  # in this order of precedence for the answer's query_id


def _relations(value, default: dict[str, float]) -> dict[str, float] | str:
    """The line's relation mixture, or an error message."""
    if value is None:
        return default
    if isinstance(value, str) and value.strip() and is_utf8(value):
        return {value: 1.0}
    if isinstance(value, dict) and value:
        out = {}
        for name, weight in value.items():
            if not name.strip() or not is_utf8(name):
                return "a relation name is empty or not valid text"
            if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                return f"weight of relation {name[:50]!r} must be a finite number"
            try:
                out[name] = float(weight)
            except OverflowError:  # an integer past float's range
                return f"relation {name[:50]!r}: weight {str(weight)[:12]}… is beyond ±{MAX_WEIGHT:g}"
        try:
            check_weights(out)
        except ValueError as e:
            return str(e)
        return out
    return "'relation' must be a name or a non-empty {name: weight} object"


def _ids(obj: dict) -> dict[str, str] | str:
    """The line's non-empty ids (``ID_KEYS``) as stripped strings, or an error message."""
    out = {}
    for key in ID_KEYS:
        value = obj.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            return f"{rec.NON_STRING_ID}: {key!r} must be a string or integer, got {type(value).__name__}"
        if not is_utf8(str(value)):
            return f"{key!r} holds a lone surrogate escape"
        if str(value).strip():
            out[key] = str(value).strip()
    return out


def parse_query_line(line_no: int, raw: bytes, default_relations: dict[str, float],
                     limits: rec.Limits = rec.DEFAULT_LIMITS,
                     known_relations: Collection[str] | None = None) -> Query | str | None:
    """One line → Query, an error message, or None for a blank line (skipped, not an error).
    ``known_relations``: when given, a line naming another relation is an error of its own
    (instead of failing the whole batch later)."""
    obj = rec.decode_line(line_no, raw, limits)
    if isinstance(obj, rec.Rejection):
        return None if obj.reason == rec.EMPTY_LINE else f"{obj.reason}: {obj.detail}"
    if "relation" in obj and "relations" in obj:
        return "give 'relation' or 'relations' (the HTTP API's spelling), not both"
    relations = _relations(obj.get("relation", obj.get("relations")), default_relations)
    if isinstance(relations, str):
        return relations
    unknown = sorted(set(relations) - set(known_relations)) if known_relations is not None else []
    if unknown:
        return f"unknown relation {unknown[0][:50]!r}; available: {', '.join(sorted(known_relations))}"
    ids = _ids(obj)
    if isinstance(ids, str):
        return ids
    qid = next((ids[key] for key in ID_KEYS if key in ids), str(line_no))  # always a string
    text = obj.get("text")
    if "doc_id" in ids:
        return Query(doc_id=ids["doc_id"], relations=relations, query_id=qid, line=line_no)
    if isinstance(text, str) and text.strip():
        if not is_utf8(text):
            return "'text' holds a lone surrogate escape"
        if len(text.encode("utf-8")) > limits.max_text_bytes:
            return f"'text' is longer than {limits.max_text_bytes} bytes"
        return Query(text=text, relations=relations, query_id=qid, line=line_no)
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
