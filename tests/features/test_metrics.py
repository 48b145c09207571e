"""The metrics (features/metrics.py) against direct computations: numpy over the recorded activations for
FVU (and its per-token columns), L0, dead and dense; the cross-entropies by plain PyTorch hooks on the Hugging
Face model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from streetlamp.features.activations import build_corpus, site_activations
from streetlamp.features.metrics import DENSE, cross_entropy, fvu_columns, reconstruction
from streetlamp.models.features import FeatureSet

from ..models.test_features import random_dictionary
from .helpers import adapter64, corpus_file


def _numpy_forward(d, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    """The latents and the reconstruction of ``x`` by the dictionary's weights, in numpy."""
    W_enc, b_enc, W_dec, b_dec = (getattr(d, n).numpy() for n in ("W_enc", "b_enc", "W_dec", "b_dec"))
    z = (x - b_dec if d.b_dec_in else x) @ W_enc + b_enc
    if d.activation == "relu":
        f = np.maximum(z, 0)
    elif d.activation == "topk":
        f = np.zeros_like(z)
        idx = np.argsort(-z, axis=-1, kind="stable")[:, : d.k]
        np.put_along_axis(f, idx, np.maximum(np.take_along_axis(z, idx, -1), 0), -1)
    else:
        f = z * (z > d.threshold.numpy())
    return f, f @ W_dec + b_dec


def _numpy_fvus(y: np.ndarray, yh: np.ndarray) -> dict[str, float]:
    """fvu and the per-token columns as features/metrics.py's docstring defines them, in numpy."""
    e2 = ((y - yh) ** 2).sum(1)
    centre = np.median(y, axis=0)
    dist = np.sqrt(((y - centre) ** 2).sum(1))
    keep = dist <= 10 * np.median(dist)  # massive: more than 10 median distances from the median
    yk = y[keep]
    return {
        "fvu": e2.sum() / ((y - y.mean(0)) ** 2).sum(),
        "fvu_token_median": np.median(e2 / dist**2),
        "fvu_without_massive": e2[keep].sum() / ((yk - yk.mean(0)) ** 2).sum(),
        "massive_tokens": int((~keep).sum()),
    }


@pytest.mark.parametrize(("where", "act"), [("mlp", "relu"), ("resid_pre", "topk"), ("mlp", "jumprelu")])
def test_reconstruction_metrics_by_numpy(tmp_path, where: str, act: str) -> None:
    a = adapter64("llama")
    held = build_corpus(a, str(corpus_file(tmp_path)), tokens=50, seq_len=10, heldout=5, seed=0).held
    d = random_dictionary(1, where, a.d_model, 40, act, seed=3)
    got = reconstruction(a, FeatureSet({(1, where): d}), held, batch_seqs=2)[1]
    x, y = site_activations(a, held, [1], where)[1]
    x, y = x[:, 1:].reshape(-1, a.d_model).numpy(), y[:, 1:].reshape(-1, a.d_model).numpy()
    f, yh = _numpy_forward(d, x)
    want = _numpy_fvus(y, yh)
    fires = (f != 0).mean(0)
    assert got["heldout_tokens"] == x.shape[0] == 5 * 9
    for c in ("fvu", "fvu_token_median", "fvu_without_massive"):
        assert got[c] == pytest.approx(want[c], rel=1e-9), c
    assert got["massive_tokens"] == want["massive_tokens"]
    assert got["l0"] == pytest.approx((f != 0).sum(-1).mean(), rel=1e-12)
    assert got["dead_fraction"] == pytest.approx((fires == 0).mean())
    assert got["dense_fraction"] == pytest.approx((fires > DENSE).mean())
    assert 0 < got["l0"] < 40


@pytest.mark.parametrize("n", [200, 201])  # the medians of an even and an odd count
def test_one_massive_token_decides_fvu_but_not_the_per_token_columns(n: int) -> None:
    """A random dictionary on random inputs with unrelated targets reconstructs them worse than a constant
    (per-token ratios about 1 or more), except one massive token: 1000 times an ordinary input, its target its
    own reconstruction plus ordinary noise. It holds almost all the variance and is reconstructed, so fvu is
    small; the median per-token ratio and the fvu without it stay those of the ordinary tokens."""
    g = np.random.default_rng(0)
    dim = 16
    d = random_dictionary(0, "mlp", dim, 40, "relu", seed=4)
    x = g.standard_normal((n, dim))
    x[0] *= 1000.0
    _, yh = _numpy_forward(d, x)
    y = g.standard_normal((n, dim))
    y[0] = yh[0] + g.standard_normal(dim)
    yt, yht = torch.from_numpy(y), d.decode(d.encode(torch.from_numpy(x)), torch.from_numpy(x))
    np.testing.assert_allclose(yht.numpy(), yh, rtol=1e-12, atol=1e-12)  # the dictionary is the numpy one
    got = fvu_columns(yt, (yt - yht).pow(2).sum(-1))
    want = _numpy_fvus(y, yh)
    for c in ("fvu", "fvu_token_median", "fvu_without_massive"):
        assert got[c] == pytest.approx(want[c], rel=1e-12), c
    assert got["massive_tokens"] == want["massive_tokens"] == 1
    # the direction: fvu is small, the ordinary tokens' columns are not
    assert got["fvu"] < 0.01 and got["fvu_token_median"] > 0.5 and got["fvu_without_massive"] > 0.5
    # without the massive token, fvu_without_massive is plain fvu over the rest
    rest = _numpy_fvus(y[1:], yh[1:])
    assert got["fvu_without_massive"] == pytest.approx(rest["fvu"], rel=1e-12)
    # why the centre is the median: against the mean (dragged by the massive token) every ordinary token looks
    # far away, and the median ratio flatters the dictionary
    e2 = ((y - yh) ** 2).sum(1)
    assert np.median(e2 / ((y - y.mean(0)) ** 2).sum(1)) < 0.5 * got["fvu_token_median"]


