"""The one attention function streetlamp registers with transformers.

Every supported family (BERT, RoBERTa, DistilBERT, GPT-2, Llama, Mistral, Qwen2/3, Phi-3, Gemma 2/3,
ModernBERT, ViT) calls its attention
through ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]``. Registering this function (and
the eager mask builder under the same name, so masks arrive as additive float tensors) lets one
piece of code record and intervene on attention for all of them.

Outside an active :class:`~streetlamp.models.trace.Session` it is a plain eager attention
(identical numerics to Hugging Face's eager path). Inside one it exposes three sites per layer:

* ``layers.{l}.attn.v`` -- value vectors ``[batch, pos, head, d_head]`` (per query head);
* ``layers.{l}.attn.pattern`` -- post-softmax probabilities ``[batch, head, query, key]``
  (per *query* head for grouped-query attention);
* ``layers.{l}.attn.z`` -- per-head context vectors ``[batch, pos, head, d_head]``, before the
  output projection.

Keyword arguments transformers passes and how they are honoured (as in Hugging Face's eager code):
``scaling`` multiplies the scores (Gemma's ``query_pre_attn_scalar ** -0.5``; 1/sqrt(d_head) when
absent); ``softcap`` caps the scaled scores as ``softcap * tanh(scores / softcap)`` *before* the mask
is added (Gemma 2); ``sliding_window`` is already inside the per-layer mask transformers builds for
sliding layers (through the mask builder registered below), and is applied here only when no mask
arrives, by the one mask rule of :mod:`streetlamp.models.masks` (a causal query i then sees keys
i - window + 1 .. i; a bidirectional one keys with |i - j| < window), which the fused kernel and the
chunked pass use too. ``position_bias`` (T5: the relative-position bias of the stack's first layer,
``[1 or batch, head, query, key]``, zeros for cross-attention) is added to the scaled scores before the
mask, as T5's eager code does; T5 passes ``scaling=1.0`` (it does not scale q·k).

What a call should do besides attend (the session, the long-context recorder, the fused flag, AttnLRP's
rules) is read from :mod:`streetlamp.models.context`.

Encoder-decoders (T5, BART) name the sites by stack and attention kind
(``encoder.layers.{l}.attn.*``, ``decoder.layers.{l}.self_attn.*``, ``decoder.layers.{l}.cross_attn.*``):
the session says which prefix a module's call belongs to.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from ..errors import StreetlampError
from .context import active_recorder, active_session, fused_attention, fused_on
from .masks import rule_mask
from .relevance import soft_cap

__all__ = ["ATTN_IMPLEMENTATION", "fused_attention", "register", "repeat_kv", "streetlamp_attention"]
ATTN_IMPLEMENTATION = "streetlamp"
# sites computed inside this function: a layer whose site is recorded or edited needs the weights
_INSIDE = ("v", "pattern", "z")


def _needs_weights(session: object, prefix: str) -> bool:
    """Whether the session records or edits a site inside this call (``{prefix}.v/.pattern/.z``)."""
    if session is None or not prefix:
        return False
    wanted = getattr(session, "record", set()) | set(getattr(session, "edits", {}))
    return any(f"{prefix}.{s}" in wanted for s in _INSIDE)


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[batch, kv_heads, seq, d] -> [batch, kv_heads * groups, seq, d] (grouped-query attention)."""
    if groups == 1:
        return x
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, groups, s, d).reshape(b, h * groups, s, d)


