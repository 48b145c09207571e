"""Shared pieces: batched output distributions of token-id rows, and ranking by score."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..batching import group_by_budget
from ..models.adapter import Inputs, ModelAdapter
from ..models.context import fused_attention
from ..models.kinds import ModelKind

# Integrated gradients inside evaluate on a classifier, when the run gives no rule: Clenshaw–Curtis (the default
# before issue 28) reaches the tolerance in fewer gradient evaluations there than ``auto``, whose coarse pass sends
# these integrands to the panels (minilm-sentiment, the benchmark's 3 movie sentences: 83 against 115); ``auto``
# stays for causal LMs and encoder-decoders (a pre-norm decoder's spike), and an example Clenshaw–Curtis does not
# converge on is redone with ``auto`` (pipeline.py).
IG_CLASSIFIER_RULE = "clenshaw_curtis"


def evaluate_params(params: Mapping[str, Mapping[str, Any]], name: str, kind: ModelKind) -> dict[str, Any]:
    """The parameters evaluate builds method ``name`` with on a model of ``kind``: the run's ``params[name]``, and
    :data:`IG_CLASSIFIER_RULE` for integrated gradients on a classifier when they name no rule."""
    p = dict(params.get(name, {}))
    if name == "integrated_gradients" and kind.labels and "rule" not in p:
        p["rule"] = IG_CLASSIFIER_RULE
    return p


# On CPU a forward pass costs about this many tokens' worth of work besides its tokens (reading the weights, the
# Python of a pass): minilm-sentiment, one thread, 17 tokens: one row alone 13.4 ms, 3.4 ms a row in a batch of 64
# (0.2 ms a token), so a pass is worth ~50 tokens; below that a padded token costs more than a pass saves.
PASS_TOKENS = 48


def length_groups(lengths: Sequence[int], budget: int | None, device: torch.device | str) -> list[list[int]]:
    """:func:`~streetlamp.batching.group_by_budget`'s groups, each split (on CPU) where a pass of its own costs
    less than the padding it saves: the split of each group's sorted lengths into runs that minimises
    ``sum(PASS_TOKENS + rows * longest)`` (a dynamic programme over its distinct lengths). Erasure rows span every
    length from the rationale alone to the whole text, and one padded batch of them is half padding."""
    groups = group_by_budget(lengths, budget, device)
    if torch.device(device).type != "cpu":  # a GPU pass costs far more than its padding
        return groups
    out: list[list[int]] = []
    for g in groups:  # each group is in increasing length order
        distinct = sorted({lengths[i] for i in g})
        count = np.cumsum([sum(1 for i in g if lengths[i] == n) for n in distinct])
        best = [0.0] + [np.inf] * len(distinct)  # best[j]: the cheapest split of the first j distinct lengths
        cut = [0] * (len(distinct) + 1)
        for j in range(1, len(distinct) + 1):
            for i in range(j):  # the last run holds distinct lengths i .. j-1
                cost = best[i] + PASS_TOKENS + (count[j - 1] - (count[i - 1] if i else 0)) * distinct[j - 1]
                if cost < best[j]:
                    best[j], cut[j] = cost, i
        bounds, j = [], len(distinct)
        while j:
            bounds.append(distinct[j - 1])
            j = cut[j]
        lo = 0
        for hi in sorted(bounds):
            out.append([i for i in g if lo < lengths[i] <= hi])
            lo = hi
    return out


# An edit builder gets the row indices of the batch being run and returns {site: fn} (or {}).
EditBuilder = Callable[[list[int], int], dict]


# one stored metric: (example_id, method, metric, value) -- the rows of evaluate's and replicate's run store
Rows = list[tuple[str, str, str, float]]


class ChunkTables:
    """What a chunk of examples writes to the run store: metric ``rows`` and per-example ``arrays``."""

    def __init__(self, example_ids: Sequence[str]) -> None:
        self.rows: Rows = []
        self.arrays: dict[str, dict[str, np.ndarray]] = {e: {} for e in example_ids}

    def add(self, example_id: str, method: str, metric: str, value: float | bool | np.generic) -> None:
        self.rows.append((example_id, method, metric, float(value)))

    def out(self) -> tuple[Rows, dict[str, dict[str, np.ndarray]]]:
        return self.rows, self.arrays


@torch.no_grad()
def output_map(
    adapter: ModelAdapter,
    rows: Sequence[Sequence[int]],
    budget: int | None,
    fn: Callable[[list[int], torch.Tensor], torch.Tensor],
    width: int,
    edit: EditBuilder | None = None,
) -> np.ndarray:
    """``fn(group, probs)`` for every row, ``[rows, width]`` float64, never holding all distributions.

    ``probs`` is the softmax over the explained outputs of the rows ``group`` (float64, on the
    model's device). Rows are grouped by length within the token budget (:func:`length_groups`); ``edit(group, width)``
    may return site edits for that group (e.g. zeroed attention items). A causal LM's vocabulary
    makes ``[rows, vocab]`` large, so callers reduce each group to what they need.

    Only outputs are read, so every layer whose attention nobody edits runs the fused kernel
    (:func:`~streetlamp.models.context.fused_attention`; an edited layer stays eager): the same numbers up to
    float reassociation (tests/evaluation/test_frozen.py compares against the eager path)."""
    out = np.zeros((len(rows), width), dtype=np.float64)
    for group in length_groups([len(r) for r in rows], budget, adapter.device):
        inp = Inputs.from_ids(adapter, [rows[i] for i in group], strings=False)
        e = edit(group, inp.input_ids.shape[1]) if edit is not None else None
        with fused_attention():
            logits = adapter.forward(inp, edit=e or None).logits
        out[group] = fn(group, torch.softmax(logits.double(), -1)).reshape(len(group), width).cpu().numpy()
    return out


def output_probs(
    adapter: ModelAdapter, rows: Sequence[Sequence[int]], budget: int | None, edit: EditBuilder | None = None
) -> np.ndarray:
    """Softmax over the explained outputs for every row, ``[rows, n_outputs]`` float64."""
    return output_map(adapter, rows, budget, lambda group, p: p, adapter.n_outputs, edit)


def output_prob_of(
    adapter: ModelAdapter,
    rows: Sequence[Sequence[int]],
    budget: int | None,
    index: Sequence[int],
    edit: EditBuilder | None = None,
) -> np.ndarray:
    """Probability of output ``index[r]`` for every row ``r``, ``[rows]``.

    Without an edit, a row is a pure function of its ids: repeated (ids, index) pairs (the erasure plans'
    full and empty inputs, a comprehensiveness row equal to a deletion-curve row, two rankings removing the
    same tokens) run once and are copied."""
    if edit is None and len(rows):
        firsts, where = unique_rows([(int(i), *map(int, r)) for r, i in zip(rows, index)])
        if len(firsts) < len(rows):
            uniq = output_prob_of(adapter, [rows[r] for r in firsts], budget, [index[r] for r in firsts], None)
            return uniq[where]
    idx = torch.as_tensor(np.asarray(index, np.int64))

    def fn(group: list[int], p: torch.Tensor) -> torch.Tensor:
        return p.gather(1, idx[group].view(-1, 1).to(p.device))

    return output_map(adapter, rows, budget, fn, 1, edit)[:, 0]


def unique_rows(keys: Sequence[object]) -> tuple[list[int], np.ndarray]:
    """The first index of each distinct key and, per key, the position of its first in that list: rows with
    equal keys (the same ids under the same edit) run once and are copied."""
    first: dict[object, int] = {}
    firsts: list[int] = []
    where = np.zeros(len(keys), dtype=np.int64)
    for r, k in enumerate(keys):
        u = first.setdefault(k, len(first))
        if u == len(firsts):
            firsts.append(r)
        where[r] = u
    return firsts, where


def rank_desc(scores: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Indices of ``candidates`` (bool mask) ordered by decreasing score, ties by position (stable)."""
    idx = np.flatnonzero(candidates)
    return idx[np.argsort(-scores[idx], kind="stable")]
