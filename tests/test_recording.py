"""Attention recording and interventions against Hugging Face's own eager attention."""
from __future__ import annotations

import pytest
import torch

from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.sites import output_matrix

from .conftest import TEXTS, eager_twin


def check_against_eager(adapter: ModelAdapter, texts: list[str]) -> None:
    inputs = adapter.encode(texts)
    fwd = adapter.forward(inputs, record=["layers.*.attn.pattern"])
    twin = eager_twin(adapter)
    with torch.no_grad():
        ref = twin(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask, output_attentions=True)
    ref_logits = adapter.select_logits(ref.logits, inputs)
    torch.testing.assert_close(fwd.logits, ref_logits, atol=1e-5, rtol=1e-5)
    allowed = fwd.cache["allowed"]
    for b, n in enumerate(inputs.lengths):
        for l in range(adapter.n_layers):
            ours = fwd.cache[f"layers.{l}.attn.pattern"][b, :, :n, :n]
            theirs = ref.attentions[l][b, :, :n, :n]
            assert ours.shape == (adapter.n_heads, n, n)
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
            ok = allowed[b, :n, :n]
            assert torch.all(ours[:, ~ok] == 0), "forbidden cells must be exactly 0"
            torch.testing.assert_close(ours.sum(-1), torch.ones_like(ours.sum(-1)), atol=1e-5, rtol=0)
            if adapter.kind == "causal_lm":
                assert torch.equal(ok, torch.ones(n, n, dtype=torch.bool).tril())
            else:
                assert bool(ok.all())


def test_recorded_attention_equals_hf_eager(tiny: ModelAdapter) -> None:
    check_against_eager(tiny, TEXTS)


def test_batched_equals_alone(tiny: ModelAdapter) -> None:
    inputs = tiny.encode(TEXTS)
    batch = tiny.forward(inputs, record=["layers.*.attn.pattern"])
    for b, text in enumerate(TEXTS):
        alone = tiny.forward(tiny.encode(text), record=["layers.*.attn.pattern"])
        n = inputs.lengths[b]
        torch.testing.assert_close(batch.logits[b], alone.logits[0], atol=1e-5, rtol=1e-5)
        for l in range(tiny.n_layers):
            torch.testing.assert_close(batch.cache[f"layers.{l}.attn.pattern"][b, :, :n, :n],
                                       alone.cache[f"layers.{l}.attn.pattern"][0], atol=1e-5, rtol=1e-5)


def test_recording_leaves_logits_unchanged(tiny: ModelAdapter) -> None:
    inputs = tiny.encode(TEXTS)
    plain = tiny.forward(inputs)
    every = tiny.forward(inputs, record=["*"])
    assert torch.equal(plain.logits, every.logits)
    assert len(every.cache) == len(tiny.site_names) + 1  # + "allowed"


def test_scaling_attention_by_one_changes_nothing(tiny: ModelAdapter) -> None:
    inputs = tiny.encode(TEXTS)
    plain = tiny.forward(inputs)
    edits = {f"layers.{l}.attn.pattern": (lambda a: a * 1.0) for l in range(tiny.n_layers)}
    assert torch.equal(plain.logits, tiny.forward(inputs, edit=edits).logits)


@pytest.mark.parametrize("site", ["attn.z", "attn.head_out"])
def test_zeroing_a_head_equals_zeroed_output_projection(tiny: ModelAdapter, site: str) -> None:
    """Independent computation: zero head h's input columns of W_O in an eager copy of the model."""
    layer, head = tiny.n_layers - 1, 1
    inputs = tiny.encode(TEXTS)

    def zero(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[:, :, head] = 0
        return x

    ours = tiny.forward(inputs, edit={f"layers.{layer}.{site}": zero}).logits
    twin = eager_twin(tiny)
    twin_adapter = ModelAdapter(twin, tiny.tokenizer, "twin")
    twin.set_attn_implementation("eager")
    w = output_matrix(twin_adapter.o_proj_modules[layer], tiny.n_heads)  # a view on the weight
    with torch.no_grad():
        w[head] = 0
        ref = twin(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask).logits
    torch.testing.assert_close(ours, tiny.select_logits(ref, inputs), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ours, tiny.forward(inputs).logits, atol=1e-6)


def test_head_out_sums_to_attention_output(tiny: ModelAdapter) -> None:
    inputs = tiny.encode(TEXTS)
    f = tiny.forward(inputs, record=["layers.*.attn.head_out", "layers.*.attn.out"])
    bias = tiny.o_proj_modules[0].bias
    for l in range(tiny.n_layers):
        total = f.cache[f"layers.{l}.attn.head_out"].sum(2)
        if tiny.o_proj_modules[l].bias is not None:
            total = total + tiny.o_proj_modules[l].bias
        torch.testing.assert_close(total, f.cache[f"layers.{l}.attn.out"], atol=1e-5, rtol=1e-5)
    del bias


def test_no_hooks_leak(tiny: ModelAdapter) -> None:
    inputs = tiny.encode(TEXTS)

    def count() -> int:
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in tiny.hf_model.modules())

    before = count()
    with pytest.raises(RuntimeError):
        with tiny.session(record=["*"]):
            tiny.hf_model(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask)
            raise RuntimeError("boom")
    assert count() == before
    from streetlamp.models.trace import active_session
    assert active_session() is None


@pytest.mark.slow
def test_embedded_classifier_matches_eager(minilm: ModelAdapter) -> None:
    check_against_eager(minilm, ["The movie was not good, but the acting was great.", "Awful."])


@pytest.mark.slow
def test_embedded_causal_lm_matches_eager(smollm: ModelAdapter) -> None:
    assert smollm.n_kv_heads < smollm.n_heads  # grouped-query attention reported per query head
    check_against_eager(smollm, ["The capital of France is", "Hello there"])
