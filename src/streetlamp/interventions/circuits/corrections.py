"""AtP*'s corrections of first-order edge scores (Kramár et al. 2024, "AtP*"; METHODS.md §9).

* **QK fix** (``eap_qk``): EAP linearises a query or key change through the softmax, which fails where
  the softmax is saturated (its gradient vanishes while a real change of the key moves the pattern
  from one position to another). For an edge ``u -> r`` into a query or key input the fix recomputes the
  attention pattern exactly with that one input patched, ``A' = softmax(q', k)`` (or ``(q, k')``; the
  norm, projection and RoPE recomputed) and keeps the linearisation only after it:
  ``ĉ = Σ_{i,j} (A'[i, j] - A[i, j]) ∂m/∂A[i, j]``, with ``∂m/∂A[i, j] = ∂m/∂z_h[i] · f_h(x_j)``
  (the head output is linear in its pattern; ``∂m/∂z_h`` is the sum of the gradients at every reader
  the head feeds). A key/value group's edge sums its heads. Every other edge keeps its EAP score.
* **GradDrop** (``graddrop``): against cancellation between paths, L more backward passes, the ℓ-th with
  the gradient through layer ℓ's blocks (its heads and MLP) dropped, the residual skip kept:
  ``ĉ_GD(e) = 1/(L−1) Σ_ℓ |ĉ_{EAP+GDℓ}(e)|`` (L ≥ 2; one layer: |EAP|). Unsigned: a ranking score.
"""

from __future__ import annotations

import torch

from ...errors import StreetlampError
from .blocks import Blocks
from .forward import reader_slices, run_graph
from .scores import EdgeScores, delta_of, finish_scores, gradient_scores, metric_values, per_batch
from .tasks import PairSet


def _writer_grads(blocks: Blocks, grads: list[torch.Tensor | None], like: torch.Tensor) -> torch.Tensor:
    """``∂m/∂z_u`` ``[b, s, U, d]``: each writer's gradient, the sum over the readers it feeds."""
    g = blocks.graph
    out = torch.zeros_like(like)
    for rr, gr in zip(reader_slices(blocks), grads):
        if gr is not None:
            out[:, :, : g.n_upstream(rr.start)] += gr.sum(2)[:, :, None]
    return out


def _qk_batch(blocks: Blocks, p: PairSet, ablated: torch.Tensor, metric: str) -> torch.Tensor:
    g = blocks.graph
    H, KV = blocks.H, blocks.KV
    G = H // KV
    run = run_graph(blocks, p.clean.input_ids, p.clean.attention_mask)
    m = metric_values(run.logits, p.answer, p.wrong, metric).sum()
    live = [x.requires_grad for x in run.readers]
    got = iter(torch.autograd.grad(m, [x for x, ok in zip(run.readers, live) if ok], allow_unused=True))
    grads = [next(got) if ok else None for ok in live]
    z = run.writers.detach()
    delta = delta_of(p, ablated, z)
    gz = _writer_grads(blocks, grads, z)
    out = gradient_scores(blocks, p, ablated, metric, False, delta=delta).detach()
    emb = z[:, :, 0]
    am = p.clean.attention_mask.to(z.device)
    with torch.no_grad():
        for l in range(g.n_layers):
            x = run.readers[2 * l].detach()[:, :, 0]  # [b, s, d]: the layer's stream
            b, s, d = x.shape
            n = g.layer_start(l)
            allowed = blocks.allowed(l, emb, am)
            cs = blocks.rotary(emb, l)
            xh = x[:, :, None].expand(b, s, H, d)
            xg = x[:, :, None].expand(b, s, KV, d)
            q, k = blocks.queries_keys(l, xh, xg, cs)
            A = blocks.pattern(l, q, k, allowed)  # [b, KV, G, query, key]
            fv = blocks.transformed_values(l, xg)  # [b, s(key), KV, G, d]
            gh = gz[:, :, g.layer_start(l) : g.layer_start(l) + H].reshape(b, s, KV, G, d)
            dA = torch.einsum("bqkgd,bskgd->bkgqs", gh, fv)  # ∂m/∂A
            rows = g.attn_readers(l)
            for u in range(n):
                du = delta[:, :, u]
                q2, _ = blocks.queries_keys(l, (x + du)[:, :, None].expand(b, s, H, d), xg, cs)
                _, k2 = blocks.queries_keys(l, xh, (x + du)[:, :, None].expand(b, s, KV, d), cs)
                cq = ((blocks.pattern(l, q2, k, allowed) - A) * dA).sum((-1, -2))  # [b, KV, G]
                ck = ((blocks.pattern(l, q, k2, allowed) - A) * dA).sum((-1, -2, -3))  # [b, KV]
                out[:, rows.start : rows.start + H, u] = cq.reshape(b, H)
                out[:, rows.start + H : rows.start + H + KV, u] = ck
    return out


def eap_qk(
    blocks: Blocks,
    pairs: PairSet,
    metric: str = "logit_diff",
    ablation: str = "patch",
    batch_size: int = 16,
    reference: PairSet | None = None,
) -> EdgeScores:
    """EAP with AtP*'s QK fix on every query and key edge (module docstring)."""

    def score(p: PairSet, ab: torch.Tensor) -> torch.Tensor:
        return _qk_batch(blocks, p, ab, metric)

    return finish_scores(
        blocks, per_batch(blocks, pairs, ablation, batch_size, reference, score), "eap-qk", ablation, metric
    )


def graddrop(
    blocks: Blocks,
    pairs: PairSet,
    metric: str = "logit_diff",
    ablation: str = "patch",
    batch_size: int = 16,
    reference: PairSet | None = None,
    per_layer: bool = False,
) -> EdgeScores | list[EdgeScores]:
    """GradDrop scores (module docstring); ``per_layer``: the L signed gradient-dropped EAP scores instead."""
    g = blocks.graph
    L = g.n_layers
    if L < 1:
        raise StreetlampError("GradDrop needs at least one layer")

    def score(p: PairSet, ab: torch.Tensor) -> list[torch.Tensor]:
        with torch.no_grad():
            clean = run_graph(blocks, p.clean.input_ids, p.clean.attention_mask).writers
        delta = delta_of(p, ab, clean)
        out = []
        for ell in range(L):
            s = g.layer_start(ell)
            over = {
                f"attn{ell}": clean[:, :, s : s + blocks.H],
                f"mlp{ell}": clean[:, :, g.mlp_writers(ell)],
            }
            out.append(gradient_scores(blocks, p, ab, metric, False, over, delta=delta).detach())
        return out

    chunks = per_batch(blocks, pairs, ablation, batch_size, reference, score)
    each = [finish_scores(blocks, [c[ell] for c in chunks], f"eap-gd{ell}", ablation, metric) for ell in range(L)]
    if per_layer:
        return each
    total = sum(e.per_prompt.abs() for e in each)
    assert isinstance(total, torch.Tensor)
    return EdgeScores("graddrop", total / max(1, L - 1), ablation, metric)
