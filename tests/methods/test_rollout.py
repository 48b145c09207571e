"""rollout and flow: against a direct product of Hugging Face's own attention matrices (eager twin,
output_attentions), networkx max-flow on the same graph, and hand-worked toy models."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.methods.maxflow import layered_max_flow, networkx_graph
from streetlamp.methods.registry import get_method
from streetlamp.methods.rollout import Flow, Rollout
from streetlamp.models.adapter import ModelAdapter, Target
from streetlamp.models.tiny import tiny_model
from tests.conftest import TEXTS, eager_twin


def hf_attention(adapter: ModelAdapter, text: str) -> torch.Tensor:
    """[L, H, n, n] from Hugging Face's eager attention (output_attentions=True)."""
    twin = eager_twin(adapter)
    inputs = adapter.encode(text)
    with torch.no_grad():
        out = twin(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask, output_attentions=True)
    return torch.stack([a[0] for a in out.attentions]).double()


def direct_rollout(att: torch.Tensor, fuse) -> torch.Tensor:
    n = att.shape[-1]
    r = torch.eye(n, dtype=torch.float64)
    for l in range(att.shape[0]):
        a = 0.5 * fuse(att[l]) + 0.5 * torch.eye(n, dtype=torch.float64)
        a = a / a.sum(-1, keepdim=True)
        r = a @ r
    return r


FUSE = {"mean": lambda a: a.mean(0), "max": lambda a: a.max(0).values, "min": lambda a: a.min(0).values}


@pytest.mark.parametrize("fusion", ["mean", "max"])
def test_rollout_is_the_product_of_hf_attention(tiny: ModelAdapter, fusion: str) -> None:
    exps = Rollout(fusion=fusion).attribute(tiny, tiny.encode(TEXTS), target=Target())
    for b, text in enumerate(TEXTS):
        want = direct_rollout(hf_attention(tiny, text), FUSE[fusion]).numpy()
        np.testing.assert_allclose(exps[b].arrays["matrix"], want, atol=1e-6)
        pos = tiny.explained_position(len(exps[b].tokens))
        np.testing.assert_allclose(exps[b].scores, want[pos], atol=1e-6)
        np.testing.assert_allclose(want.sum(1), 1.0, atol=1e-9)  # rows of R are shares


def test_flow_equals_networkx_on_tiny_models(tiny: ModelAdapter) -> None:
    text = TEXTS[2]
    e = Flow(rows="all").attribute(tiny, tiny.encode(text), target=Target())[0]
    att = hf_attention(tiny, text)
    caps = torch.stack(
        [a / a.sum(-1, keepdim=True) for a in (0.5 * att.mean(1) + 0.5 * torch.eye(att.shape[-1], dtype=torch.float64))]
    ).numpy()
    g = networkx_graph(caps)
    L, n = caps.shape[0], caps.shape[1]
    ref = np.array([[nx.maximum_flow_value(g, (0, j), (L, i)) for j in range(n)] for i in range(n)])
    np.testing.assert_allclose(e.arrays["matrix"], ref, atol=1e-6)
    row = Flow().attribute(tiny, tiny.encode(text), target=Target())[0]
    np.testing.assert_allclose(row.scores, ref[tiny.explained_position(n)], atol=1e-6)
    assert "matrix" not in row.arrays


@pytest.mark.parametrize(
    "L,S,causal,seed", [(2, 9, False, 0), (3, 12, True, 1), (5, 10, False, 2), (6, 8, True, 3), (4, 14, False, 4)]
)
def test_layered_max_flow_equals_networkx(L: int, S: int, causal: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(L, S, S)) * 3  # peaky rows, like real attention
    if causal:
        x = np.where(np.tril(np.ones((S, S))) > 0, x, -np.inf)
    a = np.exp(x - x.max(-1, keepdims=True))
    a = a / a.sum(-1, keepdims=True)
    # some exact zeros and ties, the hard cases for float max-flow
    a[a < 0.01] = 0.0
    caps = 0.5 * a + 0.5 * np.eye(S)
    caps /= caps.sum(-1, keepdims=True)
    g = networkx_graph(caps)
    ref = np.array([[nx.maximum_flow_value(g, (0, j), (L, i)) for j in range(S)] for i in range(S)])
    np.testing.assert_allclose(layered_max_flow(caps), ref, atol=1e-9)
    np.testing.assert_allclose(layered_max_flow(caps, [S - 1, 0]), ref[[S - 1, 0]], atol=1e-9)


