"""The causal-LM cache path of the perturbation scorer (methods/scorer.py, models/packed.py) against a full
recompute of every perturbed text straight through Hugging Face, in float64: both plans (blocks computed
from one shared start, and suffixes packed end to end) agree with it to ~1e-12 for every occluded position."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streetlamp.methods.occlusion import Occlusion
from streetlamp.methods.removal import Removal
from streetlamp.methods.scorer import Scorer
from streetlamp.models.adapter import ModelAdapter, Target
from streetlamp.models.packed import packable
from streetlamp.models.tiny import tiny_model

TEXT = "the movie was not good , but the acting was great and the ending was sad ."
LOGIT = Target(index=1, quantity="logit")
TOL = 1e-12  # float64 routes: the same sums in another order (batch shapes) differ by ~1e-15 here


def tiny(family: str, window: int | None = None) -> ModelAdapter:
    """A tiny float64 causal LM, weights x4 so that tokens matter; ``window`` widens a sliding window so
    that it covers the text (packing is then exact and allowed)."""
    model, tok = tiny_model(family, seed=3)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    if window is not None:
        model.config.sliding_window = window
        for m in model.modules():
            if getattr(m, "sliding_window", None):
                m.sliding_window = window
    return ModelAdapter(model.double(), tok, f"tiny-{family}")


def direct_F(adapter: ModelAdapter, row: torch.Tensor) -> float:
    """F of one perturbed text by a plain Hugging Face forward of the whole text (no streetlamp pass)."""
    with torch.no_grad():
        return float(adapter.hf_model(input_ids=row[None]).logits[0, -1, LOGIT.index])


def first_change(row: torch.Tensor, ids: torch.Tensor) -> int:
    """The first position where ``row`` differs from ``ids`` (its last position if none: F is read there)."""
    m = min(len(row), len(ids))
    diff = [i for i in range(m) if int(row[i]) != int(ids[i])]
    return min(diff[0] if diff else m, len(row) - 1)


@pytest.mark.parametrize(
    "family,window", [("gpt2", None), ("llama", None), ("qwen2", None), ("phi3", None), ("gemma2", 64)]
)
@pytest.mark.parametrize("replacement", ["delete", "unk"])
def test_both_plans_equal_full_recompute(family: str, window: int | None, replacement: str) -> None:
    a = tiny(family, window)
    ids = a.encode(TEXT).input_ids[0]
    n = len(ids)
    assert packable(a, n)
    tid = None if replacement == "delete" else a.tokenizer.unk_token_id
    rule = Removal.of(a, tid)
    rows = [rule.row(ids, np.arange(n) == i) for i in range(n - 1)]
    want = np.array([direct_F(a, r) for r in rows])
    base = direct_F(a, ids)
    assert np.ptp(want) > 1e-2 and np.abs(base - want).max() > 1e-2  # the occlusions matter
    scale = np.abs(want).max()
    for plan in ("shared", "packed", "auto"):
        for budget in (None, 3 * n):  # one pass, or several
            s = Scorer(a, ids, LOGIT, budget, use_cache=True, plan=plan)
            got = s(rows)
            np.testing.assert_allclose(got, want, rtol=0, atol=TOL * scale, err_msg=f"{plan} {budget}")
            assert abs(s.base - base) <= TOL * scale
            if plan == "packed":  # every suffix from its own first changed position, nothing recomputed
                assert s.n_positions == sum(len(r) - first_change(r, ids) for r in rows)


def test_packing_needs_the_window_to_cover_the_text() -> None:
    """Gemma 2 / Mistral's tiny window (4) masks keys of a 17-token text: packing (whose mask replaces the
    model's) is refused there and the shared-start plan runs; it still equals the full recompute."""
    for family in ("gemma2", "mistral"):
        a = tiny(family)
        ids = a.encode(TEXT).input_ids[0]
        assert not packable(a, len(ids)) and packable(tiny(family, 64), len(ids))
        rows = [Removal.of(a, None).row(ids, np.arange(len(ids)) == i) for i in range(len(ids) - 1)]
        s = Scorer(a, ids, LOGIT, None, use_cache=True, plan="packed")
        want = np.array([direct_F(a, r) for r in rows])
        np.testing.assert_allclose(s(rows), want, rtol=0, atol=TOL * np.abs(want).max())


def test_auto_plan_packs_short_texts_and_keeps_occlusion_numbers() -> None:
    """On a short text the packed plan is chosen: fewer passes than the shared-start blocks, fewer positions
    than them, and Occlusion's scores are the plain path's."""
    a = tiny("llama")
    inputs = a.encode(TEXT)
    ids = inputs.input_ids[0]
    n = len(ids)
    rows = [Removal.of(a, None).row(ids, np.arange(n) == i) for i in range(n - 1)]
    shared = Scorer(a, ids, LOGIT, 4 * n, use_cache=True, plan="shared")
    auto = Scorer(a, ids, LOGIT, 4 * n, use_cache=True)
    np.testing.assert_allclose(auto(rows), shared(rows), rtol=0, atol=TOL * 10)
    assert auto.n_passes < shared.n_passes and auto.n_positions < shared.n_positions
    kv = Occlusion(replacement="delete").attribute(a, inputs, target=LOGIT, batch_size=4 * n)[0]
    plain = Occlusion(replacement="delete", kv_cache=False).attribute(a, inputs, target=LOGIT, batch_size=4 * n)[0]
    np.testing.assert_allclose(kv.scores, plain.scores, rtol=2.0**-23, atol=1e-12)
    assert np.abs(plain.scores).max() > 1e-2
    occluded = np.flatnonzero(kv.arrays["groups"] >= 0)
    rule = Removal.of(a, None)
    suffixes = [len(r) - first_change(r, ids) for r in (rule.row(ids, np.arange(n) == i) for i in occluded)]
    assert len(occluded) > 10 and kv.info["positions_computed"] == sum(suffixes)  # exactly the changed positions