def test_fvu_columns_exact_tokens_and_ties() -> None:
    """A token reconstructed exactly at the median itself is ratio 0 (0/0), one missed there is +inf."""
    y = torch.tensor([[0.0], [1.0], [2.0], [3.0], [4.0]], dtype=torch.float64)
    got = fvu_columns(y, torch.tensor([0.0, 1.0, 0.0, 1.0, 4.0], dtype=torch.float64))
    # median of y: 2; ratios 0/4, 1/1, 0/0 -> 0, 1/1, 4/4 -> median 1; nothing massive
    assert got["fvu_token_median"] == 1.0 and got["massive_tokens"] == 0
    assert got["fvu"] == pytest.approx(6.0 / 10.0, rel=1e-15) == got["fvu_without_massive"]
    got = fvu_columns(y, torch.tensor([0.0, 0.0, 5.0, 0.0, 0.0], dtype=torch.float64))
    assert got["fvu_token_median"] == 0.0  # the ratios 0, 0, +inf, 0, 0
    got = fvu_columns(y, torch.tensor([5.0, 5.0, 5.0, 0.0, 0.0], dtype=torch.float64))
    assert got["fvu_token_median"] == 5.0 / 4.0  # the ratios 5/4, 5, +inf, 0, 0


def _hf_ce(a, ids: torch.Tensor, hook=None, module=None) -> float:  # noqa: ANN001
    h = module.register_forward_hook(hook) if hook is not None else None
    try:
        with torch.no_grad():
            logits = a.hf_model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    finally:
        if h is not None:
            h.remove()
    return float(F.cross_entropy(logits[:, 1:-1].reshape(-1, logits.shape[-1]), ids[:, 2:].reshape(-1)))


def test_cross_entropy_against_hand_written_hooks(tmp_path) -> None:
    a = adapter64("llama")
    held = build_corpus(a, str(corpus_file(tmp_path)), tokens=50, seq_len=10, heldout=4, seed=0).held
    d = random_dictionary(0, "mlp", a.d_model, 64, "relu", seed=5)
    got = cross_entropy(a, FeatureSet({(0, "mlp"): d}), held, batch_seqs=3)[0]
    mlp = a.layer_modules[0].mlp

    def splice(module, args, out):  # noqa: ANN001, ANN202
        x = args[0]
        new = d.decode(d.encode(x), x)
        return torch.cat([out[:, :1], new[:, 1:]], 1)

    def zero(module, args, out):  # noqa: ANN001, ANN202
        return torch.cat([out[:, :1], torch.zeros_like(out[:, 1:])], 1)

    clean = _hf_ce(a, held)
    want_splice = _hf_ce(a, held, splice, mlp)
    want_zero = _hf_ce(a, held, zero, mlp)
    assert got["ce_clean"] == pytest.approx(clean, rel=1e-10)
    assert got["ce_spliced"] == pytest.approx(want_splice, rel=1e-10)
    assert got["ce_zero_ablated"] == pytest.approx(want_zero, rel=1e-10)
    assert got["ce_recovered"] == pytest.approx((want_zero - want_splice) / (want_zero - clean), rel=1e-8)
    assert abs(want_splice - clean) > 1e-3 and abs(want_zero - clean) > 1e-6  # the interventions do something
    assert a.features is None  # restored


def test_sae_cross_entropy_zeroes_resid_pre(tmp_path) -> None:
    a = adapter64("qwen2")
    held = build_corpus(a, str(corpus_file(tmp_path)), tokens=50, seq_len=8, heldout=3, seed=1).held
    d = random_dictionary(1, "resid_pre", a.d_model, 48, "topk", seed=2)
    got = cross_entropy(a, FeatureSet({(1, "resid_pre"): d}), held)[1]
    layer = a.layer_modules[1]

    def pre(fn):  # noqa: ANN001, ANN202
        def hook(module, args, kwargs):  # noqa: ANN001, ANN202
            x = args[0] if args else kwargs["hidden_states"]
            new = torch.cat([x[:, :1], fn(x)[:, 1:]], 1)
            if args:
                return (new, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": new}

        return hook

    def ce_with(fn) -> float:  # noqa: ANN001
        h = layer.register_forward_pre_hook(pre(fn), with_kwargs=True)
        try:
            return _hf_ce(a, held)
        finally:
            h.remove()

    assert got["ce_spliced"] == pytest.approx(ce_with(lambda x: d.decode(d.encode(x))), rel=1e-10)
    assert got["ce_zero_ablated"] == pytest.approx(ce_with(torch.zeros_like), rel=1e-10)
