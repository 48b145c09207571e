"""GPT-2 (``GPT2LMHeadModel``): pre-LN, fused Conv1D ``c_attn``, learned positions."""

from __future__ import annotations

from typing import Any

from ..kinds import CAUSAL_LM
from .base import Circuit, Family, NormPlacement, Readout, TinySpec


def _tiny(tok: Any, layers: int, heads: int, d_model: int) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_embd=d_model,
        n_layer=layers,
        n_head=heads,
        n_positions=64,
        vocab_size=len(tok),
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )
    return GPT2LMHeadModel(cfg)


GPT2 = Family(
    "gpt2",
    layers="h",
    attn="attn",
    o_proj="attn.c_proj",
    mlp_out="mlp.c_proj",
    mlp="mlp",
    embed="wte",
    norm=NormPlacement("pre", "ln_1", "layernorm"),
    readout=Readout("ln_f", "ln_1"),
    qkv="c_attn",
    circuit=Circuit("ln_2", "ln_f", positions="wpe"),
    attnlrp_refusal=None,
    tiny=TinySpec(CAUSAL_LM, _tiny),
)
