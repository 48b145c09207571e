"""Training (features/train.py): the losses against hand-written formulas, the JumpReLU straight-through
gradients against their definition, the fold into the model's units is exact, and an interrupted + resumed
fit equals the uninterrupted one with the same seed (no shard twice)."""

from __future__ import annotations

import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.features.activations import build_corpus
from streetlamp.features.train import FitConfig, LayerFit, _Jump, _Step, fit

from .helpers import adapter64, corpus_file

D, W = 8, 12


def trained_like(act: str, where: str = "mlp", seed: int = 0) -> LayerFit:
    """A LayerFit with random (not initial) parameters and scales, as after some training."""
    cfg = FitConfig(where=where, width=W, activation=act, k=3 if act == "topk" else None, aux=1.0, dead_window=0)
    f = LayerFit(0, D, D, cfg, "cpu")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in f.p.values():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        if "threshold" in f.p:
            f.p["threshold"].copy_(torch.rand(W, generator=g) * 0.3)
    f.scale_in, f.scale_out = 1.7, 0.6 if where == "mlp" else 1.7
    return f


@pytest.mark.parametrize("act", ["relu", "topk", "jumprelu"])
@pytest.mark.parametrize("where", ["mlp", "resid_pre"])
def test_fold_into_model_units_is_exact(act: str, where: str) -> None:
    """dictionary() (unit decoder rows, raw units) reconstructs what training computes, divided by s_out."""
    f = trained_like(act, where)
    x = torch.randn(50, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, a, recon = f.forward(x * f.scale_in)
    d = f.dictionary()
    torch.testing.assert_close(d.W_dec.norm(dim=-1), torch.ones(W), rtol=0, atol=1e-6)
    got_a = d.encode(x)
    torch.testing.assert_close(d.decode(got_a), recon / f.scale_out, rtol=1e-5, atol=1e-5)
    assert torch.equal(got_a != 0, a != 0)  # the same latents fire
    assert d.b_dec_in == (where == "resid_pre")


def test_relu_loss_is_mse_plus_decoder_scaled_l1() -> None:
    f = trained_like("relu")
    x, y = torch.randn(20, D), torch.randn(20, D)
    total, parts, _ = f.loss(x, y, lam=0.3)
    p = {k: v.detach() for k, v in f.p.items()}
    a = torch.relu(x @ p["W_enc"] + p["b_enc"])
    mse = ((a @ p["W_dec"] + p["b_dec"] - y) ** 2).sum(-1).mean()
    l1 = 0.3 * (a * p["W_dec"].norm(dim=-1)).sum(-1).mean()
    torch.testing.assert_close(total.detach(), mse + l1)
    assert parts["mse"] == pytest.approx(float(mse), rel=1e-6)


def test_topk_aux_loss_by_hand() -> None:
    """Dead latents (here all: dead_window 0 and nothing fired yet... set by hand): the k_aux = d/2 largest
    scaled pre-activations among them reconstruct the detached residual, weight min(dead/k_aux, 1)."""
    f = trained_like("topk")
    f.since_fired[:] = 0
    dead = torch.zeros(W, dtype=torch.bool)
    dead[[1, 4, 5, 9, 10]] = True
    f.since_fired[dead] = 5
    x, y = torch.randn(20, D), torch.randn(20, D)
    total, parts, _ = f.loss(x, y, lam=0.0)
    p = {k: v.detach() for k, v in f.p.items()}
    n = p["W_dec"].norm(dim=-1)
    z = x @ p["W_enc"] + p["b_enc"]
    h = z * n
    top = torch.topk(h, 3, -1)
    a = torch.zeros_like(h).scatter(-1, top.indices, torch.relu(top.values))
    recon = (a / n) @ p["W_dec"] + p["b_dec"]
    mse = ((recon - y) ** 2).sum(-1).mean()
    k_aux = D // 2  # 4 of the 5 dead
    hd = torch.where(dead[None], h, torch.tensor(-float("inf")))
    t = torch.topk(hd, k_aux, -1)
    aa = torch.zeros_like(h).scatter(-1, t.indices, t.values)
    aux = 1.0 * min(5 / k_aux, 1.0) * (((aa / n) @ p["W_dec"] - (y - recon)) ** 2).sum(-1).mean()
    torch.testing.assert_close(total.detach(), mse + aux)
    assert parts["aux"] == pytest.approx(float(aux), rel=1e-5)


def test_jumprelu_straight_through_gradients() -> None:
    """∂/∂θ of Σ g·JumpReLU(z, θ) = −(θ/ε) Σ_rows g [|z − θ| < ε/2]; of Σ g·H(z − θ) = −(1/ε) Σ_rows g [...];
    ∂/∂z = g [z > θ]; the values are z [z > θ] and [z > θ]."""
    eps = 0.2
    z = torch.tensor([[0.05, 0.31, 0.5, -1.0], [0.28, 0.12, 0.45, 2.0]], dtype=torch.float64, requires_grad=True)
    th = torch.tensor([0.1, 0.3, 0.4, 0.0], dtype=torch.float64, requires_grad=True)
    g = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]], dtype=torch.float64)
    out = _Jump.apply(z, th, eps)
    assert torch.equal(out.detach(), (z * (z > th)).detach())
    gz, gt = torch.autograd.grad((out * g).sum(), [z, th])
    near = ((z - th).abs() < eps / 2).double()
    torch.testing.assert_close(gz, g * (z > th))
    torch.testing.assert_close(gt, (-(th / eps) * near * g).sum(0).detach())
    step = _Step.apply(z, th, eps)
    (gt2,) = torch.autograd.grad((step * g).sum(), [th])
    torch.testing.assert_close(gt2, (-(1 / eps) * near * g).sum(0).detach())
    # a threshold in the window moves: the latent at 0.31 vs 0.3 contributes to both gradients
    assert gt[1] != 0 and gt2[1] != 0


