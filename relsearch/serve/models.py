"""What a request to ``relsearch serve`` may be: the per-request limits and the JSON bodies (pydantic);
and what a search answers (its schema in OpenAPI).

The bodies are strict (JSON types as the Python API checks them) and refuse unknown fields; what
they leave to the API (the filter grammar, relation and field names) is checked once, there.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from ..api import MAX_K, MAX_RERANK_DEPTH, SearchRequest
from ..retrieval.inputs import FACET_DEPTH
from ..retrieval.plan import SCALES


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
    weight: FiniteFloat | None = Field(None, gt=0, description="The example's weight (default: 1 for a like, 0.5 for an unlike).")


_EXAMPLES = ("Query by examples instead of text or id (Qdrant's recommend): each example is moved by the relation "
             "mixture, then q = Σ w·q(like) − Σ w·q(unlike); the example documents never come back.")


class QueryOptions(_Body):
    index: str | None = Field(None, description="Served index name (default: the first --index).")
    relations: dict[str, FiniteFloat] = Field(default_factory=lambda: {"identity": 1.0},
                                              description="Relation mixture {name: weight}; see GET /relations.")
    k: int = Field(10, ge=1, le=MAX_K)
    offset: int = Field(0, ge=0, le=MAX_K - 1)
    min_score: FiniteFloat | None = Field(None, description="Drop hits scoring below this.")
    collapse: Literal[False] | Annotated[str, Field(min_length=1)] | None = Field(
        None, description="Keep the best hit per value of this metadata field (default: the index's recorded "
        "collapse field, if any; false: none).")
    field: str | None = Field(None, min_length=1, description="One named text field of an index of several (default: "
                              "all, each document by its best field; each hit's \"field\" says which).")
    # typed here only as an object: its grammar ($any / $all lists, operator objects, "in" lists) is
    # checked once, by the API's validation (indexer/filters.py), as for relsearch query and Index.search
    filters: Filters = Field(default_factory=dict)
    explain: bool = Field(False, description="Add every operator's own score to each hit.")
    rerank: str | None = Field(None, description="A re-ranking head of the bundle, e.g. pu-head.")
    rerank_depth: int | None = Field(None, ge=1, le=MAX_RERANK_DEPTH)
    hybrid: Literal["rrf", "weighted"] | None = Field(None, description="Fuse with BM25 on the query text: "
                                                      "rrf (reciprocal rank fusion) or weighted.")
    hybrid_weight: FiniteFloat | None = Field(None, ge=0, le=1, description="With hybrid weighted: the relational "
                                        "list's share of the min-max normalised scores (BM25 gets the rest; 0.5).")
    fields: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None, max_length=1000, description="The metadata fields each hit carries, in this order (like Elasticsearch's "
        "_source filtering); default: every field.")
    metadata: bool = Field(True, description="false: hits carry no metadata (\"metadata\": {}).")
    facets: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, max_length=16, description="Metadata fields whose values are counted over the first "
        "facet_depth hits (the answer's \"facets\": {field: [[value, count], ...]}).")
    facet_depth: int = Field(FACET_DEPTH, ge=1, le=MAX_K, description="Hits the facets count.")
    highlight: bool = Field(False, description="Each hit's \"highlights\": [start, end) offsets of the query's BM25 "
                                               "terms in its text (searches with a BM25 part).")

    def request(self, text: str | None, doc_id: str | None, relations: dict | None = None,
                like: list[ExampleBody] = (), unlike: list[ExampleBody] = ()) -> SearchRequest:
        return SearchRequest(text=text, id=doc_id, relations=relations or self.relations, k=self.k,
                             like=[e.model_dump(exclude_none=True) for e in like],
                             unlike=[e.model_dump(exclude_none=True) for e in unlike],
                             offset=self.offset, min_score=self.min_score, collapse=self.collapse,
                             filters=self.filters, explain=self.explain, rerank=self.rerank,
                             rerank_depth=self.rerank_depth, hybrid=self.hybrid, hybrid_weight=self.hybrid_weight,
                             fields=self.fields, metadata=self.metadata, facets=tuple(self.facets),
                             facet_depth=self.facet_depth, highlight=self.highlight, field=self.field)


class SearchBody(QueryOptions):
    model_config = ConfigDict(json_schema_extra=ONE_OF_TEXT_OR_ID)
    text: Text | None = Field(None, description="Query text (or give id).")
    id: str | None = Field(None, min_length=1, description="An indexed document to query with.")
    like: list[ExampleBody] = Field(default_factory=list, max_length=64, description=_EXAMPLES)
    unlike: list[ExampleBody] = Field(default_factory=list, max_length=64, description="Examples to push away from.")


class BatchQuery(_Body):
    model_config = ConfigDict(json_schema_extra=ONE_OF_TEXT_OR_ID)
    text: Text | None = None
    id: str | None = Field(None, min_length=1)
    like: list[ExampleBody] = Field(default_factory=list, max_length=64, description=_EXAMPLES)
    unlike: list[ExampleBody] = Field(default_factory=list, max_length=64)
    relations: dict[str, FiniteFloat] | None = Field(None, description="Overrides the batch's relations.")


class BatchBody(QueryOptions):
    queries: list[BatchQuery] = Field(min_length=1, description="Queries sharing the other options.")


class ScoreBody(_Body):
    index: str | None = None
    a: Text
    b: Text


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


class RecipeParts(BaseModel):
    """The combined recipe a query ran (retrieval/recipe.py ``Recipe.to_json``): its relations'
    recipes weighted by the mixture (retrieval/plan.py ``combine``), hybrid's BM25 share included."""

    mixture: dict[str, float] = Field(description="Operator → weight of the dense query vector.")
    bm25: float = Field(description="BM25's share of the min-max normalised scores (recipe mode), in [0, 1].")
    title: float = Field(description="Weight of the query title's (first line) vector beside the mixture.")
    same: dict[str, float] = Field(description="Metadata field → bonus for sharing the query document's value.")
    prior: dict[str, float] = Field(description="Relation → weight of its answer prior "
                                    "(retrieval/prior.py: how often a document answered it in training).")
    neighbours: float = Field(description="Bonus for a document the model's training graph links to the query "
                                          "(retrieval/graph.py).")
    prominence: float = Field(0.0, description="Weight of a document's prominence in the index's own texts, in [0, 1] "
                                               "(indexer/mining.py: how many other texts name it, how much text it has).")
    depth: int = Field(description="Candidates taken from each list: the pool the fusion re-orders.")


