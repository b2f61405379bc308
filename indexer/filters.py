"""Typed metadata filters: the JSON form every entry point shares, its checks, and its SQL.

A filter is ``{field: condition}``, all fields AND-ed. A condition is a scalar (exact match) or an
object of operators, also AND-ed::

    {"gics_sector": "Energy"}                               equal (JSON types respected)
    {"year": {"gte": 2010, "lt": 2020}}                     range: gt, gte, lt, lte (numbers or strings)
    {"gics_sector": {"in": ["Energy", "Utilities"]}}        any of
    {"tags": {"has": "finance"}}                            an array holding the value
    {"name": {"ieq": "apple inc."}}                         case-insensitive string equality
    {"ceo": {"exists": true}}                               the field is present (any value, null too)
    {"country": {"not": {"eq": "US", "in": ["CA"]}}}        each operator inside negated

Matching (tests/indexer/test_filters.py holds the full table): values compare only within their JSON type
(``true`` is not ``1``, ``"1"`` is not ``1``; ``1`` equals ``1.0``); strings order by code point.
A field holding an array matches ``eq``, ``ieq``, ranges and ``in`` when any element does (as in
Elasticsearch or MongoDB) and ``has`` only when it is an array. ``not`` keeps the documents the
operator does not match, documents without the field included.

The docstore answers a filter from an indexed side table (one row per field value and array
element, indexer/docstore.py): each positive operator is an index range scan, so a selective
filter costs in proportion to its matches; a filter made only of ``not`` operators costs one pass
over the positions.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

RANGE_OPS = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
OPS = ("eq", "ieq", *RANGE_OPS, "in", "has", "exists", "not")
MAX_IN = 10_000  # values of one ``in``


class FilterError(ValueError):
    """A filter that cannot be evaluated; the message names the field and what is wrong."""


@dataclass(frozen=True)
class Clause:
    """One operator on one field; ``negate``: the documents it does not match."""

    field: str
    op: str  # one of OPS except "not"
    value: object = None
    negate: bool = False


def kind(value) -> str:
    """The filter type of a scalar: "bool", "number" or "text" (FilterError otherwise)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)) and (not isinstance(value, float) or math.isfinite(value)):
        return "number"
    if isinstance(value, str):
        if not _utf8(value):
            raise FilterError("not valid UTF-8")
        return "text"
    raise FilterError(f"{value!r} is not a string, boolean or finite number")


def clauses(filters: Mapping[str, object] | None) -> list[Clause]:
    """``filters`` (the JSON form above) → its clauses; FilterError (one line naming the field) if invalid."""
    out: list[Clause] = []
    for field, cond in (filters or {}).items():
        if not isinstance(field, str) or not _utf8(field):
            raise FilterError(f"filter field {field!r} must be a string of valid UTF-8")
        try:
            if isinstance(cond, Mapping):
                if not cond:
                    raise FilterError("give at least one operator")
                for op, value in cond.items():
                    if op == "not":
                        if not isinstance(value, Mapping) or not value or "not" in value:
                            raise FilterError('"not" takes an object of operators, e.g. {"not": {"eq": "US"}}')
                        out += [_clause(field, o, v, negate=True) for o, v in value.items()]
                    else:
                        out.append(_clause(field, op, value))
            else:
                out.append(_clause(field, "eq", cond))
        except FilterError as e:
            raise FilterError(f"filter {field!r}: {e}") from None
    return out


def _clause(field: str, op: str, value, negate: bool = False) -> Clause:
    if op not in OPS:
        raise FilterError(f"unknown operator {op!r}; operators: {', '.join(OPS)}")
    if op == "exists":
        if not isinstance(value, bool):
            raise FilterError('"exists" takes true or false')
        return Clause(field, "exists", None, negate != (not value))
    if op == "in":
        if not isinstance(value, (list, tuple)) or not 1 <= len(value) <= MAX_IN:
            raise FilterError(f'"in" takes a list of 1 to {MAX_IN:,} values')
        for v in value:
            kind(v)
        return Clause(field, "in", tuple(value), negate)
    k = kind(value)
    if op in RANGE_OPS and k == "bool":
        raise FilterError(f'"{op}" compares numbers or strings, not {json.dumps(value)}')
    if op == "ieq" and k != "text":
        raise FilterError('"ieq" compares strings')
    return Clause(field, op, value, negate)


