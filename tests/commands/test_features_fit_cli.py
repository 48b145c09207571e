"""``streetlamp features-fit``: the run folder is a dictionary folder with metrics.csv per layer; an interrupted
fit resumed with --resume equals the uninterrupted one; bad input is one line, exit 2, nothing written or lost."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from streetlamp.cli import main
from streetlamp.models.dictionaries import load_features
from streetlamp.models.tiny import save_tiny

from ..features.helpers import corpus_file


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    t = tmp_path_factory.mktemp("ffit")
    return {"llama": save_tiny("llama", t / "llama", seed=1), "data": corpus_file(t, n=80)}


def args(s: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return [
        "features-fit", "--model", str(s["llama"]), "--kind", "transcoder", "--data", str(s["data"]),
        "--width", "16", "--tokens", "120", "--seq-len", "8", "--heldout", "2", "--batch-seqs", "3",
        "--batch-tokens", "7", "--layers", "0,1", "--out", str(out), "--checkpoint-every", "1", *extra,
    ]  # fmt: skip


def test_fit_writes_a_dictionary_folder_with_metrics(setup, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert main(args(setup, out, "--activation", "topk", "--k", "3")) == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    assert "ce_recovered" in text and f"--features {out}" in text
    fs = load_features(out)
    assert sorted(fs.dictionaries) == [(0, "mlp"), (1, "mlp")]
    assert all(d.activation == "topk" and d.k == 3 and d.width == 16 for d in fs)
    m = pd.read_csv(out / "metrics.csv")
    assert m.layer.tolist() == [0, 1]
    assert {"fvu", "l0", "dead_fraction", "dense_fraction", "ce_clean", "ce_spliced", "ce_zero_ablated"} <= set(m)
    assert (m.l0 <= 3).all() and (m.fvu > 0).all()
    man = json.loads((out / "manifest.json").read_text())
    assert man["training"]["tokens_seen"] == 6 * 3 * 7  # ceil(120 / 21) shards of 3 sequences x 7 tokens
    assert man["corpus"]["sources"][str(setup["data"])]["tokens"] > 0
    assert not (out / "checkpoint.safetensors").exists()
    assert (out / "training.csv").is_file()


def test_evaluate_measures_a_finished_fit_without_fitting(setup, tmp_path, capsys) -> None:
    """--evaluate DIR with the fit's corpus settings rebuilds the fit's held-out text: its metrics.csv equals the
    fit's, value for value; the per-token columns are in the table, the csv and the manifest's columns."""
    fit, ev = tmp_path / "fit", tmp_path / "eval"
    assert main(args(setup, fit, "--activation", "topk", "--k", "3")) == 0, capsys.readouterr().err
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in fit.iterdir() if p.is_file()}
    assert main(args(setup, ev, "--evaluate", str(fit))) == 0, capsys.readouterr().err
    out, err = capsys.readouterr()
    assert "measured, not fitted" in out and "fvu_token_median" in out and "not the fit's" not in err
    a, b = pd.read_csv(fit / "metrics.csv"), pd.read_csv(ev / "metrics.csv")
    assert {"fvu_token_median", "fvu_without_massive", "massive_tokens"} <= set(b)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert not (ev / "features.json").exists() and not (ev / "training.csv").exists()
    man = json.loads((ev / "manifest.json").read_text())
    assert set(man["columns"]) == set(b) and man["evaluated"]["heldout_is_the_fit's"] is True
    assert before == {p.name: p.read_bytes() for p in fit.iterdir() if p.is_file()}  # the fit is untouched
    # other corpus settings: measured, and said to be on other text; one layer only
    assert main(args(setup, tmp_path / "e2", "--evaluate", str(fit), "--seed", "3", "--no-ce")) == 0
    assert "not the fit's: --seed 3 (fit: 0)" in capsys.readouterr().err
    one = args(setup, tmp_path / "e5", "--evaluate", str(fit), "--no-ce")
    one[one.index("0,1")] = "1"
    assert main(one) == 0
    c = pd.read_csv(tmp_path / "e5" / "metrics.csv")
    assert c.layer.tolist() == [1] and c.fvu_token_median[0] == a.fvu_token_median[1]
    # an SAE's --kind against a transcoder folder, and a folder that is no dictionary: one line, exit 2
    bad = args(setup, tmp_path / "e3", "--evaluate", str(fit))
    bad[bad.index("transcoder")] = "sae"
    assert main(bad) == 2
    assert "sits at resid_pre" in capsys.readouterr().err
    assert main(args(setup, tmp_path / "e4", "--evaluate", str(tmp_path))) == 2
    assert "not a finished dictionary folder" in capsys.readouterr().err


def test_interrupted_and_resumed_equals_uninterrupted(setup, tmp_path, capsys) -> None:
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(args(setup, full, "--activation", "jumprelu", "--no-ce")) == 0
    assert main(args(setup, part, "--activation", "jumprelu", "--no-ce", "--stop-after", "2")) == 0
    assert "--resume" in capsys.readouterr().out
    ck = part / "checkpoint.safetensors"
    before = ck.read_bytes()
    assert not (part / "features.json").exists()
    # without --resume: refused in one line, the checkpoint untouched
    assert main(args(setup, part, "--activation", "jumprelu", "--no-ce")) == 2
    err = capsys.readouterr().err.strip()
    assert "--resume" in err and len(err.splitlines()) == 1
    # other settings: refused
    assert main(args(setup, part, "--activation", "jumprelu", "--no-ce", "--lr", "0.5", "--resume")) == 2
    assert "other settings" in capsys.readouterr().err
    assert ck.read_bytes() == before
    assert main(args(setup, part, "--activation", "jumprelu", "--no-ce", "--resume")) == 0, capsys.readouterr().err
    a, b = load_features(full), load_features(part)
    for d in a:
        e = b.get(d.layer, d.where)
        for n in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold"):
            assert torch.equal(getattr(d, n), getattr(e, n)), n
    assert pd.read_csv(full / "training.csv").equals(pd.read_csv(part / "training.csv"))  # every shard once
    # a finished fit is not fitted again
    assert main(args(setup, part, "--activation", "jumprelu", "--no-ce", "--resume")) == 2
    assert "finished" in capsys.readouterr().err


def test_a_fit_checkpointed_before_evaluate_existed_resumes(setup, tmp_path, capsys) -> None:
    """Its manifest has no ``evaluate``: a stored setting that is absent compares as None, --evaluate's default."""
    part = tmp_path / "part"
    assert main(args(setup, part, "--no-ce", "--stop-after", "2")) == 0
    man = json.loads((part / "manifest.json").read_text())
    del man["settings"]["evaluate"]  # as an older streetlamp wrote it
    (part / "manifest.json").write_text(json.dumps(man))
    assert main(args(setup, part, "--no-ce", "--resume")) == 0, capsys.readouterr().err
    assert (part / "features.json").is_file()


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--layers", "2"], "out of range"),
        (["--width", "0"], "--width"),
        (["--activation", "topk", "--k", "17"], "more than --width"),
        (["--activation", "topk"], "needs --k"),
        (["--site", "resid_pre"], "sits at mlp"),
        (["--resume"], "nothing to resume"),
        (["--evaluate", "x", "--stop-after", "2"], "fits nothing"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(setup, tmp_path, capsys, extra, says) -> None:
    out = tmp_path / "run"
    assert main(args(setup, out, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
    assert not out.exists()
