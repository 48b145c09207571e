"""DistilBERT (``DistilBertForSequenceClassification``): a post-LN encoder reading [CLS]."""

from __future__ import annotations

from typing import Any

from ..kinds import CLASSIFIER
from .base import Family, NormPlacement, TinySpec, classifier_config


def _tiny(tok: Any, layers: int, heads: int, d_model: int) -> Any:
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    cfg = DistilBertConfig(
        dim=d_model,
        n_layers=layers,
        n_heads=heads,
        hidden_dim=2 * d_model,
        max_position_embeddings=64,
        **classifier_config(tok),
    )
    return DistilBertForSequenceClassification(cfg)


DISTILBERT = Family(
    "distilbert",
    layers="transformer.layer",
    attn="attention",
    o_proj="attention.out_lin",
    mlp_out="ffn.lin2",
    embed="embeddings.word_embeddings",
    norm=NormPlacement("post", "sa_layer_norm", "layernorm"),
    attnlrp_refusal=None,  # its inline nn.ReLU(): the identity rule equals the gradient
    bidirectional=True,
    reads_cls=True,
    tiny=TinySpec(CLASSIFIER, _tiny),
)
