"""Threshold sweep (CODER++ Figure 2): P/R/F1 per θ from one neighbour search, written as JSON and a plot.

The graph's pairs are sorted by score, so the pairs at θ are a prefix: the paper's pair counts for every θ come
from one cumulative sum of TP flags; the cluster counts need the connected components once per θ (O(n + pairs)).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..io.files import atomic_open, write_json
from .graph import NeighbourGraph, check_threshold, connected_clusters
from .pair_scores import PairCounts, count_clusters, gold_codes, pairs_within

DEFAULT_THRESHOLDS = tuple(round(0.3 + 0.02 * i, 2) for i in range(36))  # 0.30, 0.32, ..., 1.00


def sweep(
    graph: NeighbourGraph, thresholds: Sequence[float] = DEFAULT_THRESHOLDS, gold: Sequence | None = None
) -> list:
    """One row per threshold (ascending): the predicted pairs and clusters, and with `gold` the confusion counts
    and P/R/F1 of both readings (`pairs`: the paper's; `clusters`: connected components; see `evaluate`).

    graph (NeighbourGraph): Searched with `min_score` at most the lowest threshold.
    thresholds (Sequence[float]): Cosines in [-1, 1].
    gold (Sequence): Gold label per term, or None.
    RETURNS (list): Dicts with threshold, predicted_pairs, clusters and, given gold, `pairs` and `clusters_eval`.
    """
    thresholds = sorted({check_threshold(t) for t in thresholds})
    codes = gold_codes(gold, graph.n) if gold is not None else None
    if codes is not None:
        tp_prefix = np.concatenate([[0], np.cumsum(codes[graph.rows] == codes[graph.cols])])
        gold_positive = pairs_within(np.bincount(codes)) if len(codes) else 0
    total = graph.n * (graph.n - 1) // 2
    rows = []
    for threshold in thresholds:
        k = graph.count_above(threshold)
        labels = connected_clusters(graph.n, graph.rows[:k], graph.cols[:k])
        row = {"threshold": threshold, "predicted_pairs": k, "clusters": int(labels.max()) + 1 if graph.n else 0}
        if codes is not None:
            tp = int(tp_prefix[k])
            fp, fn = k - tp, gold_positive - tp
            row["pairs"] = PairCounts(tp, fp, fn, total - tp - fp - fn).as_dict()
            row["clusters_eval"] = count_clusters(labels, codes).as_dict()
        rows.append(row)
    return rows


def best(rows: list, reading: str = "pairs") -> dict | None:
    """The row with the highest F1 under `reading` ("pairs" or "clusters_eval"); the lowest θ on ties."""
    scored = [r for r in rows if reading in r]
    return max(scored, key=lambda r: (r[reading]["f1"], -r["threshold"])) if scored else None


def write_sweep(path: str | Path, rows: list, meta: dict | None = None) -> None:
    """The sweep as JSON (atomically): {"meta": ..., "best": {reading: row}, "thresholds": rows}."""
    write_json(
        path, {"meta": meta or {}, "best": {r: best(rows, r) for r in ("pairs", "clusters_eval")}, "thresholds": rows}
    )


def plot_sweep(path: str | Path, curves: dict[str, list], title: str = "Term clustering") -> None:
    """Precision, recall and F1 against θ, one colour per curve (e.g. per encoder), like CODER++ Figure 2:
    solid for the paper's pair reading, dashed for connected components. Written atomically (PNG or SVG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4), sharey=True)
    for colour, (label, rows) in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"] * 4, curves.items()):
        theta = [r["threshold"] for r in rows if "pairs" in r]
        for ax, metric in zip(axes, ("precision", "recall", "f1")):
            ax.plot(theta, [r["pairs"][metric] for r in rows if "pairs" in r], color=colour, label=f"{label} (pairs)")
            ax.plot(theta, [r["clusters_eval"][metric] for r in rows if "pairs" in r], color=colour, ls="--",
                    label=f"{label} (clusters)")  # fmt: skip
    for ax, metric in zip(axes, ("precision", "recall", "F1")):
        ax.set_title(metric)
        ax.set_xlabel("threshold θ (cosine)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    suffix = Path(path).suffix.lstrip(".") or "png"
    with atomic_open(path) as f:
        fig.savefig(f, format=suffix, dpi=120)
    plt.close(fig)
