"""Encoder-decoders: greedy decoding ends at the decoder's EOS, and occlusion over source and target tokens
equals a brute-force recomputation cell by cell on Hugging Face's eager twin (float64)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from streetlamp.commands.explain import GenerationSettings
from streetlamp.commands.explain.generation import explain_generation
from streetlamp.models.seq2seq import Seq2SeqAdapter
from streetlamp.models.tiny import tiny_seq2seq
from streetlamp.store.files import load_arrays
from tests.conftest import F64_TOL

SOURCE = "the movie was not good"
TARGET = [5, 9, 7]


def _gaps(model: torch.nn.Module, src: torch.Tensor, steps: int) -> tuple[list[int], list[float]]:
    """HF's own greedy tokens (EOS never chosen) and, at each step, max logit minus the EOS logit."""
    eos, start = model.config.eos_token_id, model.config.decoder_start_token_id
    dec, gaps = [start], []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=src[None], decoder_input_ids=torch.tensor([dec])).logits[0, -1]
            others = logits.clone()
            others[eos] = -torch.inf
            gaps.append(float(others.max() - logits[eos]))
            dec.append(int(others.argmax()))
    return dec[1:], gaps


def _eos_bias(model: torch.nn.Module, b: float) -> torch.utils.hooks.RemovableHandle:
    eos = model.config.eos_token_id

    def hook(module: torch.nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        out[..., eos] += b
        return out

    return model.get_output_embeddings().register_forward_hook(hook)


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_greedy_stops_at_eos_like_hf_generate(family: str, tmp_path: Path) -> None:
    """A bias on the LM head's EOS logit chosen between the EOS gaps of HF's greedy path: EOS wins first at
    step m >= 1, so greedy decoding must end there (EOS kept as the last token), as HF's ``generate`` does;
    without the bias it runs to --new-tokens. Seeds whose greedy path is not one repeated token with one gap
    (most tiny random T5s repeat <pad> whatever the decoder reads)."""
    model, tok = tiny_seq2seq(family, seed={"t5": 0, "bart": 1}[family])
    model = model.double()
    adapter = Seq2SeqAdapter(model, tok, f"tiny-{family}")
    src = tok(SOURCE, return_tensors="pt").input_ids[0]
    eos = model.config.eos_token_id
    free, gaps = _gaps(model, src, 6)
    m = 1 + int(np.argmin(gaps[1:]))
    b = gaps[m] + 0.5 * min([g - gaps[m] for g in gaps[:m] if g > gaps[m]] + [1.0])
    assert all(g > b for g in gaps[:m]) and gaps[m] < b, "the bias must let EOS win at step m first"
    handle = _eos_bias(model, b)
    try:
        ours = adapter.generate(src, 6)
        with torch.no_grad():
            hf = model.generate(
                input_ids=src[None], max_new_tokens=6, do_sample=False, num_beams=1, eos_token_id=eos, min_length=0
            )[0].tolist()
        assert ours == free[:m] + [eos]
        assert hf[1:] == ours  # HF's generate: the start token, then the same tokens, EOS last
        res = explain_generation(
            adapter, GenerationSettings.from_values(prompt=SOURCE, new_tokens=6, methods=["saliency"]), tmp_path / "g"
        )
        man = json.loads((tmp_path / "g" / "manifest.json").read_text())
        assert man["generated_ids"] == ours and man["stopped_at"] == "eos"
        assert res.matrices["saliency"].shape == (m + 1, len(src) + m + 1)
        assert "ended by EOS" in res.summary[0]
        # --new-tokens still caps a target whose EOS comes later
        assert adapter.generate(src, m) == free[:m]
    finally:
        handle.remove()
    explain_generation(
        adapter, GenerationSettings.from_values(prompt=SOURCE, new_tokens=2, methods=["saliency"]), tmp_path / "n"
    )
    man = json.loads((tmp_path / "n" / "manifest.json").read_text())
    assert len(man["generated_ids"]) == 2 and man["stopped_at"] == (
        "eos" if man["generated_ids"][-1] == eos else "new_tokens"
    )


def _brute(model: torch.nn.Module, tok, src: list[int], target: list[int], rep: int | None) -> np.ndarray:  # noqa: ANN001
    """Every cell from its own forward pass on ids: row j reads the last position of the decoder inputs
    0..j (with decoder input i replaced by ``rep`` or, for rep None, deleted)."""
    twin = copy.deepcopy(model)
    twin.set_attn_implementation("eager")
    start = twin.config.decoder_start_token_id
    dec = [start] + target[:-1]
    specials = {tok.pad_token_id, tok.eos_token_id, tok.bos_token_id} - {None}
    S, k = len(src), len(target)

    def F(s: list[int], d: list[int], j: int) -> float:
        with torch.no_grad():
            logits = twin(input_ids=torch.tensor([s]), decoder_input_ids=torch.tensor([d])).logits[0, -1]
        return float(torch.log_softmax(logits, -1)[target[j]])

    out = np.zeros((k, S + k))
    for j in range(k):
        d = dec[: j + 1]
        base = F(src, d, j)
        for i in range(S):
            if src[i] in specials:
                continue
            s = src[:i] + src[i + 1 :] if rep is None else src[:i] + [rep] + src[i + 1 :]
            out[j, i] = base - F(s, d, j)
        for i in range(1, j + 1):
            if rep is None and i == j:
                continue  # the input y_j is read after is kept under deletion
            dd = d[:i] + d[i + 1 :] if rep is None else d[:i] + [rep] + d[i + 1 :]
            out[j, S + i] = base - F(src, dd, j)
    return out


@pytest.mark.parametrize("family", ["t5", "bart"])
@pytest.mark.parametrize("replacement", ["mask", "delete"])
def test_occlusion_equals_brute_force(family: str, replacement: str, tmp_path: Path) -> None:
    model, tok = tiny_seq2seq(family, seed=1)
    model = model.double()
    adapter = Seq2SeqAdapter(model, tok, f"tiny-{family}")
    res = explain_generation(
        adapter,
        GenerationSettings.from_values(
            prompt=SOURCE,
            methods=["occlusion"],
            method_params={"occlusion": {"replacement": replacement}},
            batch_size=40,
        ),
        tmp_path / "o",
        continuation_ids=TARGET,
    )
    src = tok(SOURCE).input_ids
    # T5 has no <mask>: the fallback is <unk>, as for every occlusion
    rep = None if replacement == "delete" else (tok.mask_token_id if family == "bart" else tok.unk_token_id)
    ref = _brute(model, tok, src, TARGET, rep)
    np.testing.assert_allclose(res.matrices["occlusion"], ref, rtol=0, atol=F64_TOL)
    S, k = len(src), len(TARGET)
    a = load_arrays(tmp_path / "o" / "arrays.safetensors")
    removed = a["occlusion.removed"]
    assert removed[:, [i for i in range(S) if src[i] in adapter.special_ids]].sum() == 0
    assert removed[:, S].sum() == 0  # the decoder start token
    want = sum(range(k)) - (k - 1 if replacement == "delete" else 0)
    assert removed[:, S:].sum() == want and np.all(removed * (1 - a["allowed"]) == 0)
    assert np.abs(ref[:, S + 1 :]).sum() > 1e-3 and np.abs(ref[:, :S]).sum() > 1e-3  # both blocks carry weight
    occ = json.loads((tmp_path / "o" / "manifest.json").read_text())["parameters"]["methods"]["occlusion"]
    assert occ["replacement_used"] == ("delete" if rep is None else ("mask" if family == "bart" else "unk"))
    assert ("deleted" if rep is None else "replaced by") in occ["removal_rule"]
    np.testing.assert_allclose(occ["base_scores"], [ref_base(model, src, TARGET, j) for j in range(k)], atol=F64_TOL)


def ref_base(model: torch.nn.Module, src: list[int], target: list[int], j: int) -> float:
    dec = [model.config.decoder_start_token_id] + target[:j]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([src]), decoder_input_ids=torch.tensor([dec])).logits[0, -1]
    return float(torch.log_softmax(logits, -1)[target[j]])


