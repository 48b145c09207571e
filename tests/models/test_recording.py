"""Attention recording and interventions against Hugging Face's own eager attention."""

from __future__ import annotations

import copy

import pytest
import torch

from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.sites import output_matrix
from tests.conftest import TEXTS, eager_twin


def layer_window(adapter: ModelAdapter, layer: int) -> int | None:
    """The sliding window of ``layer`` read from the config (independently of the mask code):
    ``layer_types`` says which layers slide (Gemma, Qwen2/3, ModernBERT); without it every layer does
    when ``sliding_window`` is set (Mistral, Phi-3)."""
    cfg = adapter.hf_model.config
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if window is None or (types is not None and types[layer] != "sliding_attention"):
        return None
    return int(window)


def expected_allowed(adapter: ModelAdapter, n: int, layer: int) -> torch.Tensor:
    """``[n, n]``: every key for an encoder; keys j <= i for a decoder; and within the window in a sliding layer."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    window = layer_window(adapter, layer)
    if adapter.kind != "causal_lm":  # ModernBERT's local layers: |i - j| <= sliding_window (= local_attention / 2)
        return (i - j).abs() <= window if window is not None else torch.ones(n, n, dtype=torch.bool)
    ok = j <= i
    return ok & (i - j < window) if window is not None else ok


def check_against_eager(adapter: ModelAdapter, texts: list[str]) -> None:
    inputs = adapter.encode(texts)
    fwd = adapter.forward(inputs, record=["layers.*.attn.pattern"])
    twin = eager_twin(adapter)
    allowed = fwd.cache["allowed"]
    # in float64 (the tiny fixture) the reference runs one text at a time: Hugging Face's eager Gemma and
    # Mistral give NaN rows for padded batches there; in float32 (the embedded models) it is batched like ours
    per_text = next(adapter.hf_model.parameters()).dtype == torch.float64
    if not per_text:
        with torch.no_grad():
            batch_ref = twin(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask, output_attentions=True)
    for b, n in enumerate(inputs.lengths):
        if per_text:
            one = adapter.encode([texts[b]])
            with torch.no_grad():
                ref = twin(input_ids=one.input_ids, attention_mask=one.attention_mask, output_attentions=True)
            row, ref_logits = 0, adapter.select_logits(ref.logits, one)
        else:
            ref, row = batch_ref, b
            ref_logits = adapter.select_logits(ref.logits, inputs)[b : b + 1]
        torch.testing.assert_close(fwd.logits[b : b + 1], ref_logits, atol=1e-5, rtol=1e-5)
        union = torch.zeros(n, n, dtype=torch.bool)
        for l in range(adapter.n_layers):
            ours = fwd.cache[f"layers.{l}.attn.pattern"][b, :, :n, :n]
            theirs = ref.attentions[l][row, :, :n, :n]
            assert ours.shape == (adapter.n_heads, n, n)
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
            ok = expected_allowed(adapter, n, l)
            union |= ok
            assert torch.all(ours[:, ~ok] == 0), "forbidden cells must be exactly 0"
            assert torch.all(ours[:, ok] > 0), "allowed cells carry weight"
            if hasattr(adapter.attn_modules[l], "sinks"):  # gpt-oss: the sink takes its share of every row
                assert bool((ours.sum(-1) < 1).all())
            else:
                torch.testing.assert_close(ours.sum(-1), torch.ones_like(ours.sum(-1)), atol=1e-5, rtol=0)
        assert torch.equal(allowed[b, :n, :n], union), "cache['allowed'] is the union of the layers' masks"


def test_recorded_attention_equals_hf_eager(tiny: ModelAdapter) -> None:
    check_against_eager(tiny, TEXTS)


def test_float64_equals_hf_eager(tiny: ModelAdapter) -> None:
    """The same in float64, with the float32 arithmetic of the comparison above gone. We keep the
    softmax in float64; Hugging Face's eager code takes it in float32 for the decoder families (BERT's
    in float64), so the tolerance is a few float32 roundings of a probability (2^-24 ~ 6e-8 relative),
    not the 1e-5 the float32 comparison needs; the logits get 5x that for the amplification through two
    layers of the tiny configs' weights (initialised with std 0.2)."""
    model = copy.deepcopy(tiny.hf_model).double()
    adapter = ModelAdapter(model, tiny.tokenizer, "f64")
    twin = eager_twin(adapter)
    tol = dict(atol=4e-7, rtol=4e-7)
    # one text at a time: HF's eager Gemma 2 turns padded float64 batches into NaN (a fully masked
    # padding row), which says nothing about us; padding is covered in float32 above
    for text in TEXTS:
        inputs = adapter.encode(text)
        fwd = adapter.forward(inputs, record=["layers.*.attn.pattern"])
        with torch.no_grad():
            ref = twin(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask, output_attentions=True)
        assert fwd.logits.dtype == torch.float64
        torch.testing.assert_close(fwd.logits, adapter.select_logits(ref.logits, inputs), atol=2e-6, rtol=2e-6)
        for l in range(adapter.n_layers):
            torch.testing.assert_close(fwd.cache[f"layers.{l}.attn.pattern"], ref.attentions[l], **tol)


def test_batched_equals_alone(tiny: ModelAdapter) -> None:
    inputs = tiny.encode(TEXTS)
    batch = tiny.forward(inputs, record=["layers.*.attn.pattern"])
    for b, text in enumerate(TEXTS):
        alone = tiny.forward(tiny.encode(text), record=["layers.*.attn.pattern"])
        n = inputs.lengths[b]
        torch.testing.assert_close(batch.logits[b], alone.logits[0], atol=1e-5, rtol=1e-5)
        for l in range(tiny.n_layers):
            torch.testing.assert_close(
                batch.cache[f"layers.{l}.attn.pattern"][b, :, :n, :n],
                alone.cache[f"layers.{l}.attn.pattern"][0],
                atol=1e-5,
                rtol=1e-5,
            )


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
    # the reference one text at a time: Hugging Face's eager Gemma/Mistral give NaN rows for padded
    # batches in float64 (the tiny fixture's precision)
    with torch.no_grad():
        w[head] = 0
        for i, text in enumerate(TEXTS):
            one = tiny.encode([text])
            ref = twin(input_ids=one.input_ids, attention_mask=one.attention_mask).logits
            torch.testing.assert_close(ours[i : i + 1], tiny.select_logits(ref, one), atol=1e-5, rtol=1e-5)
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
