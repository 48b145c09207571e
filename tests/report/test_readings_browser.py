"""The readings in a real browser (Chromium from file://): a forced attention sink is worded in the explain
view and in the long view, with the stored share; a run without one shows no note."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.browser import Page, require_browser

require_browser()

from streetlamp.cli import main  # noqa: E402
from streetlamp.models.tiny import save_tiny  # noqa: E402
from tests.test_readings import TEXT, sink_gpt2  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("readings")
    model, tok = sink_gpt2()
    ckpt = root / "ckpt"
    model.save_pretrained(ckpt, safe_serialization=True)
    tok.save_pretrained(ckpt)
    plain = save_tiny("gpt2", root / "plain-ckpt", seed=1)
    out = {k: root / k for k in ("sink", "long", "plain")}
    base = ["explain", TEXT, "--methods", "attention,rollout"]
    assert main([*base, "--model", str(ckpt), "--out", str(out["sink"])]) == 0
    assert main([*base, "--model", str(plain), "--out", str(out["plain"])]) == 0
    long = ["explain", TEXT, "--methods", "rollout", "--rows", "last", "--layers", "0"]
    assert main([*long, "--model", str(ckpt), "--out", str(out["long"])]) == 0
    return out


def test_explain_view_words_the_sink(runs: dict[str, Path], page: Page) -> None:
    m = json.loads((runs["sink"] / "manifest.json").read_text())["methods"]
    page.open(runs["sink"] / "report.html")
    for name in ("attention", "rollout"):
        s = m[name]["attention_sink"]
        text = page.page.text_content(f"#compare .reading[data-method='{name}']")
        assert f"attention sink in {name}: " in text and f"@0 takes {100 * s['share']:.1f}% of its mass" in text
        assert f"{s['set_aside'][0][1]!r}".strip("'") in text and "set aside" in text
    page.clean()


def test_long_view_words_the_sink(runs: dict[str, Path], page: Page) -> None:
    s = json.loads((runs["long"] / "manifest.json").read_text())["arrays"]["rollout.tokens"]["attention_sink"]
    page.open(runs["long"] / "report.html")
    text = page.page.text_content(".reading[data-method='rollout']")
    assert "attention sink in rollout: " in text and f"takes {100 * s['share']:.1f}% of its mass" in text
    page.clean()


def test_no_note_without_a_sink(runs: dict[str, Path], page: Page) -> None:
    page.open(runs["plain"] / "report.html")
    assert page.page.query_selector_all(".reading") == [] and page.page.text_content("#sentence")
    page.clean()
