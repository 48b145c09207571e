"""Soft erasure (Zhao & Aletras, ACL 2023) and its retention-controlled form (pi-Soft, arXiv 2601.03089).

Hard erasure removes whole tokens and compares methods at the same number of removed tokens; soft
erasure keeps or drops each token at random with a probability that follows its importance, so a
method is scored on its scores, not only on their order. For one example with ``F`` the probability of
the predicted class and the ``m`` rankable tokens (special tokens, and a decoder's explained last
position, are always kept):

* normalised importance ``q_i = (s_i - min s) / (max s - min s)`` over the rankable tokens (0.5 for
  every token when the scores are constant);
* a **soft input** multiplies token ``i``'s embedding (the ``embed`` site: the token lookup, before
  positions are added) by ``z_i ~ Bernoulli(k_i)``, independently per token; ``k_i`` is the keep
  probability;
* ``Soft-S = 1 - max(0, F(x) - F(x'))`` with ``k = q`` (the important tokens tend to stay);
  ``Soft-C = max(0, F(x) - F(x'))`` with ``k = 1 - q`` (the important tokens tend to go);
* normalised by the input with every rankable embedding zeroed, ``S0 = 1 - max(0, F(x) - F(x_0))``:
  ``soft_ns = max(0, E[Soft-S] - S0) / (1 - S0)``, ``soft_nc = E[Soft-C] / (1 - S0)`` (NaN when
  ``1 - S0 < DENOM_FLOOR = 0.001``: the empty input is (almost) as confident, and the ratio would be
  float noise divided by a near-zero denominator);
* **pi-Soft** fixes the expected retained fraction ``mean_i k_i = pi`` so that a method with larger
  scores does not keep more tokens: ``pi_soft_ns`` keeps with ``k = w(q, pi)``, ``pi_soft_nc`` drops with
  ``1 - k = w(q, 1 - pi)``, where ``w(q, t)`` is ``min(1, c q_i)`` with the one ``c >= 0`` that makes the
  mean ``t`` (water-filling); when even ``c -> inf`` falls short (tokens of zero importance), those
  tokens share the rest of ``t`` equally, so every ``t`` in [0, 1] is reached and ``w`` keeps the order.

``E`` is a Monte Carlo mean over ``samples`` masks per (example, method, variant), drawn from a seed
derived from the run seed and the example's position; ``soft_comprehensiveness`` /
``soft_sufficiency`` are the unnormalised ``E[Soft-C]`` / ``E[Soft-S]`` (and ``pi_`` forms).
A token's whole embedding is kept or zeroed (METHODS.md section 12), where the authors' code drops
single embedding entries; the enumeration test (``tests/evaluation/test_soft.py``) checks the estimator
against the exact expectation over all ``2^m`` masks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..methods.removal import Removal
from ..models.adapter import ModelAdapter
from .common import output_prob_of, unique_rows

VARIANTS = ("soft_nc", "soft_ns", "pi_soft_nc", "pi_soft_ns")  # *_nc: keep 1 - importance; *_ns: keep importance
DEFAULT_SAMPLES = 10
DEFAULT_PI = 0.5
# below this F(x) - F(x_0) the normalised metrics are NaN: the ratio would be float noise times 1/denominator
DENOM_FLOOR = 1e-3


def normalised_importance(scores: np.ndarray, rankable: np.ndarray) -> np.ndarray:
    """Min-max scaled scores in [0, 1] over the rankable tokens (0 elsewhere); 0.5 when they are constant."""
    s = np.asarray(scores, np.float64)
    q = np.zeros(len(s))
    if not rankable.any():
        return q
    r = s[rankable]
    lo, hi = r.min(), r.max()
    q[rankable] = (r - lo) / (hi - lo) if hi > lo else 0.5
    return q


def water_fill(q: np.ndarray, target: float) -> np.ndarray:
    """``min(1, c q)`` with ``mean = target`` (see the module docstring); ``q`` in [0, 1], target in [0, 1]."""
    q = np.asarray(q, np.float64)
    m = len(q)
    if m == 0 or target <= 0:
        return np.zeros(m)
    total = target * m
    pos = q > 0
    if total >= pos.sum():  # every important token kept for sure; the zero-importance ones share the rest
        k = np.where(pos, 1.0, 0.0)
        if (~pos).any():
            k[~pos] = (total - pos.sum()) / (~pos).sum()
        return np.clip(k, 0.0, 1.0)
    order = np.argsort(-q, kind="stable")
    qs = q[order]
    suffix = np.cumsum(qs[::-1])[::-1]  # suffix[j] = sum of qs[j:]
    for j in range(m):  # j tokens capped at 1, c from the rest
        c = (total - j) / suffix[j]
        if c * qs[j] <= 1.0:
            return np.minimum(1.0, c * q)
    raise AssertionError("water filling found no level")  # unreachable: total < count of q > 0


def keep_probabilities(q: np.ndarray, rankable: np.ndarray, pi: float) -> dict[str, np.ndarray]:
    """Per variant the keep probability of every position (1 for the positions never removed)."""
    out: dict[str, np.ndarray] = {}
    r = rankable
    for v in VARIANTS:
        k = np.ones(len(q))
        if v == "soft_ns":
            k[r] = q[r]
        elif v == "soft_nc":
            k[r] = 1.0 - q[r]
        elif v == "pi_soft_ns":
            k[r] = water_fill(q[r], pi)
        else:
            k[r] = 1.0 - water_fill(q[r], 1.0 - pi)
        out[v] = k
    return out


def soft_scores(f_full: float, f_masked: np.ndarray, f_empty: float, variant: str) -> dict[str, float]:
    """The metrics of one variant from ``F`` of the full input, of each sampled mask and of the empty one.
    ``f_masked`` may carry weights (an exact expectation) through :func:`soft_from_terms`."""
    w = np.full(len(f_masked), 1.0 / len(f_masked))
    return soft_from_terms(f_full, f_masked, w, f_empty, variant)


def soft_from_terms(f_full: float, f: np.ndarray, w: np.ndarray, f_empty: float, variant: str) -> dict[str, float]:
    drop = np.maximum(0.0, f_full - np.asarray(f, np.float64))
    s0 = 1.0 - max(0.0, f_full - f_empty)
    denom = 1.0 - s0
    pre = "pi_" if variant.startswith("pi_") else ""
    if variant.endswith("_nc"):
        c = float(np.dot(w, drop))
        return {f"{pre}soft_comprehensiveness": c, variant: c / denom if denom >= DENOM_FLOOR else float("nan")}
    s = float(np.dot(w, 1.0 - drop))
    return {f"{pre}soft_sufficiency": s, variant: max(0.0, s - s0) / denom if denom >= DENOM_FLOOR else float("nan")}


@dataclass
class SoftPlan:
    """The sampled masks of one (example, method): ``masks[v]`` ``[samples, n]`` bool, plus the empty row."""

    n: int
    masks: dict[str, np.ndarray]
    rankable: np.ndarray
    keep: dict[str, np.ndarray]

    @staticmethod
    def build(
        scores: np.ndarray, special: np.ndarray, removal: Removal | None, pi: float, samples: int, seed: int
    ) -> SoftPlan:
        n = len(scores)
        fixed = special | (removal.protected(n) if removal is not None else np.zeros(n, bool))
        rankable = ~fixed
        keep = keep_probabilities(normalised_importance(scores, rankable), rankable, pi)
        rng = np.random.default_rng(seed)
        masks = {v: rng.random((samples, n)) < keep[v][None] for v in VARIANTS}
        return SoftPlan(n, masks, rankable, keep)

    def rows(self) -> list[np.ndarray]:
        """Every mask to run: the samples of each variant in VARIANTS order, then the empty input."""
        out = [m for v in VARIANTS for m in self.masks[v]]
        return out + [~self.rankable]

    def metrics(self, f_full: float, f_rows: np.ndarray) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        if not self.rankable.any():
            return {}, {}
        s = len(next(iter(self.masks.values())))
        met: dict[str, float] = {}
        for i, v in enumerate(VARIANTS):
            met.update(soft_scores(f_full, f_rows[i * s : (i + 1) * s], float(f_rows[-1]), v))
        return met, {"soft_f": f_rows[:-1].reshape(len(VARIANTS), s).astype(np.float32)}


def masked_prob_of(
    adapter: ModelAdapter,
    ids: list[list[int]],
    masks: list[np.ndarray],
    index: np.ndarray,
    budget: int | None,
) -> np.ndarray:
    """``F`` of every row ``ids[r]`` with position ``i``'s token embedding multiplied by ``masks[r][i]``."""

    def edit(group: list[int], width: int) -> dict:
        z = torch.zeros(len(group), width, dtype=torch.float64)
        for j, r in enumerate(group):
            z[j, : len(masks[r])] = torch.as_tensor(masks[r], dtype=torch.float64)

        def fn(e: torch.Tensor) -> torch.Tensor:
            return e * z.to(e.device, e.dtype)[..., None]

        return {"embed": fn}

    return output_prob_of(adapter, ids, budget, np.asarray(index).tolist(), edit=edit)


