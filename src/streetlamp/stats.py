"""The statistics streetlamp reports, each in one place.

* :func:`kendall_tau` -- Kendall's tau-b between two token-score vectors (ties handled, scipy's
  definition). **Special-token policy** (the same in ``explain``'s summary, ``evaluate``'s agreement
  rows and the comparison table): the positions flagged by ``exclude`` -- the model's structural
  special tokens, :meth:`~streetlamp.models.adapter.ModelAdapter.special_mask` -- are dropped
  before ranking; the result is NaN when fewer than two tokens remain or either ranking is constant.
* :func:`spearman_rho` -- Spearman's rank correlation (Pearson correlation of the average ranks, ties
  shared), with the same ``exclude`` policy and NaN rule as :func:`kendall_tau`.
* :func:`js_divergence` / :func:`js_divergence_t` -- Jensen-Shannon divergence in bits (base 2, in
  [0, 1]), numpy and torch.
* :func:`total_variation` / :func:`total_variation_t` -- ``0.5 * sum |p - q|``.
* :func:`average_precision` -- tie-aware average precision ``sum_n (R_n - R_{n-1}) P_n`` over the
  distinct score thresholds (scikit-learn's ``average_precision_score``): tokens with equal scores
  share a threshold, so the answer never depends on their order.
* :func:`auprc` -- the area under the precision-recall curve by the trapezoid rule, as ERASER and
  ferret compute it (``sklearn.metrics.auc(recall, precision)`` over ``precision_recall_curve``, which
  starts at the point (recall 0, precision 1)). Not the same number as average precision.
* :func:`precision_at_k` -- expected precision of the top ``k`` when ties at the cut are broken at
  random (so it too does not depend on token order).
* :func:`bootstrap_ci` -- the mean and its percentile bootstrap confidence interval over independent
  units (examples), NaNs dropped; :func:`resample_indices` and :func:`percentile_interval` are its two
  halves, for statistics that are not a mean (the circuit engine's faithfulness, a ratio of means).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from scipy.stats import kendalltau


def _paired(a: np.ndarray, b: np.ndarray, exclude: np.ndarray | None) -> tuple[np.ndarray, np.ndarray] | None:
    """``a`` and ``b`` as float64 vectors over the positions not in ``exclude`` (bool mask); None when a rank
    correlation is undefined (fewer than 2 items, or either side constant)."""
    a, b = np.asarray(a, np.float64).reshape(-1), np.asarray(b, np.float64).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"score arrays differ in shape: {a.shape} vs {b.shape}")
    if exclude is not None:
        keep = ~np.asarray(exclude, bool).reshape(-1)
        if keep.shape != a.shape:
            raise ValueError(f"exclude mask has shape {keep.shape}, scores {a.shape}")
        a, b = a[keep], b[keep]
    if a.size < 2 or np.all(a == a[0]) or np.all(b == b[0]):
        return None
    return a, b


def kendall_tau(a: np.ndarray, b: np.ndarray, exclude: np.ndarray | None = None) -> float:
    """Kendall's tau-b of ``a`` and ``b`` over the positions not in ``exclude`` (bool mask)."""
    ab = _paired(a, b, exclude)
    if ab is None:
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(kendalltau(*ab).statistic)


def _avg_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of their ranks."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    _, inv = np.unique(x, return_inverse=True)
    sums = np.bincount(inv, weights=ranks)
    return (sums / np.bincount(inv))[inv]


def spearman_rho(a: np.ndarray, b: np.ndarray, exclude: np.ndarray | None = None) -> float:
    """Spearman's rho of ``a`` and ``b`` over the positions not in ``exclude`` (bool mask)."""
    ab = _paired(a, b, exclude)
    if ab is None:
        return float("nan")
    ra, rb = _avg_ranks(ab[0]), _avg_ranks(ab[1])
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float(np.dot(ra, rb) / np.sqrt(np.dot(ra, ra) * np.dot(rb, rb)))


def _kl_bits(a: np.ndarray, b: np.ndarray, axis: int) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(a > 0, a * (np.log2(np.where(a > 0, a, 1.0)) - np.log2(np.where(b > 0, b, 1.0))), 0.0)
    return t.sum(axis)


