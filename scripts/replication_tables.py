"""Compact per-layer tables of ``streetlamp replicate`` runs for docs/replication.md (from their summary.csv).

    python scripts/replication_tables.py runs/rep3-smollm2-recall [runs/...] [--layers 0,6,12] [--counts]

One table per run and dataset: mean [95% interval] of the head-mean attention row's tau with the gradient and
with leave-one-out, zeroing the top-attention item vs a random one in every head (``flip``, the paired JS
difference), the same per head (pooled over the layer's heads), permutation TVD, adversarial JS and uniform
flip. ``--counts`` prints how many decisions each run recorded (flip decisions: every ``flip_*`` and
``uniform_flip`` value; plus leave-one-out deletions, permutations and adversarial searches).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

from streetlamp.commands.replicate.run import by_method_metric

COLUMNS = [
    ("tau(att,grad)", "layer", "tau_attention_gradient"),
    ("tau(att,loo)", "layer", "tau_attention_loo"),
    ("flip top-att", "layer", "flip_top_attention"),
    ("flip random", "layer", "flip_random"),
    ("JS top-att - random", "layer", "js_top_minus_random"),
    ("per head: flip top-att - random", "heads", "flip_top_minus_random"),
    ("per head: JS top-att - random", "heads", "js_top_minus_random"),
    ("perm TVD", "layer", "perm_tvd_median"),
    ("adv JS", "layer", "adv_js"),
    ("uniform flip", "layer", "uniform_flip"),
]


def cell(r: pd.Series | None, digits: int = 2) -> str:
    if r is None or math.isnan(r["mean"]):
        return ""
    if math.isnan(r["low"]) or r["low"] == r["high"]:
        return f"{r['mean']:.{digits}f}"
    return f"{r['mean']:.{digits}f} [{r['low']:.{digits}f}, {r['high']:.{digits}f}]"


def table(summary: pd.DataFrame, dataset: str, layers: list[int] | None) -> list[str]:
    sd = summary[summary.dataset == dataset]
    key = by_method_metric(sd)
    all_layers = sorted(int(m[5:]) for m in sd.method.unique() if m.startswith("layer"))
    out = ["| layer | " + " | ".join(c for c, _, _ in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for layer in layers or all_layers:
        cells = [
            cell(key.get((f"{kind}{layer:02d}", m)), 3 if "js" in m or "tvd" in m else 2) for _, kind, m in COLUMNS
        ]
        out.append(f"| {layer} | " + " | ".join(cells) + " |")
    return out


def counts(folder: Path) -> dict[str, int]:
    df = pd.concat([pd.read_parquet(p) for p in sorted((folder / "metrics").glob("*.parquet"))])
    ds = df.example_id.str.split(":").str[0]
    out = {}
    for d in sorted(ds.unique()):
        x = df[ds == d]
        flips = x.metric.str.startswith("flip_") | (x.metric == "uniform_flip")
        out[f"{d}: examples"] = int(x.example_id.nunique())
        out[f"{d}: flip decisions"] = int(flips.sum())
        out[f"{d}: leave-one-out deletions"] = int(x[x.metric == "n_items"].value.sum())
        out[f"{d}: adversarial searches"] = int((x.metric == "adv_js").sum())
    return out


def head_totals(summary: pd.DataFrame) -> dict[str, str]:
    """Per dataset: how many heads' intervals lie above / below 0 (tau with gradient and leave-one-out; the
    paired JS difference of zeroing the head's top item vs a random one, where per-head zeroing ran)."""
    h = summary[summary.method.str.match(r"head\d")]
    out = {}
    for (d, metric), g in h.groupby(["dataset", "metric"]):
        if metric in ("tau_attention_gradient", "tau_attention_loo", "js_top_minus_random", "flip_top_minus_random"):
            out[f"{d}: heads {metric} >0 / <0"] = f"{int((g.low > 0).sum())} / {int((g.high < 0).sum())} of {len(g)}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--layers", default=None, help="comma list (default every layer with a value)")
    ap.add_argument("--counts", action="store_true")
    args = ap.parse_args()
    layers = [int(x) for x in args.layers.split(",")] if args.layers else None
    for folder in args.runs:
        summary = pd.read_csv(folder / "summary.csv")
        settings = json.loads((folder / "manifest.json").read_text()).get("settings", {})
        print(f"## {folder.name}: {json.dumps(settings.get('settings', settings))}\n")
        for d in summary.dataset.unique():
            print(f"### {d}\n")
            print("\n".join(table(summary, d, layers)) + "\n")
        if args.counts:
            print(json.dumps({**counts(folder), **head_totals(summary)}, indent=1) + "\n")


if __name__ == "__main__":
    main()
