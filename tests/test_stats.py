"""streetlamp.stats against independent computations: scipy, scikit-learn, and textbook brute force."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon
from scipy.stats import kendalltau
from sklearn.metrics import auc, average_precision_score, precision_recall_curve

from streetlamp import stats

RNG = np.random.default_rng(0)


def tau_b_brute(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau-b from its definition: (C - D) / sqrt((n0 - n1)(n0 - n2))."""
    n = len(a)
    c = d = ta = tb = 0
    for i, j in itertools.combinations(range(n), 2):
        x, y = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])
        if x == 0 and y == 0:
            continue
        if x == 0:
            ta += 1
        elif y == 0:
            tb += 1
        elif x == y:
            c += 1
        else:
            d += 1
    denom = math.sqrt((c + d + ta) * (c + d + tb))
    return (c - d) / denom if denom else float("nan")  # a constant ranking: undefined


def ap_brute(scores: np.ndarray, rel: np.ndarray) -> float:
    """Average precision from its definition, threshold by threshold: sum (R_t - R_prev) * P_t."""
    s = np.asarray(scores, float)
    out = 0.0
    for t in sorted(set(s.tolist()), reverse=True):
        sel = s >= t
        out += (rel[sel].sum() - rel[s > t].sum()) / rel.sum() * (rel[sel].sum() / sel.sum())
    return float(out)


def test_kendall_tau_b_matches_definition_and_scipy_with_ties() -> None:
    for n in (3, 7, 12):
        for _ in range(20):
            a = RNG.integers(0, 4, n).astype(float)  # many ties
            b = RNG.integers(0, 3, n).astype(float)
            if np.ptp(a) == 0 or np.ptp(b) == 0:
                assert math.isnan(stats.kendall_tau(a, b))
                continue
            assert stats.kendall_tau(a, b) == pytest.approx(tau_b_brute(a, b), abs=1e-12)
            assert stats.kendall_tau(a, b) == pytest.approx(kendalltau(a, b).statistic, abs=1e-12)


def test_kendall_tau_special_token_policy() -> None:
    a = np.array([9.0, 0.1, 0.5, 0.3, 0.2, -7.0])  # huge scores on the two special positions
    b = np.array([-5.0, 0.2, 0.6, 0.1, 0.3, 8.0])
    special = np.array([True, False, False, False, False, True])
    assert stats.kendall_tau(a, b, special) == pytest.approx(tau_b_brute(a[1:-1], b[1:-1]))
    assert stats.kendall_tau(a, b, special) != pytest.approx(stats.kendall_tau(a, b))
    assert math.isnan(stats.kendall_tau(a, b, ~np.eye(6, dtype=bool)[2]))  # one token left
    with pytest.raises(ValueError):
        stats.kendall_tau(a, b[:3])


def test_js_and_total_variation() -> None:
    p, q = RNG.dirichlet(np.ones(7), size=4), RNG.dirichlet(np.ones(7), size=4)
    q[0, :3] = 0  # zeros in one distribution only
    q[0] /= q[0].sum()
    want = jensenshannon(p, q, base=2, axis=-1) ** 2
    np.testing.assert_allclose(stats.js_divergence(p, q), want, rtol=1e-12, atol=1e-15)
    got_t = stats.js_divergence_t(torch.as_tensor(p), torch.as_tensor(q)).numpy()
    np.testing.assert_allclose(got_t, want, rtol=1e-12, atol=1e-15)
    assert stats.js_divergence(np.array([1.0, 0]), np.array([0, 1.0])) == pytest.approx(1.0)  # disjoint: 1 bit
    tv = np.array([0.5 * sum(abs(x - y) for x, y in zip(pp, qq)) for pp, qq in zip(p, q)])
    np.testing.assert_allclose(stats.total_variation(p, q), tv, rtol=1e-14)
    np.testing.assert_allclose(stats.total_variation_t(torch.as_tensor(p), torch.as_tensor(q)).numpy(), tv, rtol=1e-14)


def test_average_precision_and_auprc_match_sklearn_with_ties() -> None:
    for n in (4, 9, 20):
        for _ in range(30):
            rel = RNG.random(n) < 0.4
            if not rel.any():
                rel[RNG.integers(n)] = True
            s = np.round(RNG.random(n), 1)  # ties
            ap = stats.average_precision(s, rel)
            assert ap == pytest.approx(average_precision_score(rel, s), abs=1e-12)
            assert ap == pytest.approx(ap_brute(s, rel), abs=1e-12)
            prec, rec, _ = precision_recall_curve(rel, s)
            assert stats.auprc(s, rel) == pytest.approx(auc(rec, prec), abs=1e-12)


def test_tie_aware_means_order_free() -> None:
    """Same scores, same relevance, tokens in a different order: same numbers (the evaluate bug)."""
    rel = np.array([True, False])
    s = np.array([0.5, 0.5])
    for f in (stats.average_precision, stats.auprc, stats.precision_at_k):
        assert f(s, rel) == f(s[::-1], rel[::-1])
    assert stats.average_precision(s, rel) == 0.5
    # the textbook values: AP 0.5 (one threshold at P=1/2, R=1); AUPRC: trapezoid (0,1)->(1,1/2) = 0.75
    assert stats.auprc(s, rel) == pytest.approx(0.75)
    assert stats.precision_at_k(s, rel) == pytest.approx(0.5)


def test_precision_at_k_is_the_mean_over_tie_breaks() -> None:
    for _ in range(15):
        n = 6
        rel = RNG.random(n) < 0.5
        if not rel.any():
            rel[0] = True
        s = RNG.integers(0, 3, n).astype(float)
        k = int(rel.sum())
        # every order of the tokens, top k by a stable sort: the mean is over all tie-breaks
        outcomes = [
            rel[list(p)][np.argsort(-s[list(p)], kind="stable")[:k]].mean() for p in itertools.permutations(range(n))
        ]
        assert stats.precision_at_k(s, rel) == pytest.approx(np.mean(outcomes), abs=1e-12)


def test_errors() -> None:
    with pytest.raises(ValueError, match="relevant"):
        stats.average_precision(np.ones(3), np.zeros(3, bool))
    with pytest.raises(ValueError, match="NaN"):
        stats.auprc(np.array([np.nan, 1.0]), np.array([True, False]))
