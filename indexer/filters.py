"""Typed metadata filters: the JSON form every entry point shares, its checks, and its SQL.

A filter is ``{field: condition}``, all fields AND-ed. A condition is a scalar (exact match) or an
object of operators, also AND-ed::

    {"gics_sector": "Energy"}                               equal (JSON types respected)
    {"year": {"gte": 2010, "lt": 2020}}                     range: gt, gte, lt, lte (numbers or strings)
    {"gics_sector": {"in": ["Energy", "Utilities"]}}        any of
    {"tags": {"has": "finance"}}                            an array holding the value
    {"name": {"ieq": "apple inc."}}                         case-insensitive string equality
    {"ceo": {"exists": true}}                               the field is present (any value, null too)
    {"ceo": {"null": true}}                                 the field is missing or null ("null": false: it holds a value)
    {"country": {"not": {"eq": "US", "in": ["CA"]}}}        each operator inside negated
    {"$any": [{"sector": "Energy"}, {"year": {"lt": 1950}}]}  at least one of the filters (OR, across fields)
    {"$all": [{"$any": [...]}, {"$any": [...]}]}             every one of the filters (AND; to combine several $any)

Matching (tests/indexer/test_filters.py holds the full table): values compare only within their JSON type
(``true`` is not ``1``, ``"1"`` is not ``1``; ``1`` equals ``1.0``); strings order by code point.
A field holding an array matches ``eq``, ``ieq``, ranges and ``in`` when any element does (as in
Elasticsearch or MongoDB) and ``has`` only when it is an array. ``not`` keeps the documents the
operator does not match, documents without the field included. ``$any`` and ``$all`` are the only
reserved keys: a metadata field of either name cannot be filtered in this form.

A filter holds at most :data:`MAX_CLAUSES` operators (each operator of each field, in every ``$any``
branch, counts once; an ``in`` counts once), holds at most :data:`MAX_VALUES` ``in`` values in all (the
elements of every ``in`` list, counted once per place the list is used) and nests
``$any``/``$all`` at most :data:`MAX_DEPTH` deep. A sub-filter used in several places (the same
Python object twice) counts each time it is used, as the SQL would repeat it, but is measured once:
these bounds are checked before any term is built, so a filter that is refused costs no more than
the objects it is made of. Below these bounds the SQL never reaches one of SQLite's own limits:
compound SELECTs are built in groups of at most :data:`SQL_GROUP` terms (SQLite allows 500).

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
OPS = ("eq", "ieq", *RANGE_OPS, "in", "has", "exists", "null", "not")
MAX_IN = 10_000  # values of one ``in``
MAX_VALUES = 10_000  # values of all the ``in`` lists of one filter together (each also at most MAX_IN)
MAX_CLAUSES = 1_024  # operators in one filter (Elasticsearch's classic indices.query.bool.max_clause_count)
MAX_DEPTH = 4  # nesting of $any / $all
SQL_GROUP = 32  # terms per compound SELECT in the generated SQL (SQLITE_MAX_COMPOUND_SELECT is 500)
ANY, ALL = "$any", "$all"
# the largest integer a filter compares as a number: beyond it float() overflows (a build keeps such a
# metadata number as JSON, see stored(), but no filter can compare it)
MAX_NUMBER = 2**1024 - 2**970


class FilterError(ValueError):
    """A filter that cannot be evaluated; the message names the field and what is wrong."""


@dataclass(frozen=True)
class Clause:
    """One operator on one field; ``negate``: the documents it does not match. ``op`` is one of
    OPS except "not" and "null", or "notnull" (the field holds a value other than null: ``null``
    true is a negated "notnull")."""

    field: str
    op: str
    value: object = None
    negate: bool = False


@dataclass(frozen=True)
class AnyOf:
    """``$any``: the documents matching at least one option, each option a list of terms AND-ed."""

    options: tuple[tuple, ...]
    negate = False

    def clauses(self):
        for option in self.options:
            for term in option:
                yield from term.clauses() if isinstance(term, AnyOf) else (term,)


def kind(value) -> str:
    """The filter type of a scalar: "bool", "number" or "text" (FilterError otherwise)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)) and (not isinstance(value, float) or math.isfinite(value)):
        if isinstance(value, int) and abs(value) > MAX_NUMBER:
            raise FilterError(f"{_shown(value)} is beyond the numbers a filter compares (about ±1.8e308)")
        return "number"
    if isinstance(value, str):
        if not _utf8(value):
            raise FilterError("not valid UTF-8")
        return "text"
    raise FilterError(f"{_shown(value)} is not a string, boolean or finite number")


def clauses(filters: Mapping[str, object] | None) -> list:
    """``filters`` (the JSON form above) → its terms: :class:`Clause` and :class:`AnyOf`; FilterError
    (one line naming the field or the bound) if invalid, or if it holds more than MAX_CLAUSES
    operators, more than MAX_VALUES ``in`` values or nests deeper than MAX_DEPTH; these bounds are
    checked first (:func:`_measure`), in time proportional to the distinct objects of ``filters``."""
    _measure(filters, 0, {})
    return _terms(filters, 0)