SHORT = "i loved it"


def _coalition_values(model: torch.nn.Module, src: list[int], target: list[int], j: int, feats, rep):  # noqa: ANN001, ANN202
    """v(subset present) for row j on the eager twin, from ids: source and decoder inputs 0..j with the absent
    features (("s", i) source position i, ("d", i) decoder input i) replaced by ``rep`` or deleted."""
    twin = copy.deepcopy(model)
    twin.set_attn_implementation("eager")
    dec = [twin.config.decoder_start_token_id] + target[:j]

    def v(present: tuple[bool, ...]) -> float:
        gone = {f for f, p in zip(feats, present) if not p}
        s = [rep if ("s", i) in gone else t for i, t in enumerate(src) if rep is not None or ("s", i) not in gone]
        d = [rep if ("d", i) in gone else t for i, t in enumerate(dec) if rep is not None or ("d", i) not in gone]
        with torch.no_grad():
            logits = twin(input_ids=torch.tensor([s]), decoder_input_ids=torch.tensor([d])).logits[0, -1]
        return float(torch.log_softmax(logits, -1)[target[j]])

    return v


@pytest.mark.parametrize(("family", "replacement"), [("t5", "mask"), ("bart", "delete")])
def test_shap_rows_are_exact_shapley_values(family: str, replacement: str, tmp_path: Path) -> None:
    """Each row's SHAP (every coalition enumerated) equals the Shapley formula over that row's source and
    decoder-input tokens, each coalition's value from its own forward pass on ids (float64)."""
    from itertools import product
    from math import factorial

    model, tok = tiny_seq2seq(family, seed=1)
    model = model.double()
    adapter = Seq2SeqAdapter(model, tok, f"tiny-{family}")
    target = TARGET if replacement == "delete" else TARGET[:2]  # a decoder-input feature either way, fewer passes
    res = explain_generation(
        adapter,
        GenerationSettings.from_values(
            prompt=SHORT, methods=["shap"], method_params={"shap": {"replacement": replacement}}, batch_size=64
        ),
        tmp_path / "s",
        continuation_ids=target,
    )
    src = tok(SHORT).input_ids
    S = len(src)
    rep = None if replacement == "delete" else (tok.mask_token_id if family == "bart" else tok.unk_token_id)
    for j in range(len(target)):
        feats = [("s", i) for i in range(S) if src[i] not in adapter.special_ids]
        feats += [("d", i) for i in range(1, j + 1) if rep is not None or i < j]
        v = _coalition_values(model, src, target, j, feats, rep)
        M = len(feats)
        vals = {z: v(z) for z in product([False, True], repeat=M)}
        for a, (kind, i) in enumerate(feats):
            phi = 0.0
            for z, val in vals.items():
                if z[a]:
                    continue
                with_a = z[:a] + (True,) + z[a + 1 :]
                n = sum(z)
                phi += factorial(n) * factorial(M - n - 1) / factorial(M) * (vals[with_a] - val)
            col = i if kind == "s" else S + i
            assert abs(res.matrices["shap"][j, col] - phi) < 1e-9, (j, kind, i)
        assert np.count_nonzero(res.matrices["shap"][j]) <= M
    a = load_arrays(tmp_path / "s" / "arrays.safetensors")
    assert a["shap.features"].sum(1).tolist() == [
        sum(src[i] not in adapter.special_ids for i in range(S)) + (j if rep is not None else max(j - 1, 0))
        for j in range(len(target))
    ]


