"""BERT and RoBERTa (``*ForSequenceClassification``): post-LN encoders reading [CLS]."""

from __future__ import annotations

from typing import Any

from .base import Family, NormPlacement, TinySpec, classifier_config

PATHS: dict[str, Any] = dict(
    layers="encoder.layer",
    attn="attention.self",
    o_proj="attention.output.dense",
    mlp_out="output.dense",
    embed="embeddings.word_embeddings",
)
POST_LN = NormPlacement("post", "attention.output.LayerNorm", "layernorm")


def _tiny(family: str) -> Any:
    def build(tok: Any, layers: int, heads: int, d_model: int) -> Any:
        from transformers import (
            BertConfig,
            BertForSequenceClassification,
            RobertaConfig,
            RobertaForSequenceClassification,
        )

        roberta = family == "roberta"
        cls_c, cls_m = (
            (RobertaConfig, RobertaForSequenceClassification)
            if roberta
            else (BertConfig, BertForSequenceClassification)
        )
        cfg = cls_c(
            hidden_size=d_model,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=2 * d_model,
            max_position_embeddings=64 + (2 if roberta else 0),
            **classifier_config(tok),
        )
        if roberta:
            cfg.pad_token_id = 0
        return cls_m(cfg)

    return TinySpec("classifier", build)


BERT = Family("bert", **PATHS, norm=POST_LN, attnlrp_refusal=None, reads_cls=True, tiny=_tiny("bert"))
ROBERTA = Family(
    "roberta",
    **PATHS,
    norm=POST_LN,
    attnlrp_refusal=None,
    # the classification head's tanh and the LM head's gelu are plain functions between these modules
    functional_activations=(("classifier.dense", "classifier.out_proj"), ("lm_head.dense", "lm_head.layer_norm")),
    reads_cls=True,
    reserved_positions=2,  # RoBERTa numbers positions from padding_idx + 1
    tiny=_tiny("roberta"),
)
