"""Tiny random Transformers of every supported family, built in code (tests, examples, toys).

Each comes with a small word-level tokenizer so nothing is downloaded. ``save_tiny`` writes a
regular Hugging Face checkpoint folder (safetensors) that :func:`streetlamp.load` reads back.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    RobertaConfig,
    RobertaForSequenceClassification,
)

WORDS = ("the a movie film was is not good bad great terrible acting plot but and very really "
         "i loved hated it story boring fun to of when mary john went store gave drink paris "
         "capital france berlin germany nurse doctor said that he she". split())
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
FAMILY_KINDS = {"bert": "classifier", "roberta": "classifier", "distilbert": "classifier",
                "gpt2": "causal_lm", "llama": "causal_lm"}


def tiny_tokenizer(encoder: bool) -> PreTrainedTokenizerFast:
    vocab = {t: i for i, t in enumerate(SPECIALS + list(WORDS) + [",", ".", "!"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace()])
    if encoder:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
        return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                       cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                   eos_token="[SEP]", bos_token="[CLS]", mask_token="[MASK]")


def tiny_model(family: str, seed: int = 0, layers: int = 2, heads: int = 4, d_model: int = 32,
               attn_implementation: str = "eager") -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A randomly initialised model of ``family`` (classifier for encoders, causal LM for decoders)."""
    torch.manual_seed(seed)
    kind = FAMILY_KINDS[family]
    tok = tiny_tokenizer(encoder=kind == "classifier")
    v = len(tok)
    common: dict[str, Any] = dict(vocab_size=v, num_labels=3, id2label={0: "neg", 1: "neu", 2: "pos"},
                                  label2id={"neg": 0, "neu": 1, "pos": 2}, pad_token_id=0)
    model: PreTrainedModel
    cfg: Any  # one of the families' config classes
    if family in ("bert", "roberta"):
        cls_c, cls_m = (BertConfig, BertForSequenceClassification) if family == "bert" else (
            RobertaConfig, RobertaForSequenceClassification)
        cfg = cls_c(hidden_size=d_model, num_hidden_layers=layers, num_attention_heads=heads,
                    intermediate_size=2 * d_model,
                    max_position_embeddings=64 + (2 if family == "roberta" else 0), **common)
        if family == "roberta":
            cfg.pad_token_id = 0
        model = cls_m(cfg)
    elif family == "distilbert":
        cfg = DistilBertConfig(dim=d_model, n_layers=layers, n_heads=heads, hidden_dim=2 * d_model,
                               max_position_embeddings=64, **common)
        model = DistilBertForSequenceClassification(cfg)
    elif family == "gpt2":
        cfg = GPT2Config(n_embd=d_model, n_layer=layers, n_head=heads, n_positions=64, vocab_size=v,
                         pad_token_id=0, bos_token_id=2, eos_token_id=3)
        model = GPT2LMHeadModel(cfg)
    elif family == "llama":
        cfg = LlamaConfig(hidden_size=d_model, num_hidden_layers=layers, num_attention_heads=heads,
                          num_key_value_heads=max(1, heads // 2), intermediate_size=2 * d_model,
                          max_position_embeddings=64, vocab_size=v, pad_token_id=0, bos_token_id=2,
                          eos_token_id=3, tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg)
    else:
        raise ValueError(f"no tiny model for family {family!r}; have {sorted(FAMILY_KINDS)}")
    model.set_attn_implementation(attn_implementation)
    return model.eval(), tok


def save_tiny(family: str, path: str | Path, seed: int = 0, **kw: Any) -> Path:
    model, tok = tiny_model(family, seed=seed, **kw)
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path
