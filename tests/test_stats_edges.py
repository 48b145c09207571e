"""Edges of :mod:`streetlamp.stats` that the first mutmut run (docs/developing.md, "Mutation testing")
found untested: inputs of another shape or dtype than float64 vectors, the error messages, an explicit
``k`` and ties at the cut of precision@k, and the torch versions over a batch of heads ``[B, H, W]`` (as
the adversarial search calls them). Each against an independent computation (scipy, numpy, enumeration)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon
from scipy.stats import kendalltau

from streetlamp.stats import (
    average_precision,
    js_divergence,
    js_divergence_t,
    kendall_tau,
    precision_at_k,
    total_variation,
    total_variation_t,
)


def test_kendall_tau_flattens_any_shape_and_reads_lists_and_integers() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 3)), rng.normal(size=(2, 3))
    want = kendalltau(a.ravel(), b.ravel()).statistic
    assert kendall_tau(a, b) == pytest.approx(want, abs=1e-12)
    ex = np.array([[True, False, False], [False, False, True]])
    assert kendall_tau(a, b, ex) == pytest.approx(kendalltau(a[~ex], b[~ex]).statistic, abs=1e-12)
    assert kendall_tau([3, 1, 2], [30, 10, 20]) == 1.0
    with pytest.raises(ValueError, match=r"score arrays differ in shape: \(3,\) vs \(2,\)"):
        kendall_tau(np.ones(3), np.ones(2))
    with pytest.raises(ValueError, match=r"exclude mask has shape \(2,\), scores \(3,\)"):
        kendall_tau(np.arange(3.0), np.arange(3.0), np.zeros(2, bool))


def test_divergences_are_float64_whatever_the_input_dtype() -> None:
    rng = np.random.default_rng(1)
    p, q = rng.dirichlet(np.ones(50), size=4), rng.dirichlet(np.ones(50), size=4)
    p32, q32 = p.astype(np.float32), q.astype(np.float32)
    js = js_divergence(p32, q32)
    x, y = p32.astype(np.float64), q32.astype(np.float64)  # the same numbers, in float64 (not renormalised)
    m = 0.5 * (x + y)
    want = 0.5 * (x * np.log2(x / m)).sum(-1) + 0.5 * (y * np.log2(y / m)).sum(-1)
    np.testing.assert_allclose(js, want, rtol=0, atol=1e-13)  # float32 arithmetic would be off by ~1e-8
    tv = total_variation(p32, q32)
    np.testing.assert_allclose(tv, 0.5 * np.abs(p32.astype(np.float64) - q32.astype(np.float64)).sum(-1), atol=1e-15)
    assert js.dtype == np.float64 and tv.dtype == np.float64


def test_torch_divergences_reduce_the_last_axis_of_a_batch_of_heads() -> None:
    g = torch.Generator().manual_seed(2)
    p = torch.softmax(torch.randn(3, 4, 7, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(3, 4, 7, generator=g, dtype=torch.float64), -1)
    p[0, 0, :3] = 0  # zeros on one side
    p[0, 0] /= p[0, 0].sum()
    js = js_divergence_t(p, q)
    tv = total_variation_t(p, q)
    assert js.shape == (3, 4) and tv.shape == (3, 4)
    np.testing.assert_allclose(js.numpy(), js_divergence(p.numpy(), q.numpy()), atol=1e-14)
    for b, h in itertools.product(range(3), range(4)):
        assert float(js[b, h]) == pytest.approx(jensenshannon(p[b, h], q[b, h], base=2) ** 2, abs=1e-12)
        assert float(tv[b, h]) == pytest.approx(0.5 * float((p[b, h] - q[b, h]).abs().sum()), abs=1e-15)


def expected_precision_at_k(s: np.ndarray, rel: np.ndarray, k: int) -> float:
    """Enumerate every order of the tokens tied at the cut: the mean share of relevant in the top k."""
    order = np.argsort(-s, kind="stable")
    cut = s[order[k - 1]]
    above = [j for j in order if s[j] > cut]
    tied = [j for j in order if s[j] == cut]
    need = k - len(above)
    picks = list(itertools.combinations(tied, need))
    return float(np.mean([(rel[above].sum() + rel[list(c)].sum()) / k for c in picks]))


def test_precision_at_k_with_an_explicit_k_and_ties_at_the_cut() -> None:
    s = np.array([5.0, 4, 4, 4, 1, 0])
    rel = np.array([1, 0, 1, 1, 0, 1], bool)
    for k in range(1, len(s) + 1):  # k = len(s) is allowed: every token
        assert precision_at_k(s, rel, k) == pytest.approx(expected_precision_at_k(s, rel, k), abs=1e-15), k
    assert precision_at_k(s, rel) == pytest.approx(expected_precision_at_k(s, rel, int(rel.sum())))
    assert precision_at_k(s, rel, 2) != precision_at_k(s, rel)  # the explicit k is used
    for k in (0, len(s) + 1):
        with pytest.raises(ValueError, match=rf"precision@k needs 0 < k <= {len(s)} \(got {k}\)"):
            precision_at_k(s, rel, k)


def test_precision_recall_errors_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match=r"scores \(3,\) and relevance \(2,\) differ in shape"):
        average_precision(np.ones(3), np.ones(2, bool))
    with pytest.raises(ValueError, match="^precision-recall needs at least one relevant item$"):
        average_precision(np.ones(3), np.zeros(3, bool))
    with pytest.raises(ValueError, match="^scores contain NaN$"):
        average_precision(np.array([1.0, np.nan]), np.ones(2, bool))
