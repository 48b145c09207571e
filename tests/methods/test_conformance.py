"""Every registered method, on a tiny model of every family: shapes and axes, no leaked hooks,
batch invariance (batch composition and token budget), and the same result with the same seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.methods.registry import REGISTRY, get_method
from streetlamp.models.adapter import ModelAdapter, Target
from streetlamp.models.trace import active_session
from tests.conftest import TEXTS, assert_same_route

# Cheap settings so the suite stays fast; defaults are exercised elsewhere.
FAST: dict[str, dict] = {
    "integrated_gradients": {"steps": 8, "adaptive": False},
    "shap": {"n_samples": 64},
    "lime": {"n_samples": 64},
    "attention_attribution": {"steps": 4},
    "flow": {},
}


def hook_count(adapter: ModelAdapter) -> int:
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in adapter.hf_model.modules()
    )


def runs_on(method, adapter: ModelAdapter) -> bool:
    """Skip a method that does not apply to the model's kind; assert the one-line refusal of a method
    that does not cover its family (True: the method runs on this model)."""
    if adapter.kind not in method.kinds:
        pytest.skip(f"{method.name} does not apply to {adapter.kind}")
    return not refuses(method, adapter)


def refuses(method, adapter: ModelAdapter) -> bool:
    """A method that does not cover a family must say so in one line, from check() and from attribute()."""
    try:
        method.check(adapter)
    except StreetlampError as e:
        assert "\n" not in str(e)
        with pytest.raises(StreetlampError):
            method.attribute(adapter, adapter.encode(TEXTS[:1]), target=Target())
        return True
    return False


def make(name: str):
    return get_method(name, **FAST.get(name, {}))


@pytest.mark.parametrize("name", list(REGISTRY))
def test_conformance(name: str, tiny: ModelAdapter) -> None:
    method = make(name)
    if not runs_on(method, tiny):
        return
    inputs = tiny.encode(TEXTS)
    before = hook_count(tiny)
    exps = method.attribute(tiny, inputs, target=Target(), seed=3)
    assert hook_count(tiny) == before and active_session() is None
    assert len(exps) == len(TEXTS)
    for b, e in enumerate(exps):
        n = inputs.lengths[b]
        assert e.method == name and e.tokens == inputs.tokens[b]
        assert e.scores.shape == (n,), f"{name}: tokens must be one score per real token"
        for k, a in e.arrays.items():
            assert len(e.axes[k]) == a.ndim and k in e.meaning
            if np.issubdtype(a.dtype, np.floating):
                assert np.all(np.isfinite(a)), f"{name}.{k} has non-finite values"
        assert e.info["params"] == method.params() and e.info["method"] == name
    # batch invariance: each text alone gives the same as in the padded batch
    for b, text in enumerate(TEXTS):
        alone = make(name).attribute(tiny, tiny.encode(text), target=Target(), seed=3)[0]
        for k in exps[b].arrays:
            assert_same_route(alone.arrays[k], exps[b].arrays[k], err_msg=f"{name}.{k} differs alone vs batched")
    # token budget does not change results
    small = make(name).attribute(tiny, inputs, target=Target(), seed=3, batch_size=16)
    for a, b in zip(small, exps):
        for k in a.arrays:
            assert_same_route(a.arrays[k], b.arrays[k], err_msg=f"{name}.{k} depends on batch_size")
    # same seed, same result
    again = make(name).attribute(tiny, inputs, target=Target(), seed=3)
    for a, b in zip(again, exps):
        for k in a.arrays:
            np.testing.assert_array_equal(a.arrays[k], b.arrays[k])


@pytest.mark.parametrize("name", list(REGISTRY))
def test_explicit_target(name: str, tiny: ModelAdapter) -> None:
    method = make(name)
    if not runs_on(method, tiny):
        return
    inputs = tiny.encode(TEXTS[:1])
    e = method.attribute(tiny, inputs, target=Target(index=1), seed=0)[0]
    assert e.info["target"]["index"] == 1


def test_registry_names_are_unique_and_described() -> None:
    for name, cls in REGISTRY.items():
        assert cls.name == name and cls.description and cls.family
    torch.manual_seed(0)


# -- the capability flags are claims: each is checked ------------------------------------------------
def _f(adapter: ModelAdapter, inputs, index: int, target: Target, edit: dict | None = None) -> float:
    with torch.no_grad():
        logits = adapter.forward(inputs, edit=edit).logits
    return float(adapter.score(logits, torch.tensor([index]), target)[0])


def check_ig(adapter: ModelAdapter, one, e, target: Target) -> None:
    """sum IG = F(e) - F(e') up to the recorded error; F(e) from an independent forward pass."""
    delta, rel, fe, fb, total = e.arrays["completeness"]
    assert fe == pytest.approx(_f(adapter, one, e.info["target"]["index"], target), rel=1e-6, abs=1e-9)
    assert total == pytest.approx(float(e.scores.astype(np.float64).sum()), rel=1e-5, abs=1e-7)
    assert delta == pytest.approx(abs(total - (fe - fb)), rel=1e-5, abs=1e-9)
    assert e.info["completeness_error"] == pytest.approx(float(delta), rel=1e-5, abs=1e-9)


def check_attention_attribution(adapter: ModelAdapter, one, e, target: Target) -> None:
    """per layer: sum Attr_l - (F(A) - F(0 A_l)) is the recorded gap; both F from forward passes here."""
    index = e.info["target"]["index"]
    full = _f(adapter, one, index, target)
    for l in range(adapter.n_layers):
        zero = _f(adapter, one, index, target, {f"layers.{l}.attn.pattern": lambda p: p * 0})
        got = float(e.arrays["attention_attribution"][l].astype(np.float64).sum()) - (full - zero)
        assert got == pytest.approx(float(e.arrays["completeness_error"][l]), rel=1e-4, abs=1e-6)


COMPLETENESS = {"integrated_gradients": check_ig, "attention_attribution": check_attention_attribution}


def test_every_completeness_claim_has_a_check() -> None:
    assert {n for n, c in REGISTRY.items() if c.reports_completeness} == set(COMPLETENESS)


@pytest.mark.parametrize("name", sorted(COMPLETENESS))
def test_reported_completeness_is_true(name: str, tiny: ModelAdapter) -> None:
    target = Target(quantity="logit")
    inputs = tiny.encode(TEXTS[:2])
    exps = make(name).attribute(tiny, inputs, target=target)
    for b, e in enumerate(exps):
        COMPLETENESS[name](tiny, inputs.select([b]), e, target)


@pytest.mark.parametrize("name", [n for n, c in REGISTRY.items() if not c.needs_gradients])
def test_methods_without_gradients_run_in_inference_mode(name: str, tiny: ModelAdapter) -> None:
    method = make(name)
    if not runs_on(method, tiny):
        return
    inputs = tiny.encode(TEXTS[:2])
    with torch.inference_mode():
        got = method.attribute(tiny, inputs, target=Target(), seed=1)
    want = make(name).attribute(tiny, inputs, target=Target(), seed=1)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a.scores, b.scores)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_seed_matters_only_for_stochastic_methods(name: str, tiny: ModelAdapter) -> None:
    method = make(name)
    if not runs_on(method, tiny):
        return
    inputs = tiny.encode(TEXTS[:1])
    a = method.attribute(tiny, inputs, target=Target(), seed=1)[0].scores
    b = make(name).attribute(tiny, inputs, target=Target(), seed=2)[0].scores
    if REGISTRY[name].stochastic:
        assert not np.array_equal(a, b)
    else:
        np.testing.assert_array_equal(a, b)
