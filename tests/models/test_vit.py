"""ViT: images as patch tokens, recorded against Hugging Face's eager ViT on the same pixels; rollout
as vit-explain uses it on images against an independent numpy port; the [MEAN]-patch baseline of
occlusion and integrated gradients against the eager model on edited pixels; bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.methods.context_mixing import Alti, alti_layer
from streetlamp.methods.ig import IntegratedGradients
from streetlamp.methods.lrp import attnlrp_relevance
from streetlamp.methods.occlusion import Occlusion
from streetlamp.methods.rollout import Flow, Rollout
from streetlamp.models.adapter import ModelAdapter, Target
from streetlamp.models.loading import load
from streetlamp.models.relevance import softmax_absorbed
from streetlamp.models.sites import output_matrix
from streetlamp.models.tiny import TINY_IMAGE_SIZE, TINY_PATCH, save_tiny, tiny_model
from tests.conftest import f32_tol
from tests.helpers.vit_helpers import random_image, tiny_vit

GRID = TINY_IMAGE_SIZE // TINY_PATCH  # 4 x 4 patches
# float64 against Hugging Face's eager ViT, whose softmax runs in float32 even in a float64 model: a few
# float32 roundings of a probability (2^-24 relative each), amplified 5x on the logits (as test_recording.py)
SOFTMAX32 = 4e-7


@pytest.fixture(scope="module")
def vit64() -> ModelAdapter:
    return tiny_vit(seed=1, double=True)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("img")
    out = []
    for k in range(2):
        p = root / f"im{k}.png"
        random_image(10 + k).save(p)
        out.append(p)
    return out


def eager(adapter: ModelAdapter) -> torch.nn.Module:
    """An independent ViT with the same weights, Hugging Face's own eager attention."""
    model, _ = tiny_model("vit", seed=1)
    model.load_state_dict(adapter.hf_model.state_dict())
    model.set_attn_implementation("eager")
    return model.to(next(adapter.hf_model.parameters()).dtype).eval()


def processed(adapter: ModelAdapter, path: Path) -> torch.Tensor:
    """Pixel values straight from the image processor (not through the patch vocabulary)."""
    from PIL import Image

    proc = adapter.tokenizer.processor  # type: ignore[attr-defined]
    with Image.open(path) as im:
        return proc(images=[im.convert("RGB")], return_tensors="pt")["pixel_values"]


# -- recording ------------------------------------------------------------------------------------
def test_saved_and_reloaded(tmp_path: Path, images: list[Path]) -> None:
    path = save_tiny("vit", tmp_path / "vit", seed=4)
    a = load(path)
    assert a.modality == "image" and a.kind == "classifier" and a.family.name == "vit"
    assert (a.n_layers, a.n_heads, a.max_positions) == (2, 4, 1 + GRID * GRID)
    ref, _ = tiny_model("vit", seed=4)
    with torch.no_grad():
        want = ref(pixel_values=processed(a, images[0])).logits
    torch.testing.assert_close(a.forward(a.encode(images[0])).logits, want, atol=f32_tol(2), rtol=f32_tol(2))


