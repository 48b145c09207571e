"""attention_x_gradient, gradient_rollout and attention_attribution against an independent autograd
path: Hugging Face's own eager attention (eager twin), with the attention probabilities taken as the
graph nodes where the eager code applies attention dropout (identity in eval mode)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.interventions.experts import n_experts_of, routed_top_k
from streetlamp.methods.attention_grad import AttentionAttribution, AttentionXGradient
from streetlamp.methods.registry import get_method
from streetlamp.methods.rollout import GradientRollout
from streetlamp.models.adapter import ModelAdapter, Target
from streetlamp.models.sites import submodule
from tests.conftest import TEXTS, eager_twin


@contextlib.contextmanager
def leaf_attention(scale: dict[int, float] | None = None):
    """Inside: every 4-D tensor passed to dropout (only the attention probabilities, identity in
    eval mode) is collected in layer order (times ``scale[layer]`` where given), as the graph node
    the eager code uses downstream, so autograd.grad w.r.t. it is the total derivative."""
    leaves: list[torch.Tensor] = []
    orig = torch.nn.functional.dropout

    def patched(x, *args, **kwargs):
        if x.dim() == 4:
            s = (scale or {}).get(len(leaves))
            node = x if s is None else x * s  # stays in the graph: gradients are total derivatives
            leaves.append(node)
            return node
        return orig(x, *args, **kwargs)

    torch.nn.functional.dropout = patched
    try:
        yield leaves
    finally:
        torch.nn.functional.dropout = orig


def twin_attention_grad(
    adapter: ModelAdapter, twin, text: str, index: int | None = None, scale: dict[int, float] | None = None
):
    """(F, A [L,H,n,n], dF/dA [L,H,n,n], index) from the eager twin, F = prob of the target."""
    inputs = adapter.encode(text)
    with leaf_attention(scale) as leaves:
        logits = twin(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask).logits
    if logits.dim() == 3:
        logits = logits[:, -1]
    p = torch.softmax(logits.float(), -1)[0]
    index = int(p.argmax()) if index is None else index
    grads = torch.autograd.grad(p[index], leaves, allow_unused=True)
    grads = [torch.zeros_like(l) if g is None else g for l, g in zip(leaves, grads)]
    assert len(leaves) == adapter.n_layers
    return (
        float(p[index].detach()),
        torch.stack([l[0] for l in leaves]).detach().double(),
        torch.stack([g[0] for g in grads]).double(),
        index,
    )


def test_attention_x_gradient_matches_eager_autograd(tiny: ModelAdapter) -> None:
    twin = eager_twin(tiny)
    exps = AttentionXGradient().attribute(tiny, tiny.encode(TEXTS), target=Target())
    for b, text in enumerate(TEXTS):
        _, a, g, index = twin_attention_grad(tiny, twin, text)
        e = exps[b]
        assert e.info["target"]["index"] == index
        want = (a * g).numpy()
        assert np.abs(want).max() > 1e-6  # the check is not vacuous
        np.testing.assert_allclose(e.arrays["attention_x_gradient"], want, atol=1e-6, rtol=1e-3)
        pos = tiny.explained_position(len(e.tokens))
        np.testing.assert_allclose(e.scores, want[-1, :, pos].sum(0), atol=1e-6, rtol=1e-3)


def test_gradient_rollout_matches_direct_computation(tiny: ModelAdapter) -> None:
    twin = eager_twin(tiny)
    exps = GradientRollout().attribute(tiny, tiny.encode(TEXTS), target=Target())
    for b, text in enumerate(TEXTS):
        _, a, g, _ = twin_attention_grad(tiny, twin, text)
        n = a.shape[-1]
        r = torch.eye(n, dtype=torch.float64)
        for l in range(a.shape[0]):
            a_bar = (g[l] * a[l]).clamp(min=0).mean(0)
            r = r + a_bar @ r
        np.testing.assert_allclose(exps[b].arrays["matrix"], r.numpy(), atol=1e-6, rtol=1e-4)
        pos = tiny.explained_position(n)
        np.testing.assert_allclose(exps[b].scores, r[pos].numpy(), atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_attention_attribution_matches_riemann_sum(family: str) -> None:
    from streetlamp.models.tiny import tiny_model

    adapter = ModelAdapter(*tiny_model(family, seed=2), f"tiny-{family}")
    twin = eager_twin(adapter)
    m = 3
    e = AttentionAttribution(steps=m).attribute(adapter, adapter.encode(TEXTS[0]), target=Target())[0]
    _, a, _, index = twin_attention_grad(adapter, twin, TEXTS[0])
    for l in range(adapter.n_layers):
        gsum = sum(twin_attention_grad(adapter, twin, TEXTS[0], index, {l: k / m})[2][l] for k in range(1, m + 1))
        want = (a[l] * gsum / m).numpy()
        np.testing.assert_allclose(e.arrays["attention_attribution"][l], want, atol=1e-6, rtol=1e-3)
        assert np.abs(want).max() > 1e-6
        np.testing.assert_allclose(e.arrays["head_scores"][l], want.max((1, 2)), atol=1e-6, rtol=1e-3)
    s = AttentionAttribution(steps=m, head_score="sum").attribute(adapter, adapter.encode(TEXTS[0]), target=Target())[0]
    np.testing.assert_allclose(s.arrays["head_scores"], e.arrays["attention_attribution"].sum((2, 3)), atol=1e-5)


def _router_jumps(tiny: ModelAdapter, twin, text: str, index: int, layer: int, grid: int = 64) -> float:
    """The sum of F's jumps along the path ``alpha * A`` of layer ``layer`` (alpha 0 -> 1): where any router's
    top-k choice switches (found on a grid, each switch located by bisection to 2^-40), ``F(after) - F(before)``
    (the path's smooth change over the bracket is below 1e-9 there)."""
    routes: list[torch.Tensor] = []
    spec = tiny.family.experts
    hooks = [
        submodule(m, spec.router).register_forward_hook(lambda mod, a, out: routes.append(out[2].sort(-1).values))
        for m in list(twin.base_model.layers)
    ]

    def at(alpha: float) -> tuple[float, list[torch.Tensor]]:
        routes.clear()
        f = twin_attention_grad(tiny, twin, text, index, {layer: alpha})[0]
        return f, list(routes)

    def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
        return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))

    try:
        total = 0.0
        pts = [at(k / grid) for k in range(grid + 1)]
        for k in range(grid):
            lo, hi = k / grid, (k + 1) / grid
            r_lo, r_hi = pts[k][1], pts[k + 1][1]
            while not same(r_lo, r_hi):
                a, b, ra = lo, hi, r_lo
                while b - a > 2.0**-40:
                    mid = (a + b) / 2
                    fm, rm = at(mid)
                    if same(rm, ra):
                        a = mid
                    else:
                        b = mid
                fa, ra = at(a)
                fb, rb = at(b)
                total += fb - fa
                lo, r_lo = b, rb  # further switches in the same grid step
        return total
    finally:
        for h in hooks:
            h.remove()


