"""Llama and Mistral (``*ForCausalLM``): pre-RMSNorm, RoPE, grouped-query attention, gated MLP.
Mistral adds a sliding window on every layer."""

from __future__ import annotations

from typing import Any

from ..kinds import CAUSAL_LM
from .base import TINY_WINDOW, Circuit, Family, NormPlacement, Readout, SpecialTokens, TinySpec, decoder_config

PATHS: dict[str, Any] = dict(
    layers="layers",
    attn="self_attn",
    o_proj="self_attn.o_proj",
    mlp_out="mlp.down_proj",
    mlp="mlp",
    embed="embed_tokens",
)
PRE_RMS = NormPlacement("pre", "input_layernorm", "rmsnorm")
READOUT = Readout("norm", "input_layernorm")
CIRCUIT = Circuit("post_attention_layernorm", READOUT.final_norm)
# what every Llama-like decoder shares (Qwen, Phi-3 and Gemma start from it too)
LLAMA_LIKE: dict[str, Any] = dict(
    **PATHS, norm=PRE_RMS, readout=READOUT, rotary=True, circuit=CIRCUIT, gated_mlp=True, attnlrp_refusal=None
)


def _tiny_llama(tok: Any, layers: int, heads: int, d_model: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=d_model,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        intermediate_size=2 * d_model,
        max_position_embeddings=64,
        vocab_size=len(tok),
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg)


def _tiny_mistral(tok: Any, layers: int, heads: int, d_model: int) -> Any:
    from transformers import MistralConfig, MistralForCausalLM

    cfg = decoder_config(tok, layers, heads, d_model)
    return MistralForCausalLM(MistralConfig(head_dim=d_model // heads, sliding_window=TINY_WINDOW, **cfg))


LLAMA = Family("llama", **LLAMA_LIKE, tiny=TinySpec(CAUSAL_LM, _tiny_llama))
MISTRAL = Family(
    "mistral",
    **LLAMA_LIKE,
    # Mistral prepends <s> and has no pad (the adapter pads with EOS)
    specials=SpecialTokens({"bos": "<s>", "eos": "</s>", "unk": "<unk>"}, prepend_bos=True),
    tiny=TinySpec(CAUSAL_LM, _tiny_mistral),
)
