"""Figures for head and circuit interventions. They draw saved arrays; they never recompute."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _sym(a: np.ndarray) -> float:
    m = float(np.nanmax(np.abs(a))) if np.isfinite(a).any() else 1.0
    return m if m > 0 else 1.0


def layer_head(a: np.ndarray, title: str, label: str, path: Path, diverging: bool = True) -> None:
    """Heatmap of ``a[layer, head]``: rows layers, columns heads."""
    L, H = a.shape
    fig, ax = plt.subplots(figsize=(1.0 + 0.45 * H + 1.5, 1.0 + 0.3 * L))
    kw = dict(cmap="RdBu_r", vmin=-_sym(a), vmax=_sym(a)) if diverging else dict(cmap="viridis")
    im = ax.imshow(np.ma.masked_invalid(a), aspect="auto", interpolation="nearest", **kw)
    ax.set_xticks(range(H))
    ax.set_yticks(range(L))
    ax.tick_params(labelsize=6)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax).set_label(label)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def side_by_side(panels: dict[str, np.ndarray], title: str, path: Path) -> None:
    """Several ``[layer, head]`` score maps next to each other, each on its own scale."""
    n = len(panels)
    L, H = next(iter(panels.values())).shape
    fig, axes = plt.subplots(1, n, figsize=(n * (0.4 * H + 2.0), 1.0 + 0.3 * L), squeeze=False)
    for ax, (name, a) in zip(axes[0], panels.items()):
        diverging = bool(np.nanmin(a) < 0)
        kw = dict(cmap="RdBu_r", vmin=-_sym(a), vmax=_sym(a)) if diverging else dict(cmap="viridis")
        im = ax.imshow(a, aspect="auto", interpolation="nearest", **kw)
        ax.set_title(name, fontsize=8)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.tick_params(labelsize=6)
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def ranked(a: np.ndarray, title: str, label: str, path: Path, k: int = 20) -> None:
    """Horizontal bars of the ``k`` heads with the largest |value|."""
    L, H = a.shape
    flat = a.reshape(-1)
    idx = np.argsort(-np.abs(flat))[:k]
    fig, ax = plt.subplots(figsize=(5, 0.25 * len(idx) + 1))
    ax.barh(range(len(idx)), flat[idx], color=["#b2182b" if v < 0 else "#2166ac" for v in flat[idx]])
    ax.set_yticks(range(len(idx)), [f"L{i // H}.H{i % H}" for i in idx], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(label)
    ax.set_title(title, fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def prune_curves(
    curves: dict[str, tuple[np.ndarray, np.ndarray]], title: str, path: Path, baseline: float | None = None
) -> None:
    """Accuracy vs number of heads removed, one line per order (random seeds thin grey)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, (x, y) in curves.items():
        if name.startswith("random"):
            ax.plot(x, y, color="grey", lw=0.8, alpha=0.6, label="random" if name.endswith("seed0") else None)
        else:
            ax.plot(x, y, lw=1.8, label=name)
    if baseline is not None:
        ax.axhline(baseline, ls=":", color="black", lw=0.8, label="majority class")
    ax.set_xlabel("heads removed (zero-ablated)")
    ax.set_ylabel("held-out accuracy")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def layer_pos(panels: dict[str, np.ndarray], labels: Sequence[str], title: str, path: Path) -> None:
    """Patching maps ``[layer, pos]`` side by side (normalised metric, 0 = corrupt, 1 = clean)."""
    n = len(panels)
    L, P = next(iter(panels.values())).shape
    fig, axes = plt.subplots(1, n, figsize=(n * (0.35 * P + 2.0), 1.5 + 0.22 * L), squeeze=False)
    v = max(_sym(a) for a in panels.values())
    im = None
    for ax, (name, a) in zip(axes[0], panels.items()):
        im = ax.imshow(a, aspect="auto", cmap="RdBu_r", vmin=-v, vmax=v, interpolation="nearest")
        ax.set_title(name, fontsize=8)
        ax.set_xticks(range(P), labels, rotation=90, fontsize=6)
        ax.set_ylabel("layer")
        ax.tick_params(axis="y", labelsize=6)
    fig.suptitle(title, fontsize=9)
    assert im is not None
    fig.colorbar(im, ax=list(axes[0]), shrink=0.8).set_label("normalised logit difference")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def scatter(real: np.ndarray, approx: np.ndarray, title: str, path: Path) -> None:
    """Attribution patching (x) vs activation patching (y), every site."""
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.scatter(approx, real, s=8, alpha=0.6)
    lo = float(np.nanmin([real.min(), approx.min()]))
    hi = float(np.nanmax([real.max(), approx.max()]))
    ax.plot([lo, hi], [lo, hi], ls=":", color="black", lw=0.8)
    ax.set_xlabel("attribution patching (linear approximation)")
    ax.set_ylabel("activation patching (real)")
    ax.set_title(title, fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
