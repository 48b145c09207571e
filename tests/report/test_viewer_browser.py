"""The report in a real browser (Chromium from file://): the numbers it shows are the stored arrays,
nothing reaches the network, run text stays text, state survives in the URL fragment."""

from __future__ import annotations

import itertools
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.browser import Page, require_browser

require_browser()

from scipy.spatial.distance import jensenshannon  # noqa: E402
from scipy.stats import kendalltau  # noqa: E402

from streetlamp.cli import main  # noqa: E402
from streetlamp.models.tiny import save_tiny  # noqa: E402
from streetlamp.report.viewer import write_report  # noqa: E402
from streetlamp.report.viewer.palettes import palettes  # noqa: E402
from streetlamp.store.files import load_arrays  # noqa: E402

HOSTILE = "</script><img src=x onerror=alert(1)>"
TEXT = "the movie was not good , but the acting was great ."


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    ck = {f: save_tiny(f, root / "ckpt" / f, seed=1) for f in ("bert", "gpt2")}
    out = {"bert": root / "bert", "gpt2": root / "gpt2", "long": root / "long"}
    assert main(["explain", f"{TEXT} {HOSTILE}", "--model", str(ck["bert"]), "--out", str(out["bert"])]) == 0
    assert (
        main(
            ["explain", TEXT, "--model", str(ck["gpt2"]), "--methods", "attention,occlusion", "--out", str(out["gpt2"])]
        )
        == 0
    )
    # a tokenizer may yield any string as a token: plant the hostile one among the labels
    long_text = " ".join(TEXT.split() * 6)  # 72 words: truncated to the tiny model's 64 positions
    assert (
        main(
            [
                "explain",
                long_text,
                "--model",
                str(ck["gpt2"]),
                "--methods",
                "attention",
                "--truncate",
                "--out",
                str(out["long"]),
            ]
        )
        == 0
    )
    m = json.loads((out["bert"] / "manifest.json").read_text())
    m["token_labels"][3] = HOSTILE
    (out["bert"] / "manifest.json").write_text(json.dumps(m))
    for o in out.values():
        write_report(o)
    return out


def raw_rows(page: Page) -> dict[int, tuple[float, str]]:
    """The raw-numbers rows that exist now (a virtual list: the rows in view), by key position."""
    got = page.page.eval_on_selector_all(
        "#raw tbody tr[data-j]",
        "trs => trs.map(tr => { const v = tr.querySelector('td.val'); return [tr.dataset.j, v.dataset.value, v.textContent]; })",
    )
    return {int(j): (float(v) if v else float("nan"), text) for j, v, text in got}


def text_number(page: Page, selector: str) -> float:
    return float(page.page.text_content(selector))


