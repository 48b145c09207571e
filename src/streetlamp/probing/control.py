"""Control tasks (Hewitt & Liang, EMNLP 2019, "Designing and Interpreting Probes with Control Tasks").

Each word *type* gets one control label, drawn independently from the empirical distribution of
the real task's labels (over labelled tokens); the same mapping labels train and test, so the
control task can only be solved by memorising word types. ``selectivity = acc(task) -
acc(control)`` on the same held-out items with the same probe settings.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .probes import ProbeSpec, fit_probe


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


def task_and_control(
    spec: ProbeSpec, X: np.ndarray, y: np.ndarray, yc: np.ndarray, n_classes: int, split: tuple[np.ndarray, ...]
) -> dict[str, Any]:
    """One probe setting fitted twice on the training items ``split[0]`` (dev ``split[1]`` for early
    stopping), on the task labels ``y`` and on the control labels ``yc``, each scored on the test items
    ``split[2]`` **against its own labels**: the columns of a results row and of a capacity-sweep row."""
    tr, dv, te = split
    pt = fit_probe(spec, X[tr], y[tr], n_classes, X[dv], y[dv])
    pc = fit_probe(spec, X[tr], yc[tr], n_classes, X[dv], yc[dv])
    acc_t, acc_c = pt.accuracy(X[te], y[te]), pc.accuracy(X[te], yc[te])
    return {
        "probe": spec.name,
        "task_accuracy": acc_t,
        "control_accuracy": acc_c,
        "selectivity": selectivity(acc_t, acc_c),
        "train_accuracy": pt.accuracy(X[tr], y[tr]),
        "control_train_accuracy": pc.accuracy(X[tr], yc[tr]),
        "epochs": pt.epochs,
        "control_epochs": pc.epochs,
    }
