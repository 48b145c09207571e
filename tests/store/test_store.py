"""Run store: resumption after SIGKILL (real subprocess), no duplicate rows, refusal of other
settings, bad input leaving stored work intact, plain-pandas readability."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from streetlamp.cli import main
from streetlamp.commands.evaluate import EvaluateSettings
from streetlamp.commands.evaluate.run import evaluate
from streetlamp.errors import StreetlampError
from streetlamp.models.tiny import WORDS, save_tiny
from streetlamp.settings import RunOptions
from streetlamp.store import read_metrics

CHEAP = ["--adv-steps", "2", "--permutations", "2", "--chunk-size", "1", "--methods", "attention"]


def cheap_settings(data: Path | str, **kw) -> EvaluateSettings:
    """The settings of ``CHEAP`` (as the API builds them) on ``data``."""
    return EvaluateSettings(data=str(data), methods=["attention"], permutations=2, adv_steps=2, **kw)


def write_data(path: Path, n: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    lines = ["text,label"] + [
        " ".join(rng.choice(WORDS, rng.integers(3, 9))) + f",{['neg', 'neu', 'pos'][i % 3]}" for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("bert", tmp_path_factory.mktemp("m") / "tiny-bert", seed=1)


def test_sigkill_resume(tmp_path: Path, tiny_dir: Path) -> None:
    data = write_data(tmp_path / "d.csv", 14)
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "streetlamp.cli",
        "evaluate",
        "--model",
        str(tiny_dir),
        "--data",
        str(data),
        "--out",
        str(out),
        *CHEAP,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and len(list((out / "metrics").glob("part-*.parquet"))) < 3:
        assert p.poll() is None, p.stderr.read().decode()[-2000:]
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    parts = {q.name: q.stat().st_mtime_ns for q in (out / "metrics").glob("part-*.parquet")}
    assert 3 <= len(parts) < 14, "killed too late to test resumption"
    before = read_metrics(out)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    after = read_metrics(out)
    for name, mtime in parts.items():  # nothing stored was recomputed
        assert (out / "metrics" / name).stat().st_mtime_ns == mtime
    assert not list(out.rglob(".*.tmp-*"))
    raw = pd.read_parquet(out / "metrics")  # plain pandas, no streetlamp reader: no duplicates either
    assert not raw.duplicated(["example_id", "method", "metric"]).any()
    assert raw.example_id.nunique() == 14 and len(raw) == len(after)
    merged = before.merge(after, on=["example_id", "method", "metric"], suffixes=("_a", "_b"))
    assert len(merged) == len(before)
    np.testing.assert_array_equal(merged.value_a.to_numpy(), merged.value_b.to_numpy())
    # the same as one uninterrupted run
    ref = evaluate(None, cheap_settings(str(data), chunk_size=1), tmp_path / "ref", RunOptions(model=str(tiny_dir)))
    a = after.sort_values(["example_id", "method", "metric"]).reset_index(drop=True)
    b = read_metrics(ref.out).sort_values(["example_id", "method", "metric"]).reset_index(drop=True)
    assert a[["example_id", "method", "metric"]].equals(b[["example_id", "method", "metric"]])
    np.testing.assert_allclose(a.value, b.value, rtol=1e-5, atol=1e-6)


def test_refuses_other_settings_and_keeps_data(tmp_path: Path, tiny_dir: Path, capsys) -> None:
    data = write_data(tmp_path / "d.csv", 3)
    out = tmp_path / "run"
    base = ["evaluate", "--model", str(tiny_dir), "--data", str(data), "--out", str(out), *CHEAP]
    assert main(base) == 0
    n = len(read_metrics(out))
    assert main(base) == 0 and len(read_metrics(out)) == n  # rerun: nothing to do, nothing duplicated
    assert "0 chunks computed now" in capsys.readouterr().out
    assert main(base + ["--seed", "5"]) == 2
    assert "other settings" in capsys.readouterr().err
    write_data(tmp_path / "d.csv", 3, seed=9)  # the data changed under the same name
    assert main(base) == 2
    assert "sha256" in capsys.readouterr().err
    assert len(read_metrics(out)) == n
    s = pd.read_csv(out / "summary.csv")
    assert {"method", "metric", "mean", "median", "n"} <= set(s.columns)
    assert (out / "summary.md").read_text().startswith("## Faithfulness")
    assert (out / "figures" / "aopc_curves.png").exists()


def test_bad_labels_and_long_examples(tmp_path: Path, tiny_dir: Path, capsys) -> None:
    (tmp_path / "bad.csv").write_text("text,label\nthe movie,pos\nthe film,happy\n")
    out = tmp_path / "r"
    assert main(["evaluate", "--model", str(tiny_dir), "--data", str(tmp_path / "bad.csv"), "--out", str(out)]) == 2
    assert "'happy' are not classes" in capsys.readouterr().err and not out.exists()
    long = " ".join(["the"] * 80)  # tiny models take 64 positions
    (tmp_path / "long.csv").write_text(f"text,label\nthe movie,pos\n{long},neg\n")
    res = evaluate(None, cheap_settings(str(tmp_path / "long.csv")), tmp_path / "s", RunOptions(model=str(tiny_dir)))
    assert res.n_examples == 1 and res.n_skipped == 1
    assert read_metrics(res.out).example_id.nunique() == 1
    res = evaluate(
        None, cheap_settings(str(tmp_path / "long.csv"), truncate=True), tmp_path / "t", RunOptions(model=str(tiny_dir))
    )
    df = read_metrics(res.out)
    assert res.n_skipped == 0 and df.example_id.nunique() == 2
    assert df[(df.metric == "truncated")].value.sum() == 1
    assert df[(df.metric == "n_tokens")].value.max() == 64
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    with pytest.raises(StreetlampError, match="no manifest"):
        evaluate(None, cheap_settings(str(tmp_path / "long.csv")), tmp_path / "x", RunOptions(model=str(tiny_dir)))
    assert (tmp_path / "x" / "keep.txt").read_text() == "mine"


def test_eraser_plausibility_rows(tmp_path: Path, tiny_dir: Path) -> None:
    from tests.data.test_data import write_eraser

    root = write_eraser(tmp_path / "er")
    res = evaluate(None, cheap_settings(str(root)), tmp_path / "run", RunOptions(model=str(tiny_dir)))
    df = read_metrics(res.out)
    pl = df[df.metric.isin(["average_precision", "auprc", "token_f1", "iou_f1"])]
    assert set(pl.example_id) == {"d1", "d2"} and pl.value.between(0, 1).all()
    assert set(pl.metric) == {"average_precision", "auprc", "token_f1", "iou_f1"}  # both named for what they are
    from streetlamp.store.files import load_arrays

    arr = load_arrays(res.out / "arrays" / "d2.safetensors")
    assert arr["rationale"].tolist() == [0, 0, 1, 0, 0, 1, 1, 0]  # [CLS] a boring plot and bad acting [SEP]


def test_limit_on_label_sorted_data_warns(tmp_path: Path, tiny_dir: Path, capsys: pytest.CaptureFixture) -> None:
    data = tmp_path / "sorted.csv"
    data.write_text(
        "text,label\n"
        + "".join(f"the movie {i},neg\n" for i in range(3))
        + "".join(f"great acting {i},pos\n" for i in range(3))
    )
    assert (
        main(
            [
                "evaluate",
                "--model",
                str(tiny_dir),
                "--data",
                str(data),
                "--out",
                str(tmp_path / "r"),
                "--limit",
                "2",
                *CHEAP,
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "--limit 2 takes the first 2 examples, which carry only neg of the labels neg, pos" in err
    assert (
        main(
            [
                "evaluate",
                "--model",
                str(tiny_dir),
                "--data",
                str(data),
                "--out",
                str(tmp_path / "r2"),
                "--limit",
                "4",
                *CHEAP,
            ]
        )
        == 0
    )
    assert "warning" not in capsys.readouterr().err


def test_sample_draws_both_labels_repeatably(tmp_path: Path, tiny_dir: Path, capsys: pytest.CaptureFixture) -> None:
    """--sample N draws N examples with --seed (file order kept), recorded; --limit with it is refused."""
    from streetlamp.data import sample_indices

    data = tmp_path / "sorted.csv"
    data.write_text(
        "text,label\n"
        + "".join(f"the movie {i},neg\n" for i in range(10))
        + "".join(f"great acting {i},pos\n" for i in range(10))
    )
    idx = sample_indices(20, 6, seed=0)
    assert idx == sorted(idx) and len(set(idx)) == 6 and idx == sample_indices(20, 6, seed=0)
    assert idx != sample_indices(20, 6, seed=1) and sample_indices(5, 9, seed=0) == list(range(5))
    assert any(i < 10 for i in idx) and any(i >= 10 for i in idx)  # both labels (checked for this seed)
    out = tmp_path / "r"
    assert (
        main(["evaluate", "--model", str(tiny_dir), "--data", str(data), "--out", str(out), "--sample", "6", *CHEAP])
        == 0
    )
    assert "warning" not in capsys.readouterr().err
    df = read_metrics(out)
    assert sorted(set(df.example_id)) == [f"sorted-{i:06d}" for i in idx]
    import json

    assert json.loads((out / "manifest.json").read_text())["settings"]["sample"] == 6
    # the same command resumes (same draw); both options at once are refused before anything runs
    assert (
        main(["evaluate", "--model", str(tiny_dir), "--data", str(data), "--out", str(out), "--sample", "6", *CHEAP])
        == 0
    )
    assert len(read_metrics(out)) == len(df)
    assert (
        main(
            [
                "evaluate",
                "--model",
                str(tiny_dir),
                "--data",
                str(data),
                "--out",
                str(tmp_path / "r2"),
                "--sample",
                "6",
                "--limit",
                "3",
                *CHEAP,
            ]
        )
        == 2
    )
    assert "not both" in capsys.readouterr().err and not (tmp_path / "r2").exists()
    assert (
        main(
            [
                "evaluate",
                "--model",
                str(tiny_dir),
                "--data",
                str(data),
                "--out",
                str(tmp_path / "r3"),
                "--sample",
                "0",
                *CHEAP,
            ]
        )
        == 2
    )
