"""Features of a text for the perturbation methods (occlusion, SHAP, LIME): tokens or words.

A feature is a group of token positions perturbed together: one token, or with ``group="word"``
one word (its subword tokens). The model's structural special tokens
(:meth:`~streetlamp.models.adapter.ModelAdapter.special_mask`: [CLS], [SEP], BOS, ...; not [UNK])
are in no feature unless asked for.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

import numpy as np

from ..models.adapter import ModelAdapter

GROUPS = ("token", "word")
_PUNCT = set(string.punctuation)


def word_starts(tokens: Sequence[str], special: np.ndarray) -> np.ndarray:
    """Bool ``[n]``: where a word begins.

    WordPiece marks continuations with a ``##`` prefix; byte-level BPE (``Ġ``) and SentencePiece
    (``▁``) mark word *starts* instead. The marker style is read from the tokens themselves: if any
    token starts with ``Ġ``/``▁`` the text uses start markers, otherwise ``##`` continuations
    (a word-level tokenizer then makes every token a word). With start markers, a token made only
    of punctuation, the first token, and the token after a special token also start a word.
    """
    start_marked = any(t.startswith(("Ġ", "▁")) for t in tokens)
    out = np.zeros(len(tokens), dtype=bool)
    for i, t in enumerate(tokens):
        if special[i] or i == 0 or special[i - 1]:
            out[i] = True
        elif start_marked:
            bare = t.lstrip("Ġ▁")
            out[i] = t != bare or (bool(bare) and all(c in _PUNCT for c in bare))
        else:
            out[i] = not t.startswith("##")
    return out


def feature_groups(
    adapter: ModelAdapter,
    ids: Sequence[int],
    tokens: Sequence[str],
    group: str,
    include_special: bool,
    protected: np.ndarray | None = None,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """``groups`` ``[n]`` (feature id per position, -1 = never perturbed) and the features' positions.
    ``protected`` (bool ``[n]``) positions are in no feature (a decoder's explained position under deletion)."""
    special = adapter.special_mask(ids)
    n = len(ids)
    starts = word_starts(tokens, special) if group == "word" else np.ones(n, dtype=bool)
    groups = np.full(n, -1, dtype=np.int32)
    g = -1
    for i in range(n):
        if protected is not None and protected[i]:
            continue
        if special[i]:
            if include_special:
                g += 1
                groups[i] = g
            continue
        if i == 0 or starts[i] or groups[i - 1] == -1:
            g += 1
        groups[i] = g
    feats = [np.flatnonzero(groups == k) for k in range(g + 1)]
    return groups, feats
