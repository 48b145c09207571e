"""The one attention mask rule: causal, sliding window, offset.

Query ``i`` stands at position ``i + offset`` among the keys (``offset``: the positions a KV cache holds
before the queries; 0 when queries and keys are the same positions). It may see key ``j``

* causal: ``j <= i + offset``; bidirectional: every key;
* with a window ``w``: causal also ``j > i + offset - w`` (the last ``w`` positions, itself included),
  bidirectional ``|i + offset - j| < w``.

The eager attention path (when no mask arrives), the fused kernel and the chunked pass all take their
masks from :func:`allowed`; the chunked pass also skips what the rule masks anyway (:func:`key_range`,
:func:`mask_bands`).
"""

from __future__ import annotations

import torch


def allowed(
    r0: int, r1: int, k0: int, k1: int, causal: bool, window: int | None, device: torch.device, offset: int = 0
) -> torch.Tensor:
    """``[r1 - r0, k1 - k0]`` bool: which keys ``k0..k1-1`` queries ``r0..r1-1`` may see (one text, no padding)."""
    i = torch.arange(r0, r1, device=device)[:, None] + offset
    j = torch.arange(k0, k1, device=device)[None, :]
    ok = j <= i if causal else torch.ones(r1 - r0, k1 - k0, dtype=torch.bool, device=device)
    if window:
        ok = ok & (j > i - int(window)) if causal else ok & ((i - j).abs() < int(window))
    return ok


def rule_mask(q_len: int, k_len: int, causal: bool, window: int | None, device: torch.device) -> torch.Tensor | None:
    """The rule's ``[1, 1, query, key]`` mask for ``q_len`` queries that are the last of ``k_len`` positions,
    or None where it masks nothing (bidirectional without a window, or one causal query without one)."""
    if not window and not (causal and q_len > 1):
        return None
    return allowed(0, q_len, 0, k_len, causal, window, device, offset=k_len - q_len)[None, None]


def key_range(r0: int, r1: int, n: int, causal: bool, window: int | None) -> tuple[int, int]:
    """Keys k0..k1-1 that queries r0..r1-1 (offset 0, ``n`` positions) may see at all (causal: none after
    r1 - 1; a window: none before r0 - window + 1); the probabilities outside are exactly 0."""
    w = window or n
    k0 = max(0, r0 - w + 1)
    return k0, (r1 if causal else min(n, r1 + w - 1))


def mask_bands(r0: int, r1: int, k0: int, k1: int, causal: bool, window: int | None) -> list[tuple[int, int]]:
    """Key ranges ``[a, b)`` inside ``[k0, k1)`` where some query r0..r1-1 (offset 0) may have a masked key;
    every key outside them is allowed for every query of the chunk (so only these columns are masked).
    Causal: keys after the first query (``j > r0``); a window ``w``: keys before ``r1 - w`` (``j <= i - w``)
    and, bidirectional, from ``r0 + w`` on (``j >= i + w``)."""
    bands = []
    if window:
        bands.append((k0, min(k1, r1 - int(window))))
    if causal:
        bands.append((max(k0, r0 + 1), k1))
    elif window:
        bands.append((max(k0, r0 + int(window)), k1))
    return [(a, b) for a, b in bands if a < b]
