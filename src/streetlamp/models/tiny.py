"""Tiny random Transformers of every supported family, built in code (tests, examples, toys).

Each comes with a small word-level tokenizer so nothing is downloaded. ``save_tiny`` writes a
regular Hugging Face checkpoint folder (safetensors) that :func:`streetlamp.load` reads back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    BertConfig,
    BertForSequenceClassification,
    DebertaV2Config,
    DebertaV2ForSequenceClassification,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    ModernBertConfig,
    ModernBertForSequenceClassification,
    Phi3Config,
    Phi3ForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    RobertaConfig,
    RobertaForSequenceClassification,
    T5Config,
    T5ForConditionalGeneration,
    ViTConfig,
    ViTForImageClassification,
    ViTImageProcessorPil,
)

WORDS = (
    "the a movie film was is not good bad great terrible acting plot but and very really "
    "i loved hated it story boring fun to of when mary john went store gave drink paris "
    "capital france berlin germany nurse doctor said that he she".split()
)
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
FAMILY_KINDS = {
    "bert": "classifier",
    "roberta": "classifier",
    "distilbert": "classifier",
    "modernbert": "classifier",
    "deberta-v2": "classifier",
    "gpt2": "causal_lm",
    "llama": "causal_lm",
    "qwen2": "causal_lm",
    "qwen3": "causal_lm",
    "mistral": "causal_lm",
    "phi3": "causal_lm",
    "gemma2": "causal_lm",
    "gemma3_text": "causal_lm",
}
# Image families: not in FAMILY_KINDS (whose tests feed text); tests/test_vit*.py run them.
IMAGE_FAMILY_KINDS = {"vit": "classifier"}
# The tiny ViT: 32 x 32 RGB images cut into 8 x 8 patches, so [CLS] + 16 patch tokens.
TINY_IMAGE_SIZE, TINY_PATCH = 32, 8
# Sliding-window size of the tiny Mistral and Gemma configs: shorter than the test texts, so the
# window mask matters (a 4-token window lets query i see keys i-3 .. i).
TINY_WINDOW = 4

# Special tokens of the tiny decoders, per family: which of bos/eos/pad/unk/mask exist and whether
# the tokenizer prepends BOS follow the family's published tokenizers, so the methods' fallbacks
# (a [MASK] stand-in, the pad token, BOS as the empty context) are exercised as on the real models:
# Qwen has no BOS, unk or mask and pads with <|endoftext|>; Mistral prepends <s> and has no pad (the
# adapter pads with EOS); Phi-3 pads with <|endoftext|>; Gemma prepends <bos> (its models expect it).
# (token names, prepend BOS)
DECODER_SPECIALS: dict[str, tuple[dict[str, str], bool]] = {
    "qwen2": ({"eos": "<|endoftext|>", "pad": "<|endoftext|>"}, False),
    "qwen3": ({"eos": "<|endoftext|>", "pad": "<|endoftext|>"}, False),
    "mistral": ({"bos": "<s>", "eos": "</s>", "unk": "<unk>"}, True),
    "phi3": ({"bos": "<s>", "eos": "<|endoftext|>", "unk": "<unk>", "pad": "<|endoftext|>"}, False),
    "gemma2": ({"bos": "<bos>", "eos": "<eos>", "unk": "<unk>", "pad": "<pad>"}, True),
    "gemma3_text": ({"bos": "<bos>", "eos": "<eos>", "unk": "<unk>", "pad": "<pad>"}, True),
}


def tiny_tokenizer(encoder: bool) -> PreTrainedTokenizerFast:
    vocab = {t: i for i, t in enumerate(SPECIALS + list(WORDS) + [",", ".", "!"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace()])
    if encoder:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            unk_token="[UNK]",
            pad_token="[PAD]",
            cls_token="[CLS]",
            sep_token="[SEP]",
            mask_token="[MASK]",
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        eos_token="[SEP]",
        bos_token="[CLS]",
        mask_token="[MASK]",
    )


def family_tokenizer(family: str) -> PreTrainedTokenizerFast:
    """The tiny word-level tokenizer with ``family``'s special-token layout (see DECODER_SPECIALS)."""
    if family not in DECODER_SPECIALS:
        return tiny_tokenizer(encoder=FAMILY_KINDS[family] == "classifier")
    names, prepend_bos = DECODER_SPECIALS[family]
    specials = list(dict.fromkeys(names.values()))
    # words the tokenizer cannot split go to an unknown id; families without <unk> still need one
    # for the word-level model, kept as an ordinary (non-special) vocabulary entry
    unk = names.get("unk", "<unk-word>")
    vocab = {
        t: i for i, t in enumerate(specials + ([unk] if unk not in specials else []) + list(WORDS) + [",", ".", "!"])
    }
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace()])
    if prepend_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{names['bos']} $A", special_tokens=[(names["bos"], vocab[names["bos"]])]
        )
    return PreTrainedTokenizerFast(tokenizer_object=tok, **{f"{k}_token": v for k, v in names.items()})


