"""Gemma 2 and Gemma 3 text (``Gemma2ForCausalLM``, ``Gemma3ForCausalLM``): RMSNorm gain ``1 + w``
(q/k norms included), sandwich norms (the attention and MLP outputs are RMS-normalised before they join
the residual stream; ``mlp.out`` is ``down_proj``, before ``post_feedforward_layernorm``), alternating
sliding-window and global layers, final-logit soft-cap; Gemma 2 also soft-caps the attention logits."""

from __future__ import annotations

from typing import Any

from ..kinds import CAUSAL_LM
from .base import TINY_WINDOW, Family, NormPlacement, Readout, SpecialTokens, TinySpec, decoder_config
from .llama import LLAMA_LIKE


def _tiny(family: str) -> TinySpec:
    """Alternating sliding-window and global layers, a query scale from ``query_pre_attn_scalar`` that
    differs from 1/sqrt(d_head), a head size that is not d_model / heads, attention-logit soft-capping
    small enough that tanh bends the scores (Gemma 2; Gemma 3 dropped it) and final-logit soft-capping."""

    def build(tok: Any, layers: int, heads: int, d_model: int) -> Any:
        from transformers import Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig

        d_head = d_model // heads
        types = ["sliding_attention" if l % 2 == 0 else "full_attention" for l in range(layers)]
        gemma = dict(
            head_dim=d_head + 4,
            query_pre_attn_scalar=2 * d_head,
            sliding_window=TINY_WINDOW,
            layer_types=types,
            final_logit_softcapping=3.0,
            **decoder_config(tok, layers, heads, d_model),
        )
        if family == "gemma2":
            return Gemma2ForCausalLM(Gemma2Config(attn_logit_softcapping=1.5, **gemma))
        return Gemma3ForCausalLM(Gemma3TextConfig(**gemma))

    return TinySpec(CAUSAL_LM, build)


GEMMA_LIKE: dict[str, Any] = dict(
    **{
        **LLAMA_LIKE,
        "norm": NormPlacement("sandwich", "post_attention_layernorm", "rmsnorm_1p"),
        "readout": Readout("norm", "input_layernorm", "post_attention_layernorm", "post_feedforward_layernorm"),
        # each layer's heads are RMS-normalised together before they join the residual stream: no sum of writers
        "circuit": None,
    },
    norm_offset=1.0,
    # Gemma prepends <bos> (its models expect it)
    specials=SpecialTokens({"bos": "<bos>", "eos": "<eos>", "unk": "<unk>", "pad": "<pad>"}, prepend_bos=True),
)
GEMMA2 = Family("gemma2", **GEMMA_LIKE, tiny=_tiny("gemma2"))
GEMMA3_TEXT = Family("gemma3_text", **GEMMA_LIKE, tiny=_tiny("gemma3_text"))  # Gemma3ForCausalLM (text only)
