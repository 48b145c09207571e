"""The lens view (``static/lens.js``) in a real browser, on a ``streetlamp lens --check-variant both`` run of a
tiny Llama with a random tuned lens (so that layers disagree): every number drawn is the stored CSV's and
arrays', the tokens are the stored labels rendered as text (a token that looks like markup stays text),
every disagreeing layer (and only those) is marked, the variant selector switches to the baseline check,
and the figures export; a run without --check shows the readout and says how to check it."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from tests.helpers.browser import Page, require_browser

require_browser()

from streetlamp.cli import main  # noqa: E402
from streetlamp.interventions.lenses.base import Lens  # noqa: E402
from streetlamp.interventions.lenses.store import save_lens  # noqa: E402
from streetlamp.models.loading import load  # noqa: E402
from streetlamp.models.tiny import save_tiny  # noqa: E402
from streetlamp.report.viewer import write_report  # noqa: E402
from streetlamp.store.files import load_arrays  # noqa: E402

TEXT = "when mary and john went to the store , john gave a drink to"
EVIL = "<img src=x onerror=alert(1)><b>"
F32 = 2e-6  # stored float64 values travel as float32 (relative 2^-24), shown with data-value at full float32


@pytest.fixture()
def page(browser: Any) -> Iterator[Page]:
    ctx = browser.new_context(viewport={"width": 1300, "height": 1000})
    pg = Page(ctx.new_page())
    yield pg
    ctx.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    t = tmp_path_factory.mktemp("lens_view")
    ck = save_tiny("llama", t / "llama", seed=1, layers=3)
    a = load(ck)
    g = torch.Generator().manual_seed(3)
    d, L = a.d_model, a.n_layers
    A = [
        torch.eye(d, dtype=torch.float64) + 0.8 * torch.randn(d, d, generator=g, dtype=torch.float64) for _ in range(L)
    ]
    b = [2 * torch.randn(d, generator=g, dtype=torch.float64) for _ in range(L)]
    lens = Lens("tuned", L, d, list(A), list(b), mean=torch.randn(L + 1, d, generator=g, dtype=torch.float64))
    (t / "lens").mkdir()
    save_lens(t / "lens", lens, a, {"how": "random, for the view test"})
    base = ["lens", TEXT, "--model", str(ck), "--types-length", "4", "--types-seqs", "1"]
    out = {"checked": t / "checked", "plain": t / "plain"}
    with contextlib.redirect_stdout(io.StringIO()):
        args = ["--lens", f"tuned:{t / 'lens'}", "--check-variant", "both", "--baseline", "mean"]
        assert main(base + ["--out", str(out["checked"]), *args]) == 0
        assert main(base + ["--out", str(out["plain"])]) == 0
    m = json.loads((out["checked"] / "manifest.json").read_text())
    m["lens_view"]["lens_top"][1][0] = EVIL  # a token that looks like markup must stay text
    (out["checked"] / "manifest.json").write_text(json.dumps(m))
    write_report(out["checked"])
    return out


def rows_of(p: Any) -> dict:
    return p.evaluate("() => window.streetlamp.lensView")


def check_against_stored(state: dict, run: Path, variant: str) -> None:
    a = load_arrays(run / "arrays.safetensors")
    m = json.loads((run / "manifest.json").read_text())
    lv = m["lens_view"]
    if variant == "patch":
        csv = pd.read_csv(run / "lens_check.csv")
        kl, rl, ro, top_l, top_o = "kl_patched_lens", "rank_lens", "rank_patched", "lens_top", "patched_top"
    else:
        csv = pd.read_csv(run / "lens_check_baseline.csv")
        kl, rl, ro, top_l, top_o = "kl_model", "rank_lens", "rank_model", "lens_top", "model_top"
    rows = state["rows"]
    assert state["variant"] == variant and len(rows) == len(csv) == 4
    pos = lv["position"]
    for r, (_, want) in zip(rows, csv.iterrows(), strict=True):
        assert r["layer"] == str(want["layer"])
        assert r["kl"] == pytest.approx(want[kl], rel=F32, abs=1e-30)
        assert r["rank_lens"] == want[rl] and r["rank_outcome"] == want[ro]
        assert r["match"] == bool(want["top1_match"]) and r["disagrees"] == bool(want["disagrees"])
        assert r["check_lens_top"] == want[top_l] and r["outcome_top"] == want[top_o]
        assert r["lens_top"] == lv["lens_top"][r["row"]]
        np.testing.assert_allclose(r["lens_top_prob"], a["lens.top_prob"][r["row"], pos, :5], rtol=F32)
        assert r["p_target"] == pytest.approx(float(a["lens.prob"][r["row"], pos]), rel=F32)
        assert r["rank_target"] == a["lens.rank"][r["row"], pos]
        if variant == "baseline":
            assert r["kl_lens"] == pytest.approx(want["kl_lens"], rel=F32, abs=1e-30)
    flagged = [str(x) for x in csv.loc[csv["disagrees"], "layer"]]
    assert state["disagreeing"] == flagged


def check_table(p: Any, run: Path, variant: str) -> None:
    """The drawn table: one row per layer, marked exactly where the CSV says the lens disagrees, its numbers the CSV's."""
    csv = pd.read_csv(run / ("lens_check.csv" if variant == "patch" else "lens_check_baseline.csv"))
    trs = p.locator("#lens-table tbody tr")
    assert trs.count() == len(csv)
    kl = "kl_patched_lens" if variant == "patch" else "kl_model"
    for i, (_, want) in enumerate(csv.iterrows()):
        tr = trs.nth(i)
        assert tr.get_attribute("data-layer") == str(want["layer"])
        assert tr.get_attribute("data-disagrees") == ("1" if want["disagrees"] else "0")
        assert tr.locator("td.mark").text_content() == ("✗ DISAGREES" if want["disagrees"] else "✓ agrees")
        values = [float(v) for v in tr.locator("td[data-value]").evaluate_all("es => es.map(e => e.dataset.value)")]
        assert values[2] == pytest.approx(want[kl], rel=F32, abs=1e-30)  # p(target), rank(readout), KL, ...
        assert values[-2:] == [want["rank_lens"], want["rank_model" if variant == "baseline" else "rank_patched"]]


