"""Attention heatmaps. Rows are queries, columns keys, always labelled so; cells the mask
forbids are drawn grey and hatched, never as "low"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.collections import PatchCollection  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

ATTENTION_SCALE: dict[str, Any] = {
    "cmap": "viridis",
    "vmin": 0.0,
    "vmax": 1.0,
    "norm": "linear",
    "label": "attention probability",
    "forbidden": "grey #bdbdbd, hatched '///'",
}
FORBIDDEN_COLOUR = "#bdbdbd"
LABELLED_MAX = 96  # longer texts: no per-token tick labels or hatching (unreadable, and minutes to draw)


def _cmap() -> matplotlib.colors.Colormap:
    return matplotlib.colormaps[ATTENTION_SCALE["cmap"]].with_extremes(bad=FORBIDDEN_COLOUR)


def _draw(
    ax: plt.Axes, a: np.ndarray, allowed: np.ndarray, labels: list[str] | None, title: str, hatch: bool = True
) -> matplotlib.image.AxesImage:
    data = np.ma.masked_where(~allowed, a)
    im = ax.imshow(
        data,
        cmap=_cmap(),
        vmin=ATTENTION_SCALE["vmin"],
        vmax=ATTENTION_SCALE["vmax"],
        interpolation="nearest",
        aspect="equal",
    )
    if hatch and (~allowed).any() and allowed.shape[0] <= LABELLED_MAX:
        rows, cols = np.nonzero(~allowed)
        rects = [Rectangle((c - 0.5, r - 0.5), 1, 1) for r, c in zip(rows, cols)]
        ax.add_collection(PatchCollection(rects, facecolor="none", edgecolor="#555555", linewidth=0, hatch="///"))
    ax.set_title(title, fontsize=9)
    if labels is not None and len(labels) <= LABELLED_MAX:
        n = len(labels)
        ax.set_xticks(range(n), labels, rotation=90, fontsize=7)
        ax.set_yticks(range(n), labels, fontsize=7)
    else:
        ax.set_xticks([])
        ax.set_yticks([])
    return im


def _legend(fig: plt.Figure, im: matplotlib.image.AxesImage, axes: Any) -> None:
    cb = fig.colorbar(im, ax=axes, shrink=0.8)
    cb.set_label(ATTENTION_SCALE["label"])
    fig.legend(
        handles=[
            Patch(facecolor=FORBIDDEN_COLOUR, hatch="///", edgecolor="black", label="forbidden by mask (not 'low')")
        ],
        loc="lower left",
        fontsize=8,
    )


def plot_head(a: np.ndarray, allowed: np.ndarray, labels: list[str], title: str, path: Path) -> None:
    """One head (or one aggregate): ``a[query, key]``."""
    n = len(labels)
    size = min(4 + 0.28 * n, 30) if n <= LABELLED_MAX else 10
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    im = _draw(ax, a, allowed, labels, title)
    ax.set_xlabel("Key (attended-to token)")
    ax.set_ylabel("Query (attending token)")
    _legend(fig, im, ax)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_grid(att: np.ndarray, allowed: np.ndarray, labels: list[str], title: str, path: Path) -> None:
    """Layer x head grid of ``att[layer, head, query, key]`` on one shared scale."""
    L, H = att.shape[:2]
    fig, axes = plt.subplots(L, H, figsize=(1.3 * H + 1.5, 1.3 * L + 0.8), squeeze=False)
    im = None
    for l in range(L):
        for h in range(H):
            im = _draw(axes[l, h], att[l, h], allowed, None, "", hatch=False)
            if l == 0:
                axes[l, h].set_title(f"head {h}", fontsize=7)
            if h == 0:
                axes[l, h].set_ylabel(f"layer {l}\nQuery", fontsize=7)
            if l == L - 1:
                axes[l, h].set_xlabel("Key", fontsize=7)
    fig.suptitle(f"{title}\n(rows: query, columns: key; tokens as in attention_head_mean.png)", fontsize=9)
    assert im is not None
    _legend(fig, im, axes)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def plot_layer_means(att: np.ndarray, allowed: np.ndarray, labels: list[str], title: str, path: Path) -> None:
    """Head mean of every layer, side by side: ``mean_h att[l, h]``."""
    L = att.shape[0]
    n = len(labels)
    size = min(3 + 0.22 * n, 14) if n <= LABELLED_MAX else 3.5
    cols = L if n <= LABELLED_MAX else min(L, 6)  # long texts: rows of 6 layers, not one 30-panel strip
    rows = -(-L // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(size * cols + 1.5, (size + 0.5) * rows), squeeze=False)
    im = None
    for l in range(L):
        ax = axes[l // cols, l % cols]
        im = _draw(ax, att[l].mean(0), allowed, labels, f"layer {l}, mean of {att.shape[1]} heads")
        ax.set_xlabel("Key")
        if l % cols == 0:
            ax.set_ylabel("Query")
    for k in range(L, rows * cols):
        axes[k // cols, k % cols].axis("off")
    fig.suptitle(title, fontsize=10)
    assert im is not None
    _legend(fig, im, axes)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
