"""The report's "light versus use" table in a real browser: every value cell is the stored array and every
rank cell is scipy's rank (1 = largest, ties share their mean rank) of that column over the tokens the
table shows (special tokens hidden, as by default), attention by value and each method by |score|."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.browser import Page, require_browser

require_browser()

from scipy.stats import rankdata  # noqa: E402

from streetlamp.cli import main  # noqa: E402
from streetlamp.models.tiny import save_tiny  # noqa: E402
from streetlamp.report.viewer import write_report  # noqa: E402
from streetlamp.store.files import load_arrays  # noqa: E402

TEXT = "the movie was not good , but the acting was great ."
METHODS = ["attention", "occlusion", "gradient_x_input"]
PACK = 0.5 / 65535 + 1e-6  # the full tensor may travel as 16-bit fixed point (pack.py)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ranks")
    out = {}
    for family in ("bert", "gpt2"):
        ck = save_tiny(family, root / "ck" / family, seed=1)
        out[family] = root / family
        args = ["explain", TEXT, "--model", str(ck), "--methods", ",".join(METHODS), "--out", str(out[family])]
        assert main(args) == 0
        write_report(out[family])
    return out


@pytest.mark.parametrize("family", ["bert", "gpt2"])
@pytest.mark.parametrize("head", [-1, 2])
def test_rank_cells_are_scipys_ranks_of_the_shown_values(
    runs: dict[str, Path], browser: Any, family: str, head: int
) -> None:
    folder = runs[family]
    a = load_arrays(folder / "arrays.safetensors")
    m = json.loads((folder / "manifest.json").read_text())
    att = a["attention"].astype(np.float64)
    L = att.shape[0]
    pos = m["explained_position"]["index"]
    special = set(m["special_positions"])
    ctx = browser.new_context(viewport={"width": 1300, "height": 900})
    page = Page(ctx.new_page())
    try:
        page.open(folder / "report.html", f"#l={L - 1}&h={head}")
        p = page.page
        p.wait_for_selector("#compare-table tbody tr")
        titles = p.eval_on_selector_all("#compare-table thead th", "ths => ths.map(t => t.textContent)")
        cells = p.eval_on_selector_all(
            "#compare-table tbody tr",
            "trs => trs.map(tr => Array.from(tr.querySelectorAll('td')).map(td => td.dataset.value ?? td.textContent))",
        )
        page.clean()
    finally:
        ctx.close()
    assert titles[:4][1] == "token" and titles[3] == "rank" and len(titles) == 4 + 2 * len(METHODS)
    v = np.array([[float(c) for i, c in enumerate(r) if i != 1] for r in cells])  # the token column is text
    keys = v[:, 0].astype(int)
    assert sorted(keys) == [j for j in range(att.shape[-1]) if j not in special]
    row = att[L - 1, :, pos].mean(0) if head < 0 else att[L - 1, head, pos]
    np.testing.assert_allclose(v[:, 1], row[keys], atol=PACK)
    np.testing.assert_array_equal(v[:, 2], rankdata(-v[:, 1], method="average"))
    for k, name in enumerate(METHODS):
        val, rank = v[:, 3 + 2 * k], v[:, 4 + 2 * k]
        assert titles[4 + 2 * k].startswith(name) and titles[5 + 2 * k] == "rank by |score|"
        np.testing.assert_allclose(val, a[f"{name}.tokens"][keys].astype(np.float64), rtol=2.0**-23, atol=0)
        np.testing.assert_array_equal(rank, rankdata(-np.abs(val), method="average"))
    # not vacuous: the ranks are not the table's order, and |score| ranks are not signed ones somewhere
    assert not np.array_equal(v[:, 2], np.arange(1, len(keys) + 1))
    signed = [rankdata(-v[:, 3 + 2 * k], method="average") for k in range(len(METHODS))]
    assert any(not np.array_equal(s, v[:, 4 + 2 * k]) for k, s in enumerate(signed))
