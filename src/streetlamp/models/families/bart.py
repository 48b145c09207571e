"""BART (``BartForConditionalGeneration``): an encoder-decoder with learned positions and scaled
embeddings; ``</s>`` starts the decoder."""

from __future__ import annotations

from typing import Any, cast

from ..kinds import ENCODER_DECODER
from .base import EncoderDecoder, Family, SpecialTokens, TinySpec

STACKS = EncoderDecoder(
    encoder_layers="model.encoder.layers",
    decoder_layers="model.decoder.layers",
    self_attn="self_attn",
    self_o="self_attn.out_proj",
    cross_attn="encoder_attn",
    cross_o="encoder_attn.out_proj",
    encoder_mlp_out="fc2",
    decoder_mlp_out="fc2",
    encoder_embed="model.encoder.embed_tokens",
    decoder_embed="model.decoder.embed_tokens",
)


def _tiny(tok: Any, layers: int, heads: int, d_model: int) -> Any:
    """Learned positions, scaled embeddings (``scale_embedding``) and initializer_range 0.2, so the patterns
    are far from uniform."""
    from transformers import BartConfig, BartForConditionalGeneration

    cfg = cast(Any, BartConfig)(
        vocab_size=len(tok),
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=2 * d_model,
        decoder_ffn_dim=2 * d_model,
        max_position_embeddings=64,
        init_std=0.2,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        scale_embedding=True,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        decoder_start_token_id=tok.eos_token_id,
    )
    return BartForConditionalGeneration(cfg)


BART = Family(
    "bart",
    layers=STACKS.encoder_layers,
    attn=STACKS.self_attn,
    o_proj=STACKS.self_o,
    mlp_out=STACKS.encoder_mlp_out,
    embed=STACKS.encoder_embed,
    encoder_decoder=STACKS,
    attnlrp_refusal="its relevance rules cover single-stack families only",
    # BART wraps a text in <s> ... </s> and starts the decoder with </s>
    specials=SpecialTokens(
        {"bos": "<s>", "pad": "<pad>", "eos": "</s>", "unk": "<unk>", "mask": "<mask>"}, template="<s> $A </s>"
    ),
    tiny=TinySpec(ENCODER_DECODER, _tiny),
)