def test_lime_rows_are_lime_on_the_row_values(tmp_path: Path) -> None:
    """LIME's row j: the single-sequence LIME fit (tested on analytic functions in test_perturbation) on the
    coalitions drawn from default_rng([seed, j]), each valued by its own forward pass on ids."""
    from streetlamp.methods.shap_lime import lime_coalitions, lime_fit, lime_weights

    model, tok = tiny_seq2seq("bart", seed=1)
    model = model.double()
    adapter = Seq2SeqAdapter(model, tok, "tiny-bart")
    res = explain_generation(
        adapter,
        GenerationSettings.from_values(
            prompt=SHORT, methods=["lime"], method_params={"lime": {"n_samples": 24}}, seed=5
        ),
        tmp_path / "l",
        continuation_ids=TARGET,
    )
    src = tok(SHORT).input_ids
    S = len(src)
    for j in range(len(TARGET)):
        feats = [("s", i) for i in range(S) if src[i] not in adapter.special_ids] + [("d", i) for i in range(1, j + 1)]
        v = _coalition_values(model, src, TARGET, j, feats, tok.mask_token_id)
        z = lime_coalitions(len(feats), 24, np.random.default_rng([5, j]))
        f = np.array([v(tuple(bool(b) for b in row)) for row in z])
        coef, _, _ = lime_fit(z, f, lime_weights(z, 25.0), 1.0)
        cols = [i if kind == "s" else S + i for kind, i in feats]
        np.testing.assert_allclose(res.matrices["lime"][j, cols], coef, rtol=0, atol=1e-8)
