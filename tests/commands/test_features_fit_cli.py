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


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--layers", "2"], "out of range"),
        (["--width", "0"], "--width"),
        (["--activation", "topk", "--k", "17"], "more than --width"),
        (["--activation", "topk"], "needs --k"),
        (["--site", "resid_pre"], "sits at mlp"),
        (["--resume"], "nothing to resume"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(setup, tmp_path, capsys, extra, says) -> None:
    out = tmp_path / "run"
    assert main(args(setup, out, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
    assert not out.exists()