def test_lens_view_draws_the_stored_check_and_marks_disagreeing_layers(runs: dict[str, Path], page: Page) -> None:
    run = runs["checked"]
    page.open(run / "report.html")
    p = page.page
    p.wait_for_selector("#lens-strip[data-variant]")  # drawn (the attribute is set once its rows are)
    state = rows_of(p)
    check_against_stored(state, run, "patch")
    check_table(p, run, "patch")
    csv = pd.read_csv(run / "lens_check.csv")
    n_bad = int(csv["disagrees"].sum())
    assert 0 < n_bad < len(csv)  # the random lens disagrees somewhere, and the last layer always agrees
    assert not bool(csv["disagrees"].iloc[-1])
    assert p.text_content("#lens-verdict").startswith(f"{n_bad} of {len(csv)} layers disagree")
    assert p.get_attribute("#lens-strip", "data-disagrees") == ",".join(state["disagreeing"])
    # the markup-looking token is text
    assert p.locator("#lens-table b, #lens-table img").count() == 0
    assert EVIL in p.locator("#lens-table tbody tr").nth(1).locator("td.lens-tokens").text_content()
    # the baseline variant
    p.select_option("#lens-variant", "baseline")
    p.wait_for_selector("#lens-strip[data-variant='baseline']")  # a selector: the CSP forbids wait_for_function
    state = rows_of(p)
    check_against_stored(state, run, "baseline")
    check_table(p, run, "baseline")
    assert "(mean)" in p.text_content("#lens-how")
    assert p.locator("#lens-kl").count() == 1 and p.locator("#lens-logprob").count() == 1
    assert p.locator("button", has_text="SVG").count() >= 3 and p.locator("button", has_text="PNG").count() >= 3
    with p.expect_download() as dl:
        p.locator("div.panel", has=p.locator("#lens-strip")).locator("button", has_text="PNG").first.click()
    assert dl.value.suggested_filename == "lens_layers.png"
    assert p.locator("#table-0").count() == 1  # the generic panels follow (the lens table of the manifest)
    page.clean()


def test_lens_view_without_a_check(runs: dict[str, Path], page: Page) -> None:
    run = runs["plain"]
    page.open(run / "report.html")
    p = page.page
    state = rows_of(p)
    assert state["variant"] is None and state["disagreeing"] == []
    a = load_arrays(run / "arrays.safetensors")
    m = json.loads((run / "manifest.json").read_text())
    for r in state["rows"]:
        assert r["lens_top"] == m["lens_view"]["lens_top"][r["row"]] and "kl" not in r
        np.testing.assert_allclose(r["lens_top_prob"], a["lens.top_prob"][r["row"], -1, :5], rtol=F32)
    assert "--check" in p.text_content("#lens-summary")
    assert p.locator("#lens-table tbody tr[data-disagrees]").count() == 0
    page.clean()
