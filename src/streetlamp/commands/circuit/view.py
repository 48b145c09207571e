"""What the circuit report view (``static/circuit.js``) draws, stored as arrays of the run folder: the view
never recomputes. Per method ``m``: ``scores.m`` ``[reader, writer]`` (NaN where no edge),
``interval.m`` ``[2, reader, writer]``, ``inclusion.m``, ``masks.m`` ``[size, reader, writer]`` (the pruned
circuit at each swept size), ``faithfulness.m`` / ``random.m`` ``[size, 3]`` (f, ci_low, ci_high);
``sizes``; the per-edge arrays in float32 (what the page decodes); ``exact`` / ``exact_interval`` (exact edge patching where computed: the ``exact`` method, the
edges of ``paths.csv``); ``attention`` ``[layer, head, query, key]`` of the first clean prompt. The graph's
node names and the prompt's tokens go in the manifest's ``circuit_view``."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...interventions.circuits.graph import Graph
from ...methods.attention import record_attention
from ...models.adapter import ModelAdapter


def first_prompt_attention(adapter: ModelAdapter, clean: Any) -> tuple[np.ndarray, list[str], int]:
    """Attention ``[L, H, n, n]`` of the first clean prompt (real tokens), its token labels, the explained
    position."""
    one = clean.select([0])
    n = one.lengths[0]
    with torch.no_grad():
        _, att, _ = record_attention(adapter, one)
    return att[0, :, :, :n, :n].float().cpu().numpy(), list(one.labels[0]), adapter.explained_position(n)


def exact_effects(g: Graph, methods: dict, paths: Any) -> tuple[np.ndarray, np.ndarray, str]:
    """Exact patching effects ``[R, U]`` and intervals ``[2, R, U]`` where computed, and what they are."""
    eff = np.full((g.n_readers, g.n_writers), np.nan)
    iv = np.full((2, g.n_readers, g.n_writers), np.nan)
    what = []
    if "exact" in methods:
        r = methods["exact"]
        eff = r.scores.mean.double().cpu().numpy().copy()
        iv = np.stack([r.lo, r.hi]).copy()
        what.append("every edge (the exact method)")
    if paths is not None and len(paths):
        for x in paths.itertuples():
            i, j = g.reader_index(x.receiver, x.input), g.writers.index(x.sender)
            if np.isnan(eff[i, j]):
                eff[i, j], iv[0, i, j], iv[1, i, j] = x.patch_effect, x.patch_ci_low, x.patch_ci_high
        what.append("the edges of paths.csv")
    return eff, iv, " and ".join(what) or "no edge (run --methods exact, or --paths > 0)"


def add_view(
    w: Any, adapter: ModelAdapter, g: Graph, pairs: Any, methods: dict, sizes: list[float], paths: Any
) -> dict:
    """Add the view's arrays to the run writer ``w``; returns the manifest's ``circuit_view`` section."""
    E = ["reader", "writer"]
    w.add_array("sizes", np.asarray(sizes, np.float64), axes=["size"], meaning="the swept circuit sizes (fractions)")
    for name, r in methods.items():
        t = r.sweep.table
        w.add_array(f"scores.{name}", r.scores.mean.float().cpu().numpy(), axes=E,
                    meaning=f"{name} edge score: mean over prompts of m(edge ablated) - m(model); NaN: no edge")  # fmt: skip
        w.add_array(f"interval.{name}", np.stack([r.lo, r.hi]).astype(np.float32), axes=["bound", *E],
                    meaning="95% percentile bootstrap interval of the score over prompts (low, high)")  # fmt: skip
        w.add_array(f"inclusion.{name}", r.inclusion.float().numpy(), axes=E,
                    meaning="share of bootstrap resamples whose circuit at the chosen size holds the edge")  # fmt: skip
        w.add_array(f"masks.{name}", np.stack([m.numpy() for m in r.sweep.masks]).astype(np.uint8),
                    axes=["size", *E], meaning="1 = the edge is in the (pruned) circuit at that swept size")  # fmt: skip
        cols = ["faithfulness", "ci_low", "ci_high"]
        w.add_array(f"faithfulness.{name}", t[cols].to_numpy(np.float64), axes=["size", "value"],
                    meaning="f(C) at each swept size: value, 95% bootstrap low, high")  # fmt: skip
        w.add_array(f"random.{name}", t[["random_" + c for c in cols]].to_numpy(np.float64), axes=["size", "value"],
                    meaning="random circuits' f at each swept size: value, 95% bootstrap low, high")  # fmt: skip
    eff, iv, what = exact_effects(g, methods, paths)
    w.add_array(
        "exact", eff, axes=E, meaning=f"exact patching m(edge patched) - m(model), mean over prompts; for {what}"
    )
    w.add_array(
        "exact_interval",
        iv.astype(np.float32),
        axes=["bound", *E],
        meaning="95% bootstrap interval of the exact effect",
    )
    att, labels, p = first_prompt_attention(adapter, pairs.clean)
    w.add_array("attention", att, axes=["layer", "head", "query", "key"],
                meaning="attention of the first clean prompt (real tokens)")  # fmt: skip
    return {
        "writers": list(g.writers),
        # [the heads that read it (a key/value group's joined by ","), input, layer, owners, kv group or ""]
        "readers": [
            [g.target_label(i), r.input, r.layer, list(r.owners), g.kv_group(i)] for i, r in enumerate(g.readers)
        ],
        "n_layers": g.n_layers,
        "n_heads": g.n_heads,
        "n_kv_heads": g.n_kv_heads,
        "prompt": {"text": pairs.clean.texts[0], "tokens": labels, "explained_position": p},
        "exact": what,
    }
