"""What a request to ``relsearch serve`` may be: the per-request limits and the JSON bodies (pydantic);
and what a search answers (its schema in OpenAPI).

The bodies are strict (JSON types as the Python API checks them) and refuse unknown fields; what
they leave to the API (the filter grammar, relation and field names) is checked once, there.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, create_model

from ..api import SearchRequest
from ..retrieval.parts import PARTS
from ..retrieval.plan import SCALES
from ..retrieval.request import MAX_FACETS, SearchOptions
from ..retrieval.search import DEFAULT_WEIGHT, MAX_EXAMPLES


@dataclass(frozen=True, kw_only=True)
class ServeLimits:
    """Per-request limits; the defaults are documented in docs/http-api.md ("Limits")."""

    max_body_bytes: int = 4 << 20  # request body (413 beyond)
    max_batch: int = 256  # queries in one /search/batch request
    max_documents: int = 1000  # documents in one /documents request
    max_text_chars: int = 100_000  # characters of a query text
    max_hits: int = 100_000  # cost of one request (request_cost: candidates x 2 with explain); 422 beyond
    max_response_bytes: int = 32 << 20  # JSON of one search response; 422 naming k beyond
    timeout_s: float = 30.0  # a search or score request waiting longer gets 503, and its work stops
    body_timeout_s: float = 10.0  # the whole body must arrive within this after the request starts (408)
    micro_batch: int = 64  # queries per encoder pass across concurrent requests
    batch_wait_ms: float = 0.0  # always wait this long for more requests before a pass (tests)
    # Wait up to this long for as many queries as the previous pass answered: clients that pass
    # answered are sending their next request, and without the wait the next pass would start with
    # the first of them alone (passes alternating between a few and many queries).
    refill_wait_ms: float = 5.0


FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Text = Annotated[str, Field(min_length=1, max_length=ServeLimits.max_text_chars)]


class _Body(BaseModel):
    # strict: JSON types as the Python API checks them ("k": true and "k": "5" are refused, not coerced)
    model_config = ConfigDict(extra="forbid", strict=True)


ONE_OF_TEXT_OR_ID = {"oneOf": [{"required": ["text"]}, {"required": ["id"]}, {"required": ["like"]}]}
Document = Annotated[dict[str, Any], WithJsonSchema({
    "type": "object", "required": ["id", "text"], "additionalProperties": True,
    "description": "A document: id, text, and any other fields as metadata (the rules of relsearch index).",
    "properties": {"id": {"anyOf": [{"type": "string", "minLength": 1, "pattern": "\\S"}, {"type": "integer"}]},
                   "text": {"type": "string", "minLength": 1, "pattern": "\\S"}}})]

_SCALAR = {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]}
_SCALARS = {"type": "array", "minItems": 1, "items": _SCALAR}
_OPERATORS = {"type": "object", "minProperties": 1, "additionalProperties": False, "properties": {
    **{op: _SCALAR for op in ("eq", "ieq", "gt", "gte", "lt", "lte", "has")}, "in": _SCALARS,
    "exists": {"type": "boolean"}, "null": {"type": "boolean", "description": "true: missing or null"},
    "not": {"type": "object", "description": "Operators, each negated (documents without the field included)."}}}
_FILTER_LIST = {"type": "array", "minItems": 1, "items": {"type": "object", "description": "A filter (this same form)."}}
# the JSON schema /docs shows: the grammar of indexer/filters.py (nesting of $any / $all is not spelt out)
Filters = Annotated[dict[str, Any], WithJsonSchema({
    "type": "object", "description": (
        'Metadata filters, AND-ed: {field: value} (exact; JSON types match exactly: true is not 1, "1" is not 1) or '
        '{field: {operator: value}} with eq, ieq, gt, gte, lt, lte, in (a list), has, exists, null (true: missing or '
        'null), not ({operator: value} negated); "$any": [filters] matches at least one of them, "$all": [filters] '
        'every one (see indexer/filters.py).'),
    "properties": {"$any": _FILTER_LIST, "$all": _FILTER_LIST},
    "additionalProperties": {"anyOf": [_SCALAR, _OPERATORS]},
    "examples": [{"gics_sector": {"in": ["Energy", "Utilities"]}, "founded": {"not": {"null": True}}},
                 {"$any": [{"gics_sector": "Energy"}, {"founded": {"lt": "1950"}}]}]})]


class ExampleBody(_Body):
    id: str | None = Field(None, min_length=1, description="An indexed document (never returned itself).")
    text: Text | None = Field(None, description="Or a text.")
    weight: FiniteFloat | None = Field(None, gt=0, description="The example's weight (default: " + ", ".join(
        f"{w:g} for {side}" for side, w in DEFAULT_WEIGHT.items()) + ").")


Name = Annotated[str, Field(min_length=1)]
# The JSON type of each option of retrieval/request.py's SearchOptions, where its Python type says too little
JSON_TYPES = {"int": int, "int | None": int | None, "float | None": FiniteFloat | None, "bool": bool,
              "str | None": Name | None, "collapse": Literal[False] | Name | None, "filters": Filters,
              "hybrid": Literal["rrf", "weighted"] | None, "fields": list[Name] | None, "facets": list[Name]}
MAX_LENGTH = {"fields": 1000, "facets": MAX_FACETS}


def _declared(option: dataclasses.Field) -> tuple:
    """A pydantic field from an option's declaration: its type, default, bounds and help."""
    meta = option.metadata
    bounds = {key: value for key, value in (("ge", meta["low"]), ("le", meta["high"]),
                                            ("max_length", MAX_LENGTH.get(option.name))) if value is not None}
    default = ({"default_factory": option.default_factory} if option.default_factory is not dataclasses.MISSING
               else {"default_factory": list} if option.default == () else {"default": option.default})
    kind = JSON_TYPES.get(option.name) or JSON_TYPES[option.type]
    described = {} if kind is Filters else {"description": meta["help"]}  # Filters' schema describes its grammar
    return kind, Field(**default, **bounds, **described)


