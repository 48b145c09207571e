"""Figures of an evaluation run, drawn from the stored metrics only (never recomputed):
AOPC curves per method, Kendall tau distributions, decision-flip fractions, the agreement matrix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..evaluation.erasure import PERCENTS


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figures(folder: Path, df: pd.DataFrame) -> list[Path]:
    """Write the PNGs into ``folder/figures``; returns their paths (figures without data are skipped)."""
    plt = _plt()
    out = Path(folder) / "figures"
    out.mkdir(exist_ok=True)
    paths: list[Path] = []

    def save(fig, name: str) -> None:
        p = out / name
        fig.tight_layout()
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)

    comp = df[df.metric.str.startswith("comprehensiveness@") | df.metric.str.startswith("sufficiency@")]
    if not comp.empty:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, kind in zip(axes, ("comprehensiveness", "sufficiency")):
            for m, g in comp[comp.metric.str.startswith(kind)].groupby("method"):
                means = [g[g.metric == f"{kind}@{k}"].value.mean() for k in PERCENTS]
                ax.plot(PERCENTS, means, marker="o", label=m)
            ax.set_xlabel("top k% of tokens removed" if kind == "comprehensiveness" else "top k% of tokens kept")
            ax.set_ylabel(f"{kind} (F(x) - F(...)), mean")
            ax.set_xscale("log")
            ax.set_xticks(PERCENTS, [str(k) for k in PERCENTS])
            ax.legend(fontsize=7)
        save(fig, "aopc_curves.png")
    taus = df[df.metric == "kendall_tau"].dropna(subset=["value"])
    if not taus.empty:
        pairs = sorted(taus.method.unique())
        fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(pairs)), 4))
        ax.boxplot([taus[taus.method == p].value.to_numpy() for p in pairs])
        ax.set_xticks(range(1, len(pairs) + 1), pairs, rotation=30, ha="right", fontsize=7)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_ylabel("Kendall tau per example")
        save(fig, "tau_distributions.png")
        names = sorted({n for p in pairs for n in p.split("|")})
        mat = np.eye(len(names))
        for p in pairs:
            a, b = p.split("|")
            i, j = names.index(a), names.index(b)
            mat[i, j] = mat[j, i] = taus[taus.method == p].value.mean()
        fig, ax = plt.subplots(figsize=(1 + 0.8 * len(names), 1 + 0.7 * len(names)))
        im = ax.imshow(mat, vmin=-1, vmax=1, cmap="RdBu_r")
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(len(names)), names, fontsize=7)
        for i in range(len(names)):
            for j in range(len(names)):
                ax.text(j, i, f"{mat[i, j]:.2f}", ha="center", va="center", fontsize=7)
        fig.colorbar(im, ax=ax, label="mean Kendall tau")
        save(fig, "agreement_matrix.png")
    flips = df[df.metric == "flip_fraction"]
    if not flips.empty:
        ms = sorted(flips.method.unique())
        fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(ms)), 4))
        data = [flips[flips.method == m].value.dropna().to_numpy() for m in ms]
        ax.boxplot([d if d.size else np.array([np.nan]) for d in data])
        shares = [df[(df.method == m) & (df.metric == "flipped")].value.mean() for m in ms]
        ax.set_xticks(
            range(1, len(ms) + 1),
            [f"{m}\n(flipped {s:.0%})" for m, s in zip(ms, shares)],
            rotation=30,
            ha="right",
            fontsize=7,
        )
        ax.set_ylabel("fraction of attention items zeroed before the decision flips")
        save(fig, "decision_flip.png")
    return paths
