"""What a query may ask for: bounds on k and re-ranking depth, relation weights, typed filter values.

Shared by ``relsearch query`` and ``relsearch lookup`` (their options and ``--queries`` lines), the
Python API (Searcher, the lookup job) and the Elasticsearch backend, so every entry point refuses
the same things with the same words. Kept free of heavy imports: the CLI uses it in option types.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

# the --filter text grammar lives beside the JSON form it reads into; these names are used from here
from ..indexer.filter_grammar import MAX_FILTER_NESTING, filter_value, merge_filters, parse_filter  # noqa: F401
from ..indexer.filters import clauses

# Above these a request is refused; below them k and depth are clipped to the number of live
# documents (Searcher.search), so a large k costs no more than the index holds.
MAX_K = 10_000  # hits per query (query -k, lookup -k)
MAX_RERANK_DEPTH = 10_000  # ANN candidates re-scored by a pair head (query --rerank-depth)
# Scores are Σ w·cos in float32: a weight beyond this says nothing a smaller one cannot, and near
# float32's range (3.4e38) the query vector overflows to inf/nan.
MAX_WEIGHT = 1e6
FACET_DEPTH = 100  # hits a facet counts by default (Elasticsearch counts every match; a vector search's are ranked)
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


def check_filters(filters: Mapping[str, object]) -> None:
    """Raise ValueError (one line naming the field) unless ``filters`` is a valid typed filter:
    ``{field: scalar | {operator: value}}`` as indexer/filters.py describes."""
    clauses(filters)
