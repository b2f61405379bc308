"""Where a relation loses: its own test and its transfer figure against identity, BM25 and the hybrid.

A relation's bundle entry may carry two whole-corpus measurements of what ``--relation NAME``
runs: ``whole_corpus.test`` (its own test split, tools/build_pack.py → retrieval/recipe_fit.py)
and ``transfer`` (a second dataset of its kind that its recipe never saw: ``relsearch bench
transfer``, bench/transfer.py). Each compares the relation with identity (plain cosine), BM25 and
their RRF hybrid (``--hybrid``). A relation that scores below any of them on either says so
wherever it is listed — ``relsearch relations``, GET /relations (the explorer's relations panel),
the model card — in the words :func:`losses` writes, e.g. "loses to identity on WikiQA test
(MRR 0.634 vs 0.647)". Figures missing or of the wrong type (bundle.py drops those at load) give
no verdict: a user bundle without them is listed as before.
"""
from __future__ import annotations

import math

RIVALS = ("identity", "bm25", "hybrid")
SHOWN = {"identity": "identity", "bm25": "BM25", "hybrid": "the hybrid"}


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _lost(scores: dict, own: str) -> list[tuple[str, float]]:
    """The rivals that score above ``scores[own]``, best first, as (name, score)."""
    if not isinstance(scores, dict) or not _number(scores.get(own)):
        return []
    beaten = [(r, scores[r]) for r in RIVALS if _number(scores.get(r)) and scores[r] > scores[own]]
    return sorted(beaten, key=lambda rs: -rs[1])


def _line(rivals: list[tuple[str, float]], own: float, where: str, metric: str) -> str:
    names = " and ".join(SHOWN[r] for r, _ in rivals)
    against = ", ".join(f"{SHOWN[r].removeprefix('the ')} {s:.3f}" for r, s in rivals)
    return f"loses to {names} on {where} ({metric} {own:.3f} vs {against})"


def own_metric(metrics) -> tuple[str, dict] | None:
    """(metric name, {"trained", "identity", "bm25"?, "hybrid"?: score}) of an operator's test
    ``metrics`` (its main ``metric``), or None when it does not say."""
    if not isinstance(metrics, dict) or not isinstance(metrics.get("metric"), str):
        return None
    name = metrics["metric"]
    scores = {k: metrics[k].get(name) for k in ("trained", *RIVALS) if isinstance(metrics.get(k), dict)}
    return (name, scores) if _number(scores.get("trained")) else None


def losses(info: dict) -> list[str]:
    """One line per measurement where the relation scores below identity, BM25 or the hybrid:
    its own test (``whole_corpus.test``, the recipe's whole-corpus MRR; without one, the main
    metric of the operator's test ``metrics``) and its transfer set (``transfer``); first, when
    ``relsearch train`` shipped it as identity because its recipe lost there
    (``whole_corpus.fallback``), that. Empty when it wins both or the bundle does not say."""
    out = []
    corpus = info.get("whole_corpus")
    fallback = corpus.get("fallback") if isinstance(corpus, dict) else None
    if isinstance(fallback, dict) and _number(fallback.get("test")) and _number(fallback.get("identity")):
        out.append(f"ships as identity: its trained recipe ranked below identity on its own test (MRR "
                   f"{fallback['test']:.3f} vs identity {fallback['identity']:.3f})")
    test = corpus.get("test") if isinstance(corpus, dict) else None
    rivals = _lost(test, "recipe") if isinstance(test, dict) else []
    if rivals:
        out.append(_line(rivals, test["recipe"], "its own test", "MRR"))
    elif not isinstance(test, dict):  # no recipe measured (an aspect operator): its own test metric
        own = own_metric(info.get("metrics"))
        rivals = _lost(own[1], "trained") if own else []
        if rivals:
            out.append(_line(rivals, own[1]["trained"], "its own test", own[0]))
    transfer = info.get("transfer")
    rivals = _lost(transfer, "relation") if isinstance(transfer, dict) else []
    if rivals:
        where = transfer.get("dataset") if isinstance(transfer.get("dataset"), str) else "its transfer set"
        metric = transfer.get("metric") if isinstance(transfer.get("metric"), str) else "MRR"
        out.append(_line(rivals, transfer["relation"], where, metric.upper() if metric == "mrr" else metric))
    return out


def describe_transfer(transfer: dict) -> str | None:
    """One line: the relation's transfer figure beside identity, BM25 and the hybrid, or None
    when the entry lacks one of them."""
    if not isinstance(transfer, dict) or not all(_number(transfer.get(k)) for k in ("relation", *RIVALS)):
        return None
    where = transfer.get("dataset") if isinstance(transfer.get("dataset"), str) else "a transfer set"
    metric = transfer.get("metric") if isinstance(transfer.get("metric"), str) else "mrr"
    line = (f"transfer: {where}, {metric.upper() if metric == 'mrr' else metric} {transfer['relation']:.3f} "
            f"(identity {transfer['identity']:.3f}, BM25 {transfer['bm25']:.3f}, hybrid {transfer['hybrid']:.3f})")
    if _number(transfer.get("queries")):
        line += f", {int(transfer['queries'])} queries"
    if _number(transfer.get("candidates")):
        line += f" over {int(transfer['candidates'])} texts"
    return line


def relation_row(name: str, operator) -> dict:
    """How ``relsearch relations`` and GET /relations list an operator: name, kind, description,
    metrics, and when the bundle has them its ``recipe``, ``whole_corpus`` and ``transfer``, with
    ``losses`` (:func:`losses`) when it has something to compare."""
    info = operator.info
    row = {"name": name, "kind": operator.kind, "description": operator.description,
           "metrics": info.get("metrics", {}), **{k: info[k] for k in ("recipe", "whole_corpus", "transfer") if k in info}}
    if "whole_corpus" in info or "transfer" in info or own_metric(info.get("metrics")):
        row["losses"] = losses(info)
    return row