def soft_erasure(
    adapter: ModelAdapter,
    ids: list[list[int]],
    scores: dict[str, list[np.ndarray]],
    specials: list[np.ndarray],
    removal: Removal | None,
    f_full: np.ndarray,
    pred: np.ndarray,
    pi: float,
    samples: int,
    seeds: list[int],
    budget: int | None,
) -> dict[tuple[str, int], tuple[dict[str, float], dict[str, np.ndarray]]]:
    """Soft metrics of every (method, example): one batched pass over all their masks."""
    plans: list[tuple[str, int, SoftPlan, int]] = []
    rows_ids: list[list[int]] = []
    rows_masks: list[np.ndarray] = []
    owner: list[int] = []
    for mi, name in enumerate(scores):
        for b in range(len(ids)):
            p = SoftPlan.build(scores[name][b], specials[b], removal, pi, samples, seeds[b] * 7919 + mi)
            plans.append((name, b, p, len(rows_ids)))
            for m in p.rows():
                rows_ids.append(ids[b])
                rows_masks.append(m)
                owner.append(b)
    out: dict[tuple[str, int], tuple[dict[str, float], dict[str, np.ndarray]]] = {}
    if not rows_ids:
        return out
    # the empty input is the same row for every method of an example (and a drawn mask may repeat): run once
    firsts, where = unique_rows([(owner[r], rows_masks[r].tobytes()) for r in range(len(rows_ids))])
    sel = np.asarray(owner)[firsts]
    f_unique = masked_prob_of(
        adapter, [rows_ids[r] for r in firsts], [rows_masks[r] for r in firsts], pred[sel], budget
    )
    f = np.asarray(f_unique)[where]
    for name, b, p, start in plans:
        out[(name, b)] = p.metrics(float(f_full[b]), f[start : start + len(p.rows())])
    return out
