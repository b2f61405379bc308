"""What a query may ask for: bounds on k and re-ranking depth, relation weights, typed filter values.

Shared by ``relsearch query`` and ``relsearch lookup`` (their options and ``--queries`` lines), the
Python API (Searcher, the lookup job) and the Elasticsearch backend, so every entry point refuses
the same things with the same words. Kept free of heavy imports: the CLI uses it in option types.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping

# Above these a request is refused; below them k and depth are clipped to the number of live
# documents (Searcher.search), so a large k costs no more than the index holds.
MAX_K = 10_000  # hits per query (query -k, lookup -k)
MAX_RERANK_DEPTH = 10_000  # ANN candidates re-scored by a pair head (query --rerank-depth)
# Scores are Σ w·cos in float32: a weight beyond this says nothing a smaller one cannot, and near
# float32's range (3.4e38) the query vector overflows to inf/nan.
MAX_WEIGHT = 1e6

FilterValue = str | bool | int | float


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
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except ValueError:
        return text
    if isinstance(value, float) and not math.isfinite(value):  # 1e999
        return text
    return value if isinstance(value, (str, bool, int, float)) else text


def check_filters(filters: Mapping[str, FilterValue]) -> None:
    """Raise ValueError unless every filter value is valid text, a boolean or a finite number."""
    for name, value in filters.items():
        if isinstance(value, str) and not is_utf8(value) or not is_utf8(name):
            raise ValueError(f"filter {name!r}: not valid UTF-8")
        if isinstance(value, float) and not math.isfinite(value) or not isinstance(value, (str, bool, int, float)):
            raise ValueError(f"filter {name!r}: {value!r} is not a string, boolean or finite number")
