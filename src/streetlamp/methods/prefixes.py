"""Applying a method to every prefix of a causal LM's text: explain-generation's rows, answer scores.

Each prefix ``full[:P+j]`` is one :class:`~streetlamp.methods.views.SequenceView` explaining its next token
``full[P+j]``: the method's own ``attribute``, called as ``streetlamp explain`` calls it.
"""

from __future__ import annotations

import torch

from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter, Target
from ..results import Explanation
from .base import Method


def per_prefix(
    adapter: ModelAdapter,
    method: Method,
    full: torch.Tensor,
    prompt_len: int,
    quantity: str,
    batch_size: int | None,
    seed: int,
    contrast: int | None = None,
) -> list[Explanation]:
    """``method`` on each prefix ``full[:P+j]`` explaining its next token ``full[P+j]`` (one call per prefix,
    as ``streetlamp explain`` calls it)."""
    out = []
    for n in range(prompt_len, len(full)):
        inputs = Inputs.from_ids(adapter, [full[:n]])
        target = Target(int(full[n]), contrast, quantity)  # type: ignore[arg-type]
        e = method.attribute(adapter, inputs, target=target, batch_size=batch_size, seed=seed)[0]
        if len(e.scores) != n:
            raise StreetlampError(f"{method.name} gave {len(e.scores)} scores for a prefix of {n} tokens")
        out.append(e)
    return out
