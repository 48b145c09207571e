"""Tuned and Jacobian lenses on the tiny decoders (float64): readouts against Hugging Face's own modules,
the last row is the model, saved lenses reload to identical readouts, bad lens folders are refused, the
Jacobian estimate against float64 central differences, the tuned fit lowers KL, and the intervention
check against a hand-made patched run (a forward hook on the Hugging Face module)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.interventions.lens import logit_lens
from streetlamp.interventions.lenses.base import Lens, readout, row_sites
from streetlamp.interventions.lenses.check import check_against_intervention
from streetlamp.interventions.lenses.fit import corpus_sequences, fit_jacobian, fit_tuned, heldout_kl
from streetlamp.interventions.lenses.store import load_lens, save_lens, save_tuned_lens_package
from streetlamp.models.adapter import Inputs, ModelAdapter
from streetlamp.models.tiny import WORDS, tiny_model
from tests.conftest import F64_TOL

TEXT = "when mary and john went to the store , john gave a drink to"
F32 = 2.0**-24
DECODERS = ["gpt2", "llama", "qwen3", "gemma2"]


def adapter64(family: str, layers: int = 3, seed: int = 2) -> ModelAdapter:
    model, tok = tiny_model(family, seed=seed, layers=layers)
    return ModelAdapter(model.double(), tok, f"tiny-{family}")


def random_lens(a: ModelAdapter, kind: str = "tuned", seed: int = 0) -> Lens:
    g = torch.Generator().manual_seed(seed)
    d, L = a.d_model, a.n_layers
    A = [
        torch.eye(d, dtype=torch.float64) + 0.3 * torch.randn(d, d, generator=g, dtype=torch.float64) for _ in range(L)
    ]
    b = [torch.randn(d, generator=g, dtype=torch.float64) if kind == "tuned" else None for _ in range(L)]
    return Lens(kind, L, d, list(A), b)


def hf_hidden(a: ModelAdapter, ids: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    with torch.no_grad():
        out = a.hf_model(input_ids=ids[None], output_hidden_states=True)
    return tuple(h[0] for h in out.hidden_states), out.logits[0]


def hf_read(a: ModelAdapter, h: torch.Tensor) -> torch.Tensor:
    """Hugging Face's own final norm and LM head (and Gemma's soft-cap), independent of readout.py's Norm."""
    base = a.hf_model.base_model
    with torch.no_grad():
        logits = a.hf_model.lm_head(base.norm(h) if hasattr(base, "norm") else base.ln_f(h))
    cap = getattr(a.hf_model.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


@pytest.mark.parametrize("family", DECODERS)
def test_lens_readout_is_the_affine_map_then_the_models_readout(family: str) -> None:
    """Row r of a random tuned lens = lm_head(norm(A_r h_r + b_r)) with Hugging Face's hidden_states[r] and
    modules; the last row = the model's logits for every lens (no map there by construction)."""
    a = adapter64(family)
    ids = a.encode(TEXT).input_ids[0]
    hidden, logits = hf_hidden(a, ids)
    lens = random_lens(a)
    out = logit_lens(a, ids, index=7, lens=lens)
    for r in range(a.n_layers):
        want = hf_read(a, hidden[r] @ lens.A[r].t() + lens.b[r])  # type: ignore[operator]
        got = readout(a, lens, r, hidden[r])
        scale = float(want.abs().max())
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=16 * F32 * scale)
        np.testing.assert_allclose(out["logit"][r], want[:, 7].numpy(), rtol=0, atol=16 * F32 * scale)
        assert float((got - hf_read(a, hidden[r])).abs().max()) > 1e3 * 16 * F32 * scale  # the map matters
    scale = float(logits.abs().max())
    for kind in ("tuned", "jacobian"):
        last = logit_lens(a, ids, index=7, lens=random_lens(a, kind))["last_logits"]
        np.testing.assert_allclose(last, logits[-1].numpy(), rtol=0, atol=16 * F32 * scale)


@pytest.fixture(scope="module")
def llama() -> ModelAdapter:
    return adapter64("llama")


def test_saved_lens_reloads_to_identical_readouts(llama: ModelAdapter, tmp_path: Path) -> None:
    ids = llama.encode(TEXT).input_ids[0]
    for kind in ("tuned", "jacobian"):
        lens = random_lens(llama, kind, seed=3)
        (tmp_path / kind).mkdir()
        save_lens(tmp_path / kind, lens, llama, {"how": "random"})
        back = load_lens(tmp_path / kind, llama, kind)
        assert back.kind == kind and "warning" not in back.info
        want = logit_lens(llama, ids, 7, lens=lens)
        got = logit_lens(llama, ids, 7, lens=back)
        for k in ("logit", "logprob", "rank", "top_ids"):
            np.testing.assert_array_equal(got[k], want[k])


