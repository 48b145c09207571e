"""The edges of the statistics, where an off-by-one hides: Kendall tau with exactly two items (defined:
+1 or -1), with one (NaN), with two left after the special tokens are excluded; ERASER's IOU match at
exactly 0.5 (a match: ``>= 0.5``, DeYoung et al. 2020) and just below it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import kendalltau

from streetlamp.evaluation.plausibility import plausibility
from streetlamp.stats import kendall_tau


def test_kendall_tau_with_two_items() -> None:
    assert kendall_tau(np.array([1.0, 2.0]), np.array([3.0, 5.0])) == 1.0
    assert kendall_tau(np.array([1.0, 2.0]), np.array([5.0, 3.0])) == -1.0
    assert kendall_tau(np.array([1.0, 2.0]), np.array([5.0, 3.0])) == kendalltau([1, 2], [5, 3]).statistic
    assert math.isnan(kendall_tau(np.array([1.0]), np.array([2.0])))  # one item: no pair
    assert math.isnan(kendall_tau(np.array([1.0, 1.0]), np.array([2.0, 3.0])))  # a constant ranking


def test_kendall_tau_with_two_items_left_after_exclusion() -> None:
    a, b = np.array([9.0, 1.0, 2.0, 0.0]), np.array([0.0, 3.0, 5.0, 9.0])
    special = np.array([True, False, False, True])
    assert kendall_tau(a, b, special) == 1.0  # the two word tokens agree
    assert kendall_tau(a, b) == pytest.approx(kendalltau(a, b).statistic)  # all four do not
    assert kendall_tau(a, b) < 0
    assert math.isnan(kendall_tau(a, b, np.array([True, True, False, True])))  # one left


def test_iou_of_exactly_one_half_is_a_match() -> None:
    # gold spans [0, 2) and [5, 7); the top-4 tokens 0, 5, 6, 7 make the predicted spans [0, 1) and [5, 8):
    # IOU([0,1), [0,2)) = 1/2 exactly, IOU([5,8), [5,7)) = 2/3: both match, so span precision = recall = 1
    gold = np.array([1, 1, 0, 0, 0, 1, 1, 0, 0], bool)
    s = np.array([4, 0, 0, 0, 0, 3, 2, 1, 0], float)
    assert plausibility(s, gold)["iou_f1"] == 1.0
    # just below one half: IOU([0,1), [0,3)) = 1/3 for the first span, gold [0, 3) and [5, 7)
    gold2 = np.array([1, 1, 1, 0, 0, 1, 1, 0, 0], bool)
    s2 = np.array([5, 0, 0, 0, 0, 4, 3, 2, 1], float)  # top 5: 0, 5, 6, 7, 8 -> spans [0,1), [5,9)
    # [0,1) vs [0,3): 1/3, no; [5,9) vs [5,7): 2/4 = 1/2, a match: precision 1/2, recall 1/2
    assert plausibility(s2, gold2)["iou_f1"] == pytest.approx(0.5)
