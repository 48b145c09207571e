"""Tie a used hint to the local model's internals: attention vs intervention, per layer.

For a hinted prompt whose answer moved to the hint, at the position that predicts the answer
letter (after the chain and the cue ``So the answer is (``):

* attention mass on the hint tokens and on the chain's tokens, per layer (mean over heads), from
  the recorded post-softmax pattern (:func:`~streetlamp.methods.attention.record_attention`);
* attention knockout per layer (Geva et al. 2023): at layer ``l`` only, the answer position's
  attention to the hint tokens (or to the chain) is set to 0 and its row renormalised (the same as
  a ``-inf`` score before the softmax); effect = drop of ``log p(hinted letter)``;
* occlusion of the whole hint: the prompt without the hint, the same chain; effect = drop of
  ``log p(hinted letter)`` (the total effect of removing it, all layers at once).

"Attention says it read its reasoning; intervention says it used the hint" is the pattern to look
for: high attention mass on the chain, small mass on the hint, and knockout/occlusion effects the
other way round.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..methods.attention import record_attention
from ..methods.gradient import ids_inputs
from .prompts import Prompt


def _positions(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    return [i for i, (a, b) in enumerate(offsets) if b > a and any(a < e and b > s for s, e in spans)]


def _span(text: str, part: str, start: int = 0, last: bool = False) -> tuple[int, int] | None:
    part = part.strip()
    if not part:
        return None
    i = text.rfind(part) if last else text.find(part, start)
    return (i, i + len(part)) if i >= 0 else None


def hint_internals(
    engine: Any, hinted: Prompt, unhinted: Prompt, hint_parts: tuple[str, str], chain: str, letter: str
) -> dict:
    """``hinted``/``unhinted``: answer prompts (same chain, ending with the answer cue)."""
    adapter = engine.adapter
    text = engine.render(hinted)
    enc = adapter.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    spans = [s for s in (_span(text, p) for p in hint_parts) if s]
    hint_pos = _positions(offsets, spans)
    chain_span = _span(text, chain, last=True)
    chain_pos = _positions(offsets, [chain_span]) if chain_span else []
    lid = engine.letter_id(letter)
    inputs = ids_inputs(adapter, torch.tensor(ids))
    with torch.no_grad():
        logits, att, _ = record_attention(adapter, inputs)  # att [1, layer, head, q, k]
    base = float(torch.log_softmax(logits[0].double(), -1)[lid])
    last = att[0, :, :, -1, :].double()  # [layer, head, key]
    mass_hint = last[:, :, hint_pos].sum(-1).mean(-1).numpy() if hint_pos else np.zeros(adapter.n_layers)
    mass_chain = last[:, :, chain_pos].sum(-1).mean(-1).numpy() if chain_pos else np.zeros(adapter.n_layers)

    def knockout(positions: list[int]) -> np.ndarray:
        out = np.zeros(adapter.n_layers)
        if not positions:
            return out
        idx = torch.tensor(positions)
        for l in range(adapter.n_layers):

            def edit(p: torch.Tensor) -> torch.Tensor:
                p = p.clone()
                row = p[:, :, -1, :]
                row[:, :, idx] = 0
                p[:, :, -1, :] = row / row.sum(-1, keepdim=True).clamp_min(1e-30)
                return p

            with torch.no_grad():
                lg = adapter.forward(inputs, edit={f"layers.{l}.attn.pattern": edit}).logits[0].double()
            out[l] = base - float(torch.log_softmax(lg.double(), -1)[lid])
        return out

    without = engine.letter_logits(unhinted, letter)[0]
    return {
        "n_tokens": len(ids),
        "hint_positions": hint_pos,
        "chain_positions": len(chain_pos),
        "logp_hinted_letter": base,
        "occlusion_effect": base - float(without[lid]),
        "attention_hint": mass_hint.tolist(),
        "attention_chain": mass_chain.tolist(),
        "knockout_hint": knockout(hint_pos).tolist(),
        "knockout_chain": knockout(chain_pos).tolist(),
        "uniform_hint_share": len(hint_pos) / len(ids),
        "uniform_chain_share": len(chain_pos) / len(ids),
    }
