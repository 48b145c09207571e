"""The heads / prune / patch / mediate subcommands, in-process on tiny checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from streetlamp.cli import main
from streetlamp.models.tiny import save_tiny
from streetlamp.store.files import load_arrays


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    return {f: save_tiny(f, root / f, seed=1) for f in ("bert", "gpt2")}


def test_heads_text_and_data(ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "h"
    assert main(["heads", "the movie was not good", "--model", str(ckpts["bert"]), "--out", str(out)]) == 0
    m = json.loads((out / "manifest.json").read_text())
    a = load_arrays(out / "arrays.safetensors")
    assert a["ablation"].shape == (2, 4) and m["arrays"]["ablation"]["axes"] == ["layer", "head"]
    assert "versions" in m and (out / "ablation.png").exists()
    assert main(["heads", "i loved it", "--model", str(ckpts["bert"]), "--out", str(out)]) == 2  # not empty
    assert "not empty" in capsys.readouterr().err
    data = tmp_path / "d.jsonl"
    data.write_text(
        "\n".join(
            json.dumps({"text": t, "label": l})
            for t, l in [
                ("the movie was good", "pos"),
                ("i hated it", "neg"),
                ("boring plot", "neg"),
                ("great acting", "pos"),
                ("very fun", "pos"),
                ("terrible film", "neg"),
            ]
        )
    )
    out2 = tmp_path / "h2"
    assert (
        main(
            [
                "heads",
                "--data",
                str(data),
                "--ablation",
                "mean",
                "--no-attribution",
                "--model",
                str(ckpts["bert"]),
                "--out",
                str(out2),
            ]
        )
        == 0
    )
    a = load_arrays(out2 / "arrays.safetensors")
    assert {"ablation", "importance", "attention_mass"} <= set(a)
    m = json.loads((out2 / "manifest.json").read_text())
    assert "attention_mass" in m["claim"]["spearman_vs_effect"]
    out4 = tmp_path / "h4"  # --sample: N texts drawn with --seed, recorded
    assert (
        main(
            [
                "heads",
                "--data",
                str(data),
                "--sample",
                "4",
                "--seed",
                "3",
                "--no-attribution",
                "--model",
                str(ckpts["bert"]),
                "--out",
                str(out4),
            ]
        )
        == 0
    )
    m4 = json.loads((out4 / "manifest.json").read_text())
    assert m4["parameters"]["sample"] == 4 and m4["parameters"]["n_texts"] == 4
    assert load_arrays(out4 / "arrays.safetensors")["ablation_per_text"].shape[0] == 4
    assert (
        main(
            [
                "heads",
                "--data",
                str(data),
                "--sample",
                "4",
                "--limit",
                "2",
                "--model",
                str(ckpts["bert"]),
                "--out",
                str(tmp_path / "h5"),
            ]
        )
        == 2
    )
    out3 = tmp_path / "p"
    assert (
        main(
            [
                "prune",
                "--data",
                str(data),
                "--order",
                "importance,attention,random",
                "--seeds",
                "2",
                "--model",
                str(ckpts["bert"]),
                "--out",
                str(out3),
            ]
        )
        == 0
    )
    a = load_arrays(out3 / "arrays.safetensors")
    assert a["curve.importance"].shape == (2, 9) and (out3 / "prune.png").exists()
    np.testing.assert_allclose(a["curve.importance"][1, 0], a["curve.random_seed0"][1, 0])  # nothing removed


def test_patch_and_mediate(ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "pt"
    clean, corrupt = (
        "when mary and john went to the store john gave a drink to",
        "when mary and john went to the store mary gave a drink to",
    )
    assert (
        main(
            [
                "patch",
                "--model",
                str(ckpts["gpt2"]),
                "--clean",
                clean,
                "--corrupt",
                corrupt,
                "--answer",
                "mary",
                "--wrong",
                "john",
                "--approx",
                "--paths",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    a = load_arrays(out / "arrays.safetensors")
    assert a["patch.resid_pre"].shape == (2, 13) and a["approx.heads"].shape == (2, 4) and a["paths"].shape == (2, 4)
    printed = capsys.readouterr().out.split("paths sender -> logits")[1].splitlines()[0]
    lost = 1 - a["paths"]  # the printed paths are the largest |1 - value|, the array's own numbers
    top = np.unravel_index(np.argmax(np.abs(lost)), lost.shape)
    assert f"{top[0]}.{top[1]}: {lost[top]:+.3f}" in printed.split(": ", 1)[1].split(", ")[0]
    assert (
        main(
            [
                "patch",
                "--model",
                str(ckpts["gpt2"]),
                "--clean",
                clean,
                "--corrupt",
                "mary gave a drink to",
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )
    assert "same token length" in capsys.readouterr().err
    assert (
        main(
            [
                "patch",
                "--model",
                str(ckpts["gpt2"]),
                "--clean",
                clean,
                "--corrupt",
                corrupt,
                "--answer",
                "mary john",
                "--out",
                str(tmp_path / "y"),
            ]
        )
        == 2
    )
    assert "give one token" in capsys.readouterr().err
    assert (
        main(
            [
                "patch",
                "--model",
                str(ckpts["gpt2"]),
                "--clean",
                clean,
                "--corrupt",
                corrupt,
                "--paths",
                "--receiver",
                "7.1",
                "--out",
                str(tmp_path / "z"),
            ]
        )
        == 2
    )
    assert "out of range" in capsys.readouterr().err
    # mediation refuses a classifier
    assert main(["mediate", "--model", str(ckpts["bert"]), "--out", str(tmp_path / "m")]) == 2


def test_prune_holds_out_both_classes_of_sorted_data(ckpts: dict[str, Path], tmp_path: Path) -> None:
    """Data sorted by label (as gensim's movie sentences are) must not give a one-class held-out half."""
    data = tmp_path / "sorted.jsonl"
    rows = [("i hated it", "neg")] * 10 + [("great acting", "pos")] * 10
    data.write_text("\n".join(json.dumps({"text": t, "label": l}) for t, l in rows))
    out = tmp_path / "p"
    assert (
        main(
            [
                "prune",
                "--data",
                str(data),
                "--order",
                "attention",
                "--seeds",
                "1",
                "--step",
                "4",
                "--model",
                str(ckpts["bert"]),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    counts = json.loads((out / "manifest.json").read_text())["parameters"]["heldout_label_counts"]
    assert set(counts) == {"neg", "pos"} and sum(counts.values()) == 10
