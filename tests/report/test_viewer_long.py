"""The long-context explain report (`explain --rows/--layers/--heads`) in a real browser: the numbers a person
reads are the stored rows, masked keys are marked, at most MAX_LONG_ROWS rows per layer travel."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.helpers.browser import Page, require_browser

require_browser()

from streetlamp.cli import main  # noqa: E402
from streetlamp.models.tiny import TINY_WINDOW, save_tiny  # noqa: E402
from streetlamp.report.viewer import folder as viewer_folder  # noqa: E402
from streetlamp.report.viewer import write_report  # noqa: E402
from streetlamp.store.files import load_arrays  # noqa: E402

TEXT = "the movie was not good but the acting was great and i loved it"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("long")
    ck = save_tiny("mistral", root / "ckpt", seed=1)  # sliding-window layers: the window mask shows
    out = root / "run"
    args = ["explain", TEXT, "--model", str(ck), "--out", str(out), "--rows", "last,5", "--layers", "0,-1"]
    assert main([*args, "--methods", "rollout,attention_x_gradient"]) == 0
    return out


def shard_rows(run: Path, layer: int) -> tuple[list[int], np.ndarray]:
    """Kept rows of a layer and their weights ``[row, head, key]``, read straight from the shards."""
    m = json.loads((run / "manifest.json").read_text())
    rows, parts = [], []
    for sh in m["long_context"]["shards"]:
        if sh["layer"] == layer:
            rows += sh["rows"]
            parts.append(load_file(str(run / sh["file"]))["pattern"].transpose(1, 0, 2))
    return rows, np.concatenate(parts)


def test_methods_and_kept_rows_show_the_stored_numbers(run: Path, page: Page, tmp_path: Path) -> None:
    page.open(run / "report.html")
    pg = page.page
    assert pg.evaluate("document.querySelector('h1').textContent") == "streetlamp explain (long context)"
    arrays = load_arrays(run / "arrays.safetensors")
    n = len(arrays["rollout.tokens"])
    # each method's row over every token: exact float32
    for name in ("rollout", "attention_x_gradient"):
        pg.select_option("#long-what", name)
        pg.wait_for_selector(f"#long-panel[data-drawn='{name}']")  # the redraw is asynchronous
        shown = pg.eval_on_selector_all("#long-tokens .tok", "s => s.map(t => parseFloat(t.dataset.value))")
        assert len(shown) == n
        np.testing.assert_array_equal(np.float32(shown), arrays[f"{name}.tokens"].astype(np.float32))
    # kept attention rows: every kept layer, row and head, and the head mean
    pg.select_option("#long-what", "attention")
    m = json.loads((run / "manifest.json").read_text())
    layers = m["long_context"]["kept"]["layers"]
    assert layers == [0, 1]
    for layer in layers:
        rows, w = shard_rows(run, layer)
        rule = m["long_context"]["qk"]["rules"][str(layer)]
        pg.select_option("#long-layer", str(layer))
        for k, r in enumerate(rows):
            pg.select_option("#long-row", str(r))
            visible = np.array([j <= r and (not rule["window"] or j > r - rule["window"]) for j in range(n)])
            for h in (-1, 0, w.shape[1] - 1):
                pg.select_option("#long-head", str(h))
                pg.wait_for_selector(f"#long-panel[data-drawn='attention|{layer}|{r}|{h}']")
                vals = pg.eval_on_selector_all(
                    "#long-tokens .tok",
                    "s => s.map(t => t.dataset.value === undefined ? null : parseFloat(t.dataset.value))",
                )
                masked = np.array([v is None for v in vals])
                assert np.array_equal(masked, ~visible)  # masked keys carry no number (grey), never "low"
                want = w[k].mean(0) if h < 0 else w[k, h]
                # the page stores rows at fixed point when large; these are small: float32 exact up to the
                # mean's float32 summation order (eps32 x heads)
                np.testing.assert_allclose(np.float32([v for v in vals if v is not None]), want[visible], atol=1e-6)
    # the sliding window of the tiny Mistral is shorter than the text: the window mask is visible
    assert any(r - TINY_WINDOW >= 0 for r in shard_rows(run, 0)[0])
    pg.screenshot(path=str(tmp_path / "long.png"))
    page.clean()


def test_fragment_restores_the_view_and_hover_reads_a_value(run: Path, page: Page) -> None:
    page.open(run / "report.html", "#view=explain_long&what=attention&l=1&r=5&h=0")
    pg = page.page
    assert pg.input_value("#long-layer") == "1" and pg.input_value("#long-row") == "5"
    assert pg.input_value("#long-head") == "0"
    pg.wait_for_selector("#long-panel[data-drawn='attention|1|5|0']")
    pg.hover("#long-tokens .tok[data-i='3']")
    text = pg.text_content("#long-value") or ""
    _, w = shard_rows(run, 1)
    assert text.startswith("position 3 ") and float(pg.get_attribute("#long-value", "data-value") or "nan") == float(
        np.float32(w[0, 0, 3])  # kept rows are [5, 14]: row 5 is the first
    )
    page.clean()


def test_rows_beyond_the_page_limit_stay_in_the_folder(run: Path, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(viewer_folder, "MAX_LONG_ROWS", 1)
    model, _ = viewer_folder.load_folder(run)
    assert model["view"] == "explain_long"
    assert model["long"]["rows"] == {"0": [5], "1": [5]} and model["long"]["omitted_rows"] == {"0": 1, "1": 1}


def test_a_missing_shard_is_one_clear_error(run: Path, tmp_path: Path) -> None:
    import shutil

    from streetlamp.errors import StreetlampError

    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    m = json.loads((copy / "manifest.json").read_text())
    (copy / m["long_context"]["shards"][0]["file"]).unlink()
    with pytest.raises(StreetlampError, match="missing"):
        write_report(copy)
