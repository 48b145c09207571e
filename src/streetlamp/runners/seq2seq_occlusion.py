"""Occlusion for ``explain-generation`` on an encoder-decoder: leave one source or target token out.

Cell ``(j, i) = F_j(x) - F_j(x with token i removed)``, where ``F_j`` is the quantity of target token
``y_j`` read after decoder input ``j`` (teacher forcing; the target is the greedy or given one, kept
fixed: forced decoding) and the columns are the source tokens, then the decoder inputs, as in every
seq2seq matrix. The removal rule (:data:`ENCDEC_RULE`):

* **a source token** (encoder input) is replaced by the method's ``replacement`` (``mask`` falls back to
  ``unk``, ``pad``, ``eos`` as everywhere: T5 has no ``<mask>``, its ``<unk>`` is used) or, with
  ``delete``, deleted: the encoder is bidirectional and has no start token, so a deletion moves no
  sink and no explained position. The structural specials the tokenizer adds (T5's ``</s>``, BART's
  ``<s>`` and ``</s>``) are not removed unless ``occlude_special``.
* **a decoder input** ``i >= 1`` (target token ``y_{i-1}``) is replaced in place, or deleted: the
  later decoder inputs move one position left and ``y_j`` is read after the last one left. The
  decoder start token (input 0) is never removed; with ``delete`` neither is decoder input ``j`` for
  row ``j``, the input ``y_j`` is read after (deleting it would explain another position: the
  causal-LM rule of :mod:`..methods.removal`). A decoder input after ``j`` is not an input of row ``j``.

One forward pass per removed token gives every row's cell at once (the decoder is causal); passes of
equal shape are batched within the token budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..batching import chunks
from ..errors import StreetlampError
from ..methods.occlusion import Occlusion
from ..methods.scorer import check_replacement, occlusion_replacement
from ..models.adapter import Target
from ..models.seq2seq import Seq2SeqAdapter

ENCDEC_RULE = (
    "encoder-decoder removal: a source token is {how} (structural specials kept{special}); a decoder input "
    "(an earlier target token) is {how}{shift}; the decoder start token is never removed{keep}"
)


@dataclass
class OcclusionResult:
    matrix: np.ndarray  # [k, S+k]: F_j - F_j(without token i); 0 where not removed
    removed: np.ndarray  # [k, S+k] uint8: 1 where the cell's token was removed for that row
    base: np.ndarray  # [k]: F_j on the unperturbed input
    rule: str
    info: dict


def rule_text(used: str, token: str | None, occlude_special: bool) -> str:
    delete = used == "delete"
    return ENCDEC_RULE.format(
        how="deleted" if delete else f"replaced by {token!r}",
        special=" unless occlude_special" if not occlude_special else ": occlude_special, they are removed too",
        shift=" (later decoder inputs move left; target j is read after the last one left)" if delete else "",
        keep=", nor, for row j, decoder input j (the one y_j is read after)" if delete else "",
    )


def check_params(adapter: Seq2SeqAdapter, method: Occlusion) -> tuple[str, int | None, str | None]:
    """One line for parameters the encoder-decoder path does not take; else the replacement actually used."""
    check_replacement(method.replacement, method.group)
    if method.group != "token":
        raise StreetlampError(
            "occlusion on an encoder-decoder removes single tokens: group 'word' is not built there (use 'token')"
        )
    return occlusion_replacement(adapter, method.replacement)


def seq2seq_occlusion(
    adapter: Seq2SeqAdapter,
    src: torch.Tensor,
    gen: list[int],
    method: Occlusion,
    target: Target,
    batch_size: int | None = None,
) -> OcclusionResult:
    """Leave-one-out over source ``src`` ``[S]`` and decoder inputs for the forced target ``gen``."""
    used, tid, token = check_params(adapter, method)
    src = src.cpu()
    dec = adapter.decoder_inputs(gen)
    S, k = len(src), len(gen)
    keep_src = adapter.special_mask(src) if not method.occlude_special else np.zeros(S, dtype=bool)
    # one perturbed input per removed token: (column, source row, decoder row, read[j] or -1)
    cases: list[tuple[int, torch.Tensor, torch.Tensor, list[int]]] = []
    for i in range(S):
        if keep_src[i]:
            continue
        if tid is None and S == 1:
            raise StreetlampError("deleting the only source token leaves the encoder no input: use a replacement")
        if tid is None:
            s_row = torch.cat([src[:i], src[i + 1 :]])
        else:
            s_row = src.clone()
            s_row[i] = tid
        cases.append((i, s_row, dec, list(range(k))))
    for i in range(1, k):
        if tid is None:
            d_row = torch.cat([dec[:i], dec[i + 1 :]])
            read = [j - 1 if j > i else -1 for j in range(k)]
        else:
            d_row = dec.clone()
            d_row[i] = tid
            read = [j if j >= i else -1 for j in range(k)]
        cases.append((S + i, src, d_row, read))
    index = torch.tensor(gen, dtype=torch.long)
    with torch.no_grad():
        logits = adapter.run(src.view(1, -1), dec.view(1, -1)).logits[0]
        base = adapter.score(logits, index, target).double().cpu().numpy()
    matrix = np.zeros((k, S + k))
    removed = np.zeros((k, S + k), np.uint8)
    shapes: dict[tuple[int, int], list[int]] = {}
    for c, (_, s_row, d_row, _) in enumerate(cases):
        shapes.setdefault((len(s_row), len(d_row)), []).append(c)
    passes = 0
    for (ls, ld), members in shapes.items():
        for sl in chunks(len(members), ls + ld, batch_size, adapter.device):
            group = [cases[c] for c in members[sl]]
            with torch.no_grad():
                out = adapter.run(torch.stack([g[1] for g in group]), torch.stack([g[2] for g in group])).logits
            passes += 1
            rows, pos, js = [], [], []
            for r, (_, _, _, read) in enumerate(group):
                for j, p in enumerate(read):
                    if p >= 0:
                        rows.append(r)
                        pos.append(p)
                        js.append(j)
            f = adapter.score(out[rows, pos], index[js], target).double().cpu().numpy()
            for r, j, v in zip(rows, js, f):
                col = group[r][0]
                matrix[j, col] = base[j] - v
                removed[j, col] = 1
    info = {
        "replacement": method.replacement,
        "replacement_used": used,
        "replacement_token": token,
        "occlude_special": method.occlude_special,
        "removal_rule": rule_text(used, token, method.occlude_special),
        "forward_passes": passes + 1,
        "base_scores": base.tolist(),
    }
    return OcclusionResult(matrix, removed, base, info["removal_rule"], info)
