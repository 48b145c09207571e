"""Heatmaps over the image (image models): each method's patch scores drawn on the picture.

The image is the one the model saw (resized by its image processor, normalisation undone). A
method's scores over the patch tokens (its ``tokens`` array without [CLS]) are laid on the patch
grid and drawn as nearest-neighbour squares, one square per patch, so no value is smeared onto a
patch it does not belong to. Unsigned scores use a sequential scale from 0 to their maximum;
signed scores a diverging scale symmetric around 0. The numbers are in ``arrays.safetensors``.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

OVERLAY_FILE = "image_overlay.png"
ALPHA = 0.6


def patch_grid(scores: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Scores over ``[CLS] + rows*cols`` patch tokens -> ``[rows, cols]`` (the [CLS] score dropped)."""
    return np.asarray(scores, dtype=np.float64)[1:].reshape(rows, cols)


def plot_overlay(rgb: np.ndarray, panels: dict[str, np.ndarray], title: str, path: Path) -> None:
    """``rgb`` ``[H, W, 3]`` in [0, 1]; ``panels``: name -> ``[rows, cols]`` patch scores."""
    n = 1 + len(panels)
    ncol = min(n, 4)
    nrow = math.ceil(n / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.2 * ncol, 3.4 * nrow), squeeze=False)
    h, w = rgb.shape[:2]
    flat = axes.ravel()
    flat[0].imshow(rgb, interpolation="nearest")
    flat[0].set_title("input (as the model sees it)", fontsize=9)
    for ax, (name, grid) in zip(flat[1:], panels.items()):
        ax.imshow(rgb, interpolation="nearest")
        signed = bool(np.nanmin(grid) < 0)
        top = float(np.nanmax(np.abs(grid))) or 1.0
        im = ax.imshow(
            grid,
            cmap="RdBu_r" if signed else "inferno",
            vmin=-top if signed else 0.0,
            vmax=top,
            alpha=ALPHA,
            interpolation="nearest",
            extent=(0, w, h, 0),
        )
        ax.set_title(name, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    for ax in flat:
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in flat[n:]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
