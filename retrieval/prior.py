"""A relation's answer prior: how often each text answered the relation in training.

In a knowledge graph some answers recur: ``occupation`` is answered by "actor" hundreds of times
and by "falconer" once; ``country of citizenship`` mostly by a dozen countries. A query operator
moves the query toward the right *kind* of answer but cannot add a per-document bias to document
vectors it does not change. The prior is that bias, learned by counting the training triples:

    prior_R(d) = log(1 + n_R(d)) / log(1 + max_e n_R(e))      in [0, 1]

``n_R(d)``: training triples (·, R, d); for ``R^-1`` (head prediction), triples (d, R, ·). A
recipe adds ``w · prior_R(d)`` to each pooled candidate's score (retrieval/recipe.py), ``w``
chosen on dev like its other weights (0 when dev shows no gain; the table is then not stored).

The same table says which texts training never gave as answers: the recipe's ``unanswered`` part
(retrieval/parts.py) adds ``w · [n_R(d) = 0]``. Where most entities have one answer at most (a
birthplace, a citizenship, a hypernym), the candidate still without one is the likelier new answer:
on CoDEx-M, 68 % of the test triples' heads of ``country of citizenship`` had none in training.

Stored in the operator's bundle entry as ``info["answer_prior"] = {"key": KEY, "weights": {h: w},
"complete": bool}``: each text by :func:`key` (a 16-hex SHA-1 prefix of its UTF-8 bytes: short, and
a collision between two of a million texts has odds about 10⁻⁸), weights rounded to 4 decimals, the
most frequent answers first. A fitted relation keeps the :data:`MAX_ENTRIES` most frequent (a rarer
answer's weight is small) unless its recipe weighs ``unanswered``, which needs every answer: then
all of them (``complete``; the part is offered only then), when they are at most :data:`MAX_ANSWERS`
and fit the :data:`MAX_BUNDLE_ANSWERS` the bundle's complete tables may hold in all. A document
matches by its stored text, so an index of the same texts the triples name (a knowledge graph's
entity file) gets the prior.
"""
from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable

import numpy as np

KEY = "sha1-16"
MAX_ENTRIES = 5000  # answers a prior alone keeps
MAX_ANSWERS = 50_000  # answers a table holds for the unanswered part (1.8 MB of bundle.json)
MAX_BUNDLE_ANSWERS = 150_000  # answers a bundle's complete tables hold in all: bundle.json is read whole (16 MiB)


def key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def table(answers: Iterable[str], room: int = MAX_ANSWERS) -> dict:
    """The stored prior of a relation from its training answers (one text per triple, repeats
    counted): the ``answer_prior`` entry, ``complete`` with every answer when they are at most
    ``room`` and MAX_ANSWERS, else the MAX_ENTRIES most frequent; empty weights when there are none."""
    counts = Counter(answers)
    complete = len(counts) <= min(room, MAX_ANSWERS)
    kept = counts.most_common(None if complete else MAX_ENTRIES)
    top = math.log1p(kept[0][1]) if kept else 1.0
    return {"key": KEY, "weights": {key(text): round(math.log1p(n) / top, 4) for text, n in kept},
            "complete": complete}


def trimmed(entry: dict) -> dict:
    """``entry`` (:func:`table`) cut to its MAX_ENTRIES most frequent answers: what a prior alone needs."""
    if len(entry["weights"]) <= MAX_ENTRIES:
        return entry
    return {**entry, "weights": dict(list(entry["weights"].items())[:MAX_ENTRIES]), "complete": False}


def complete(operator) -> bool:
    """Whether the operator's table holds every answer training gave (what ``unanswered`` reads)."""
    entry = operator.info.get("answer_prior")
    return isinstance(entry, dict) and entry.get("complete") is True


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


def unanswered(operator, texts: list[str]) -> np.ndarray | None:
    """(len(texts),) float32: 1 for a text training never gave as the operator's answer; None when
    its table is not :func:`complete`."""
    return (scores(operator, texts) == 0).astype(np.float32) if complete(operator) else None
