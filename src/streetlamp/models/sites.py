"""Named sites: one stable name per intervention point, the same for every family.

A family is a small table of module paths (relative to ``model.base_model``); everything else
is derived from it. Shapes:

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

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

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


@dataclass(frozen=True)
class Family:
    """Module paths of one architecture family, relative to ``model.base_model``."""

    name: str
    layers: str
    attn: str  # the module that calls the attention function
    o_proj: str  # relative to a layer
    mlp_out: str  # relative to a layer
    embed: str  # token-embedding lookup, relative to the base model
    # Gemma 2/3 RMS-normalise a layer's attention output before it joins the residual stream
    # ("sandwich" norms): the output is then unchanged when all of a layer's attention is scaled by α > 0
    normed_attention_output: bool = False
    # DeBERTa-v2/v3 compute attention inside their own module, not through ALL_ATTENTION_FUNCTIONS: the
    # attention sites come from hooks on that module (models/deberta.py) instead of our attention function
    own_attention: bool = False


_BERT: dict[str, Any] = dict(
    layers="encoder.layer",
    attn="attention.self",
    o_proj="attention.output.dense",
    mlp_out="output.dense",
    embed="embeddings.word_embeddings",
)
_LLAMA: dict[str, Any] = dict(
    layers="layers", attn="self_attn", o_proj="self_attn.o_proj", mlp_out="mlp.down_proj", embed="embed_tokens"
)
FAMILIES: dict[str, Family] = {
    "bert": Family("bert", **_BERT),
    "roberta": Family("roberta", **_BERT),
    "distilbert": Family(
        "distilbert",
        layers="transformer.layer",
        attn="attention",
        o_proj="attention.out_lin",
        mlp_out="ffn.lin2",
        embed="embeddings.word_embeddings",
    ),
    "gpt2": Family("gpt2", layers="h", attn="attn", o_proj="attn.c_proj", mlp_out="mlp.c_proj", embed="wte"),
    "llama": Family("llama", **_LLAMA),
    "mistral": Family("mistral", **_LLAMA),
    "qwen2": Family("qwen2", **_LLAMA),
    "qwen3": Family("qwen3", **_LLAMA),  # q_norm / k_norm act before the attention function
    "phi3": Family("phi3", **_LLAMA),  # fused qkv_proj and gate_up_proj; o_proj and down_proj as Llama's
    # mlp.out is down_proj, before post_feedforward_layernorm
    "gemma2": Family("gemma2", **_LLAMA, normed_attention_output=True),
    "gemma3_text": Family("gemma3_text", **_LLAMA, normed_attention_output=True),  # Gemma3ForCausalLM (text only)
    # ModernBERT: fused Wqkv; W_O is attn.Wo, the MLP's last linear mlp.Wo; alternating global and
    # local (bidirectional sliding-window) layers
    "modernbert": Family(
        "modernbert",
        layers="layers",
        attn="attn",
        o_proj="attn.Wo",
        mlp_out="mlp.Wo",
        embed="embeddings.tok_embeddings",
    ),
    # disentangled attention (c2c + c2p + p2c scores); sites from hooks, see models/deberta.py
    "deberta-v2": Family("deberta-v2", **_BERT, own_attention=True),
    # ViTForImageClassification (transformers 5: q/k/v/o_proj, mlp.fc1/fc2); ``embed`` hooks ViTEmbeddings
    # and exposes cat([CLS], patch embeddings) before the position embeddings (models/images.py)
    "vit": Family(
        "vit",
        layers="layers",
        attn="attention",
        o_proj="attention.o_proj",
        mlp_out="mlp.fc2",
        embed="embeddings",
    ),
}


# Families whose RMSNorm multiplies by (1 + w) instead of w (Gemma; their weights are stored offset by 1),
# q_norm / k_norm included
UNIT_OFFSET_NORM_FAMILIES = ("gemma2", "gemma3_text")


def norm_gain_offset(family: str) -> float:
    """1.0 where the family's RMSNorm gain is ``1 + w``, else 0.0 (gain ``w``)."""
    return 1.0 if family in UNIT_OFFSET_NORM_FAMILIES else 0.0


# Families whose attention transformers 5 does not compute through ALL_ATTENTION_FUNCTIONS (so ours
# cannot be registered), or that need inputs streetlamp does not model yet: the reason is the error.
UNSUPPORTED: dict[str, str] = {
    "deberta": "DeBERTa v1 computes its disentangled attention inside its own module in transformers 5, "
    "not through ALL_ATTENTION_FUNCTIONS, and streetlamp hooks only DeBERTa-v2/v3's module "
    "(model_type 'deberta-v2'); use a v2/v3 checkpoint",
}


def unsupported_message(model_type: str) -> str:
    """One line: why ``model_type`` cannot be loaded, and the supported families."""
    why = UNSUPPORTED.get(model_type, "not supported")
    # the encoder-decoders (models/seq2seq.py) after the single-stack families
    return f"model type {model_type!r}: {why}; supported: {', '.join(sorted(FAMILIES))}; encoder-decoder: bart, t5"


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
