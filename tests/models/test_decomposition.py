"""norm, alti, value_zeroing against independent computations.

* norm: value vectors and W_O taken by hand from the Hugging Face modules of an eager twin,
  the attention from Hugging Face's own ``output_attentions``.
* alti: the decomposition is exact (Σ_j T_i(x_j) + bias = the block's real output, read from the
  eager twin's own modules by hooks), plus hand-worked L1 contributions and rollout.
* value_zeroing: a plain loop, one zeroed token per full forward pass, recording resid_post;
  and a toy (identical tokens, uniform attention) whose matrices are known in closed form.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.methods.context_mixing import Alti, Norm, ValueZeroing, alti_layer, l1_contributions, rollout
from streetlamp.models.adapter import ModelAdapter, Target
from streetlamp.models.attention_block import placement
from streetlamp.models.tiny import tiny_model
from tests.conftest import TEXTS, eager_twin

TEXT = TEXTS[0]


def _layers(twin: torch.nn.Module) -> list[torch.nn.Module]:
    base = twin.base_model
    t = twin.config.model_type
    return list(
        {
            "bert": lambda: base.encoder.layer,
            "roberta": lambda: base.encoder.layer,
            "distilbert": lambda: base.transformer.layer,
            "gpt2": lambda: base.h,
            "deberta-v2": lambda: base.encoder.layer,
        }.get(t, lambda: base.layers)()
    )  # Llama, Mistral, Qwen, Phi-3, Gemma: base.layers


def hand_values(twin: torch.nn.Module, layer: torch.nn.Module, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Value vectors ``[S, H, dh]`` (per query head) and W_O ``[H, dh, d]`` from the HF modules."""
    cfg = twin.config
    t = cfg.model_type
    n_heads = cfg.num_attention_heads if t != "gpt2" else cfg.n_head
    d = h.shape[-1]
    if t in ("bert", "roberta"):
        v, wo = layer.attention.self.value(h), layer.attention.output.dense.weight.t()
    elif t == "distilbert":
        v, wo = layer.attention.v_lin(h), layer.attention.out_lin.weight.t()
    elif t == "deberta-v2":
        v, wo = layer.attention.self.value_proj(h), layer.attention.output.dense.weight.t()
    elif t == "gpt2":
        v, wo = layer.attn.c_attn(layer.ln_1(h))[:, 2 * d :], layer.attn.c_proj.weight
    elif t == "modernbert":  # fused Wqkv: [q, k, v], each d wide
        v, wo = layer.attn.Wqkv(layer.attn_norm(h))[:, 2 * d :], layer.attn.Wo.weight.t()
    else:
        kv = cfg.num_key_value_heads
        hn = layer.input_layernorm(h)
        if t == "phi3":  # fused qkv_proj: [q (heads x dh), k (kv x dh), v (kv x dh)]
            v = layer.self_attn.qkv_proj(hn)[:, -kv * layer.self_attn.head_dim :]
        else:
            v = layer.self_attn.v_proj(hn)
        v = v.reshape(h.shape[0], kv, -1)
        v = v.repeat_interleave(n_heads // kv, dim=1).reshape(h.shape[0], -1)
        wo = layer.self_attn.o_proj.weight.t()
    dh = v.shape[-1] // n_heads
    return v.reshape(-1, n_heads, dh), wo.reshape(n_heads, dh, -1)


@torch.no_grad()
def direct_norm(adapter: ModelAdapter, text: str) -> tuple[np.ndarray, np.ndarray]:
    """‖Σ_h A[h,i,j] f_h(x_j)‖ and per head, materialising every weighted vector."""
    twin = eager_twin(adapter)
    enc = adapter.encode(text)
    out = twin(
        input_ids=enc.input_ids, attention_mask=enc.attention_mask, output_hidden_states=True, output_attentions=True
    )
    norms, heads = [], []
    for l, layer in enumerate(_layers(twin)):
        v, wo = hand_values(twin, layer, out.hidden_states[l][0])
        f = torch.einsum("jhk,hkd->jhd", v, wo)
        a = out.attentions[l][0]  # [H, S, S]
        weighted = a[:, :, :, None] * f.permute(1, 0, 2)[:, None]  # [H, i, j, d]
        norms.append(weighted.sum(0).norm(dim=-1))
        heads.append(weighted.norm(dim=-1))
    return torch.stack(norms).numpy(), torch.stack(heads).numpy()


def test_norm_matches_direct_computation(tiny: ModelAdapter) -> None:
    e = Norm(per_head=True).attribute(tiny, tiny.encode([TEXT, "i loved it"]), target=Target())[0]
    norm, heads = direct_norm(tiny, TEXT)
    np.testing.assert_allclose(e.arrays["norm"], norm, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(e.arrays["norm_heads"], heads, rtol=1e-4, atol=1e-6)
    pos = e.info["position"]
    np.testing.assert_allclose(e.scores, norm[-1, pos], rtol=1e-4, atol=1e-6)


def test_norm_rollout_aggregate(tiny: ModelAdapter) -> None:
    e = Norm(aggregate="rollout").attribute(tiny, tiny.encode(TEXT), target=Target())[0]
    n = e.arrays["norm"].shape[-1]
    r = np.eye(n)
    for m in e.arrays["norm"].astype(np.float64):
        m = m / m.sum(1, keepdims=True)
        m = 0.5 * m + 0.5 * np.eye(n)
        r = (m / m.sum(1, keepdims=True)) @ r
    np.testing.assert_allclose(e.scores, r[e.info["position"]], rtol=1e-4, atol=1e-6)
    if tiny.kind == "causal_lm":
        assert np.all(np.triu(r, 1) == 0)


def test_norm_bad_aggregate(tiny: ModelAdapter) -> None:
    with pytest.raises(StreetlampError, match="aggregate"):
        Norm(aggregate="max").attribute(tiny, tiny.encode(TEXT), target=Target())  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------- ALTI
def test_l1_contributions_hand_worked() -> None:
    y = torch.tensor([[3.0, 1.0]])  # ‖y‖₁ = 4
    t = torch.tensor([[[3.0, 0.0], [0.0, 1.0], [-4.0, 0.0]]])
    # ‖y−T‖₁ = 1, 3, 8 -> c = 3, 1, max(0, −4) = 0 -> normalised 0.75, 0.25, 0
    c = l1_contributions(t, y)
    torch.testing.assert_close(c, torch.tensor([[3.0, 1.0, 0.0]]))
    torch.testing.assert_close(c / c.sum(-1, keepdim=True), torch.tensor([[0.75, 0.25, 0.0]]))


def test_rollout_hand_worked() -> None:
    c1 = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    c2 = torch.tensor([[0.5, 0.5], [0.0, 1.0]])
    # R = C2 C1 = [[0.75, 0.25], [0.5, 0.5]]
    torch.testing.assert_close(rollout(torch.stack([c1, c2])), torch.tensor([[0.75, 0.25], [0.5, 0.5]]))


def _block_outputs(twin: torch.nn.Module, enc) -> list[torch.Tensor]:  # noqa: ANN001
    """The attention block's real output per layer, hooked on the HF modules of the eager twin:
    post-LN: the output of the attention LayerNorm; pre-LN and sandwich: the input of the norm before the MLP."""
    t = twin.config.model_type
    got: list[torch.Tensor] = []
    handles = []
    for layer in _layers(twin):
        if t in ("bert", "roberta", "distilbert", "deberta-v2"):
            mod = layer.attention.output.LayerNorm if t != "distilbert" else layer.sa_layer_norm
            handles.append(mod.register_forward_hook(lambda m, a, o: got.append(o[0].detach())))
        else:
            # Gemma's post_attention_layernorm normalises the attention output; the residual sum
            # enters pre_feedforward_layernorm
            mod = (
                layer.ln_2
                if t == "gpt2"
                else layer.pre_feedforward_layernorm
                if t.startswith("gemma")
                else layer.mlp_norm
                if t == "modernbert"
                else layer.post_attention_layernorm
            )
            handles.append(mod.register_forward_pre_hook(lambda m, a: got.append(a[0][0].detach())))
    try:
        with torch.no_grad():
            twin(input_ids=enc.input_ids, attention_mask=enc.attention_mask)
    finally:
        for h in handles:
            h.remove()
    return got


def test_alti_decomposition_is_exact(tiny: ModelAdapter) -> None:
    enc = tiny.encode(TEXT)
    n = enc.lengths[0]
    real = _block_outputs(eager_twin(tiny), enc)
    cache = tiny.forward(
        enc, record=["layers.*.attn.v", "layers.*.attn.pattern", "layers.*.resid_pre", "layers.*.attn.out"]
    ).cache
    for l in range(tiny.n_layers):
        d = alti_layer(tiny, cache, 0, n, l, keep_vectors=True, chunk_elems=n * tiny.d_model * 3)  # several chunks
        assert d.t is not None
        torch.testing.assert_close(d.t.sum(1) + d.bias, real[l][:n], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(d.y, real[l][:n], atol=2e-5, rtol=1e-4)
        # contributions: the L1 formula on the real output, written out here
        yn = real[l][:n].abs().sum(-1)
        c = (yn[:, None] - (real[l][:n, None] - d.t).abs().sum(-1)).clamp_min(0)
        torch.testing.assert_close(d.contributions, c / c.sum(-1, keepdim=True), atol=1e-5, rtol=1e-4)
        if tiny.kind == "causal_lm":
            assert torch.all(d.t[torch.triu_indices(n, n, 1).unbind()] == 0)
    e = Alti().attribute(tiny, enc, target=Target())[0]
    c = e.arrays["contributions"].astype(np.float64)
    np.testing.assert_allclose(c.sum(-1), 1, atol=1e-5)
    np.testing.assert_allclose(
        e.arrays["matrix"], np.linalg.multi_dot(c[::-1]) if len(c) > 1 else c[0], rtol=1e-4, atol=1e-6
    )
    np.testing.assert_allclose(e.scores, e.arrays["matrix"][e.info["position"]])


def test_alti_unsupported_family_is_a_clear_error() -> None:
    fake = types.SimpleNamespace(family=types.SimpleNamespace(name="no-such-family"))
    with pytest.raises(StreetlampError, match="supported: bert"):
        placement(fake)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------- value zeroing
def plain_value_zeroing(adapter: ModelAdapter, text: str) -> tuple[np.ndarray, np.ndarray]:
    """One full forward pass per zeroed token; per-layer matrices and their rollout."""
    enc = adapter.encode(text)
    n = enc.lengths[0]
    L = adapter.n_layers
    f = adapter.forward(enc, record=["layers.*.resid_post"])
    allowed = f.cache["allowed"][0].numpy()
    mats = np.zeros((L, n, n))
    for l in range(L):
        x = f.cache[f"layers.{l}.resid_post"][0].double()
        for j in range(n):

            def zero(v: torch.Tensor, j: int = j) -> torch.Tensor:
                v = v.clone()
                v[:, j] = 0
                return v

            g = adapter.forward(enc, record=[f"layers.{l}.resid_post"], edit={f"layers.{l}.attn.v": zero})
            xt = g.cache[f"layers.{l}.resid_post"][0].double()
            mats[l, :, j] = 1 - torch.nn.functional.cosine_similarity(xt, x, dim=-1).numpy()
        mats[l] *= allowed
        mats[l] /= mats[l].sum(1, keepdims=True)
    r = mats[0]
    for m in mats[1:]:
        r = m @ r
    return mats, r


def test_value_zeroing_matches_plain_loop(tiny: ModelAdapter) -> None:
    enc = tiny.encode([TEXT, "i loved it"])
    n = enc.lengths[0]
    e = ValueZeroing().attribute(tiny, enc, target=Target(), batch_size=3 * n)[0]  # 3 zeroings per pass
    mats, r = plain_value_zeroing(tiny, TEXT)
    np.testing.assert_allclose(e.arrays["scores"], mats, rtol=2e-3, atol=2e-5)
    np.testing.assert_allclose(e.arrays["matrix"], r, rtol=2e-3, atol=2e-5)
    np.testing.assert_allclose(e.scores, r[e.info["position"]], rtol=2e-3, atol=2e-5)


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_value_zeroing_toy_known_answer(family: str) -> None:
    """Identical tokens, no position signal, uniform attention: every token's value is the same,
    so removing any visible token's value moves token i by the same amount, and each row is
    uniform over the keys i sees: ``C[i, j] = 1/S`` (encoder) or ``1/(i+1)`` for j ≤ i (causal)."""
    model, tok = tiny_model(family, seed=2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(k in name for k in ("query", "key", "q_proj", "k_proj", "position_embeddings")):
                p.zero_()
    adapter = ModelAdapter(model, tok, "toy")
    text = "the the the the the"
    enc = adapter.encode(text)
    n = enc.lengths[0]
    if family == "bert":  # [CLS] and [SEP] differ from "the": use the word tokens only
        ids = enc.input_ids.clone()
        ids[:] = ids[0, 1]
        enc.input_ids = ids
        known = np.full((n, n), 1 / n)
    else:
        known = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    e = ValueZeroing().attribute(adapter, enc, target=Target())[0]
    for l in range(adapter.n_layers):
        np.testing.assert_allclose(e.arrays["scores"][l], known, atol=1e-4)
    np.testing.assert_allclose(e.arrays["matrix"], np.linalg.matrix_power(known, adapter.n_layers), atol=1e-4)


# ------------------------------------------------------------------------------ embedded models
@pytest.mark.slow
def test_embedded_classifier(minilm: ModelAdapter) -> None:
    text = "a gripping , honest film"
    norm, _ = direct_norm(minilm, text)
    e = Norm().attribute(minilm, minilm.encode(text), target=Target())[0]
    np.testing.assert_allclose(e.arrays["norm"], norm, rtol=1e-3, atol=1e-5)
    test_alti_decomposition_is_exact(minilm)
    e = ValueZeroing().attribute(minilm, minilm.encode(text), target=Target())[0]
    mats, r = plain_value_zeroing(minilm, text)
    np.testing.assert_allclose(e.arrays["matrix"], r, rtol=2e-3, atol=2e-5)


@pytest.mark.slow
def test_embedded_causal_lm(smollm: ModelAdapter) -> None:
    text = "The capital of France is"
    norm, _ = direct_norm(smollm, text)
    e = Norm().attribute(smollm, smollm.encode(text), target=Target())[0]
    np.testing.assert_allclose(e.arrays["norm"], norm, rtol=1e-3, atol=1e-4)
    enc = smollm.encode(text)
    real = _block_outputs(eager_twin(smollm), enc)
    cache = smollm.forward(
        enc, record=["layers.*.attn.v", "layers.*.attn.pattern", "layers.*.resid_pre", "layers.*.attn.out"]
    ).cache
    for l in (0, smollm.n_layers // 2, smollm.n_layers - 1):
        d = alti_layer(smollm, cache, 0, enc.lengths[0], l, keep_vectors=True)
        torch.testing.assert_close(d.t.sum(1) + d.bias, real[l][: enc.lengths[0]], atol=1e-3, rtol=1e-4)
    v = ValueZeroing().attribute(smollm, enc, target=Target())[0]
    assert np.all(np.triu(v.arrays["matrix"], 1) == 0)
    np.testing.assert_allclose(v.arrays["matrix"].sum(1), 1, atol=1e-4)
