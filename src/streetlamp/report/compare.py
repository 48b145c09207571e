"""Method comparison for one text: a tokens x methods figure and the Kendall tau table."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ..stats import kendall_tau  # noqa: E402

COMPARISON_SCALE: dict[str, Any] = {
    "cmap": "RdBu_r",
    "vmin": -1.0,
    "vmax": 1.0,
    "norm": "linear",
    "label": "score / max |score| of that method (signed; red pushes the target up)",
}


def normalise_rows(m: np.ndarray) -> np.ndarray:
    scale = np.abs(m).max(1, keepdims=True)
    return np.divide(m, scale, out=np.zeros_like(m), where=scale > 0)


def kendall_matrix(scores: dict[str, np.ndarray], exclude: np.ndarray | None = None) -> tuple[list[str], np.ndarray]:
    """Kendall tau-b between every pair of methods' token scores, the ``exclude`` (special) tokens left
    out as everywhere in streetlamp (:func:`streetlamp.stats.kendall_tau`); NaN where a method is constant."""
    names = list(scores)
    tau = np.array([[kendall_tau(scores[na], scores[nb], exclude) for nb in names] for na in names])
    return names, tau


def write_comparison(
    method_scores: dict[str, np.ndarray], labels: list[str], out: Path, exclude: np.ndarray | None = None
) -> list[dict[str, Any]]:
    """Write ``methods_comparison.png`` and ``kendall_tau.csv`` into ``out``; their manifest records."""
    scores = {k: np.asarray(v, dtype=np.float64) for k, v in method_scores.items()}
    names = list(scores)
    m = normalise_rows(np.stack([scores[k] for k in names]))
    n = m.shape[1]
    fig, ax = plt.subplots(figsize=(min(3 + 0.45 * n, 30), 1.2 + 0.45 * len(names)))
    im = ax.imshow(m, cmap=COMPARISON_SCALE["cmap"], vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(n), labels, rotation=90, fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_xlabel("token")
    ax.set_ylabel("method")
    for i in range(len(names)):
        for j in range(n):
            ax.text(
                j,
                i,
                f"{m[i, j]:.2f}",
                ha="center",
                va="center",
                fontsize=6,
                color="white" if abs(m[i, j]) > 0.6 else "black",
            )
    cb = fig.colorbar(im, ax=ax, shrink=0.9)
    cb.set_label("row-normalised score", fontsize=8)
    ax.set_title("Token scores by method (each row divided by its max |score|)", fontsize=9)
    fig.savefig(out / "methods_comparison.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    names, tau = kendall_matrix(scores, exclude)
    with open(out / "kendall_tau.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method"] + names)
        for i, na in enumerate(names):
            w.writerow([na] + ["" if np.isnan(t) else f"{t:.4f}" for t in tau[i]])
    return [
        {
            "file": "methods_comparison.png",
            "shows": "token scores by method, rows normalised",
            "arrays": [f"{k}.tokens" for k in names],
            "colour_scale": COMPARISON_SCALE,
        },
        {
            "file": "kendall_tau.csv",
            "shows": "Kendall tau-b between every pair of methods' token scores (special tokens excluded)",
        },
    ]
