"""The circuit forward: every reader gets its own input, so single edges can be ablated.

For writers ``z_u`` and ablated values ``z̃_u`` (the corrupted run's outputs for patching, a mean, or
zero), reader ``r``'s input is

    x_r = c_r + Σ_{u before r} [ M_ru z_u + (1 - M_ru) z̃_u ]

with ``M`` the edge mask (1 = the edge is in the circuit) and ``c_r`` the constants before ``r``
(the ``b_O`` biases). ``M = 1`` is the model's own forward (every reader reads the same stream);
``M = 0`` feeds every reader its ablated input. A batch row may carry its own mask (exact patching
puts one edge per row). Without gradients, a mask that ablates few edges (at most one in eight of a reader
group's) is summed the other way round, ``x_r = c_r + Σ_u z_u + Σ_{M_ru ≠ 1} (1 - M_ru)(z̃_u - z_u)``:
the same inputs to rounding, without the dense ``[b, s, writers, d]`` product per reader group. ``override`` replaces a writer block's outputs by given values (EAP-IG's
interpolations).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .blocks import Blocks


@dataclass
class GraphRun:
    logits: torch.Tensor  # [b, n_outputs] explained logits
    writers: torch.Tensor  # [b, s, U, d] every writer's output
    # per layer [b, s, H + 2 KV, d] (q, k, v) and [b, s, 1, d] (mlp; with expert nodes [b, s, 1 + E (+ 1), d]:
    # router, experts, shared expert); then the logits'
    readers: list[torch.Tensor]


def run_graph(
    blocks: Blocks,
    ids: torch.Tensor,
    attention_mask: torch.Tensor,
    ablated: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    override: dict[str, torch.Tensor] | None = None,
) -> GraphRun:
    """One circuit forward. ``ids``, ``attention_mask`` ``[b, s]`` (right-padded); ``ablated``
    ``[b or 1, s or 1, U, d]`` (needed when ``mask`` is given); ``mask`` ``[b or 1, R, U]`` (None: every
    edge present); ``override``: block name (``embed``, ``attn{l}``, ``mlp{l}``) -> its outputs
    ``[b, s, n, d]``. The reader inputs are returned (non-leaf tensors: take gradients w.r.t. them)."""
    g, adapter = blocks.graph, blocks.adapter
    dev = adapter.device
    ids, am = ids.to(dev), attention_mask.to(dev)
    override = override or {}
    emb = blocks.embed(ids)
    b, s, d = emb.shape
    outs: list[torch.Tensor] = [override.get("embed", emb[:, :, None])]  # pieces [b, s, n, d], writer order
    const = torch.zeros_like(emb)
    resid = outs[0].sum(2)  # every-edge path: the stream itself (the sum of the writers so far)
    readers: list[torch.Tensor] = []
    # masked path without gradients: z_u - z̃_u of the writers so far, writer-major [b, U, s, d], written once
    # per writer (so each reader group's mix is one batched matrix product on a slice, no copy)
    buf: torch.Tensor | None = None
    if mask is not None:
        assert ablated is not None, "an edge mask needs the ablated writer values"
        # masks and ablated values are built beside the graph (on the CPU): bring both to the activations
        ablated = ablated.to(emb.device, emb.dtype)
        mask = mask.to(emb.device, emb.dtype)
        if not torch.is_grad_enabled():
            buf = torch.empty(b, g.n_writers, s, d, dtype=emb.dtype, device=emb.device)
            buf[:, :1] = (outs[0] - ablated[:, :, :1]).permute(0, 2, 1, 3)
        ab_sum = torch.cumsum(ablated.expand(b, s, -1, -1), 2)  # Σ_{u < n} z̃_u = ab_sum[:, :, n - 1]
    done = 1  # writers computed so far

    def add(piece: torch.Tensor) -> None:
        nonlocal resid, done
        outs.append(piece)
        resid = resid + piece.sum(2)
        if buf is not None:
            assert ablated is not None
            k = piece.shape[2]
            buf[:, done : done + k] = (piece - ablated[:, :, done : done + k]).permute(0, 2, 1, 3)
        done += piece.shape[2]

    def inputs(rows: range, n: int) -> torch.Tensor:
        """Inputs ``[b, s, len(rows), d]`` of readers ``rows``, each reading writers ``0..n-1``."""
        assert n == done
        if mask is None:
            return (resid + const)[:, :, None].expand(-1, -1, len(rows), -1)
        assert ablated is not None
        m = mask[:, rows.start : rows.stop, :n]
        if buf is not None:
            off = (m != 1).expand(b, -1, -1)
            if int(off.sum()) * 8 <= b * len(rows) * n:  # few edges ablated (exact patching: one per row)
                return sparse(off, m.expand(b, -1, -1), n, len(rows))
        base = (const + ab_sum[:, :, n - 1])[:, :, None]
        if buf is not None:  # Σ_u M_ru (z_u - z̃_u) as [b, r, n] @ [b, n, s·d]
            mix = torch.matmul(m.expand(b, -1, -1), buf[:, :n].reshape(b, n, s * d))
            return base + mix.view(b, len(rows), s, d).permute(0, 2, 1, 3)
        diff = torch.cat(outs, 2) - ablated[:, :, :n]
        return base + torch.einsum("bsud,bru->bsrd", diff, m)

    def sparse(off: torch.Tensor, m: torch.Tensor, n: int, r: int) -> torch.Tensor:
        """The same inputs as the dense sum, for a mask that ablates few edges: the stream (every edge)
        plus ``(1 - M_ru)(z̃_u - z_u)`` at reader r for each ablated edge (no ``[b, s, n, d]`` product)."""
        assert ablated is not None and buf is not None
        bi, ri, ui = off.nonzero(as_tuple=True)
        x = (resid + const)[:, None].expand(b, r, s, d).clone()  # [b, r, s, d]
        if len(bi):
            w = (1 - m[bi, ri, ui])[:, None, None]
            x.index_put_((bi, ri), w * -buf[bi, ui], accumulate=True)
        return x.permute(0, 2, 1, 3)

    H, KV = blocks.H, blocks.KV
    for l in range(g.n_layers):
        n = g.layer_start(l)
        rows = g.attn_readers(l)
        x = inputs(rows, n)
        allowed = blocks.allowed(l, emb, am)
        heads = blocks.attention(l, x[:, :, :H], x[:, :, H : H + KV], x[:, :, H + KV :], allowed, blocks.rotary(emb, l))
        add(override.get(f"attn{l}", heads))
        bias = blocks.out_bias(l)
        if bias is not None:
            const = const + bias.to(const.dtype)
        xm = inputs(g.mlp_readers(l), n + H)
        readers += [x, xm]
        add(override.get(f"mlp{l}", blocks.mlp_nodes(l, xm)))
    xl = inputs(range(g.logits_reader, g.logits_reader + 1), g.n_writers)
    readers.append(xl)
    logits = blocks.readout(xl[:, :, 0], am)
    return GraphRun(logits, torch.cat(outs, 2), readers)


def reader_slices(blocks: Blocks) -> list[range]:
    """The reader indices of each tensor in :attr:`GraphRun.readers`."""
    g = blocks.graph
    out: list[range] = []
    for l in range(g.n_layers):
        out += [g.attn_readers(l), g.mlp_readers(l)]
    return out + [range(g.logits_reader, g.logits_reader + 1)]
