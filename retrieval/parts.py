"""A recipe's additive parts (retrieval/recipe.py): components behind one interface, in one table.

Beside its dense mixture, BM25 share and title, a recipe adds ``w · value(d)`` to each pooled
candidate d for every part it weighs. Each part is a :class:`Part` registered in :data:`PARTS`,
which declares in one place:

- its ``name``: the :class:`~.recipe.Recipe` field, the bundle's JSON key and the ``--explain``
  label (``recipe:NAME``, or ``recipe:NAME:KEY`` for a keyed part);
- whether it is ``keyed`` (one weight per key: a metadata field, an operator) or single;
- its dev ``grid`` (the weights :func:`~.recipe.choose` tries), how it is described, what a bundle
  must hold for it (:meth:`Part.check`), what a query is warned of (:meth:`Part.warnings`);
- how it computes its values for a query's pooled positions at query time (:meth:`Part.scorer`),
  from a :class:`Batch`: what a batch of queries reads, each thing built once and only when a part
  with a non-zero weight asks for it.

The generic code loops over the table: a recipe's validation, JSON form and description, a
mixture's averaging (retrieval/plan.py), the dev search and whole-table scores (recipe.py
``choose``, ``score_matrix``: a part's dev table is ``tables[name]``, ``{key: array}`` for a keyed
part, one array for a single one; (n, m) per query or (m,) per candidate) and the index's ranking
(retrieval/recipe_search.py). Adding a part is one Recipe field plus one Part class registered in
PARTS plus the code computing its values (its :meth:`Part.scorer`, and its dev table in
retrieval/recipe_fit.py ``tables``).
"""
from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

from ..indexer import mining
from . import prior as answer_prior

Scorer = Callable[[int, set, dict], dict]  # (query row, its pool, position → document) → position → w · value


class Batch:
    """What a batch of queries gives the parts: the ``searcher``, the ``queries``, each one's own
    position (``own``, -1 for a text query) and, read on first use, their texts and metadata."""

    def __init__(self, searcher, queries: list, own, texts: list[str] | None = None):
        self.searcher, self.queries, self.own, self._texts = searcher, queries, own, texts
        self._keys: tuple[int, dict[int, str]] = (-1, {})

    @cached_property
    def texts(self) -> list[str]:
        """Each query's text (the query document's for an ``--id`` query)."""
        return self._texts if self._texts is not None else self.searcher.query_texts(self.queries)

    @cached_property
    def sources(self) -> list[list[int]]:
        """Per query, the positions of the documents it is about: the query document's, or every liked
        document's ([] for a text query)."""
        liked = self.searcher.files.docstore.positions([e.doc_id for q in self.queries for e in q.like if e.doc_id])
        return [[int(p)] if p >= 0 else [liked[e.doc_id] for e in q.like if e.doc_id in liked]
                for q, p in zip(self.queries, self.own)]

    @cached_property
    def metadata(self) -> list[dict[str, list]]:
        """Per query, field → the values a hit may share for a bonus: its :attr:`sources`' ({} for a
        text query)."""
        found = self.searcher.files.docstore.get(sorted({p for row in self.sources for p in row}))
        out = []
        for row in self.sources:
            values: dict[str, list] = {}
            for p in row:
                for f, v in found[p]["metadata"].items():
                    if v is not None:
                        values.setdefault(f, []).append(v)
            out.append(values)
        return out

    def text_keys(self, i: int, pool: set[int], docs: dict[int, dict]) -> dict[int, str]:
        """Position → the key (retrieval/prior.py) of each pooled text of query ``i``, hashed once
        per query for every part that matches texts."""
        if self._keys[0] != i:
            self._keys = (i, {p: answer_prior.key(docs[p]["text"]) for p in pool})
        return self._keys[1]


class Part:
    """One additive part of a recipe (module docstring). ``what``: its weights in a bounds error;
    ``noun``: what it adds, in a refusal; ``help``: what its weights mean (the HTTP schema); ``around``: :func:`~.recipe.choose` tries it before the
    other parts and once more after them, offered whatever its table holds (the others: once,
    when their table has a non-zero value); ``reads_documents``: its scorer reads pooled documents."""

    name: str
    keyed: bool = False
    grid: tuple[float, ...] = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5)
    what: str
    noun: str
    help: str
    around: bool = False
    reads_documents: bool = False

    def weights(self, recipe) -> dict:
        """Key → weight in ``recipe`` (the single key None for a single part)."""
        value = getattr(recipe, self.name)
        return value if self.keyed else {None: value}

    def tables(self, table) -> dict:
        """Key → this part's dev table (retrieval/recipe.py ``score_matrix``; None: it has none)."""
        return (table or {}) if self.keyed else {None: table}

    def describe(self, key, weight: float) -> str:
        return f"{weight:g}·{self.name}" if key is None else f"{weight:g}·{self.name}({key})"

    def check(self, key, weight: float, operators: dict, graph) -> str | None:
        """Why a bundle of ``operators`` and training ``graph`` cannot run this weight (None: it can)."""
        return None

    def warnings(self, weights: dict, owners: str, metadata_fields, text_query: bool) -> list[str]:
        """Why the non-zero ``weights`` (of relations ``owners``) change nothing for this query."""
        return []

    def scorer(self, batch: Batch, key, weight: float) -> Scorer | None:
        """A function of (query row, its pool, position → document) that gives each pooled position
        ``weight`` · this part's value where the value is not 0 (the weight applied in the same pass);
        None when the part cannot apply to this index (it then adds nothing and has no label)."""
        raise NotImplementedError


