"""Feature sites (models/features.py): a dictionary spliced in leaves the model unchanged with its error kept,
on every decoder family, and its sites equal a hand-written float64 forward."""

from __future__ import annotations

import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.dictionaries import load_features, save_features
from streetlamp.models.families import FAMILIES
from streetlamp.models.features import Dictionary, FeatureSet, feature_site
from streetlamp.models.tiny import tiny_model

DECODERS = sorted(n for n, f in FAMILIES.items() if f.tiny is not None and f.tiny.kind.causal and f.stacks == 1)
TEXT = ["when mary and john went to the store , john gave a drink to"]


def random_dictionary(layer: int, where: str, d: int, width: int, act: str = "relu", seed: int = 0) -> Dictionary:
    g = torch.Generator().manual_seed(seed)
    kw: dict = {}
    if act == "topk":
        kw["k"] = 4
    if act == "jumprelu":
        kw["threshold"] = torch.rand(width, generator=g, dtype=torch.float64) * 0.1
    return Dictionary(
        layer,
        where,  # type: ignore[arg-type]
        W_enc=torch.randn(d, width, generator=g, dtype=torch.float64) / d**0.5,
        b_enc=torch.randn(width, generator=g, dtype=torch.float64) * 0.1,
        W_dec=torch.randn(width, d, generator=g, dtype=torch.float64) / width**0.5,
        b_dec=torch.randn(d, generator=g, dtype=torch.float64) * 0.1,
        activation=act,  # type: ignore[arg-type]
        b_dec_in=where == "resid_pre",
        **kw,
    )


def feature_set(adapter: ModelAdapter, act: str = "relu") -> FeatureSet:
    d = adapter.d_model
    dicts = {}
    for l in range(adapter.n_layers):
        dicts[(l, "resid_pre")] = random_dictionary(l, "resid_pre", d, 3 * d, act, seed=l)
        dicts[(l, "mlp")] = random_dictionary(l, "mlp", d, 3 * d, act, seed=10 + l)
    return FeatureSet(dicts, source="random")


def adapter64(family: str) -> ModelAdapter:
    model, tok = tiny_model(family, seed=1)
    return ModelAdapter(model.double(), tok, f"tiny-{family}")


@pytest.mark.parametrize("family", DECODERS)
def test_spliced_model_is_the_model(family: str) -> None:
    a = adapter64(family)
    inputs = a.encode(TEXT)
    plain = a.forward(inputs).logits
    a.attach_features(feature_set(a))
    sites = [s for s in a.site_names if ".features" in s]
    assert len(sites) == 4 * a.n_layers
    # recorded only: the activations flow on untouched, bit for bit
    rec = a.forward(inputs, record=sites)
    assert torch.equal(rec.logits, plain)
    # every site spliced (identity edits force decode(a) + error): equal to float64 rounding
    edits = {s: (lambda t: t * 1.0) for s in sites}
    spliced = a.forward(inputs, edit=edits).logits
    torch.testing.assert_close(spliced, plain, rtol=0, atol=1e-10)
    # kept for gradients: spliced too, and still the model
    torch.testing.assert_close(a.forward(inputs, record=sites, keep_grad=True).logits, plain, rtol=0, atol=1e-10)


def test_sites_equal_hand_written_forward() -> None:
    """layers.l.resid_pre.features = σ((x − b_dec) W_enc + b_enc) at the layer's input; the transcoder's latents
    read the MLP's input (the post-attention RMSNorm of the residual stream), its error is mlp.out − recon."""
    a = adapter64("llama")
    fs = feature_set(a, "jumprelu")
    a.attach_features(fs)
    inputs = a.encode(TEXT)
    l = 1
    want_sites = [feature_site(l, w, e) for w in ("resid_pre", "mlp") for e in (False, True)]
    fwd = a.forward(inputs, record=[f"layers.{l}.resid_pre", f"layers.{l}.mlp.out", *want_sites])
    x = fwd.cache[f"layers.{l}.resid_pre"]
    sae = fs.get(l, "resid_pre")
    z = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
    f = z * (z > sae.threshold)
    torch.testing.assert_close(fwd.cache[feature_site(l, "resid_pre")], f, rtol=0, atol=0)
    torch.testing.assert_close(
        fwd.cache[feature_site(l, "resid_pre", True)], x - (f @ sae.W_dec + sae.b_dec), rtol=0, atol=1e-12
    )
    # the MLP's input by hand: resid_mid = resid_pre + attn.out, then the layer's post-attention RMSNorm
    layer = a.layer_modules[l]
    mid = x + a.forward(inputs, record=[f"layers.{l}.attn.out"]).cache[f"layers.{l}.attn.out"]
    norm = layer.post_attention_layernorm
    m32 = mid.float()  # Llama's RMSNorm normalises in float32, then multiplies its gain in the input's dtype
    h = norm.weight * (m32 * torch.rsqrt(m32.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)).double()
    tc = fs.get(l, "mlp")
    zt = h @ tc.W_enc + tc.b_enc
    ft = zt * (zt > tc.threshold)
    torch.testing.assert_close(fwd.cache[feature_site(l, "mlp")], ft, rtol=0, atol=1e-12)
    torch.testing.assert_close(
        fwd.cache[feature_site(l, "mlp", True)],
        fwd.cache[f"layers.{l}.mlp.out"] - (ft @ tc.W_dec + tc.b_dec),
        rtol=0,
        atol=1e-12,
    )


