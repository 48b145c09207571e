"""ModernBERT (``ModernBertForSequenceClassification``): fused ``Wqkv``; W_O is ``attn.Wo``, the MLP's
last linear ``mlp.Wo`` (after a chunked, gated ``Wi``); pre-LN (layer 0's ``attn_norm`` is the identity);
alternating global and local (bidirectional sliding-window) layers."""

from __future__ import annotations

from typing import Any, cast

from ..kinds import CLASSIFIER
from .base import TINY_WINDOW, Circuit, Family, NormPlacement, TinySpec, classifier_config


def _tiny(tok: Any, layers: int, heads: int, d_model: int) -> Any:
    from transformers import ModernBertConfig, ModernBertForSequenceClassification

    # layer 0 global, layer 1 local: a bidirectional window |i - j| <= local_attention / 2 = 2;
    # [CLS] pooling (its default); the tokenizer's [CLS]/[SEP]/[PAD]/[MASK] ids in the config
    cfg = cast(Any, ModernBertConfig)(
        hidden_size=d_model,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * d_model,
        max_position_embeddings=64,
        local_attention=TINY_WINDOW,
        global_attn_every_n_layers=2,
        initializer_range=0.2,
        cls_token_id=tok.cls_token_id,
        sep_token_id=tok.sep_token_id,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
        **classifier_config(tok),
    )
    return ModernBertForSequenceClassification(cfg)


MODERNBERT = Family(
    "modernbert",
    layers="layers",
    attn="attn",
    o_proj="attn.Wo",
    mlp_out="mlp.Wo",
    mlp="mlp",
    embed="embeddings.tok_embeddings",
    norm=NormPlacement("pre", "attn_norm", "layernorm"),
    qkv="Wqkv",
    rotary=True,  # global and local layers rotate with their own base
    bidirectional=True,
    # the embed writer is the embedding module's output (after its norm)
    circuit=Circuit("mlp_norm", "final_norm", embeddings="embeddings", readout="pooled"),
    gated_mlp=True,
    attnlrp_refusal=None,
    tiny=TinySpec(CLASSIFIER, _tiny),
)
