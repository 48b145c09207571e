"""``lens`` keeps probabilities too small for float32 (``lens.logprob``) and stores the embedding's direct
logit attribution (``dla.embed``), each checked against Hugging Face's own hidden states in float64 on a
tiny GPT-2 whose unembedding is scaled so that most next-token probabilities underflow float32."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from streetlamp.cli import main
from streetlamp.interventions.lens import direct_logit_attribution, logit_lens
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.tiny import tiny_model
from streetlamp.store.files import load_arrays
from tests.conftest import F64_TOL, f32_tol

TEXT = "when mary and john went to the store , john gave a drink to"
SCALE = 600.0  # wte (tied to the unembedding) times this: logits spread over hundreds, p down to e^-500


def loud_gpt2() -> tuple[torch.nn.Module, object]:
    model, tok = tiny_model("gpt2", seed=3, layers=3)
    with torch.no_grad():
        model.transformer.wte.weight.mul_(SCALE)
    return model, tok


def hf_logprobs(model: torch.nn.Module, ids: torch.Tensor, index: int) -> np.ndarray:
    """log p(index) [layer+1, pos] from HF's hidden states: ln_f then the unembedding, log-softmax in
    float64 (HF's last hidden state already has ln_f applied)."""
    model = model.double()
    with torch.no_grad():
        out = model(ids[None], output_hidden_states=True)
        hs = out.hidden_states
        rows = [model.transformer.ln_f(h[0]) for h in hs[:-1]] + [hs[-1][0]]
        w = model.lm_head.weight.double()
        return np.stack([torch.log_softmax(r.double() @ w.T, -1)[:, index].numpy() for r in rows])


def hf_embed_dla(model: torch.nn.Module, ids: torch.Tensor, index: int) -> float:
    """The embedding's direct logit attribution: (e - mean e) / σ(x) · γ · W_U[index], x the residual
    entering ln_f at the last position (caught by a hook), e = wte + wpe there."""
    model = model.double()
    got: dict[str, torch.Tensor] = {}

    def catch(mod: torch.nn.Module, args: tuple, out: torch.Tensor) -> None:
        got["x"] = args[0][0, -1]

    h = model.transformer.ln_f.register_forward_hook(catch)
    with torch.no_grad():
        model(ids[None])
        h.remove()
        x, n = got["x"], ids.shape[0]
        e = model.transformer.wte.weight[ids[-1]] + model.transformer.wpe.weight[n - 1]
        ln = model.transformer.ln_f
        sigma = torch.sqrt(x.var(unbiased=False) + ln.eps)
        return float(((e - e.mean()) / sigma * ln.weight) @ model.lm_head.weight[index])


def test_logprob_where_float32_underflows_and_embed_dla() -> None:
    model, tok = loud_gpt2()
    a = ModelAdapter(model.double(), tok, "tiny-gpt2-loud")
    ids = a.encode(TEXT).input_ids[0]
    index = 7
    out = logit_lens(a, ids, index)
    ref = hf_logprobs(model, ids, index)
    scale = float(np.abs(ref).max())
    assert scale > 300  # the model underflows: probabilities far below float32's smallest subnormal
    np.testing.assert_allclose(out["logprob"], ref, rtol=0, atol=F64_TOL * scale)
    tiny = ref < np.log(np.finfo(np.float32).tiny)
    assert tiny.sum() >= 5 and np.all(out["prob"][tiny].astype(np.float32) < np.finfo(np.float32).tiny)
    np.testing.assert_allclose(np.log(out["prob"][~tiny]), ref[~tiny], rtol=0, atol=1e-6 * scale)
    d = direct_logit_attribution(a, ids, index)
    want = hf_embed_dla(model, ids, index)
    assert abs(want) > 1e-3 and d.embed == pytest.approx(want, abs=F64_TOL * max(1.0, abs(want)))


def test_lens_cli_stores_logprob_and_embed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model, tok = loud_gpt2()
    ckpt = tmp_path / "loud"
    model.save_pretrained(ckpt, safe_serialization=True)
    tok.save_pretrained(ckpt)
    out = tmp_path / "lens"
    argv = ["lens", TEXT, "--model", str(ckpt), "--out", str(out), "--types-length", "4", "--types-seqs", "1"]
    assert main(argv) == 0
    capsys.readouterr()
    m = json.loads((out / "manifest.json").read_text())
    arr = load_arrays(out / "arrays.safetensors")
    index = int(m["parameters"]["target"]["index"])
    ids = torch.tensor(tok(TEXT)["input_ids"])
    ref = hf_logprobs(model, ids, index)  # float64 from the same (float32) weights the CLI ran
    scale = float(np.abs(ref).max())
    assert scale > 300 and (arr["lens.prob"] == 0).sum() >= 5  # the old array underflows, as documented
    np.testing.assert_allclose(arr["lens.logprob"], ref, rtol=0, atol=f32_tol(3, scale))
    assert np.all(np.isfinite(arr["lens.logprob"]))
    assert m["arrays"]["lens.logprob"]["axes"] == m["arrays"]["lens.prob"]["axes"]
    want = hf_embed_dla(model, ids, index)
    assert arr["dla.embed"].shape == () and float(arr["dla.embed"]) == pytest.approx(want, abs=f32_tol(3, want))
    s = m["summary"]  # the stored parts and the two bias terms add up to the logit
    parts = arr["dla.embed"] + arr["dla.heads"].sum() + arr["dla.mlp"].sum() + arr["dla.attn_bias"].sum()
    total = float(parts) + s["dla_norm_bias"] + s["dla_unembed_bias"]
    assert total == pytest.approx(s["logit"], abs=f32_tol(3, abs(s["logit"]) + abs(float(parts))))
    table = m["tables"][0]  # the report shows log p beside p
    col = next(i for i, c in enumerate(table["columns"]) if c.startswith("log p("))
    np.testing.assert_allclose([r[col] for r in table["rows"]], ref[:, -1], rtol=0, atol=f32_tol(3, scale))