def test_tokens_are_cls_and_patches_row_by_row(vit64: ModelAdapter, images: list[Path]) -> None:
    inp = vit64.encode(images[0])
    assert inp.tokens[0][0] == "[CLS]" and len(inp.tokens[0]) == 1 + GRID * GRID
    assert inp.tokens[0][1:] == [f"patch({r},{c})" for r in range(GRID) for c in range(GRID)]
    assert vit64.explained_position(inp.lengths[0]) == 0  # [CLS] feeds the classifier
    assert vit64.special_mask(inp.input_ids[0]).tolist() == [True] + [False] * GRID * GRID
    # the id row stands for exactly the processed pixels
    pix = vit64.tokenizer.pixels(inp.input_ids)  # type: ignore[attr-defined]
    assert torch.equal(pix, processed(vit64, images[0]))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_attention_and_logits_equal_hf_eager(images: list[Path], dtype: torch.dtype) -> None:
    """Both images in one batch. float64: Hugging Face's eager softmax runs in float32 and ours in
    float64, so probabilities differ by a few float32 roundings (2^-24 relative); float32: the same
    operations in another order, f32_tol per layer."""
    a = tiny_vit(seed=1, double=dtype == torch.float64)
    twin = eager(a)
    inp = a.encode(images)
    fwd = a.forward(inp, record=["layers.*.attn.pattern"])
    pix = torch.cat([processed(a, p) for p in images]).to(dtype)
    with torch.no_grad():
        ref = twin(pixel_values=pix, output_attentions=True)
    tol = SOFTMAX32 if dtype == torch.float64 else f32_tol(a.n_layers)
    torch.testing.assert_close(fwd.logits, ref.logits, atol=5 * tol, rtol=5 * tol)
    for l in range(a.n_layers):
        ours = fwd.cache[f"layers.{l}.attn.pattern"]
        assert ours.shape == (2, a.n_heads, 17, 17)
        torch.testing.assert_close(ours, ref.attentions[l], atol=tol, rtol=tol)
        assert float(ours.std()) > 0.01  # far from uniform: the comparison can fail
    assert bool(fwd.cache["allowed"].all())  # no mask: every patch sees every patch


def test_embed_site_is_cls_and_patch_embeddings_before_positions(vit64: ModelAdapter, images: list[Path]) -> None:
    """The patch embedding written out: each 8 x 8 patch (row-major) times the projection, plus its bias."""
    inp = vit64.encode(images[0])
    rec = vit64.forward(inp, record=["embed"]).cache["embed"][0]
    proj = vit64.hf_model.vit.embeddings.patch_embeddings.projection
    x = processed(vit64, images[0])[0].double()  # [C, H, W]
    p = TINY_PATCH
    want = [vit64.hf_model.vit.embeddings.cls_token[0, 0]]
    for r in range(GRID):
        for c in range(GRID):
            patch = x[:, r * p : (r + 1) * p, c * p : (c + 1) * p]
            want.append((proj.weight * patch).sum((1, 2, 3)) + proj.bias)
    torch.testing.assert_close(rec, torch.stack(want).detach(), atol=1e-12, rtol=1e-12)


