"""BERT and RoBERTa (``*ForSequenceClassification``): post-LN encoders reading [CLS]."""

from __future__ import annotations

from typing import Any

from ..kinds import CLASSIFIER
from .base import Family, NormPlacement, TinySpec, classifier_config

PATHS: dict[str, Any] = dict(
    layers="encoder.layer",
    attn="attention.self",
    o_proj="attention.output.dense",
    mlp_out="output.dense",
    embed="embeddings.word_embeddings",
)
POST_LN = NormPlacement("post", "attention.output.LayerNorm", "layernorm")


def _encoder(tok: Any, layers: int, heads: int, d_model: int, positions: int) -> dict[str, Any]:
    return dict(
        hidden_size=d_model,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * d_model,
        max_position_embeddings=positions,
        **classifier_config(tok),
    )


def _tiny_bert(tok: Any, layers: int, heads: int, d_model: int) -> Any:
    from transformers import BertConfig, BertForSequenceClassification

    return BertForSequenceClassification(BertConfig(**_encoder(tok, layers, heads, d_model, 64)))


def _tiny_roberta(tok: Any, layers: int, heads: int, d_model: int) -> Any:
    from transformers import RobertaConfig, RobertaForSequenceClassification

    cfg = RobertaConfig(**_encoder(tok, layers, heads, d_model, 66))  # two slots before the first position
    cfg.pad_token_id = 0
    return RobertaForSequenceClassification(cfg)


BERT = Family(
    "bert",
    **PATHS,
    norm=POST_LN,
    attnlrp_refusal=None,
    bidirectional=True,
    reads_cls=True,
    tiny=TinySpec(CLASSIFIER, _tiny_bert),
)
ROBERTA = Family(
    "roberta",
    **PATHS,
    norm=POST_LN,
    attnlrp_refusal=None,
    # the classification head's tanh and the LM head's gelu are plain functions between these modules
    functional_activations=(("classifier.dense", "classifier.out_proj"), ("lm_head.dense", "lm_head.layer_norm")),
    bidirectional=True,
    reads_cls=True,
    reserved_positions=2,  # RoBERTa numbers positions from padding_idx + 1
    tiny=TinySpec(CLASSIFIER, _tiny_roberta),
)
