"""``cite-bench --engine ray`` on a local Ray instance (one CPU, one actor): a run started on the local engine
and finished on Ray gives the numbers of a run made wholly on the local engine (the same chunk function,
commands/cite/run.bench_chunk, on the actor), and the store records the Ray session's chunks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from streetlamp.cli import main
from streetlamp.methods import citation as C
from streetlamp.models.loading import load
from streetlamp.models.tiny import save_tiny
from tests.commands.test_cite import SOURCES
from tests.helpers.peers import require_module


def _bench(model: Path, path: Path) -> None:
    """Four questions whose expected answers are the tiny model's own greedy ones (the last one wrong)."""
    ad = load(model).to("cpu")
    rows = []
    qs = ["what is good", "who went to the store", "what is the capital of france", "who loved the plot"]
    for i, q in enumerate(qs):
        lay = C.layout(ad, SOURCES[:5], q)
        greedy = ad.tokenizer.decode(C.generate_answer(ad, lay, 1)).strip() if i < 3 else "zzz never"
        rows.append({"sources": SOURCES[:5], "question": q, "answer": greedy, "planted": [i], "kind": f"k{i % 2}"})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def _metrics(out: Path) -> pd.DataFrame:
    m = pd.read_parquet(out / "metrics")
    m = m[m.metric != "seconds"]  # wall time differs; every other number is the computation's
    return m.sort_values(["example_id", "method", "metric"]).reset_index(drop=True)


def test_ray_finishes_a_local_run_with_the_local_numbers(tmp_path: Path) -> None:
    ray = require_module("ray")  # installed by the test extra (pyproject); .ci/run requires it
    model = save_tiny("llama", tmp_path / "llama", seed=1)
    data = tmp_path / "b.jsonl"
    _bench(model, data)
    base = ["cite-bench", "--model", str(model), "--data", str(data), "--chunk-size", "1", "--seed", "3"]
    base += ["--methods", "attention,attntrace,gradient_x_input,contextcite,leave_one_out"]
    base += ["--ablations", "8", "--held-out", "4", "--attntrace-samples", "3", "--max-answer-tokens", "2"]
    local, mixed = tmp_path / "local", tmp_path / "mixed"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the actor runs one thread: the same kernels, the same floats
    try:
        assert main([*base, "--out", str(local)]) == 0
        assert main([*base, "--out", str(mixed), "--limit", "2"]) == 0  # chunks 0 and 1 here
    finally:
        torch.set_num_threads(threads)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        assert main([*base, "--out", str(mixed), "--engine", "ray", "--workers", "1"]) == 0  # resumed: 2 and 3
        before = sorted(p.stat().st_mtime_ns for p in (mixed / "metrics").glob("*.parquet"))
        assert main([*base, "--out", str(mixed), "--engine", "ray"]) == 0  # every chunk done: nothing on Ray
        assert sorted(p.stat().st_mtime_ns for p in (mixed / "metrics").glob("*.parquet")) == before
    finally:
        ray.shutdown()
    a, b = _metrics(local), _metrics(mixed)
    pd.testing.assert_frame_equal(a.drop(columns="value"), b.drop(columns="value"))
    x, y = a.value.to_numpy(np.float64), b.value.to_numpy(np.float64)
    assert np.array_equal(np.isnan(x), np.isnan(y))
    ok = ~np.isnan(x)
    # the same chunks, kernels and seeds on one thread: equal to float32 rounding of the log-probabilities
    assert np.abs(x[ok] - y[ok]).max() <= 1e-5 * max(1.0, np.abs(x[ok]).max())
    assert a[a.metric == "correct"].value.tolist() == [1.0, 1.0, 1.0, 0.0]
    drops = a[a.metric.str.startswith("drop_")].value.abs()
    assert drops.max() > 1e-2  # not a comparison of zeros
    recs = {
        str(out): [json.loads(x) for p in sorted((out / "records").glob("*.jsonl")) for x in p.read_text().splitlines()]
        for out in (local, mixed)
    }
    ra, rb = recs[str(local)], recs[str(mixed)]
    assert [r["id"] for r in ra] == [r["id"] for r in rb] and [r["correct"] for r in ra] == [r["correct"] for r in rb]
    for p, q in zip(ra, rb):
        for m, v in p.get("scores", {}).items():
            np.testing.assert_allclose(q["scores"][m], v, rtol=1e-5, atol=1e-7)
    ta, tb = (pd.read_csv(out / "recall.csv") for out in (local, mixed))
    ta, tb = (t[t.metric != "seconds"].reset_index(drop=True) for t in (ta, tb))
    pd.testing.assert_frame_equal(ta, tb, rtol=1e-5, atol=1e-7)
    engines = json.loads((mixed / "manifest.json").read_text())["engine"]
    assert [e["chunks"] for e in engines] == [[2, 3]]  # one Ray session, the chunks the local run left
    assert engines[0]["name"] == "ray" and engines[0]["workers"] == 1 and engines[0]["cluster_resources"]["CPU"] == 1
    assert "engine" not in json.loads((local / "manifest.json").read_text())


def test_ray_needs_a_model_name(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    require_module("ray")
    from streetlamp.commands.cite import CiteBenchSettings
    from streetlamp.commands.cite.run import run_bench
    from streetlamp.errors import StreetlampError

    model = load(save_tiny("llama", tmp_path / "llama", seed=1))
    with pytest.raises(StreetlampError, match="give --model NAME"):
        run_bench(model, CiteBenchSettings(engine="ray"), tmp_path / "r", None)
    assert not (tmp_path / "r").exists()