def uniform_attention_model(family: str, layers: int) -> ModelAdapter:
    """Zero query/key weights: every head attends uniformly over the keys it may see."""
    model, tok = tiny_model(family, seed=0, layers=layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(k in name for k in ("query", "key", "q_lin", "k_lin", "q_proj", "k_proj")):
                p.zero_()
            if "c_attn" in name:  # GPT-2 packs q, k, v: zero the q and k thirds
                d = p.shape[-1] // 3
                p[..., : 2 * d] = 0
    return ModelAdapter(model, tok, f"uniform-{family}")


def test_one_layer_toy_by_hand() -> None:
    """One layer, uniform attention over n tokens: Â = 0.5/n + 0.5·I, and rollout = flow = Â
    (a single edge per pair). Causal: A[i, j] = 1/(i+1) for j <= i."""
    enc = uniform_attention_model("bert", 1)
    text = "the movie was good"
    n = 6  # [CLS] + 4 words + [SEP]
    a_hat = 0.5 / n + 0.5 * np.eye(n)
    r = Rollout().attribute(enc, enc.encode(text), target=Target())[0]
    f = Flow(rows="all").attribute(enc, enc.encode(text), target=Target())[0]
    np.testing.assert_allclose(r.arrays["matrix"], a_hat, atol=1e-6)
    np.testing.assert_allclose(f.arrays["matrix"], a_hat, atol=1e-6)
    np.testing.assert_allclose(r.scores, [0.5 + 0.5 / n] + [0.5 / n] * (n - 1), atol=1e-6)
    dec = uniform_attention_model("gpt2", 1)
    m = 4
    causal = np.tril(1.0 / np.arange(1, m + 1)[:, None] * np.ones((m, m)))
    want = 0.5 * causal + 0.5 * np.eye(m)
    r = Rollout().attribute(dec, dec.encode(text), target=Target())[0]
    f = Flow(rows="all").attribute(dec, dec.encode(text), target=Target())[0]
    np.testing.assert_allclose(r.arrays["matrix"], want, atol=1e-6)
    np.testing.assert_allclose(f.arrays["matrix"], want, atol=1e-6)
    np.testing.assert_allclose(f.scores, [0.125, 0.125, 0.125, 0.625], atol=1e-6)


def test_two_layer_toy_by_hand() -> None:
    """Two uniform layers over n tokens, a = 0.5/n, d = 0.5 + a: rollout Â² has diagonal d² + (n-1)a²
    and off-diagonal 2ad + (n-2)a²; flow(i, j) = Σ_k min(Â[k, j], Â[i, k]) = n·a = 0.5 off the
    diagonal and d + (n-1)a = 1 on it: flow is not rollout."""
    enc = uniform_attention_model("bert", 2)
    n = 5
    a, d = 0.5 / n, 0.5 + 0.5 / n
    r = Rollout().attribute(enc, enc.encode("i loved it"), target=Target())[0]
    f = Flow(rows="all").attribute(enc, enc.encode("i loved it"), target=Target())[0]
    want_r = np.full((n, n), 2 * a * d + (n - 2) * a * a)
    np.fill_diagonal(want_r, d * d + (n - 1) * a * a)
    np.testing.assert_allclose(r.arrays["matrix"], want_r, atol=1e-6)
    want_f = np.full((n, n), 0.5)
    np.fill_diagonal(want_f, 1.0)
    np.testing.assert_allclose(f.arrays["matrix"], want_f, atol=1e-6)


def test_padding_is_cropped() -> None:
    model, tok = tiny_model("bert", seed=3)
    adapter = ModelAdapter(model, tok, "tiny-bert")
    batch = Flow().attribute(adapter, adapter.encode(TEXTS), target=Target())
    for b, text in enumerate(TEXTS):
        alone = Flow().attribute(adapter, adapter.encode(text), target=Target())[0]
        assert batch[b].scores.shape == (len(alone.tokens),)
        np.testing.assert_allclose(batch[b].scores, alone.scores, atol=1e-5)


def test_bad_input() -> None:
    model, tok = tiny_model("bert", seed=1)
    adapter = ModelAdapter(model, tok, "tiny-bert")
    inputs = adapter.encode(TEXTS[0])
    for bad in (Rollout(fusion="median"), Flow(fusion="sum"), Flow(rows="some")):  # type: ignore[arg-type]
        with pytest.raises(StreetlampError, match="fusion|rows"):
            bad.attribute(adapter, inputs, target=Target())
    with pytest.raises(StreetlampError):
        get_method("rollout", head_fusion="mean")
    with pytest.raises(ValueError):
        layered_max_flow(-np.ones((2, 3, 3)))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["minilm", "smollm"])
def test_embedded_models(model: str, request: pytest.FixtureRequest) -> None:
    adapter = request.getfixturevalue(model)
    text = "the film was surprisingly good"
    r = Rollout().attribute(adapter, adapter.encode(text), target=Target())[0]
    att = hf_attention(adapter, text)
    want = direct_rollout(att, FUSE["mean"]).numpy()
    np.testing.assert_allclose(r.arrays["matrix"], want, atol=1e-5)
    f = Flow().attribute(adapter, adapter.encode(text), target=Target())[0]
    caps = 0.5 * att.mean(1).numpy() + 0.5 * np.eye(att.shape[-1])
    caps /= caps.sum(-1, keepdims=True)
    g = networkx_graph(caps)
    n, L = caps.shape[-1], caps.shape[0]
    pos = adapter.explained_position(n)
    ref = [nx.maximum_flow_value(g, (0, j), (L, pos)) for j in range(n)]
    np.testing.assert_allclose(f.scores, ref, atol=1e-5)
