"""What a query may ask for: bounds on k and re-ranking depth, relation weights, typed filter values.

Shared by ``relsearch query`` and ``relsearch lookup`` (their options and ``--queries`` lines), the
Python API (Searcher, the lookup job) and the Elasticsearch backend, so every entry point refuses
the same things with the same words. Kept free of heavy imports: the CLI uses it in option types.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping

from ..indexer.filters import ALL, ANY, MAX_CLAUSES, clauses

# Above these a request is refused; below them k and depth are clipped to the number of live
# documents (Searcher.search), so a large k costs no more than the index holds.
MAX_K = 10_000  # hits per query (query -k, lookup -k)
MAX_RERANK_DEPTH = 10_000  # ANN candidates re-scored by a pair head (query --rerank-depth)
# Scores are Σ w·cos in float32: a weight beyond this says nothing a smaller one cannot, and near
# float32's range (3.4e38) the query vector overflows to inf/nan.
MAX_WEIGHT = 1e6
FACET_DEPTH = 100  # hits a facet counts by default (Elasticsearch counts every match; a vector search's are ranked)
# A --filter expression nests brackets ([ and {, outside double quotes) at most this deep: deeper ones are
# refused before any JSON is decoded (json.loads recurses once per level: 3,000 levels raised RecursionError).
MAX_FILTER_NESTING = 32

FilterValue = str | bool | int | float
Filters = Mapping[str, "FilterValue | Mapping"]  # {field: value | {operator: value}}: indexer/filters.py


def check_at_most(name: str, value: int, maximum: int) -> int:
    """``value`` when 1 ≤ value ≤ ``maximum``; else a ValueError naming ``name`` and the range."""
    if not 1 <= value <= maximum:
        raise ValueError(f"{name} must be between 1 and {maximum:,}, got {value:,}")
    return value


def check_weights(relations: Mapping[str, float]) -> None:
    """Raise ValueError (one line naming the relation and value) unless every weight is a finite
    number of magnitude at most MAX_WEIGHT and at least one is non-zero."""
    for name, weight in relations.items():
        if not math.isfinite(weight):
            raise ValueError(f"relation {name!r}: weight {weight} is not a finite number")
        if abs(weight) > MAX_WEIGHT:
            raise ValueError(f"relation {name!r}: weight {weight:g} is beyond ±{MAX_WEIGHT:g}")
    if relations and not any(relations.values()):
        listed = ", ".join(f"{n}={w:g}" for n, w in relations.items())
        raise ValueError(f"relation weights are all zero ({listed}): give at least one non-zero weight")


def is_utf8(text: str) -> bool:
    """False for a str holding lone surrogates (undecodable argv bytes, JSON ``\\ud800``): it cannot be
    encoded, stored or printed."""
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _no_constant(name: str):
    raise ValueError(name)  # NaN, Infinity: not JSON values, so the text stays a string


def filter_value(text: str) -> FilterValue:
    """The value a ``--filter FIELD=VALUE`` matches: a JSON number (``1``, ``2.5``; finite), ``true``
    or ``false``, or a JSON string in double quotes (``"1"`` is the string 1); any other text is
    that text as a string (``Financials``, ``null``, ``[1]``)."""
    if text.lstrip()[:1] in ("[", "{"):  # never a scalar: not decoded (a deep one would recurse)
        return text
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except ValueError:
        return text
    if isinstance(value, float) and not math.isfinite(value):  # 1e999
        return text
    return value if isinstance(value, (str, bool, int, float)) else text


def check_filters(filters: Mapping[str, object]) -> None:
    """Raise ValueError (one line naming the field) unless ``filters`` is a valid typed filter:
    ``{field: scalar | {operator: value}}`` as indexer/filters.py describes."""
    clauses(filters)


# --filter grammar: [not ] FIELD OP VALUE, FIELD in|has VALUE, FIELD exists, FIELD is [not] null (FIELD has none
# of = ! < > ~); EXPR or EXPR ...: any of them
_WORD = re.compile(r"(?P<field>[^\s=!<>~]+)\s+(?:(?P<op>in|has)\s+(?P<value>.*\S)|(?P<exists>exists|is null|is not null))"
                   r"\s*", re.S)
# the field runs to the first operator character (stripped after): no backtracking over long runs of spaces
_CMP = re.compile(r"(?P<field>[^=!<>~]+)(?P<op>!=|~=|>=|<=|=|>|<)(?P<value>.*)", re.S)
_CMP_OPS = {"=": "eq", "!=": "eq", "~=": "ieq", ">": "gt", ">=": "gte", "<": "lt", "<=": "lte"}


def parse_filter(spec: str) -> tuple[str, str, object, bool]:
    """One ``--filter`` expression → (field, operator, value, negated) of indexer/filters.py.

    ``FIELD=VALUE`` (typed by :func:`filter_value`), ``FIELD!=VALUE``, ``FIELD>=VALUE`` (also ``>``,
    ``<``, ``<=``; numbers or strings), ``FIELD~=TEXT`` (case-insensitive), ``FIELD in [A,B]``
    (a JSON array, or comma-separated values typed one by one), ``FIELD has VALUE`` (an array
    holding it), ``FIELD exists``, ``FIELD is null`` (missing or null), ``FIELD is not null``; a
    leading ``not `` negates any of them. ``EXPR or EXPR ...`` matches when any of them does (also
    across fields): it parses to ``("$any", "any", [filter, ...], False)``. ValueError if malformed,
    or for a doubled operator (``==``, ``=>``, ``<>``, ...) naming the right form, for brackets
    nested deeper than :data:`MAX_FILTER_NESTING` or more than MAX_CLAUSES ``or`` alternatives.
    """
    _check_nesting(spec)
    alternatives = _split_or(spec)
    if len(alternatives) > MAX_CLAUSES:
        raise ValueError(f"cannot read filter {spec[:80]!r}...: {len(alternatives):,} alternatives joined by 'or', "
                         f"at most {MAX_CLAUSES:,} are allowed")
    if len(alternatives) > 1:
        return ANY, "any", [merge_filters([parse_filter(a)]) for a in alternatives], False
    text = spec.strip()
    negate = text.startswith("not ")
    if negate:
        text = text[4:].lstrip()
    if m := _WORD.fullmatch(text):
        field = m["field"]
        if m["exists"] == "exists":
            return field, "exists", True, negate
        if m["exists"]:
            return field, "null", m["exists"] == "is null", negate
        if m["op"] == "has":
            return field, "has", filter_value(m["value"]), negate
        return field, "in", _listed(m["value"], spec), negate
    if (m := _CMP.fullmatch(text)) and m["field"].strip():
        op, raw = m["op"], m["value"].strip()
        _refuse_doubled(spec, m["field"].strip(), op, m["value"])
        value = raw if op == "~=" and not raw.startswith('"') else filter_value(raw)
        return m["field"].strip(), _CMP_OPS[op], value, negate != (op == "!=")
    raise ValueError(f"cannot read filter {spec!r}: expected FIELD=VALUE, FIELD!=VALUE, FIELD>=VALUE (>, <, <=), "
                     "FIELD~=TEXT, FIELD in [A,B], FIELD has VALUE, FIELD exists or FIELD is [not] null, optionally "
                     "after 'not '; several joined by ' or '")


_DOUBLED = {"==": "=", "=>": ">=", "=<": "<=", "<>": "!=", "!==": "!=", ">==": ">=", "<==": "<=", "~==": "~=",
            "=!": "!=", "=~": "~="}


def _refuse_doubled(spec: str, field: str, op: str, rest: str) -> None:
    """``FIELD == VALUE`` would read as the value ``= VALUE``: refuse it (and =>, <>, ...) naming the form meant."""
    rest = rest.lstrip(" ")
    if rest[:1] not in ("=", "<", ">", "!", "~"):
        return
    written = op + rest[0] + (rest[1] if op + rest[:2] in _DOUBLED else "")
    meant, value = _DOUBLED.get(written, op), rest[len(written) - len(op):].strip()
    raise ValueError(f"cannot read filter {spec!r}: {written!r} is not an operator; write {field}{meant}{value} "
                     f"(a value that starts with {rest[0]!r} goes in double quotes: {field}{op}{json.dumps(rest.strip())})")


def _check_nesting(spec: str) -> None:
    """ValueError naming MAX_FILTER_NESTING when ``spec`` nests [ or { (outside double quotes) deeper."""
    depth = deepest = 0
    quoted = False
    for i, c in enumerate(spec):
        if c == '"' and (i == 0 or spec[i - 1] != "\\"):
            quoted = not quoted
        elif not quoted and c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif not quoted and c in "]}":
            depth = max(depth - 1, 0)
    if deepest > MAX_FILTER_NESTING:
        shown = spec if len(spec) <= 60 else spec[:57] + "..."
        raise ValueError(f"cannot read filter {shown!r}: brackets nest {deepest:,} deep, at most "
                         f"{MAX_FILTER_NESTING} are allowed")


def _split_or(spec: str) -> list[str]:
    """``spec`` cut at each `` or `` outside double quotes (one piece when there is none)."""
    pieces, start, quoted, i = [], 0, False, 0
    while i < len(spec):
        if spec[i] == '"' and (i == 0 or spec[i - 1] != "\\"):
            quoted = not quoted
        elif not quoted and spec.startswith(" or ", i):
            pieces.append(spec[start:i])
            start = i = i + 4
            continue
        i += 1
    return pieces + [spec[start:]]


def _listed(text: str, spec: str) -> list:
    if not (text.startswith("[") and text.endswith("]")):
        raise ValueError(f"filter {spec!r}: 'in' takes a list in brackets, e.g. [Energy,Utilities]")
    try:
        values = json.loads(text, parse_constant=_no_constant)
        if isinstance(values, list) and all(isinstance(v, (str, bool, int, float)) for v in values):
            return values
    except ValueError:
        pass
    return [filter_value(item.strip()) for item in text[1:-1].split(",")]


def merge_filters(specs: list[tuple[str, str, object, bool]]) -> dict:
    """Parsed ``--filter`` expressions (AND) → the JSON form: a lone equality stays a plain value,
    anything else becomes ``{operator: value, "not": {...}}``; the same operator twice on a field
    is a ValueError (two values AND-ed would match nothing; use ``in``)."""
    ops: dict[str, dict] = {}
    anys: list[list] = []
    for field, op, value, negate in specs:
        if field == ANY and op == "any":
            anys.append(value)
            continue
        target = ops.setdefault(field, {})
        if negate:
            target = target.setdefault("not", {})
        if op in target:
            raise ValueError(f"filter {field!r}: {'not ' if negate else ''}{op} given twice; use "
                             f"'{field} in [A,B]' for any of several values")
        target[op] = value
    out: dict = {f: o["eq"] if list(o) == ["eq"] else o for f, o in ops.items()}
    if len(anys) == 1:
        out[ANY] = anys[0]
    elif anys:
        out[ALL] = [{ANY: a} for a in anys]
    return out
