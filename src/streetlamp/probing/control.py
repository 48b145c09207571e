"""Control tasks (Hewitt & Liang, EMNLP 2019, "Designing and Interpreting Probes with Control Tasks").

Each word *type* gets one control label, drawn independently from the empirical distribution of
the real task's labels (over labelled tokens); the same mapping labels train and test, so the
control task can only be solved by memorising word types. ``selectivity = acc(task) -
acc(control)`` on the same held-out items with the same probe settings.
"""

from __future__ import annotations

import numpy as np


def control_mapping(words: list[str], y: np.ndarray, n_classes: int, seed: int) -> dict[str, int]:
    """One label per distinct word type, each drawn from the empirical label distribution of ``y``."""
    freq = np.bincount(y, minlength=n_classes).astype(np.float64)
    freq /= freq.sum()
    types = sorted(set(words))  # sorted: the mapping depends on the seed only, not on item order
    rng = np.random.default_rng(seed)
    draws = rng.choice(n_classes, size=len(types), p=freq)
    return {w: int(c) for w, c in zip(types, draws)}


def control_labels(words: list[str], y: np.ndarray, n_classes: int, seed: int) -> np.ndarray:
    """Control label of every item: ``mapping[word type]``."""
    m = control_mapping(words, y, n_classes, seed)
    return np.array([m[w] for w in words], dtype=np.int64)


def selectivity(task_accuracy: float, control_accuracy: float) -> float:
    return float(task_accuracy) - float(control_accuracy)