def _utf8(text: str) -> bool:
    """False for a str holding lone surrogates (undecodable argv bytes, JSON ``\\ud800``)."""
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def fold(text: str) -> str:
    """The case-insensitive form of a string (Unicode case folding: "Straße" ~ "STRASSE")."""
    return text.casefold()


def stored(value) -> tuple[str, object]:
    """(type, value) as the side table holds a scalar: bools as 0/1, integers beyond SQLite's
    64 bits as floats (JSON numbers: 1 and 1.0 are the same number)."""
    k = kind(value)
    if k == "bool":
        return k, int(value)
    if k == "number" and isinstance(value, int) and abs(value) >= 2**63:
        return k, float(value)
    return k, value


def clause_sql(c: Clause) -> tuple[str, list]:
    """``SELECT pos FROM fields ...`` for the positions ``c`` matches, ignoring ``negate``: each form
    is a search of one of the side table's indexes (field, type, value) or (field, folded)."""
    head, args = "SELECT pos FROM fields WHERE field = ?", [c.field]
    if c.op == "exists":
        return head + " AND elem = 0", args
    if c.op == "ieq":
        return head + " AND folded = ?", args + [fold(c.value)]
    if c.op == "in":
        by_type: dict[str, list] = {}
        for v in c.value:
            k, s = stored(v)
            by_type.setdefault(k, []).append(s)
        parts = [f"{head} AND type = ? AND value IN (SELECT value FROM json_each(?))" for _ in by_type]
        args = [a for k, vs in sorted(by_type.items()) for a in (c.field, k, json.dumps(vs))]
        return " UNION ALL ".join(parts), args
    k, s = stored(c.value)
    cmp = "=" if c.op in ("eq", "has") else RANGE_OPS[c.op]
    sql = f"{head} AND type = ? AND value {cmp} ?" + (" AND elem = 1" if c.op == "has" else "")
    return sql, args + [k, s]


def matching_sql(cs: list[Clause]) -> tuple[str, list]:
    """One statement for the sorted distinct positions matching every clause: the positive clauses
    intersected (or all documents when there is none), the negated ones subtracted."""
    pos = [c for c in cs if not c.negate]
    neg = [c for c in cs if c.negate]
    parts, args = [], []
    for i, c in enumerate(pos or [None]):
        sql, a = clause_sql(c) if c is not None else ("SELECT pos FROM docs", [])
        parts.append(("" if i == 0 else " INTERSECT ") + f"SELECT pos FROM ({sql})")
        args += a
    for c in neg:
        sql, a = clause_sql(c)
        parts.append(f" EXCEPT SELECT pos FROM ({sql})")
        args += a
    if len(parts) == 1:  # a compound already yields distinct rows; a single select needs DISTINCT
        parts[0] = parts[0].replace("SELECT pos", "SELECT DISTINCT pos", 1)
    return "".join(parts) + " ORDER BY 1", args


def fields_of(metadata: Mapping[str, object]):
    """The side-table rows (field, type, value, folded, elem) of one document's metadata: its own
    value per field (``elem`` 0; arrays, objects and null have type "array", "object", "null") and
    one row per scalar element of an array (``elem`` 1)."""
    rows = set()
    for field, value in metadata.items():
        rows.add(_row(field, value, 0))
        if isinstance(value, list):
            rows.update(_row(field, v, 1) for v in value)
    return rows


def _row(field: str, value, elem: int) -> tuple:
    if value is None or isinstance(value, (list, dict)):
        return field, {type(None): "null", list: "array", dict: "object"}[type(value)], "", None, elem
    k, s = stored(value)
    return field, k, s, fold(s) if k == "text" else None, elem
