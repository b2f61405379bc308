"""Link prediction in both directions, as knowledge-graph papers report it, from the operators' own test metrics.

A run with ``--inverse`` trains, beside each relation R, the operator ``R^-1`` on the reversed
triples: R answers tail prediction (h, R, ?) and ``R^-1`` head prediction (?, R, t), the query being
the tail, filtered over the other true heads of (R, t). Each operator's ``info["metrics"]`` already
holds its own test figures (``trained`` and ``identity``, and ``queries``); :func:`both_directions`
combines them into one record with uniform keys: ``mrr_tail``, ``mrr_head`` and ``mrr``, their
mean (likewise ``mr`` and ``hits@1/3/10``). A direction's figure over several relations is the mean
over all its test queries (micro), as ``relsearch bench linkpred`` reports "overall"; only relations
with figures in both directions count. ``relsearch train`` stores it as
``bundle.info["link_prediction"]`` and prints :func:`direction_lines`.
"""
from __future__ import annotations

from ..metrics import METRIC_KEYS
from .data import INVERSE_SUFFIX

SIDES = ("trained", "identity")


def _figures(metrics: dict, side: str) -> dict[str, float] | None:
    values = metrics.get(side)
    if not isinstance(values, dict) or not all(isinstance(values.get(k), (int, float)) for k in METRIC_KEYS):
        return None
    return {k: float(values[k]) for k in METRIC_KEYS}


def _mean_over_queries(parts: list[tuple[int, dict[str, float]]]) -> dict[str, float]:
    n = sum(q for q, _ in parts)
    return {k: sum(q * m[k] for q, m in parts) / n for k in METRIC_KEYS}


def combine(tail: dict[str, float], head: dict[str, float]) -> dict[str, float]:
    """``{"mrr": mean, "mrr_tail", "mrr_head", ...}`` for every metric key, rounded to 5 places."""
    out = {}
    for k in METRIC_KEYS:
        out[k] = round((tail[k] + head[k]) / 2, 5)
        out[f"{k}_tail"], out[f"{k}_head"] = round(tail[k], 5), round(head[k], 5)
    return out


def both_directions(operators: dict) -> dict | None:
    """Tail, head and mean test figures of the relations whose operator and ``^-1`` both have them.

    Returns ``{"split", "relations", "queries": {"tail", "head"}, "trained": {...}, "identity": {...},
    "per_relation": {R: {"queries": {...}, "trained", "identity"}}}`` (``identity`` where every one of
    those relations has it), or None when no relation has figures in both directions.
    """
    pairs = []
    for name, op in sorted(operators.items()):
        inverse = operators.get(name + INVERSE_SUFFIX)
        if name.endswith(INVERSE_SUFFIX) or inverse is None:
            continue
        tail_m, head_m = op.info.get("metrics") or {}, inverse.info.get("metrics") or {}
        if tail_m.get("split", "test") != "test" or head_m.get("split", "test") != "test":
            continue
        if _figures(tail_m, "trained") and _figures(head_m, "trained") and tail_m.get("queries") and head_m.get("queries"):
            pairs.append((name, tail_m, head_m))
    if not pairs:
        return None
    out = {"split": "test", "relations": len(pairs),
           "queries": {"tail": sum(int(t["queries"]) for _, t, _ in pairs),
                       "head": sum(int(h["queries"]) for _, _, h in pairs)},
           "per_relation": {}}
    for side in SIDES:
        tails = [(int(t["queries"]), _figures(t, side)) for _, t, _ in pairs]
        heads = [(int(h["queries"]), _figures(h, side)) for _, _, h in pairs]
        if any(m is None for _, m in tails + heads):
            continue
        out[side] = combine(_mean_over_queries(tails), _mean_over_queries(heads))
        for (name, t, h), (_, tm), (_, hm) in zip(pairs, tails, heads):
            row = out["per_relation"].setdefault(name, {"queries": {"tail": int(t["queries"]),
                                                                    "head": int(h["queries"])}})
            row[side] = combine(tm, hm)
    return out


def direction_lines(summary: dict | None) -> list[str]:
    """Report lines: MRR of tail and head prediction and their mean, then Hits@1/3/10 the same way."""
    if not summary or "trained" not in summary:
        return []
    t, i, q = summary["trained"], summary.get("identity"), summary["queries"]

    def three(m: dict, k: str) -> str:
        return f"{m[k]:.3f} (tail {m[k + '_tail']:.3f}, head {m[k + '_head']:.3f})"

    lines = [f"link prediction, both directions ({summary['relations']} relations, {q['tail']} tail and "
             f"{q['head']} head test queries; head = R^-1 from the tail, filtered over heads): "
             f"MRR {three(t, 'mrr')}" + (f"; identity {three(i, 'mrr')}" if i else "")]
    lines.append("  " + ", ".join(f"{k} {three(t, k)}" for k in METRIC_KEYS if k.startswith("hits@")))
    return lines


def direction_table(summary: dict | None) -> list[str]:
    """Markdown for the model card: overall and per relation, tail / head / mean."""
    if not summary or "trained" not in summary:
        return []
    cols = ["mrr", "hits@1", "hits@3", "hits@10"]
    header = "| relation | queries (tail / head) | " + " | ".join(f"{k} tail / head / **mean**" for k in cols) + " |"

    def row(label: str, queries: dict, m: dict) -> str:
        cells = [f"{m[k + '_tail']:.3f} / {m[k + '_head']:.3f} / **{m[k]:.3f}**" for k in cols]
        return f"| {label} | {queries['tail']} / {queries['head']} | " + " | ".join(cells) + " |"

    lines = ["## Link prediction in both directions", "",
             "Tail prediction (h, R, ?) through R, head prediction (?, R, t) through R^-1 from the tail (filtered "
             "over the other true heads), and their mean, as knowledge-graph papers report it; each "
             "operator's own test protocol (above), overall = mean over the queries of each direction.", "",
             header, "|---|---|" + "---|" * len(cols), row("**overall**", summary["queries"], summary["trained"])]
    if summary.get("identity"):
        lines.append(row("overall, identity", summary["queries"], summary["identity"]))
    lines += [row(name, r["queries"], r["trained"]) for name, r in sorted(summary["per_relation"].items())
              if "trained" in r]
    return lines + [""]
