"""Readers of the open formats (models/dictionaries.py): SAELens's ``cfg.json`` + ``sae_weights.safetensors`` and
circuit-tracer's transcoder sets, written here by hand as each project lays them out, read back as the hand-written
float64 encoder/decoder of each format's definition says; the TransformerLens hook table; every refusal in one line.
(The peers' own code on the same files: tests/models/test_feature_formats.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from streetlamp.errors import StreetlampError
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.dictionaries import TL_HOOKS, load_features, tl_hook
from streetlamp.models.features import feature_site
from streetlamp.models.tiny import tiny_model

D, W = 16, 40
G = torch.Generator().manual_seed(3)


def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=G, dtype=torch.float64) * scale


def saelens(folder: Path, arch: str, hook: str, hook_out: str | None = None, **cfg_extra) -> dict[str, torch.Tensor]:
    """A SAELens folder as ``SAE.save_model`` writes it (6.x: metadata holds the hook names)."""
    folder.mkdir(parents=True, exist_ok=True)
    w = {"W_enc": rnd(D, W, scale=D**-0.5), "b_enc": rnd(W, scale=0.1), "W_dec": rnd(W, D), "b_dec": rnd(D, scale=0.1)}
    if "jumprelu" in arch:
        w["threshold"] = rnd(W, scale=0.1)  # some negative: SAELens's relu(z)·[z > θ] then differs from z·[z > θ]
    if "skip" in arch:
        w["W_skip"] = rnd(D, D, scale=0.1)  # [d_out, d_in]
    save_file(w, str(folder / "sae_weights.safetensors"))
    meta = {"hook_name": hook, "model_name": "tiny", "sae_lens_version": "6.54.12"}
    if hook_out is not None:
        meta["hook_name_out"] = hook_out
    cfg = {
        "architecture": arch,
        "d_in": D,
        "d_sae": W,
        "dtype": "float64",
        "apply_b_dec_to_input": "transcoder" not in arch,
        "normalize_activations": "none",
        "reshape_activations": "none",
        "metadata": meta,
        **({"d_out": D} if "transcoder" in arch else {}),
        **cfg_extra,
    }
    (folder / "cfg.json").write_text(json.dumps(cfg))
    return w


def x_in() -> torch.Tensor:
    return rnd(2, 5, D)


def test_hook_table() -> None:
    assert tl_hook("blocks.3.hook_resid_pre", "t")[0] == 3
    assert tl_hook("blocks.3.hook_resid_post", "t")[2].offset == 1
    assert {h.role for h in TL_HOOKS.values()} == {"resid", "mlp_in", "mlp_out"}
    for bad in ("blocks.2.hook_resid_mid", "blocks.2.attn.hook_z", "hook_embed"):
        with pytest.raises(StreetlampError, match="refused|not a TransformerLens"):
            tl_hook(bad, "t")


@pytest.mark.parametrize("arch", ["standard", "jumprelu", "topk"])
def test_saelens_sae(tmp_path: Path, arch: str) -> None:
    extra = {"k": 7} if arch == "topk" else {}
    w = saelens(tmp_path / "sae", arch, "blocks.2.hook_resid_pre", **extra)
    fs = load_features(tmp_path / "sae")
    assert fs.format == "saelens" and list(fs.dictionaries) == [(2, "resid_pre")]
    d = fs.get(2, "resid_pre")
    x = x_in()
    z = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]  # apply_b_dec_to_input
    if arch == "standard":
        want = torch.relu(z)
    elif arch == "jumprelu":
        want = torch.relu(z) * (z > w["threshold"])  # SAELens: the ReLU, then the mask
    else:
        top = z.topk(7, dim=-1)
        want = torch.zeros_like(z).scatter(-1, top.indices, top.values.relu())
    torch.testing.assert_close(d.encode(x), want, rtol=0, atol=1e-12)
    torch.testing.assert_close(d.decode(want), want @ w["W_dec"] + w["b_dec"], rtol=0, atol=1e-12)


def test_saelens_topk_rescaled_by_decoder_norm(tmp_path: Path) -> None:
    w = saelens(tmp_path / "sae", "topk", "blocks.0.hook_resid_pre", k=5, rescale_acts_by_decoder_norm=True)
    d = load_features(tmp_path / "sae").get(0, "resid_pre")
    x = x_in()
    n = w["W_dec"].norm(dim=-1)
    z = ((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]) * n
    top = z.topk(5, dim=-1)
    a = torch.zeros_like(z).scatter(-1, top.indices, top.values.relu())
    torch.testing.assert_close(d.encode(x), a, rtol=0, atol=1e-12)
    torch.testing.assert_close(d.decode(a), (a / n) @ w["W_dec"] + w["b_dec"], rtol=0, atol=1e-12)


@pytest.mark.parametrize("arch", ["transcoder", "jumprelu_skip_transcoder"])
def test_saelens_transcoder(tmp_path: Path, arch: str) -> None:
    w = saelens(tmp_path / "tc", arch, "blocks.1.hook_mlp_in", "blocks.1.hook_mlp_out")
    d = load_features(tmp_path / "tc").get(1, "mlp")
    x = x_in()
    z = x @ w["W_enc"] + w["b_enc"]
    a = torch.relu(z) * (z > w["threshold"]) if "jumprelu" in arch else torch.relu(z)
    torch.testing.assert_close(d.encode(x), a, rtol=0, atol=1e-12)
    want = a @ w["W_dec"] + w["b_dec"] + (x @ w["W_skip"].T if "skip" in arch else 0)
    torch.testing.assert_close(d.decode(a, x), want, rtol=0, atol=1e-12)


def test_saelens_folder_of_saes(tmp_path: Path) -> None:
    saelens(tmp_path / "set" / "l0", "standard", "blocks.0.hook_resid_pre")
    saelens(tmp_path / "set" / "l1", "standard", "blocks.0.hook_resid_post")  # = layer 1's resid_pre
    fs = load_features(tmp_path / "set")
    assert sorted(fs.dictionaries) == [(0, "resid_pre"), (1, "resid_pre")] and fs.model == "tiny"


def circuit_tracer(folder: Path, hook_in: str, hook_out: str, n: int = 2, jump: bool = True) -> list[dict]:
    """A transcoder set as circuit-tracer 0.5's ``TranscoderSet.to_safetensors`` and its cache write it."""
    folder.mkdir(parents=True, exist_ok=True)
    ws = []
    for l in range(n):
        w = {
            "W_enc": rnd(W, D, scale=D**-0.5),  # [width, d_model]: F.linear
            "W_dec": rnd(W, D),
            "b_enc": rnd(W, scale=0.1),
            "b_dec": rnd(D, scale=0.1),
            "W_skip": rnd(D, D, scale=0.1),  # applied as x @ W_skip.T
        }
        if jump:
            w["activation_function.threshold"] = rnd(W, scale=0.1)
        save_file(w, str(folder / f"layer_{l}.safetensors"))
        ws.append(w)
    (folder / "config.yaml").write_text(
        f"model_kind: transcoder_set\nfeature_input_hook: {hook_in}\nfeature_output_hook: {hook_out}\nscan: tiny\n"
    )
    return ws


