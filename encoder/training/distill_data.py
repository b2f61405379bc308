"""The data of sentence ensemble distillation: corpus sentences, STS pairs and their Spearman score.

:func:`read_sentences` takes the sentences of any corpus JSONL (``text_field``, else both sides of
pairs or triples); :func:`read_sts` reads STS pairs ``{"a", "b", "score"}`` (dev early stopping
and test metrics of :mod:`.distill`, and the data of :mod:`.sts_teacher`); :func:`sts_spearman`
is the metric.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .data import iter_jsonl


def read_sentences(files, *, text_field: str = "text") -> list[str]:
    """Distinct sentences of corpus files, in first-seen order (see the module docstring for the fields)."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    out: dict[str, None] = {}
    for f in files:
        n = 0
        for where, rec in iter_jsonl(f, "corpus"):
            if text_field in rec:
                fields = (text_field,)
            elif "a" in rec and "b" in rec:
                fields = ("a", "b")
            elif "head" in rec and "tail" in rec:
                fields = ("head", "tail")
            else:
                raise ValueError(f"{where}: no sentence field: need {text_field!r} (set --text-field), "
                                 f"or 'a' and 'b' (pairs), or 'head' and 'tail' (triples)")
            for k in fields:
                if not isinstance(rec[k], str) or not rec[k].strip():
                    raise ValueError(f"{where}: field {k!r} must be a non-empty string")
                out.setdefault(rec[k], None)
            n += 1
        if n == 0:
            raise ValueError(f"{f}: no sentences (empty file)")
    return list(out)


@dataclass(frozen=True)
class STSPairs:
    a: list[str]
    b: list[str]
    score: np.ndarray
    files: list[str]

    def __len__(self):
        return len(self.a)


def is_sts_file(path) -> bool:
    """True when the first record of ``path`` has ``a``, ``b`` and ``score``."""
    for _, rec in iter_jsonl(path, "STS pairs"):
        return all(k in rec for k in ("a", "b", "score"))
    return False


def read_sts(files) -> STSPairs:
    """STS pairs ``{"a", "b", "score"}`` (score any number, e.g. 0–5); every problem names file:line."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    a, b, s = [], [], []
    for f in files:
        n = 0
        for where, rec in iter_jsonl(f, "STS pairs"):
            missing = [k for k in ("a", "b", "score") if k not in rec]
            if missing:
                raise ValueError(f"{where}: missing field(s) {', '.join(missing)} "
                                 "(an STS pairs file needs a, b, score)")
            for k in ("a", "b"):
                if not isinstance(rec[k], str) or not rec[k].strip():
                    raise ValueError(f"{where}: field {k!r} must be a non-empty string")
            if isinstance(rec["score"], bool) or not isinstance(rec["score"], (int, float)):
                raise ValueError(f"{where}: field 'score' must be a number")
            a.append(rec["a"])
            b.append(rec["b"])
            s.append(float(rec["score"]))
            n += 1
        if n == 0:
            raise ValueError(f"{f}: no pairs (empty file)")
    return STSPairs(a, b, np.array(s, dtype=np.float64), [str(f) for f in files])


def sts_spearman(vectors_a: np.ndarray, vectors_b: np.ndarray, score: np.ndarray) -> float:
    """Spearman correlation of cos(a, b) with the gold scores."""
    from scipy.stats import spearmanr

    na = vectors_a / np.maximum(np.linalg.norm(vectors_a, axis=1, keepdims=True), 1e-12)
    nb = vectors_b / np.maximum(np.linalg.norm(vectors_b, axis=1, keepdims=True), 1e-12)
    return float(spearmanr((na * nb).sum(1), score).statistic)