def fields_in(filters: Mapping[str, object] | None) -> list[str]:
    """The metadata fields ``filters`` names, in order, each once ($any / $all branches included)."""
    return list(dict.fromkeys(c.field for c in iter_clauses(clauses(filters))))


def iter_clauses(terms):
    for t in terms:
        yield from t.clauses() if isinstance(t, AnyOf) else (t,)


def _terms(filters, depth: int) -> list:
    if filters is not None and not isinstance(filters, Mapping):
        raise FilterError("a filter is an object of {field: condition}")
    out: list = []
    for field, cond in (filters or {}).items():
        if field in (ANY, ALL):
            if depth >= MAX_DEPTH:
                raise FilterError(f"{ANY} and {ALL} nest at most {MAX_DEPTH} deep")
            if not isinstance(cond, (list, tuple)) or not cond or not all(isinstance(f, Mapping) and f for f in cond):
                raise FilterError(f'"{field}" takes a list of filters, e.g. '
                                  '{"%s": [{"sector": "Energy"}, {"year": {"lt": 1950}}]}' % field)
            options = [_terms(f, depth + 1) for f in cond]
            if field == ALL:
                out += [t for option in options for t in option]
            else:
                out.append(AnyOf(tuple(tuple(option) for option in options)))
            continue
        if not isinstance(field, str) or not _utf8(field):
            raise FilterError(f"filter field {_shown(field)} must be a string of valid UTF-8")
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


def _measure(filters, depth: int, seen: dict) -> tuple[int, int]:
    """(operators, ``in`` values) of ``filters`` as :func:`_terms` would expand it; FilterError as soon as
    either passes its bound (MAX_CLAUSES, MAX_VALUES) or ``$any``/``$all`` nest deeper than MAX_DEPTH.
    ``seen`` (id → size) measures an object used in several places once: a filter made of one
    sub-filter repeated (``d = {"$all": [d] * 32}`` four times: a million operators) is refused in
    time proportional to its distinct objects, not to its expansion. Shapes are left to _terms."""
    if not isinstance(filters, Mapping):
        return 0, 0
    if id(filters) in seen:
        return seen[id(filters)]
    ops = values = 0
    for field, cond in filters.items():
        if field in (ANY, ALL):
            if depth >= MAX_DEPTH:
                raise FilterError(f"{ANY} and {ALL} nest at most {MAX_DEPTH} deep")
            if isinstance(cond, (list, tuple)):
                if len(cond) > MAX_CLAUSES:
                    _too_many(len(cond), 0)
                for option in cond:
                    o, v = _measure(option, depth + 1, seen)
                    ops, values = ops + o, values + v
                    _too_many(ops, values)
            continue
        if isinstance(cond, Mapping):
            for op, value in cond.items():
                for o, v in value.items() if op == "not" and isinstance(value, Mapping) else ((op, value),):
                    ops += 1
                    if o == "in" and isinstance(v, (list, tuple)):
                        if len(v) > MAX_IN:
                            raise FilterError(f'filter {_shown(field)}: "in" takes a list of 1 to {MAX_IN:,} values')
                        values += len(v)
                    _too_many(ops, values)
        else:
            ops += 1
            _too_many(ops, values)
    seen[id(filters)] = ops, values
    return ops, values


def _too_many(ops: int, values: int) -> None:
    if ops > MAX_CLAUSES:
        raise FilterError(f"the filter has more than {MAX_CLAUSES:,} operators (a sub-filter counts each time it "
                          f"is used), at most {MAX_CLAUSES:,} are allowed; give several values of one field as one 'in'")
    if values > MAX_VALUES:
        raise FilterError(f"the filter's 'in' lists hold more than {MAX_VALUES:,} values together (a list counts each "
                          f"time it is used), at most {MAX_VALUES:,} are allowed")


def _shown(value) -> str:
    """``value`` in an error message, bounded: a short scalar as written, anything else by its type
    (the repr of a list nested 3,000 deep would itself fail, of a huge one would be huge)."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**40:
            return f"an integer of {value.bit_length():,} bits"  # str() of one beyond 4,300 digits raises
        text = repr(value)
        return text if len(text) <= 80 else text[:77] + "..."
    return f"a {type(value).__name__}"


def _clause(field: str, op: str, value, negate: bool = False) -> Clause:
    if op not in OPS:
        raise FilterError(f"unknown operator {_shown(op)}; operators: {', '.join(OPS)}")
    if op == "exists":
        if not isinstance(value, bool):
            raise FilterError('"exists" takes true or false')
        return Clause(field, "exists", None, negate != (not value))
    if op == "null":  # true: missing or null, the complement of "holds a value"
        if not isinstance(value, bool):
            raise FilterError('"null" takes true (missing or null) or false (holds a value other than null)')
        return Clause(field, "notnull", None, negate != value)
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
    64 bits as floats (JSON numbers: 1 and 1.0 are the same number). A metadata integer beyond
    float's range (10**400 is valid JSON) is type "bignum" with no value: it is kept in the
    document's JSON, the field exists, but no filter compares it as a number."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_NUMBER:
        return "bignum", ""
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
    if c.op == "notnull":
        return head + " AND elem = 0 AND type <> 'null'", args
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


def matching_sql(terms: list) -> tuple[str, list]:
    """One statement for the sorted distinct positions matching every term: the positive terms
    intersected (or all documents when there is none), the negated ones subtracted, an
    :class:`AnyOf` the union of its options. Compound SELECTs hold at most SQL_GROUP terms each
    (larger ones nest in groups), so no filter within MAX_CLAUSES reaches SQLite's limits."""
    sql, args = _and_sql(terms)
    return f"SELECT DISTINCT pos FROM ({sql}) ORDER BY 1", args