class Same(Part):
    """A bonus per metadata field a hit shares with the query document (an ``--id`` query's)."""

    name, keyed, grid, around, reads_documents = "same", True, (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0), True, True
    what, noun = "same bonuses", "metadata bonuses"
    help = "Metadata field → bonus for sharing the query document's value."

    def describe(self, key, weight: float) -> str:
        return f"{weight:g}·same {key}"

    def warnings(self, weights: dict, owners: str, metadata_fields, text_query: bool) -> list[str]:
        return _sharing_warnings(weights, owners, metadata_fields, text_query)

    def scorer(self, batch: Batch, key, weight: float) -> Scorer | None:
        if key not in batch.searcher.metadata_fields:
            return None
        metadata = batch.metadata

        def score(i, pool, docs):
            values = metadata[i].get(key, [])  # the query document's value, or any liked document's
            return {p: weight for p in pool if docs[p]["metadata"].get(key) in values}
        return score


class Prior(Part):
    """An operator's answer prior (retrieval/prior.py): how often a text answered it in training."""

    name, keyed, reads_documents = "prior", True, True
    what, noun = "prior weights", "answer priors"
    help = "Relation → weight of its answer prior (retrieval/prior.py: how often a document answered it in training)."

    def check(self, key, weight: float, operators: dict, graph) -> str | None:
        if key not in operators or answer_prior.weights_of(operators[key]) is None:
            return f"prior names {key[:60]!r}, which is not an operator of this bundle with an answer_prior"
        return None

    def scorer(self, batch: Batch, key, weight: float) -> Scorer | None:
        table = answer_prior.weights_of(batch.searcher.operators[key])

        def score(i, pool, docs):
            keys = batch.text_keys(i, pool, docs)
            return {p: v for p in pool if (v := self.value(weight, table.get(keys[p], 0.0)))}
        return score

    @staticmethod
    def value(weight: float, prior: float) -> float:
        """What the part adds for a text of that ``prior`` (0: never an answer)."""
        return weight * prior


class Unanswered(Prior):
    """A bonus for a candidate that training never gave as an answer of an operator's relation
    (retrieval/prior.py): where most entities have one answer at most (a birthplace, a hypernym), the
    one still without is the likelier new answer. Reads the operator's complete answer table."""

    name, grid = "unanswered", (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0)
    what, noun = "unanswered bonuses", "unanswered bonuses"
    help = "Relation → bonus for a document that training never gave as an answer of it (retrieval/prior.py)."

    def check(self, key, weight: float, operators: dict, graph) -> str | None:
        if key not in operators or not answer_prior.complete(operators[key]):
            return f"unanswered names {key[:60]!r}, which is not an operator of this bundle with every answer stored"
        return None

    @staticmethod
    def value(weight: float, prior: float) -> float:
        return 0.0 if prior else weight


class Neighbours(Part):
    """A bonus for a candidate the bundle's training graph links to the query (retrieval/graph.py)."""

    name, reads_documents = "neighbours", True
    what, noun = "the neighbours bonus", "neighbours bonus"
    help = "Bonus for a document the model's training graph links to the query (retrieval/graph.py)."

    def check(self, key, weight: float, operators: dict, graph) -> str | None:
        return "a neighbours bonus, but the bundle stores no graph" if weight and graph is None else None

    def scorer(self, batch: Batch, key, weight: float) -> Scorer | None:
        linked = [batch.searcher.graph.neighbours(t) for t in batch.texts]  # the text keys linked to each query

        def score(i, pool, docs):
            keys = batch.text_keys(i, pool, docs)
            return {p: weight for p in pool if keys[p] in linked[i]}
        return score


