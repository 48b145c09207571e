"""Qwen2 (q/k/v biases) and Qwen3 (per-head q_norm / k_norm before RoPE, acting before the attention
function): Llama's layout otherwise."""

from __future__ import annotations

from typing import Any

from ..kinds import CAUSAL_LM
from .base import Family, SpecialTokens, TinySpec, decoder_config
from .llama import LLAMA_LIKE

# Qwen has no BOS, unk or mask and pads with <|endoftext|>
QWEN_SPECIALS = SpecialTokens({"eos": "<|endoftext|>", "pad": "<|endoftext|>"})


def _tiny_qwen2(tok: Any, layers: int, heads: int, d_model: int) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(**decoder_config(tok, layers, heads, d_model)))  # biases: its default


def _tiny_qwen3(tok: Any, layers: int, heads: int, d_model: int) -> Any:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = decoder_config(tok, layers, heads, d_model)
    return Qwen3ForCausalLM(Qwen3Config(head_dim=d_model // heads, **cfg))  # q/k RMSNorm: its default


QWEN2 = Family("qwen2", **LLAMA_LIKE, specials=QWEN_SPECIALS, tiny=TinySpec(CAUSAL_LM, _tiny_qwen2))
QWEN3 = Family("qwen3", **LLAMA_LIKE, specials=QWEN_SPECIALS, tiny=TinySpec(CAUSAL_LM, _tiny_qwen3))
