"""Head-type detector (after TransformerLens' ``head_detector``): previous-token, duplicate-token,
induction and attention-sink scores per head.

For a token sequence ``t`` and a head's pattern ``A[query, key]``, each type marks target cells:

* previous-token: ``(i, i-1)``;
* duplicate-token: ``(i, j)`` with ``j < i`` and ``t_j = t_i``;
* induction: ``(i, j+1)`` with ``j + 1 < i`` and ``t_j = t_i`` (the token after an earlier copy);
* attention sink: ``(i, 0)``.

A head's score is the attention mass on the target cells, averaged over the queries that have at
least one target cell (TransformerLens' ``"mul"`` measure averages over every query, so a perfect
induction head scores only about 1/2 on a sequence repeated twice; here it scores 1). The sink
score leaves out query 0, which can only attend to itself. Scores are averaged over sequences.
The model is run on ``n_seqs`` random sequences of ``length`` distinct non-special tokens, each
repeated twice (as TransformerLens does), seeded.
"""

from __future__ import annotations

import numpy as np
import torch

from ..methods.gradient import ids_inputs
from ..models.adapter import ModelAdapter

TYPES = ("previous_token", "duplicate_token", "induction", "attention_sink")


def target_cells(tokens: np.ndarray) -> dict[str, np.ndarray]:
    """Bool ``[query, key]`` target cells of each type for the token ids ``tokens`` ``[pos]``."""
    t = np.asarray(tokens)
    n = len(t)
    i, j = np.indices((n, n))
    same = (t[:, None] == t[None, :]) & (j < i)
    induction = np.zeros((n, n), bool)
    induction[:, 1:] = same[:, :-1] & (j[:, 1:] < i[:, 1:])  # key j+1 after an earlier copy at j, j+1 < i
    sink = np.zeros((n, n), bool)
    sink[1:, 0] = True
    return {"previous_token": j == i - 1, "duplicate_token": same, "induction": induction, "attention_sink": sink}


def type_scores(pattern: np.ndarray, tokens: np.ndarray) -> dict[str, np.ndarray]:
    """Scores ``[...]`` per type from patterns ``[..., query, key]`` (e.g. ``[layer, head, q, k]``)."""
    out = {}
    for name, cells in target_cells(tokens).items():
        rows = cells.any(1)
        mass = (np.asarray(pattern, np.float64) * cells).sum(-1)  # [..., query]
        out[name] = mass[..., rows].mean(-1) if rows.any() else np.full(pattern.shape[:-2], np.nan)
    return out


def random_repeated(adapter: ModelAdapter, length: int, n_seqs: int, seed: int) -> list[np.ndarray]:
    """``n_seqs`` sequences of ``length`` distinct random non-special token ids, each repeated twice."""
    rng = np.random.default_rng(seed)
    special = set(adapter.tokenizer.all_special_ids)
    pool = np.array([i for i in range(len(adapter.tokenizer)) if i not in special and i < adapter.n_outputs])
    return [np.tile(rng.choice(pool, size=length, replace=False), 2) for _ in range(n_seqs)]


def detect_head_types(adapter: ModelAdapter, length: int = 20, n_seqs: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    """Scores ``[layer, head]`` per type, averaged over the random repeated sequences."""
    sums = {k: np.zeros((adapter.n_layers, adapter.n_heads)) for k in TYPES}
    seqs = random_repeated(adapter, length, n_seqs, seed)
    for s in seqs:
        with torch.no_grad():
            fwd = adapter.forward(ids_inputs(adapter, torch.tensor(s)), record=["layers.*.attn.pattern"])
        pat = np.stack(
            [fwd.cache[f"layers.{l}.attn.pattern"][0].double().cpu().numpy() for l in range(adapter.n_layers)]
        )
        for k, v in type_scores(pat, s).items():
            sums[k] += v
    return {k: v / len(seqs) for k, v in sums.items()}
