"""The metrics (features/metrics.py) against direct computations: numpy over the recorded activations for
FVU, L0, dead and dense; the cross-entropies by plain PyTorch hooks on the Hugging Face model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from streetlamp.features.activations import build_corpus, site_activations
from streetlamp.features.metrics import DENSE, cross_entropy, reconstruction
from streetlamp.models.features import FeatureSet

from ..models.test_features import random_dictionary
from .helpers import adapter64, corpus_file


@pytest.mark.parametrize(("where", "act"), [("mlp", "relu"), ("resid_pre", "topk"), ("mlp", "jumprelu")])
def test_reconstruction_metrics_by_numpy(tmp_path, where: str, act: str) -> None:
    a = adapter64("llama")
    held = build_corpus(a, str(corpus_file(tmp_path)), tokens=50, seq_len=10, heldout=5, seed=0).held
    d = random_dictionary(1, where, a.d_model, 40, act, seed=3)
    got = reconstruction(a, FeatureSet({(1, where): d}), held, batch_seqs=2)[1]
    x, y = site_activations(a, held, [1], where)[1]
    x, y = x[:, 1:].reshape(-1, a.d_model).numpy(), y[:, 1:].reshape(-1, a.d_model).numpy()
    W_enc, b_enc, W_dec, b_dec = (getattr(d, n).numpy() for n in ("W_enc", "b_enc", "W_dec", "b_dec"))
    z = (x - b_dec if d.b_dec_in else x) @ W_enc + b_enc
    if act == "relu":
        f = np.maximum(z, 0)
    elif act == "topk":
        f = np.zeros_like(z)
        idx = np.argsort(-z, axis=-1, kind="stable")[:, : d.k]
        np.put_along_axis(f, idx, np.maximum(np.take_along_axis(z, idx, -1), 0), -1)
    else:
        f = z * (z > d.threshold.numpy())
    yh = f @ W_dec + b_dec
    fvu = ((y - yh) ** 2).sum() / ((y - y.mean(0)) ** 2).sum()
    fires = (f != 0).mean(0)
    assert got["heldout_tokens"] == x.shape[0] == 5 * 9
    assert got["fvu"] == pytest.approx(fvu, rel=1e-9)
    assert got["l0"] == pytest.approx((f != 0).sum(-1).mean(), rel=1e-12)
    assert got["dead_fraction"] == pytest.approx((fires == 0).mean())
    assert got["dense_fraction"] == pytest.approx((fires > DENSE).mean())
    assert 0 < got["l0"] < 40


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
