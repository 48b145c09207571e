"""The circuit view (``static/circuit.js``) in a real browser, on a ``streetlamp circuit`` run of a tiny
grouped-query Llama: the edges drawn are the stored circuit at the slider's size (the same edges, the same
scores), the faithfulness shown is the stored f and interval (= faithfulness.csv), the slider changes
both, clicking an edge shows its stored exact patching effect, inclusion frequency and the receiving
heads' stored attention, and the method selector switches to the other method's stored circuit."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests.helpers.browser import Page, require_browser

require_browser()

from streetlamp.cli import main  # noqa: E402
from streetlamp.models.tiny import save_tiny  # noqa: E402
from streetlamp.store.files import load_arrays  # noqa: E402
from tests.commands.test_circuit_cli import PAIRS  # noqa: E402

SIZES = [0.02, 0.1, 0.5, 1.0]
F32 = 1e-6  # scores and f are stored as float64 and travel as float32: relative rounding 2^-24


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = tmp_path_factory.mktemp("circuit_view")
    (t / "pairs.csv").write_text(PAIRS)
    ck = save_tiny("llama", t / "llama", seed=1)
    out = t / "run"
    args = ["circuit", "--model", str(ck), "--task", str(t / "pairs.csv"), "--out", str(out), "--methods", "eap,exact"]
    args += ["--sizes", ",".join(map(str, SIZES)), "--size", "0.1", "--bootstrap", "20", "--paths", "3", "--seed", "1"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(args) == 0
    assert (out / "report.html").is_file()
    return out


def drawn(p: Any) -> dict:
    return p.evaluate("""() => { const c = window.streetlamp.circuit;
        return {method: c.method, size: c.size, f: c.f, lo: c.lo, hi: c.hi,
                edges: c.drawn.map(e => [e.reader, e.writer, e.score])}; }""")


def check_drawn(state: dict, a: dict, method: str, k: int) -> None:
    mask = a[f"masks.{method}"][k].astype(bool)
    got = {(r, w): s for r, w, s in state["edges"]}
    want = set(zip(*np.nonzero(mask)))
    assert set(got) == {(int(r), int(w)) for r, w in want} and len(state["edges"]) == int(mask.sum())
    sc = a[f"scores.{method}"]
    for (r, w), s in got.items():
        assert s == pytest.approx(sc[r, w], rel=F32, abs=1e-30)
    f = a[f"faithfulness.{method}"][k]
    assert [state["f"], state["lo"], state["hi"]] == pytest.approx(list(f), rel=F32)


def test_drawn_circuit_and_faithfulness_are_the_stored_arrays(run: Path, browser: Any) -> None:
    a = load_arrays(run / "arrays.safetensors")
    ft = pd.read_csv(run / "faithfulness.csv")
    m = json.loads((run / "manifest.json").read_text())
    cv = m["circuit_view"]
    ctx = browser.new_context(viewport={"width": 1300, "height": 900})
    page = Page(ctx.new_page())
    try:
        page.open(run / "report.html")
        p = page.page
        p.wait_for_selector("#circuit-graph")
        s = drawn(p)
        assert s["method"] == "eap" and SIZES[s["size"]] == 0.1  # opens at the chosen size
        check_drawn(s, a, "eap", s["size"])
        row = ft[(ft["method"] == "eap") & np.isclose(ft["size_fraction"], 0.1)].iloc[0]
        assert len(s["edges"]) == row["n_edges"] and s["f"] == pytest.approx(row["faithfulness"], rel=F32)
        text = p.text_content("#circuit-f")
        assert f"{int(row['n_edges'])} edges" in text and f"f = {row['faithfulness']:.3f}" in text
        assert f"[{row['ci_low']:.3f}, {row['ci_high']:.3f}]" in text
        # the slider redraws: fewer edges at the smallest size, another f
        counts = {}
        for k in range(len(SIZES)):
            p.evaluate(
                "k => { const s = document.getElementById('circuit-size'); s.value = k; "
                "s.dispatchEvent(new Event('input')); }",
                k,
            )
            sk = drawn(p)
            assert sk["size"] == k
            check_drawn(sk, a, "eap", k)
            assert p.get_attribute("#circuit-graph", "data-edges") == str(len(sk["edges"]))
            assert float(p.get_attribute("#circuit-f", "data-f")) == pytest.approx(a["faithfulness.eap"][k, 0], rel=F32)
            counts[k] = (len(sk["edges"]), sk["f"])
        assert counts[0][0] < counts[1][0] < counts[3][0] and counts[0][1] != counts[3][1]
        assert counts[3][1] == pytest.approx(1.0, abs=1e-3)  # the whole graph is the model
        # click an edge row: its stored exact effect (the exact method ran: every edge), inclusion, attention
        p.click("#circuit-edges tbody tr:nth-child(1)")
        kv = p.locator("#circuit-edge-kv")
        r, w = int(kv.get_attribute("data-reader")), int(kv.get_attribute("data-writer"))
        assert float(kv.get_attribute("data-exact")) == pytest.approx(a["exact"][r, w], rel=F32)
        assert float(kv.get_attribute("data-inclusion")) == pytest.approx(a["inclusion.eap"][r, w], abs=1e-4)
        assert float(kv.get_attribute("data-score")) == pytest.approx(a["scores.eap"][r, w], rel=F32)
        assert np.isfinite(a["exact"][r, w]) and abs(a["exact"][r, w]) > 1e-5
        node, inp, layer, owners, group = cv["readers"][r]
        assert node == ",".join(cv["writers"][o] for o in owners) if group else ".KV" not in node
        grids = p.eval_on_selector_all("#circuit-edge canvas[id^='circuit-att-']", "cs => cs.map(c => c.id)")
        if inp in ("q", "k", "v"):
            heads = [int(cv["writers"][o].split(".H")[1]) for o in owners]
            assert grids == [f"circuit-att-L{layer}H{h}" for h in heads]
        else:
            assert grids == []
        # click in the graph, on the middle of the largest drawn edge: that edge (or one crossing there) opens
        box = p.locator("#circuit-graph").bounding_box()
        e = p.evaluate("() => { const d = window.streetlamp.circuit.drawn; return d[d.length - 1]; }")
        p.mouse.click(box["x"] + (e["x1"] + e["x2"]) / 2, box["y"] + (e["y1"] + e["y2"]) / 2)
        r2, w2 = int(kv.get_attribute("data-reader")), int(kv.get_attribute("data-writer"))
        assert (r2, w2) in {(x[0], x[1]) for x in drawn(p)["edges"]}
        assert float(p.locator("#circuit-edge-kv").get_attribute("data-exact")) == pytest.approx(
            a["exact"][r2, w2], rel=F32
        )
        # the other method's stored circuit
        p.select_option("#circuit-method", "exact")
        se = drawn(p)
        assert se["method"] == "exact"
        check_drawn(se, a, "exact", se["size"])
        # the curves and the paths table are there, every figure exports
        assert p.locator("#circuit-curves").count() == 1 and p.locator("#circuit-paths tbody tr").count() == 12
        assert p.locator("button", has_text="SVG").count() >= 2 and p.locator("button", has_text="PNG").count() >= 2
        page.clean()
    finally:
        ctx.close()
