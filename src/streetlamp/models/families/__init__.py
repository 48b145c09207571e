"""The registry of single-stack architecture families: one frozen :class:`Family` per model type.

Adding a family is one file here (its :class:`Family` object: module paths, norm placement, readout,
gated MLP, norm offset, q/k/v layout, rotary, bidirectional, circuit wiring, AttnLRP status, special-token layout, extra hooks, tiny-model recipe) plus one
line in :data:`FAMILIES`. Everything else reads the object: the adapter finds the modules, the session
installs the family's extra hooks, the context-mixing methods find the norm, the lenses the readout, the circuit engine its wiring,
AttnLRP its rules, and the tests (site names, conformance, tiny models) iterate the registry. The
encoder-decoders (T5, BART) are families too, of the encoder-decoder kind (their ``encoder_decoder``
stacks; sites in :mod:`streetlamp.models.seq2seq`); :func:`single_stack` and :func:`encoder_decoders`
name each group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

from .bart import BART
from .base import (
    NO_RULES_YET,
    QKV,
    TINY_WINDOW,
    Circuit,
    EncoderDecoder,
    Experts,
    Family,
    NormPlacement,
    Readout,
    SpecialTokens,
    TinySpec,
)
from .bert import BERT, ROBERTA
from .deberta import DEBERTA_V2
from .distilbert import DISTILBERT
from .gemma import GEMMA2, GEMMA3_TEXT
from .gpt2 import GPT2
from .llama import LLAMA, MISTRAL
from .modernbert import MODERNBERT
from .moe import GPT_OSS, MIXTRAL, OLMOE, QWEN2_MOE, QWEN3_MOE
from .phi3 import PHI3
from .qwen import QWEN2, QWEN3
from .t5 import T5
from .vit import VIT

__all__ = [
    "FAMILIES",
    "Experts",
    "NO_RULES_YET",
    "QKV",
    "TINY_WINDOW",
    "UNSUPPORTED",
    "Circuit",
    "EncoderDecoder",
    "Family",
    "FamilyTable",
    "NormPlacement",
    "Readout",
    "SpecialTokens",
    "TinySpec",
    "encoder_decoders",
    "single_stack",
    "unsupported_message",
]

# model_type -> family; one line per family
FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        BERT,
        ROBERTA,
        DISTILBERT,
        GPT2,
        LLAMA,
        MISTRAL,
        QWEN2,
        QWEN3,
        MIXTRAL,
        QWEN2_MOE,
        QWEN3_MOE,
        OLMOE,
        GPT_OSS,
        PHI3,
        GEMMA2,
        GEMMA3_TEXT,
        MODERNBERT,
        DEBERTA_V2,
        VIT,
        T5,
        BART,
    )
}

# Families whose attention transformers 5 does not compute through ALL_ATTENTION_FUNCTIONS (so ours
# cannot be registered), or that need inputs streetlamp does not model yet: the reason is the error.
UNSUPPORTED: dict[str, str] = {
    "deberta": "DeBERTa v1 computes its disentangled attention inside its own module in transformers 5, "
    "not through ALL_ATTENTION_FUNCTIONS, and streetlamp hooks only DeBERTa-v2/v3's module "
    "(model_type 'deberta-v2'); use a v2/v3 checkpoint",
}


def single_stack() -> list[str]:
    """The registered single-stack families (classifiers, causal LMs, image classifiers), sorted."""
    return sorted(n for n, f in FAMILIES.items() if f.stacks == 1)


def encoder_decoders() -> list[str]:
    """The registered encoder-decoder families, sorted."""
    return sorted(n for n, f in FAMILIES.items() if f.stacks == 2)


def unsupported_message(model_type: str) -> str:
    """One line: why ``model_type`` cannot be loaded, and the supported families."""
    why = UNSUPPORTED.get(model_type, "not supported")
    # the encoder-decoders after the single-stack families
    return (
        f"model type {model_type!r}: {why}; supported: {', '.join(single_stack())}; "
        f"encoder-decoder: {', '.join(encoder_decoders())}"
    )


T = TypeVar("T")


class FamilyTable(Mapping[str, T], Generic[T]):
    """A read-only table ``name -> fact(family)`` over the registered families whose fact is not None,
    read from :data:`FAMILIES` at each use (a family registered later is in it). The per-fact tables that
    existed before the family objects (``DECOMPOSE``, ``READOUT``, ``GATED_FAMILIES``, ``RULE_FAMILIES``,
    ``FAMILY_KINDS``) are such views, kept where callers and tests still use the names."""

    def __init__(self, fact: Callable[[Family], T | None]) -> None:
        self._fact = fact

    def _table(self) -> dict[str, T]:
        out = {}
        for name, f in FAMILIES.items():
            v = self._fact(f)
            if v is not None:
                out[name] = v
        return out

    def __getitem__(self, name: str) -> T:
        return self._table()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __repr__(self) -> str:
        return f"FamilyTable({self._table()!r})"