def test_explain_numbers_are_the_stored_arrays(runs: dict[str, Path], page: Page) -> None:
    folder = runs["bert"]
    a = load_arrays(folder / "arrays.safetensors")
    att = a["attention"].astype(np.float64)
    L, H, n, _ = att.shape
    m = json.loads((folder / "manifest.json").read_text())
    page.open(folder / "report.html", "#l=1&h=2&mode=row")
    p = page.page
    assert p.input_value("#layer") == "1" and p.input_value("#head") == "2"
    err = 0.5 / 65535 + 1e-6  # 16-bit fixed point, see pack.py
    keys = [j for j in range(n) if j not in set(m["special_positions"])]  # special tokens hidden by default
    for t in (0, 2, 5):
        p.hover(f"#tokens .tok[data-i='{t}']")
        rows = raw_rows(page)
        assert sorted(rows) == keys[: len(rows)] and len(rows) >= min(len(keys), 17)  # 17 rows fill the box
        np.testing.assert_allclose([rows[j][0] for j in rows], att[1, 2, t, list(rows)], atol=err)
        # 4 decimals shown
        np.testing.assert_allclose([float(rows[j][1]) for j in rows], att[1, 2, t, list(rows)], atol=5e-5 + err)
    p.click("#mode-col")
    rows = raw_rows(page)
    np.testing.assert_allclose([rows[j][0] for j in rows], att[1, 2, list(rows), 5], atol=err)  # token 5's column
    p.click("#mode-row")
    p.select_option("#head", "-1")  # head mean
    p.hover("#tokens .tok[data-i='4']")
    rows = raw_rows(page)
    np.testing.assert_allclose([rows[j][0] for j in rows], att[1, :, 4].mean(0)[list(rows)], atol=err + 1e-6)
    # the head-mean disagreement: mean pairwise JSD (bits) between the heads' rows of query 4
    jsd = np.mean(
        [jensenshannon(att[1, x, 4], att[1, y, 4], base=2) ** 2 for x, y in itertools.combinations(range(H), 2)]
    )
    assert abs(float(p.get_attribute("#jsd", "data-value")) - jsd) < 1e-4
    assert (p.locator("#jsd-warning").count() == 1) == (jsd >= 0.1)
    # the full matrix: the value under the pointer
    p.click("canvas.thumb[data-l='0'][data-h='3']")
    p.wait_for_selector("#matrix[data-drawn='0:3']")  # the redraw is asynchronous (the layer is decoded first)
    assert p.text_content("#matrix-title").startswith("layer 0, head 3")
    box = p.locator("#matrix").bounding_box()
    cs, m0 = min(16, 640 // n), 96
    for i, j in ((1, 2), (n - 1, 0), (3, 3)):
        p.mouse.move(box["x"] + m0 + (j + 0.5) * cs, box["y"] + m0 + (i + 0.5) * cs)
        assert p.get_attribute("#cellvalue", "data-i") == str(i) and p.get_attribute("#cellvalue", "data-j") == str(j)
        assert abs(float(p.get_attribute("#cellvalue", "data-value")) - att[0, 3, i, j]) <= err
        assert "Query row" in p.text_content("#cellvalue") and "Key column" in p.text_content("#cellvalue")
    # light versus use: attention row of the explained position, the methods, Kendall tau
    pos = m["explained_position"]["index"]
    special = set(m["special_positions"])
    keep = [j for j in range(n) if j not in special]
    p.uncheck("#hide-special")
    p.check("#hide-special")
    taus = {
        e["m"]: float(e["v"])
        for e in p.eval_on_selector_all("#taus .tau", "es => es.map(e => ({m: e.dataset.method, v: e.dataset.value}))")
    }
    assert set(taus) == {"attention", "rollout", "integrated_gradients", "occlusion"}
    row = att[0, 3, pos]
    for name, tau in taus.items():
        ref = kendalltau(row[keep], np.abs(a[f"{name}.tokens"][keep].astype(np.float64))).statistic
        assert abs(tau - ref) < 1e-6 or (np.isnan(ref) and np.isnan(tau)), name
    top = max(keep, key=lambda j: row[j])
    sentence = p.text_content("#sentence")
    occ = a["occlusion.tokens"].astype(np.float64)
    labels = json.loads((folder / "manifest.json").read_text())["token_labels"]
    assert f"points at {json.dumps(labels[top])}" in sentence
    assert f"changes {m['target']['explained']} by " in sentence
    said = float(sentence.split(" by ")[-1].rstrip("."))
    assert abs(said + occ[top]) <= 5e-5 + 0.01 * abs(occ[top])  # 4 decimals, or 3 significant digits
    page.clean()


def test_raw_numbers_of_a_long_text_are_a_virtual_list(runs: dict[str, Path], page: Page) -> None:
    """Only the rows in view exist (hover cost independent of the length); scrolling shows the others."""
    folder = runs["long"]
    att = load_arrays(folder / "arrays.safetensors")["attention"].astype(np.float64)
    n = att.shape[2]
    assert n == 64
    page.open(folder / "report.html", "#l=0&h=1&hide=0")
    p = page.page
    p.click(f"#tokens .tok[data-i='{n - 1}']")  # the last query reads every key (causal mask)
    rows = raw_rows(page)
    assert min(rows) == 0 and len(rows) < n  # the top of the list, not every row
    np.testing.assert_allclose([rows[j][0] for j in rows], att[0, 1, n - 1, list(rows)], atol=0.5 / 65535 + 1e-6)
    p.eval_on_selector("#raw-box", "b => { b.scrollTop = b.scrollHeight; }")
    p.wait_for_selector(f"#raw tbody tr[data-j='{n - 1}']")
    rows = raw_rows(page)
    assert max(rows) == n - 1 and 0 not in rows
    np.testing.assert_allclose([rows[j][0] for j in rows], att[0, 1, n - 1, list(rows)], atol=0.5 / 65535 + 1e-6)
    page.clean()


def test_hostile_token_stays_text(runs: dict[str, Path], page: Page) -> None:
    html = (runs["bert"] / "report.html").read_text()
    assert HOSTILE not in html  # escaped in the data, never raw markup
    page.open(runs["bert"] / "report.html")
    p = page.page
    assert p.text_content("#tokens .tok[data-i='3']") == HOSTILE
    assert HOSTILE in p.text_content("#text")
    assert p.locator("img").count() == 0  # the explain view has no images: none was injected
    # the data could not open or close an element: the page has exactly the script elements written
    assert p.evaluate("document.querySelectorAll('script').length") == len(re.findall(r"^<script", html, re.M))
    page.clean()


def test_keyboard_lock_fragment_and_special_toggle(runs: dict[str, Path], page: Page) -> None:
    page.open(runs["bert"] / "report.html")
    p = page.page
    p.click("#tokens .tok[data-i='2']")  # lock
    p.hover("#tokens .tok[data-i='6']")  # locked: hovering elsewhere does not move the selection
    assert "lock" in p.get_attribute("#tokens .tok[data-i='2']", "class")
    p.focus("#tokens")
    p.keyboard.press("ArrowRight")
    assert "lock" in p.get_attribute("#tokens .tok[data-i='3']", "class")
    p.select_option("#layer", "0")
    p.select_option("#head", "1")
    p.click("#mode-col")
    url = p.url
    assert "t=3" in url and "l=0" in url and "h=1" in url and "mode=col" in url
    assert p.is_hidden("#tokens .tok[data-i='0']") is False  # the explained position stays visible
    last = len(json.loads((runs["bert"] / "manifest.json").read_text())["tokens"]) - 1
    assert p.is_hidden(f"#tokens .tok[data-i='{last}']")  # [SEP] hidden by default
    # as keys, every special token leaves the numbers, the explained [CLS] too; the hidden ones are listed
    assert p.is_hidden("#raw tbody tr[data-j='0']") and p.is_hidden(f"#raw tbody tr[data-j='{last}']")
    assert '"[CLS]"@0' in p.text_content("#hidden-keys") and f'"[SEP]"@{last}' in p.text_content("#hidden-keys")
    assert 0 not in {
        int(k) for k in p.eval_on_selector_all("#compare-table tbody tr", "es => es.map(e => e.dataset.key)")
    }
    p.uncheck("#hide-special")
    assert p.is_visible(f"#tokens .tok[data-i='{last}']") and p.is_visible("#raw tbody tr[data-j='0']")
    assert p.text_content("#hidden-keys") == ""
    page2 = Page(p.context.new_page()).open(runs["bert"] / "report.html", "#" + url.split("#", 1)[1])
    q = page2.page
    assert q.input_value("#layer") == "0" and q.input_value("#head") == "1"
    assert q.get_attribute("#mode-col", "aria-pressed") == "true"
    assert "lock" in q.get_attribute("#tokens .tok[data-i='3']", "class")
    page.clean()
    page2.clean()


def test_fixed_scale_and_mask_hatching(runs: dict[str, Path], page: Page) -> None:
    """Thumbnails use one fixed 0..1 viridis scale; a causal mask's cells are grey, never a low colour."""
    folder = runs["gpt2"]
    att = load_arrays(folder / "arrays.safetensors")["attention"].astype(np.float64)
    allowed = load_arrays(folder / "arrays.safetensors")["allowed"].astype(bool)
    n = att.shape[-1]
    page.open(folder / "report.html")
    p = page.page
    p.wait_for_selector("canvas.thumb[data-l='0'][data-h='1'][data-drawn='1']")
    size = p.evaluate("document.querySelector(\"canvas.thumb[data-l='0'][data-h='1']\").width")
    cell = size // n
    hexes = palettes()["sequential"]["hex"]
    lut = [tuple(int(hexes[6 * k + c * 2 : 6 * k + c * 2 + 2], 16) for c in range(3)) for k in range(256)]
    for i, j in ((n - 1, 0), (4, 2), (2, 2)):
        rgb = p.evaluate(
            "([x, y]) => Array.from(document.querySelector(\"canvas.thumb[data-l='0'][data-h='1']\")"
            ".getContext('2d').getImageData(x, y, 1, 1).data.slice(0, 3))",
            [j * cell + cell // 2, i * cell + cell // 2],
        )
        assert allowed[i, j]
        assert tuple(rgb) == lut[int(round(att[0, 1, i, j] * 255))]
    # a forbidden cell (key after the query): grey or hatch ink, never a palette colour
    rgb = p.evaluate(
        "([x, y]) => Array.from(document.querySelector(\"canvas.thumb[data-l='0'][data-h='1']\")"
        ".getContext('2d').getImageData(x, y, 1, 1).data.slice(0, 3))",
        [(n - 1) * cell + 1, 1],
    )
    assert not allowed[0, n - 1] and tuple(rgb) not in lut and abs(rgb[0] - rgb[1]) < 8 and abs(rgb[1] - rgb[2]) < 8
    assert "forbidden by the mask" in p.text_content("#matrix-legend")
    p.check("#rescale")
    assert "rescaled" in p.text_content("#scale-note")
    page.clean()


def test_export_png_and_svg(runs: dict[str, Path], page: Page, tmp_path: Path) -> None:
    page.open(runs["bert"] / "report.html")
    p = page.page
    panel = p.locator("#matrix").locator("xpath=ancestor::div[contains(@class,'panel')]")
    with p.expect_download() as d:
        panel.get_by_role("button", name="PNG").click()
    png = tmp_path / "m.png"
    d.value.save_as(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with p.expect_download() as d:
        panel.get_by_role("button", name="SVG").click()
    d.value.save_as(tmp_path / "m.svg")
    svg = (tmp_path / "m.svg").read_text()
    assert svg.startswith("<svg") and "data:image/png;base64," in svg and "layer" in svg
    page.clean()


def test_rebuilt_report_from_a_copy_shows_the_same_numbers(runs: dict[str, Path], page: Page, tmp_path: Path) -> None:
    copy = tmp_path / "elsewhere"
    shutil.copytree(runs["gpt2"], copy)
    (copy / "report.html").unlink()
    assert main(["report", str(copy)]) == 0
    att = load_arrays(copy / "arrays.safetensors")["attention"].astype(np.float64)
    values = []
    for folder in (runs["gpt2"], copy):
        page.open(folder / "report.html", "#l=1&h=0")
        page.page.hover("#tokens .tok[data-i='5']")
        values.append(page.page.eval_on_selector_all("#raw tbody td.val", "es => es.map(e => e.textContent)"))
    assert values[0] == values[1]
    shown_row = [float(v) for v in values[1][:6]]  # positions 0..5 are a causal row's allowed keys
    np.testing.assert_allclose(shown_row, att[1, 0, 5, :6], atol=5e-5 + 0.5 / 65535)
    assert values[1][6:] == ["masked"] * (att.shape[-1] - 6)
    page.clean()


@pytest.fixture(scope="module")
def command_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A run folder of every other command, on tiny checkpoints, each with its report."""
    root = tmp_path_factory.mktemp("cmds")
    ck = {f: save_tiny(f, root / "ckpt" / f, seed=1) for f in ("bert", "gpt2")}
    data = root / "d.jsonl"
    data.write_text(
        "\n".join(
            json.dumps({"text": t, "label": lab})
            for t, lab in [
                ("the movie was good", "pos"),
                ("i hated it", "neg"),
                ("boring plot", "neg"),
                ("great acting", "pos"),
            ]
        )
    )
    clean, corrupt = (
        "when mary and john went to the store john gave a drink to",
        "when mary and john went to the store mary gave a drink to",
    )
    argvs = {
        "heads": ["heads", "--data", str(data), "--no-attribution", "--model", str(ck["bert"])],
        "prune": [
            "prune",
            "--data",
            str(data),
            "--order",
            "attention,random",
            "--seeds",
            "1",
            "--model",
            str(ck["bert"]),
        ],
        "patch": [
            "patch",
            "--model",
            str(ck["gpt2"]),
            "--clean",
            clean,
            "--corrupt",
            corrupt,
            "--answer",
            "mary",
            "--wrong",
            "john",
            "--approx",
        ],
        "mediate": ["mediate", "--model", str(ck["gpt2"]), "--prompts", "2"],
        "explain-generation": [
            "explain-generation",
            "the movie was not",
            "--model",
            str(ck["gpt2"]),
            "--new-tokens",
            "3",
        ],
        "evaluate": [
            "evaluate",
            "--model",
            str(ck["bert"]),
            "--data",
            str(data),
            "--methods",
            "attention,occlusion",
            "--adv-steps",
            "2",
            "--permutations",
            "2",
            "--chunk-size",
            "2",
        ],
        "benchmark": ["benchmark", "--tasks", "keyword", "--methods", "attention,occlusion", "--n-examples", "4"],
    }
    out = {}
    for name, argv in argvs.items():
        out[name] = root / name
        assert main(argv + ["--out", str(out[name])]) == 0, name
        write_report(out[name])
    return out


def hover_cell(page: Page, canvas: str, i: int, j: int) -> float:
    p = page.page
    rows, cols = (int(p.get_attribute(canvas, a)) for a in ("data-rows", "data-cols"))
    p.locator(canvas).scroll_into_view_if_needed()
    box = p.locator(canvas).bounding_box()
    p.mouse.move(box["x"] + (j + 0.5) * box["width"] / cols, box["y"] + (i + 0.5) * box["height"] / rows)
    return float(p.get_attribute(canvas + "-value", "data-value"))


@pytest.mark.parametrize(
    "kind, canvas, array",
    [
        ("heads", "#grid-ablation", "ablation"),
        ("heads", "#grid-attention_mass", "attention_mass"),
        ("patch", "#grid-patch_resid_pre", "patch.resid_pre"),
        ("patch", "#grid-patch_heads", "patch.heads"),
        ("mediate", "#grid-head_nie", "head_nie"),
        ("prune", "#grid-score_attention", "score.attention"),
        ("explain-generation", "#gen-matrix", "integrated_gradients.matrix"),
    ],
)
def test_grids_show_the_stored_values(
    command_runs: dict[str, Path], page: Page, kind: str, canvas: str, array: str
) -> None:
    folder = command_runs[kind]
    a = load_arrays(folder / "arrays.safetensors")[array]
    page.open(folder / "report.html")
    allowed = load_arrays(folder / "arrays.safetensors").get("allowed") if kind == "explain-generation" else None
    for i, j in {(0, 0), (a.shape[0] - 1, a.shape[1] - 1), (a.shape[0] // 2, a.shape[1] // 2)}:
        if allowed is not None and not allowed[i, j]:
            continue
        assert hover_cell(page, canvas, i, j) == pytest.approx(float(a[i, j]), rel=1e-6, abs=1e-12)
    page.clean()


def test_generation_method_selector_shows_each_methods_values(page: Page, tmp_path: Path) -> None:
    folder = tmp_path / "gen"
    ck = save_tiny("gpt2", tmp_path / "ckpt", seed=1)
    argv = ["explain-generation", "the movie was not", "--model", str(ck), "--new-tokens", "3"]
    assert main([*argv, "--methods", "attention,occlusion", "--out", str(folder)]) == 0
    write_report(folder)
    a = load_arrays(folder / "arrays.safetensors")
    page.open(folder / "report.html")
    p = page.page
    assert p.eval_on_selector_all("#gen-method option", "os => os.map(o => o.value)") == ["attention", "occlusion"]
    for method in ("attention", "occlusion", "attention"):
        p.select_option("#gen-method", method)
        assert p.get_attribute("#gen-matrix", "data-method") == method and method in p.text_content("#gen-explained")
        for i, j in [(0, 0), (2, 4), (1, 3)]:  # allowed cells: row i sees the prompt (4 tokens) and i generated ones
            want = float(a[f"{method}.matrix"][i, j])
            assert hover_cell(page, "#gen-matrix", i, j) == pytest.approx(want, rel=1e-6, abs=1e-12), (method, i, j)
    assert "method=attention" in p.url
    assert not np.allclose(a["attention.matrix"], a["occlusion.matrix"])  # switching must show different numbers
    page.clean()


def test_heads_scatter_and_ranking(command_runs: dict[str, Path], page: Page) -> None:
    folder = command_runs["heads"]
    a = load_arrays(folder / "arrays.safetensors")
    page.open(folder / "report.html")
    p = page.page
    assert p.locator("#mass-vs-effect").count() == 1
    first = p.eval_on_selector("#heads-rank tbody tr", "tr => Array.from(tr.children).map(td => td.textContent)")
    l, h = (int(x) for x in first[0].split("."))
    assert abs(a["ablation"][l, h]) == np.abs(a["ablation"]).max()  # sorted by |ΔF|, largest first
    page.clean()


def test_prune_curves_table(command_runs: dict[str, Path], page: Page) -> None:
    folder = command_runs["prune"]
    a = load_arrays(folder / "arrays.safetensors")
    page.open(folder / "report.html")
    rows = page.page.eval_on_selector_all(
        "#prune-table tbody tr",
        "trs => trs.map(tr => Array.from(tr.children).map(td => td.dataset.value || td.textContent))",
    )
    for r in rows:
        np.testing.assert_allclose([float(x) for x in r[1:]], a[f"curve.{r[0]}"][1], rtol=1e-6)
    page.clean()


def test_evaluate_summary_and_example(command_runs: dict[str, Path], page: Page) -> None:
    from streetlamp.store import read_metrics

    folder = command_runs["evaluate"]
    df = read_metrics(folder)
    page.open(folder / "report.html")
    p = page.page
    for tr in p.eval_on_selector_all(
        "#summary tbody tr",
        "trs => trs.map(tr => Array.from(tr.children).map(td => td.dataset.value || td.textContent))",
    ):
        want = df[(df.method == tr[0]) & (df.metric == "aopc_comprehensiveness")].value.mean()
        if not np.isnan(want):
            assert float(tr[1]) == pytest.approx(want, rel=1e-6, abs=1e-12)
    for fig in ("#aopc-comprehensiveness", "#deletion_curve", "#flip-bars", "#tau-strip"):
        assert p.locator(fig).count() == 1, fig
    p.click("#examples tbody tr[data-key='d-000001']")
    assert p.text_content("#example-title") == "Example d-000001"
    arr = load_arrays(folder / "arrays" / "d-000001.safetensors")
    assert hover_cell(page, "#example-scores", 1, 2) == pytest.approx(
        float(arr["occlusion.tokens"][2]), rel=1e-6, abs=1e-12
    )
    assert "ex=d-000001" in p.url
    # the tokens as text (stored beside the ids), not token ids
    from streetlamp.store.files import TOKEN_LABELS, labels_of

    labels = labels_of(arr[TOKEN_LABELS])
    assert len(labels) == len(arr["input_ids"])
    assert p.eval_on_selector_all("#example-tokens .tok", "es => es.map(e => e.textContent)") == labels
    page.clean()


def test_benchmark_leaderboard_sorts(command_runs: dict[str, Path], page: Page) -> None:
    import csv

    folder = command_runs["benchmark"]
    rows = list(csv.DictReader(open(folder / "leaderboard.csv")))
    page.open(folder / "report.html")
    p = page.page
    col = list(rows[0]).index("auprc")
    p.click(f"#leaderboard th[data-col='{col}']")  # numbers sort descending first
    top = p.eval_on_selector("#leaderboard tbody tr", f"tr => tr.children[{col}].dataset.value")
    assert float(top) == max(float(r["auprc"]) for r in rows)
    page.clean()


def test_generic_view_renders_tables_and_figures(tmp_path: Path, page: Page) -> None:
    import base64

    folder = tmp_path / "cot"
    folder.mkdir()
    png = base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    )
    (folder / "one.png").write_bytes(png)
    (folder / "manifest.json").write_text(
        json.dumps(
            {
                "streetlamp": "cot",
                "question": HOSTILE,
                "tables": [
                    {
                        "title": "faithfulness",
                        "columns": ["step", "text", "effect"],
                        "rows": [[0, HOSTILE, 0.25], [1, "b", 0.75], [2, "c", -0.5]],
                        "note": "a note",
                    }
                ],
                "figures": [{"file": "one.png", "shows": "one pixel"}],
            }
        )
    )
    write_report(folder)
    page.open(folder / "report.html")
    p = page.page
    assert p.text_content("#table-0 tbody tr:first-child td:nth-child(2)") == HOSTILE
    p.click("#table-0 th[data-col='2']")
    assert p.eval_on_selector("#table-0 tbody tr", "tr => tr.children[2].dataset.value") == "0.75"
    assert p.locator("img").count() == 1 and p.get_attribute("img", "src").startswith("data:image/png;base64,")
    assert HOSTILE in p.text_content(".kv")
    page.clean()


def test_notebook_iframe_runs_its_scripts(runs: dict[str, Path], page: Page, tmp_path: Path) -> None:
    """What _repr_html_ returns: the whole report in an iframe srcdoc (scripts run there in JupyterLab,
    VS Code and classic Jupyter, which do not run scripts of plain HTML output)."""
    from types import SimpleNamespace

    from streetlamp.commands.explain.run import ExplainResult

    snippet = ExplainResult._repr_html_(SimpleNamespace(out=runs["bert"]))  # type: ignore[arg-type]
    assert snippet.startswith('<iframe srcdoc="') and "<script" not in snippet  # all of it escaped
    host = tmp_path / "notebook.html"
    host.write_text(f"<!DOCTYPE html><html><body><h1>cell output</h1>{snippet}</body></html>")
    page.page.goto(host.resolve().as_uri())
    frame = page.page.frame_locator("iframe")
    frame.locator("body[data-ready='1']").wait_for(timeout=60_000)
    assert frame.locator("#tokens .tok[data-i='3']").text_content() == HOSTILE
    assert frame.locator("#raw tbody td.val").count() > 0
    page.clean_events()
