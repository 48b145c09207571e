"""T5 (``T5ForConditionalGeneration``): an encoder-decoder with relative position buckets (a bias computed
by the first layer of each stack and shared by the others), no 1/sqrt(d) query scaling, RMSNorm, tied
embeddings (the LM head scaled by d_model^-0.5); ``<pad>`` starts the decoder."""

from __future__ import annotations

from typing import Any, cast

from ..kinds import ENCODER_DECODER
from .base import EncoderDecoder, Family, SpecialTokens, TinySpec

STACKS = EncoderDecoder(
    encoder_layers="encoder.block",
    decoder_layers="decoder.block",
    self_attn="layer.0.SelfAttention",
    self_o="layer.0.SelfAttention.o",
    cross_attn="layer.1.EncDecAttention",
    cross_o="layer.1.EncDecAttention.o",
    encoder_mlp_out="layer.1.DenseReluDense.wo",
    decoder_mlp_out="layer.2.DenseReluDense.wo",
    encoder_embed="encoder.embed_tokens",
    decoder_embed="decoder.embed_tokens",
)


def _tiny(tok: Any, layers: int, heads: int, d_model: int) -> Any:
    """Relative position buckets few enough (8, max distance 16) that the test texts fill several."""
    from transformers import T5Config, T5ForConditionalGeneration

    cfg: Any = cast(Any, T5Config)(  # decoder_start_token_id is a PretrainedConfig keyword
        vocab_size=len(tok),
        d_model=d_model,
        d_kv=d_model // heads,
        d_ff=2 * d_model,
        num_layers=layers,
        num_decoder_layers=layers,
        num_heads=heads,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        dropout_rate=0.0,
        feed_forward_proj="relu",
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        decoder_start_token_id=tok.pad_token_id,
    )
    return T5ForConditionalGeneration(cfg)


T5 = Family(
    "t5",
    layers=STACKS.encoder_layers,
    attn=STACKS.self_attn,
    o_proj=STACKS.self_o,
    mlp_out=STACKS.encoder_mlp_out,
    embed=STACKS.encoder_embed,
    encoder_decoder=STACKS,
    attnlrp_refusal="its relevance rules cover single-stack families only",
    # T5 appends </s> (no BOS; <pad> also starts the decoder)
    specials=SpecialTokens({"pad": "<pad>", "eos": "</s>", "unk": "<unk>"}, template="$A </s>"),
    tiny=TinySpec(ENCODER_DECODER, _tiny),
)
