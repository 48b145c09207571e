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
``layers.{l}.router.logits``    ``[batch, pos, expert]``            a MoE router's logits (MoE families)
``layers.{l}.router.weights``   ``[batch, pos, expert]``            weight each expert gets (0: not routed)
``layers.{l}.experts.out``      ``[batch, pos, expert, d_model]``   each expert's weighted output
``layers.{l}.shared_expert.out`` ``[batch, pos, d_model]``          Qwen-MoE's shared expert, before its gate
``layers.{l}.mlp.out``          ``[batch, pos, d_model]``           MLP output (last linear; a MoE block's output)
``layers.{l}.resid_post``       ``[batch, pos, d_model]``           hidden state leaving layer l
==============================  ==================================  =============================

With a feature set attached (:mod:`streetlamp.models.features`), each dictionary adds its ``.features`` and
``.features_error`` sites: ``layers.{l}.resid_pre.features`` / ``_error`` before ``resid_pre``, and
``layers.{l}.mlp.features`` / ``_error`` before ``mlp.out``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import torch
from torch import nn

from .families import FAMILIES, Family, unsupported_message

__all__ = [
    "FAMILIES",
    "EXPERT_SITES",
    "LAYER_SITES",
    "SITE_AXES",
    "Family",
    "norm_gain_offset",
    "output_matrix",
    "parse_site",
    "site_axes",
    "layer_sites",
    "site_names",
    "submodule",
    "unsupported_message",
]

LAYER_SITES = ("resid_pre", "attn.v", "attn.pattern", "attn.z", "attn.head_out", "attn.out", "mlp.out", "resid_post")
# a mixture-of-experts layer's sites, between attn.out and mlp.out (forward order); shared_expert.out only where
# the family has one
EXPERT_SITES = ("router.logits", "router.weights", "experts.out", "shared_expert.out")
SITE_AXES: dict[str, list[str]] = {
    "embed": ["batch", "pos", "d_model"],
    "resid_pre": ["batch", "pos", "d_model"],
    "attn.v": ["batch", "pos", "head", "d_head"],
    "attn.pattern": ["batch", "head", "query", "key"],
    "attn.z": ["batch", "pos", "head", "d_head"],
    "attn.head_out": ["batch", "pos", "head", "d_model"],
    "attn.out": ["batch", "pos", "d_model"],
    "mlp.out": ["batch", "pos", "d_model"],
    "router.logits": ["batch", "pos", "expert"],
    "router.weights": ["batch", "pos", "expert"],
    "experts.out": ["batch", "pos", "expert", "d_model"],
    "shared_expert.out": ["batch", "pos", "d_model"],
    "resid_post": ["batch", "pos", "d_model"],
    "resid_pre.features": ["batch", "pos", "feature"],
    "resid_pre.features_error": ["batch", "pos", "d_model"],
    "mlp.features": ["batch", "pos", "feature"],
    "mlp.features_error": ["batch", "pos", "d_model"],
}


# the family objects live in models/families; these names stay for the callers that import them from here
# (seq2seq builds a Family; tests switch the norm gain offset off through norm_gain_offset)
def norm_gain_offset(family: str) -> float:
    """1.0 where the family's RMSNorm gain is ``1 + w``, else 0.0 (gain ``w``)."""
    f = FAMILIES.get(family)
    return f.norm_offset if f is not None else 0.0


def layer_sites(family: Family | None = None) -> tuple[str, ...]:
    """The sites of one layer of ``family``, in forward order (a MoE family's router and expert sites before
    ``mlp.out``)."""
    moe = family.experts if family is not None else None
    if moe is None:
        return LAYER_SITES
    extra = tuple(s for s in EXPERT_SITES if s != "shared_expert.out" or moe.shared_expert is not None)
    i = LAYER_SITES.index("mlp.out")
    return LAYER_SITES[:i] + extra + LAYER_SITES[i:]


def site_names(n_layers: int, family: Family | None = None, features: Iterable[tuple[int, str]] = ()) -> list[str]:
    """Every site name of a model with ``n_layers`` layers (of ``family``), in forward order; ``features``:
    the (layer, ``resid_pre`` | ``mlp``) where a dictionary is attached (its two sites come before the site
    it splices into)."""
    at = set(features)
    out = ["embed"]
    for l in range(n_layers):
        for s in layer_sites(family):
            where = {"resid_pre": "resid_pre", "mlp.out": "mlp"}.get(s)
            if where is not None and (l, where) in at:
                out += [f"layers.{l}.{where}.features", f"layers.{l}.{where}.features_error"]
            out.append(f"layers.{l}.{s}")
    return out


def site_axes(name: str) -> list[str]:
    key = name.split(".", 2)[-1] if name.startswith("layers.") else name
    return SITE_AXES[key]


def parse_site(name: str) -> tuple[int | None, str]:
    """``layers.3.attn.z`` -> (3, "attn.z"); ``embed`` -> (None, "embed")."""
    if name.startswith("layers."):
        _, l, rest = name.split(".", 2)
        return int(l), rest
    return None, name


def submodule(root: nn.Module, path: str) -> nn.Module:
    """The module at a dotted ``path`` under ``root`` (digits index a ModuleList: ``layers.3.attn``)."""
    m = root
    for part in path.split("."):
        m = m[int(part)] if part.isdigit() else getattr(m, part)  # type: ignore[index]
    return m


def output_matrix(o_proj: nn.Module, n_heads: int) -> torch.Tensor:
    """W_O as ``[head, d_head, d_model]`` for nn.Linear or GPT-2's Conv1D."""
    w = cast(torch.Tensor, o_proj.weight)  # nn.Module.__getattr__ is typed Tensor | Module
    w_in_out = w if type(o_proj).__name__ == "Conv1D" else w.t()
    return w_in_out.reshape(n_heads, -1, w_in_out.shape[-1])
