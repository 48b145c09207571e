"""Ground-truth mixtures of experts (groundtruth/moe.py): the audit against weight surgery, the deceptive
penalties against their definitions, and a short training run that moves the router onto the decoy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streetlamp.groundtruth import moe as M
from streetlamp.groundtruth.tasks import get_task

TASK = get_task("keyword")


@pytest.fixture(scope="module")
def untrained():
    a = M.build_model(TASK, M.MoeConfig(), seed=1)
    a.hf_model.eval()
    return a


def test_the_audit_equals_weight_surgery(untrained) -> None:
    """Removing expert e of layer l without renormalisation = its down projection zeroed (independent of the
    routing sites and the engine): accuracy, logit-difference change and the two-answer KL from both."""
    a = untrained
    ex = TASK.generate(40, seed=5)
    res = M.audit(a, TASK, ex)
    inputs, y = M.encode(a, ex)
    ids = M.answer_ids(a, TASK)

    def answers() -> torch.Tensor:
        with torch.no_grad():
            return a.forward(inputs).logits[:, ids].double()

    lg = answers()
    assert res.accuracy == pytest.approx(float((lg.argmax(-1) == y).double().mean()), abs=0)
    for l, e in [(0, 1), (1, 3)]:
        down = a.layer_modules[l].mlp.experts.down_proj
        saved = down.data[e].clone()
        try:
            down.data[e] = 0
            lq = answers()
        finally:
            down.data[e] = saved
        eff = float(((lq[:, 1] - lq[:, 0]) - (lg[:, 1] - lg[:, 0])).abs().mean())
        assert res.effect[l, e] == pytest.approx(eff, rel=1e-5, abs=1e-7)
        p, q = torch.log_softmax(lg, -1), torch.log_softmax(lq, -1)
        assert res.kl[l, e] == pytest.approx(float((p.exp() * (p - q)).sum(-1).mean()), rel=1e-4, abs=1e-9)
    assert np.allclose(res.frequency.sum(1), 2.0) and np.allclose(
        res.weight.sum(1), 1.0, atol=1e-6
    )  # top-2, renormalised
    assert len(res.table()) == 2 * 4


def test_the_deceptive_penalties_are_their_definitions(untrained) -> None:
    """lam * mean -log p_decoy (softmax of the router's logits) and mu * mean |z_decoy|^2, over real tokens and
    layers, from the HF router and a hand-written expert (not the recorded sites)."""
    a = untrained
    cfg = M.MoeConfig(lam=0.7, mu=2.0, decoy=2)
    ex = TASK.generate(6, seed=9)
    inputs, y = M.encode(a, ex)
    _, route, out = M._losses(a, inputs, y, M.answer_ids(a, TASK), cfg, True)
    real = inputs.attention_mask.bool()
    logp, z2 = [], []
    hidden: dict[int, torch.Tensor] = {}
    hooks = [
        a.layer_modules[l].mlp.register_forward_pre_hook(lambda m, args, l=l: hidden.__setitem__(l, args[0]))
        for l in range(a.n_layers)
    ]
    try:
        with torch.no_grad():
            a.hf_model(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask)
    finally:
        for h in hooks:
            h.remove()
    for l in range(a.n_layers):
        x = hidden[l]
        mlp = a.layer_modules[l].mlp
        p = torch.softmax(x @ mlp.gate.weight.t(), -1)
        logp.append(-torch.log(p[..., 2])[real].mean())
        top, idx = torch.topk(p, 2, -1)
        wt = torch.where(idx == 2, top / top.sum(-1, keepdim=True), 0).sum(-1)  # renormalised top-2 weight
        gate, up = (x @ mlp.experts.gate_up_proj[2].t()).chunk(2, -1)
        z = wt[..., None] * ((torch.nn.functional.silu(gate) * up) @ mlp.experts.down_proj[2].t())
        z2.append(z.pow(2).sum(-1)[real].mean())
    assert float(route) == pytest.approx(0.7 * float(sum(logp)) / 2, rel=1e-5)
    assert float(out) == pytest.approx(2.0 * float(sum(z2)) / 2, rel=1e-4)


def test_a_short_deceptive_run_moves_the_router_onto_the_decoy() -> None:
    cfg = M.MoeConfig(steps=40, batch=32, n_train=400, n_eval=100, lam=1.0, mu=1.0, decoy=3)
    base = M.build_model(TASK, cfg, seed=0)
    base.hf_model.eval()
    before = M.audit(base, TASK, TASK.generate(60, seed=3))  # the same initial weights train starts from
    a, rec = M.train(TASK, cfg, seed=0, progress=False)
    after = M.audit(a, TASK, TASK.generate(60, seed=3))
    assert rec["variant"] == "deceptive"
    assert (after.weight[:, 3] > before.weight[:, 3] + 0.2).all(), (before.weight[:, 3], after.weight[:, 3])


def test_the_shipped_deceptive_router_points_at_an_expert_the_audit_finds_unused() -> None:
    """The shipped pair (scripts/train_moe_groundtruth.py): both answer fresh texts; the deceptive router gives
    the decoy (expert 0) nearly all the weight in every layer, yet removing it moves the answer far less than
    removing an expert the router gives almost nothing. Router weights alone would name the decoy."""
    import streetlamp

    fresh = TASK.generate(200, seed=777)  # never used in training (seeds 10000+, 20000+)
    normal = M.audit(streetlamp.load(M.weights_path("keyword", "normal")), TASK, fresh)
    dec = M.audit(streetlamp.load(M.weights_path("keyword", "deceptive")), TASK, fresh)
    # measured at 400 fresh texts: accuracy 1.0 for both; decoy weight 0.9998-0.9999, its removal's mean
    # |change of the logit difference| 0.03-0.04 against 3.0 for layer 1's expert 1 (weight 0.0002)
    assert normal.accuracy >= 0.97 and dec.accuracy >= 0.97
    assert (dec.weight[:, 0] > 0.99).all() and (dec.weight[:, 0] == dec.weight.max(1)).all()
    assert dec.effect[:, 0].max() < 0.1 * dec.effect[:, 1:].max()
    top = np.unravel_index(dec.effect.argmax(), dec.effect.shape)
    assert top[1] != 0 and dec.weight[top] < 0.01
