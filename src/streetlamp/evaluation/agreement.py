"""Agreement between explanations (Jain & Wallace, NAACL 2019): Kendall's tau per example.

``tau_b`` (scipy.stats.kendalltau, ties handled) between two methods' token scores over the
rankable (non-special) tokens of one text; NaN when fewer than two tokens or a constant ranking.
The method x method matrix is the mean of the per-example taus (NaNs ignored).
"""
from __future__ import annotations

import itertools
import warnings

import numpy as np
from scipy.stats import kendalltau


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"score arrays differ in shape: {a.shape} vs {b.shape}")
    if a.size < 2 or np.all(a == a[0]) or np.all(b == b[0]):
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(kendalltau(a, b).statistic)


def pairwise_taus(scores: dict[str, np.ndarray], keep: np.ndarray) -> dict[tuple[str, str], float]:
    """tau for every unordered pair of methods (sorted names), over tokens where ``keep``."""
    out = {}
    for x, y in itertools.combinations(sorted(scores), 2):
        out[(x, y)] = kendall_tau(scores[x][keep], scores[y][keep])
    return out
