"""Token scores aggregated to words, sentences or paragraphs (``explain-generation --granularity``).

The rule: **a unit's score is the sum of its tokens' scores** (attributions are additive over tokens for
IG, occlusion of a whole unit is not: this is a reading aid, not a re-run). Units come from the
tokenizer's own token strings:

* word: a token starts a word where :func:`~streetlamp.methods.features.word_starts` says so (a
  leading-space marker ``Ġ``/``▁``, a punctuation-only token, or no ``##`` continuation mark), or where
  whitespace (a newline token) separates it from the previous token;
* sentence: after ``.``, ``!`` or ``?`` (closing quotes/brackets allowed) followed by whitespace; the new
  sentence starts at the first token that begins at or after that whitespace (a token carrying the
  whitespace at its start opens the sentence, one carrying it at its end closes the previous one);
* paragraph: the same, where the whitespace holds a blank line (``\\n\\n``, spaces allowed between);
* a structural special token (``<|im_start|>``, BOS, ...) is a unit of its own at every level, and it
  starts a new unit after it.

Every paragraph start is a sentence start and every sentence start a word start, so units nest.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from ..errors import StreetlampError
from ..models.adapter import ModelAdapter
from .features import word_starts

LEVELS = ("token", "word", "sentence", "paragraph")
_SENTENCE_END = re.compile(r"[.!?][\"'”’)\]]*$")
_PARAGRAPH = re.compile(r"\n[ \t]*\n")


def unit_starts(texts: Sequence[str], tokens: Sequence[str], special: np.ndarray, level: str) -> np.ndarray:
    """Bool ``[n]``: where a unit of ``level`` begins. ``texts``: each token's decoded text; ``tokens``: the
    tokenizer's token strings (for the word markers)."""
    if level not in LEVELS:
        raise StreetlampError(f"unknown granularity {level!r}; choose one of {', '.join(LEVELS)}")
    n = len(texts)
    if level == "token":
        return np.ones(n, dtype=bool)
    starts = word_starts(tokens, special)
    for i in range(1, n):  # whitespace that is not a marker (a newline token "ĊĊ") also separates words
        starts[i] |= texts[i][:1].isspace() or texts[i - 1][-1:].isspace()
    if level == "word":
        return starts
    out = np.zeros(n, dtype=bool)
    seg = 0  # start (in characters) of the text since the last special token
    full = ""
    offs = []
    for t in texts:
        offs.append(len(full))
        full += t
    for i, t in enumerate(texts):
        if i == 0 or special[i] or special[i - 1]:
            out[i] = True
            seg = offs[i] + (len(t) if special[i] else 0)
            continue
        before = full[seg : offs[i]].rstrip()
        ws_start = seg + len(before)  # where the whitespace before this point begins
        rest = full[offs[i] :]
        run = full[ws_start : offs[i] + len(rest) - len(rest.lstrip())]
        # the unit starts at the first token that begins at or after the whitespace run
        first = next(j for j in range(1, n + 1) if j == n or offs[j] >= ws_start)
        if not run or first != i or not before:
            continue
        para = bool(_PARAGRAPH.search(run))  # a paragraph break is also a sentence break (units nest)
        out[i] = para if level == "paragraph" else para or bool(_SENTENCE_END.search(before))
    return out


def token_texts(adapter: ModelAdapter, ids: Sequence[int]) -> list[str]:
    """Each token's text as the tokenizer decodes the sequence (the growth of the decoded prefix), so a
    word-level tokenizer's inserted spaces are seen; a token's own decoding where the prefix does not grow
    by appending (e.g. an incomplete UTF-8 byte sequence)."""
    dec = adapter.tokenizer.decode
    out, prev = [], ""
    for i in range(len(ids)):
        cur = str(dec(list(ids[: i + 1])))
        out.append(cur[len(prev) :] if cur.startswith(prev) else str(dec([ids[i]])))
        prev = cur
    return out


def units(adapter: ModelAdapter, ids: Sequence[int], level: str) -> tuple[np.ndarray, list[str]]:
    """``unit`` ``[n]`` (the unit index of each token) and each unit's text."""
    ids = [int(i) for i in ids]
    texts = token_texts(adapter, ids)
    tokens = [str(t) for t in adapter.tokenizer.convert_ids_to_tokens(ids)]
    starts = unit_starts(texts, tokens, adapter.special_mask(ids), level)
    unit = np.cumsum(starts) - 1
    labels = [
        "".join(texts[j] for j in np.flatnonzero(unit == u)) for u in range(int(unit[-1]) + 1 if len(unit) else 0)
    ]
    return unit.astype(np.int64), labels


def aggregate(matrix: np.ndarray, unit: np.ndarray) -> np.ndarray:
    """``[rows, n_units]``: the sum of each unit's columns of ``matrix`` ``[rows, n]``."""
    n_units = int(unit.max()) + 1 if len(unit) else 0
    out = np.zeros((matrix.shape[0], n_units), dtype=np.float64)
    np.add.at(out.T, unit, matrix.T.astype(np.float64))
    return out
