"""Span occlusion of long inputs (prefix KV cache + fused suffix passes) against plain occlusion and
against a brute-force full recompute of every perturbed text (tiny models in float64, F64_TOL)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.methods.long_occlusion import default_window, occlusion_spans
from streetlamp.methods.occlusion import Occlusion
from streetlamp.models.adapter import Inputs, ModelAdapter, Target
from streetlamp.models.tiny import tiny_model
from tests.conftest import F64_TOL

TEXT = "the movie was not good , but the acting was great and i loved it"


def tiny64(family: str) -> ModelAdapter:
    model, tok = tiny_model(family, seed=1, layers=3)
    return ModelAdapter(model.double(), tok, f"tiny-{family}")


def brute_force(adapter: ModelAdapter, inputs: Inputs, target: Target, window: int, replacement: str) -> np.ndarray:
    """F(x) - F(x without span k), each perturbed text run whole through the eager model, the removal
    rule spelled out here: special tokens stay; on a causal LM, deletion keeps the last position and
    turns a removed first position into the document-start token; a replacement token keeps every position."""
    n = inputs.lengths[0]
    ids = inputs.input_ids[0, :n].tolist()
    special = adapter.special_mask(ids)
    tok = adapter.tokenizer
    causal = adapter.kind == "causal_lm"
    token_id = {"mask": tok.mask_token_id, "unk": tok.unk_token_id, "delete": None}[replacement]
    sink = tok.get_vocab().get("<|endoftext|>", tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id)

    def f(row: list[int], target: Target) -> tuple[float, int]:
        one = Inputs.from_ids(adapter, [torch.tensor(row)], strings=False)
        logits = adapter.forward(one).logits
        index = adapter.resolve(one, target, logits)
        return float(adapter.score(logits, index, target)[0]), int(index[0])

    base, index = f(ids, target)
    fixed = Target(index, target.contrast, target.quantity)  # the original text's explained output
    out = []
    for s in range(0, n, window):
        span = [
            i
            for i in range(s, min(n, s + window))
            if not special[i] and not (causal and token_id is None and i == n - 1)
        ]
        if not span:
            continue
        if token_id is not None:
            row = [token_id if i in span else t for i, t in enumerate(ids)]
        else:
            row = [t for i, t in enumerate(ids) if i not in span or (i == 0 and causal)]
            if causal and 0 in span:
                row[0] = int(sink)
        out.append(base - f(row, fixed)[0])
    return np.array(out)


@pytest.mark.parametrize("replacement", ["mask", "unk", "delete"])
def test_window_one_equals_plain_occlusion(replacement: str) -> None:
    adapter = tiny64("llama")
    inputs = adapter.encode(TEXT)
    for target in (Target(), Target(index=7, quantity="logit")):
        plain = Occlusion(replacement=replacement).attribute(adapter, inputs, target=target)[0]
        spans = occlusion_spans(adapter, inputs, target, window=1, replacement=replacement)
        ref = plain.info["base_score"] - np.array(plain.info["perturbed_scores"])  # float64, one per token
        np.testing.assert_allclose(spans.drop, ref, atol=F64_TOL, rtol=0)
        assert np.array_equal(spans.groups, plain.arrays["groups"])
        np.testing.assert_allclose(spans.tokens.astype(np.float32), plain.scores, atol=0, rtol=0)  # stored float32
        assert np.abs(spans.drop).max() > 1e-4  # not a comparison of zeros
        assert spans.base == pytest.approx(plain.info["base_score"], abs=F64_TOL)


@pytest.mark.parametrize(
    ("family", "replacement"), [("llama", "delete"), ("llama", "unk"), ("gpt2", "delete"), ("bert", "mask")]
)
def test_spans_equal_a_full_recompute_of_each_text(family: str, replacement: str) -> None:
    adapter = tiny64(family)
    inputs = adapter.encode(TEXT)
    n = inputs.lengths[0]
    target = Target(quantity="logit")  # the tiny classifier's probabilities barely move
    for window in (3, 5, default_window(n)):
        got = occlusion_spans(adapter, inputs, target, window=window, replacement=replacement)
        ref = brute_force(adapter, inputs, target, window, replacement)
        assert len(got.drop) == len(ref)
        np.testing.assert_allclose(got.drop, ref, atol=F64_TOL, rtol=0)
        assert np.abs(ref).max() > 1e3 * F64_TOL  # far above the tolerance: not a comparison of zeros
        # every occluded token carries its span's drop
        for k, (s, e) in enumerate(got.spans):
            assert s % window == 0 and e - s <= window
            assert np.all(got.tokens[s:e][got.groups[s:e] == k] == got.drop[k])
    if adapter.kind == "causal_lm":  # the prefix is reused: fewer positions than span count x n
        assert got.positions_computed < len(got.drop) * n


def test_fused_equals_eager_and_bad_window() -> None:
    adapter = tiny64("llama")
    inputs = adapter.encode(TEXT)
    a = occlusion_spans(adapter, inputs, Target(), window=4, replacement="delete", fused=True)
    b = occlusion_spans(adapter, inputs, Target(), window=4, replacement="delete", fused=False)
    np.testing.assert_allclose(a.drop, b.drop, atol=F64_TOL, rtol=0)
    for bad in (0, inputs.lengths[0] + 1):
        with pytest.raises(StreetlampError, match="--occlusion-window"):
            occlusion_spans(adapter, inputs, Target(), window=bad)