def _decoder_ids(tok: PreTrainedTokenizerFast) -> dict[str, int | None]:
    return {
        "pad_token_id": tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
    }


def tiny_model(
    family: str, seed: int = 0, layers: int = 2, heads: int = 4, d_model: int = 32, attn_implementation: str = "eager"
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A randomly initialised model of ``family`` (classifier for encoders, causal LM for decoders)."""
    torch.manual_seed(seed)
    if family in IMAGE_FAMILY_KINDS:
        return _tiny_vit(layers, heads, d_model, attn_implementation)  # type: ignore[return-value]
    if family not in FAMILY_KINDS:
        raise ValueError(f"no tiny model for family {family!r}; have {sorted(FAMILY_KINDS)} and vit")
    tok = family_tokenizer(family)
    v = len(tok)
    common: dict[str, Any] = dict(
        vocab_size=v,
        num_labels=3,
        id2label={0: "neg", 1: "neu", 2: "pos"},
        label2id={"neg": 0, "neu": 1, "pos": 2},
        pad_token_id=0,
    )
    model: PreTrainedModel
    cfg: Any  # one of the families' config classes
    if family in ("bert", "roberta"):
        cls_c, cls_m = (
            (BertConfig, BertForSequenceClassification)
            if family == "bert"
            else (RobertaConfig, RobertaForSequenceClassification)
        )
        cfg = cls_c(
            hidden_size=d_model,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=2 * d_model,
            max_position_embeddings=64 + (2 if family == "roberta" else 0),
            **common,
        )
        if family == "roberta":
            cfg.pad_token_id = 0
        model = cls_m(cfg)
    elif family == "modernbert":
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
            **common,
        )
        model = ModernBertForSequenceClassification(cfg)
    elif family == "deberta-v2":
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
            **common,
        )
        model = DebertaV2ForSequenceClassification(cfg)
    elif family == "distilbert":
        cfg = DistilBertConfig(
            dim=d_model, n_layers=layers, n_heads=heads, hidden_dim=2 * d_model, max_position_embeddings=64, **common
        )
        model = DistilBertForSequenceClassification(cfg)
    elif family == "gpt2":
        cfg = GPT2Config(
            n_embd=d_model,
            n_layer=layers,
            n_head=heads,
            n_positions=64,
            vocab_size=v,
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=3,
        )
        model = GPT2LMHeadModel(cfg)
    elif family == "llama":
        cfg = LlamaConfig(
            hidden_size=d_model,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 2),
            intermediate_size=2 * d_model,
            max_position_embeddings=64,
            vocab_size=v,
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=3,
            tie_word_embeddings=False,
        )
        model = LlamaForCausalLM(cfg)
    elif family in DECODER_SPECIALS:
        model = _modern_decoder(family, tok, layers, heads, d_model)
    else:
        raise ValueError(f"no tiny model for family {family!r}; have {sorted(FAMILY_KINDS)}")
    model.set_attn_implementation(attn_implementation)
    return model.eval(), tok


def _tiny_vit(
    layers: int, heads: int, d_model: int, attn_implementation: str
) -> tuple[PreTrainedModel, ViTImageProcessorPil]:
    """A ViTForImageClassification on 32 x 32 images with 8 x 8 patches, and its image processor
    (the Pillow one: no torchvision needed; resize to 32 x 32, scale to [0, 1], normalise with mean
    and std 0.5 as google/vit-base-patch16-224 does). ``initializer_range`` 0.2, as for the tiny
    decoders, so attention is far from uniform."""
    cfg = cast(Any, ViTConfig)(
        hidden_size=d_model,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * d_model,
        image_size=TINY_IMAGE_SIZE,
        patch_size=TINY_PATCH,
        num_channels=3,
        initializer_range=0.2,
        num_labels=3,
        id2label={0: "cat", 1: "dog", 2: "car"},
        label2id={"cat": 0, "dog": 1, "car": 2},
    )
    model = ViTForImageClassification(cfg)
    with torch.no_grad():  # HF initialises it to 0; a trained ViT's is not, so the [MEAN] patch's embedding
        # (the projection of a zero patch: this bias) differs from IG's zero-vector baseline, as on real models
        cast(torch.Tensor, model.vit.embeddings.patch_embeddings.projection.bias).normal_(0.0, 0.2)
    model.set_attn_implementation(attn_implementation)
    proc = ViTImageProcessorPil(size={"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE})
    return model.eval(), proc


def _modern_decoder(
    family: str, tok: PreTrainedTokenizerFast, layers: int, heads: int, d_model: int
) -> PreTrainedModel:
    """Qwen2, Qwen3, Mistral, Phi-3, Gemma 2 and Gemma 3 (text) at toy size.

    Each config switches on what makes its family different, so the tests see it: Qwen2's q/k/v
    biases (its default), Qwen3's q/k RMSNorm (default), Mistral's sliding window on every layer,
    Phi-3's fused qkv_proj and gate_up_proj (its modules), and for Gemma alternating sliding-window
    and global layers, a query scale from ``query_pre_attn_scalar`` that differs from 1/sqrt(d_head),
    a head size that is not d_model / heads, attention-logit soft-capping small enough that tanh
    bends the scores (Gemma 2; Gemma 3 dropped it) and final-logit soft-capping.
    """
    kv = max(1, heads // 2)
    # initializer_range 0.2 (HF's default is 0.02): attention scores of order 1, so patterns are far
    # from uniform and Gemma's soft-capping (tanh) is not a near-identity on them
    common: dict[str, Any] = dict(
        initializer_range=0.2,
        vocab_size=len(tok),
        hidden_size=d_model,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=2 * d_model,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        **_decoder_ids(tok),
    )
    d_head = d_model // heads
    if family == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common))
    if family == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(head_dim=d_head, **common))
    if family == "mistral":
        return MistralForCausalLM(MistralConfig(head_dim=d_head, sliding_window=TINY_WINDOW, **common))
    if family == "phi3":  # partial RoPE as Phi-4-mini (0.75 there): half of each head's dimensions rotate
        return Phi3ForCausalLM(
            cast(Any, Phi3Config)(original_max_position_embeddings=64, partial_rotary_factor=0.5, **common)
        )
    types = ["sliding_attention" if l % 2 == 0 else "full_attention" for l in range(layers)]
    gemma = dict(
        head_dim=d_head + 4,
        query_pre_attn_scalar=2 * d_head,
        sliding_window=TINY_WINDOW,
        layer_types=types,
        final_logit_softcapping=3.0,
        **common,
    )
    if family == "gemma2":
        return Gemma2ForCausalLM(Gemma2Config(attn_logit_softcapping=1.5, **gemma))
    return Gemma3ForCausalLM(Gemma3TextConfig(**gemma))


# Encoder-decoders (kind "seq2seq"), kept apart from FAMILY_KINDS: the single-stack tests iterate that.
# Special tokens as the published tokenizers lay them out: T5 appends </s> (no BOS; <pad> also starts
# the decoder), BART wraps a text in <s> ... </s> and starts the decoder with </s>.
SEQ2SEQ_SPECIALS: dict[str, tuple[dict[str, str], str]] = {
    "t5": ({"pad": "<pad>", "eos": "</s>", "unk": "<unk>"}, "$A </s>"),
    "bart": ({"bos": "<s>", "pad": "<pad>", "eos": "</s>", "unk": "<unk>", "mask": "<mask>"}, "<s> $A </s>"),
}


def seq2seq_tokenizer(family: str) -> PreTrainedTokenizerFast:
    """The tiny word-level tokenizer with ``family``'s special tokens and template (SEQ2SEQ_SPECIALS)."""
    names, template = SEQ2SEQ_SPECIALS[family]
    vocab = {t: i for i, t in enumerate(list(names.values()) + list(WORDS) + [",", ".", "!"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=names["unk"]))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace()])
    used = [t for t in names.values() if t in template]
    tok.post_processor = processors.TemplateProcessing(single=template, special_tokens=[(t, vocab[t]) for t in used])
    return PreTrainedTokenizerFast(tokenizer_object=tok, **{f"{k}_token": v for k, v in names.items()})


