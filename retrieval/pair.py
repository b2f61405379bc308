"""What ``relsearch score TEXT_A TEXT_B`` prints: every relation of a bundle scored for a pair of texts,
as ``query --relation R`` would score them without an index (no BM25 list, no metadata)."""
from __future__ import annotations

import numpy as np

from ..encoder.bundle import Bundle
from ..encoder.model import Encoder
from ..encoder.relations import mixture_query


class PairScores(dict):
    """``relsearch score``'s answer: relation → score, with ``warnings`` (one per relation whose
    recipe has parts a pair of texts cannot give: its BM25 share and metadata bonuses)."""

    def __init__(self, scores: dict[str, float], warnings: list[str]):
        super().__init__(scores)
        self.warnings = warnings


def score_pair(bundle: Bundle, encoder: Encoder, text_a: str, text_b: str) -> PairScores:
    """For every relation R of the bundle, what ``--relation R`` runs scored for the pair a → b:
    ⟨q_R(a), t̂_b⟩ with q_R the dense query vector of R's recipe (its operator mixture plus its
    title share; the operator alone without a recipe, retrieval/plan.py) — a query's score in the
    ``dense`` mode, the ``dense`` explain value in the ``recipe`` mode, whose BM25 share and
    bonuses rank an index's candidates (a warning names them). Query encoders (kind ``encoder``)
    read text_a through their tower on ``encoder``."""
    from .plan import relation_recipe
    from .recipe import title_vectors

    if any(op.needs_text for op in bundle.operators.values()):
        from ..encoder.tower import attach_towers

        attach_towers(bundle.operators, encoder)
    h = encoder.encode([text_a, text_b]).vectors
    t = h[1] / max(np.linalg.norm(h[1]), 1e-12)
    scores, warnings = {}, []
    for name in sorted(bundle.operators):
        recipe = relation_recipe(bundle.operators, name)
        q = mixture_query(bundle.operators, h[:1], recipe.mixture, [text_a])
        if recipe.title:
            q = q + recipe.title * title_vectors(lambda texts: encoder.encode(texts).vectors, [text_a], h[:1])
        scores[name] = float(q[0] @ t)
        if recipe.bm25 or recipe.adds:
            warnings.append(f"{name}: the score is its recipe's dense part ({recipe.describe()}); its BM25 share, "
                            "bonuses and priors rank an index's candidates: `relsearch query --explain` shows the "
                            "whole score")
    return PairScores(scores, warnings)
