"""Logit lens, direct logit attribution, head types and QK attribution on the tiny decoders (float64)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.interventions.head_types import (
    detect_head_types,
    target_cells,
    type_scores,
)
from streetlamp.interventions.lens import direct_logit_attribution, logit_lens
from streetlamp.interventions.qk import head_table, qk_attribution
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.readout import FINAL_NORM, READOUT
from streetlamp.models.tiny import tiny_model

TEXT = "when mary and john went to the store , john gave a drink to"
F32 = 2.0**-24  # unit roundoff of float32: Hugging Face runs RMSNorm (Llama's, Gemma's) in float32
DECODERS = ["gpt2", "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text"]


def adapter64(family: str) -> ModelAdapter:
    model, tok = tiny_model(family, seed=2, layers=3)
    return ModelAdapter(model.double(), tok, f"tiny-{family}")


def ids_of(a: ModelAdapter) -> torch.Tensor:
    return a.encode(TEXT).input_ids[0]


@pytest.mark.parametrize("family", DECODERS)
def test_logit_lens_last_layer_is_the_model(family: str) -> None:
    """The last row of the lens (final norm and unembedding of the last resid_post) equals the
    model's own logits; float64 except Llama's RMSNorm, which Hugging Face runs in float32
    (relative 2^-24 of the largest logit, times a margin of 16)."""
    a = adapter64(family)
    out = logit_lens(a, ids_of(a), index=7)
    scale = np.abs(out["model_logits"]).max()
    np.testing.assert_allclose(out["last_logits"], out["model_logits"], rtol=0, atol=16 * 2.0**-24 * scale)
    assert out["logit"].shape == (a.n_layers + 1, len(ids_of(a)))
    assert out["logit"][-1, -1] == pytest.approx(out["model_logits"][7], abs=16 * 2.0**-24 * scale)
    assert np.all(out["rank"][-1, -1] == (out["model_logits"] > out["model_logits"][7]).sum())


@pytest.mark.parametrize("family", DECODERS)
def test_dla_parts_sum_to_the_logit(family: str) -> None:
    """embed + heads + attention biases + MLPs + β·W_U + b_U = the logit, the final norm linearised with
    its own scale (exact for this residual: float64 arithmetic, Llama's RMSNorm float32 as above)."""
    a = adapter64(family)
    d = direct_logit_attribution(a, ids_of(a), 7)
    tol = 16 * F32 * (abs(d.embed) + np.abs(d.heads).sum() + np.abs(d.mlp).sum() + abs(d.logit))
    assert d.total() == pytest.approx(d.logit, abs=tol)
    np.testing.assert_allclose(d.head_source.sum(-1), d.heads, atol=1e-10)
    assert np.all(np.isfinite(d.head_source))
    assert d.heads.shape == (3, a.n_heads) and np.abs(d.heads).sum() > 0


def test_head_type_scores_on_hand_made_patterns() -> None:
    toks = np.array([5, 6, 7, 8, 5, 6, 7, 8])
    n = len(toks)
    cells = target_cells(toks)
    assert cells["duplicate_token"][4, 0] and not cells["duplicate_token"][4, 1]
    assert cells["induction"][4, 1] and cells["induction"][7, 4] and not cells["induction"][4, 0]
    prev = np.eye(n, k=-1)
    prev[0, 0] = 1
    sink = np.zeros((n, n))
    sink[:, 0] = 1
    induct = np.zeros((n, n))
    for i in range(n):
        induct[i, i - 3 if i >= 4 else 0] = 1  # the token after the earlier copy (i-4) is i-3
    dup = np.zeros((n, n))
    for i in range(n):
        dup[i, i - 4 if i >= 4 else 0] = 1
    s = type_scores(np.stack([prev, sink, induct, dup]), toks)
    np.testing.assert_allclose(s["previous_token"], [1, 1 / 7, 1 / 7, 1 / 7])
    np.testing.assert_allclose(s["attention_sink"], [1 / 7, 1, 3 / 7, 4 / 7])
    np.testing.assert_allclose(s["induction"], [0, 0, 1, 0])
    np.testing.assert_allclose(s["duplicate_token"], [0, 1 / 4, 0, 1])


@pytest.mark.parametrize("family", DECODERS)
def test_detector_runs_on_the_model(family: str) -> None:
    a = adapter64(family)
    s = detect_head_types(a, length=6, n_seqs=2, seed=1)
    for v in s.values():
        assert v.shape == (3, a.n_heads) and np.all((v >= -1e-12) & (v <= 1 + 1e-12))


@pytest.mark.parametrize("family", DECODERS)
def test_qk_parts_sum_to_the_score(family: str) -> None:
    """The [query part x key part] table sums to the score, and the recomputed row of scores
    softmaxes to the model's recorded pattern (its softmax runs in float32: 1e-6; Gemma 2's row is
    soft-capped first, sliding-window layers mask the keys outside the window, so this checks the
    q/k norms, RoPE per layer type, the fused qkv_proj and the masks too). The table sums in float64;
    with Gemma's sandwich norms the model's residual holds each norm's output rounded to float32, so
    the tolerance there is 16 · 2^-24 of the table's absolute mass (else 1e-9)."""
    a = adapter64(family)
    rel = 16 * F32 if READOUT[family].attn_out else 1e-9
    for layer in (0, 1, 2):  # Gemma: sliding, full (other RoPE base), sliding
        qk = qk_attribution(a, ids_of(a), layer, 1, query=9)
        assert qk.table.sum() == pytest.approx(qk.score, abs=rel * (1 + np.abs(qk.table).sum()))
        np.testing.assert_allclose(torch.softmax(torch.tensor(qk.row_scores), 0).numpy(), qk.pattern_row, atol=1e-6)
        assert qk.table.shape == (len(qk.parts), len(qk.parts)) and qk.key == int(np.argmax(qk.pattern_row))
    assert qk.parts[0] == "embed" and "L1H0" in qk.parts and qk.parts[-1] == "bias"


def test_qk_softcap_and_window_on_gemma2() -> None:
    """Gemma 2: the table splits the score before the soft-cap; capped_score = cap·tanh(score/cap), bent
    measurably on this model; on a sliding-window layer (0) keys outside the window are -inf and refused."""
    a = adapter64("gemma2")
    cap = a.hf_model.config.attn_logit_softcapping
    bent = 0.0
    for head in range(a.n_heads):
        qk = qk_attribution(a, ids_of(a), 1, head, query=9)
        assert qk.softcap == cap
        assert qk.capped_score == pytest.approx(cap * np.tanh(qk.score / cap), rel=1e-12)
        bent = max(bent, abs(qk.score - qk.capped_score))
    assert bent > 0.01
    qk = qk_attribution(a, ids_of(a), 0, 1, query=9)  # window 4: keys 6..9
    assert np.all(np.isneginf(qk.row_scores[:6])) and np.all(np.isfinite(qk.row_scores[6:10]))
    with pytest.raises(StreetlampError, match="sliding window 4: 6..9"):
        qk_attribution(a, ids_of(a), 0, 1, query=9, key=2)


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text"])
def test_dla_splits_the_logit_before_the_final_softcap(family: str) -> None:
    """With a final soft-cap the parts sum to the logit before the cap, l, and cap·tanh(l/cap) is the
    model's logit (both to float32 rounding of Gemma's norms), which the cap bends on this token."""
    a = adapter64(family)
    cap = a.hf_model.config.final_logit_softcapping
    idx = int(np.argmax(np.abs(logit_lens(a, ids_of(a), 0)["model_logits"])))
    d = direct_logit_attribution(a, ids_of(a), idx)
    assert d.softcap == cap
    tol = 16 * F32 * (abs(d.embed) + np.abs(d.heads).sum() + np.abs(d.mlp).sum() + abs(d.logit))
    assert cap * np.tanh(d.total() / cap) == pytest.approx(d.model_logit, abs=tol)
    assert abs(d.logit - d.model_logit) > 1e-3 * abs(d.logit)


def test_head_table_and_errors(tiny: ModelAdapter) -> None:
    ids = tiny.encode(TEXT).input_ids[0]
    if tiny.kind == "classifier" or tiny.family.name not in FINAL_NORM:
        with pytest.raises(StreetlampError, match="pre-norm causal LM"):
            qk_attribution(tiny, ids, 0, 0, 3)
        return
    with pytest.raises(StreetlampError, match="head 9 out of range"):
        qk_attribution(tiny, ids, 0, 9, 3)
    with pytest.raises(StreetlampError, match="query position 40"):
        qk_attribution(tiny, ids, 0, 0, 40)
    t = head_table(tiny, ids, 1, 2, 9, index=7)
    assert t["table"]["columns"] == ["what", "which", "value"] and len(t["table"]["rows"]) > 5
    d = direct_logit_attribution(tiny, ids, 7)
    assert t["dla"] == pytest.approx(d.heads[1, 2])