class _Options(_Body):
    def request(self, query: _Query, relations: dict | None = None) -> SearchRequest:
        """The API's request for ``query`` (text, id or examples) with these options."""
        return SearchRequest(text=query.text, id=query.id, relations=relations or self.relations, **query.examples(),
                             **{o.name: getattr(self, o.name) for o in dataclasses.fields(SearchOptions)})


# The server's options are SearchOptions' (retrieval/request.py), with the served index and the relations
QueryOptions = create_model(
    "QueryOptions", __base__=_Options,
    index=(str | None, Field(None, description="Served index name (default: the first --index).")),
    relations=(dict[str, FiniteFloat], Field(default_factory=lambda: {"identity": 1.0},
                                             description="Relation mixture {name: weight}; see GET /relations.")),
    **{option.name: _declared(option) for option in dataclasses.fields(SearchOptions)})


class _Query(_Body):
    """A query: a text, an id, or examples of each side (Qdrant's recommend): each example is moved by the
    relation mixture, then q = Σ w·q(e) over one side minus over the other; the examples never come back."""

    def examples(self) -> dict[str, list[dict]]:
        return {side: [e.model_dump(exclude_none=True) for e in getattr(self, side)] for side in DEFAULT_WEIGHT}


_QueryFields = create_model(
    "_QueryFields", __base__=_Query,
    text=(Text | None, Field(None, description="Query text (or give id).")),
    id=(Name | None, Field(None, description="An indexed document to query with.")),
    **{side: (list[ExampleBody], Field(default_factory=list, max_length=MAX_EXAMPLES,
                                       description=f"Examples, {side} (default weight {w:g}); instead of text or id."))
       for side, w in DEFAULT_WEIGHT.items()})


class SearchBody(QueryOptions, _QueryFields):
    model_config = ConfigDict(json_schema_extra=ONE_OF_TEXT_OR_ID)


class BatchQuery(_QueryFields):
    model_config = ConfigDict(json_schema_extra=ONE_OF_TEXT_OR_ID)
    relations: dict[str, FiniteFloat] | None = Field(None, description="Overrides the batch's relations.")


