"""The result of an attribution method: :class:`Explanation`, raw arrays with named axes plus an
``info`` record. Run folders save them as safetensors + JSON (:mod:`streetlamp.store`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Explanation:
    """One method's output for one text: named raw arrays, their axes and meaning, and info."""

    method: str
    arrays: dict[str, np.ndarray]
    axes: dict[str, list[str]]
    meaning: dict[str, str]
    tokens: list[str]
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for k, a in self.arrays.items():
            if k not in self.axes or len(self.axes[k]) != a.ndim:
                raise ValueError(f"{self.method}: array {k!r} of shape {a.shape} needs one axis name per dimension")

    @property
    def scores(self) -> np.ndarray:
        """The token-level scores ``[token]`` (the array named ``tokens``)."""
        return self.arrays["tokens"]
