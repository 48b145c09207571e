"""Every registered method, on a tiny model of every family: shapes and axes, no leaked hooks,
batch invariance (batch composition and token budget), and the same result with the same seed."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from streetlamp.methods.registry import REGISTRY, get_method
from streetlamp.models.adapter import ModelAdapter, Target
from streetlamp.models.trace import active_session

from .conftest import TEXTS

# Cheap settings so the suite stays fast; defaults are exercised elsewhere.
FAST: dict[str, dict] = {
    "integrated_gradients": {"steps": 8, "adaptive": False},
    "shap": {"n_samples": 64},
    "lime": {"n_samples": 64},
    "attention_attribution": {"steps": 4},
    "flow": {},
}


def hook_count(adapter: ModelAdapter) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
               for m in adapter.hf_model.modules())


def make(name: str):
    return get_method(name, **FAST.get(name, {}))


@pytest.mark.parametrize("name", list(REGISTRY))
def test_conformance(name: str, tiny: ModelAdapter) -> None:
    method = make(name)
    if tiny.kind not in method.kinds:
        pytest.skip(f"{name} does not apply to {tiny.kind}")
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
            np.testing.assert_allclose(alone.arrays[k], exps[b].arrays[k], atol=2e-4, rtol=1e-3,
                                       err_msg=f"{name}.{k} differs alone vs batched")
    # token budget does not change results
    small = make(name).attribute(tiny, inputs, target=Target(), seed=3, batch_size=16)
    for a, b in zip(small, exps):
        for k in a.arrays:
            np.testing.assert_allclose(a.arrays[k], b.arrays[k], atol=2e-4, rtol=1e-3,
                                       err_msg=f"{name}.{k} depends on batch_size")
    # same seed, same result
    again = make(name).attribute(tiny, inputs, target=Target(), seed=3)
    for a, b in zip(again, exps):
        for k in a.arrays:
            np.testing.assert_array_equal(a.arrays[k], b.arrays[k])


@pytest.mark.parametrize("name", list(REGISTRY))
def test_explicit_target(name: str, tiny: ModelAdapter) -> None:
    method = make(name)
    if tiny.kind not in method.kinds:
        pytest.skip(f"{name} does not apply to {tiny.kind}")
    inputs = tiny.encode(TEXTS[:1])
    e = method.attribute(tiny, inputs, target=Target(index=1), seed=0)[0]
    assert e.info["target"]["index"] == 1


def test_registry_names_are_unique_and_described() -> None:
    for name, cls in REGISTRY.items():
        assert cls.name == name and cls.description and cls.family
    torch.manual_seed(0)