def _moe_completeness_is_the_routers_jumps(tiny: ModelAdapter) -> None:
    """A MoE router's top-k choice switches along the path ``alpha * A`` (F jumps there), so the Riemann sum of
    the gradient converges to F's change minus those jumps, not to F's change: the completeness error at 32
    steps is minus the jumps (located independently by bisection), to first order in 1/steps. With every expert
    routed (top-k = the number of experts: softmax routing, no switch) F is smooth and the error falls as on a
    dense model."""
    text = TEXTS[0]
    twin = eager_twin(tiny)
    f_full, *_, index = twin_attention_grad(tiny, twin, text)
    jumps = [_router_jumps(tiny, twin, text, index, l) for l in range(tiny.n_layers)]
    rest = []
    for steps in (8, 32):
        e = AttentionAttribution(steps=steps).attribute(tiny, tiny.encode(text), target=Target())[0]
        rest.append([])
        for l in range(tiny.n_layers):
            f_zero = twin_attention_grad(tiny, twin, text, index, {l: 0.0})[0]
            gap = float(e.arrays["attention_attribution"][l].astype(np.float64).sum()) - (f_full - f_zero)
            rest[-1].append(gap + jumps[l])
    r8, r32 = np.abs(rest).sum(1)
    assert r32 < 0.6 * r8 or r32 < 1e-6, rest  # the gap minus the jumps: first order, as a smooth path's
    n = n_experts_of(tiny)
    with routed_top_k(tiny, n):
        twin = eager_twin(tiny)
        f_full, *_, index = twin_attention_grad(tiny, twin, text)
        gaps = []
        for steps in (2, 8, 32):
            e = AttentionAttribution(steps=steps).attribute(tiny, tiny.encode(text), target=Target())[0]
            gap = [
                float(e.arrays["attention_attribution"][l].astype(np.float64).sum())
                - (f_full - twin_attention_grad(tiny, twin, text, index, {l: 0.0})[0])
                for l in range(tiny.n_layers)
            ]
            gaps.append(np.abs(gap).sum())
        assert _router_jumps(tiny, twin, text, index, 0, grid=8) == 0.0  # no switch: the routing is every expert
    assert gaps[2] < 0.6 * gaps[1] or gaps[2] < 1e-6, gaps


