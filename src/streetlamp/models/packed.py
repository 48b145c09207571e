"""Packed suffixes after one cached prefix (causal LMs): several perturbed rows in one batch row.

A perturbed copy of a text that first differs from it at position ``p`` needs only its *suffix* (positions
``>= p``) computed: its keys and values below ``p`` are the original text's (a causal model's positions
depend on nothing after them). :meth:`~streetlamp.models.adapter.ModelAdapter.prefix_forward` batches
suffixes that start at one shared position; here suffixes that start at different positions share one
batch row, end to end, so that a long suffix and a few short ones fill a rectangle that would otherwise
be mostly padding (each batch row is one more forward's worth of rows, and a pass of few tokens is
dominated by reading the weights).

Each packed token carries its true position (``position_ids``: RoPE and learned positions are those of its
own perturbed text) and a 4-D boolean mask says what it sees: the original's cached keys ``[0, p)`` of its
own segment, and the tokens of its own segment up to itself. The mask replaces the model's own masks
(transformers uses a 4-D mask as given), so a sliding window is not applied: :func:`packable` allows
packing only when the window (if any) covers the whole text, where it masks nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from . import readout

if TYPE_CHECKING:
    from .adapter import ModelAdapter


def packable(adapter: ModelAdapter, n_tokens: int) -> bool:
    """Whether packed suffixes compute exactly what the model computes on texts of ``n_tokens``: no sliding
    window, or one at least as long as the text (it then masks nothing)."""
    windows = [readout.sliding_window(adapter, layer) for layer in range(adapter.n_layers)]
    return all(w is None or w >= n_tokens for w in windows)


def packed_forward(
    adapter: ModelAdapter,
    ids: torch.Tensor,
    cache: list,
    segments: Sequence[Sequence[tuple[int, torch.Tensor]]],
) -> torch.Tensor:
    """Logits ``[segments, vocab]`` after the last token of each segment, in the order given.

    ``ids``: the original text (1-D); ``cache``: its per-layer ``(keys, values)`` from
    :meth:`~streetlamp.models.adapter.ModelAdapter.prefix_forward` with ``keep_cache``; ``segments``: one list
    per batch row of ``(p, suffix)``: a perturbed text equal to ``ids[:p]`` followed by ``suffix``.
    """
    from transformers import DynamicCache

    from .adapter import cache_keyword

    dev = adapter.device
    rows = len(segments)
    start = max(p for row in segments for p, _ in row)  # the cached prefix every row shares
    width = max(sum(len(s) for _, s in row) for row in segments)
    tok = torch.zeros(rows, width, dtype=torch.long)
    pos = torch.zeros(rows, width, dtype=torch.long)
    allowed = torch.zeros(rows, width, start + width, dtype=torch.bool)
    # padding sees only itself (a finite softmax; nothing real reads it)
    allowed[:, torch.arange(width), start + torch.arange(width)] = True
    read_row, read_col = [], []
    for r, row in enumerate(segments):
        o = 0
        for p, s in row:
            L = len(s)
            tok[r, o : o + L] = s
            pos[r, o : o + L] = torch.arange(p, p + L)
            allowed[r, o : o + L, :p] = True  # the original's cached prefix
            allowed[r, o : o + L, start + o : start + o + L] = torch.tril(torch.ones(L, L, dtype=torch.bool))
            o += L
            read_row.append(r)
            read_col.append(o - 1)
    past = None
    if start:
        past = DynamicCache(
            ddp_cache_data=[
                (k[:, :, :start].expand(rows, -1, -1, -1), v[:, :, :start].expand(rows, -1, -1, -1)) for k, v in cache
            ]
        )
    base = adapter.hf_model.base_model
    name = cache_keyword(type(base))  # type: ignore[arg-type]  # classes are hashable
    with torch.no_grad():
        out = base(
            input_ids=tok.to(dev),
            attention_mask=allowed[:, None].to(dev),
            position_ids=pos.to(dev),
            use_cache=past is not None,
            **{name: past},
        )
        hidden = out.last_hidden_state[torch.tensor(read_row, device=dev), torch.tensor(read_col, device=dev)]
        logits = readout.lm_head_logits(adapter, hidden)  # with Gemma 2/3's final soft-cap
    return logits
