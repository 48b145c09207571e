"""The ``attention`` method's row, the project's central quantity, against Hugging Face's own attention
(an eager twin with ``output_attentions=True``): every ``view`` x every layer (negative indices too) x
every tiny family, in float64.

The method stores its row as float32, so the difference from a float64 reference is float32 rounding:
half an ulp, ``2^-24`` relative (``rtol = 2^-23`` leaves a factor 2), plus F64_TOL for the float64
routes. Where Hugging Face's eager attention itself runs its softmax in float32 (read from its source:
``softmax(..., dtype=torch.float32)``: Llama, Mistral, Qwen, Phi-3, Gemma, ModernBERT) the reference is a
float32 route through the layers, so ``f32_tol(layers)`` relative (conftest). Each comparison also asserts that what a wrong layer, head or reduction would give is
far above that tolerance, so none is vacuous."""

from __future__ import annotations

import inspect
import sys

import numpy as np
import pytest
import torch

from streetlamp.methods.attention import Attention
from streetlamp.models.adapter import ModelAdapter, Target
from tests.conftest import F64_TOL, TEXTS, eager_twin, f32_tol

RTOL = 2.0**-23  # float32 storage of a float64 value


def rtol_of(adapter: ModelAdapter) -> float:
    """``RTOL``, or ``f32_tol(layers)`` where Hugging Face's eager softmax runs in float32."""
    src = inspect.getsource(sys.modules[type(adapter.hf_model).__module__])
    f32 = any("softmax(" in line and "dtype=torch.float32" in line for line in src.splitlines())
    return max(RTOL, f32_tol(adapter.n_layers)) if f32 else RTOL


def hf_rows(adapter: ModelAdapter, text: str) -> tuple[np.ndarray, int]:
    """``[layer, head, key]``: Hugging Face's eager attention from the explained position, and it."""
    enc = adapter.encode(text)
    with torch.no_grad():
        out = eager_twin(adapter)(input_ids=enc.input_ids, attention_mask=enc.attention_mask, output_attentions=True)
    att = torch.stack([a[0] for a in out.attentions]).double().numpy()  # [L, H, n, n]
    pos = adapter.explained_position(enc.lengths[0])
    return att[:, :, pos, :], pos


def reference(rows: np.ndarray, view: str, layer: int, head: int | None) -> np.ndarray:
    return {
        "head_mean": lambda: rows[layer].mean(0),
        "head": lambda: rows[layer, head],
        "head_max": lambda: rows[layer].max(0),
        "layer_mean": lambda: rows.mean((0, 1)),
    }[view]()


def check(got: np.ndarray, want: np.ndarray, others: list[np.ndarray], rtol: float) -> None:
    tol = rtol * np.abs(want) + F64_TOL
    np.testing.assert_allclose(got, want, rtol=rtol, atol=F64_TOL)
    # every wrong answer (another layer, head or reduction) is far from this one
    for o in others:
        assert np.abs(o - want).max() > 100 * tol.max()


def test_every_view_and_layer_is_hugging_faces_attention(tiny: ModelAdapter) -> None:
    text = TEXTS[0]
    rows, pos = hf_rows(tiny, text)
    L, H = tiny.n_layers, tiny.n_heads
    rtol = rtol_of(tiny)
    assert L >= 2 and H >= 2
    if hasattr(tiny.attn_modules[0], "sinks"):  # gpt-oss: a learned sink takes part of every row
        assert (rows.sum(-1) < 1).all() and (rows.sum(-1) > 0).all()
    else:
        np.testing.assert_allclose(rows.sum(-1), 1.0, atol=rtol + F64_TOL)  # rows of probabilities
    inputs = tiny.encode(text)
    views = [("head_mean", None), ("head_max", None), ("layer_mean", None)] + [("head", h) for h in range(H)]
    all_refs = {
        (v, l % L, h): reference(rows, v, l % L, h) for v, h in views for l in range(-L, L) if v != "layer_mean"
    }
    all_refs[("layer_mean", 0, None)] = reference(rows, "layer_mean", 0, None)
    for view, head in views:
        for layer in range(-L, L):
            e = Attention(view=view, layer=layer, head=head).attribute(tiny, inputs, target=Target())[0]
            key = (view, 0 if view == "layer_mean" else layer % L, head)
            want = all_refs[key]
            others = [r for k, r in all_refs.items() if k != key and (view != "layer_mean" or k[0] != view)]
            check(e.scores, want, others, rtol)
            assert e.info["position"] == pos
            # the full tensor it stores is Hugging Face's too (every layer and head of the explained row)
            np.testing.assert_allclose(e.arrays["attention"][:, :, pos], rows, rtol=rtol, atol=F64_TOL)


def test_views_describe_the_layer_they_read(tiny: ModelAdapter) -> None:
    """``layer=-1`` is the last layer and says so; a negative layer names its non-negative index."""
    L = tiny.n_layers
    for layer in range(-L, L):
        e = Attention(layer=layer).attribute(tiny, tiny.encode(TEXTS[1]), target=Target())[0]
        assert f"layer {layer % L}," in e.info["view"]


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_batched_views_equal_each_text_alone_against_hugging_face(family: str) -> None:
    """In a padded batch every text's row is its own Hugging Face row (padding never read)."""
    from streetlamp.models.tiny import tiny_model

    model, tok = tiny_model(family, seed=1)
    a = ModelAdapter(model.double(), tok, f"tiny-{family}")
    for view in ("head_max", "layer_mean"):
        exps = Attention(view=view, layer=0).attribute(a, a.encode(TEXTS), target=Target())
        for b, text in enumerate(TEXTS):
            rows, _ = hf_rows(a, text)
            np.testing.assert_allclose(exps[b].scores, reference(rows, view, 0, None), rtol=rtol_of(a), atol=F64_TOL)
