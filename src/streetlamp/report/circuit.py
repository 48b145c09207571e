"""The circuit command's figure: faithfulness over circuit sizes per method, with the bootstrap band
and the random-circuit baseline. It draws the stored table; it never recomputes."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def faithfulness_curves(table: pd.DataFrame, title: str, path: Path) -> None:
    """``faithfulness.csv`` as curves: x = size fraction (log), one line and 95% band per method, the
    random baseline dashed, f = 1 (the model) and f = 0 (the empty circuit) dotted."""
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for name, t in table.groupby("method", sort=False):
        t = t.sort_values("size_fraction")
        (line,) = ax.plot(t["size_fraction"], t["faithfulness"], marker="o", ms=3, lw=1.6, label=str(name))
        ax.fill_between(t["size_fraction"], t["ci_low"], t["ci_high"], color=line.get_color(), alpha=0.2, lw=0)
    r = table[table["method"] == table["method"].iloc[0]].sort_values("size_fraction")
    ax.plot(r["size_fraction"], r["random_faithfulness"], ls="--", color="grey", lw=1, label="random circuits")
    ax.fill_between(r["size_fraction"], r["random_ci_low"], r["random_ci_high"], color="grey", alpha=0.15, lw=0)
    for y in (0, 1):
        ax.axhline(y, ls=":", color="black", lw=0.7)
    if (table["size_fraction"] > 0).all() and table["size_fraction"].max() / table["size_fraction"].min() > 20:
        ax.set_xscale("log")
    ax.set_xlabel("circuit size (fraction of the edges)")
    ax.set_ylabel("faithfulness f(C) (95% bootstrap band)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
