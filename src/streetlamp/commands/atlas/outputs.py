"""The atlas' finished outputs from its parts: ``atlas.parquet``, ``heads.csv`` and the view's arrays.

``arrays.safetensors`` (what ``report.html`` reads; per-head arrays chunked by head, so the page decodes a
head's panel only when it is opened):

* ``head_metrics`` ``[layer·head, metric]``: the summary's numeric columns (names in
  ``manifest["atlas"]["metrics"]``), head ``i`` = layer ``i // H``, head ``i % H``;
* ``panel_sequence`` ``[layer·head, 2k]``: the head's top ``k`` sequences by prominence, then its top
  ``k`` by effect (``kl_explained`` when every pair is exact, else ``|dlogp_est|``); -1 = none;
* ``panel_values`` ``[layer·head, 2k, 4]``: prominence, kl_explained (NaN if not exact), dlogp_est, dla;
* ``panel_patterns`` ``[layer·head, 2k, W, W]``: the head's attention on each, the first ``W`` (at most
  :data:`PANEL_WIDTH`) tokens, zero past a sequence's end (float16).

The panel sequences' tokens travel as text in ``manifest["atlas"]["tokens"]`` (sequence -> labels).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from ...interventions.atlas_chunks import Context, inputs_of
from ...interventions.atlas_stats import STATS
from ...interventions.atlas_use import SINK_EPS, deciles, sink_share, summarise, top_sequences
from ...models.adapter import ModelAdapter
from ...store.files import folder_file, save_arrays
from ...store.run_store import RunStore, atomic_write

PANEL_WIDTH = 64
EFFECTS = ("kl_explained", "dlogp", "dprob", "kl_mean", "dloss")
# atlas.parquet's float columns, stored as float32 (STATS too): the forward that made them is float32, so
# their float64 digits past 2^-24 relative carry nothing; heads.csv and the panels are computed from the
# float64 table in memory before the cast (the test bounds what recomputing them from the file changes)
STORED_F32 = ("dlogp_est", "dla", *EFFECTS, "prominence_decile", "effect_decile")


def stored(table: pd.DataFrame) -> pd.DataFrame:
    """The table as ``atlas.parquet`` holds it: :data:`STATS` and :data:`STORED_F32` as float32."""
    return table.astype({k: np.float32 for k in (*STATS, *STORED_F32)})


def merge(
    folder: Path, n_chunks: int, est: pd.DataFrame, chosen: pd.DataFrame, seq_ids: list[str], all_exact: bool
) -> pd.DataFrame:
    """One row per (layer, head, sequence) from the parts."""
    key = ["sequence", "layer", "head"]

    def parts(kind: str) -> pd.DataFrame:  # each part through the run folder's rule: never a file outside it
        names = [f"parts/{kind}-{c:06d}.parquet" for c in range(n_chunks)]
        return pd.concat([pd.read_parquet(folder_file(folder, n)) for n in names], ignore_index=True)

    stats, exact = parts("stats"), parts("exact")
    t = stats.merge(est, on=key).merge(chosen, on=key, how="left").merge(exact, on=key, how="left")
    t["audit"] = t["audit"].fillna("")
    t["exact"] = t["audit"] != ""
    t["example_id"] = [seq_ids[i] for i in t["sequence"]]
    t["prominence_decile"] = t.groupby(["layer", "head"])["prominence"].transform(deciles)
    by = "kl_explained" if all_exact else "dlogp_est"
    t["effect_decile"] = t.assign(_e=t[by].abs()).groupby(["layer", "head"])["_e"].transform(deciles)
    cols = ["layer", "head", "sequence", "example_id", *STATS, "dlogp_est", "dla", "pred", "exact", "audit", *EFFECTS]
    cols += ["prominence_decile", "effect_decile"]
    return t[cols].sort_values(["layer", "head", "sequence"]).reset_index(drop=True)


def _patterns(
    adapter: ModelAdapter, ids: list[list[int]], seqs: list[int], batch_size: int | None
) -> dict[int, np.ndarray]:
    """Each sequence's patterns ``[L, H, W, W]`` (first W tokens), float32."""
    from ...batching import group_by_budget

    L = adapter.n_layers
    out: dict[int, np.ndarray] = {}
    for group in group_by_budget([len(ids[s]) for s in seqs], batch_size, adapter.device):
        rows = [seqs[i] for i in group]
        inp = inputs_of(adapter, [ids[s] for s in rows])
        with torch.no_grad():
            fwd = adapter.forward(inp, record=[f"layers.{l}.attn.pattern" for l in range(L)])
        pat = torch.stack([fwd.cache[f"layers.{l}.attn.pattern"] for l in range(L)], 1).float().cpu().numpy()
        for k, s in enumerate(rows):
            w = min(len(ids[s]), PANEL_WIDTH)
            out[s] = pat[k, :, :, :w, :w]
    return out


