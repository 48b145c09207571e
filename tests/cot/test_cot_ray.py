"""``cot --engine ray`` on a local Ray instance (2 CPUs): the same records and metric rows as the local
engine (evaluate's Ray engine, tests/runners/test_ray.py, with cot's chunk function); resumption; refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from streetlamp.cli import main
from streetlamp.store import read_metrics
from tests.helpers.cot_helpers import RuleModel, save_tiny_lm, serve, write_questions
from tests.helpers.peers import require_module


def _records(out: Path) -> list[dict]:
    return [json.loads(l) for p in sorted((out / "records").glob("*.jsonl")) for l in p.read_text().splitlines()]


def _same(a: Any, b: Any, where: str = "") -> None:
    """Equal JSON trees; floats to 1e-9 relative (both sides run one thread of the same kernels)."""
    if isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (a != a and b != b), where
    elif isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def test_ray_matches_local_and_resumes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ray = require_module("ray")  # installed by the test extra (pyproject); .ci/run requires it
    model = save_tiny_lm(tmp_path / "tiny-lm", seed=3)
    data = write_questions(tmp_path / "q.jsonl", 4)
    judge = RuleModel("ok")  # the judge's settings travel to the actors with the chunks
    srv, jurl = serve(judge)
    args = [
        "cot",
        "--judge-endpoint",
        jurl,
        "--model",
        str(model),
        "--data",
        str(data),
        "--tests",
        "hint,biased_fewshot,early_answer,filler",
        "--hint-kinds",
        "sycophancy,metadata",
        "--max-new-tokens",
        "6",
        "--points",
        "2",
        "--shots",
        "2",
        "--out",
    ]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the actors run one thread each: the same kernels, the same floats
    try:
        assert main([*args, str(tmp_path / "local")]) == 0
    finally:
        torch.set_num_threads(threads)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = [*args, str(tmp_path / "ray"), "--engine", "ray", "--workers", "2"]
        capsys.readouterr()
        assert main(remote) == 0
        out, err = capsys.readouterr()
        assert "4 chunks computed now" in out and "Traceback" not in err
        assert main(remote) == 0  # rerun: nothing recomputed, no actor started
        assert "0 chunks computed now" in capsys.readouterr().out
    finally:
        ray.shutdown()
        srv.shutdown()
    local, far = _records(tmp_path / "local"), _records(tmp_path / "ray")
    assert [r["id"] for r in far] == ["q0", "q1", "q2", "q3"]
    _same(local, far)
    assert judge.calls == 2 * 4 * 4  # both runs: 2 hint kinds + 2 biases per question, judged once each
    assert all(r["hint"][k]["judge"]["raw"] for r in far for k in ("sycophancy", "metadata"))
    a = read_metrics(tmp_path / "local").sort_values(["example_id", "method", "metric"]).reset_index(drop=True)
    b = read_metrics(tmp_path / "ray").sort_values(["example_id", "method", "metric"]).reset_index(drop=True)
    assert len(a) > 20 and a.drop(columns="value").equals(b.drop(columns="value"))
    _same(a.value.tolist(), b.value.tolist())
    ma, mb = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("local", "ray"))
    assert ma["tables"] == mb["tables"]


def test_ray_with_endpoint_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    srv, url = serve(RuleModel("ok"))
    try:
        data = write_questions(tmp_path / "q.jsonl", 2)
        out = tmp_path / "r"
        code = main(
            ["cot", "--endpoint", url, "--data", str(data), "--tests", "hint", "--engine", "ray", "--out", str(out)]
        )
        _, err = capsys.readouterr()
    finally:
        srv.shutdown()
    assert code == 2 and "--engine ray fans a local --model out" in err and "Traceback" not in err
    assert not out.exists()  # refused before anything is written
