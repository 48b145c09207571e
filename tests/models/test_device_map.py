"""--device-map auto: a model spread over CPU and disk (accelerate) gives the numbers of the model in memory.

Here there is no GPU, so the map is CPU + disk: ``max_memory`` below the model's size sends layers to
the offload folder, loaded for every forward pass. Recording, an edit (head ablation) and gradients
must not notice. On a GPU machine the same code spreads layers over the GPUs first.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from accelerate.utils import compute_module_sizes

from streetlamp.cli import main
from streetlamp.errors import StreetlampError
from streetlamp.methods.registry import get_method
from streetlamp.models.adapter import ModelAdapter, Target
from streetlamp.models.loading import load
from streetlamp.models.tiny import save_tiny

TEXT = "the movie was not good , but the acting was great ."


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("dm") / "llama", seed=1)


def half_of(adapter: ModelAdapter) -> dict[str, int]:
    return {"cpu": int(compute_module_sizes(adapter.hf_model)[""] * 0.5)}


def test_disk_offload_gives_the_same_numbers(ckpt: Path, tmp_path: Path) -> None:
    ref = load(str(ckpt))
    off = load(str(ckpt))
    off.dispatch(half_of(off), tmp_path / "offload")  # type: ignore[arg-type]
    placed = set(off.hf_model.hf_device_map.values())
    assert placed == {"cpu", "disk"}, placed  # some layers really are on disk
    assert any(p.device.type == "meta" for p in off.hf_model.parameters())
    assert off.device == torch.device("cpu") and "device_map" in off.describe()
    inputs = ref.encode(TEXT)
    a = ref.forward(inputs, record=["layers.*.attn.pattern"])
    b = off.forward(inputs, record=["layers.*.attn.pattern"])
    assert torch.equal(a.logits, b.logits)
    for k in a.cache:
        assert torch.equal(a.cache[k], b.cache[k]), k

    def zero_head(z: torch.Tensor) -> torch.Tensor:
        z = z.clone()
        z[:, :, 1] = 0
        return z

    edit = {"layers.1.attn.z": zero_head}
    assert torch.equal(ref.forward(inputs, edit=edit).logits, off.forward(inputs, edit=edit).logits)
    ga = get_method("gradient_x_input").attribute(ref, inputs, target=Target())[0].scores
    gb = get_method("gradient_x_input").attribute(off, inputs, target=Target())[0].scores
    np.testing.assert_array_equal(ga, gb)


def test_cli_device_map_and_bad_settings(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    size = compute_module_sizes(load(str(ckpt)).hf_model)[""]
    out = tmp_path / "run"
    args = ["explain", TEXT, "--model", str(ckpt), "--methods", "attention", "--out", str(out)]
    mem = f"cpu={size * 6 // 10 // 1024}KiB"
    assert main([*args, "--device-map", "auto", "--max-memory", mem, "--offload-folder", str(tmp_path / "o")]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert "disk" in m["model"]["device_map"].values()
    for bad in (
        ["--device-map", "auto", "--max-memory", "lots"],
        ["--max-memory", "cpu=1GiB"],  # without --device-map
        ["--device-map", "auto", "--device", "cuda"],
        ["--device-map", "auto", "--max-memory", mem],  # does not fit and no offload folder
        ["--device-map", "auto", "--max-memory", "cpu=1KiB", "--offload-folder", str(tmp_path / "o2")],  # nothing fits
    ):
        capsys.readouterr()
        bad_out = tmp_path / "bad"
        assert main([*args[:-1], str(bad_out), *bad]) == 2, bad
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("streetlamp: error"), err
        assert not bad_out.exists()


def test_dispatch_refuses_disk_without_folder(ckpt: Path) -> None:
    a = load(str(ckpt))
    with pytest.raises(StreetlampError, match="offload-folder"):
        a.dispatch(half_of(a), None)  # type: ignore[arg-type]
