"""One request, one meaning: how a relation mixture, ``hybrid`` and a bundle's recipes rank.

Every caller (``relsearch query``, the Python API and through it the server and the page,
``lookup``, ``bench``) resolves each query's relation mixture once, here, into a
:class:`Scoring`; the search then executes that scoring and nothing re-decides it
(docs/how-a-query-runs.md).

What a mixture means (design.md §3, "one meaning everywhere"):

- a relation R ranks by its recipe (retrieval/recipe.py), or by its operator alone when its
  bundle entry stores none: ``Recipe(mixture={R: 1})``;
- a mixture ``{R: w_R}`` ranks by the weighted recipe of its relations:
  ``mixture = Σ w_R · mixture_R`` (one dense query vector), ``title = Σ w_R · title_R``,
  ``bm25 = Σ w_R · bm25_R / Σ w_R``, ``same_f = Σ w_R · same_R,f / Σ w_R`` and the answer priors
  ``prior_P = Σ w_R · prior_R,P / Σ w_R``, the unanswered, neighbours and prominence weights likewise,
  ``depth = max depth_R``. Relations without recipes reduce it to the plain vector mixture;
- ``hybrid="weighted"`` with weight W gives BM25 the share 1 − W of a mixture that has none;
  ``hybrid="rrf"`` fuses the dense list with BM25 by ranks. Either is refused, with the reason,
  when a named relation's recipe already fuses BM25 (it would fuse twice), and rrf also when the
  recipe adds metadata bonuses, answer priors, a neighbours bonus or prominence (rank fusion has no score to
  add them to).

Three modes, each with its own documented score scale (``--min-score`` compares against it):

- ``dense``: ⟨q, t̂⟩, the weighted sum of the operators' cosines, for every hit;
- ``recipe``: (1 − b)·minmax(dense) + b·minmax(BM25) + bonuses over the pool (each list's top
  ``depth``), in [0, 1 + Σ bonuses]; past the pool, −1 + (1 − b)·min(0, normalised dense);
- ``rrf``: Σ 1 / (60 + rank) over the two top-``depth`` lists; past the pool, 0.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..encoder.relations import lookup
from .parts import PARTS
from .recipe import Recipe, recipe_of


class PlanError(ValueError):
    """A relation mixture that cannot run as asked (a combination refused with its reason)."""


@dataclass(frozen=True)
class Scoring:
    """How one relation mixture ranks: ``mode`` (``dense`` | ``recipe`` | ``rrf`` |
    ``projection``), the combined :class:`~.recipe.Recipe` (its ``mixture`` is the dense query
    vector's operator weights), and ``warnings``: what the user named that cannot contribute."""

    mode: str
    recipe: Recipe
    warnings: tuple[str, ...] = ()

    @property
    def scale(self) -> str:
        """The score scale of this mode, in words (for --explain and the docs)."""
        return SCALES[self.mode]


SCALES = {"dense": "weighted sum of cosines",
          "projection": "cosine in the projected space",
          "recipe": "recipe score: [0, 1 + bonuses] within its candidate pool, below 0 past it",
          "rrf": "reciprocal rank fusion: sum of 1/(60 + rank)"}


def relation_recipe(operators: dict, name: str) -> Recipe:
    """What ``--relation NAME`` runs: its stored recipe, or its operator alone."""
    return recipe_of(lookup(operators, name)) or Recipe(mixture={name: 1.0})


def resolve(operators: dict, relations: dict[str, float], *, hybrid: str | None = None,
            relational_share: float | None = None, metadata_fields=(), text_query: bool = False) -> Scoring:
    """The :class:`Scoring` of one relation mixture (module docstring); :class:`PlanError` for a
    refused combination, KeyError naming the valid relations for an unknown one. ``relational_share``:
    with ``hybrid="weighted"``, the relational list's share (None: 0.5). ``text_query``:
    the queries carry no metadata (recipe bonuses then cannot apply: a warning says so)."""
    ops = {name: lookup(operators, name) for name in relations}
    warnings = [f"relation {name!r} has weight 0 in the mixture: it contributes nothing"
                for name, w in relations.items() if w == 0]
    projections = [name for name, op in ops.items() if op.both_sides]
    if projections:  # a projection is its own index: Searcher.projection_of refuses mixing it
        name = projections[0]
        if recipe_of(ops[name]) is not None and not recipe_of(ops[name]).alone(name):
            warnings.append(f"{name} is a projection, searched in its own projected index: its recipe does not apply")
        if hybrid:
            raise PlanError(f"{name} is a projection, searched in its own projected index: hybrid does not apply")
        return Scoring("projection", Recipe(mixture=dict(relations)), tuple(warnings))
    recipes = {name: relation_recipe(operators, name) for name in relations}
    fused = {name: r for name, r in recipes.items() if r.reorders}
    if fused and any(w < 0 for w in relations.values()):
        raise PlanError(f"{', '.join(fused)}: a relation with a recipe mixes only with positive weights "
                        "(its BM25 share and bonuses are weighted averages)")
    try:
        combined = combine(recipes, relations)
    except ValueError as e:  # weights that cancel every operator out
        raise PlanError(f"relations {', '.join(relations)}: the weighted mixture has no non-zero operator ({e})") from None
    if hybrid is not None and combined.bm25:
        names = ", ".join(f"{n} (BM25 share {r.bm25:g})" for n, r in fused.items() if r.bm25)
        raise PlanError(f"hybrid: {names} already fuse BM25 with the dense search; hybrid would fuse it twice. "
                        "Drop hybrid, or name a relation without a BM25 share (e.g. identity)")
    if hybrid == "rrf" and combined.adds:
        *others, last = [part.noun for part in PARTS.values()]
        raise PlanError(f"hybrid rrf fuses ranks and cannot add the {', '.join(others)} or {last} of "
                        f"{', '.join(n for n, r in fused.items() if r.adds)}'s recipe; use hybrid weighted")
    if hybrid == "weighted":
        combined = replace(combined, bm25=1.0 - (0.5 if relational_share is None else relational_share))
    for part in PARTS.values():  # what a part cannot apply to here (a field the index lacks, a text query)
        weights = {key: w for key, w in part.weights(combined).items() if w}
        if weights:
            owners = ", ".join(n for n, r in fused.items() if any(part.weights(r).values()))
            warnings += part.warnings(weights, owners, metadata_fields, text_query)
    warnings = list(dict.fromkeys(warnings))  # two parts keyed by a field the index lacks: one line
    if hybrid == "rrf":
        return Scoring("rrf", combined, tuple(warnings))
    return Scoring("recipe" if combined.reorders else "dense", combined, tuple(warnings))


def combine(recipes: dict[str, Recipe], weights: dict[str, float]) -> Recipe:
    """The weighted recipe of a mixture (module docstring); ``recipes``: each relation's (of one class)."""
    mixture: dict[str, float] = {}
    for name, recipe in recipes.items():
        for op, w in recipe.mixture.items():
            mixture[op] = mixture.get(op, 0.0) + weights[name] * w
    total = sum(weights.values())

    def averaged(part):  # a part's weight (a keyed part's, key by key), weight-averaged over the relations
        if not part.keyed:
            return sum(weights[n] * getattr(r, part.name) for n, r in recipes.items()) / total if total > 0 else 0.0
        out: dict[str, float] = {}
        for name, recipe in recipes.items():
            for key, w in getattr(recipe, part.name).items():
                if w:
                    out[key] = out.get(key, 0.0) + weights[name] * w / total
        return out

    mixture = {op: w for op, w in mixture.items() if w} or mixture
    kind = type(next(iter(recipes.values())))  # Recipe (a test registers a part with a subclass of it)
    return kind(mixture=mixture, **{part.name: averaged(part) for part in PARTS.values()},
                depth=max(r.depth for r in recipes.values()),
                bm25=sum(weights[n] * r.bm25 for n, r in recipes.items()) / total if total > 0 else 0.0,
                title=sum(weights[n] * r.title for n, r in recipes.items()))
