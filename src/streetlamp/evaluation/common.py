"""Shared pieces: token-id rows to :class:`Inputs`, batched output distributions, JS divergence."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from ..batching import group_by_budget
from ..models.adapter import Inputs, ModelAdapter

# An edit builder gets the row indices of the batch being run and returns {site: fn} (or {}).
EditBuilder = Callable[[list[int], int], dict]


def empty_context_token(adapter: ModelAdapter) -> int:
    """What a causal LM reads when erasure leaves no token at all: BOS, else EOS (GPT-2's
    ``<|endoftext|>`` starts a document); a classifier always keeps its [CLS]/[SEP]."""
    tok = adapter.tokenizer
    return int(tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id)


def inputs_from_rows(adapter: ModelAdapter, rows: Sequence[Sequence[int]]) -> Inputs:
    """Right-padded Inputs from token-id lists (special tokens included as given). An empty row
    (erasure removed every token of a causal LM's prompt) becomes :func:`empty_context_token`."""
    if any(len(r) == 0 for r in rows):
        rows = [list(r) if len(r) else [empty_context_token(adapter)] for r in rows]
    width = max(1, max(len(r) for r in rows))
    pad = int(adapter.tokenizer.pad_token_id)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
        mask[i, : len(r)] = 1
    toks = [adapter.tokenizer.convert_ids_to_tokens(list(r)) for r in rows]
    return Inputs(ids, mask, toks, toks, ["" for _ in rows], [False] * len(rows))


def special_mask(adapter: ModelAdapter, ids: Sequence[int]) -> np.ndarray:
    """True where the token is a special token ([CLS], [SEP], <s> ...): never ranked nor removed."""
    special = set(adapter.tokenizer.all_special_ids)
    return np.array([int(i) in special for i in ids], dtype=bool)


@torch.no_grad()
def output_map(adapter: ModelAdapter, rows: Sequence[Sequence[int]], budget: int | None,
               fn: Callable[[list[int], torch.Tensor], torch.Tensor], width: int,
               edit: EditBuilder | None = None) -> np.ndarray:
    """``fn(group, probs)`` for every row, ``[rows, width]`` float64, never holding all distributions.

    ``probs`` is the softmax over the explained outputs of the rows ``group`` (float64, on the
    model's device). Rows are grouped by length within the token budget; ``edit(group, width)``
    may return site edits for that group (e.g. zeroed attention items). A causal LM's vocabulary
    makes ``[rows, vocab]`` large, so callers reduce each group to what they need."""
    out = np.zeros((len(rows), width), dtype=np.float64)
    for group in group_by_budget([len(r) for r in rows], budget, adapter.device):
        inp = inputs_from_rows(adapter, [rows[i] for i in group])
        e = edit(group, inp.input_ids.shape[1]) if edit is not None else None
        logits = adapter.forward(inp, edit=e or None).logits
        out[group] = fn(group, torch.softmax(logits.double(), -1)).reshape(len(group), width).cpu().numpy()
    return out


def output_probs(adapter: ModelAdapter, rows: Sequence[Sequence[int]], budget: int | None,
                 edit: EditBuilder | None = None) -> np.ndarray:
    """Softmax over the explained outputs for every row, ``[rows, n_outputs]`` float64."""
    return output_map(adapter, rows, budget, lambda group, p: p, adapter.n_outputs, edit)


def output_prob_of(adapter: ModelAdapter, rows: Sequence[Sequence[int]], budget: int | None,
                   index: Sequence[int], edit: EditBuilder | None = None) -> np.ndarray:
    """Probability of output ``index[r]`` for every row ``r``, ``[rows]``."""
    idx = torch.as_tensor(np.asarray(index, np.int64))

    def fn(group: list[int], p: torch.Tensor) -> torch.Tensor:
        return p.gather(1, idx[group].view(-1, 1).to(p.device))

    return output_map(adapter, rows, budget, fn, 1, edit)[:, 0]


def js_divergence(p: np.ndarray, q: np.ndarray, axis: int = -1) -> np.ndarray:
    """Jensen-Shannon divergence in bits (log base 2, so it lies in [0, 1])."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    m = 0.5 * (p + q)

    def kl(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(a > 0, a * (np.log2(a) - np.log2(np.where(b > 0, b, 1.0))), 0.0)
        return t.sum(axis)

    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def js_divergence_t(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """:func:`js_divergence` over the last axis, in torch (rows of distributions, bits)."""
    m = 0.5 * (p + q)

    def kl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        safe_b = torch.where(b > 0, b, torch.ones_like(b))
        safe_a = torch.where(a > 0, a, torch.ones_like(a))
        return torch.where(a > 0, a * (torch.log2(safe_a) - torch.log2(safe_b)), torch.zeros_like(a)).sum(-1)

    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def tvd(p: np.ndarray, q: np.ndarray, axis: int = -1) -> np.ndarray:
    """Total variation distance ``0.5 * sum |p - q|`` (Jain & Wallace's output-change measure)."""
    return 0.5 * np.abs(np.asarray(p, np.float64) - np.asarray(q, np.float64)).sum(axis)


def rank_desc(scores: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Indices of ``candidates`` (bool mask) ordered by decreasing score, ties by position (stable)."""
    idx = np.flatnonzero(candidates)
    return idx[np.argsort(-scores[idx], kind="stable")]
