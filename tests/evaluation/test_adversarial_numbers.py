"""Adversarial attention (Jain & Wallace, 2019): the JS divergence and the output TVD it reports are
recomputed from the rows the search tried. Every forward the search makes is watched: the rows it puts
in (its edit applied to the recorded pattern) are read, their JS divergence to the original rows is
computed with scipy (base 2, mean over heads), and the output change by a forward of our own that writes
those rows into the pattern. The reported pair must be the best feasible iterate (largest JS with
TVD <= eps) by that recomputation.

Tolerances: the search keeps its rows and their JS in float32: a float32 sum of ``W`` terms with a
logarithm each is good to ~``W`` units of ``u = 2^-24``, so ``4 W u``. The model runs in float64 on
those very rows, against a float32 copy of the original probabilities: the TVD is good to ``u / 2``
(``u`` leaves a factor 2). The values compared are ~0.001-0.6 and the wrong variants (sum over heads,
softmax over the batch) far above both."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

from streetlamp.evaluation.common import output_probs
from streetlamp.evaluation.counterfactual import Counterfactual
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.tiny import tiny_model
from tests.conftest import F64_TOL

U = 2.0**-24  # float32 unit roundoff

TEXTS = [
    "the movie was not good , but the acting was great .",
    "i loved it",
    "the plot was boring and bad",
    "mary gave john a drink at the store",
]


@pytest.fixture(scope="module")
def sharp() -> ModelAdapter:
    """A tiny BERT whose classifier is scaled so that outputs move visibly (as in test_evaluation)."""
    m, t = tiny_model("bert", seed=3)
    with torch.no_grad():
        m.classifier.weight.mul_(60)
    return ModelAdapter(m.double(), t, "tiny-bert-sharp")


def own_edit(pos: list[int], rows: torch.Tensor):
    """Write ``rows[b, h, :]`` into row ``pos[b]`` of every head (our own edit, not the search's)."""

    def fn(p: torch.Tensor) -> torch.Tensor:
        p = p.clone()
        for b, q in enumerate(pos):
            p[b, :, q, :] = rows[b, :, : p.shape[-1]].to(p.dtype)
        return p

    return fn


@pytest.mark.parametrize("layer", [0, 1])
def test_reported_js_and_tvd_are_the_best_feasible_iterate(
    sharp: ModelAdapter, layer: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = sharp
    inputs = a.encode(TEXTS)
    probs = output_probs(a, inputs.rows(), None)
    site = f"layers.{layer}.attn.pattern"
    with torch.no_grad():
        pattern = a.forward(inputs, record=[site]).cache[site].double()
    B = len(TEXTS)
    pos = [a.explained_position(n) for n in inputs.lengths]
    orig = pattern[torch.arange(B), :, torch.tensor(pos)].numpy()  # [B, H, W]
    tried: list[np.ndarray] = []
    forward = a.forward

    def watching(inp, *args, **kw):
        edit = kw.get("edit") or {}
        if site in edit:
            with torch.no_grad():
                edited = edit[site](pattern.clone())
            tried.append(edited[torch.arange(B), :, torch.tensor(pos)].detach().double().numpy())
        return forward(inp, *args, **kw)

    monkeypatch.setattr(a, "forward", watching)
    cf = Counterfactual(steps=12, eps=1e-3)  # small enough that some iterates break it
    js, tvd = cf.adversarial(a, inputs, probs, layer, list(range(B)))
    monkeypatch.undo()
    assert len(tried) == cf.steps + 1
    W = orig.shape[-1]
    js_tol, tvd_tol = 4 * W * U, U + F64_TOL
    # recompute every iterate: JS by scipy, TVD by our own edited forward
    rec_js = np.zeros((len(tried), B))
    rec_tvd = np.zeros((len(tried), B))
    for i, rows in enumerate(tried):
        for b, n in enumerate(inputs.lengths):
            assert np.abs(rows[b, :, n:]).max(initial=0) == 0  # padding keys get nothing
            rec_js[i, b] = np.mean([jensenshannon(rows[b, h], orig[b, h], base=2) ** 2 for h in range(a.n_heads)])
        with torch.no_grad():
            lg = forward(inputs, edit={site: own_edit(pos, torch.as_tensor(rows))}).logits
        rec_tvd[i] = 0.5 * np.abs(torch.softmax(lg.double(), -1).numpy() - probs).sum(-1)
    for b in range(B):
        feasible = rec_tvd[:, b] <= cf.eps - tvd_tol
        best = rec_js[feasible, b].max(initial=0.0)
        # the reported pair is one iterate's (or the original row: JS 0, TVD 0), feasible, and none clearly
        # feasible is clearly better
        match = (np.abs(rec_js[:, b] - js[b]) <= js_tol) & (np.abs(rec_tvd[:, b] - tvd[b]) <= tvd_tol)
        assert match.any() or (js[b] == 0 and tvd[b] == 0), b
        assert tvd[b] <= cf.eps + tvd_tol and js[b] >= best - js_tol
    # not vacuous: the search found rows far from the original within the budget, and far-off iterates
    assert max(js) > 1e3 * js_tol and max(tvd) > 1e3 * tvd_tol
    assert rec_tvd.max() > cf.eps + 1e3 * tvd_tol  # some iterates were infeasible: the choice mattered
