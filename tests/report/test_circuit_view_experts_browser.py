"""The circuit view on a ``circuit --expert-nodes`` run of the tiny Qwen2-MoE (4 routed experts and a shared
expert per layer), in a real browser: the drawn edges are the stored circuit, every expert node has a place of
its own below the heads (none on a head's), an edge into a router ends left of its layer's experts, and clicking
an edge into an expert or a router shows its stored scores and no attention grid (an expert attends to nothing)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.browser import Page, require_browser

require_browser()

from streetlamp.cli import main  # noqa: E402
from streetlamp.models.tiny import save_tiny  # noqa: E402
from streetlamp.store.files import load_arrays  # noqa: E402
from tests.commands.test_circuit_cli import PAIRS  # noqa: E402
from tests.report.test_circuit_view_browser import check_drawn, drawn  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = tmp_path_factory.mktemp("circuit_view_experts")
    (t / "pairs.csv").write_text(PAIRS)
    ck = save_tiny("qwen2_moe", t / "qwen2_moe", seed=1)
    out = t / "run"
    args = ["circuit", "--model", str(ck), "--task", str(t / "pairs.csv"), "--out", str(out), "--methods", "eap"]
    args += ["--expert-nodes", "--sizes", "0.1,0.5,1.0", "--size", "0.5", "--bootstrap", "20", "--paths", "0"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(args) == 0
    return out


def test_expert_nodes_are_drawn_in_their_own_places(run: Path, browser: Any) -> None:
    a = load_arrays(run / "arrays.safetensors")
    cv = json.loads((run / "manifest.json").read_text())["circuit_view"]
    assert "L1.SE" in cv["writers"] and "L0.E3" in cv["writers"]
    ctx = browser.new_context(viewport={"width": 1300, "height": 1000})
    page = Page(ctx.new_page())
    try:
        page.open(run / "report.html")
        p = page.page
        p.wait_for_selector("#circuit-graph")
        s = drawn(p)
        check_drawn(s, a, "eap", s["size"])
        lay = p.evaluate("() => window.streetlamp.circuit.layout")
        pos = {w: tuple(xy) for w, xy in zip(cv["writers"], lay["pos"])}
        assert len(set(pos.values())) == len(pos)  # every node its own place
        h = lay["Hh"]
        for w, (x, y) in pos.items():
            assert 0 < x < lay["W"] and 0 < y < h, w
            if ".E" in w or w.endswith(".SE"):  # below every head of its layer
                l = w.split(".")[0]
                assert y > max(pos[f"{l}.H{k}"][1] for k in range(cv["n_heads"])), w
        for i, (_node, inp, _layer, owners, _) in enumerate(cv["readers"]):
            if inp == "router":
                tx, ty = lay["target"][i]
                ys = [pos[cv["writers"][o]][1] for o in owners]
                assert tx < pos[cv["writers"][owners[0]]][0] and min(ys) <= ty <= max(ys)
        # an edge into an expert's or a router's input: its stored score, no attention grid
        e = next(x for x in s["edges"] if cv["readers"][x[0]][1] in ("router", "mlp"))
        r, w = int(e[0]), int(e[1])
        p.evaluate("([r, w]) => window.streetlamp.circuit.show(r, w)", [r, w])
        kv = p.locator("#circuit-edge-kv")
        assert (int(kv.get_attribute("data-reader")), int(kv.get_attribute("data-writer"))) == (r, w)
        assert float(kv.get_attribute("data-score")) == pytest.approx(a["scores.eap"][r, w], rel=1e-6)
        assert p.locator("#circuit-edge canvas[id^='circuit-att-']").count() == 0
        assert np.isfinite(a["scores.eap"][r, w])
        p.locator("#circuit-graph").screenshot(path=str(run / "graph.png"))
        page.clean()
    finally:
        ctx.close()