def tiny_seq2seq(
    family: str, seed: int = 0, layers: int = 2, heads: int = 4, d_model: int = 32, attn_implementation: str = "eager"
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A random T5ForConditionalGeneration or BartForConditionalGeneration at toy size.

    T5: relative position buckets few enough (8, max distance 16) that the test texts fill several, a
    bias only in the first layer of each stack (as T5 has it), no query scaling (T5's), tied embeddings
    (so the LM head is scaled by d_model^-0.5). BART: learned positions, scaled embeddings
    (``scale_embedding``) and initializer_range 0.2, so the patterns are far from uniform."""
    if family not in SEQ2SEQ_SPECIALS:
        raise ValueError(f"no tiny encoder-decoder for family {family!r}; have {sorted(SEQ2SEQ_SPECIALS)}")
    torch.manual_seed(seed)
    tok = seq2seq_tokenizer(family)
    model: PreTrainedModel
    if family == "t5":
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
        model = T5ForConditionalGeneration(cfg)
    else:
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
        model = BartForConditionalGeneration(cfg)
    model.set_attn_implementation(attn_implementation)
    return model.eval(), tok


def save_tiny(family: str, path: str | Path, seed: int = 0, **kw: Any) -> Path:
    """Save ``tiny_model(family)`` (``tiny_seq2seq`` for T5/BART) and its tokenizer (image processor for
    ViT) as a checkpoint folder."""
    model, tok = (tiny_seq2seq if family in SEQ2SEQ_SPECIALS else tiny_model)(family, seed=seed, **kw)
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path