def write_outputs(
    adapter: ModelAdapter,
    store: RunStore,
    table: pd.DataFrame,
    ids: list[list[int]],
    seq_ids: list[str],
    ctx: Context,
    settings: dict[str, Any],
) -> pd.DataFrame:
    folder = store.folder
    summary = summarise(table, settings["floor"], settings["striking"], seed=settings["seed"])
    atomic_write(folder / "atlas.parquet", lambda p: stored(table).to_parquet(p, index=False, compression="zstd"))
    atomic_write(folder / "heads.csv", lambda p: summary.to_csv(p, index=False))
    L, H, k = adapter.n_layers, adapter.n_heads, settings["top_k"]
    by = "kl_explained" if settings["exact_share"] >= 1 else "dlogp_est"
    panel = np.full((L * H, 2 * k), -1, np.int64)
    for (l, h), g in table.groupby(["layer", "head"], sort=True):
        att, eff = top_sequences(g, k, by)
        panel[l * H + h, : len(att)] = att
        panel[l * H + h, k : k + len(eff)] = eff
    seqs = sorted({int(s) for s in panel.reshape(-1) if s >= 0})
    pats = _patterns(adapter, ids, seqs, ctx.batch_size)
    W = max((p.shape[-1] for p in pats.values()), default=1)
    patterns = np.zeros((L * H, 2 * k, W, W), np.float16)
    values = np.full((L * H, 2 * k, 4), np.nan, np.float32)
    idx = table.set_index(["layer", "head", "sequence"])
    for i in range(L * H):
        l, h = divmod(i, H)
        for j, s in enumerate(panel[i]):
            if s < 0:
                continue
            p = pats[int(s)][l, h]
            patterns[i, j, : p.shape[0], : p.shape[1]] = p
            r = idx.loc[(l, h, int(s))]
            values[i, j] = [r.prominence, r.kl_explained, r.dlogp_est, r.dla]
    metric_cols = [c for c in summary.columns if c not in ("layer", "head", "head_type")]
    metrics = summary.sort_values(["layer", "head"])[metric_cols].astype(np.float64).to_numpy(np.float32)
    arrays = {
        "head_metrics": metrics,
        "panel_sequence": panel.astype(np.float32),
        "panel_values": values,
        "panel_patterns": patterns,
    }
    atomic_write(folder / "arrays.safetensors", lambda p: save_arrays(p, arrays))
    labels = {str(s): inputs_of(adapter, [ids[s]]).labels[0][:PANEL_WIDTH] for s in seqs}
    store.update_manifest(
        {
            "arrays": {
                k: {
                    "axes": axes,
                    "meaning": meaning,
                    "file": "arrays.safetensors",
                    "key": k,
                    "shape": list(arrays[k].shape),
                    "dtype": str(arrays[k].dtype),
                }
                for k, axes, meaning in (
                    ("head_metrics", ["head", "metric"], "heads.csv's numeric columns per head"),
                    ("panel_sequence", ["head", "slot"], "top sequences by prominence, then by effect (-1: none)"),
                    ("panel_values", ["head", "slot", "value"], "prominence, kl_explained, dlogp_est, dla"),
                    ("panel_patterns", ["head", "slot", "query", "key"], "the head's attention, first tokens"),
                )
            },
            "files": {
                "atlas.parquet": "one row per (layer, head, sequence): every statistic and effect (float32)",
                "heads.csv": "one row per head: means, light-against-use correlation with its interval, flags",
            },
            "atlas": {
                "n_layers": L,
                "n_heads": H,
                "n_sequences": len(ids),
                "metrics": metric_cols,
                "head_types": summary.sort_values(["layer", "head"]).head_type.tolist(),
                "top_k": k,
                "panel_width": PANEL_WIDTH,
                "effect_ranking": by,
                "tokens": labels,
                "example_ids": {str(s): seq_ids[s] for s in seqs},
                "explained": {str(s): adapter.explained_position(len(ids[s])) for s in seqs},
                "n_exact_pairs": int(table.exact.sum()),
                "n_pairs": int(len(table)),
                # Gu et al.'s Sink₁^ε (arXiv 2410.10781) over these sequences: the share of sink_head heads
                "sink_share": sink_share(summary),
                "sink_eps": SINK_EPS,
                "rules": {
                    "floor": settings["floor"],
                    "striking": settings["striking"],
                    "streetlight": "mean prominence >= striking and the effect's 95% upper bound < floor",
                    "unremarkable_used": "mean prominence below the median head, effect's lower bound >= floor, "
                    "effect in the top quarter of heads",
                    "estimate_poor": "est_r < 0.5 or est_mae > 0.5 * mean |dlogp| (>= 3 audited pairs)",
                    "effect": "mean kl_explained (nats) over the unbiased exact pairs (audit all or random)",
                    "sink_head": f"mean first_token (attention to the first token, every query) > {SINK_EPS}",
                },
            },
        }
    )
    return summary
