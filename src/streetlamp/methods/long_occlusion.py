"""Occlusion of long inputs by spans, without ``[layer, head, seq, seq]``.

Occluding the span ``[s, s + W)`` leaves positions ``< s`` unchanged, and on a causal LM their keys
and values depend on nothing after them. So the text runs once (keeping its KV cache) and each span's
perturbed copy runs only from ``s`` on, with the cache cropped to ``s`` (or, where the Scorer's cost model
finds it cheaper, packed with other spans' suffixes: :mod:`streetlamp.models.packed`) — the
:class:`~streetlamp.methods.scorer.Scorer`'s prefix reuse, the same code plain occlusion uses — and
every pass goes through the fused kernel (SDPA, :func:`~streetlamp.models.chunked.fused_long`): no
``[head, query, key]`` tensor at all. Removal follows plain occlusion exactly
(:class:`~streetlamp.methods.removal.Removal`, :func:`~streetlamp.methods.scorer.occlusion_replacement`):
``mask`` on a causal LM without [MASK] deletes; deleting on a causal LM replaces a removed first token by
the document-start token and never removes the explained (last) position; special tokens are not
occluded. A span's score is ``F(x) - F(x without the span's occludable tokens)``; with ``W = 1`` these
are plain occlusion's token scores.

Cost: span ``[s, s + W)`` recomputes ``n - s`` positions, so ``n / W`` spans cost about ``n / (2W)``
full passes. The default window (:func:`default_window`) makes :data:`DEFAULT_SPANS` spans.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter, Target
from ..models.chunked import fused_long
from .features import feature_groups
from .removal import Removal
from .scorer import REPLACEMENTS, Scorer, occlusion_replacement

DEFAULT_SPANS = 32  # the default window splits the text into this many spans (~16 full passes)


def default_window(n_tokens: int) -> int:
    """``ceil(n / 32)``: 32 spans, about 16 full forward passes whatever the length."""
    return max(1, math.ceil(n_tokens / DEFAULT_SPANS))


@dataclass
class SpanOcclusion:
    """Occlusion by spans of one text: ``spans`` ``[k, 2]`` (start, end), ``drop`` ``[k]`` = F(x) - F(x
    without span k), ``tokens`` ``[n]`` (each occluded token carries its span's drop, 0 elsewhere),
    ``groups`` ``[n]`` (span id per token, -1 where never removed)."""

    window: int
    spans: np.ndarray
    drop: np.ndarray
    tokens: np.ndarray
    groups: np.ndarray
    base: float
    index: int
    replacement: str
    rule: str | None
    positions_computed: int


def check_window(window: int | None, n_tokens: int) -> int:
    if window is None:
        return default_window(n_tokens)
    if not 1 <= window <= n_tokens:
        raise StreetlampError(
            f"--occlusion-window {window} out of range: the text has {n_tokens} tokens (1..{n_tokens})"
        )
    return int(window)


def span_groups(
    adapter: ModelAdapter, ids: list[int], tokens: list[str], window: int, rule: Removal
) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Span id per position (-1: special token or protected by the removal rule) and the spans that hold
    an occludable token, as ``(start, end)``; span ids are consecutive."""
    n = len(ids)
    single, _ = feature_groups(adapter, ids, tokens, "token", False, rule.protected(n))
    groups = np.full(n, -1, dtype=np.int32)
    spans: list[tuple[int, int]] = []
    for s in range(0, n, window):
        e = min(n, s + window)
        free = single[s:e] >= 0
        if free.any():
            groups[s:e][free] = len(spans)
            spans.append((s, e))
    return groups, spans


def occlusion_spans(
    adapter: ModelAdapter,
    inputs: Inputs,
    target: Target,
    window: int | None = None,
    replacement: str = "mask",
    fused: bool = True,
) -> SpanOcclusion:
    """Span occlusion of the one text in ``inputs`` (see the module docstring); ``fused=False`` runs the
    passes through the eager attention (the same numbers to float rounding; for tests)."""
    if len(inputs) != 1:
        raise StreetlampError("long-context occlusion takes one text")
    if replacement not in REPLACEMENTS:
        raise StreetlampError(f"unknown replacement {replacement!r}; choose one of {', '.join(REPLACEMENTS)}")
    n = inputs.lengths[0]
    window = check_window(window, n)
    used, tid, tok = occlusion_replacement(adapter, replacement)
    rule = Removal.of(adapter, tid)
    ids = inputs.input_ids[0, :n].cpu()
    groups, spans = span_groups(adapter, ids.tolist(), inputs.tokens[0], window, rule)
    rows = [rule.row(ids, groups == k) for k in range(len(spans))]
    with torch.no_grad(), fused_long(adapter) if fused else nullcontext():
        # budget n: a block of suffixes holds at most one full text's positions (memory of one pass)
        scorer = Scorer(adapter, ids, target, n, use_cache=True, desc="occlusion")
        values = scorer(rows)
    drop = scorer.base - values
    tokens = np.where(groups >= 0, drop[np.maximum(groups, 0)] if len(spans) else 0.0, 0.0)
    return SpanOcclusion(
        window,
        np.array(spans, dtype=np.int64).reshape(-1, 2),
        drop,
        tokens,
        groups,
        float(scorer.base),
        int(scorer.index[0]),
        used if used == "delete" else f"{used} ({tok})",
        rule.describe(adapter),
        int(scorer.n_positions),
    )
