"""The named sites are the same for every family; pinned here."""

from __future__ import annotations

import torch

from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.sites import site_axes

from .conftest import TEXTS

PINNED = ["embed"] + [
    f"layers.{l}.{s}"
    for l in range(2)
    for s in ("resid_pre", "attn.v", "attn.pattern", "attn.z", "attn.head_out", "attn.out", "mlp.out", "resid_post")
]


def test_site_names_pinned(tiny: ModelAdapter) -> None:
    assert tiny.site_names == PINNED


def test_site_shapes(tiny: ModelAdapter) -> None:
    inputs = tiny.encode(TEXTS)
    f = tiny.forward(inputs, record=["*"])
    b, s = inputs.input_ids.shape
    h, d = tiny.n_heads, tiny.d_model
    d_head = getattr(tiny.hf_model.config, "head_dim", None) or d // h  # Gemma: not d_model / heads
    for l in range(2):
        assert f.cache[f"layers.{l}.attn.pattern"].shape == (b, h, s, s)
        assert f.cache[f"layers.{l}.attn.z"].shape == (b, s, h, d_head)
        assert f.cache[f"layers.{l}.attn.v"].shape == (b, s, h, d_head)
        # z is the attention-weighted sum of values, per head
        z = torch.einsum("bhqk,bkhd->bqhd", f.cache[f"layers.{l}.attn.pattern"], f.cache[f"layers.{l}.attn.v"])
        torch.testing.assert_close(z, f.cache[f"layers.{l}.attn.z"], atol=1e-5, rtol=1e-5)
        assert f.cache[f"layers.{l}.attn.head_out"].shape == (b, s, h, d)
        for k in ("attn.out", "mlp.out", "resid_post", "resid_pre"):
            assert f.cache[f"layers.{l}.{k}"].shape == (b, s, d)
    assert f.cache["embed"].shape == (b, s, d)
    sizes = {"batch": b, "pos": s, "query": s, "key": s, "head": h, "d_head": d_head, "d_model": d}
    for name in tiny.site_names:  # the documented axes of every site are its real axes
        assert f.cache[name].shape == tuple(sizes[a] for a in site_axes(name)), name
    # resid_post of layer 0 is what enters layer 1
    torch.testing.assert_close(f.cache["layers.0.resid_post"], f.cache["layers.1.resid_pre"])