def js_divergence(p: np.ndarray, q: np.ndarray, axis: int = -1) -> np.ndarray:
    """Jensen-Shannon divergence in bits along ``axis`` (0 = equal, 1 = disjoint supports)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    m = 0.5 * (p + q)
    return 0.5 * _kl_bits(p, m, axis) + 0.5 * _kl_bits(q, m, axis)


def js_divergence_t(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """:func:`js_divergence` over the last axis in torch (differentiable where ``p, q > 0``)."""
    m = 0.5 * (p + q)

    def kl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        safe_a = torch.where(a > 0, a, torch.ones_like(a))
        safe_b = torch.where(b > 0, b, torch.ones_like(b))
        return torch.where(a > 0, a * (torch.log2(safe_a) - torch.log2(safe_b)), torch.zeros_like(a)).sum(-1)

    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def total_variation(p: np.ndarray, q: np.ndarray, axis: int = -1) -> np.ndarray:
    """Total variation distance ``0.5 * sum |p - q|`` (Jain & Wallace's output-change measure)."""
    return 0.5 * np.abs(np.asarray(p, np.float64) - np.asarray(q, np.float64)).sum(axis)


def total_variation_t(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """:func:`total_variation` over the last axis in torch."""
    return 0.5 * (p - q).abs().sum(-1)


def _pr_points(scores: np.ndarray, relevant: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Precision and recall at every distinct score threshold, highest threshold first."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    rel = np.asarray(relevant, dtype=bool).reshape(-1)
    if s.shape != rel.shape:
        raise ValueError(f"scores {s.shape} and relevance {rel.shape} differ in shape")
    if not rel.any():
        raise ValueError("precision-recall needs at least one relevant item")
    if np.isnan(s).any():
        raise ValueError("scores contain NaN")
    order = np.argsort(-s, kind="mergesort")
    s, r = s[order], rel[order]
    last = np.r_[np.nonzero(np.diff(s))[0], len(s) - 1]  # last index of each distinct threshold
    tp = np.cumsum(r)[last]
    return tp / (last + 1), tp / rel.sum()


def average_precision(scores: np.ndarray, relevant: np.ndarray) -> float:
    """Tie-aware average precision of ranking ``scores`` (higher first) against bool ``relevant``."""
    precision, recall = _pr_points(scores, relevant)
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def auprc(scores: np.ndarray, relevant: np.ndarray) -> float:
    """Trapezoid area under the precision-recall curve from (0, 1) to the first threshold at full recall."""
    precision, recall = _pr_points(scores, relevant)
    stop = int(np.argmax(recall >= 1.0))  # thresholds past full recall add no recall: dropped (as sklearn)
    x = np.r_[0.0, recall[: stop + 1]]
    y = np.r_[1.0, precision[: stop + 1]]
    return float(np.sum(np.diff(x) * (y[1:] + y[:-1]) / 2))


def precision_at_k(scores: np.ndarray, relevant: np.ndarray, k: int | None = None) -> float:
    """Expected fraction of relevant items in the top ``k`` (default: the number relevant), ties at
    the cut broken uniformly at random."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    rel = np.asarray(relevant, dtype=bool).reshape(-1)
    k = int(rel.sum()) if k is None else int(k)
    if not 0 < k <= len(s):
        raise ValueError(f"precision@k needs 0 < k <= {len(s)} (got {k})")
    cut = np.sort(s)[::-1][k - 1]
    above = s > cut
    tied = s == cut
    hits = rel[above].sum() + (k - above.sum()) * rel[tied].mean()
    return float(hits / k)


def bootstrap_ci(
    values: np.ndarray, n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float, int]:
    """``(mean, low, high, n)``: the mean of the non-NaN ``values`` and its percentile bootstrap interval.

    ``n_boot`` resamples of the ``n`` values with replacement (``numpy.random.default_rng(seed)``); the
    interval is the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the resampled means (linear
    interpolation). The values must be independent units (one per example), not e.g. the heads of one
    example. NaN interval when fewer than two values remain; all NaN when none does."""
    v = np.asarray(values, np.float64).reshape(-1)
    v = v[~np.isnan(v)]
    n = int(v.size)
    if n == 0:
        return float("nan"), float("nan"), float("nan"), 0
    mean = float(v.mean())
    if n < 2:
        return mean, float("nan"), float("nan"), n
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    lo, hi = percentile_interval(v[resample_indices(n, n_boot, seed)].mean(1), level)
    return mean, lo, hi, n


def resample_indices(n: int, n_boot: int = 2000, seed: int = 0) -> np.ndarray:
    """``[n_boot, n]`` indices: ``n_boot`` resamples of ``n`` independent units with replacement
    (``numpy.random.default_rng(seed)``), the draws :func:`bootstrap_ci` uses; for statistics other than a
    mean (a ratio of means, a ranking), computed on each resample."""
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def percentile_interval(samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of bootstrap ``samples`` (linear
    interpolation, NaN samples dropped; NaN when none remains)."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    x = np.asarray(samples, np.float64).reshape(-1)
    x = x[~np.isnan(x)]
    if x.size == 0:
        return float("nan"), float("nan")
    lo, hi = np.quantile(x, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)
