"""``atlas --engine ray`` on a local Ray instance (one CPU): the same atlas as the local engine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from streetlamp.commands.atlas import AtlasSettings
from streetlamp.commands.atlas.run import run_atlas
from streetlamp.models.loading import load
from streetlamp.models.tiny import WORDS, save_tiny
from streetlamp.settings import RunOptions
from tests.helpers.peers import require_module


def test_ray_atlas_matches_local(tmp_path: Path) -> None:
    ray = require_module("ray")  # installed by the test extra (pyproject); .ci/run requires it
    model = save_tiny("llama", tmp_path / "tiny-llama", seed=1)
    rng = np.random.default_rng(0)
    data = tmp_path / "d.txt"
    data.write_text("\n".join(" ".join(rng.choice(WORDS, int(rng.integers(3, 9)))) for _ in range(8)) + "\n")
    kw = dict(data=str(data), exact_share=0.3, exact_top=1, chunk_size=3, seed=1)
    adapter = load(model)
    local = run_atlas(adapter, AtlasSettings(**kw), tmp_path / "local")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        remote = run_atlas(
            adapter, AtlasSettings(engine="ray", workers=1, **kw), tmp_path / "ray", RunOptions(model=str(model))
        )
    finally:
        ray.shutdown()
    assert local.computed == remote.computed == {"stats": 3, "estimate": 3, "exact": 3}
    a, b = (pd.read_parquet(r.out / "atlas.parquet") for r in (local, remote))
    assert len(a) == 8 * 2 * 4 and a.exact.sum() >= round(0.3 * len(a))
    # the actor runs the same code on the same chunks; only the float32 rounding of its thread count may differ
    pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-5, atol=1e-7)
    assert a.kl_explained.max() > 1e3 * 1e-7 and a.dlogp.abs().max() > 1e3 * 1e-7  # far above the tolerance
    pd.testing.assert_frame_equal(
        pd.read_csv(local.out / "heads.csv"), pd.read_csv(remote.out / "heads.csv"), rtol=1e-5
    )
    engines = json.loads((remote.out / "manifest.json").read_text())["engine"]  # one Ray session per pass
    assert [e["chunks"] for e in engines] == [[0, 1, 2]] * 3
    assert all(e["name"] == "ray" and e["workers"] == 1 and e["cluster_resources"]["CPU"] == 1.0 for e in engines)
    assert "engine" not in json.loads((local.out / "manifest.json").read_text())
