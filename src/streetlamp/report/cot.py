"""Figures of ``streetlamp cot`` (from the stored records and scores; nothing is recomputed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ..cot.metrics import mean_curve  # noqa: E402

LABELS = {
    "early_answer": "early answering (x: share of chain kept)",
    "add_mistake": "adding a mistake (x: share before the mistake)",
    "paraphrase": "paraphrasing (x: share paraphrased)",
    "filler": "filler tokens (x: filler / chain length)",
}


def figures(folder: Path, scores: dict, records: list[dict]) -> list[dict]:
    figdir = Path(folder) / "figures"
    figdir.mkdir(exist_ok=True)
    out = []
    lan = [t for t in LABELS if t in scores and scores[t].get("curves")]
    if lan:
        fig, ax = plt.subplots(figsize=(6, 4))
        for t in lan:
            g, y = mean_curve(scores[t]["curves"])
            ax.plot(g, y, marker="o", ms=3, label=f"{LABELS[t]}; AOC {scores[t]['aoc']:.3f}")
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("x (see legend)")
        ax.set_ylabel("share with the same answer as the whole chain")
        ax.set_title("Lanham et al. tests (mean over examples, interpolated)", fontsize=9)
        ax.legend(fontsize=7)
        fig.savefig(figdir / "lanham.png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        out.append({"file": "figures/lanham.png", "shows": "mean same-answer curves of the Lanham tests"})
    if "hint" in scores:
        kinds = [k for k, v in scores["hint"].items() if isinstance(v, dict) and k != "all"]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        x = np.arange(len(kinds))
        used = [scores["hint"][k]["p_to_hint"] for k in kinds]
        verb = [scores["hint"][k]["faithfulness_raw"] for k in kinds]
        ax.bar(x - 0.2, np.nan_to_num(used), 0.4, label="answer moved to the hint (share of pairs)")
        ax.bar(x + 0.2, np.nan_to_num(verb), 0.4, label="chain mentions the hint (share of used)")
        ax.set_xticks(x, kinds)
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
        ax.set_title("Hints (Chen et al.): used and verbalised", fontsize=9)
        fig.savefig(figdir / "hints.png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        out.append({"file": "figures/hints.png", "shows": "share of hints used and share of used hints verbalised"})
    ints = [
        r["hint"][k]["internals"]
        for r in records
        for k in r.get("hint", {})
        if isinstance(r["hint"][k], dict) and "internals" in r["hint"][k]
    ]
    if ints:
        keys = ["attention_hint", "attention_chain", "knockout_hint", "knockout_chain"]
        m = {k: np.mean([np.asarray(i[k], float) for i in ints], 0) for k in keys}
        layers = np.arange(len(m["attention_hint"]))
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
        a1.plot(layers, m["attention_hint"], label="on hint tokens")
        a1.plot(layers, m["attention_chain"], label="on chain-of-thought tokens")
        a1.set_xlabel("layer")
        a1.set_ylabel("attention mass from the answer position")
        a1.legend(fontsize=7)
        a1.set_title(f"Attention (mean of {len(ints)} used hints)", fontsize=9)
        a2.plot(layers, m["knockout_hint"], label="knock out attention to the hint")
        a2.plot(layers, m["knockout_chain"], label="knock out attention to the chain")
        occ = float(np.mean([i["occlusion_effect"] for i in ints]))
        a2.axhline(occ, color="k", ls="--", lw=1, label=f"remove the hint from the prompt: {occ:.3f}")
        a2.set_xlabel("layer (knockout at this layer only)")
        a2.set_ylabel("drop of log p(hinted letter)")
        a2.legend(fontsize=7)
        a2.set_title("Intervention", fontsize=9)
        fig.savefig(figdir / "internals.png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        out.append(
            {
                "file": "figures/internals.png",
                "shows": "per layer: attention mass on hint vs chain, and the "
                "effect of knocking that attention out; dashed: occluding the hint",
            }
        )
    return out
