"""Attention probabilities of query rows from stored queries and keys, under a layer's rule.

The arithmetic of the eager path (``softmax(cap(q kᵀ · scaling) + mask)`` in at least float32, masked cells
exactly 0), a chunk of query rows at a time: the long-context recorder (:mod:`streetlamp.models.chunked`)
runs it during the forward pass, and the stored recording (:class:`streetlamp.store.qk.QKStore`) runs the
same code on the stored queries and keys afterwards, so a row comes back bit for bit on the same machine.
The mask is the one rule of :mod:`streetlamp.models.masks`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .masks import allowed, key_range, mask_bands

# one chunk of scores and probabilities, [head, chunk, key], stays near this many bytes
CHUNK_BYTES = 64 << 20


@dataclass(frozen=True)
class LayerRule:
    """How one layer turns its queries and keys into probabilities."""

    scaling: float
    softcap: float | None
    causal: bool
    window: int | None  # causal: keys i-window+1..i; bidirectional: |i - j| < window
    groups: int  # query heads per key head (repeat_kv)


def repeat_heads(k: torch.Tensor, groups: int) -> torch.Tensor:
    """``[kv_head, pos, d]`` -> ``[kv_head * groups, pos, d]`` (the attention function's repeat_kv)."""
    if groups == 1:
        return k
    h, s, d = k.shape
    return k[:, None].expand(h, groups, s, d).reshape(h * groups, s, d)


def qk_matmul(q: torch.Tensor, kt: torch.Tensor, out: torch.Tensor) -> None:
    """``out = q @ kt`` (``[head, rows, d] @ [head, d, keys]``). On the CPU through numpy's BLAS: for this
    shape (inner dimension d_head, tens of thousands of keys) OpenBLAS ran 1.7-1.8x faster than torch's
    MKL on the AMD development machine (docs/measurements/longctx.md); elsewhere (other devices, bfloat16 or
    float16, which numpy lacks) torch's matmul."""
    cpu = out.device == torch.device("cpu")  # plain CPU memory (not a device that merely reports type cpu)
    if cpu and out.dtype in (torch.float32, torch.float64) and q.dtype == kt.dtype == out.dtype:
        np.matmul(q.detach().numpy(), kt.detach().numpy(), out=out.numpy())
    else:
        torch.matmul(q, kt, out=out)


class Scratch:
    """One reusable buffer for a chunk's scores/probabilities. A fresh ``[head, chunk, key]`` tensor per
    chunk costs more than the arithmetic (tens of MiB are mapped and page-faulted anew each time); the
    chunk is computed in place in this buffer instead. A block it returns is valid until the next call."""

    def __init__(self) -> None:
        self.buf: torch.Tensor | None = None

    def view(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        size = 1
        for x in shape:
            size *= x
        b = self.buf
        if b is None or b.dtype != dtype or b.device != device or b.numel() < size:
            b = self.buf = torch.empty(size, dtype=dtype, device=device)
        return b[:size].view(shape)


def pattern_block(
    q: torch.Tensor, k: torch.Tensor, r0: int, r1: int, rule: LayerRule, scratch: Scratch | None = None
) -> tuple[torch.Tensor, int]:
    """Probabilities ``[head, r1 - r0, k1 - k0]`` of query rows r0..r1-1 over the keys they can see
    (:func:`~streetlamp.models.masks.key_range`), and k0; queries ``q`` and repeated keys ``k`` are ``[head, pos, d]``. The
    eager path's arithmetic: ``softmax(cap(q kᵀ · scaling), masked)`` in at least float32. With
    ``scratch`` (float32/float64 models) the block is computed in place in its buffer, bit for bit the
    same numbers, and stays valid until the scratch's next use."""
    k0, k1 = key_range(r0, r1, k.shape[1], rule.causal, rule.window)
    kt = k[:, k0:k1].transpose(1, 2)
    if scratch is not None and q.dtype in (torch.float32, torch.float64):
        scores = scratch.view((q.shape[0], r1 - r0, k1 - k0), q.dtype, q.device)
        qk_matmul(q[:, r0:r1], kt, scores)
        scores.mul_(rule.scaling)
    else:
        scores = torch.matmul(q[:, r0:r1], kt) * rule.scaling
    if rule.softcap is not None:
        scores.div_(rule.softcap).tanh_().mul_(rule.softcap)
    low = torch.finfo(scores.dtype).min
    for a, b in mask_bands(r0, r1, k0, k1, rule.causal, rule.window):  # masked cells lie in these columns only
        ok = allowed(r0, r1, a, b, rule.causal, rule.window, q.device)
        scores[:, :, a - k0 : b - k0].masked_fill_(~ok, low)
    dtype = torch.promote_types(scores.dtype, torch.float32)
    if dtype == scores.dtype:
        return torch.softmax(scores, -1, out=scores), k0  # in place: each row's max and sum are read first
    return torch.softmax(scores, -1, dtype=dtype).to(q.dtype), k0


def pattern_rows(
    q: torch.Tensor, k: torch.Tensor, r0: int, r1: int, rule: LayerRule, scratch: Scratch | None = None
) -> torch.Tensor:
    """Probabilities ``[head, r1 - r0, key]`` of query rows r0..r1-1 over every key (zeros where masked)."""
    block, k0 = pattern_block(q, k, r0, r1, rule, scratch)
    out = torch.zeros(q.shape[0], r1 - r0, k.shape[1], dtype=block.dtype, device=block.device)
    out[:, :, k0 : k0 + block.shape[-1]] = block
    return out


def chunk_rows(n_heads: int, n_keys: int, element: int = 4) -> int:
    """Query rows per chunk so that ``[head, rows, key]`` scores stay near :data:`CHUNK_BYTES`."""
    return max(1, min(n_keys, CHUNK_BYTES // max(1, n_heads * n_keys * element)))
