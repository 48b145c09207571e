"""Phi-3 (``Phi3ForCausalLM``): fused ``qkv_proj`` and ``gate_up_proj``; ``o_proj`` and ``down_proj`` as
Llama's; partial RoPE allowed."""

from __future__ import annotations

from typing import Any, cast

from ..kinds import CAUSAL_LM
from .base import Family, SpecialTokens, TinySpec, decoder_config
from .llama import LLAMA_LIKE


def _tiny(tok: Any, layers: int, heads: int, d_model: int) -> Any:
    from transformers import Phi3Config, Phi3ForCausalLM

    # partial RoPE as Phi-4-mini (0.75 there): half of each head's dimensions rotate
    cfg = decoder_config(tok, layers, heads, d_model)
    return Phi3ForCausalLM(cast(Any, Phi3Config)(original_max_position_embeddings=64, partial_rotary_factor=0.5, **cfg))


PHI3 = Family(
    "phi3",
    **LLAMA_LIKE,
    qkv="qkv_proj",
    # Phi-3 pads with <|endoftext|>
    specials=SpecialTokens({"bos": "<s>", "eos": "<|endoftext|>", "unk": "<unk>", "pad": "<|endoftext|>"}),
    tiny=TinySpec(CAUSAL_LM, _tiny),
)