class BatchBody(QueryOptions):
    queries: list[BatchQuery] = Field(min_length=1, description="Queries sharing the other options.")


class ScoreBody(_Body):
    index: str | None = None
    a: Text | None = Field(None, description="A text (with b), or give ids.")
    b: Text | None = None
    ids: list[Name] | None = Field(None, min_length=2, max_length=2, description="[A, B]: two indexed documents; "
                                   "per relation B's whole score in A's answer, its rank and parts.")


class DocumentsBody(_Body):
    index: str | None = None
    documents: list[Document] = Field(min_length=1, description='{"id", "text", ...metadata} each.')


class DeleteBody(_Body):
    index: str | None = None
    ids: list[str] = Field(min_length=1)


# ---------------------------------------------------------------- what a search answers
# The routes write these answers by hand, hit by hit within --max-response-bytes (routers/search.py);
# the models give them their schema in OpenAPI.

Mode = Literal[tuple(SCALES)]  # retrieval/plan.py's modes
MODE = ("What the query plan decided for the relation mixture (retrieval/plan.py), and so the scale of the scores: "
        "dense (the weighted sum of cosines), recipe (fused scores, [0, 1 + bonuses] within the pool, below 0 past "
        "it), rrf (reciprocal rank fusion) or projection (cosine in the relation's projected space).")


class _Recipe(BaseModel):
    """The combined recipe a query ran (retrieval/recipe.py ``Recipe.to_json``): its relations'
    recipes weighted by the mixture (retrieval/plan.py ``combine``), hybrid's BM25 share included."""

    mixture: dict[str, float] = Field(description="Operator → weight of the dense query vector.")
    bm25: float = Field(description="BM25's share of the min-max normalised scores (recipe mode), in [0, 1].")
    title: float = Field(description="Weight of the query title's (first line) vector beside the mixture.")


# the additive parts as retrieval/parts.py's table declares them, then the pool depth
RecipeParts = create_model(
    "RecipeParts", __base__=_Recipe,
    **{name: ((dict[str, float], Field(default_factory=dict, description=part.help)) if part.keyed
              else (float, Field(0.0, description=part.help))) for name, part in PARTS.items()},
    depth=(int, Field(description="Candidates taken from each list: the pool the fusion re-orders.")))


RESULTS = "The hits, best first: rank, id, score, text, metadata and, as asked, explain and highlights."
WHY_NOT = ('With why_not: {"id", "rank" (null: the query cannot return it), "of" (hits ranked), "score", "explain", '
           '"cut": the last hit shown, {"rank", "id", "score", "explain"}, when the document ranks below it}.')
FACETS = "With facets: {field: [[value, count], ...]} over the hits the facets count."


class SearchAnswer(BaseModel):
    index: str
    generation: str = Field(description="The index generation that answered.")
    results: list[dict[str, Any]] = Field(description=RESULTS)
    warnings: list[str] = Field(description="Filter operators that can never match, parts of a relation that cannot "
                                            "apply to this query: each once.")
    facets: dict[str, list[list[Any]]] | None = Field(None, description=FACETS)
    why_not: dict[str, Any] | None = Field(None, description=WHY_NOT)
    mode: Mode = Field(description=MODE)
    recipe: RecipeParts = Field(description="The combined recipe the query ran (projection: its relations).")


class BatchEntry(BaseModel):
    """One query's answer: its hits and plan, or the error of that query alone."""

    results: list[dict[str, Any]] | None = Field(None, description=RESULTS)
    facets: dict[str, list[list[Any]]] | None = Field(None, description=FACETS)
    why_not: dict[str, Any] | None = Field(None, description=WHY_NOT)
    mode: Mode | None = Field(None, description=MODE)
    recipe: RecipeParts | None = None
    error: dict[str, Any] | None = Field(None, description='{"field": "queries[i].FIELD", "message": ...}')


class BatchSearchAnswer(BaseModel):
    index: str
    generation: str
    batch: list[BatchEntry] = Field(description="One entry per query, in order.")
    warnings: list[str]
