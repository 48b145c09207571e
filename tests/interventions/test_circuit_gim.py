"""GIM in the circuit engine (issue 37 item 3), each rule against a computation that does not use it:
the softmax rule against its closed form; the forward's values unchanged; zero Q/K/V (gate/up) gradient
scales against the model with those blocks' outputs overridden by constants (true autograd); frozen norms
against the model whose norm statistics are recorded at the clean run and replayed as constants; neutral
settings give EAP exactly; and the GIM scores audited against exact patching like EAP."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from streetlamp.commands.circuit.methods import edge_scores
from streetlamp.interventions.circuits import gim as G
from streetlamp.interventions.circuits import scores as S
from streetlamp.interventions.circuits.forward import run_graph
from streetlamp.interventions.circuits.tasks import encode_pairs
from tests.conftest import F64_TOL
from tests.interventions.test_circuit_faithfulness import PAIRS3
from tests.interventions.test_circuit_scores import f64_llama, make  # noqa: F401

OFF: dict[str, Any] = dict(temperature=1.0, q_scale=1.0, k_scale=1.0, v_scale=1.0, gate_scale=1.0, up_scale=1.0)


def test_softmax_rule_is_its_closed_form() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(3, 7, dtype=torch.float64, generator=g)
    for T in (1.0, 2.0, 0.5):
        y = G.softmax_t(x, -1, T)
        torch.testing.assert_close(y, torch.softmax(x, -1), rtol=0, atol=1e-15)  # the forward is softmax
        (gx,) = torch.autograd.grad((y * w).sum(), x)
        s = torch.softmax(x.detach() / T, -1)
        want = s * w - s * (s * w).sum(-1, keepdim=True)  # s_T ⊙ (g - <g, s_T>), per row
        torch.testing.assert_close(gx, want, rtol=0, atol=1e-15)
    (gt,) = torch.autograd.grad((torch.softmax(x, -1) * w).sum(), x)  # T = 1 is the true Jacobian
    (g1,) = torch.autograd.grad((G.softmax_t(x, -1, 1.0) * w).sum(), x)
    torch.testing.assert_close(g1, gt, rtol=0, atol=1e-15)
    v = torch.ones(4, dtype=torch.float64, requires_grad=True)
    (gv,) = torch.autograd.grad((G.scale_grad(v, 0.25) * torch.arange(4.0)).sum(), v)
    assert gv.tolist() == [0.0, 0.25, 0.5, 0.75]


def _grads(b, pairs, override=None) -> tuple[torch.Tensor, list]:
    run, grads = S._reader_grads(b, pairs, "logit_diff", override)
    return run.logits.detach(), grads


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_forward_unchanged_and_neutral_settings_are_eap(family: str, f64_llama: None) -> None:  # noqa: F811
    a, b = make(family)
    pairs = encode_pairs(a, PAIRS3)
    plain, gp = _grads(b, pairs)
    with G.gim(b):
        logits, gg = _grads(b, pairs)
    torch.testing.assert_close(logits, plain, rtol=0, atol=F64_TOL)
    assert any(float((x - y).abs().max()) > 1e-6 for x, y in zip(gp, gg) if x is not None)  # the backward moved
    with G.gim(b, **OFF, freeze_norm=False):
        e0 = S.eap(b, pairs)
    e = S.eap(b, pairs)
    v = b.graph.valid()
    torch.testing.assert_close(e0.per_prompt[:, v], e.per_prompt[:, v], rtol=0, atol=0)
    # and everything is put back: the blocks' methods and the norms' forwards
    assert "pattern" not in b.__dict__ and all("forward" not in m.__dict__ for m in G._norm_modules(b))
    torch.testing.assert_close(S.eap(b, pairs).per_prompt[:, v], e.per_prompt[:, v], rtol=0, atol=0)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_zero_qkv_and_gate_scales_are_constant_blocks(family: str, f64_llama: None) -> None:  # noqa: F811
    """q = k = v = 0: no gradient passes through any attention block, the same as the model with every
    layer's head outputs replaced by their (detached) values; gate = up = 0 likewise for gated MLPs."""
    a, b = make(family)
    pairs = encode_pairs(a, PAIRS3)
    run = run_graph(b, pairs.clean.input_ids, pairs.clean.attention_mask)
    g = b.graph
    heads = {
        f"attn{l}": run.writers[:, :, g.layer_start(l) : g.layer_start(l) + g.n_heads].detach()
        for l in range(g.n_layers)
    }
    _, want = _grads(b, pairs, heads)
    with G.gim(b, **{**OFF, "q_scale": 0.0, "k_scale": 0.0, "v_scale": 0.0}, freeze_norm=False):
        _, got = _grads(b, pairs)
    for i, (x, y) in enumerate(zip(got, want)):
        if i % 2 == 0 and i < 2 * g.n_layers:  # attention readers: no gradient reaches them
            assert y is None and float(x.abs().max()) == 0.0
        else:
            torch.testing.assert_close(x, y, rtol=0, atol=F64_TOL)
    gated = getattr(b.layers[0].mlp, "gate_proj", None) is not None
    assert gated == (family == "llama")
    if gated:
        mlps = {
            f"mlp{l}": run.writers[:, :, g.layer_start(l) + g.n_heads][:, :, None].detach() for l in range(g.n_layers)
        }
        _, want = _grads(b, pairs, mlps)
        with G.gim(b, **{**OFF, "gate_scale": 0.0, "up_scale": 0.0}, freeze_norm=False):
            _, got = _grads(b, pairs)
        for i, (x, y) in enumerate(zip(got, want)):
            if i % 2 == 1 and i < 2 * g.n_layers:
                assert y is None and float(x.abs().max()) == 0.0
            else:
                torch.testing.assert_close(x, y, rtol=0, atol=F64_TOL)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_frozen_norms_are_the_recorded_statistics(family: str, f64_llama: None, monkeypatch) -> None:  # noqa: F811
    """The gradient with frozen norms is the true gradient of the model whose every norm call divides by
    the statistic recorded at the clean run (a constant), replayed in call order."""
    a, b = make(family)
    pairs = encode_pairs(a, PAIRS3)
    mods = G._norm_modules(b)
    stats: dict[int, list[torch.Tensor]] = {id(m): [] for m in mods}

    def stat(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if isinstance(m, nn.LayerNorm):
            return ((x - x.mean(-1, keepdim=True)).pow(2).mean(-1, keepdim=True) + m.eps).sqrt()
        return (x.pow(2).mean(-1, keepdim=True) + m.variance_epsilon).sqrt()

    def recorder(m: nn.Module):
        real = type(m).forward

        def f(x: torch.Tensor) -> torch.Tensor:
            stats[id(m)].append(stat(m, x).detach().clone())
            return real(m, x)

        return f

    for m in mods:
        monkeypatch.setattr(m, "forward", recorder(m))
    with torch.no_grad():
        run_graph(b, pairs.clean.input_ids, pairs.clean.attention_mask)
    seen = {k: list(v) for k, v in stats.items()}
    assert all(seen.values())

    def replayer(m: nn.Module):
        queue = seen[id(m)]

        def f(x: torch.Tensor) -> torch.Tensor:
            c = queue.pop(0)
            if isinstance(m, nn.LayerNorm):
                return (x - x.mean(-1, keepdim=True)) / c * m.weight + m.bias
            return m.weight * (x / c)

        return f

    for m in mods:
        monkeypatch.setattr(m, "forward", replayer(m))
    _, want = _grads(b, pairs)
    assert all(not q for q in seen.values())  # every recorded call replayed
    for m in mods:
        monkeypatch.delattr(m, "forward")
    with G.gim(b, **OFF):
        _, got = _grads(b, pairs)
    _, plain = _grads(b, pairs)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=0, atol=10 * F64_TOL)
    assert max(float((x - p).abs().max()) for x, p in zip(got, plain)) > 1e-6  # freezing changes the gradient


def test_gim_methods_and_audit() -> None:
    a, b = make("llama")
    pairs = encode_pairs(a, PAIRS3)
    e = edge_scores(b, pairs, "eap-gim", "patch", "logit_diff", 2, 8)
    with G.gim(b):
        want = S.eap(b, pairs)
    v = b.graph.valid()
    assert e.method == "eap-gim"
    torch.testing.assert_close(e.per_prompt[:, v], want.per_prompt[:, v], rtol=0, atol=0)
    ig = edge_scores(b, pairs, "eap-ig-inputs-gim", "patch", "logit_diff", 2, 8)
    with G.gim(b):
        want = S.eap_ig(b, pairs, 2, "inputs")
    torch.testing.assert_close(ig.per_prompt[:, v], want.per_prompt[:, v], rtol=0, atol=0)
    au = S.audit(b, pairs, e, n_edges=40)  # first-order, so audited against exact patching like EAP
    assert np.isfinite(au["kendall_tau"]) and len(au["edges"]) == 40
    assert not np.allclose(au["estimate"], S.audit(b, pairs, S.eap(b, pairs), n_edges=40)["estimate"])
