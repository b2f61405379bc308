"""A relation's answer prior: how often each text answered the relation in training.

In a knowledge graph some answers recur: ``occupation`` is answered by "actor" hundreds of times
and by "falconer" once; ``country of citizenship`` mostly by a dozen countries. A query operator
moves the query toward the right *kind* of answer but cannot add a per-document bias to document
vectors it does not change. The prior is that bias, learned by counting the training triples:

    prior_R(d) = log(1 + n_R(d)) / log(1 + max_e n_R(e))      in [0, 1]

``n_R(d)``: training triples (·, R, d); for ``R^-1`` (head prediction), triples (d, R, ·). A
recipe adds ``w · prior_R(d)`` to each pooled candidate's score (retrieval/recipe.py), ``w``
chosen on dev like its other weights (0 when dev shows no gain; the table is then not stored).

Stored in the operator's bundle entry as ``info["answer_prior"] = {"key": KEY, "weights": {h: w}}``:
each text by :func:`key` (a 16-hex SHA-1 prefix of its UTF-8 bytes: short, and a collision between
two of a million texts has odds about 10⁻⁸), the :data:`MAX_ENTRIES` most frequent answers (a rarer
answer's weight is small), weights rounded to 4 decimals. A document matches by its stored text,
so an index of the same texts the triples name (a knowledge graph's entity file) gets the prior.
"""
from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable

import numpy as np

KEY = "sha1-16"
MAX_ENTRIES = 5000


def key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def table(answers: Iterable[str]) -> dict:
    """The stored prior of a relation from its training answers (one text per triple, repeats
    counted): the ``answer_prior`` entry; empty weights when there are no answers."""
    counts = Counter(answers).most_common(MAX_ENTRIES)
    top = math.log1p(counts[0][1]) if counts else 1.0
    return {"key": KEY, "weights": {key(text): round(math.log1p(n) / top, 4) for text, n in counts}}


def weights_of(operator) -> dict[str, float] | None:
    """The operator's prior weights (text key → weight), or None when it has none; ValueError naming
    the relation when the stored entry is malformed (checked when a bundle is opened for search)."""
    entry = operator.info.get("answer_prior")
    if entry is None:
        return None
    if not (isinstance(entry, dict) and entry.get("key") == KEY and isinstance(entry.get("weights"), dict)
            and all(isinstance(w, (int, float)) and not isinstance(w, bool) and 0.0 <= w <= 1.0
                    for w in entry["weights"].values())):
        raise ValueError(f"relation {operator.name!r}: malformed answer_prior (expected {{'key': {KEY!r}, "
                         "'weights': {text key: weight in [0, 1]}})")
    return entry["weights"]


def scores(operator, texts: list[str]) -> np.ndarray:
    """(len(texts),) float32 prior of each text under ``operator`` (0 for a text never its answer)."""
    weights = weights_of(operator) or {}
    return np.asarray([weights.get(key(t), 0.0) for t in texts], np.float32)
