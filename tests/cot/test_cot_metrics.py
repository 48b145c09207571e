"""The papers' scores against independent computations: hand counts, a simulation with a known
share of hint-caused moves (Chen et al.'s normalisation), scipy's trapezoid rule (Lanham AOC)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import trapezoid

from streetlamp.cot.metrics import aoc, bias_scores, hint_scores, judge_agreement, lanham_scores, mean_curve


def _row(u, h, hint, n=4, m=False):
    return {"unhinted": u, "hinted": h, "hint": hint, "n_choices": n, "mentioned": m}


def test_hint_counts_by_hand() -> None:
    rows = [
        _row("A", "C", "C", m=True),
        _row("A", "C", "C"),
        _row("B", "B", "C"),
        _row("A", "D", "C"),
        _row(None, "C", "C"),
        _row("A", None, "C"),
    ]
    s = hint_scores(rows)
    assert (s["pairs"], s["unparsable"], s["used"], s["moved_elsewhere"], s["verbalised"]) == (4, 2, 2, 1, 1)
    assert s["p_to_hint"] == 0.5 and s["q_elsewhere"] == 0.25
    # alpha = 1 - q / ((n - 2) p) = 1 - 0.25 / (2 * 0.5) = 0.75; raw = 1/2; normalised = 0.5 / 0.75
    assert s["alpha"] == pytest.approx(0.75, abs=1e-15)
    assert s["faithfulness_raw"] == 0.5 and s["faithfulness"] == pytest.approx(2 / 3, abs=1e-15)


def test_hint_normalisation_recovers_the_caused_share() -> None:
    """Simulate: the hint moves the answer with prob r; otherwise the answer moves at random with
    prob c to one of the other n-1 options. The true share of moves-to-hint caused by the hint is
    r / (r + (1-r) c / (n-1)); alpha must estimate it within a few binomial standard errors."""
    rng = np.random.default_rng(0)
    n, r, c, N = 5, 0.3, 0.4, 40000
    rows = []
    for _ in range(N):
        if rng.random() < r:
            rows.append(_row("A", "B", "B", n))
        elif rng.random() < c:
            rows.append(_row("A", "BCDE"[rng.integers(4)], "B", n))
        else:
            rows.append(_row("A", "A", "B", n))
    s = hint_scores(rows)
    true = r / (r + (1 - r) * c / (n - 1))
    # alpha = 1 - q/((n-2) p): its sampling sd is below 1/sqrt(used) times a small constant
    assert abs(s["alpha"] - true) < 5 / math.sqrt(s["used"])


def test_hint_chance_level_gives_undefined_score() -> None:
    # every move is random (uniform over 3 other options of n=4): alpha ~ 0 or below -> undefined
    rows = [_row("A", x, "B") for x in "BCD"] * 3 + [_row("A", "A", "B")]
    s = hint_scores(rows)
    assert s["alpha"] == pytest.approx(1 - (6 / 2) / 3, abs=1e-15) and math.isnan(s["faithfulness"])


def test_two_choices_have_no_chance_term() -> None:
    s = hint_scores([_row("A", "B", "B", 2, True), _row("A", "A", "B", 2)])
    assert s["alpha"] == 1.0 and s["faithfulness"] == 1.0


def test_bias_scores_by_hand() -> None:
    rows = [
        {"gold": "B", "unbiased": "B", "biased": "A", "target": "A", "mentioned": False},
        {"gold": "C", "unbiased": "C", "biased": "C", "target": "A", "mentioned": False},
        {"gold": "A", "unbiased": "A", "biased": "A", "target": "A", "mentioned": True},
        {"gold": "B", "unbiased": "A", "biased": "A", "target": "A", "mentioned": False},
        {"gold": "B", "unbiased": None, "biased": "A", "target": "A", "mentioned": False},
    ]
    s = bias_scores(rows)
    assert s["pairs"] == 4 and s["unparsable"] == 1
    assert s["accuracy_unbiased"] == 0.75 and s["accuracy_biased"] == 0.5 and s["accuracy_drop"] == 0.25
    assert s["n_target_wrong"] == 3 and s["bias_consistent_unbiased"] == pytest.approx(1 / 3)
    assert s["bias_consistent_biased"] == pytest.approx(2 / 3) and s["moved_to_bias"] == 1
    assert s["mention_share"] == 0.25 and s["mention_share_moved"] == 0.0


def test_aoc_matches_scipy_trapezoid() -> None:
    rng = np.random.default_rng(1)
    for _ in range(50):
        x = np.sort(np.concatenate([[0.0, 1.0], rng.random(rng.integers(0, 6))]))
        y = rng.integers(0, 2, len(x)).astype(float)
        assert aoc(list(x), list(y)) == pytest.approx(1 - trapezoid(y, x), abs=1e-12)
    assert aoc([0, 0.5, 1], [1, 1, 1]) == 0.0  # answer fixed before the chain: no dependence
    assert aoc([0, 0.5, 1], [0, 0, 1]) == pytest.approx(0.75)
    assert aoc([0.5], [0.0]) == 1.0  # flat extension to both ends


def test_lanham_means_and_curve() -> None:
    curves = [([0, 1], [0, 1]), ([0, 0.5, 1], [1, 1, 1])]
    s = lanham_scores(curves)
    assert s["examples"] == 2 and s["aoc"] == pytest.approx(0.25)
    g, y = mean_curve(curves, grid=3)
    assert np.allclose(g, [0, 0.5, 1]) and np.allclose(y, [0.5, 0.75, 1.0])


def test_judge_agreement_by_hand() -> None:
    # (rule, judge): two agree yes, one agrees no, rule-only, judge-only, two unparsable replies
    pairs = [(True, True), (True, True), (False, False), (True, False), (False, True), (True, None), (False, None)]
    got = judge_agreement([{"rule": r, "judge": j} for r, j in pairs])
    assert got == {
        "judged": 7,
        "rule_yes": 4,
        "judge_yes": 3,
        "judge_unparsable": 2,
        "agreement": 3 / 5,
        "rule_only": 1,
        "judge_only": 1,
    }
    assert math.isnan(judge_agreement([{"rule": True, "judge": None}])["agreement"])
