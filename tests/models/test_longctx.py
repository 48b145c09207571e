"""Long context in bounded memory: chunked recording, rows recomputed from stored q/k, rollout and
flow of the explained row, the fused (SDPA) path; each against the full-tensor implementation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors import safe_open

from streetlamp.commands.explain.long import read_rows, record
from streetlamp.errors import StreetlampError
from streetlamp.methods.attention import record_attention
from streetlamp.methods.long_rows import check_flow_size, flow_row, rollout_row
from streetlamp.methods.maxflow import layered_max_flow
from streetlamp.methods.rollout import residual_attention, rollout_matrix
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.attention import fused_attention
from streetlamp.models.chunked import LayerRule, QKStore, Scratch, Selection, fused_long, pattern_block
from streetlamp.models.tiny import tiny_model
from tests.conftest import F64_TOL, f32_tol

TEXT = "the movie was not good , but the acting was great and i loved it"
# Gemma 2: soft-capping and sliding-window layers; BERT: bidirectional; GPT-2: MHA; Llama: GQA + RoPE
EXACT_FAMILIES = ["llama", "gpt2", "gemma2", "bert"]


def tiny64(family: str, layers: int = 3) -> ModelAdapter:
    model, tok = tiny_model(family, seed=1, layers=layers)
    return ModelAdapter(model.double(), tok, f"tiny-{family}")


def full(adapter: ModelAdapter) -> tuple[np.ndarray, np.ndarray]:
    """Logits and attention [L, H, n, n] from the existing full-tensor path (float64)."""
    logits, att, _ = record_attention(adapter, adapter.encode(TEXT))
    return logits[0].numpy(), att[0].numpy()


def recorded(adapter: ModelAdapter, tmp_path, rows=None, layers=None, heads=None, chunk=3):
    inputs = adapter.encode(TEXT)
    n = inputs.lengths[0]
    sel = Selection(
        layers or list(range(adapter.n_layers)), heads or list(range(adapter.n_heads)), rows or list(range(n))
    )
    logits, rec = record(adapter, inputs, tmp_path, sel, chunk=chunk)
    return logits[0].numpy(), rec, QKStore(tmp_path, rec.describe())


@pytest.mark.parametrize("family", EXACT_FAMILIES)
def test_recorded_and_recomputed_rows_equal_the_full_tensor(family: str, tmp_path) -> None:
    adapter = tiny64(family)
    ref_logits, att = full(adapter)
    n = att.shape[-1]
    rows, heads = [0, 4, n - 1], [1, 3]
    logits, rec, store = recorded(adapter, tmp_path, rows=rows, heads=heads)
    np.testing.assert_allclose(logits, ref_logits, atol=F64_TOL, rtol=0)  # the chunked forward is the model
    assert {s["layer"] for s in rec.shards} == set(range(adapter.n_layers))
    (tmp_path / "manifest.json").write_text(__import__("json").dumps({"long_context": rec.describe()}))
    for layer in range(adapter.n_layers):
        kept = read_rows(tmp_path, layer, rows, heads)  # from the shards
        np.testing.assert_allclose(kept, att[layer][heads][:, rows], atol=F64_TOL, rtol=0)
        again = store.rows(layer, rows).numpy()  # recomputed from q/k, every head
        np.testing.assert_allclose(again, att[layer][:, rows], atol=F64_TOL, rtol=0)
        assert np.array_equal(again[heads], kept)  # same code, same chunk shapes: bit for bit
        np.testing.assert_allclose(store.column(layer, 2).numpy(), att[layer][:, :, 2], atol=F64_TOL, rtol=0)
        other = read_rows(tmp_path, layer, [1, 2])  # not kept: recomputed
        np.testing.assert_allclose(other, att[layer][:, [1, 2]], atol=F64_TOL, rtol=0)
    if family == "gemma2":  # the sliding layer's rule really cuts: keys older than the window get 0
        assert store.rules[0].window and store.rules[0].softcap and store.rules[1].window is None
        assert np.all(store.rows(0, [n - 1]).numpy()[:, 0, : n - store.rules[0].window] == 0)


@pytest.mark.parametrize("family", ["llama", "bert", "gemma2"])
def test_rollout_row_equals_the_full_rollout(family: str, tmp_path) -> None:
    adapter = tiny64(family)
    _, att = full(adapter)
    _, _, store = recorded(adapter, tmp_path, rows=[0], layers=[0], chunk=4)
    for fusion in ("mean", "max", "min"):
        ref = rollout_matrix(residual_attention(att, fusion))
        for pos in (0, 5, att.shape[-1] - 1):
            np.testing.assert_allclose(rollout_row(store, pos, fusion), ref[pos], atol=F64_TOL, rtol=0)


def test_flow_row_equals_the_full_flow_and_refuses_past_the_limit(tmp_path) -> None:
    adapter = tiny64("llama", layers=3)
    _, att = full(adapter)
    _, _, store = recorded(adapter, tmp_path, rows=[0], layers=[0])
    pos = att.shape[-1] - 1
    ref = layered_max_flow(residual_attention(att, "mean"), [pos])[0]
    np.testing.assert_allclose(flow_row(store, pos), ref, atol=F64_TOL, rtol=0)
    check_flow_size(30, 1024)  # the stated limit at SmolLM2's depth passes
    with pytest.raises(StreetlampError, match="past the feasible max-flow size"):
        check_flow_size(30, 1025)


def test_recorded_rows_keep_only_what_was_asked(tmp_path) -> None:
    adapter = tiny64("llama", layers=3)
    _, rec, _ = recorded(adapter, tmp_path, rows=[2, 3, 9], layers=[1], heads=[0, 2], chunk=4)
    assert [(s["layer"], s["rows"]) for s in rec.shards] == [(1, [2, 3]), (1, [9])]  # one shard per chunk
    assert sorted(p.name for p in (tmp_path / "attention").iterdir()) == ["L1_2-3.safetensors", "L1_9-9.safetensors"]
    assert rec.describe()["kept"] == {"layers": [1], "heads": [0, 2], "rows": [2, 3, 9]}


@pytest.mark.parametrize("family", ["llama", "mistral", "bert", "gemma2"])
def test_fused_attention_logits_equal_the_eager_path(family: str) -> None:
    model, tok = tiny_model(family, seed=1, layers=3)  # float32: SDPA sums in another order
    adapter = ModelAdapter(model, tok, f"tiny-{family}")
    inputs = adapter.encode([TEXT, "i loved it"])  # padding: the float mask goes to SDPA
    eager = adapter.forward(inputs).logits
    with fused_attention():
        fused = adapter.forward(inputs).logits
    one = adapter.encode(TEXT)
    with fused_long(adapter):  # masks for SDPA (None for one causal text)
        fused_one = adapter.forward(one).logits
    assert torch.allclose(fused_one, eager[:1], atol=f32_tol(3, float(eager.abs().max())), rtol=0)
    with fused_attention():
        # a layer whose pattern is asked for stays eager (layer 0, whose input no fused layer touched:
        # bit for bit), the others still fused
        rec = adapter.forward(inputs, record=["layers.0.attn.pattern"])
    scale = float(eager.abs().max())
    assert torch.allclose(fused, eager, atol=f32_tol(3, scale), rtol=0)
    site = "layers.0.attn.pattern"
    assert torch.equal(rec.cache[site], adapter.forward(inputs, record=[site]).cache[site])
    assert torch.allclose(rec.logits, eager, atol=f32_tol(3, scale), rtol=0)
    if family == "gemma2":  # soft-capped layers cannot be fused: eager, identical
        assert torch.equal(fused, eager)


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_attention_x_gradient_row_equals_the_full_method(family: str, tmp_path) -> None:
    from streetlamp.commands.explain.long import attention_x_gradient_row
    from streetlamp.methods.attention_grad import AttentionXGradient
    from streetlamp.models.adapter import Target

    adapter = tiny64(family)
    inputs = adapter.encode(TEXT)
    sel = Selection([0], [0], [0])
    for target in (Target(), Target(index=1, quantity="logit")):
        ref = AttentionXGradient().attribute(adapter, inputs, target=target)[0].scores
        for mode in (True, False):
            with torch.set_grad_enabled(mode):
                row, logits, _ = attention_x_gradient_row(
                    adapter, inputs, tmp_path / f"{target.index}{mode}", sel, target
                )
                assert torch.is_grad_enabled() == mode  # the mode is restored after the pass
            np.testing.assert_allclose(row, ref, atol=F64_TOL, rtol=0)
            assert logits.grad_fn is None
        assert np.abs(ref).max() > 1e-6  # not a comparison of zeros


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [None, 1, 3, 6])
@pytest.mark.parametrize("softcap", [None, 2.0])
def test_pattern_block_equals_a_dense_masked_softmax(causal: bool, window: int | None, softcap: float | None) -> None:
    """The chunk arithmetic (scores in a reused buffer, masking only the columns that can be masked,
    softmax in place) against one dense masked softmax over the whole [head, query, key] (float64)."""
    g = torch.Generator().manual_seed(0)
    n, h, d = 13, 3, 4
    q, k = (
        torch.randn(h, n, d, generator=g, dtype=torch.float64),
        torch.randn(h, n, d, generator=g, dtype=torch.float64),
    )
    rule = LayerRule(0.7, softcap, causal, window, 1)
    s = (q @ k.transpose(1, 2)) * rule.scaling
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    i, j = torch.arange(n)[:, None], torch.arange(n)[None]
    ok = (j <= i) if causal else torch.ones(n, n, dtype=torch.bool)
    if window:
        ok = ok & ((j > i - window) if causal else ((i - j).abs() < window))
    ref = torch.softmax(s.masked_fill(~ok, float("-inf")), -1)
    scratch = Scratch()
    for step in (1, 2, 5, n):
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            for sc in (scratch, None):
                block, k0 = pattern_block(q, k, r0, r1, rule, sc)
                full = torch.zeros(h, r1 - r0, n, dtype=torch.float64)
                full[:, :, k0 : k0 + block.shape[-1]] = block
                torch.testing.assert_close(full, ref[:, r0:r1], atol=F64_TOL, rtol=0)
                assert torch.all(full[:, ~ok[r0:r1]] == 0)  # masked cells exactly 0


def test_recording_without_sdpa_equals_the_fused_one(tmp_path) -> None:
    """``fused=False`` (every layer's output from the chunked probabilities) and the default (SDPA for
    the outputs, chunks only where a row is kept) give the same logits and rows."""
    adapter = tiny64("llama")
    ref_logits, att = full(adapter)
    inputs = adapter.encode(TEXT)
    n = inputs.lengths[0]
    sel = Selection([0, 1, 2], [0, 1, 2, 3], [0, 5, n - 1])
    for fused in (True, False):
        logits, rec = record(adapter, inputs, tmp_path / str(fused), sel, chunk=4, fused=fused)
        np.testing.assert_allclose(logits[0].numpy(), ref_logits, atol=F64_TOL, rtol=0)
        store = QKStore(tmp_path / str(fused), rec.describe())
        for shard in rec.shards:  # the kept rows as written, and recomputed from q/k
            kept = safe_open(str(tmp_path / str(fused) / shard["file"]), framework="np").get_tensor("pattern")
            np.testing.assert_allclose(kept, att[shard["layer"]][:, shard["rows"]], atol=F64_TOL, rtol=0)
            assert np.array_equal(store.rows(shard["layer"], shard["rows"]).numpy(), kept)
        assert {s["layer"] for s in rec.shards} == {0, 1, 2}


def test_bfloat16_on_cpu_records_rows_near_the_float64_ones(tmp_path) -> None:
    """A bfloat16 model on the CPU (numpy has no bfloat16: the QK product then stays in torch): the kept
    rows match the float64 model's to bfloat16's precision (8 bits of mantissa: 2^-8 relative on
    each q and k, a few times that on a probability <= 1 through 3 layers)."""
    ref = tiny64("llama")
    _, att = full(ref)
    model, tok = tiny_model("llama", seed=1, layers=3)
    low = ModelAdapter(model.to(torch.bfloat16), tok, "tiny-llama-bf16")
    n = att.shape[-1]
    sel = Selection(list(range(low.n_layers)), list(range(low.n_heads)), [n - 1])
    _, rec = record(low, low.encode(TEXT), tmp_path, sel, chunk=3)
    store = QKStore(tmp_path, rec.describe())
    for layer in range(low.n_layers):
        got = store.rows(layer, [n - 1]).float().numpy()
        np.testing.assert_allclose(got, att[layer][:, [n - 1]], atol=16 * 2.0**-8, rtol=0)