def _term_sql(t) -> tuple[str, list]:
    if isinstance(t, AnyOf):
        return _compound([_and_sql(list(option)) for option in t.options], " UNION ")
    return clause_sql(t)


def _and_sql(terms: list) -> tuple[str, list]:
    pos = [_term_sql(t) for t in terms if not t.negate] or [("SELECT pos FROM docs", [])]
    neg = [_term_sql(t) for t in terms if t.negate]
    sql, args = _compound(pos, " INTERSECT ")
    if neg:
        minus, more = _compound(neg, " UNION ")
        sql, args = f"SELECT pos FROM ({sql}) EXCEPT SELECT pos FROM ({minus})", args + more
    return sql, args


def _compound(parts: list[tuple[str, list]], op: str) -> tuple[str, list]:
    """``parts`` joined by ``op`` (INTERSECT, UNION), each a ``SELECT pos FROM (...)``; more than
    SQL_GROUP parts are combined in groups first, so every compound SELECT stays small."""
    while len(parts) > SQL_GROUP:
        parts = [_compound(parts[i:i + SQL_GROUP], op) for i in range(0, len(parts), SQL_GROUP)]
    if len(parts) == 1:
        return parts[0]
    return (op.join(f"SELECT pos FROM ({sql})" for sql, _ in parts), [a for _, args in parts for a in args])


def fields_of(metadata: Mapping[str, object]):
    """The side-table rows (field, type, value, folded, elem) of one document's metadata: its own
    value per field (``elem`` 0; arrays, objects and null have type "array", "object", "null", an
    integer beyond float's range "bignum") and
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


# ---------------------------------------------------------------- filters that can never match

TYPES = ("text", "number", "bool", "null", "array", "object", "bignum")  # the side table's types
_NAMES = {"text": "strings", "number": "numbers", "bool": "booleans", "null": "nulls", "array": "arrays",
          "object": "objects", "bignum": "integers beyond ±1.8e308"}
_CLI_OPS = {"eq": "=", "gt": ">", "gte": ">=", "lt": "<", "lte": "<=", "has": " has "}


def warnings(terms: list, types_of) -> list[str]:
    """One line per operator that can never match because the type of its value never occurs in
    its field: ``types_of(field)`` → the side-table types present there (:data:`TYPES`). Such an
    operator matches no document (negated: every document that has the field or not), silently
    but for this warning; when the field holds strings, it suggests the quoted form of the value.
    ``exists`` and ``null`` never warn."""
    out: list[str] = []
    for c in dict.fromkeys(iter_clauses(terms)):
        if c.op in ("exists", "notnull"):
            continue
        present = set(types_of(c.field))
        if c.op == "has":
            wanted, value_types = {"array"}, "arrays"
        elif c.op == "ieq":
            wanted, value_types = {"text"}, "strings"
        else:
            values = c.value if c.op == "in" else (c.value,)
            wanted = {kind(v) for v in values}
            value_types = " or ".join(_NAMES[k] for k in sorted(wanted))
        if wanted & present:
            continue
        holds = ", ".join(_NAMES[t] for t in TYPES if t in present) or "nothing"
        effect = "matches every document" if c.negate else "matches no document"
        line = (f"filter {c.field!r}: {'not ' if c.negate else ''}{c.op} {json.dumps(c.value, ensure_ascii=False)} "
                f"{effect}: {c.field!r} holds no {value_types} (it holds {holds})")
        if "text" in present and c.op not in ("has", "ieq"):
            quoted = [v if isinstance(v, str) else json.dumps(v) for v in (c.value if c.op == "in" else (c.value,))]
            if c.op == "in":
                line += f'; to match strings, quote the values: {json.dumps(quoted, ensure_ascii=False)}'
            else:
                cli = f'{"not " if c.negate and c.op != "eq" else ""}{c.field}{"!=" if c.negate and c.op == "eq" else _CLI_OPS[c.op]}'
                line += (f"; to match the string, quote it: --filter '{cli}{json.dumps(quoted[0], ensure_ascii=False)}'"
                         f" (JSON: {json.dumps(quoted[0], ensure_ascii=False)})")
        out.append(line)
    return out
