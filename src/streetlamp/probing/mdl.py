"""MDL probing, online code (Voita & Titov, EMNLP 2020, "Information-Theoretic Probing with MDL").

The items are put in a random order (seeded). With timesteps ``t_0 = 0 < t_1 < ... < t_S = n``
(by default 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.25, 12.5, 25, 50, 100 % of n, as the paper), the
first block is sent with the uniform code, ``t_1 log2 K`` bits; then for every i >= 1 a probe is
trained on the first ``t_i`` items and the next block ``t_i..t_{i+1}`` costs
``sum -log2 p(y_j | x_j)``. ``online code length`` is the total, and
``compression = n log2 K / online code length`` (the uniform code over the online code).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import StreetlampError
from .probes import ProbeSpec, fit_probe

FRACTIONS = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.0625, 0.125, 0.25, 0.5, 1.0)


@dataclass
class OnlineCode:
    codelength: float  # bits
    uniform: float  # bits, n log2 K
    compression: float
    timesteps: list[int]
    block_bits: list[float]  # the bits of every block (the first: uniform)


def timesteps(n: int, fractions: tuple[float, ...] = FRACTIONS) -> list[int]:
    """Distinct block boundaries ``t_1 < ... < t_S = n`` (each at least 1)."""
    ts = sorted({max(1, int(round(f * n))) for f in fractions} | {n})
    return [t for t in ts if t <= n]


def online_codelength(
    spec: ProbeSpec,
    X: np.ndarray,
    y: np.ndarray,
    n_classes: int,
    seed: int = 0,
    fractions: tuple[float, ...] = FRACTIONS,
    shuffle: bool = True,
) -> OnlineCode:
    n = len(y)
    if n < 2:
        raise StreetlampError("MDL needs at least 2 items")
    order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
    X, y = np.asarray(X)[order], np.asarray(y)[order]
    ts = timesteps(n, fractions)
    bits = [ts[0] * np.log2(n_classes)]
    for t0, t1 in zip(ts[:-1], ts[1:]):
        probe = fit_probe(spec, X[:t0], y[:t0], n_classes)
        lp = probe.log_proba(X[t0:t1])
        bits.append(float(-lp[np.arange(t1 - t0), y[t0:t1]].sum() / np.log(2)))
    total = float(sum(bits))
    uniform = float(n * np.log2(n_classes))
    return OnlineCode(total, uniform, uniform / total, ts, [float(b) for b in bits])