RESULTS = "The hits, best first: rank, id, score, text, metadata and, as asked, explain and highlights."
FACETS = "With facets: {field: [[value, count], ...]} over the first facet_depth hits."


class SearchAnswer(BaseModel):
    index: str
    generation: str = Field(description="The index generation that answered.")
    results: list[dict[str, Any]] = Field(description=RESULTS)
    warnings: list[str] = Field(description="Filter operators that can never match, parts of a relation that cannot "
                                            "apply to this query: each once.")
    facets: dict[str, list[list[Any]]] | None = Field(None, description=FACETS)
    mode: Mode = Field(description=MODE)
    recipe: RecipeParts = Field(description="The combined recipe the query ran (projection: its relations).")


class BatchEntry(BaseModel):
    """One query's answer: its hits and plan, or the error of that query alone."""

    results: list[dict[str, Any]] | None = Field(None, description=RESULTS)
    facets: dict[str, list[list[Any]]] | None = Field(None, description=FACETS)
    mode: Mode | None = Field(None, description=MODE)
    recipe: RecipeParts | None = None
    error: dict[str, Any] | None = Field(None, description='{"field": "queries[i].FIELD", "message": ...}')


class BatchSearchAnswer(BaseModel):
    index: str
    generation: str
    batch: list[BatchEntry] = Field(description="One entry per query, in order.")
    warnings: list[str]
