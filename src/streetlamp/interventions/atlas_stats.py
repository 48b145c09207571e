"""Where a head looks on one sequence (METHODS.md §10): the atlas' attention statistics.

For a head's pattern ``A[i, j]`` (query ``i``, key ``j``) on one sequence of ``n`` real tokens (padding
left out), every statistic is a mean over query rows unless said otherwise:

* ``entropy``: ``-Σ_j A[i,j] log A[i,j]`` (nats), mean over every query;
* ``sink``: ``A[i, 0]``, the mass on the first token / BOS, mean over queries ``i >= 1`` (lens' head-type
  ``attention_sink``: query 0 can only attend to itself in a decoder);
* ``first_token``: ``A[i, 0]`` mean over **every** query, the first included (Gu et al. 2024's α¹ on this
  sequence, arXiv 2410.10781: its share of heads above ε over a corpus is their Sink₁^ε; a decoder's query 0
  attends only to itself, so it adds ``(1 - sink) / n`` to ``sink``);
* ``self``: ``A[i, i]``, mean over every query;
* ``distance``: ``Σ_j A[i,j] |i - j|``, mean over every query (equals METHODS' ``Σ_j A[i,j](i - j)`` in a
  causal model, where ``j <= i``; an encoder's keys after the query count as far as those before);
* ``previous_token``, ``duplicate_token``, ``induction``: lens' head types,
  :func:`streetlamp.interventions.head_types.type_scores` (NaN on a sequence with no target cell, e.g.
  no repeated token);
* ``concentration``: of the explained position's row only, ``1 - H(row) / log(k)`` with ``k`` the keys
  it may see (``pos + 1`` in a decoder, ``n`` in an encoder): 1 = all its attention on one key, 0 = uniform;
  0 when it can see a single key;
* ``prominence``: ``max(concentration, previous_token, duplicate_token, induction)`` (NaN types left
  out): how striking the pattern would look in a heatmap: the attention score the atlas sets against
  the head's effect (the attention sink shows in ``concentration`` when the explained row sinks).
"""

from __future__ import annotations

import numpy as np

from .head_types import type_scores

STATS = (
    "entropy",
    "sink",
    "first_token",
    "self",
    "distance",
    "previous_token",
    "duplicate_token",
    "induction",
    "concentration",
    "prominence",
)


def _entropy(p: np.ndarray) -> np.ndarray:
    """``-Σ p log p`` over the last axis (0 log 0 = 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0).sum(-1)


def pattern_stats(pattern: np.ndarray, tokens: np.ndarray, explained: int, causal: bool) -> dict[str, np.ndarray]:
    """Every statistic ``[...]`` (e.g. ``[layer, head]``) from the patterns ``[..., query, key]`` of one
    sequence of ``n`` real tokens ``tokens`` ``[n]``, ``explained`` the explained position."""
    a = np.asarray(pattern, np.float64)
    n = a.shape[-1]
    if a.shape[-2] != n or len(tokens) != n:
        raise ValueError(f"pattern {a.shape} does not match {len(tokens)} tokens")
    i, j = np.indices((n, n))
    types = type_scores(a, np.asarray(tokens))
    out: dict[str, np.ndarray] = {
        "entropy": _entropy(a).mean(-1),
        "sink": types["attention_sink"],
        "first_token": a[..., :, 0].mean(-1),
        "self": np.diagonal(a, axis1=-2, axis2=-1).mean(-1),
        "distance": (a * np.abs(i - j)).sum(-1).mean(-1),
        "previous_token": types["previous_token"],
        "duplicate_token": types["duplicate_token"],
        "induction": types["induction"],
    }
    keys = explained + 1 if causal else n
    row = a[..., explained, :keys]
    out["concentration"] = 1.0 - _entropy(row) / np.log(keys) if keys > 1 else np.zeros(a.shape[:-2])
    parts = np.stack([out[k] for k in ("concentration", "previous_token", "duplicate_token", "induction")])
    with np.errstate(invalid="ignore"):
        out["prominence"] = np.nanmax(np.where(np.isnan(parts), -np.inf, parts), 0)
    return out
