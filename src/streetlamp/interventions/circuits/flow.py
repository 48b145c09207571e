"""Information-flow routes (Ferrando & Voita, EMNLP 2024) on the circuit graph: contribution-based edge
importance from one clean forward, no corrupted input (METHODS.md §9).

ALTI's proximity (:func:`streetlamp.methods.context_mixing.l1_contributions`, Ferrando et al. 2022):
the share of a vector ``y = Σ_c t_c`` that a term ``t_c`` makes is
``max(0, ‖y‖₁ − ‖y − t_c‖₁)`` normalised over the terms. Top-down from the prediction, per position:

* the logits reader at the explained (last real) position has importance 1;
* a reader r at position s with importance ``R`` splits it over the writers whose outputs sum to its
  input (and the constant ``b_O`` terms, one more competitor): edge ``u -> r`` gets
  ``R · prox(z_u[s], x_r[s])``, and writer u's importance at s grows by it;
* a head's importance at query i goes to its value input at key j in proportion to
  ``prox(A[i, j] f_h(x_j), z_h[i])`` (``f_h(x_j) = v_j W_O,h``, the per-key terms of its output); a
  group's value reader collects its heads'; an MLP's importance at s goes to its input at s.

A head's query and key inputs move the attention weights, which a contribution decomposition holds
fixed: their edges score 0 (as in the paper, whose graph has no q/k edges). The edge score is the
importance summed over positions, in [0, 1] (a share of the prediction, not in the metric's units; the
circuit ranks by it like any score). The paper's route: :func:`route` keeps the edges whose importance
reaches a threshold τ, top-down from the logits.
"""

from __future__ import annotations

import torch

from ...methods.context_mixing import l1_contributions
from .blocks import Blocks
from .forward import run_graph
from .scores import EdgeScores
from .tasks import PairSet


def _shares(t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """ALTI proximity shares ``[s, n]`` of terms ``t`` ``[s, n, d]`` summing to ``y`` ``[s, d]``."""
    c = l1_contributions(t, y)
    return c / c.sum(-1, keepdim=True).clamp_min(1e-300)


@torch.no_grad()
def _one(blocks: Blocks, ids: torch.Tensor, am: torch.Tensor) -> torch.Tensor:
    """Per-edge importance ``[R, U]`` of one unpadded prompt (``ids`` ``[1, s]``)."""
    g = blocks.graph
    with torch.no_grad():
        run = run_graph(blocks, ids, am)
    z = run.writers[0]  # [s, U, d]
    s, U, _ = z.shape
    dt = z.dtype
    const = torch.zeros(s, z.shape[-1], dtype=dt, device=z.device)
    consts = []  # the b_O sum before each layer's attention and MLP readers
    for l in range(g.n_layers):
        consts.append(const.clone())
        b = blocks.out_bias(l)
        if b is not None:
            const = const + b.to(dt)
        consts.append(const.clone())
    consts.append(const)
    out = torch.zeros(g.n_readers, g.n_writers, dtype=dt, device=z.device)
    w_imp = torch.zeros(s, U, dtype=dt, device=z.device)  # writers' importance per position
    r_imp = torch.zeros(g.n_readers, s, dtype=dt, device=z.device)
    r_imp[g.logits_reader, s - 1] = 1.0

    def split(reader: int, stage: int) -> None:
        n = g.n_upstream(reader)
        terms = torch.cat([z[:, :n], consts[stage][:, None]], 1)  # the writers, then the constant
        share = _shares(terms, terms.sum(1))[:, :n]  # [s, n]
        e = r_imp[reader][:, None] * share
        out[reader, :n] = e.sum(0)
        w_imp[:, :n] += e

    split(g.logits_reader, 2 * g.n_layers)
    emb = run.writers[:, :, 0]
    for l in reversed(range(g.n_layers)):
        mr = g.mlp_reader(l)
        r_imp[mr] = w_imp[:, g.layer_start(l) + blocks.H]
        split(mr, 2 * l + 1)
        # the heads: importance at query i -> the value readers at the keys j
        rows = g.attn_readers(l)
        x = run.readers[2 * l][0]  # [s, H + 2 KV, d]: every reader of the layer reads the same stream here
        H, KV = blocks.H, blocks.KV
        with torch.no_grad():
            probs, fv = blocks.attention_parts(
                l,
                x[None, :, :H],
                x[None, :, H : H + KV],
                x[None, :, H + KV :],
                blocks.allowed(l, emb, am.to(z.device)),
                blocks.rotary(emb, l),
            )
        G = H // KV
        p = probs[0].reshape(H, s, s)  # [head, query, key]
        f = fv[0].permute(1, 2, 0, 3).reshape(H, s, -1)  # [head, key, d]
        h0 = g.layer_start(l)
        for h in range(H):
            t = p[h][:, :, None] * f[h][None]  # [query, key, d]
            share = _shares(t, t.sum(1))  # [query, key]
            r_imp[rows.start + H + KV + h // G] += (w_imp[:, h0 + h][:, None] * share).sum(0)
        for gi in range(KV):
            split(rows.start + H + KV + gi, 2 * l)
    return out


def flow_routes(blocks: Blocks, pairs: PairSet, ablation: str = "patch", metric: str = "logit_diff") -> EdgeScores:
    """Information-flow edge importance of every edge, per prompt (the clean prompts only). The scores use
    neither ``ablation`` nor ``metric``: they label how the circuits they rank are to be ablated and measured."""
    g = blocks.graph
    ids, am = pairs.clean.input_ids, pairs.clean.attention_mask
    parts = []
    for i in range(len(pairs)):
        n = int(am[i].sum())
        parts.append(_one(blocks, ids[i : i + 1, :n], am[i : i + 1, :n]).double().cpu())
    s = torch.stack(parts).masked_fill(~g.valid(), float("nan"))
    return EdgeScores("flow-routes", s, ablation, metric)


def route(blocks: Blocks, scores: EdgeScores, threshold: float = 0.04) -> torch.Tensor:
    """The paper's route ``[R, U]`` bool: edges whose mean importance reaches ``threshold``, kept only
    where they lead to the logits through kept edges (top-down, as the importance was propagated)."""
    from .faithfulness import prune

    m = torch.nan_to_num(scores.mean) >= threshold
    return prune(blocks.graph, m)
