"""The benchmark figure: AUPRC per method, normal vs deceptive model, one panel per task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def plot_leaderboard(rows: list[dict[str, Any]], path: Path) -> None:
    ok = [r for r in rows if not r.get("error")]
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(len(tasks), 1, figsize=(max(6, 0.7 * len(methods) + 2), 2.6 * len(tasks)), squeeze=False)
    x = np.arange(len(methods))
    for ax, task in zip(axes[:, 0], tasks):
        for j, (variant, colour) in enumerate((("normal", "#4477aa"), ("deceptive", "#ee6677"))):
            vals = [
                next(
                    (r["auprc"] for r in ok if r["task"] == task and r["variant"] == variant and r["method"] == m),
                    np.nan,
                )
                for m in methods
            ]
            ax.bar(x + (j - 0.5) * 0.38, vals, 0.38, color=colour, label=variant)
        base = [r["base_rate"] for r in ok if r["task"] == task and "base_rate" in r]
        if base:
            ax.axhline(float(np.mean(base)), color="grey", lw=0.8, ls="--", label="base rate")
        ax.set_ylim(0, 1.02)
        ax.set_ylabel("AUPRC")
        ax.set_title(f"task: {task} (planted-token recovery)", fontsize=10)
        ax.set_xticks(x, methods, rotation=30, ha="right", fontsize=8)
    axes[0, 0].legend(fontsize=8, ncol=3, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
