"""DeBERTa-v2/v3: the recorded attention is the softmax of the disentangled scores, recomputed here
from the weights with the paper's formulas (He et al., ICLR 2021; v3's log-bucketed positions), and
an edited pattern is what multiplies the values. The shared per-family tests cover the rest
("deberta-v2" is in FAMILY_KINDS)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.loading import load
from streetlamp.models.tiny import save_tiny, tiny_model
from tests.conftest import TEXTS, f32_tol

F64 = 1e-10  # two float64 routes through the same few products
# Hugging Face computes the scale sqrt(3 * d_head) in float32 even in a float64 model: the scores carry a
# relative float32 rounding (2^-24 ~ 6e-8), so probabilities agree to a few of them times |score| (~1-5 here)
SCALE32 = 4e-7


@pytest.fixture(scope="module")
def deberta() -> ModelAdapter:
    model, tok = tiny_model("deberta-v2", seed=1)
    return ModelAdapter(model.double(), tok, "tiny-deberta")


def log_bucket(rel: np.ndarray, buckets: int, max_position: int) -> np.ndarray:
    """DeBERTa-v3's relative-position buckets: distances within ``buckets // 2`` kept, longer ones
    mapped logarithmically, ``sign(r) * (mid + ceil(log(|r| / mid) / log((max - 1) / mid) * (mid - 1)))``."""
    mid = buckets // 2
    a = np.abs(rel).astype(np.float64)
    safe = np.where(a < mid, mid - 1, a)
    log_pos = np.ceil(np.log(safe / mid) / math.log((max_position - 1) / mid) * (mid - 1)) + mid
    return np.where(a <= mid, rel, np.sign(rel) * log_pos).astype(np.int64)


def disentangled_attention(adapter: ModelAdapter, h: torch.Tensor, layer: int) -> torch.Tensor:
    """``[head, q, k]`` for hidden states ``h`` ``[s, d]`` entering ``layer`` (no padding)."""
    cfg = adapter.hf_model.config
    enc = adapter.hf_model.deberta.encoder
    att = enc.layer[layer].attention.self
    H, s = adapter.n_heads, h.shape[0]
    dh = adapter.d_model // H
    span = cfg.position_buckets

    def heads(x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], H, dh).transpose(0, 1)  # [H, n, dh]

    q, k = heads(att.query_proj(h)), heads(att.key_proj(h))
    rel_emb = enc.LayerNorm(enc.rel_embeddings.weight)[: 2 * span]  # norm_rel_ebd = layer_norm
    qr, kr = heads(att.query_proj(rel_emb)), heads(att.key_proj(rel_emb))  # share_att_key
    pos = np.arange(s)
    delta = log_bucket(pos[:, None] - pos[None, :], span, cfg.max_relative_positions)  # δ(i, j)
    idx = torch.from_numpy(np.clip(delta + span, 0, 2 * span - 1))
    c2c = q @ k.transpose(1, 2)
    c2p = torch.stack([(q[h_] @ kr[h_].T).gather(1, idx) for h_ in range(H)])  # Q_c[i] · K_r[δ(i,j)]
    # p2c: K_c[j] · Q_r[-δ(j, i)] in the authors' code (the paper writes δ(j, i)); the bucket is odd in r,
    # so -δ(j, i) = δ(i, j): the same index as c2p
    cols = torch.arange(s)[None, :].expand(s, s)
    p2c = torch.stack([(k[h_] @ qr[h_].T)[cols, idx] for h_ in range(H)])
    scores = (c2c + c2p + p2c) / math.sqrt(3 * dh)
    return torch.softmax(scores, -1)


def test_attention_is_the_softmax_of_c2c_c2p_p2c(deberta: ModelAdapter) -> None:
    for text in TEXTS:
        inp = deberta.encode(text)
        n = inp.lengths[0]
        assert n > deberta.hf_model.config.position_buckets // 2  # log buckets are used
        f = deberta.forward(inp, record=["layers.*.attn.pattern", "layers.*.resid_pre"])
        for l in range(deberta.n_layers):
            with torch.no_grad():
                want = disentangled_attention(deberta, f.cache[f"layers.{l}.resid_pre"][0], l)
            torch.testing.assert_close(f.cache[f"layers.{l}.attn.pattern"][0], want, atol=SCALE32, rtol=SCALE32)
            assert float(want.std()) > 0.01  # not uniform: the comparison can fail
            # without the position terms the pattern would differ (the check sees them)
    with torch.no_grad():
        h = f.cache["layers.0.resid_pre"][0]
        att = deberta.hf_model.deberta.encoder.layer[0].attention.self
        q = att.query_proj(h).view(n, 4, -1).transpose(0, 1)
        k = att.key_proj(h).view(n, 4, -1).transpose(0, 1)
        c2c_only = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(3 * q.shape[-1]), -1)
    assert (f.cache["layers.0.attn.pattern"][0] - c2c_only).abs().max() > 1e-3


def test_padding_mask_and_uniform_edit(deberta: ModelAdapter) -> None:
    """Padded keys get exactly 0; replacing the pattern by uniform attention equals averaging the
    values by hand (the edited pattern is what multiplies V)."""
    inp = deberta.encode(TEXTS)
    f = deberta.forward(inp, record=["layers.*.attn.pattern"])
    for b, n in enumerate(inp.lengths):
        assert bool((f.cache["layers.1.attn.pattern"][b, :, :n, n:] == 0).all())
        assert bool(f.cache["allowed"][b, :n, :n].all()) and not bool(f.cache["allowed"][b, :n, n:].any())
    one = deberta.encode(TEXTS[1])
    n = one.lengths[0]
    uniform = {"layers.1.attn.pattern": lambda p: torch.full_like(p, 1.0 / p.shape[-1])}
    got = deberta.forward(one, record=["layers.1.attn.z", "layers.1.attn.v"], edit=uniform).cache
    want = got["layers.1.attn.v"].mean(1, keepdim=True).expand(-1, n, -1, -1)
    torch.testing.assert_close(got["layers.1.attn.z"], want, atol=F64, rtol=F64)


def test_saved_reloaded_and_the_v1_refusal(tmp_path) -> None:  # noqa: ANN001
    path = save_tiny("deberta-v2", tmp_path / "deb", seed=2)
    a = load(path)
    assert a.family.name == "deberta-v2" and a.explained_position(5) == 0  # the ContextPooler reads [CLS]
    ref, _ = tiny_model("deberta-v2", seed=2)
    inp = a.encode(TEXTS[0])
    with torch.no_grad():
        want = ref(input_ids=inp.input_ids, attention_mask=inp.attention_mask).logits
    torch.testing.assert_close(a.forward(inp).logits, want, atol=f32_tol(2), rtol=f32_tol(2))
    cfg = (path / "config.json").read_text().replace('"deberta-v2"', '"deberta"')
    (path / "config.json").write_text(cfg)
    with pytest.raises(StreetlampError, match="DeBERTa v1.*deberta-v2"):
        load(path)
