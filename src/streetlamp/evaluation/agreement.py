"""Agreement between explanations (Jain & Wallace, NAACL 2019): Kendall's tau-b per example.

:func:`streetlamp.stats.kendall_tau` between two methods' token scores of one text, the model's
structural special tokens excluded (the one policy of streetlamp's tau, see :mod:`streetlamp.stats`);
NaN when fewer than two tokens remain or a ranking is constant. The method x method matrix is the
mean of the per-example taus (NaNs ignored).
"""

from __future__ import annotations

import itertools

import numpy as np

from ..stats import kendall_tau


def pairwise_taus(scores: dict[str, np.ndarray], exclude: np.ndarray) -> dict[tuple[str, str], float]:
    """tau for every unordered pair of methods (sorted names), over tokens not in ``exclude``."""
    return {(x, y): kendall_tau(scores[x], scores[y], exclude) for x, y in itertools.combinations(sorted(scores), 2)}
