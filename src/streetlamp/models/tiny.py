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
    PreTrainedModel,
    PreTrainedTokenizerFast,
    T5Config,
    T5ForConditionalGeneration,
)

from .families import FAMILIES, TINY_WINDOW, Family, FamilyTable
from .families.vit import TINY_IMAGE_SIZE, TINY_PATCH

__all__ = [
    "FAMILY_KINDS",
    "IMAGE_FAMILY_KINDS",
    "SEQ2SEQ_SPECIALS",
    "TINY_IMAGE_SIZE",
    "TINY_PATCH",
    "TINY_WINDOW",
    "WORDS",
    "family_tokenizer",
    "save_tiny",
    "seq2seq_tokenizer",
    "tiny_model",
    "tiny_seq2seq",
    "tiny_tokenizer",
]

WORDS = (
    "the a movie film was is not good bad great terrible acting plot but and very really "
    "i loved hated it story boring fun to of when mary john went store gave drink paris "
    "capital france berlin germany nurse doctor said that he she".split()
)
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# Each family's tiny recipe is its ``tiny`` (models/families); these tables are views of the registry.
# text families (the tests that feed text iterate this) and image families (tests/test_vit*.py run them)
FAMILY_KINDS: FamilyTable[str] = FamilyTable(lambda f: f.tiny.kind if f.tiny and f.modality == "text" else None)
IMAGE_FAMILY_KINDS: FamilyTable[str] = FamilyTable(lambda f: f.tiny.kind if f.tiny and f.modality == "image" else None)


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
    """The tiny word-level tokenizer with ``family``'s special-token layout (its ``specials``), or the
    generic tiny layout where it has none (``[CLS] text [SEP]`` for classifiers)."""
    fam = _tiny_family(family)
    if fam.specials is None:
        return tiny_tokenizer(encoder=fam.tiny is not None and fam.tiny.kind == "classifier")
    names, prepend_bos = dict(fam.specials.names), fam.specials.prepend_bos
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


def _tiny_family(family: str) -> Family:
    fam = FAMILIES.get(family)
    if fam is None or fam.tiny is None:
        have = sorted(n for n, f in FAMILIES.items() if f.tiny is not None)
        raise ValueError(f"no tiny model for family {family!r}; have {have}")
    return fam


def tiny_model(
    family: str, seed: int = 0, layers: int = 2, heads: int = 4, d_model: int = 32, attn_implementation: str = "eager"
) -> tuple[PreTrainedModel, Any]:
    """A randomly initialised model of ``family`` (its ``tiny`` recipe: a classifier for the encoders and
    ViT, a causal LM for the decoders) and its tokenizer (ViT: its image processor)."""
    torch.manual_seed(seed)
    spec = _tiny_family(family).tiny
    assert spec is not None
    tok = spec.tokenizer() if spec.tokenizer is not None else family_tokenizer(family)
    model = spec.build(tok, layers, heads, d_model)
    model.set_attn_implementation(attn_implementation)
    return model.eval(), tok


# Encoder-decoders (kind "seq2seq"), kept apart from the registry: the single-stack tests iterate that.
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
