"""Rollout and attention flow of the explained row from a long-context recording, without
``[layer, head, seq, seq]`` in memory.

Both read the queries and keys a long recording stored (:class:`~streetlamp.models.chunked.QKStore`)
and recompute ``Â_l = 0.5·fuse_h A[l] + 0.5·I`` (rows renormalised; the formula of
:func:`~streetlamp.methods.rollout.residual_attention`) one query chunk at a time.

* :func:`rollout_row`: row ``pos`` of ``R = Â_L ⋯ Â_1`` as ``e_posᵀ Â_L ⋯ Â_1``, evaluated right to left:
  ``v ← vᵀ Â_l`` for l = L..1, each layer read in query chunks, and only the chunks where ``v`` is
  nonzero (for a causal model the top layer needs the explained row alone). Memory: one chunk
  ``[head, chunk, seq]`` plus two float64 vectors of length seq.
* :func:`flow_row`: the max-flow needs every capacity at once (``[layer, seq, seq]`` float64 plus
  the flow of the same size), and a row costs about ``L·S³`` (see docs/attention-methods.md);
  :func:`check_flow_size` refuses beyond :data:`FLOW_MAX_TOKENS_AT_30_LAYERS`'s cost.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..errors import StreetlampError
from ..models.chunked import QKStore, Scratch, chunk_rows, pattern_block
from .maxflow import layered_max_flow

FUSIONS = ("mean", "max", "min")
# A flow row costs ~L·S³ (measured: 0.7 s at 128 tokens, 12 layers; ×5-8 per doubling of S): at
# 30 layers 1,024 tokens is ~15 minutes on 2 cores, 2,048 about two hours. The cap is that cost.
FLOW_MAX_TOKENS_AT_30_LAYERS = 1024
FLOW_MAX_WORK = 30 * FLOW_MAX_TOKENS_AT_30_LAYERS**3
FLOW_MAX_BYTES = 8 << 30  # capacities + flow, float64


def _fuse(p: torch.Tensor, fusion: str) -> torch.Tensor:
    """Head fusion in float64 without a float64 copy of ``[head, rows, key]`` (max/min are exact in any dtype)."""
    if fusion == "mean":
        return p.sum(0, dtype=torch.float64) / p.shape[0]
    return (p.amax(0) if fusion == "max" else p.amin(0)).double()


def residual_block(p: torch.Tensor, r0: int, k0: int, fusion: str) -> torch.Tensor:
    """Rows r0.. of ``Â = 0.5·fuse_h A + 0.5·I`` (renormalised), float64, from probabilities ``[head, rows,
    keys k0..]`` (the diagonal key r0 + i lies inside the block: every query sees itself)."""
    a = 0.5 * _fuse(p, fusion)
    idx = torch.arange(a.shape[0], device=a.device)
    a[idx, r0 - k0 + idx] += 0.5
    return a / a.sum(-1, keepdim=True)


def residual_rows(p: torch.Tensor, r0: int, fusion: str) -> torch.Tensor:
    """Rows r0.. of ``Â`` from probabilities over every key ``[head, rows, key]``."""
    return residual_block(p, r0, 0, fusion)


PIECE = 64  # rows of a block per matrix-vector product; the products are summed in float64


def mean_step(block: torch.Tensor, w: torch.Tensor, lo: int, k0: int, nxt: torch.Tensor) -> None:
    """``nxt += wᵀ Â`` for rows lo.. of mean fusion, without forming ``Â``: with ``u = w / rowsum(Â)``,
    ``wᵀ Â = 0.5/H · Σ_h uᵀ A_h + 0.5·u`` (the identity's half lands on the diagonal). ``uᵀ A`` runs in
    the block's dtype :data:`PIECE` (head, row) pairs at a time and the pieces are summed in float64: one
    float32 product over a whole block lost ~2e-6 of the row's mass per layer (5e-5 after 30 layers);
    this way ~1e-9, at a fifth of the cost of converting the block to float64."""
    h, r, kk = block.shape
    rowsum = 0.5 * block.sum(-1).sum(0, dtype=torch.float64) / h + 0.5  # residual_block's a.sum(-1)
    u = w / rowsum
    dt = torch.promote_types(block.dtype, torch.float32)  # bfloat16/float16 blocks: products in float32
    uh = u.to(dt).repeat(h)  # [head * row], the block's (head, row) order
    flat = block.reshape(h * r, kk)
    x = torch.zeros(kk, dtype=torch.float64, device=block.device)
    for p0 in range(0, h * r, PIECE):
        x += (uh[p0 : p0 + PIECE] @ flat[p0 : p0 + PIECE].to(dt)).double()
    nxt[k0 : k0 + kk] += (0.5 / h) * x
    nxt[lo : lo + r] += 0.5 * u


def rollout_row(
    store: QKStore,
    pos: int,
    fusion: str = "mean",
    chunk: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> np.ndarray:
    """Row ``pos`` of the rollout ``R = Â_L ⋯ Â_1`` ``[seq]`` float64, from the stored queries and keys
    (``progress(layer)`` is called after each layer, top to bottom)."""
    if fusion not in FUSIONS:
        raise StreetlampError(f"unknown head fusion {fusion!r}; choose one of {', '.join(FUSIONS)}")
    store._check([pos], "row")
    n = store.n_tokens
    dev = store.device or torch.device("cpu")
    v = torch.zeros(n, dtype=torch.float64, device=dev)
    v[pos] = 1.0
    scratch = Scratch()
    for layer in reversed(range(store.n_layers)):
        q, k, rule = store.load(layer)
        step = chunk or chunk_rows(q.shape[0], n, max(4, q.element_size()))
        nxt = torch.zeros(n, dtype=torch.float64, device=dev)
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            w = v[r0:r1]
            if not torch.any(w != 0):
                continue
            nz = torch.nonzero(w).flatten().tolist()
            lo, hi = r0 + int(nz[0]), r0 + int(nz[-1]) + 1  # only the rows that carry weight
            block, k0 = pattern_block(q, k, lo, hi, rule, scratch)  # only the keys these rows can see
            if fusion == "mean":
                mean_step(block, w[lo - r0 : hi - r0], lo, k0, nxt)
            else:
                a = residual_block(block, lo, k0, fusion)
                nxt[k0 : k0 + a.shape[-1]] += w[lo - r0 : hi - r0] @ a
        v = nxt
        if progress is not None:
            progress(layer)
    return v.cpu().numpy()


def check_flow_size(n_layers: int, n_tokens: int) -> None:
    """Refuse a flow row whose max-flow graph is past what this machine does in minutes (one line)."""
    work = n_layers * n_tokens**3
    need = 2 * n_layers * n_tokens * n_tokens * 8
    if work > FLOW_MAX_WORK or need > FLOW_MAX_BYTES:
        limit = int((FLOW_MAX_WORK / n_layers) ** (1 / 3))
        raise StreetlampError(
            f"attention flow: {n_tokens} tokens x {n_layers} layers is past the feasible max-flow size "
            f"(a row costs ~L*S^3: about {limit} tokens at this depth take ~15 minutes on 2 cores, the graph needs "
            f"{need / (1 << 30):.1f} GiB); use rollout for long inputs"
        )


def flow_row(store: QKStore, pos: int, fusion: str = "mean", chunk: int | None = None) -> np.ndarray:
    """Attention flow ``Flow[pos, :]`` ``[seq]`` float64, capacities recomputed chunk by chunk."""
    if fusion not in FUSIONS:
        raise StreetlampError(f"unknown head fusion {fusion!r}; choose one of {', '.join(FUSIONS)}")
    store._check([pos], "row")
    check_flow_size(store.n_layers, store.n_tokens)
    n = store.n_tokens
    caps = np.empty((store.n_layers, n, n), np.float64)
    for layer in range(store.n_layers):
        for r0, r1, p in store.chunks(layer, chunk):
            caps[layer, r0:r1] = residual_rows(p, r0, fusion).cpu().numpy()  # the max-flow runs on the CPU
    return layered_max_flow(caps, [pos])[0]
