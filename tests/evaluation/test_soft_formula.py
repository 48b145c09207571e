"""Soft sufficiency normalised as Zhao & Aletras (2023) define it, by hand (issue 35, item 11 d):
``Soft-NS = max(0, E[Soft-S] - S0) / (1 - S0)`` with ``S0 = 1 - max(0, F(x) - F(x_0))``. A method whose
soft inputs keep less of the prediction than the empty input does scores 0, never below; one that keeps
more scores the ratio. The comprehensiveness side has no clamp: ``Soft-NC = E[Soft-C] / (1 - S0)``."""

from __future__ import annotations

import pytest

from streetlamp.evaluation.soft import soft_scores

F_FULL, F_EMPTY = 0.9, 0.5  # S0 = 1 - 0.4 = 0.6, 1 - S0 = 0.4
TOL = 1e-15  # a few float64 operations on numbers of order 1


@pytest.mark.parametrize("variant", ["soft_ns", "pi_soft_ns"])
def test_soft_ns_is_clamped_at_zero_below_the_empty_input(variant: str) -> None:
    pre = "pi_" if variant.startswith("pi_") else ""
    # F of the soft inputs 0.3 and 0.4: Soft-S = 1 - 0.6 = 0.4 and 1 - 0.5 = 0.5, mean 0.45 < S0 = 0.6
    low = soft_scores(F_FULL, [0.3, 0.4], F_EMPTY, variant)
    assert abs(low[f"{pre}soft_sufficiency"] - 0.45) < TOL
    assert low[variant] == 0.0  # max(0, 0.45 - 0.6) / 0.4; unclamped it would be -0.375
    # 0.85 and 0.95 (a drop below 0 counts as 0): Soft-S = 0.95 and 1, mean 0.975: (0.975 - 0.6) / 0.4
    high = soft_scores(F_FULL, [0.85, 0.95], F_EMPTY, variant)
    assert abs(high[f"{pre}soft_sufficiency"] - 0.975) < TOL
    assert abs(high[variant] - 0.9375) < TOL


@pytest.mark.parametrize("variant", ["soft_nc", "pi_soft_nc"])
def test_soft_nc_is_the_plain_ratio(variant: str) -> None:
    pre = "pi_" if variant.startswith("pi_") else ""
    # drops 0.6 and 0.5, mean 0.55; / 0.4 = 1.375 (may exceed 1: no clamp in the definition)
    got = soft_scores(F_FULL, [0.3, 0.4], F_EMPTY, variant)
    assert abs(got[f"{pre}soft_comprehensiveness"] - 0.55) < TOL
    assert abs(got[variant] - 1.375) < 4 * TOL