def test_editing_features_moves_the_output_through_the_decoder() -> None:
    """Zeroing the features leaves b_dec + error: the residual stream shifts by −(a W_dec) exactly."""
    a = adapter64("llama")
    fs = feature_set(a, "topk")
    a.attach_features(fs)
    inputs = a.encode(TEXT)
    site = feature_site(0, "resid_pre")
    base = a.forward(inputs, record=[site, "layers.0.resid_pre"])
    edited = a.forward(inputs, edit={site: torch.zeros_like}, record=["layers.0.resid_pre"])
    shift = edited.cache["layers.0.resid_pre"] - base.cache["layers.0.resid_pre"]
    want = -(base.cache[site] @ fs.get(0, "resid_pre").W_dec)
    torch.testing.assert_close(shift, want, rtol=0, atol=1e-12)
    assert (base.cache[site] != 0).sum(-1).max() <= 4  # TopK k=4


@pytest.mark.parametrize("act", ["topk", "jumprelu", "relu"])
def test_sparse_decode_is_the_dense_product(act: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The decode from the active latents only (``embedding_bag``) equals ``a W_dec + b_dec`` in float64 (rows
    with no active latent, negative values as an edit leaves them, a skip term); it is taken where the rows are
    sparse (TopK k=4 of 256) and not where they are not (ReLU and this JumpReLU: many active); a gradient through ``a`` takes
    the dense product (every latent's gradient, active or not)."""
    d = random_dictionary(0, "mlp", 32, 256, act, seed=3)
    d.W_skip = torch.randn(32, 32, dtype=torch.float64) * 0.1
    x = torch.randn(3, 7, 32, dtype=torch.float64)
    a = d.encode(x)
    a[0, 0] = 0  # a row with nothing active
    a[1, 2, :3] = -a[1, 2, :3] - 1.5  # edited values, negative ones among them
    dense = a @ d.W_dec + d.b_dec + x @ d.W_skip
    taken = []
    original = Dictionary._sparse_decode
    monkeypatch.setattr(Dictionary, "_sparse_decode", lambda self, *z: taken.append(r := original(self, *z)) or r)
    got = d.decode(a, x)
    torch.testing.assert_close(got, dense, rtol=0, atol=1e-12 * float(dense.abs().max()))
    sparse = bool((a != 0).sum(-1).max() <= 256 // 16)
    assert (taken[0] is not None) == sparse and sparse == (act == "topk")  # these JumpReLU rows are dense
    a.requires_grad_(True)
    (g,) = torch.autograd.grad(d.decode(a, x)[..., 0].sum(), a)
    torch.testing.assert_close(g, d.W_dec[:, 0].expand_as(g), rtol=0, atol=0)  # inactive latents included


def test_feature_edit_without_error_record_equals_two_decodes() -> None:
    """An edit at a feature site with the error kept as computed (not recorded): the spliced output is
    ``decode(a') + (value − decode(a))``, here computed as ``value + (a' − a) W_dec`` (one sparse product);
    equal in float64 to the hand-written form, and an in-place edit does not fool it."""
    a = adapter64("llama")
    fs = FeatureSet({(0, "mlp"): random_dictionary(0, "mlp", a.d_model, 256, "topk", seed=5)}, source="r")
    a.attach_features(fs)
    inputs = a.encode(TEXT)
    site, tc = feature_site(0, "mlp"), fs.get(0, "mlp")
    base = a.forward(inputs, record=[site, "layers.0.mlp.out"])
    feats, out = base.cache[site], base.cache["layers.0.mlp.out"]

    def inplace(t: torch.Tensor) -> torch.Tensor:
        t[..., 7] += 2.0  # steering one latent, in place
        return t

    got = a.forward(inputs, edit={site: inplace}, record=["layers.0.mlp.out"]).cache["layers.0.mlp.out"]
    steered = feats.clone()
    steered[..., 7] += 2.0
    want = (steered @ tc.W_dec + tc.b_dec) + (out - (feats @ tc.W_dec + tc.b_dec))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert float((got - out).abs().max()) > 0.1  # the edit moved it


def test_gradient_at_features_is_the_decoder_path() -> None:
    """d logit / d features = W_dec · d logit / d resid (the error's path does not cancel it)."""
    a = adapter64("llama")
    fs = feature_set(a)
    a.attach_features(fs)
    inputs = a.encode(TEXT)
    site = feature_site(1, "resid_pre")
    fwd = a.forward(inputs, record=[site, "layers.1.resid_pre"], keep_grad=True)
    y = fwd.logits[0, 5]
    g_f, g_x = torch.autograd.grad(y, [fwd.cache[site], fwd.cache["layers.1.resid_pre"]])
    torch.testing.assert_close(g_f, g_x @ fs.get(1, "resid_pre").W_dec.T, rtol=1e-10, atol=1e-12)


def test_save_load_round_trip(tmp_path) -> None:
    a = adapter64("qwen2")
    fs = feature_set(a, "jumprelu")
    fs.model = a.name
    save_features(fs, tmp_path / "dict")
    back = load_features(tmp_path / "dict")
    assert back.model == a.name and len(back.dictionaries) == len(fs.dictionaries)
    for d in fs:
        e = back.get(d.layer, d.where)
        assert e is not None and e.activation == d.activation and e.b_dec_in == d.b_dec_in
        for n in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold"):
            assert torch.equal(getattr(e, n), getattr(d, n))


def test_bad_feature_sets(tmp_path) -> None:
    a = adapter64("llama")
    other = random_dictionary(0, "resid_pre", a.d_model + 8, 16)
    with pytest.raises(StreetlampError, match="another model"):
        a.attach_features(FeatureSet({(0, "resid_pre"): other}))
    with pytest.raises(StreetlampError, match="layers 0..1"):
        a.attach_features(FeatureSet({(5, "mlp"): random_dictionary(5, "mlp", a.d_model, 16)}))
    bert = adapter64("bert") if "bert" in FAMILIES else None
    if bert is not None:
        with pytest.raises(StreetlampError, match="transcoder"):
            bert.attach_features(FeatureSet({(0, "mlp"): random_dictionary(0, "mlp", bert.d_model, 16)}))
    save_features(feature_set(a), tmp_path / "d")
    (tmp_path / "d" / "layer_000_mlp.safetensors").write_bytes(b"\x80\x04junk")  # a pickle's first bytes
    with pytest.raises(StreetlampError, match="pickle"):
        load_features(tmp_path / "d")
    blob = (tmp_path / "d" / "layer_000_resid_pre.safetensors").read_bytes()
    (tmp_path / "d" / "layer_000_mlp.safetensors").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(StreetlampError, match="not a readable safetensors"):
        load_features(tmp_path / "d")
    with pytest.raises(StreetlampError, match="no feature set"):
        load_features(tmp_path)


@pytest.mark.parametrize("act", ["topk", "jumprelu", "relu"])
def test_encode_in_place_is_the_formula(act: str) -> None:
    """encode works in place on its own pre-activations (no extra buffers): it equals σ(x W_enc + b_enc) written
    out in float64 (TopK: the k largest by a full sort), bit for bit; activate() leaves a caller's tensor alone;
    under autograd the gradient at x is the formula's (W_enc's columns of the active latents, hand-summed)."""
    d = random_dictionary(0, "mlp", 32, 256, act, seed=7)
    x = torch.randn(3, 5, 32, dtype=torch.float64)
    z = x @ d.W_enc + d.b_enc
    if act == "relu":
        want = torch.where(z > 0, z, torch.zeros_like(z))
    elif act == "jumprelu":
        want = torch.where(z > d.threshold, z, torch.zeros_like(z))
    else:
        kth = z.sort(-1, descending=True).values[..., d.k - 1 : d.k]
        want = torch.where((z >= kth) & (z > 0), z, torch.zeros_like(z))
    assert torch.equal(d.encode(x), want)
    assert int((want != 0).sum()) > 0 and int((want == 0).sum()) > 0  # some active, some not
    z_copy = z.clone()
    assert torch.equal(d.activate(z), want) and torch.equal(z, z_copy)
    xg = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(d.encode(xg).sum(), xg)
    hand = (want != 0).double() @ d.W_enc.T  # d/dx of the active latents' z, each with slope 1
    torch.testing.assert_close(g, hand, rtol=0, atol=1e-12)