def test_tuned_lens_package_folder(llama: ModelAdapter, tmp_path: Path) -> None:
    """A lens saved in the tuned-lens package's layout (config.json + params.pt: W = A - I in float32,
    translators applied residually) reads as the same lens, to float32 rounding of A and b."""
    lens = random_lens(llama, seed=4)
    save_tuned_lens_package(tmp_path / "tl", lens, "tiny-llama")
    state = torch.load(tmp_path / "tl" / "params.pt", weights_only=True)
    assert set(state) == {f"{i}.{w}" for i in range(3) for w in ("weight", "bias")}
    np.testing.assert_allclose(state["1.weight"].double() + torch.eye(32, dtype=torch.float64), lens.A[1], atol=8 * F32)
    with pytest.raises(StreetlampError, match="params.pt is a pickle.*--allow-pt"):
        load_lens(tmp_path / "tl", llama, "tuned")  # safetensors only unless the user opts in
    back = load_lens(tmp_path / "tl", llama, "tuned", allow_pt=True)
    ids = llama.encode(TEXT).input_ids[0]
    hidden, _ = hf_hidden(llama, ids)
    for r in range(3):
        want = readout(llama, lens, r, hidden[r])
        np.testing.assert_allclose(readout(llama, back, r, hidden[r]), want, atol=1e-4 * float(want.abs().max()))
    with pytest.raises(StreetlampError, match="holds a tuned lens, not a jacobian lens"):
        load_lens(tmp_path / "tl", llama, "jacobian", allow_pt=True)


def _saved(a: ModelAdapter, folder: Path, kind: str = "tuned") -> Path:
    folder.mkdir()
    save_lens(folder, random_lens(a, kind), a, {})
    return folder


def test_bad_lens_folders_are_refused(llama: ModelAdapter, tmp_path: Path) -> None:
    other = adapter64("llama", layers=2)
    with pytest.raises(StreetlampError, match="3 layers, d_model 32.*has 2 layers"):
        load_lens(_saved(llama, tmp_path / "a"), other)
    f = _saved(llama, tmp_path / "b")
    (f / "lens.safetensors").unlink()
    with pytest.raises(StreetlampError, match="lens.safetensors is missing"):
        load_lens(f, llama)
    f = _saved(llama, tmp_path / "c")
    raw = bytearray((f / "lens.safetensors").read_bytes())
    raw[-5] ^= 0xFF
    (f / "lens.safetensors").write_bytes(bytes(raw))
    with pytest.raises(StreetlampError, match="does not match the sha256"):
        load_lens(f, llama)
    f = _saved(llama, tmp_path / "d")
    (f / "lens.json").write_text("{not json")
    with pytest.raises(StreetlampError, match="lens.json is not readable JSON"):
        load_lens(f, llama)
    (tmp_path / "e").mkdir()
    with pytest.raises(StreetlampError, match="no lens here"):
        load_lens(tmp_path / "e", llama)
    with pytest.raises(StreetlampError, match="does not exist"):
        load_lens(tmp_path / "nothing", llama)
    f = tmp_path / "f"
    save_tuned_lens_package(f, random_lens(llama), "x")
    (f / "params.pt").write_bytes(b"\x80\x04garbage")
    with pytest.raises(StreetlampError, match="params.pt is not a readable tensor file"):
        load_lens(f, llama, allow_pt=True)
    bert_model, bert_tok = tiny_model("bert", seed=1)
    with pytest.raises(StreetlampError, match="pre-norm causal LM"):
        load_lens(_saved(llama, tmp_path / "g"), ModelAdapter(bert_model, bert_tok, "tiny-bert"))
    same_shape = adapter64("llama", seed=9)
    assert "unembedding differs" in load_lens(_saved(llama, tmp_path / "h"), same_shape).info["warning"]


def _fd_jacobian(a: ModelAdapter, seq: torch.Tensor, row: int, skip: int, eps: float = 1e-5) -> torch.Tensor:
    """The paper's J_row for one sequence by float64 central differences: perturb h_row[p] along e_j, sum the
    change of h_final over target positions p' >= max(p, skip), average over source positions p >= skip."""
    sites = row_sites(a.n_layers)
    T, d = seq.shape[0], a.d_model
    J = torch.zeros(d, d, dtype=torch.float64)
    inputs = Inputs.from_ids(a, [seq.tolist()], strings=False)
    for p in range(skip, T):
        for j in range(d):

            def final(sign: float, p: int = p, j: int = j) -> torch.Tensor:
                def edit(x: torch.Tensor) -> torch.Tensor:
                    x = x.clone()
                    x[0, p, j] += sign * eps
                    return x

                with torch.no_grad():
                    f = a.forward(inputs, record=[sites[-1]], edit={sites[row]: edit})
                return f.cache[sites[-1]][0, p:].sum(0)

            J[:, j] += (final(1.0) - final(-1.0)) / (2 * eps)
    return J / (T - skip)


