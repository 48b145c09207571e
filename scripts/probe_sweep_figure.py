"""Capacity-sweep figure for docs/probing.md from one or more ``streetlamp probe`` run folders.

    python scripts/probe_sweep_figure.py OUT.png RUN_DIR [RUN_DIR ...]

One panel per run folder: held-out task accuracy, control accuracy and selectivity against the swept
setting (log axis), with the share of test items whose word type occurs in training (the most a probe
that memorises word types can get right on the control task, besides guessing).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(out: str, runs: list[str]) -> None:
    fig, axes = plt.subplots(1, len(runs), figsize=(5.2 * len(runs), 4.4), squeeze=False)
    for ax, run in zip(axes[0], runs):
        man = json.loads((Path(run) / "manifest.json").read_text())
        sw = man["sweep"]
        v = [r["value"] for r in sw]
        ax.plot(v, [r["task_accuracy"] for r in sw], "-o", ms=3, label="task (held out)")
        ax.plot(v, [r["control_accuracy"] for r in sw], "--o", ms=3, label="control (held out)")
        ax.plot(v, [r["selectivity"] for r in sw], ":s", ms=3, label="selectivity")
        ax.plot(
            v, [r["control_train_accuracy"] for r in sw], "-", lw=0.8, color="C1", alpha=0.5, label="control (train)"
        )
        b = man["baselines"]
        if "control_memoriser_test_accuracy" in b:
            ax.axhline(b["control_memoriser_test_accuracy"], color="grey", lw=0.8, label="control: perfect memoriser")
        ax.axhline(
            b["test_items_with_a_training_word_type"],
            color="grey",
            lw=0.8,
            ls=":",
            label="test items with a training word type",
        )
        ax.set_xscale("log")
        ax.set_xticks(v, [f"{x:g}" for x in v])
        ax.minorticks_off()
        ax.set_ylim(0, 1.02)
        ax.set_xlabel(f"{sw[0]['kind']} ({'MLP, 1 hidden layer' if sw[0]['kind'] == 'hidden' else 'linear probe'})")
        where = f"{man['settings']['data']}, {man['task']['n_texts']} texts"
        ax.set_title(f"{man['model']['name']} · {man['task']['name']} ({where}) · {sw[0]['site']}", fontsize=9)
    axes[0][0].set_ylabel("accuracy / selectivity")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
