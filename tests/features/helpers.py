"""Shared pieces of the features tests: a tiny float64 model and a small corpus file of its words."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.tiny import WORDS, tiny_model


def adapter64(family: str = "llama", layers: int = 2) -> ModelAdapter:
    model, tok = tiny_model(family, seed=1, layers=layers)
    return ModelAdapter(model.double(), tok, f"tiny-{family}")


def corpus_file(folder: Path, n: int = 120, seed: int = 0, name: str = "words.csv") -> Path:
    """A CSV of ``n`` random sentences of the tiny vocabulary (5 to 14 words each)."""
    rng = np.random.default_rng(seed)
    rows = [" ".join(rng.choice(WORDS, size=int(rng.integers(5, 15)))) for _ in range(n)]
    path = folder / name
    path.write_text("text\n" + "\n".join(rows) + "\n")
    return path
