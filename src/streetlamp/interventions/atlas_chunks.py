"""The atlas' work on one chunk of sequences, the unit of resumption and of ``--engine ray`` fan-out.

Three passes over the corpus, each chunk by chunk (each a module-level function so Ray ships it by
reference; each returns plain arrays the driver writes):

1. :func:`stats_chunk`: the clean run's patterns -> the statistics of :mod:`.atlas_stats` per
   (sequence, layer, head), and the chunk's sum of ``attn.z`` over its real tokens (for the corpus mean);
2. :func:`estimate_chunk`: the attribution estimate and DLA of every (sequence, layer, head)
   (:mod:`.atlas_effects`), which needs the corpus mean (mean ablation);
3. :func:`exact_chunk`: exact ablation of the chosen (sequence, layer, head) pairs, which needs the
   estimates of every chunk (the top-estimated pairs are audited).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..models.adapter import Inputs, ModelAdapter
from . import atlas_effects as E
from .atlas_stats import STATS, pattern_stats


@dataclass
class Chunk:
    """Sequences ``index`` (corpus positions) with their token ids; for resample their sources' ids."""

    index: list[int]
    ids: list[list[int]]
    source_ids: list[list[int]] = field(default_factory=list)


@dataclass
class Context:
    """What a pass needs besides its chunk: the ablation, the corpus mean ``[L, H, dh]``, the seed,
    the token budget, and (exact pass) the pairs ``(sequence, layer, head)`` to ablate."""

    ablation: str = "mean"
    mean: np.ndarray | None = None
    seed: int = 0
    batch_size: int | None = None
    pairs: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)  # chunk -> pairs


def inputs_of(adapter: ModelAdapter, ids: list[list[int]]) -> Inputs:
    return Inputs.from_ids(adapter, ids)


def stats_chunk(adapter: ModelAdapter, chunk: Chunk, ctx: Context) -> dict[str, np.ndarray]:
    """``{stat: [B, L, H]}``, ``zsum`` ``[L, H, dh]`` (float64) and ``n_tokens`` ``[1]``."""
    L, H = adapter.n_layers, adapter.n_heads
    out = {k: np.zeros((len(chunk.ids), L, H)) for k in STATS}
    zsum: np.ndarray | None = None
    n_tok = 0
    from ..batching import group_by_budget

    for group in group_by_budget([len(r) for r in chunk.ids], ctx.batch_size, adapter.device):
        inp = inputs_of(adapter, [chunk.ids[i] for i in group])
        rec = [f"layers.{l}.attn.pattern" for l in range(L)] + E.z_sites(adapter)
        with torch.no_grad():
            fwd = adapter.forward(inp, record=rec)
        pat = torch.stack([fwd.cache[f"layers.{l}.attn.pattern"] for l in range(L)], 1).double().cpu().numpy()
        real = inp.attention_mask.bool()
        zs = np.stack(
            [fwd.cache[s][real.to(fwd.cache[s].device)].double().sum(0).cpu().numpy() for s in E.z_sites(adapter)]
        )
        zsum = zs if zsum is None else zsum + zs
        n_tok += int(real.sum())
        for k, i in enumerate(group):
            n = len(chunk.ids[i])
            st = pattern_stats(
                pat[k, :, :, :n, :n], np.array(chunk.ids[i]), adapter.explained_position(n), adapter.kind.causal
            )
            for name in STATS:
                out[name][i] = st[name]
    assert zsum is not None
    out["zsum"] = zsum
    out["n_tokens"] = np.array([n_tok])
    return out


def replacements(
    adapter: ModelAdapter, chunk: Chunk, z: dict[int, torch.Tensor], ctx: Context
) -> dict[int, torch.Tensor]:
    """Per layer, what each row's ablated head becomes ``[B, n, H, dh]`` (:func:`.atlas_effects.replacement`),
    from the chunk's clean ``attn.z`` ``{layer: [B, n, H, dh]}``."""
    if ctx.ablation != "resample":
        mean = torch.from_numpy(ctx.mean) if ctx.mean is not None else None
        return {l: E.replacement(ctx.ablation, zl, None if mean is None else mean[l]) for l, zl in z.items()}
    src = E.clean_run(adapter, inputs_of(adapter, chunk.source_ids))
    pos = [
        E.resample_positions(len(chunk.ids[b]), len(chunk.source_ids[b]), np.random.default_rng([ctx.seed, 2, s]))
        for b, s in enumerate(chunk.index)
    ]
    return {l: E.replacement("resample", zl, source=src.z[l], source_pos=pos) for l, zl in z.items()}


def estimate_chunk(adapter: ModelAdapter, chunk: Chunk, ctx: Context) -> dict[str, np.ndarray]:
    """``{"dlogp_est", "dla", "pred"}``: ``[B, L, H]`` and ``[B]`` for the chunk's sequences, from one
    forward + backward of the chunk (:func:`.atlas_effects.estimate_and_dla`)."""
    inp = inputs_of(adapter, chunk.ids)
    est, dla, pred = E.estimate_and_dla(adapter, inp, lambda z: replacements(adapter, chunk, z, ctx))
    return {"dlogp_est": est, "dla": dla, "pred": pred.cpu().numpy()}


def exact_chunk(adapter: ModelAdapter, chunk: Chunk, ctx: Context, pairs: list[tuple[int, int, int]]) -> dict[str, Any]:
    """Exact effects of ``pairs`` (row in the chunk, layer, head): ``{metric: [pair]}``. The clean run
    covers only the rows that have a pair."""
    if not pairs:
        return {}
    rows = sorted({b for b, _, _ in pairs})
    at = {b: k for k, b in enumerate(rows)}
    sub = Chunk(
        [chunk.index[b] for b in rows],
        [chunk.ids[b] for b in rows],
        [chunk.source_ids[b] for b in rows] if chunk.source_ids else [],
    )
    inp = inputs_of(adapter, sub.ids)
    clean = E.clean_run(adapter, inp)
    repl = replacements(adapter, sub, clean.z, ctx)
    return E.exact(adapter, inp, clean, repl, [(at[b], l, h) for b, l, h in pairs], ctx.batch_size)


def work(adapter: ModelAdapter, job: tuple[str, Chunk, list[tuple[int, int, int]]], ctx: Context) -> dict[str, Any]:
    """One chunk of one pass (``job = (pass, chunk, pairs)``): the function Ray actors run."""
    kind, chunk, pairs = job
    if kind == "stats":
        return stats_chunk(adapter, chunk, ctx)
    if kind == "estimate":
        return estimate_chunk(adapter, chunk, ctx)
    return exact_chunk(adapter, chunk, ctx, pairs)
