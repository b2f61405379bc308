"""Aspect data and evaluation (AspectCSE): labelled documents, who is relevant to whom, P@10.

What both regimes of :mod:`.aspect` (the adapter in :mod:`.aspect`, the joint regime in
:mod:`.aspect_joint`) share: reading the train/dev/test documents (:func:`load_splits`), the
relevance of documents to each other (same label in one field, or in any / all of several:
:func:`relevance`), operator names and descriptions, and the same-label retrieval metrics
(:func:`aspect_metrics`, AspectCSE's protocol, k = 10).
"""
from __future__ import annotations

import numpy as np

from ..metrics import aspect_retrieval_metrics
from ..relations import IDENTITY, Operator, normalize
from .card import hyperparameters
from .data import Labelled, read_labelled

K = 10


def operator_name(fields: tuple[str, ...], combine: str) -> str:
    if len(fields) == 1:
        return f"aspect:{fields[0]}"
    return f"aspect:{'any' if combine == 'union' else 'all'}:{','.join(fields)}"


def relevance(docs: list[Labelled], fields: tuple[str, ...], combine: str):
    """``i -> (n,) bool``: documents relevant to document i (sharing a label; all or any of ``fields``)."""
    per_field = []
    for f in fields:
        vocab: dict[str, int] = {}
        rows = [[vocab.setdefault(x, len(vocab)) for x in d.labels[f]] for d in docs]
        onehot = np.zeros((len(docs), len(vocab)), dtype=bool)
        for i, r in enumerate(rows):
            onehot[i, r] = True
        per_field.append(onehot)

    def relevant_to(i: int) -> np.ndarray:
        shares = [(m & m[i]).any(axis=1) for m in per_field]
        return np.logical_and.reduce(shares) if combine == "intersection" else np.logical_or.reduce(shares)

    return relevant_to


def load_splits(train_files, dev_files, test_files, config) -> dict[str, list[Labelled]]:
    """``{"train", "dev", "test"}`` documents: from three file lists, or one corpus by ``config.split_field``."""
    if not config.split_field:
        return {"train": _load(train_files, config), "dev": _load(dev_files, config),
                "test": _load(test_files, config)}
    if dev_files or test_files:
        raise ValueError("give either --split-field (one corpus with train/dev/test rows) or --dev/--test files")
    return {s: _load(train_files, config, s) for s in ("train", "dev", "test")}


def _load(files, config, split: str | None = None) -> list[Labelled]:
    """Documents of ``files`` (only the rows of ``split`` when given), exact duplicate texts dropped."""
    docs, seen = [], set()
    for f in files:
        try:
            found = read_labelled(f, config.aspects, text_field=config.text_field, split=split)[0]
        except ValueError as e:
            if split in (None, "train") or "no record has a text" not in str(e):
                raise
            found = []  # a corpus without dev/test rows: no early stopping / no test metrics
        for d in found:
            if d.text not in seen:  # an exact duplicate would be a trivial positive
                seen.add(d.text)
                docs.append(d)
    return docs


def aspect_metrics(op: Operator, vectors: np.ndarray, docs, fields, combine) -> dict:
    """Same-label retrieval metrics (P@K, R@K, MRR@K, seeds) of ``op`` over raw ``vectors`` of ``docs``."""
    q, d = op.apply(vectors), op.documents(normalize(vectors))
    m = aspect_retrieval_metrics(lambda a, b: q[a:b] @ d.T, relevance(docs, fields, combine), K)
    return {k: (round(v, 5) if isinstance(v, float) else v) for k, v in m.items()}


def describe(fields, combine) -> str:
    joiner = " and " if combine == "intersection" else " or "
    return "documents with the same " + joiner.join(fields)


def operator_info(op, splits, vec, fields, combine, config, training: dict) -> dict:
    """``op.info``: aspects, data sizes, hyperparameters, ``training`` and test metrics vs identity."""
    metrics = {"split": "test", "protocol": f"AspectCSE same-label retrieval on the test documents, k = {K}",
               "metric": f"p@{K}"}
    if len(splits["test"]) >= 2:
        for label, scorer in (("trained", op), ("identity", IDENTITY)):
            m = aspect_metrics(scorer, vec["test"], splits["test"], fields, combine)
            metrics["queries"], metrics["candidates"] = m.pop("seeds"), len(splits["test"])
            m.pop("seeds_without_relevant")
            metrics[label] = m
    return {"aspects": list(fields), "combine": combine, "regime": config.regime,
            "data": {s: {"documents": len(v)} for s, v in splits.items()},
            "hyperparameters": record(config), "training": training, "metrics": metrics}


def record(config) -> dict:
    """The hyperparameter record of an aspect run (learning rate resolved)."""
    return hyperparameters(config, lr=config.learning_rate)
