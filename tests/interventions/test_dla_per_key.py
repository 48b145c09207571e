"""Per-key direct logit attribution (``DLA.head_source``) recomputed by hand from GPT-2's weights in float64
numpy (issue 35, item 11 e): the hidden state entering each layer from Hugging Face, then ``ln_1``, the
value vectors, the causal attention pattern ``softmax(q k^T / sqrt(d_head))``, each key's
``A[h, last, j] v_j W_O,h``, the final LayerNorm linearised at the final residual
``(c - mean c) / sqrt(var x + eps) * gamma`` and ``W_U[y]`` (Elhage et al. 2021). Only the sum over keys
was tested before, which a reversed key axis keeps."""

from __future__ import annotations

import numpy as np
import torch

from streetlamp.interventions.lens import direct_logit_attribution
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.tiny import tiny_model

TOL = 1e-10  # float64 throughout; the two computations differ in summation order only (~1e-16 relative)


def _ln(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * w + b


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def test_per_key_dla_equals_a_hand_computation_key_by_key() -> None:
    model, tok = tiny_model("gpt2", seed=3, layers=2)
    model = model.double()
    a = ModelAdapter(model, tok, "tiny-gpt2")
    ids = a.encode(["john gave a drink to mary and the movie was good"]).rows()[0]
    n, cfg = len(ids), model.config
    H, d = cfg.n_head, cfg.n_embd
    dh, eps = d // H, cfg.layer_norm_epsilon
    final: list[np.ndarray] = []
    hook = model.transformer.ln_f.register_forward_pre_hook(lambda m, args: final.append(_np(args[0][0])))
    try:
        with torch.no_grad():
            out = model(torch.tensor([ids]), output_hidden_states=True)
    finally:
        hook.remove()
    hs = [_np(h[0]) for h in out.hidden_states]  # [0]: embeddings, [l]: entering layer l
    y = int(out.logits[0, -1].argmax())
    x = final[0][-1]  # the residual leaving the last layer at the explained position, before ln_f
    sigma = np.sqrt(x.var() + eps)
    gamma = _np(model.transformer.ln_f.weight)
    u = _np(model.lm_head.weight)[y]

    def direct(c: np.ndarray) -> np.ndarray:  # [..., d] -> [...]
        return ((c - c.mean(-1, keepdims=True)) / sigma * gamma) @ u

    want = np.zeros((cfg.n_layer, H, n))
    for l, blk in enumerate(model.transformer.h):
        xl = _ln(hs[l], _np(blk.ln_1.weight), _np(blk.ln_1.bias), eps)
        qkv = xl @ _np(blk.attn.c_attn.weight) + _np(blk.attn.c_attn.bias)  # Conv1D: x W + b
        q, k, v = (qkv[:, i * d : (i + 1) * d].reshape(n, H, dh) for i in range(3))
        w_o = _np(blk.attn.c_proj.weight).reshape(H, dh, d)
        for h in range(H):
            s = q[-1, h] @ k[:, h].T / np.sqrt(dh)  # the last query sees every key (causal)
            p = np.exp(s - s.max())
            p /= p.sum()
            per_key = p[:, None] * (v[:, h] @ w_o[h])  # [key, d]
            want[l, h] = direct(per_key)

    got = direct_logit_attribution(a, torch.tensor(ids), y)
    assert got.head_source.shape == want.shape
    np.testing.assert_allclose(got.head_source, want, rtol=0, atol=TOL)
    # not vacuous: the keys differ, so a reversed (or shifted) key axis is far outside the tolerance
    assert np.abs(want - want[..., ::-1]).max() > 1e4 * TOL
    assert np.abs(want - np.roll(want, 1, -1)).max() > 1e4 * TOL