def test_jacobian_estimate_against_finite_differences() -> None:
    """On GPT-2 (LayerNorm: float64 throughout; Llama's RMSNorm runs in float32 inside Hugging Face, which
    central differences of step 1e-5 cannot resolve) the VJP estimate equals the difference quotient."""
    gpt2 = adapter64("gpt2")
    seq = gpt2.encode(TEXT).input_ids[0][:7].clone()
    skip = 3
    lens = fit_jacobian(gpt2, seq[None], probes=0, skip_first=skip, dim_batch=12)
    for row in (0, 2):
        want = _fd_jacobian(gpt2, seq, row, skip)
        got = lens.A[row]
        scale = float(want.abs().max())
        assert got is not None and scale > 0.1
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=1e-6 * scale)  # FD error ~ eps^2
        assert float((want - torch.eye(32, dtype=torch.float64)).abs().max()) > 1e-2  # not the identity


def test_random_probe_estimator_is_unbiased_within_its_variance(llama: ModelAdapter) -> None:
    """k Rademacher probes: E||Ĵ - J||_F^2 = (d - 1)/k · ||J||_F^2 (per entry (1/k) Σ_{m≠i} J[m, j]^2, summed);
    the seeded estimate lies within 3 times that (and its error shrinks from k = 8 to k = 128)."""
    seq = llama.encode(TEXT).input_ids[0][:6].clone()
    exact = fit_jacobian(llama, seq[None], probes=0, skip_first=2, dim_batch=32)
    errs = []
    for k in (8, 128):
        est = fit_jacobian(llama, seq[None], probes=k, skip_first=2, dim_batch=32, seed=5)
        J, E = exact.A[1], est.A[1]
        assert J is not None and E is not None
        expected = (32 - 1) / k * float((J**2).sum())
        err = float(((E - J) ** 2).sum())
        assert 0 < err < 3 * expected
        errs.append(err)
    assert errs[1] < errs[0] / 4


def test_tuned_fit_starts_at_the_logit_lens_and_lowers_kl(llama: ModelAdapter) -> None:
    texts = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(12)) for i in range(40)]
    seqs = corpus_sequences(llama, texts, seq_len=16, seed=0)
    train, held = seqs[:-4], seqs[-4:]
    zero, _ = fit_tuned(llama, train, steps=0, lr=1e-2, batch_seqs=4)
    before = heldout_kl(llama, {"logit": Lens.logit(llama), "tuned": zero}, held)
    np.testing.assert_allclose(before["kl"]["tuned"], before["kl"]["logit"], atol=F64_TOL)
    lens, losses = fit_tuned(llama, train, steps=60, lr=1e-2, batch_seqs=4)
    after = heldout_kl(llama, {"logit": Lens.logit(llama), "tuned": lens}, held)
    assert losses[-1] < 0.5 * losses[0]
    assert np.all(after["kl"]["tuned"][:-1] < after["kl"]["logit"][:-1])
    assert after["kl"]["tuned"][-1] == pytest.approx(0, abs=F64_TOL) and after["kl"]["logit"][-1] == pytest.approx(
        0, abs=F64_TOL
    )
    assert after["tokens"] == 4 * 16 and after["kl"]["logit"][1] > 1e5 * F64_TOL


def test_check_against_intervention_matches_a_hand_made_patch(llama: ModelAdapter) -> None:
    """The patched outcome of row r = the model on the neutral context with Hugging Face's own hidden state
    hidden_states[r] put at the last position by a forward hook; the last row agrees exactly."""
    ids = llama.encode(TEXT).input_ids[0]
    lens = random_lens(llama, seed=6)
    res = check_against_intervention(llama, ids, lens, index=7)
    hidden, _ = hf_hidden(llama, ids)
    neutral = torch.tensor(res["neutral"])
    m = llama.hf_model
    for r in range(1, 3):  # hidden_states[3] is after the final norm in Hugging Face: the last row is checked below

        def hook(mod: torch.nn.Module, args: tuple, out: object, v: torch.Tensor = hidden[r][-1]) -> object:
            h = (out[0] if isinstance(out, tuple) else out).clone()
            h[:, -1] = v
            return (h, *out[1:]) if isinstance(out, tuple) else h

        handle = m.base_model.layers[r - 1].register_forward_hook(hook)
        try:
            with torch.no_grad():
                want = m(input_ids=neutral[None]).logits[0, -1]
        finally:
            handle.remove()
        np.testing.assert_allclose(res["patched_logits"][r], want.numpy(), atol=16 * F32 * float(want.abs().max()))
    assert res["kl"][-1] == pytest.approx(0, abs=1e-9) and res["top1_match"][-1]
    assert res["rows"][-1]["disagrees"] is False and len(res["rows"]) == 4
    assert res["kl"][:-1].min() > 1e5 * F64_TOL  # a random map disagrees with the intervention somewhere
    assert json.dumps(res["rows"])