def test_zeroing_a_head_equals_zeroed_output_projection(vit64: ModelAdapter, images: list[Path]) -> None:
    layer, head = 1, 2
    inp = vit64.encode(images[0])

    def zero(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[:, :, head] = 0
        return x

    ours = vit64.forward(inp, edit={f"layers.{layer}.attn.head_out": zero}).logits
    twin = eager(vit64)
    with torch.no_grad():
        output_matrix(twin.vit.layers[layer].attention.o_proj, vit64.n_heads)[head] = 0
        want = twin(pixel_values=processed(vit64, images[0]).double()).logits
    torch.testing.assert_close(ours, want, atol=5 * SOFTMAX32, rtol=5 * SOFTMAX32)
    assert not torch.allclose(ours, vit64.forward(inp).logits, atol=1e-4)


# -- rollout as used on images (vit-explain) --------------------------------------------------------
def vit_explain_rollout(att: np.ndarray, discard_ratio: float, fusion: str) -> np.ndarray:
    """github.com/jacobgil/vit-explain's ``rollout`` (vit_rollout.py), ported to numpy for one image:
    fuse heads, zero the ``int(S*S*discard_ratio)`` smallest fused entries except flat index 0, add I,
    halve, renormalise, multiply up; return the [CLS] row over the patches on the grid divided by its
    max. One change, stated in the method's docstring: rows are renormalised (vit-explain's
    ``a / a.sum(dim=-1)`` broadcasts the row sums over columns)."""
    s = att.shape[-1]
    result = np.eye(s)
    for layer in att:  # [H, S, S]
        fused = {"mean": layer.mean(0), "max": layer.max(0), "min": layer.min(0)}[fusion].copy()
        flat = fused.reshape(-1)
        k = int(flat.size * discard_ratio)
        idx = np.argsort(flat, kind="stable")[:k]
        idx = idx[idx != 0]
        flat[idx] = 0
        a = (fused + np.eye(s)) / 2
        a = a / a.sum(-1, keepdims=True)
        result = a @ result
    mask = result[0, 1:].reshape(GRID, GRID)
    return mask / mask.max()


@pytest.mark.parametrize(("fusion", "discard"), [("mean", 0.0), ("max", 0.9), ("min", 0.5), ("mean", 0.75)])
def test_rollout_equals_vit_explain(vit64: ModelAdapter, images: list[Path], fusion: str, discard: float) -> None:
    inp = vit64.encode(images[1])
    with torch.no_grad():
        ref = eager(vit64)(pixel_values=processed(vit64, images[1]).double(), output_attentions=True)
    att = torch.stack([a[0] for a in ref.attentions]).double().numpy()
    e = Rollout(fusion=fusion, discard_ratio=discard).attribute(vit64, inp, target=Target())[0]  # type: ignore[arg-type]
    want = vit_explain_rollout(att, discard, fusion)
    np.testing.assert_allclose(e.arrays["grid"], want, atol=1e-6)
    assert e.arrays["grid"].shape == (GRID, GRID) and e.axes["grid"] == ["patch_row", "patch_col"]
    np.testing.assert_allclose(e.scores[1:].reshape(GRID, GRID) / e.scores[1:].max(), want, atol=1e-6)
    if discard:  # dropping entries changes the map: the option is not a no-op
        plain = vit_explain_rollout(att, 0.0, fusion)
        assert np.abs(plain - want).max() > 1e-3


def test_flow_grid_and_discard(vit64: ModelAdapter, images: list[Path]) -> None:
    inp = vit64.encode(images[0])
    e = Flow(discard_ratio=0.5).attribute(vit64, inp, target=Target())[0]
    np.testing.assert_allclose(e.arrays["grid"], e.scores[1:].reshape(GRID, GRID) / e.scores[1:].max(), atol=1e-6)
    assert not np.allclose(e.scores, Flow().attribute(vit64, inp, target=Target())[0].scores, atol=1e-4)
    with pytest.raises(StreetlampError, match="discard_ratio"):
        Rollout(discard_ratio=1.0).check(vit64)


# -- the [MEAN] patch: occlusion replacement and IG baseline ---------------------------------------
def test_occlusion_replaces_a_patch_by_the_mean_pixel(vit64: ModelAdapter, images: list[Path]) -> None:
    """Independent: the eager twin on pixel values with that 8 x 8 square set to 0 (the processor's
    normalised mean pixel)."""
    inp = vit64.encode(images[0])
    e = Occlusion().attribute(vit64, inp, target=Target())[0]
    assert e.info["replacement_token"] == "[MEAN]" and e.scores[0] == 0.0
    twin = eager(vit64)
    x = processed(vit64, images[0]).double()
    y = x.repeat(GRID * GRID, 1, 1, 1)
    for j in range(GRID * GRID):
        r, c = divmod(j, GRID)
        y[j, :, r * TINY_PATCH : (r + 1) * TINY_PATCH, c * TINY_PATCH : (c + 1) * TINY_PATCH] = 0
    with torch.no_grad():
        p0 = torch.softmax(twin(pixel_values=x).logits, -1)[0]
        k = int(p0.argmax())
        want = (p0[k] - torch.softmax(twin(pixel_values=y).logits, -1)[:, k]).numpy()
    np.testing.assert_allclose(e.scores[1:], want, atol=5 * SOFTMAX32)
    assert np.abs(e.scores).max() > 1e-3
    with pytest.raises(StreetlampError, match="cannot be deleted"):
        Occlusion(replacement="delete").attribute(vit64, inp, target=Target())


def test_ig_default_baseline_is_the_all_mean_image(vit64: ModelAdapter, images: list[Path]) -> None:
    """F(baseline) recorded by IG equals the eager twin on an image whose every pixel is the mean
    (normalised pixel values 0): [CLS] kept, every patch the [MEAN] patch."""
    inp = vit64.encode(images[0])
    target = Target(quantity="logit")
    e = IntegratedGradients(steps=16, adaptive=True, tolerance=1e-4).attribute(vit64, inp, target=target)[0]
    assert "[MEAN]" in e.info["baseline_used"]
    _, _, fe, fb, total = e.arrays["completeness"]
    k = e.info["target"]["index"]
    with torch.no_grad():
        twin = eager(vit64)
        f_img = float(twin(pixel_values=processed(vit64, images[0]).double()).logits[0, k])
        f_mean = float(twin(pixel_values=torch.zeros(1, 3, TINY_IMAGE_SIZE, TINY_IMAGE_SIZE).double()).logits[0, k])
    assert fe == pytest.approx(f_img, abs=5 * SOFTMAX32) and fb == pytest.approx(f_mean, abs=5 * SOFTMAX32)
    assert total == pytest.approx(f_img - f_mean, rel=1e-3, abs=1e-6)  # completeness, converged
    assert e.scores[0] == 0.0  # [CLS] keeps its own embedding in the baseline
    z = IntegratedGradients(baseline="zero", steps=8, adaptive=False).attribute(vit64, inp, target=target)[0]
    assert "zero vector" in z.info["baseline_used"] and z.arrays["completeness"][3] != pytest.approx(f_mean)


# -- methods that need family tables --------------------------------------------------------------
def test_alti_decomposition_is_exact(vit64: ModelAdapter, images: list[Path]) -> None:
    """Each layer's decomposed attention-block output (sum over sources + bias) equals the residual
    stream entering layernorm_after in the eager twin (pre-LN, as GPT-2)."""
    inp = vit64.encode(images[0])
    n = inp.lengths[0]
    twin = eager(vit64)
    real: list[torch.Tensor] = []
    hooks = [
        layer.layernorm_after.register_forward_pre_hook(lambda m, a: real.append(a[0][0].detach()))
        for layer in twin.vit.layers
    ]
    try:
        with torch.no_grad():
            twin(pixel_values=processed(vit64, images[0]).double())
    finally:
        for h in hooks:
            h.remove()
    sites = ["layers.*.attn.v", "layers.*.attn.pattern", "layers.*.resid_pre", "layers.*.attn.out"]
    cache = vit64.forward(inp, record=sites).cache
    for l in range(vit64.n_layers):
        d = alti_layer(vit64, cache, 0, n, l, keep_vectors=True, chunk_elems=n * vit64.d_model * 3)
        assert d.t is not None
        torch.testing.assert_close(d.t.sum(1) + d.bias, real[l], atol=5 * SOFTMAX32, rtol=5 * SOFTMAX32)
    e = Alti().attribute(vit64, inp, target=Target())[0]
    np.testing.assert_allclose(e.arrays["contributions"].sum(-1), 1, atol=1e-5)


def test_attnlrp_conserves_on_vit(vit64: ModelAdapter, images: list[Path]) -> None:
    """F = sum of token relevances + additive parameters (biases, LayerNorm betas, the position
    embeddings) + what the softmaxes absorb, to float32 rounding of the softmax (see test_lrp.py)."""
    ids = vit64.encode(images[0]).input_ids[0]
    r, f, cache = attnlrp_relevance(vit64, ids, 1, Target(quantity="logit"), record=("layers.*.attn.pattern",))
    pats = [cache[f"layers.{l}.attn.pattern"] for l in range(vit64.n_layers)]
    named = dict(vit64.hf_model.named_parameters())
    params = [p for k, p in named.items() if k.endswith("bias") or k.endswith("position_embeddings")]
    gs = torch.autograd.grad(f, pats + params, allow_unused=True)
    f, r = f.detach(), r.detach()
    soft = sum(float(softmax_absorbed(p, g).detach().sum()) for p, g in zip(pats, gs[: len(pats)]))
    bias = sum(float((p.detach() * g).sum()) for p, g in zip(params, gs[len(pats) :]) if g is not None)
    flow = sum(float((p.detach().double() * g).abs().sum()) for p, g in zip(pats, gs[: len(pats)]))
    scale = abs(float(f)) + float(r.abs().sum()) + abs(bias) + flow
    resid = float(f) - (float(r.sum()) + soft + bias)
    assert abs(resid) <= 64 * 2.0**-24 * scale, resid
    assert abs(float(r.sum())) > 0.05 * abs(float(f))


# -- bad input -------------------------------------------------------------------------------------
def test_bad_input(vit64: ModelAdapter, images: list[Path], tmp_path: Path) -> None:
    with pytest.raises(StreetlampError, match="image model.*not text"):
        vit64.encode("the movie was great")
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png at all")
    with pytest.raises(StreetlampError, match="not a readable image"):
        vit64.encode(bad)
    inp = vit64.encode(images[0])
    with pytest.raises(StreetlampError, match="cannot be deleted or added"):
        vit64.forward(inp.select([0]).__class__.from_ids(vit64, [inp.input_ids[0, :-1]]))
    with pytest.raises(StreetlampError, match="reads images, not text"):
        vit64.tokenizer("some text")  # type: ignore[operator]
    bert, tok = tiny_model("bert", seed=1)
    text_model = ModelAdapter(bert, tok, "tiny-bert")
    with pytest.raises(StreetlampError, match="text model.*cannot read the image"):
        text_model.encode(str(images[0]))
    from PIL import Image

    with pytest.raises(StreetlampError, match="text model.*cannot read the image"):
        text_model.encode([Image.new("RGB", (8, 8))])


# -- heads and evaluate on an image ---------------------------------------------------------------
def test_heads_on_an_image_equals_zeroed_output_projections(
    vit64: ModelAdapter, images: list[Path], tmp_path: Path
) -> None:
    """``heads IMAGE``: each head's zero-ablation effect equals p(target) on the eager twin with that head's
    columns of the output projection zeroed, minus the clean p(target) (target: the clean prediction)."""
    from streetlamp.commands.heads import HeadsSettings
    from streetlamp.commands.heads.run import run_heads
    from streetlamp.store.files import load_arrays

    s = HeadsSettings.from_values(text=str(images[0]), attribution=False)
    run_heads(vit64, s, tmp_path / "h", progress=False)
    got = load_arrays(tmp_path / "h" / "arrays.safetensors")["ablation"]
    pix = processed(vit64, images[0]).double()
    twin = eager(vit64)
    with torch.no_grad():
        clean = torch.softmax(twin(pixel_values=pix).logits[0], -1)
    c = int(clean.argmax())
    want = np.zeros((vit64.n_layers, vit64.n_heads))
    for layer in range(vit64.n_layers):
        for head in range(vit64.n_heads):
            t = eager(vit64)
            with torch.no_grad():
                output_matrix(t.vit.layers[layer].attention.o_proj, vit64.n_heads)[head] = 0
                want[layer, head] = float(torch.softmax(t(pixel_values=pix).logits[0], -1)[c] - clean[c])
    np.testing.assert_allclose(got, want, rtol=0, atol=f32_tol(4))  # the stored array is float32
    assert np.abs(want).max() > 1e-3


def test_heads_mean_ablation_of_one_image_and_evaluate_refuse(
    vit64: ModelAdapter, images: list[Path], tmp_path: Path
) -> None:
    from streetlamp.commands.evaluate import EvaluateSettings
    from streetlamp.commands.evaluate.run import evaluate
    from streetlamp.commands.heads import HeadsSettings

    with pytest.raises(StreetlampError, match="built-in ones are sentences.*--data.*--ablation zero"):
        HeadsSettings.from_values(text=str(images[0]), ablation="mean").validate(vit64)  # before any work
    csv = tmp_path / "d.csv"
    csv.write_text(f"text,label\n{images[0]},cat\n")
    with pytest.raises(StreetlampError, match="evaluate scores text datasets.*image model"):
        evaluate(vit64, EvaluateSettings(data=str(csv), methods=["attention"]), tmp_path / "e")
    assert not (tmp_path / "h").exists() and not (tmp_path / "e").exists()
