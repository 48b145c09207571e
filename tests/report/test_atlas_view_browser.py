"""The atlas view in a real browser (Chromium from file://), checked against the stored arrays and tables:
every head a point, the finder's numbers are heads.csv's, a head's panel shows its stored top sequences
with their tokens as text (a token that looks like HTML stays text) and its stored pattern, decoded lazily."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.helpers.browser import Page, require_browser

require_browser()

from streetlamp.cli import main  # noqa: E402
from streetlamp.models.tiny import WORDS, save_tiny  # noqa: E402
from streetlamp.store.files import load_arrays  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = tmp_path_factory.mktemp("atlas-view")
    rng = np.random.default_rng(1)
    lines = [" ".join(rng.choice(WORDS, int(rng.integers(4, 9)))) for _ in range(8)]
    (t / "d.txt").write_text("\n".join(lines) + "\n")
    out = t / "run"
    model = save_tiny("llama", t / "llama", seed=1)
    assert main(["atlas", "--model", str(model), "--data", str(t / "d.txt"), "--out", str(out), "--top-k", "2"]) == 0
    import json

    from streetlamp.report.viewer import write_report

    m = json.loads((out / "manifest.json").read_text())
    for labels in m["atlas"]["tokens"].values():  # a token that looks like markup must stay text
        labels[0] = EVIL
    (out / "manifest.json").write_text(json.dumps(m))
    write_report(out)
    return out


EVIL = "<img src=x onerror=alert(1)><b>"


def test_scatter_finder_and_panel(run: Path, page: Page) -> None:
    page.open(run / "report.html")
    p = page.page
    s = pd.read_csv(run / "heads.csv")
    assert p.get_attribute("#atlas-scatter", "data-points") == str(len(s))
    rows = p.locator("#atlas-heads tbody tr")
    assert rows.count() == len(s)
    first = rows.first  # sorted by effect, largest first
    want = s.sort_values("effect", ascending=False).iloc[0]
    assert first.get_attribute("data-key") == f"{want.layer}.{want['head']}"
    shown = float(first.locator("td").nth(4).get_attribute("data-value"))
    assert abs(shown - want.effect) <= 1e-6 * max(1.0, abs(want.effect))
    first.click()
    p.wait_for_selector("#atlas-panel[data-ms]")
    assert p.get_attribute("#atlas-panel", "data-head") == f"{want.layer}.{want['head']}"
    arrays = load_arrays(run / "arrays.safetensors")
    i = int(want.layer) * 4 + int(want["head"])
    seqs = [int(x) for x in arrays["panel_sequence"][i] if x >= 0]
    boxes = p.locator("#atlas-panel .atlas-seq")
    assert [int(boxes.nth(k).get_attribute("data-sequence")) for k in range(boxes.count())] == seqs
    man = __import__("json").loads((run / "manifest.json").read_text())
    toks = man["atlas"]["tokens"][str(seqs[0])]
    assert boxes.first.locator(".tok").all_text_contents() == toks
    # the explained row's weights as the page shows them (title) equal the stored pattern's last row
    n = len(toks)
    pat = arrays["panel_patterns"][i, 0].astype(np.float64)
    titles = [float(t.split()[-1]) for t in boxes.first.locator(".tok").evaluate_all("es => es.map(e => e.title)")]
    np.testing.assert_allclose(titles, pat[n - 1, :n], atol=1e-4 + 2 / 255)
    assert p.evaluate("window.streetlamp.atlasPanelMs") < 100
    page.clean()


def test_tokens_are_text_and_filter(run: Path, page: Page) -> None:
    page.open(run / "report.html")
    p = page.page
    p.locator("#atlas-heads tbody tr").first.click()
    p.wait_for_selector("#atlas-panel[data-ms]")
    assert p.locator("#atlas-panel b, #atlas-panel img").count() == 0
    assert p.locator("#atlas-panel .tok").first.text_content() == EVIL
    p.select_option("#atlas-filter", "streetlight")
    s = pd.read_csv(run / "heads.csv")
    assert p.locator("#atlas-heads tbody tr").count() == int(s.streetlight.sum())
    p.select_option("#atlas-filter", "")
    p.select_option("#atlas-x", "entropy")
    assert p.get_attribute("#atlas-scatter", "data-points") == str(int(s.entropy.notna().sum()))
    page.clean()