class Prominence(Part):
    """How much the corpus itself says of a candidate (indexer/mining.py, in [0, 1]) times how much it
    says of the query document: a major's peers are lifted by their own prominence, a small firm's
    list is not filled with majors. An ``--id`` query's (the liked documents' mean for a query by
    examples); a text query has no document to weigh it by."""

    name, grid = "prominence", (0.0, 0.1, 0.2, 0.5, 1.0, 1.5, 2.0, 3.0)
    what, noun = "the prominence weight", "prominence"
    help = ("Weight of a document's prominence in the index's own texts times the query document's, each in [0, 1] "
            "(indexer/mining.py: how many other texts name it, how much text it has).")

    def warnings(self, weights: dict, owners: str, metadata_fields, text_query: bool) -> list[str]:
        unnamed = _without_names(self, owners, metadata_fields)
        return unnamed or ([f"{owners}: the recipe's prominence, weighed by the query document's, does not apply "
                            "to a text query (query by --id / id to use it)"] if text_query else [])

    def scorer(self, batch: Batch, key, weight: float) -> Scorer | None:
        found = mining.prominence(batch.searcher.files)  # position → prominence, mined with the generation
        if found is None:
            return None
        own = [weight * sum(found.get(p, 0.0) for p in row) / len(row) if row else 0.0 for row in batch.sources]
        return lambda i, pool, docs: {p: own[i] * found[p] for p in pool if own[i] and p in found}


class Mentions(Part):
    """A bonus for a candidate that the query document's texts name, or whose texts name it, times
    how strongly (indexer/mining.py ``Mined.mentioned``: 1, or less for a smaller firm that names the
    query's; names as the corpus's name field gives them), when it also shares the query document's
    value of the key's metadata field: a rival named on a company's own pages in its industry, not the
    supplier, lender or shareholder of another that its pages name as often. An ``--id`` query's; a
    text query has no document to be named by."""

    name, keyed, grid, reads_documents = "mentions", True, (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0), True
    what, noun = "mentions bonuses", "mentions bonuses"
    help = ("Metadata field → bonus for a document that the query document's texts name, or whose texts name it, "
            "when the two share that field's value (indexer/mining.py).")

    def describe(self, key, weight: float) -> str:
        return f"{weight:g}·mentions within {key}"

    def warnings(self, weights: dict, owners: str, metadata_fields, text_query: bool) -> list[str]:
        # the same words as Same's for a field the index lacks: the plan says each once
        return _without_names(self, owners, metadata_fields) + _sharing_warnings(weights, owners, metadata_fields,
                                                                                 text_query)

    def scorer(self, batch: Batch, key, weight: float) -> Scorer | None:
        s = batch.searcher  # who names whom, mined with prominence; None: no names
        found = mining.of_generation(s.files)
        if found is None or key not in s.metadata_fields:
            return None
        metadata = batch.metadata

        def score(i, pool, docs):
            values, linked = metadata[i].get(key, []), found.mentioned(int(batch.own[i]))
            return {p: weight * linked[p] for p in pool & linked.keys() if docs[p]["metadata"].get(key) in values}
        return score


def _sharing_warnings(weights: dict, owners: str, metadata_fields, text_query: bool) -> list[str]:
    """A bonus keyed by a metadata field the query document must share changes nothing where the
    index lacks the field, or for a text query (no document)."""
    missing = [f for f in weights if f not in metadata_fields]
    out = [f"{owners}: the recipe's bonuses for sharing {', '.join(missing)} do not apply: this index has no such "
           "metadata field"] if missing else []
    if text_query and len(missing) < len(weights):
        out.append(f"{owners}: the recipe's bonuses for sharing {', '.join(f for f in weights if f not in missing)} "
                   "with the query document do not apply to a text query (query by --id / id to use them)")
    return out


def _without_names(part: Part, owners: str, metadata_fields) -> list[str]:
    """A part mined from the documents' names (indexer/mining.py) changes nothing without a name field."""
    if mining.name_field(metadata_fields) is not None:
        return []
    return [f"{owners}: the recipe's {part.name} does not apply: this index has no name field "
            f"({', '.join(mining.NAME_FIELDS)}) to find its documents' names in the texts"]


PARTS: dict[str, Part] = {part.name: part for part in (Same(), Prior(), Unanswered(), Neighbours(), Prominence(),
                                                        Mentions())}


def scorers(recipe, batch: Batch) -> tuple[list[tuple[str, Scorer]], bool]:
    """(label, scorer) of each non-zero weight of ``recipe`` that applies to ``batch``'s index, in
    the table's order, and whether any of them reads the pooled documents."""
    out, read = [], False
    for part in PARTS.values():
        for key, weight in part.weights(recipe).items():
            score = part.scorer(batch, key, weight) if weight else None
            if score is not None:
                out.append((f"recipe:{part.name}" + ("" if key is None else f":{key}"), score))
                read = read or part.reads_documents
    return out, read