def test_circuit_tracer_set(tmp_path: Path) -> None:
    ws = circuit_tracer(tmp_path / "ct", "mlp.hook_in", "mlp.hook_out")
    fs = load_features(tmp_path / "ct")
    assert fs.format == "circuit-tracer" and sorted(fs.dictionaries) == [(0, "mlp"), (1, "mlp")]
    x = x_in()
    for l, w in enumerate(ws):
        d = fs.get(l, "mlp")
        z = x @ w["W_enc"].T + w["b_enc"]
        a = z * (z > w["activation_function.threshold"])  # circuit-tracer's JumpReLU: no ReLU before the mask
        torch.testing.assert_close(d.encode(x), a, rtol=0, atol=1e-12)
        torch.testing.assert_close(d.decode(a, x), a @ w["W_dec"] + w["b_dec"] + x @ w["W_skip"].T, rtol=0, atol=1e-12)


def tiny(family: str) -> ModelAdapter:
    model, tok = tiny_model(family, seed=1)
    return ModelAdapter(model.double(), tok, f"tiny-{family}")


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_ln2_hook_normalized_folds_the_norm(tmp_path: Path, family: str) -> None:
    """A transcoder reading ``ln2.hook_normalized`` (the pre-MLP norm before its gain and bias, as TransformerLens
    and circuit-tracer read it) gives, spliced into the model, the latents of the hand-normalised MLP input."""
    a = tiny(family)
    with torch.no_grad():  # a gain and bias other than 1 and 0, so the fold is not the identity
        for layer in a.layer_modules:
            norm = layer.ln_2 if family == "gpt2" else layer.post_attention_layernorm
            norm.weight.copy_(1 + rnd(a.d_model, scale=0.5))
            if getattr(norm, "bias", None) is not None:
                norm.bias.copy_(rnd(a.d_model, scale=0.5))
    global D
    old, D = D, a.d_model
    try:
        ws = circuit_tracer(tmp_path / "ct", "ln2.hook_normalized", "hook_mlp_out", n=a.n_layers, jump=False)
    finally:
        D = old
    with pytest.raises(StreetlampError, match="with the model"):
        load_features(tmp_path / "ct")
    fs = load_features(tmp_path / "ct", a)
    a.attach_features(fs)
    inputs = a.encode(["when mary and john went to the store , john gave"])
    l = 1
    fwd = a.forward(inputs, record=[f"layers.{l}.resid_pre", f"layers.{l}.attn.out", feature_site(l, "mlp")])
    mid = fwd.cache[f"layers.{l}.resid_pre"] + fwd.cache[f"layers.{l}.attn.out"]
    if family == "gpt2":
        eps = a.layer_modules[l].ln_2.eps
        n = (mid - mid.mean(-1, keepdim=True)) / (mid.var(-1, unbiased=False, keepdim=True) + eps).sqrt()
    else:
        eps = a.layer_modules[l].post_attention_layernorm.variance_epsilon
        m32 = mid.float()  # Llama's RMSNorm normalises in float32, then multiplies its gain in the input's dtype
        n = (m32 * torch.rsqrt(m32.pow(2).mean(-1, keepdim=True) + eps)).double()
    want = torch.relu(n @ ws[l]["W_enc"].T + ws[l]["b_enc"])
    # the fold divides by the gain: float64 rounding of the MLP input's scale, relative to the largest latent
    torch.testing.assert_close(fwd.cache[feature_site(l, "mlp")], want, rtol=0, atol=1e-9 * float(want.abs().max()))


