"""Any GGUF file, not only SmolLM2's: tiny Llama and Qwen2 GGUFs written here (tests/helpers/tiny_gguf.py, from the
GGUF layout, not from transformers' reader) load through ``streetlamp.load`` / ``--model FILE.gguf`` with the
weights, vocabulary and merges they were written with; Q8_0 weights dequantise as ``gguf.quants`` does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import streetlamp
from streetlamp.cli import main
from streetlamp.models import loading
from tests.helpers.tiny_gguf import write_tiny_gguf

TEXT = "hello the world"
# float32 logits of a 2-layer model computed in two different orders (our attention function vs the
# written model's eager path): a few ulps of the largest logit per operation
ATOL = 64 * torch.finfo(torch.float32).eps


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STREETLAMP_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("arch,quant", [("llama", "F32"), ("llama", "Q8_0"), ("qwen2", "F32")])
def test_tiny_gguf_loads_with_its_weights(arch: str, quant: str, cache: Path, tmp_path: Path) -> None:
    path = tmp_path / f"tiny-{arch}-{quant}.gguf"
    want = write_tiny_gguf(path, arch, quant)
    adapter = streetlamp.load(str(path))
    assert adapter.family.name == arch and adapter.kind == "causal_lm"
    # the byte-level BPE written into the file: merges "h e", "l l", "Ġ t", "Ġt he" apply
    ids = adapter.tokenizer(TEXT, add_special_tokens=False).input_ids
    assert adapter.tokenizer.convert_ids_to_tokens(ids) == ["he", "ll", "o", "Ġthe", "Ġw", "o", "r", "l", "d"]
    inputs = adapter.encode(TEXT)
    with torch.no_grad():
        ref = want(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask).logits
    scale = float(ref.abs().max())
    torch.testing.assert_close(
        adapter.forward(inputs).logits, adapter.select_logits(ref, inputs), atol=ATOL * scale, rtol=0
    )
    entry = loading.gguf_cache_entry(path)
    assert (entry / "model.safetensors").exists()
    assert json.loads((entry / "streetlamp-source.json").read_text())["sha256"] == loading.file_sha256(path)


def test_quantised_file_differs_from_float(cache: Path, tmp_path: Path) -> None:
    """The Q8_0 check above can fail: its weights are not the float ones (the round trip moves them)."""
    f32 = write_tiny_gguf(tmp_path / "a.gguf", "llama", "F32")
    q8 = write_tiny_gguf(tmp_path / "b.gguf", "llama", "Q8_0")
    w32 = f32.model.layers[0].self_attn.q_proj.weight
    w8 = q8.model.layers[0].self_attn.q_proj.weight
    step = float(w32.detach().abs().max()) / 127  # Q8_0: one scale per 32 values, 8-bit levels
    assert 0 < float((w32 - w8).detach().abs().max()) <= step


def test_explain_on_a_gguf_file(cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, "llama", "Q8_0")
    out = tmp_path / "run"
    rc = main(["explain", TEXT, "--model", str(path), "--methods", "attention,gradient_x_input", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert "tiny.gguf" in json.dumps(manifest["model"])
