"""The cite view in a real browser (Chromium from file://): one row per source, one column per method, each
cell the source's rank under that method as scores.csv ranks it; the court and cost tables are court.csv's
and cost.csv's; a source's text stays text; a forced answer is flagged."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers.browser import Page, require_browser

require_browser()

from streetlamp.cli import main  # noqa: E402
from streetlamp.models.tiny import save_tiny  # noqa: E402

EVIL = "<img src=x onerror=alert(1)><b>the movie"
SOURCES = ["the movie was good", "mary went to the store", EVIL, "paris is the capital of france"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = tmp_path_factory.mktemp("cite-view")
    src = t / "s.jsonl"
    src.write_text("\n".join(json.dumps({"text": s}) for s in SOURCES) + "\n")
    out = t / "run"
    model = save_tiny("llama", t / "llama", seed=1)
    argv = ["cite", "--model", str(model), "--context", str(src), "--question", "what is the capital of france"]
    argv += ["--answer", "paris", "--out", str(out), "--ablations", "6", "--held-out", "3", "--ig-steps", "2"]
    assert main([*argv, "--attntrace-samples", "2"]) == 0
    return out


def test_sources_side_by_side(run: Path, page: Page) -> None:
    page.open(run / "report.html")
    p = page.page
    m = json.loads((run / "manifest.json").read_text())
    scores = pd.read_csv(run / "scores.csv")
    rows = p.locator("#cite-grid tr")
    assert rows.count() == 1 + len(SOURCES)
    head = rows.first.locator("th").all_text_contents()
    assert head == ["source", *m["methods"], "text"]
    for s in range(len(SOURCES)):
        cells = rows.nth(1 + s).locator("td")
        for j, meth in enumerate(m["methods"]):
            want = int(scores[(scores.method == meth) & (scores.source == s)]["rank"].iloc[0])
            assert int(cells.nth(1 + j).get_attribute("data-rank")) == want
            assert cells.nth(1 + j).text_content() == str(want)
        assert cells.last.text_content() == (EVIL if s == 2 else SOURCES[s])
    assert p.locator("#cite-grid img").count() == 0  # the hostile source stayed text
    assert "forced" in p.text_content("#cite-forced")
    court = pd.read_csv(run / "court.csv")
    assert p.locator("#cite-court tbody tr").count() == len(court)
    assert p.locator("#cite-cost tbody tr").count() == len(pd.read_csv(run / "cost.csv"))
    assert "LDS" in p.text_content("#cite-lds")
    p.screenshot(path=str(run / "view.png"), full_page=True)
    page.clean()
