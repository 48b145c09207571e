"""streetlamp's IG equals inseq's on a tiny GPT-2 (runs where inseq imports; see scripts/compare_inseq.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("inseq", reason="inseq not importable (optional peer: see docs/decoder.md)")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


def test_integrated_gradients_equals_inseq() -> None:
    from compare_inseq import compare

    mine, theirs = compare(steps=64)
    ok = ~np.isnan(theirs)
    assert np.array_equal(ok, ~np.isnan(mine))
    # same rule and nodes (Gauss-Legendre, 64), same baseline (unk); inseq returns float32 attributions
    np.testing.assert_allclose(mine[ok], theirs[ok], atol=1e-6 * np.abs(theirs[ok]).max() + 1e-9)
    assert np.abs(theirs[ok]).max() > 1e-3


def test_attention_equals_inseq() -> None:
    from compare_inseq import compare_attention

    mine, theirs = compare_attention()
    ok = ~np.isnan(theirs)
    assert np.array_equal(ok, ~np.isnan(mine)) and ok.sum() > 0
    # every layer and head; both are the same softmax in float64 (Hugging Face's eager path vs streetlamp's)
    np.testing.assert_allclose(mine[ok], theirs[ok], atol=1e-12)
