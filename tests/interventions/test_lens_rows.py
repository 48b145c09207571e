"""The logit lens row by row and per-head direct logit attribution, by hand from Hugging Face's own
modules (an eager twin): the hidden state of every layer (``output_hidden_states``) through the model's
final norm module and its output embedding (and Gemma's final soft-cap), not only the last row; and each
head's DLA equal to zero-ablating that head in the last layer of a model whose final norm is linear.

Tolerances: the tiny decoders run in float64, but Hugging Face's RMSNorm (Llama family, Gemma) runs in
float32 inside, so a norm of O(1) values agrees to 2^-24 relative; 16 x that of the largest logit, as in
tests/interventions/test_lens.py. Every comparison asserts that the wrong variant (no final norm below the last layer,
another head's credit) is far above the tolerance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streetlamp.interventions.lens import direct_logit_attribution, logit_lens
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.tiny import tiny_model
from tests.conftest import F64_TOL, eager_twin

TEXT = "when mary and john went to the store , john gave a drink to"
F32 = 2.0**-24
DECODERS = ["gpt2", "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text"]


def adapter64(family: str) -> ModelAdapter:
    model, tok = tiny_model(family, seed=2, layers=3)
    return ModelAdapter(model.double(), tok, f"tiny-{family}")


def final_norm_module(twin: torch.nn.Module) -> torch.nn.Module:
    base = twin.base_model
    return base.ln_f if hasattr(base, "ln_f") else base.norm


def hand_lens(adapter: ModelAdapter, ids: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """``[layer + 1, pos, vocab]`` logits: row r < L is hidden state r through the final norm and the
    unembedding (then the soft-cap); row L is the model's own logits (Hugging Face's last hidden state
    is already normed). Also the same without the final norm, for the non-vacuity check."""
    twin = eager_twin(adapter)
    with torch.no_grad():
        out = twin(input_ids=ids[None], output_hidden_states=True)
        hs = out.hidden_states  # L + 1: the embedding, then each layer's output (the last one normed)
        norm, head = final_norm_module(twin), twin.get_output_embeddings()
        cap = getattr(twin.config, "final_logit_softcapping", None)

        def logits(h: torch.Tensor) -> torch.Tensor:
            z = head(h)
            return torch.tanh(z / cap) * cap if cap else z

        L = len(hs) - 1
        rows = [logits(norm(hs[r][0])) for r in range(L)] + [out.logits[0]]
        raw = [logits(hs[r][0]) for r in range(L)] + [out.logits[0]]
    return torch.stack(rows).double().numpy(), torch.stack(raw).double().numpy()


@pytest.mark.parametrize("family", DECODERS)
def test_every_lens_row_is_the_hidden_state_through_the_final_norm(family: str) -> None:
    a = adapter64(family)
    ids = a.encode(TEXT).input_ids[0]
    want, raw = hand_lens(a, ids)
    L, n, _ = want.shape
    assert L == a.n_layers + 1
    tol = 16 * F32 * np.abs(want).max() + F64_TOL
    for index in (7, int(want[-1, -1].argmax())):
        got = logit_lens(a, ids, index=index, top=5)
        np.testing.assert_allclose(got["logit"], want[:, :, index], rtol=0, atol=tol)
        p = torch.softmax(torch.as_tensor(want), -1).numpy()
        np.testing.assert_allclose(got["prob"], p[:, :, index], rtol=0, atol=tol)
        # rank: how many tokens have a larger logit (ties within the tolerance are not counted either way)
        t = want[:, :, index][..., None]
        lo, hi = (want > t + tol).sum(-1), (want > t - tol).sum(-1)
        assert np.all((lo <= got["rank"]) & (got["rank"] <= hi))
        np.testing.assert_allclose(got["top_prob"], -np.sort(-p, -1)[..., :5], rtol=0, atol=tol)
        # not vacuous: below the last layer, the unnormed hidden state gives other logits, far apart
        assert np.abs(raw[:-1, :, index] - want[:-1, :, index]).max() > 1e3 * tol


def linear_final_norm(family: str) -> ModelAdapter:
    """A tiny GPT-2 (LayerNorm, float64 inside) whose final norm is linear: eps = 1e12 >> var(x) makes
    ``(x - mean x) / sqrt(var x + eps) * 1e6`` equal ``x - mean x`` to ~var/eps relative; and whose last
    MLP writes nothing, so the last layer's heads reach the logits only directly."""
    model, tok = tiny_model(family, seed=2, layers=3)
    model = model.double()
    with torch.no_grad():
        ln = model.transformer.ln_f
        ln.eps = 1e12
        ln.weight.fill_(1e6)
        mlp = model.transformer.h[-1].mlp.c_proj
        mlp.weight.zero_()
        mlp.bias.zero_()
    return ModelAdapter(model, tok, f"tiny-{family}-linear-norm")


def ablated_logit(adapter: ModelAdapter, ids: torch.Tensor, index: int, head: int | None) -> float:
    """The logit of ``index`` at the last position with head ``head`` of the last layer zeroed (its slice
    of the input to the output projection ``c_proj``), by a hook on Hugging Face's module."""
    twin = eager_twin(adapter)
    attn = twin.transformer.h[-1].attn
    dh = adapter.d_model // adapter.n_heads

    def pre(_m: torch.nn.Module, args: tuple) -> tuple:
        x = args[0].clone()
        if head is not None:
            x[..., head * dh : (head + 1) * dh] = 0
        return (x,)

    h = attn.c_proj.register_forward_pre_hook(pre)
    try:
        with torch.no_grad():
            return float(twin(input_ids=ids[None]).logits[0, -1, index])
    finally:
        h.remove()


def test_per_head_dla_is_zero_ablating_that_head_in_the_last_layer() -> None:
    a = linear_final_norm("gpt2")
    ids = a.encode(TEXT).input_ids[0]
    index = 7
    d = direct_logit_attribution(a, ids, index)
    full = ablated_logit(a, ids, index, None)
    assert d.logit == pytest.approx(full, abs=F64_TOL * max(1.0, abs(full)))
    effect = np.array([full - ablated_logit(a, ids, index, h) for h in range(a.n_heads)])
    # the linearised norm is exact to var(x)/eps ~ 1e-12 relative; float64 arithmetic below that
    tol = 1e-9 * max(1.0, np.abs(effect).max())
    np.testing.assert_allclose(d.heads[-1], effect, rtol=0, atol=tol)
    np.testing.assert_allclose(d.head_source[-1].sum(-1), effect, rtol=0, atol=tol)
    # not vacuous: the heads differ from each other (another head's credit is far off)
    assert np.abs(effect - np.roll(effect, 1)).min() > 1e3 * tol