def test_bad_configs_are_one_line() -> None:
    with pytest.raises(StreetlampError, match="at least one latent"):
        FitConfig(where="mlp", width=0)
    with pytest.raises(StreetlampError, match="TopK needs"):
        FitConfig(where="mlp", width=4, activation="topk", k=5)


@pytest.mark.parametrize("act", ["relu", "topk", "jumprelu"])
def test_interrupted_and_resumed_equals_uninterrupted(tmp_path, act: str) -> None:
    a = adapter64("llama")
    corpus = build_corpus(a, str(corpus_file(tmp_path)), tokens=300, seq_len=12, heldout=2, seed=0)
    cfg = FitConfig(
        where="mlp",
        width=16,
        activation=act,
        k=4 if act == "topk" else None,
        batch_seqs=3,
        batch_tokens=11,
        shards=5,
        sparsity=0.5,
        warmup=3,
        aux=1.0 if act == "topk" else 0.0,
        dead_window=2,
        seed=7,
    )
    full, info_full = fit(a, corpus, [0, 1], cfg, checkpoint=tmp_path / "a.safetensors", checkpoint_every=2)
    ck = tmp_path / "b.safetensors"
    part, info_part = fit(a, corpus, [0, 1], cfg, checkpoint=ck, checkpoint_every=2, stop_after=3)
    assert part is None and info_part["shards_done"] == 3
    with pytest.raises(StreetlampError, match="other settings"):
        fit(a, corpus, [0, 1], FitConfig(**{**cfg.record(), "lr": 0.5}), checkpoint=ck, resume=True)
    done, info = fit(a, corpus, [0, 1], cfg, checkpoint=ck, checkpoint_every=2, resume=True)
    assert done is not None and full is not None
    for d in full:
        e = done.get(d.layer, d.where)
        for name in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold"):
            if getattr(d, name) is not None:
                assert torch.equal(getattr(d, name), getattr(e, name)), name
    assert [e["shard"] for e in info["log"]] == list(range(5))  # every shard once
    assert info["log"] == info_full["log"] and info["tokens_seen"] == 5 * 3 * 11
