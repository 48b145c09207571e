"""The statistics the report's page computes in JavaScript (viewer.js: ``rankDesc`` for the rank columns
of the "light versus use" table, ``kendallTauB`` for its taus, ``jsd`` for the head disagreement), run by
Node.js on random vectors with ties and compared with scipy. The functions are read from the shipped
viewer.js itself (the block between its "statistics shown" comment and ``SL.stats``), so the page's own
code is what is tested. Without Node.js the test skips; with STREETLAMP_REQUIRE_BROWSER=1 (.ci/run) it
fails instead, as the browser tests do. tests/report/test_report_ranks_browser.py reads the cells themselves."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from importlib import resources

import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon
from scipy.stats import kendalltau, rankdata

NODE = shutil.which("node") or shutil.which("nodejs")
if NODE is None:
    if os.environ.get("STREETLAMP_REQUIRE_BROWSER") == "1":
        pytest.fail("the report's JavaScript statistics need Node.js (STREETLAMP_REQUIRE_BROWSER=1)", pytrace=False)
    pytest.skip("no node on PATH: the report's JavaScript statistics are not run", allow_module_level=True)


def stats_block() -> str:
    src = (resources.files("streetlamp.report.viewer") / "static" / "viewer.js").read_text(encoding="utf-8")
    start = src.index("// ---------- statistics shown")
    stop = src.index("SL.stats =", start)
    return src[start:stop]


def run_js(calls: list[tuple[str, list]]) -> list:
    script = stats_block() + (
        "\nconst calls = JSON.parse(process.argv[1]);"
        "\nconst fns = { rankDesc, kendallTauB, jsd };"
        "\nconsole.log(JSON.stringify(calls.map(([f, args]) => { const v = fns[f](...args);"
        " return Array.isArray(v) ? v : (Number.isNaN(v) ? null : v); })));"
    )
    out = subprocess.run(
        [NODE, "-e", script, json.dumps(calls)], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(out.stdout)


def vectors() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    out = []
    for n in (2, 3, 7, 20):
        for ties in (False, True):
            x, y = rng.normal(size=n), rng.normal(size=n)
            if ties:  # a few values shared: ties share their mean rank
                x, y = np.round(x * 2) / 2, np.round(y * 2) / 2
            out.append((x, y))
    return out


def test_rank_desc_is_scipys_average_rank_of_the_negated_values() -> None:
    vs = vectors()
    got = run_js([("rankDesc", [x.tolist()]) for x, _ in vs])
    for (x, _), r in zip(vs, got):
        np.testing.assert_array_equal(r, rankdata(-x, method="average"))
    # not vacuous: ties occur, and ascending ranks (or ranks without ties shared) would differ
    assert any(len(set(x)) < len(x) for x, _ in vs)
    assert any(not np.array_equal(rankdata(-x, method="average"), rankdata(-x, method="ordinal")) for x, _ in vs)


def test_kendall_tau_b_and_jsd_are_scipys() -> None:
    vs = vectors()
    got = run_js([("kendallTauB", [x.tolist(), y.tolist()]) for x, y in vs])
    for (x, y), t in zip(vs, got):
        want = kendalltau(x, y).statistic
        assert (t is None and np.isnan(want)) or abs(t - want) <= 1e-12  # integer pair counts: float64 exact
    rng = np.random.default_rng(1)
    ps = [rng.dirichlet(np.ones(6)) for _ in range(4)] + [np.array([1.0, 0, 0]), np.array([0, 0.5, 0.5])]
    pairs = [(ps[0], ps[1]), (ps[2], ps[3]), (ps[4], ps[5]), (ps[4], ps[4])]
    got = run_js([("jsd", [p.tolist(), q.tolist()]) for p, q in pairs])
    for (p, q), d in zip(pairs, got):
        assert abs(d - jensenshannon(p, q, base=2) ** 2) <= 1e-12
    assert got[2] == pytest.approx(1.0) and got[3] == 0  # disjoint supports, identical rows
