"""Shared pieces: token-id rows to :class:`Inputs`, batched output distributions, JS divergence."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from ..batching import group_by_budget
from ..models.adapter import Inputs, ModelAdapter

# An edit builder gets the row indices of the batch being run and returns {site: fn} (or {}).
EditBuilder = Callable[[list[int], int], dict]


def inputs_from_rows(adapter: ModelAdapter, rows: Sequence[Sequence[int]]) -> Inputs:
    """Right-padded Inputs from token-id lists (special tokens included as given)."""
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
def output_probs(adapter: ModelAdapter, rows: Sequence[Sequence[int]], budget: int | None,
                 edit: EditBuilder | None = None) -> np.ndarray:
    """Softmax over the explained outputs for every row, ``[rows, n_outputs]`` float64.

    Rows are grouped by length within the token budget; ``edit(group, width)`` may return site edits
    for that group (e.g. zeroed attention items)."""
    out = np.zeros((len(rows), adapter.n_outputs), dtype=np.float64)
    for group in group_by_budget([len(r) for r in rows], budget, adapter.device):
        inp = inputs_from_rows(adapter, [rows[i] for i in group])
        e = edit(group, inp.input_ids.shape[1]) if edit is not None else None
        logits = adapter.forward(inp, edit=e or None).logits
        out[group] = torch.softmax(logits.double(), -1).cpu().numpy()
    return out


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


def tvd(p: np.ndarray, q: np.ndarray, axis: int = -1) -> np.ndarray:
    """Total variation distance ``0.5 * sum |p - q|`` (Jain & Wallace's output-change measure)."""
    return 0.5 * np.abs(np.asarray(p, np.float64) - np.asarray(q, np.float64)).sum(axis)


def rank_desc(scores: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Indices of ``candidates`` (bool mask) ordered by decreasing score, ties by position (stable)."""
    idx = np.flatnonzero(candidates)
    return idx[np.argsort(-scores[idx], kind="stable")]
