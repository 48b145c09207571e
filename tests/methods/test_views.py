"""The attribution views (methods/views.py): every method that declares the encoder-decoder kind runs once
over the encoder-decoder view with the conformance checks the registry suite makes on one-stack models; the
one-text view gives what the method's own ``attribute`` gives; the causal LM's shared prefix view gives each
row what that row's own prefix gives; the long-input capability is a registry query."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.methods.base import ENCODER_DECODER, Method
from streetlamp.methods.long_input import LongInput
from streetlamp.methods.registry import REGISTRY, get_method, long_methods, methods_of_kind
from streetlamp.methods.views import PrefixView, Seq2SeqView, SequenceView
from streetlamp.models.adapter import Inputs, ModelAdapter, Target
from streetlamp.models.seq2seq import SEQ2SEQ_METHODS, Seq2SeqAdapter
from streetlamp.models.tiny import tiny_model, tiny_seq2seq
from streetlamp.models.trace import active_session
from tests.conftest import F64_TOL, TEXTS

SOURCE = "i loved it"
TARGET = [5, 9, 7]
FAST: dict[str, dict] = {
    "integrated_gradients": {"rule": "gauss_legendre", "steps": 4, "adaptive": False},
    "shap": {"n_samples": 64},
    "lime": {"n_samples": 32},
}


def hook_count(adapter: ModelAdapter) -> int:
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in adapter.hf_model.modules()
    )


def test_the_encoder_decoder_kind_is_a_registry_query() -> None:
    """The methods explain-generation runs on T5/BART are those declaring the kind; each is written over the view."""
    names = methods_of_kind(ENCODER_DECODER)
    assert set(names) == set(SEQ2SEQ_METHODS) and len(names) == 7
    for name in names:
        assert REGISTRY[name].attribute_view is not Method.attribute_view, name


@pytest.fixture(scope="module", params=["bart", "t5"])
def s2s(request: pytest.FixtureRequest) -> Seq2SeqAdapter:
    model, tok = tiny_seq2seq(request.param, seed=1)
    return Seq2SeqAdapter(model.double(), tok, f"tiny-{request.param}")


@pytest.mark.parametrize("name", methods_of_kind(ENCODER_DECODER))
def test_conformance_over_the_encoder_decoder_view(name: str, s2s: Seq2SeqAdapter) -> None:
    src = s2s.encode(SOURCE).input_ids[0]
    view = Seq2SeqView(s2s, src, TARGET, Target())
    k, n = len(TARGET), len(src) + len(TARGET)
    before = hook_count(s2s)
    r = get_method(name, **FAST.get(name, {})).attribute_view(view, seed=3)
    assert hook_count(s2s) == before and active_session() is None
    assert r.matrices and all(m.shape == (k, n) for m in r.matrices.values())
    for site, mat in r.matrices.items():
        assert np.all(np.isfinite(mat)) and np.all(mat[view.allowed == 0] == 0), (name, site)
        assert np.abs(mat).max() > 1e3 * F64_TOL, (name, site)  # not a matrix of zeros
    for arr, axes, meaning in r.arrays.values():
        assert arr.ndim == len(axes) and meaning
    # the token budget does not change results (float64: two chunkings of the same sums)
    small = get_method(name, **FAST.get(name, {})).attribute_view(view, seed=3, batch_size=16)
    for site, mat in r.matrices.items():
        np.testing.assert_allclose(small.matrices[site], mat, rtol=0, atol=F64_TOL, err_msg=f"{name}.{site}")
    # the seed matters only for a stochastic method (LIME's coalitions; SHAP here enumerates them all)
    other = get_method(name, **FAST.get(name, {})).attribute_view(view, seed=4)
    for site, mat in r.matrices.items():
        if name == "lime":
            assert not np.array_equal(other.matrices[site], mat)
        else:
            np.testing.assert_array_equal(other.matrices[site], mat)
    if not REGISTRY[name].needs_gradients:  # runs with autograd off
        with torch.inference_mode():
            inf = get_method(name, **FAST.get(name, {})).attribute_view(view, seed=3)
        for site, mat in r.matrices.items():
            np.testing.assert_array_equal(inf.matrices[site], mat)


@pytest.mark.parametrize("family", ["bert", "llama"])
@pytest.mark.parametrize("name", methods_of_kind(ENCODER_DECODER))
def test_one_text_view_equals_the_methods_own_attribute(family: str, name: str) -> None:
    model, tok = tiny_model(family, seed=2)
    adapter = ModelAdapter(model.double(), tok, f"tiny-{family}")
    inputs = adapter.encode(TEXTS[0])
    want = get_method(name, **FAST.get(name, {})).attribute(adapter, inputs, target=Target(), seed=1)[0]
    got = get_method(name, **FAST.get(name, {})).attribute_view(SequenceView(adapter, inputs, 0, Target()), seed=1)
    row = got.matrices[""][0]
    assert np.abs(row).max() > 1e3 * F64_TOL
    np.testing.assert_allclose(row, want.scores, rtol=2 * np.finfo(np.float32).eps, atol=1e-30)  # stored float32


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_shared_prefix_view_rows_equal_each_prefix(family: str) -> None:
    """Gradient x input over the causal LM's shared prefix view (one pass, every row) against the method on each
    prefix alone: the model is causal, so row j's gradient is that of its own P + j tokens (exactly 0 after)."""
    model, tok = tiny_model(family, seed=3)
    adapter = ModelAdapter(model.double(), tok, f"tiny-{family}")
    prompt = adapter.encode("the movie was not").input_ids[0]
    cont = [5, 9, 7]
    target = Target(quantity="logprob")
    m = get_method("gradient_x_input")
    shared = m.attribute_view(PrefixView(adapter, prompt, cont, target, batched=True)).matrices[""]
    full = torch.cat([prompt, torch.tensor(cont)])
    P = len(prompt)
    for j in range(len(cont)):
        one = Inputs.from_ids(adapter, [full[: P + j]])
        want = m.attribute_view(SequenceView(adapter, one, 0, Target(cont[j], None, "logprob"))).matrices[""][0]
        np.testing.assert_allclose(shared[j, : P + j], want, rtol=0, atol=F64_TOL)
        assert np.all(shared[j, P + j :] == 0) and np.abs(want).max() > 1e3 * F64_TOL


def test_long_input_is_a_declared_capability() -> None:
    """explain --rows runs the methods declaring ``long_input`` (registry order), each with its own long
    implementation; another method refuses its long check in one line."""
    assert long_methods() == [n for n, c in REGISTRY.items() if c.long_input]
    assert long_methods() == ["rollout", "flow", "attention_x_gradient", "occlusion"]
    for name in long_methods():
        assert REGISTRY[name].attribute_long is not Method.attribute_long, name
    model, tok = tiny_model("llama", seed=1)
    adapter = ModelAdapter(model, tok, "tiny-llama")
    inputs = adapter.encode(TEXTS[0])
    long = LongInput(adapter, inputs, Target(), adapter.explained_position(inputs.lengths[0]))
    with pytest.raises(StreetlampError, match="no long-input implementation") as e:
        get_method("lime").check_long(long)
    assert "\n" not in str(e.value)
    get_method("occlusion").check_long(long)
    assert inputs.lengths[0] <= 32 and long.window == 1  # the default window: ceil(n / 32) tokens
