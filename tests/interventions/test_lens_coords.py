"""The lens check's baseline variant and the coordinate interventions (ablate, swap), on a tiny Llama in
float64, each against an independent computation: Hugging Face's own forward with a hand-written hook
that writes the edited residual, numpy least squares for the swap's coordinates, autograd for the lens
vectors; the last row agrees by construction (its readout is the model's)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streetlamp.interventions.lenses.base import read_final
from streetlamp.interventions.lenses.check import check_baseline, neutral_ids, neutral_rows
from streetlamp.interventions.lenses.coords import ablate, coordinate_effects, lens_vectors, swap
from streetlamp.models.adapter import ModelAdapter
from tests.conftest import F64_TOL
from tests.interventions.test_lenses import TEXT, adapter64, hf_hidden, hf_read, random_lens


@pytest.fixture(scope="module")
def llama() -> ModelAdapter:
    return adapter64("llama")


def hf_edited_logits(a: ModelAdapter, ids: torch.Tensor, row: int, v: torch.Tensor) -> torch.Tensor:
    """Hugging Face's output at the last position with residual row ``row`` (0: the embedding output, r: the
    output of decoder layer r - 1) at the last position set to ``v``, by a forward hook."""
    m = a.hf_model

    def hook(mod: torch.nn.Module, args: tuple, out: object) -> object:
        h = (out[0] if isinstance(out, tuple) else out).clone()
        h[:, -1] = v.to(h.dtype)
        return (h, *out[1:]) if isinstance(out, tuple) else h

    module = m.base_model.embed_tokens if row == 0 else m.base_model.layers[row - 1]
    handle = module.register_forward_hook(hook)
    try:
        with torch.no_grad():
            return m(input_ids=ids[None]).logits[0, -1].double()
    finally:
        handle.remove()


def test_baseline_variant_matches_a_hand_made_replacement(llama: ModelAdapter) -> None:
    ids = llama.encode(TEXT).input_ids[0]
    lens = random_lens(llama, seed=6)
    base = torch.randn(4, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    res = check_baseline(llama, ids, lens, 7, base, "test")
    hidden, logits = hf_hidden(llama, ids)
    lp0 = torch.log_softmax(logits[-1].double(), -1)
    for r in range(4):
        rep = hf_edited_logits(llama, ids, r, base[r])
        scale = float(rep.abs().max())
        np.testing.assert_allclose(res["replaced_logits"][r], rep.numpy(), rtol=0, atol=16 * F64_TOL * scale)
        d_model = lp0 - torch.log_softmax(rep, -1)
        h_r = hidden[r][-1] if r < 3 else None
        if h_r is None:  # hidden_states[3] is after the final norm in Hugging Face; the lens's row 3 is the identity
            q = torch.log_softmax(logits[-1].double(), -1)
        else:
            q = torch.log_softmax(hf_read(llama, h_r @ lens.A[r].t() + lens.b[r]).double(), -1)  # type: ignore[operator]
        qb = torch.log_softmax(
            (hf_read(llama, base[r] @ lens.A[r].t() + lens.b[r]) if r < 3 else hf_read(llama, base[r])).double(),
            -1,  # type: ignore[operator]
        )
        d_lens = q - qb
        assert res["model_top"][r] == int(d_model.argmax()) and res["lens_top"][r] == int(d_lens.argmax())
        assert res["rank_model"][r] == int((d_model > d_model[7]).sum())
        assert res["kl_model"][r] == pytest.approx(float((lp0.exp() * d_model).sum()), rel=1e-9)
        assert res["kl_lens"][r] == pytest.approx(float((q.exp() * d_lens).sum()), rel=1e-6)
        assert res["kl_model"][r] > 1e5 * F64_TOL  # the replacement changes the output
    # the last row: the lens's readout is the model's, so the lens and the intervention agree exactly
    np.testing.assert_allclose(res["effect_lens"][-1], res["effect_model"][-1], atol=1e3 * F64_TOL)
    assert res["top1_match"][-1] and res["rows"][-1]["disagrees"] is False


def test_neutral_baseline_is_the_neutral_contexts_residual(llama: ModelAdapter) -> None:
    neutral = neutral_ids(llama, None)
    rows = neutral_rows(llama, neutral)
    hidden, _ = hf_hidden(llama, torch.tensor(neutral))
    for r in range(3):
        np.testing.assert_allclose(rows[r].numpy(), hidden[r][-1].numpy(), atol=16 * F64_TOL)


def test_lens_vectors_are_the_gradient_of_the_lens_logit(llama: ModelAdapter) -> None:
    """v_t = A_r^T W_U[t] = the gradient of W_U[t] · (A_r h + b_r) with respect to h (autograd)."""
    lens = random_lens(llama, seed=2)
    w = llama.hf_model.lm_head.weight.detach().double()
    for r in (0, 2, 3):
        h = torch.randn(32, dtype=torch.float64, requires_grad=True)
        (w[5] @ lens.transform(r, h)).backward()
        np.testing.assert_allclose(lens_vectors(llama, lens, r, [5])[0].numpy(), h.grad.numpy(), atol=F64_TOL)


def test_ablate_and_swap_against_least_squares() -> None:
    g = torch.Generator().manual_seed(0)
    h, v1, v2 = (torch.randn(16, generator=g, dtype=torch.float64) for _ in range(3))
    out = ablate(h, v1[None])
    assert abs(float(out @ v1)) < F64_TOL * float(h.norm() * v1.norm())
    np.testing.assert_allclose((h - out).numpy(), (float(h @ v1) / float(v1 @ v1) * v1).numpy(), atol=F64_TOL)
    V = np.stack([v1.numpy(), v2.numpy()], 1)
    c, *_ = np.linalg.lstsq(V, h.numpy(), rcond=None)
    rest = h.numpy() - V @ c
    for alpha in (1.0, 2.0):
        got = swap(h, v1, v2, alpha).numpy()
        c2, *_ = np.linalg.lstsq(V, got, rcond=None)
        np.testing.assert_allclose(c2, c + alpha * (c[::-1] - c), atol=1e3 * F64_TOL)  # exchanged coordinates
        np.testing.assert_allclose(got - V @ c2, rest, atol=1e3 * F64_TOL)  # the rest untouched
    assert abs(c[0] - c[1]) > 0.1  # the exchange moves h


@pytest.mark.parametrize("kind, tokens", [("ablate", [7]), ("swap", [7, 11])])
def test_coordinate_effects_match_a_hand_made_edit(llama: ModelAdapter, kind: str, tokens: list[int]) -> None:
    ids = llama.encode(TEXT).input_ids[0]
    lens = random_lens(llama, kind="jacobian", seed=4)
    res = coordinate_effects(llama, ids, lens, kind, tokens, alpha=2.0)
    hidden, logits = hf_hidden(llama, ids)
    lp0 = torch.log_softmax(logits[-1].double(), -1)
    w = llama.hf_model.lm_head.weight.detach().double()
    with torch.no_grad():
        fwd = llama.forward(llama.encode(TEXT), record=["layers.2.resid_post"])
    last = fwd.cache["layers.2.resid_post"][0, -1].double()  # hidden_states[3] is normed in Hugging Face
    for r in range(4):
        h = hidden[r][-1].double() if r < 3 else last
        A = lens.A[r] if r < 3 else torch.eye(32, dtype=torch.float64)
        V = (w[tokens] @ A).numpy()  # [k, d], computed here from the weights
        hv = h.numpy()
        if kind == "ablate":
            u = V[0] / np.linalg.norm(V[0])
            edited = hv - (hv @ u) * u
        else:
            c, *_ = np.linalg.lstsq(V.T, hv, rcond=None)
            edited = hv + 2.0 * (V.T @ (c[::-1] - c))
        lp1 = torch.log_softmax(hf_edited_logits(llama, ids, r, torch.from_numpy(edited)), -1)
        np.testing.assert_allclose(res["model_after"][r], lp1[tokens].numpy(), atol=1e4 * F64_TOL)
        assert res["kl"][r] == pytest.approx(float((lp0.exp() * (lp0 - lp1)).sum()), rel=1e-6, abs=1e3 * F64_TOL)
        assert res["edit_norm"][r] == pytest.approx(float(np.linalg.norm(edited - hv)), rel=1e-9)
        assert res["edit_norm"][r] > 1e-3
    # at the last row the lens's prediction is the model's outcome (its readout is the model's)
    np.testing.assert_allclose(res["lens_after"][-1], res["model_after"][-1], atol=1e4 * F64_TOL)
    q = torch.log_softmax(read_final(llama, last), -1)
    np.testing.assert_allclose(res["lens_before"][-1], q[tokens].numpy(), atol=1e3 * F64_TOL)
    if kind == "ablate":  # removing a token's direction at the last row lowers its log-probability there
        assert res["model_after"][-1, 0] < res["model_before"][0]


def test_jacobian_lens_reference_artifact(llama: ModelAdapter, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A lens saved in the reference layout ({"J": {l: [d, d]}, ...}, J[l] on block l's output = our row l + 1)
    reads as the same lens on rows 1..L-1, row 0 as the logit lens (warned); only with allow_pt; refused
    for another model's d_model or layers."""
    from streetlamp.errors import StreetlampError
    from streetlamp.interventions.lenses.base import readout
    from streetlamp.interventions.lenses.store import load_lens

    lens = random_lens(llama, kind="jacobian", seed=8)
    J = {l: lens.A[l + 1].float() for l in range(2)}  # type: ignore[union-attr]
    (tmp_path / "j").mkdir()
    torch.save(
        {"J": J, "n_prompts": 3, "source_layers": [0, 1], "d_model": 32}, tmp_path / "j" / "tiny_jacobian_lens.pt"
    )
    with pytest.raises(
        StreetlampError, match="tiny_jacobian_lens.pt is a pickle.*--lens jacobian --convert.*--allow-pt"
    ):
        load_lens(tmp_path / "j", llama, "jacobian")
    back = load_lens(tmp_path / "j", llama, "jacobian", allow_pt=True)
    assert back.A[0] is None and "rows [0]" in back.info["warning"]
    hidden, _ = hf_hidden(llama, llama.encode(TEXT).input_ids[0])
    for r in (1, 2):
        want = readout(llama, lens, r, hidden[r])
        np.testing.assert_allclose(readout(llama, back, r, hidden[r]), want, atol=1e-4 * float(want.abs().max()))
    torch.save(
        {"J": J, "n_prompts": 3, "source_layers": [0, 1], "d_model": 16}, tmp_path / "j" / "tiny_jacobian_lens.pt"
    )
    with pytest.raises(StreetlampError, match="d_model 16.*reads only the model"):
        load_lens(tmp_path / "j", llama, allow_pt=True)
    torch.save({"J": {**J, 2: J[0]}, "d_model": 32}, tmp_path / "j" / "tiny_jacobian_lens.pt")
    with pytest.raises(StreetlampError, match="matrix for layer 2.*reads only the model"):
        load_lens(tmp_path / "j", llama, allow_pt=True)
