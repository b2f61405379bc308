"""PNG figures for the benchmarks (matplotlib, no display needed: figures are drawn with Agg).

- :func:`operator_similarity`: how alike two relation operators act — the cosine between their
  shifts op(h) − ĥ stacked over a sample of raw vectors (for two translations of similar norm this
  is close to the cosine between their translation vectors).
- :func:`metric_bars`: a metric per group (relation, dataset) with one bar per method.
- :func:`pca_2d` + :func:`projection`: documents in 2-D coloured by an aspect label; drawn for
  identity and for an operator side by side.
"""
from __future__ import annotations

import numpy as np

from ..encoder.kinds import kind_of
from ..encoder.relations import Operator, normalize

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac", "#1b1b1b")  # 11 distinct colours: one per GICS sector


def figure(ncols: int = 1, *, width: float = 6.5, height: float = 4.5):
    """A figure with ``ncols`` axes side by side (no pyplot state, so it is safe in any process)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def save(fig, path: str) -> str:
    fig.savefig(path, dpi=110, format="png")
    return path


def operator_similarity(operators: dict[str, Operator], h: np.ndarray) -> tuple[list[str], np.ndarray]:
    """(names, (m, m) cosine) between the shifts op(h) − ĥ of the non-identity operators over rows of ``h``."""
    names = sorted(n for n, op in operators.items()  # plain cosine has no shift; a tower reads text
                   if not kind_of(op.kind).plain and not op.needs_text)
    base = normalize(h)
    shifts = np.stack([(operators[n].apply(h) - base).ravel() for n in names]) if names else np.zeros((0, 1))
    unit = shifts / np.maximum(np.linalg.norm(shifts, axis=1, keepdims=True), 1e-12)
    return names, unit @ unit.T


def heatmap(ax, names: list[str], matrix: np.ndarray, title: str) -> None:
    im = ax.imshow(matrix, vmin=-1, vmax=1, cmap="RdBu_r")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    for i in range(len(names)):
        for j in range(len(names)):
            ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=7)
    ax.set_title(title, fontsize=10)
    ax.figure.colorbar(im, ax=ax, shrink=0.8)


def metric_bars(ax, groups: list[str], series: dict[str, list[float]], *, ylabel: str, title: str) -> None:
    """Grouped bars: ``series`` maps a method to one value per group (NaN = not drawn)."""
    width = 0.8 / max(len(series), 1)
    x = np.arange(len(groups))
    for i, (method, values) in enumerate(series.items()):
        ax.bar(x + (i - (len(series) - 1) / 2) * width, np.nan_to_num(np.asarray(values, float)), width,
               label=method, color=PALETTE[i % len(PALETTE)])
    ax.set_xticks(x, groups, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)


def pca_2d(x: np.ndarray) -> np.ndarray:
    """(n, d) → (n, 2): projection on the top two principal components (numpy SVD)."""
    centred = np.asarray(x, dtype=np.float64) - x.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    return centred @ vt[:2].T


def projection(ax, xy: np.ndarray, labels: list, *, title: str, max_labels: int = 9) -> None:
    """Scatter ``xy`` coloured by the ``max_labels`` most frequent labels (the rest grey)."""
    values, counts = np.unique(np.array([str(v) for v in labels]), return_counts=True)
    top = [v for _, v in sorted(zip(-counts, values))][:max_labels]
    names = np.array([str(v) for v in labels])
    rest = ~np.isin(names, top)
    ax.scatter(xy[rest, 0], xy[rest, 1], s=6, c="#cccccc", label="other")
    for i, v in enumerate(top):
        sel = names == v
        ax.scatter(xy[sel, 0], xy[sel, 1], s=8, color=PALETTE[i % len(PALETTE)], label=v[:28])
    ax.set_title(title, fontsize=10)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.legend(fontsize=6, markerscale=1.5, loc="best")


# ---------------------------------------------------------------- one figure per command

def grouped(rows: list[dict], metric) -> tuple[list[str], dict[str, list[float]]]:
    """(groups, method → one value per group) from rows carrying "group" and "method"."""
    groups = list(dict.fromkeys(r["group"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    value = {(r["group"], r["method"]): metric(r) for r in rows}
    return groups, {m: [value.get((g, m), float("nan")) for g in groups] for m in methods}


def linkpred_figure(rows: list[dict], operators: dict[str, Operator], sample: np.ndarray, path: str) -> str:
    """Filtered MRR per relation and method (first direction) | operator-similarity heatmap."""
    first = rows[0]["direction"]
    bars = [{"group": r["relation"], "method": r["method"], "value": r["filtered"]["mrr"]}
            for r in rows if r["direction"] == first and r.get("available")]
    names, sim = operator_similarity(operators, sample)
    fig, axes = figure(2 if len(names) > 1 else 1)
    groups, series = grouped(bars, lambda r: r["value"])
    metric_bars(axes[0], groups, series, ylabel="MRR (filtered, realistic)", title=f"link prediction ({first})")
    if len(names) > 1:
        heatmap(axes[1], names, sim, "operator similarity: cos of shifts op(h) − ĥ")
    return save(fig, path)


def bars_figure(rows: list[dict], metrics: list[tuple[str, str]], path: str, *, title: str) -> str:
    """One panel per (key, label) in ``metrics``: rows carry "group", "method" and the keys."""
    fig, axes = figure(len(metrics))
    for ax, (key, label) in zip(axes, metrics):
        groups, series = grouped(rows, lambda r: r[key])
        metric_bars(ax, groups, series, ylabel=label, title=title)
    return save(fig, path)


def retrieval_figure(rows: list[dict], unit: np.ndarray, op_views: dict[str, np.ndarray], labels: list, path: str, *,
                     aspect: str, k: int) -> str:
    """P@k, R@k, MRR@k per method | PCA of ĥ | PCA of op(h) for each operator in ``op_views``."""
    fig, axes = figure(2 + len(op_views), width=5.0, height=4.5)
    keys = [f"p@{k}", f"r@{k}", f"mrr@{k}"]
    metric_bars(axes[0], [key.upper() for key in keys], {r["method"]: [r[key] for key in keys] for r in rows},
                ylabel="macro mean over seeds", title=f"same-{aspect} retrieval")
    for ax, (name, vecs) in zip(axes[1:], {"identity": unit, **op_views}.items()):
        projection(ax, pca_2d(vecs), labels, title=f"{name}: PCA of {'ĥ' if name == 'identity' else 'op(h)'}")
    return save(fig, path)


def embedding_figure(views: dict[str, np.ndarray], labels: list, path: str, *, title: str) -> str:
    """Side-by-side PCA maps of the same items under several views (e.g. generic vs aspect), coloured by label."""
    fig, axes = figure(len(views), width=5.5, height=5.0)
    for ax, (name, vecs) in zip(axes, views.items()):
        projection(ax, pca_2d(vecs), labels, title=f"{name} — {title}", max_labels=11)
    return save(fig, path)