def streetlamp_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    sliding_window: int | None = None,
    position_bias: torch.Tensor | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    groups = int(getattr(module, "num_key_value_groups", 1) or 1)
    session = active_session()
    where = session.attn_site(module) if session is not None else None
    layer, prefix = where if where is not None else (None, "")
    sinks = kwargs.get("s_aux")  # gpt-oss's learned attention sinks: one logit per head, in every row's softmax
    recorder = active_recorder()
    if recorder is not None:  # long context: query chunks, selected rows and q/k to disk
        if sinks is not None:
            raise StreetlampError("long-context recording does not support learned attention sinks (gpt-oss) yet")
        if _needs_weights(session, prefix):
            raise StreetlampError("a long-context recording cannot also record or edit attention sites")
        if position_bias is not None:
            raise StreetlampError("long-context recording does not support a relative-position bias (T5) yet")
        out = recorder.attend(module, query, key, value, attention_mask, scaling, softcap, sliding_window, groups)
        return out, None
    key = repeat_kv(key, groups)
    value = repeat_kv(value, groups)
    if (
        fused_on()
        and softcap is None
        and position_bias is None
        and sinks is None
        and not _needs_weights(session, prefix)
    ):
        return sdpa(module, query, key, value, attention_mask, scaling, dropout, sliding_window), None
    if layer is not None:
        assert session is not None
        v = value.transpose(1, 2)
        v_new = session.site(f"{prefix}.v", v)
        if v_new is not v:
            value = v_new.transpose(1, 2)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:  # under AttnLRP's rules with the identity rule's gradient (models/relevance.py)
        scores = soft_cap(scores, float(softcap))
    if position_bias is not None:
        scores = scores + position_bias
    q_len, k_len = query.shape[-2], key.shape[-2]
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            allowed = attention_mask[:, :, :, :k_len]
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask[:, :, :, :k_len]
            allowed = attention_mask[:, :, :, :k_len] > torch.finfo(attention_mask.dtype).min / 2
    else:  # no mask: the rule's (models/masks.py)
        rule = rule_mask(q_len, k_len, bool(getattr(module, "is_causal", False)), sliding_window, query.device)
        allowed = rule if rule is not None else torch.ones(1, 1, q_len, k_len, dtype=torch.bool, device=query.device)
        if rule is not None:
            scores = scores.masked_fill(~rule, torch.finfo(scores.dtype).min)
    if sinks is not None:
        # gpt-oss (as its eager path): the sink logit joins each row's softmax, its column is dropped, so a row
        # sums to less than 1; the pattern site holds what the keys get
        sink = cast(torch.Tensor, sinks).reshape(1, -1, 1, 1).expand(query.shape[0], -1, q_len, -1).to(scores.dtype)
        both = torch.cat([scores, sink], dim=-1)
        both = both - both.max(dim=-1, keepdim=True).values
        probs = nn.functional.softmax(both, dim=-1, dtype=both.dtype)[..., :-1].to(query.dtype)
    else:
        # softmax in float32 (as Hugging Face's eager path), or float64 when the model runs in double
        probs = nn.functional.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(
            query.dtype
        )
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    if layer is not None:
        assert session is not None
        session.note_allowed(allowed, query.shape[0], layer, prefix)
        probs = session.site(f"{prefix}.pattern", probs)
    out = torch.matmul(probs, value).transpose(1, 2).contiguous()
    if layer is not None:
        assert session is not None
        out = session.site(f"{prefix}.z", out)
        session.stash_z(layer, out)
    return out, probs


def sdpa(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """The fused kernel, with the mask the eager branch would apply (the rule's when none arrives; plain
    causal attention over the same positions as SDPA's own ``is_causal``, so no mask is built)."""
    q_len, k_len = query.shape[-2], key.shape[-2]
    causal = bool(getattr(module, "is_causal", False))
    mask = attention_mask[:, :, :, :k_len] if attention_mask is not None else None
    is_causal = mask is None and causal and not sliding_window and q_len == k_len and q_len > 1
    if mask is None and not is_causal:
        mask = rule_mask(q_len, k_len, causal, sliding_window, query.device)
    out = nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=mask,
        dropout_p=dropout if module.training else 0.0,
        is_causal=is_causal,
        scale=scaling,
    )
    return out.transpose(1, 2).contiguous()


def register() -> str:
    """Register the attention function and its mask builder; idempotent. Returns the name."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, streetlamp_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, eager_mask)
    return ATTN_IMPLEMENTATION


register()
