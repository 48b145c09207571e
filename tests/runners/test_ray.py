"""--engine ray on a local Ray instance (2 CPUs): the same rows as the local engine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from streetlamp.commands.evaluate.run import evaluate
from streetlamp.models.tiny import save_tiny
from streetlamp.settings import RunOptions
from streetlamp.store import read_metrics
from tests.helpers.peers import require_module
from tests.store.test_store import cheap_settings, write_data


def test_ray_matches_local(tmp_path: Path) -> None:
    ray = require_module("ray")  # installed by the test extra (pyproject); .ci/run requires it
    model = save_tiny("bert", tmp_path / "tiny-bert", seed=2)
    data = write_data(tmp_path / "d.csv", 6, seed=3)
    local = evaluate(None, cheap_settings(data, chunk_size=2), tmp_path / "local", RunOptions(model=str(model)))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = evaluate(
            None, cheap_settings(data, chunk_size=2, engine="ray", workers=2), tmp_path / "ray", RunOptions(str(model))
        )
    finally:
        ray.shutdown()
    assert remote.n_computed_chunks == 3
    a = read_metrics(local.out).sort_values(["example_id", "method", "metric"]).reset_index(drop=True)
    b = read_metrics(remote.out).sort_values(["example_id", "method", "metric"]).reset_index(drop=True)
    assert len(a) > 100 and a[["example_id", "method", "metric"]].equals(b[["example_id", "method", "metric"]])
    np.testing.assert_allclose(a.value, b.value, rtol=1e-5, atol=1e-6, equal_nan=True)
    # the manifest says what ran the chunks: one Ray session, its actors, cluster and chunks; local: no engine
    m = json.loads((remote.out / "manifest.json").read_text())
    assert "engine" not in json.loads((local.out / "manifest.json").read_text())
    (e,) = m["engine"]
    assert e["name"] == "ray" and e["address"] == "local instance" and e["workers"] == 2 and e["device"] == "cpu"
    assert e["chunks"] == [0, 1, 2] and e["nodes"] == 1 and e["cluster_resources"]["CPU"] == 2.0
    assert e["ray_version"] == ray.__version__ and isinstance(e["gcs_address"], str) and ":" in e["gcs_address"]
