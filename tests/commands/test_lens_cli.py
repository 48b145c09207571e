"""``streetlamp lens`` in-process on tiny checkpoints: output folder, tables, and bad input refused
before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from streetlamp.cli import main
from streetlamp.models.tiny import save_tiny
from streetlamp.store.files import load_arrays

TEXT = "when mary and john went to the store , john gave a drink to"


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    return {f: save_tiny(f, root / f, seed=1) for f in ("bert", "llama")}


def test_lens_writes_tables_and_arrays(ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "lens"
    args = ["lens", TEXT, "--model", str(ckpts["llama"]), "--out", str(out), "--types-length", "6", "--types-seqs", "2"]
    assert main(args + ["--head", "1.2", "--query", "9", "--target", "mary"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    a = load_arrays(out / "arrays.safetensors")
    assert a["lens.prob"].shape == (3, 14) and a["dla.heads"].shape == (2, 4) and a["qk.table"].ndim == 2
    assert m["arrays"]["dla.heads"]["axes"] == ["layer", "head"] and m["parameters"]["target"]["label"] == "mary"
    titles = [t["title"] for t in m["tables"]]
    assert any(t.startswith("head L1H2 from query 9") for t in titles) and len(m["tables"]) == 7
    s = m["summary"]
    assert s["dla_total"] == pytest.approx(s["logit"], abs=1e-4)
    assert np.isclose(a["qk.table"].sum(), s["head"]["score"], atol=1e-4)
    assert (out / "lens.png").exists() and (out / "head_types_induction.png").exists()
    printed = capsys.readouterr().out
    assert "direct logit attribution" in printed and f"output: {out}/" in printed


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--head", "2.0"], "--head 2.0 out of range"),
        (["--head", "x"], "bad --head"),
        (["--head", "0.0", "--query", "99"], "--query 99 out of range"),
        (["--query", "3"], "--query needs --head"),
        (["--target", "mary john"], "is 2 tokens"),
    ],
)
def test_lens_bad_input(
    ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, extra: list[str], message: str
) -> None:
    out = tmp_path / "bad"
    assert main(["lens", TEXT, "--model", str(ckpts["llama"]), "--out", str(out)] + extra) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_lens_refuses_an_encoder(ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["lens", "the movie was good", "--model", str(ckpts["bert"]), "--out", str(tmp_path / "b")]) == 2
    assert "pre-norm causal LM" in capsys.readouterr().err
