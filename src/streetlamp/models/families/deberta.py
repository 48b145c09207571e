"""DeBERTa-v2/v3 (``DebertaV2ForSequenceClassification``): disentangled attention (content-to-content plus
relative-position c2p and p2c scores) computed inside its own module, so its attention sites come from
hooks on that module (:mod:`streetlamp.models.deberta`), not from streetlamp's attention function."""

from __future__ import annotations

from typing import Any, cast

from ..kinds import CLASSIFIER
from .base import Family, TinySpec, classifier_config
from .bert import PATHS, POST_LN


def _hooks(session: Any, layer: int, attn: Any) -> Any:
    from ..deberta import deberta_hooks  # lazy for start-up time: the registry imports without torch

    return deberta_hooks(session, layer, attn)


def _tiny(tok: Any, layers: int, heads: int, d_model: int) -> Any:
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    # DeBERTa-v3's layout: c2p and p2c terms, query/key projections shared with the relative
    # positions, log-bucketed relative distances (8 buckets: fewer than the test texts' tokens, so
    # bucketing matters), layer-normed relative embeddings, no absolute position embeddings
    cfg = cast(Any, DebertaV2Config)(
        hidden_size=d_model,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * d_model,
        max_position_embeddings=64,
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        position_buckets=8,
        max_relative_positions=64,
        share_att_key=True,
        norm_rel_ebd="layer_norm",
        position_biased_input=False,
        type_vocab_size=0,
        pooler_hidden_size=d_model,
        initializer_range=0.2,
        **classifier_config(tok),
    )
    return DebertaV2ForSequenceClassification(cfg)


DEBERTA_V2 = Family(
    "deberta-v2",
    **PATHS,
    norm=POST_LN,
    attnlrp_refusal="its disentangled attention adds content-to-position scores, linear in the input, to the "
    "bilinear content-to-content score inside its own module; one uniform rule at the pattern would halve both",
    bidirectional=True,
    reads_cls=True,  # the ContextPooler reads [CLS]
    attention_hooks=_hooks,
    tiny=TinySpec(CLASSIFIER, _tiny),
)
