"""Removing tokens from a causal LM's input so that only the token's content goes away.

Deleting a token from a decoder's input also moves things that are not its content:

* **the attention sink.** Decoders park most attention on the first position. SmolLM2 adds no BOS, so
  its first word is the sink; deleting it makes the next word the sink. On "The animal didn't cross
  the street because it was too tired. In that sentence, it refers to the" deleting "The" dropped
  p(" animal") from 0.556 to 0.011, as much as deleting " animal" itself (0.011).
* **the explained position.** Deleting the last token makes the previous token the one whose next-token
  distribution is read: a different question, not the same question without the token.

The rule (``DECODER_RULE``), for ``delete`` on a causal LM: a removed first position is *replaced* by
the document-start token (:func:`sink_token`) rather than deleted, so position 0 stays a document
start and the sink stays put; the explained (last) position is never removed (no score, like a special
token). Other removed tokens are deleted. On the sentence above the first rule gives p(" animal") =
0.431 without "The" (drop 0.126), against 0.011 without " animal" (``tests/runners/test_generation_removal.py``).
Replacements (``mask``/``unk``/``pad``) keep every position and are unchanged; classifiers are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..models.adapter import ModelAdapter

DECODER_RULE = (
    "decoder removal: a removed first token is replaced by the document-start token {sink!r} (the attention "
    "sink stays at position 0; a BOS the tokenizer adds is special and never removed), the explained last "
    "position is never removed, other removed tokens are deleted"
)


def sink_token(adapter: ModelAdapter) -> int:
    """The token a causal LM reads as the start of a document (:meth:`ModelAdapter.empty_context_token`:
    ``<|endoftext|>`` where the vocabulary has it, else BOS, else EOS). SmolLM2's BOS ``<|im_start|>`` is a
    chat marker: replacing "The" by it left p(" animal") at 0.014."""
    return adapter.empty_context_token()


@dataclass(frozen=True)
class Removal:
    """How absent tokens are taken out of one model's input. ``token_id``: the replacement (None =
    delete); ``sink_id``: for deletion on a causal LM, what a removed position 0 becomes (None: plain
    deletion); ``keep_last``: the explained last position is never removed."""

    token_id: int | None
    sink_id: int | None = None
    keep_last: bool = False

    @classmethod
    def of(cls, adapter: ModelAdapter, token_id: int | None) -> Removal:
        if token_id is None and adapter.kind.removal == "causal":
            return cls(None, sink_token(adapter), True)
        return cls(token_id)

    def protected(self, n: int) -> np.ndarray:
        """Bool ``[n]``: positions never removed by this rule (the explained last position of a decoder)."""
        out = np.zeros(n, dtype=bool)
        if self.keep_last and n:
            out[-1] = True
        return out

    def row(self, ids: torch.Tensor, absent: np.ndarray) -> torch.Tensor:
        """``ids`` (1-D) with the positions in ``absent`` (bool) removed under this rule."""
        keep = torch.from_numpy(np.asarray(absent, dtype=bool) & ~self.protected(len(ids)))
        if self.token_id is not None:
            row = ids.clone()
            row[keep] = self.token_id
            return row
        if self.sink_id is not None and len(ids) and bool(keep[0]):
            head = torch.tensor([self.sink_id], dtype=ids.dtype)
            return torch.cat([head, ids[1:][~keep[1:]]])
        return ids[~keep]

    def ids(self, ids: list[int], remove: set[int]) -> list[int]:
        """The list form of :meth:`row` (positions in ``remove`` absent)."""
        absent = np.zeros(len(ids), dtype=bool)
        absent[list(remove)] = True
        return self.row(torch.tensor(ids, dtype=torch.long), absent).tolist()

    def describe(self, adapter: ModelAdapter) -> str | None:
        """The rule in words, for the output (None where deletion/replacement is the plain one)."""
        if self.sink_id is None:
            return None
        return DECODER_RULE.format(sink=adapter.tokenizer.convert_ids_to_tokens(self.sink_id))


ENCDEC_RULE = (
    "encoder-decoder removal: a source token is {how} (structural specials kept{special}); a decoder input "
    "(an earlier target token) is {how}{shift}; the decoder start token is never removed{keep}"
)


class EncDecRemoval:
    """Removing tokens from an encoder-decoder's input (:class:`~streetlamp.methods.views.Seq2SeqView`).

    * **a source token** (encoder input) is replaced by the method's ``replacement`` (``mask`` falls back to
      ``unk``, ``pad``, ``eos`` as everywhere: T5 has no ``<mask>``, its ``<unk>`` is used) or, with
      ``delete``, deleted: the encoder is bidirectional and has no start token, so a deletion moves no sink
      and no explained position. The structural specials the tokenizer adds (T5's ``</s>``, BART's ``<s>``
      and ``</s>``) are not removed unless ``occlude_special``.
    * **a decoder input** ``i >= 1`` (target token ``y_{i-1}``) is replaced in place, or deleted: the later
      decoder inputs move one position left and ``y_j`` is read after the last one left. The decoder start
      token (input 0) is never removed; with ``delete`` neither is decoder input ``j`` for row ``j``, the input
      ``y_j`` is read after (deleting it would explain another position: the causal-LM rule above). A decoder
      input after ``j`` is not an input of row ``j``.
    """

    @staticmethod
    def describe(used: str, token: str | None, occlude_special: bool) -> str:
        delete = used == "delete"
        return ENCDEC_RULE.format(
            how="deleted" if delete else f"replaced by {token!r}",
            special=" unless occlude_special" if not occlude_special else ": occlude_special, they are removed too",
            shift=" (later decoder inputs move left; target j is read after the last one left)" if delete else "",
            keep=", nor, for row j, decoder input j (the one y_j is read after)" if delete else "",
        )

    @staticmethod
    def remove(ids: torch.Tensor, absent: np.ndarray, token_id: int | None) -> torch.Tensor:
        """``ids`` (1-D) with the positions in ``absent`` (bool) replaced by ``token_id`` or deleted (None)."""
        if not absent.any():
            return ids
        mask = torch.from_numpy(np.asarray(absent, dtype=bool))
        if token_id is None:
            return ids[~mask]
        out = ids.clone()
        out[mask] = token_id
        return out