def test_attention_attribution_completeness_error_falls_with_steps(tiny: ModelAdapter) -> None:
    if tiny.family.experts is not None:
        _moe_completeness_is_the_routers_jumps(tiny)
        return
    twin = eager_twin(tiny)
    if tiny.family.normed_attention_output:  # Gemma: the analytic prediction instead (see the method's doc)
        f_full, *_ = twin_attention_grad(tiny, twin, TEXTS[0])
        for steps in (2, 8):
            e = AttentionAttribution(steps=steps).attribute(tiny, tiny.encode(TEXTS[0]), target=Target())[0]
            assert "cannot hold" in e.info["completeness"]
            attr = e.arrays["attention_attribution"].astype(np.float64)
            for l in range(tiny.n_layers):
                f_zero = twin_attention_grad(tiny, twin, TEXTS[0], e.info["target"]["index"], {l: 0.0})[0]
                # Euler for a degree-0 function: the sum is the norm's epsilon effect plus float32 rounding
                # of n*n*H products, far below the jump F(A) - F(0) it would otherwise have to match
                assert abs(attr[l].sum()) < max(1e-3, 0.02 * abs(f_full - f_zero)), (l, attr[l].sum())
                assert abs(f_full - f_zero) > 10 * abs(attr[l].sum())  # the test can fail: there is a jump
                assert e.arrays["completeness_error"][l] == pytest.approx(attr[l].sum() - (f_full - f_zero), abs=2e-5)
        return
    text = TEXTS[0]
    f_full, *_ = twin_attention_grad(tiny, twin, text)
    gaps = []
    for steps in (2, 8, 32):
        e = AttentionAttribution(steps=steps).attribute(tiny, tiny.encode(text), target=Target())[0]
        assert "completeness" not in e.info  # no caveat where completeness holds
        attr = e.arrays["attention_attribution"].astype(np.float64)
        gap = []
        for l in range(tiny.n_layers):
            f_zero = twin_attention_grad(tiny, twin, text, e.info["target"]["index"], {l: 0.0})[0]
            gap.append(attr[l].sum() - (f_full - f_zero))
        np.testing.assert_allclose(e.arrays["completeness_error"], gap, atol=2e-5)
        gaps.append(np.abs(gap).sum())
    assert gaps[2] < gaps[0] or gaps[0] < 1e-6, gaps
    # a right Riemann sum converges at first order: 4x the steps, about a quarter of the error; 0.6 allowed
    # for the higher-order terms at 8 steps (the sharper attention of the std-0.2 decoder configs, e.g.
    # mistral 0.0025 -> 0.0013). An absolute bound would depend on the config's initialisation.
    assert gaps[2] < 0.6 * gaps[1] or gaps[2] < 1e-6, gaps


def test_bad_input() -> None:
    from streetlamp.models.tiny import tiny_model

    adapter = ModelAdapter(*tiny_model("bert", seed=1), "tiny-bert")
    inputs = adapter.encode(TEXTS[0])
    for bad in (AttentionAttribution(steps=0), AttentionAttribution(head_score="mean")):  # type: ignore[arg-type]
        with pytest.raises(StreetlampError):
            bad.attribute(adapter, inputs, target=Target())
    with pytest.raises(StreetlampError):
        AttentionXGradient().attribute(adapter, inputs, target=Target(index=99))
    with pytest.raises(StreetlampError):
        get_method("attention_attribution", step=3)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["minilm", "smollm"])
def test_embedded_models(model: str, request: pytest.FixtureRequest) -> None:
    adapter = request.getfixturevalue(model)
    text = "the film was surprisingly good"
    e = AttentionXGradient().attribute(adapter, adapter.encode(text), target=Target())[0]
    _, a, g, _ = twin_attention_grad(adapter, eager_twin(adapter), text)
    np.testing.assert_allclose(e.arrays["attention_x_gradient"], (a * g).numpy(), atol=1e-5, rtol=1e-2)
    h = AttentionAttribution(steps=2).attribute(adapter, adapter.encode(text), target=Target())[0]
    assert h.arrays["head_scores"].shape == (adapter.n_layers, adapter.n_heads)
    assert np.isfinite(h.arrays["attention_attribution"]).all()
