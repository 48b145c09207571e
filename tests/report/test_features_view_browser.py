"""The feature dashboard's view in a real browser (Chromium from file://), against the run folder's tables and
arrays: the token strip is the text's tokens, shaded by the stored activations; a token's panel lists
tokens.csv's features; a feature's dashboard shows density.csv's numbers, logits.csv's tokens and
contexts.parquet's contexts in order, each token as text (a token that looks like HTML stays text)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.helpers.browser import Page, require_browser

require_browser()

from streetlamp.cli import main  # noqa: E402
from streetlamp.models.tiny import WORDS, save_tiny  # noqa: E402
from streetlamp.store.files import load_arrays  # noqa: E402
from tests.helpers.dictionaries import tiny_transcoders  # noqa: E402

EVIL = "<img src=x onerror=alert(1)><b>"
TEXT = "when mary and john went to the store"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = tmp_path_factory.mktemp("features-view")
    rng = np.random.default_rng(1)
    lines = [" ".join(rng.choice(WORDS, int(rng.integers(3, 10)))) for _ in range(30)]
    (t / "c.csv").write_text("text\n" + "\n".join(lines) + "\n")
    out = t / "run"
    model = save_tiny("llama", t / "llama", seed=1)
    argv = ["features", TEXT, "--model", str(model), "--features", str(tiny_transcoders(t / "dict"))]
    assert main([*argv, "--data", str(t / "c.csv"), "--top", "4", "--contexts", "3", "--out", str(out)]) == 0
    from streetlamp.report.viewer import write_report

    m = json.loads((out / "manifest.json").read_text())
    m["dashboard"]["text_tokens"][1] = EVIL  # tokens that look like markup must stay text
    for s in m["dashboard"]["sequences"].values():
        s["tokens"][0] = EVIL
    m["dashboard"]["features"][0]["promoted"][0][0] = EVIL
    (out / "manifest.json").write_text(json.dumps(m))
    write_report(out)
    return out


def test_strip_token_panel_and_dashboard(run: Path, page: Page, tmp_path: Path) -> None:
    page.open(run / "report.html")
    p = page.page
    arrays = load_arrays(run / "arrays.safetensors")
    dens = pd.read_csv(run / "density.csv")
    toks = p.locator("#feat-strip .tok")
    words = TEXT.split()
    assert toks.count() == len(words)
    assert toks.all_text_contents() == [words[0], EVIL, *words[2:]]
    shown = [float(v) for v in toks.evaluate_all("es => es.map(e => e.dataset.value)")]
    np.testing.assert_allclose(shown, arrays["text_activations"][:, 0], rtol=1e-6)
    # a token's panel: tokens.csv's rows at that position
    toks.nth(3).click()
    rows = p.locator("#feat-token-table tbody tr")
    tt = pd.read_csv(run / "tokens.csv")
    assert [rows.nth(k).get_attribute("data-key") for k in range(rows.count())] == tt[tt.position == 3].feature.tolist()
    # the feature list, and the second feature's dashboard
    assert p.locator("#feat-list tbody tr").count() == len(dens)
    p.locator("#feat-list tbody tr").nth(1).click()
    assert p.get_attribute("#feat-dash", "data-feature") == dens.feature[1]
    ctx = pd.read_parquet(run / "contexts.parquet")
    mine = ctx[ctx.feature == dens.feature[1]]
    boxes = p.locator("#feat-dash .feat-ctx")
    assert [int(boxes.nth(k).get_attribute("data-sequence")) for k in range(boxes.count())] == (
        mine[mine.group == "top"].sequence_index.tolist()
        + mine[mine.group == "decile"].sort_values("decile", ascending=False, kind="stable").sequence_index.tolist()
    )
    first = mine[mine.group == "top"].iloc[0]
    b0 = boxes.first
    assert b0.locator(".tok").all_text_contents() == [EVIL, *list(first.tokens)[1:]]
    vals = [float(v) for v in b0.locator(".tok").evaluate_all("es => es.map(e => e.dataset.value)")]
    np.testing.assert_allclose(vals, first.activations, rtol=1e-6, atol=1e-7)
    assert int(b0.get_attribute("data-max-index")) == first.max_token_index
    lg = pd.read_csv(run / "logits.csv")
    up = lg[(lg.feature == dens.feature[1]) & (lg.direction == "promoted")].token.tolist()
    assert p.locator("#feat-promoted tbody tr td:first-child").all_text_contents() == up
    # the first feature's dashboard carries the planted token as text
    p.locator("#feat-list tbody tr").nth(0).click()
    assert p.locator("#feat-promoted tbody tr td:first-child").first.text_content() == EVIL
    assert p.locator("#app b, #app img").count() == 0 and page.dialogs == []
    p.screenshot(path=str(tmp_path / "features.png"), full_page=True)
    page.clean()
