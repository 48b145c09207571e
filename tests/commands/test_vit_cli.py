"""``streetlamp explain IMAGE --model <vit>`` in-process, and the image/text mix-ups in one line each."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from streetlamp.cli import main
from streetlamp.models.tiny import save_tiny
from tests.helpers.vit_helpers import random_image


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    return {f: save_tiny(f, root / f, seed=1) for f in ("vit", "bert")}


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("img") / "picture.png"
    random_image(3).save(p)
    return p


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_explain_an_image(ckpts: dict[str, Path], image: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "o"
    methods = "attention,rollout,occlusion"
    rc, stdout, err = run(
        capsys, "explain", str(image), "--model", str(ckpts["vit"]), "--out", str(out), "--methods", methods
    )
    assert rc == 0, err
    assert "attention from '[CLS]'" in stdout and "replaced by [MEAN]" in stdout and "image_overlay.png" in stdout
    assert "over the 16 patches" in stdout and "word tokens" not in stdout
    m = json.loads((out / "manifest.json").read_text())
    assert m["model"]["modality"] == "image" and m["model"]["patch_rows"] == 4
    assert m["image"]["file"] == str(image) and m["tokens"][:2] == ["[CLS]", "patch(0,0)"]
    assert m["special_positions"] == [0] and m["explained_position"]["index"] == 0
    figs = {f["file"]: f for f in m["figures"]}
    assert figs["image_overlay.png"]["view"] == "explain"
    assert (out / "image_overlay.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    arrays = load_file(str(out / "arrays.safetensors"))
    assert arrays["attention"].shape == (2, 4, 17, 17)
    grid = arrays["rollout.grid"]
    # the grid is one float32 division of the stored tokens (where it was computed, possibly in another
    # order or precision than here): equal to a couple of float32 ulps, far below the grid's values
    want = arrays["rollout.tokens"][1:].reshape(4, 4) / arrays["rollout.tokens"][1:].max()
    assert want.min() > 1e-3
    np.testing.assert_allclose(grid, want, rtol=4 * float(np.finfo(np.float32).eps), atol=0)
    # the report shows the overlay in the explain view (the only figure it embeds there)
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 1 and "image_overlay.png" in html


def _refused(capsys: pytest.CaptureFixture, out: Path, *argv: str) -> str:
    rc, stdout, err = run(capsys, *argv, "--out", str(out))
    assert rc == 2 and not out.exists(), (rc, stdout, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_an_image_for_a_text_model(ckpts: dict[str, Path], image: Path, tmp_path: Path, capsys) -> None:
    line = _refused(capsys, tmp_path / "o", "explain", str(image), "--model", str(ckpts["bert"]))
    assert "text model" in line and "cannot read the image" in line


def test_a_text_for_vit(ckpts: dict[str, Path], tmp_path: Path, capsys) -> None:
    line = _refused(capsys, tmp_path / "o", "explain", "the movie was great", "--model", str(ckpts["vit"]))
    assert "image model" in line and "not text" in line


def test_an_unreadable_image(ckpts: dict[str, Path], tmp_path: Path, capsys) -> None:
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)  # a PNG signature and nothing decodable
    line = _refused(capsys, tmp_path / "o", "explain", str(bad), "--model", str(ckpts["vit"]))
    assert "not a readable image" in line and "broken.png" in line


def test_delete_replacement_refused_for_images(ckpts: dict[str, Path], image: Path, tmp_path: Path, capsys) -> None:
    line = _refused(
        capsys,
        tmp_path / "o",
        "explain",
        str(image),
        "--model",
        str(ckpts["vit"]),
        "--methods",
        "occlusion",
        "--method-params",
        '{"occlusion": {"replacement": "delete"}}',
    )
    assert "cannot be deleted" in line


def test_heads_over_a_csv_of_images_and_evaluate_refused(
    ckpts: dict[str, Path], image: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    csv = tmp_path / "images.csv"
    other = tmp_path / "other.png"
    random_image(4).save(other)
    csv.write_text(f"text,label\n{image},cat\n{other},dog\n")
    rc, out, err = run(capsys, "heads", "--data", str(csv), "--model", str(ckpts["vit"]), "--out", str(tmp_path / "h"))
    assert rc == 0, err
    a = load_file(str(tmp_path / "h" / "arrays.safetensors"))
    assert a["ablation_per_text"].shape == (2, 2, 4)  # images x layers x heads
    rc, out, err = run(
        capsys, "evaluate", "--data", str(csv), "--model", str(ckpts["vit"]), "--out", str(tmp_path / "e")
    )
    assert rc == 2 and err.count("\n") == 1 and "image model" in err and not (tmp_path / "e").exists()
    rc, out, err = run(
        capsys, "heads", str(image), "--ablation", "mean", "--model", str(ckpts["vit"]), "--out", str(tmp_path / "m")
    )
    assert rc == 2 and err.count("\n") == 1 and "--ablation zero" in err and not (tmp_path / "m").exists()