def test_refusals(tmp_path: Path) -> None:
    saelens(tmp_path / "gated", "gated", "blocks.0.hook_resid_pre")
    with pytest.raises(StreetlampError, match="'gated' refused"):
        load_features(tmp_path / "gated")
    saelens(tmp_path / "mid", "standard", "blocks.0.hook_resid_mid")
    with pytest.raises(StreetlampError, match="blocks.0.hook_resid_mid' refused"):
        load_features(tmp_path / "mid")
    saelens(tmp_path / "norm", "standard", "blocks.0.hook_resid_pre", normalize_activations="constant_norm_rescale")
    with pytest.raises(StreetlampError, match="normalize_activations"):
        load_features(tmp_path / "norm")
    saelens(tmp_path / "mlpsae", "standard", "blocks.0.hook_mlp_out")
    with pytest.raises(StreetlampError, match="residual stream only"):
        load_features(tmp_path / "mlpsae")
    saelens(tmp_path / "cross", "transcoder", "blocks.0.hook_mlp_in", "blocks.1.hook_mlp_out")
    with pytest.raises(StreetlampError, match="one layer's MLP"):
        load_features(tmp_path / "cross")
    saelens(tmp_path / "wide", "standard", "blocks.0.hook_resid_pre", d_sae=W + 1)
    with pytest.raises(StreetlampError, match="d_sae=41"):
        load_features(tmp_path / "wide")
    # truncated weights, a pickle, a .pt file, a corrupt cfg.json: one line each
    saelens(tmp_path / "cut", "standard", "blocks.0.hook_resid_pre")
    blob = (tmp_path / "cut" / "sae_weights.safetensors").read_bytes()
    (tmp_path / "cut" / "sae_weights.safetensors").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(StreetlampError, match="not a readable safetensors"):
        load_features(tmp_path / "cut")
    (tmp_path / "cut" / "sae_weights.safetensors").write_bytes(b"PK\x03\x04torch zip")
    with pytest.raises(StreetlampError, match="pickle"):
        load_features(tmp_path / "cut")
    (tmp_path / "w.pt").write_bytes(b"\x80\x02")
    with pytest.raises(StreetlampError, match=r"pickle \(\.pt\) refused"):
        load_features(tmp_path / "w.pt")
    (tmp_path / "cut" / "cfg.json").write_text('{"architecture": "stan')
    with pytest.raises(StreetlampError, match="cfg.json is not JSON"):
        load_features(tmp_path / "cut")
    # circuit-tracer: a cross-layer transcoder, a resid_mid input, remote and .npz files
    circuit_tracer(tmp_path / "clt", "hook_resid_mid", "hook_mlp_out")
    with pytest.raises(StreetlampError, match="hook_resid_mid' refused"):
        load_features(tmp_path / "clt")
    (tmp_path / "clt" / "config.yaml").write_text(
        "model_kind: cross_layer_transcoder\nfeature_input_hook: hook_resid_mid\nfeature_output_hook: hook_mlp_out\n"
    )
    with pytest.raises(StreetlampError, match="cross_layer_transcoder' refused"):
        load_features(tmp_path / "clt")
    for f, msg in (("hf://google/x/params.npz", "remote"), ("layer_0.npz", "safetensors only")):
        (tmp_path / "clt" / "config.yaml").write_text(
            f"model_kind: transcoder_set\nfeature_input_hook: mlp.hook_in\nfeature_output_hook: mlp.hook_out\n"
            f"transcoders: ['{f}']\n"
        )
        with pytest.raises(StreetlampError, match=msg):
            load_features(tmp_path / "clt")


def test_sandwich_family_refuses_hook_mlp_out(tmp_path: Path) -> None:
    """Gemma normalises the MLP's output before the residual add: TransformerLens's hook_mlp_out is after that norm,
    streetlamp's mlp.out before it; a transcoder writing hook_mlp_out is refused there, mlp.hook_out accepted."""
    a = tiny("gemma2")
    global D
    old, D = D, a.d_model
    try:
        circuit_tracer(tmp_path / "g", "mlp.hook_in", "hook_mlp_out", n=a.n_layers)
        with pytest.raises(StreetlampError, match="post-MLP norm"):
            load_features(tmp_path / "g", a)
        circuit_tracer(tmp_path / "g", "mlp.hook_in", "mlp.hook_out", n=a.n_layers)
        a.attach_features(load_features(tmp_path / "g", a))
    finally:
        D = old
