"""Tiny random Transformers of every supported family, built in code (tests, examples, toys).

Each comes with a small word-level tokenizer so nothing is downloaded. ``save_tiny`` writes a
regular Hugging Face checkpoint folder (safetensors) that :func:`streetlamp.load` reads back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from .families import FAMILIES, TINY_WINDOW, Family, FamilyTable
from .families.vit import TINY_IMAGE_SIZE, TINY_PATCH

__all__ = [
    "ENCODER_DECODER_FAMILY_KINDS",
    "FAMILY_KINDS",
    "IMAGE_FAMILY_KINDS",
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
# single-stack text families (the tests that feed text iterate this), image families (tests/test_vit*.py run
# them) and encoder-decoders (tests/models/test_encdec.py)
FAMILY_KINDS: FamilyTable[str] = FamilyTable(
    lambda f: f.tiny.kind if f.tiny and f.modality == "text" and f.stacks == 1 else None
)
IMAGE_FAMILY_KINDS: FamilyTable[str] = FamilyTable(lambda f: f.tiny.kind if f.tiny and f.modality == "image" else None)
ENCODER_DECODER_FAMILY_KINDS: FamilyTable[str] = FamilyTable(
    lambda f: f.tiny.kind if f.tiny and f.stacks == 2 else None
)


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
        return tiny_tokenizer(encoder=fam.tiny is not None and fam.tiny.kind.labels)
    names, prepend_bos, template = dict(fam.specials.names), fam.specials.prepend_bos, fam.specials.template
    specials = list(dict.fromkeys(names.values()))
    # words the tokenizer cannot split go to an unknown id; families without <unk> still need one
    # for the word-level model, kept as an ordinary (non-special) vocabulary entry
    unk = names.get("unk", "<unk-word>")
    vocab = {
        t: i for i, t in enumerate(specials + ([unk] if unk not in specials else []) + list(WORDS) + [",", ".", "!"])
    }
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace()])
    if template is not None:  # the specials the template names (T5's $A </s>, BART's <s> $A </s>)
        used = [t for t in specials if t in template]
        tok.post_processor = processors.TemplateProcessing(
            single=template, special_tokens=[(t, vocab[t]) for t in used]
        )
    elif prepend_bos:
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
    ViT, a causal LM for the decoders, a ``*ForConditionalGeneration`` for the encoder-decoders) and its
    tokenizer (ViT: its image processor)."""
    torch.manual_seed(seed)
    spec = _tiny_family(family).tiny
    assert spec is not None
    tok = spec.tokenizer() if spec.tokenizer is not None else family_tokenizer(family)
    model = spec.build(tok, layers, heads, d_model)
    model.set_attn_implementation(attn_implementation)
    return model.eval(), tok


def seq2seq_tokenizer(family: str) -> PreTrainedTokenizerFast:
    """The tiny word-level tokenizer of the encoder-decoder ``family`` (its special tokens and template)."""
    _encoder_decoder(family)
    return family_tokenizer(family)


def tiny_seq2seq(
    family: str, seed: int = 0, layers: int = 2, heads: int = 4, d_model: int = 32, attn_implementation: str = "eager"
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """:func:`tiny_model` of an encoder-decoder family (a T5ForConditionalGeneration or
    BartForConditionalGeneration at toy size; recipes in ``models/families/t5.py`` and ``bart.py``)."""
    _encoder_decoder(family)
    return tiny_model(family, seed, layers, heads, d_model, attn_implementation)


def _encoder_decoder(family: str) -> None:
    if family not in ENCODER_DECODER_FAMILY_KINDS:
        raise ValueError(f"no tiny encoder-decoder for family {family!r}; have {sorted(ENCODER_DECODER_FAMILY_KINDS)}")


def save_tiny(family: str, path: str | Path, seed: int = 0, **kw: Any) -> Path:
    """Save ``tiny_model(family)`` and its tokenizer (image processor for ViT) as a checkpoint folder."""
    model, tok = tiny_model(family, seed=seed, **kw)
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path
