"""``circuit --engine ray`` on a local Ray instance (1 CPU, one actor): the same tables as the local engine,
edge scores over batches of prompts (two batches here) and the resamples on the actor (issue 24's
scale-out; commands/circuit/ray.py through evaluate's Ray engine), under patch and mean ablation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from streetlamp.cli import main
from streetlamp.models.tiny import save_tiny
from tests.commands.test_circuit_cli import PAIRS
from tests.helpers.peers import require_module


def _tables(out: Path) -> dict[str, pd.DataFrame]:
    t = {n: pd.read_csv(out / n) for n in ("faithfulness.csv", "areas.csv", "stability.csv") if (out / n).exists()}
    return {**t, "edges.parquet": pd.read_parquet(out / "edges.parquet")}


def test_ray_gives_the_local_tables(tmp_path: Path) -> None:
    ray = require_module("ray")  # installed by the test extra (pyproject); .ci/run requires it
    model = save_tiny("llama", tmp_path / "llama", seed=1)
    (tmp_path / "pairs.csv").write_text(PAIRS)
    base = ["circuit", "--model", str(model), "--task", str(tmp_path / "pairs.csv"), "--sizes", "0.05,0.2,1"]
    base += ["--bootstrap", "20", "--random", "1", "--paths", "0", "--seed", "2", "--batch-size", "30"]
    runs = {
        "patch": ["--methods", "eap,eap-ig", "--steps", "2", "--resample", "prompts", "--resamples", "3"],
        "mean": ["--methods", "eap", "--ablation", "mean"],
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the actor runs one thread: the same kernels, the same floats
    try:
        for k, extra in runs.items():
            assert main([*base, *extra, "--out", str(tmp_path / f"local-{k}")]) == 0
    finally:
        torch.set_num_threads(threads)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        for k, extra in runs.items():
            assert main([*base, *extra, "--out", str(tmp_path / f"ray-{k}"), "--engine", "ray"]) == 0
    finally:
        ray.shutdown()
    for k in runs:
        local, far = _tables(tmp_path / f"local-{k}"), _tables(tmp_path / f"ray-{k}")
        assert set(local) == set(far) and ("stability.csv" in local) == (k == "patch")
        for name, a in local.items():
            b = far[name]
            assert list(a.columns) == list(b.columns) and len(a) == len(b) > 0, name
            num = a.select_dtypes("number").columns
            pd.testing.assert_frame_equal(a.drop(columns=num), b.drop(columns=num))
            x, y = a[num].to_numpy(np.float64), b[num].to_numpy(np.float64)
            assert np.array_equal(np.isnan(x), np.isnan(y)), name
            ok = ~np.isnan(x)
            # the same batches, padding and kernels on one thread: equal to float32 rounding of the sums
            assert np.abs(x[ok] - y[ok]).max() <= 1e-6 * max(1.0, np.abs(x[ok]).max()), name
        e = local["edges.parquet"]
        assert np.abs(e["score"]).max() > 1e-3  # not a comparison of zeros
        mf = json.loads((tmp_path / f"ray-{k}" / "manifest.json").read_text())["parameters"]
        assert mf["engine"] == "ray" and mf["ray_sessions"] and mf["ray_sessions"][0]["name"] == "ray"
        # two batches of prompts: --batch-size 30 tokens holds two of these prompts
        assert len(mf["ray_sessions"][0]["chunks"]) == 2
        ml = json.loads((tmp_path / f"local-{k}" / "manifest.json").read_text())["parameters"]
        assert ml["engine"] == "local" and "ray_sessions" not in ml
        assert not (tmp_path / f".ray-{k}.resume").exists()


def test_ray_refuses_a_bad_workers_count(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "r"
    code = main(["circuit", "--task", "ioi", "--engine", "ray", "--workers", "0", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "--workers" in err and len(err.strip().splitlines()) == 1 and not out.exists()


class Interrupted(Exception):
    """Raised by the test in the driver, as a kill would stop the run."""


def test_ray_checkpoints_each_axis_and_resumes_only_the_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--engine ray`` checkpoints each (method, axis) of ``--resample`` as its actor returns it: a run
    stopped after the first axis's result is written resumes with only the second axis sent to the actors,
    and its stability.csv equals an uninterrupted local run's."""
    import streetlamp.commands.circuit.resume as R
    from streetlamp.commands.circuit.run import stability_stage

    ray = require_module("ray")
    model = save_tiny("llama", tmp_path / "llama", seed=1)
    (tmp_path / "pairs.csv").write_text(PAIRS)
    args = ["circuit", "--model", str(model), "--task", str(tmp_path / "pairs.csv"), "--sizes", "0.05,1"]
    args += ["--bootstrap", "10", "--random", "1", "--paths", "0", "--seed", "2", "--methods", "eap"]
    args += ["--resample", "prompts,corrupt", "--resamples", "3"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the actor runs one thread: the same kernels, the same floats
    try:
        assert main([*args, "--out", str(tmp_path / "local")]) == 0
    finally:
        torch.set_num_threads(threads)
    real_put, written = R.Checkpoint.put, []

    def put(self, chunk, record, arrays):
        if record.get("stage") == "stability":
            written.append(chunk)
            if stop and len(written) == 2:
                raise Interrupted
        return real_put(self, chunk, record, arrays)

    monkeypatch.setattr(R.Checkpoint, "put", put)
    out = tmp_path / "ray"
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        stop = True
        with pytest.raises(Interrupted):
            main([*args, "--engine", "ray", "--out", str(out)])
        first, second = stability_stage(0, "prompts"), stability_stage(0, "corrupt")
        assert written == [first, second] and not out.exists()
        written.clear()
        stop = False
        assert main([*args, "--engine", "ray", "--out", str(out)]) == 0
    finally:
        ray.shutdown()
    assert written == [second]  # only the unfinished axis was computed, on an actor
    sessions = json.loads((out / "manifest.json").read_text())["parameters"]["ray_sessions"]
    assert sessions[-1]["chunks"] == [second]
    a, b = pd.read_csv(tmp_path / "local" / "stability.csv"), pd.read_csv(out / "stability.csv")
    assert list(a.columns) == list(b.columns) and len(a) == len(b) == 4
    num = a.select_dtypes("number").columns
    pd.testing.assert_frame_equal(a.drop(columns=num), b.drop(columns=num))
    x, y = a[num].to_numpy(np.float64), b[num].to_numpy(np.float64)
    ok = ~np.isnan(x)
    assert np.array_equal(np.isnan(x), np.isnan(y)) and ok.any()
    # the same (method, axis) chunk on one thread: equal to float32 rounding of the sums
    assert np.abs(x[ok] - y[ok]).max() <= 1e-6 * max(1.0, np.abs(x[ok]).max())
