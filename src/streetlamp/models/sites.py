"""Named sites: one stable name per intervention point, the same for every family.

A family's module paths (relative to ``model.base_model``, on its object in
:mod:`streetlamp.models.families`) say where each site is; everything else is derived from them. Shapes:

==============================  ==================================  =============================
name                            shape                               what
==============================  ==================================  =============================
``embed``                       ``[batch, pos, d_model]``           token embeddings (lookup output)
``layers.{l}.resid_pre``        ``[batch, pos, d_model]``           hidden state entering layer l
``layers.{l}.attn.v``           ``[batch, pos, head, d_head]``      value vectors (per query head)
``layers.{l}.attn.pattern``     ``[batch, head, query, key]``       post-softmax attention
``layers.{l}.attn.z``           ``[batch, pos, head, d_head]``      per-head context, before W_O
``layers.{l}.attn.head_out``    ``[batch, pos, head, d_model]``     per-head output, z_h W_O,h
``layers.{l}.attn.out``         ``[batch, pos, d_model]``           attention block output (W_O)
``layers.{l}.mlp.out``          ``[batch, pos, d_model]``           MLP output (last linear)
``layers.{l}.resid_post``       ``[batch, pos, d_model]``           hidden state leaving layer l
==============================  ==================================  =============================
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from .families import FAMILIES, Family, unsupported_message

__all__ = [
    "FAMILIES",
    "LAYER_SITES",
    "SITE_AXES",
    "Family",
    "norm_gain_offset",
    "output_matrix",
    "parse_site",
    "site_axes",
    "site_names",
    "unsupported_message",
]

LAYER_SITES = ("resid_pre", "attn.v", "attn.pattern", "attn.z", "attn.head_out", "attn.out", "mlp.out", "resid_post")
SITE_AXES: dict[str, list[str]] = {
    "embed": ["batch", "pos", "d_model"],
    "resid_pre": ["batch", "pos", "d_model"],
    "attn.v": ["batch", "pos", "head", "d_head"],
    "attn.pattern": ["batch", "head", "query", "key"],
    "attn.z": ["batch", "pos", "head", "d_head"],
    "attn.head_out": ["batch", "pos", "head", "d_model"],
    "attn.out": ["batch", "pos", "d_model"],
    "mlp.out": ["batch", "pos", "d_model"],
    "resid_post": ["batch", "pos", "d_model"],
}


# the family objects live in models/families; these names stay for the callers that import them from here
# (seq2seq builds a Family; tests switch the norm gain offset off through norm_gain_offset)
def norm_gain_offset(family: str) -> float:
    """1.0 where the family's RMSNorm gain is ``1 + w``, else 0.0 (gain ``w``)."""
    f = FAMILIES.get(family)
    return f.norm_offset if f is not None else 0.0


def site_names(n_layers: int) -> list[str]:
    """Every site name of a model with ``n_layers`` layers, in forward order."""
    return ["embed"] + [f"layers.{l}.{s}" for l in range(n_layers) for s in LAYER_SITES]


def site_axes(name: str) -> list[str]:
    key = name.split(".", 2)[-1] if name.startswith("layers.") else name
    return SITE_AXES[key]


def parse_site(name: str) -> tuple[int | None, str]:
    """``layers.3.attn.z`` -> (3, "attn.z"); ``embed`` -> (None, "embed")."""
    if name.startswith("layers."):
        _, l, rest = name.split(".", 2)
        return int(l), rest
    return None, name


def output_matrix(o_proj: nn.Module, n_heads: int) -> torch.Tensor:
    """W_O as ``[head, d_head, d_model]`` for nn.Linear or GPT-2's Conv1D."""
    w = cast(torch.Tensor, o_proj.weight)  # nn.Module.__getattr__ is typed Tensor | Module
    w_in_out = w if type(o_proj).__name__ == "Conv1D" else w.t()
    return w_in_out.reshape(n_heads, -1, w_in_out.shape[-1])
