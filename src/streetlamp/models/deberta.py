"""DeBERTa-v2/v3: the attention sites from hooks on its own attention module.

DeBERTa's attention is *disentangled* (He et al., ICLR 2021): with content vectors ``H`` and
relative-position embeddings ``P`` (bucketed relative distances ``δ(i, j)``), the score of query i
on key j sums three terms,

    score[i, j] = (Q_c[i]·K_c[j] + Q_c[i]·K_r[δ(i,j)] + K_c[j]·Q_r[δ(j,i)]) / sqrt(3 · d_head)

content-to-content, content-to-position (c2p) and position-to-content (p2c), each term present when
the config's ``pos_att_type`` lists it (the scale is ``sqrt(d_head · (1 + #terms))``). **Attention**
in streetlamp, for this family, is the post-softmax probability of that masked sum, per head
``[batch, head, query, key]``: the weights that mix the value vectors ``V = H W_V`` (position
embeddings enter the scores only, never the values). So ``attn.pattern`` means the same as for every
other family (rows sum to 1 over allowed keys, they multiply the values), and rollout, flow,
attention × gradient, head ablation and value-based decompositions read it unchanged.

transformers 5 computes all of this inside ``DisentangledSelfAttention.forward``, not through
``ALL_ATTENTION_FUNCTIONS``, so streetlamp's attention function cannot be registered for it. The
sites are instead taken with forward hooks at module boundaries inside that computation, exact
because they are Hugging Face's own tensors:

* ``attn.v``: the output of ``value_proj`` ``[batch, pos, head * d_head]`` viewed per head;
* ``attn.pattern``: the output of the module's attention-probability ``dropout`` (post-softmax,
  identity in eval mode): replacing it replaces what multiplies the values;
* ``attn.z``: the module's context output ``[batch, pos, head * d_head]`` viewed per head;
* the mask (``allowed``) from the module's ``attention_mask`` argument, ``m_i · m_j`` of the padding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from .trace import Session


def _per_head(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.view(*x.shape[:-1], heads, -1)


def deberta_hooks(session: Session, layer: int, attn: nn.Module) -> list[torch.utils.hooks.RemovableHandle]:
    """The hooks that expose layer ``layer``'s ``attn.v``, ``attn.pattern`` and ``attn.z`` sites (and its
    mask) on a ``DisentangledSelfAttention`` module ``attn``."""
    m: Any = attn
    heads = int(m.num_attention_heads)

    def mask_hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        mask = args[1] if len(args) > 1 else kwargs["attention_mask"]
        batch = (args[0] if args else kwargs["hidden_states"]).shape[0]
        session.note_allowed(mask.bool(), batch, layer)

    def value_hook(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        v = _per_head(out, heads)
        new = session.site(f"layers.{layer}.attn.v", v)
        return out if new is v else new.reshape(out.shape)

    def pattern_hook(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        return session.site(f"layers.{layer}.attn.pattern", out)

    def z_hook(module: nn.Module, args: tuple, out: tuple) -> tuple:
        z = _per_head(out[0], heads)
        new = session.site(f"layers.{layer}.attn.z", z)
        session.stash_z(layer, new)
        return out if new is z else (new.reshape(out[0].shape), *out[1:])

    hooks: list[tuple[nn.Module, Callable, dict]] = [
        (m, mask_hook, {"with_kwargs": True, "pre": True}),
        (m.value_proj, value_hook, {}),
        (m.dropout, pattern_hook, {}),
        (m, z_hook, {}),
    ]
    handles = []
    for mod, fn, kw in hooks:
        if kw.pop("pre", False):
            handles.append(mod.register_forward_pre_hook(fn, **kw))
        else:
            handles.append(mod.register_forward_hook(fn, **kw))
    return handles
