"""The attribution-graph view (``static/graph.js``) in a real browser, on a ``streetlamp graph`` run of the tiny
Llama with random transcoders at both layers: the nodes drawn are nodes.parquet's kept ones (error nodes as grey
squares, none overlapping), the edges drawn are edges.parquet's, hovering a node shows its label, activation and
influence, clicking it lists its edges; the paths and audit tables are paths.csv and audit.csv (disagreements
first); a panel per head of edge_heads.parquet with the edges it carries, its QK pairs (qk_pairs.csv) and its QK
audit rows; a token and node labels that look like HTML stay text; a run without head loadings says so."""

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
from tests.helpers.dictionaries import tiny_transcoders  # noqa: E402

EVIL = "<img src=x onerror=alert(1)><b>"
PROMPT = "when mary and john went to the store , john gave a drink to"


def graph_run(t: Path, name: str, extra: list[str], prompt: str = PROMPT) -> Path:
    model = t / "llama" if (t / "llama").exists() else save_tiny("llama", t / "llama", seed=1)
    feats = t / "dict" if (t / "dict").exists() else tiny_transcoders(t / "dict")
    out = t / name
    argv = ["graph", prompt, "--model", str(model), "--features", str(feats), "--top", "3", "--out", str(out)]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(argv + extra) == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    t = tmp_path_factory.mktemp("graph-view")
    out = graph_run(t, "run", [])
    from streetlamp.report.viewer import write_report

    # a token and the labels that carry it look like markup: they must stay text
    m = json.loads((out / "manifest.json").read_text())
    m["tokens"][1] = EVIL
    labels = m["graph_view"]["labels"]
    labels[labels.index("token 'mary' @1")] = shown_label("token 'mary' @1")
    (out / "manifest.json").write_text(json.dumps(m))
    qp = pd.read_csv(out / "qk_pairs.csv")
    qp.loc[0, "query_part"] = EVIL
    qp.to_csv(out / "qk_pairs.csv", index=False)
    write_report(out)
    every = graph_run(t, "every", ["--node-threshold", "1", "--edge-threshold", "1", "--head-edges", "0"])
    return {"run": out, "plain": graph_run(t, "plain", ["--head-edges", "0"]), "every": every}


def shown_label(label: str) -> str:
    """A node's label as the page shows it: the fixture planted markup in token 1's."""
    return f"token {EVIL} @1" if label == "token 'mary' @1" else label


def drawn(p: Any) -> dict:
    return p.evaluate("() => window.streetlamp.graph.drawn()")


def test_graph_nodes_edges_and_node_labels(runs: dict[str, Path], page: Page, tmp_path: Path) -> None:
    out = runs["run"]
    page.open(out / "report.html")
    p = page.page
    nodes = pd.read_parquet(out / "nodes.parquet")
    kept = nodes[nodes.kept].set_index("node")
    edges = pd.read_parquet(out / "edges.parquet")
    d = drawn(p)
    # every kept node once, at its kind; every kept edge once, with its weight (float32 on the page)
    assert sorted(n[0] for n in d["nodes"]) == sorted(kept.index)
    assert {int(n[0]): n[1] for n in d["nodes"]} == kept.kind.to_dict()
    got = {(int(s), int(t)): w for s, t, w, _ in d["edges"]}
    assert len(d["edges"]) == len(edges) == len(got)
    assert set(got) == set(zip(edges.source, edges.target))
    for s, t, w in zip(edges.source, edges.target, edges.weight):
        assert got[(s, t)] == pytest.approx(w, rel=1e-6)
    ds = p.evaluate("() => ({...document.getElementById('graph-canvas').dataset})")
    assert int(ds["nodes"]) == len(kept) and int(ds["edges"]) == len(edges)
    n_err = int((kept.kind == "error").sum())
    assert n_err > 0 and int(ds["errors"]) == n_err
    # layout: layers upwards (tokens lowest, logits highest), positions rightwards, no two nodes overlapping
    xy = {int(n[0]): (n[2], n[3]) for n in d["nodes"]}
    level = {i: -1 if k == "token" else 99 if k == "logit" else kept.layer[i] for i, k in kept.kind.items()}
    for i in xy:
        for j in xy:
            if level[i] < level[j]:
                assert xy[i][1] > xy[j][1]
            if i < j:
                assert np.hypot(xy[i][0] - xy[j][0], xy[i][1] - xy[j][1]) >= 9, (i, j)
    tok = kept[kept.kind == "token"].sort_values("position")
    assert [xy[i][0] for i in tok.index] == sorted(xy[i][0] for i in tok.index)
    # error nodes are grey squares, features are not grey: the pixel at each node's centre
    px = p.evaluate(
        """(pts) => { const g = document.getElementById('graph-canvas').getContext('2d');
        return pts.map(([x, y]) => Array.from(g.getImageData(Math.round(x), Math.round(y), 1, 1).data)); }""",
        [list(xy[i]) for i in kept.index],
    )
    colour = dict(zip(kept.index, px))
    for i, k in kept.kind.items():
        if k == "error":
            assert colour[i][:3] == [154, 154, 154], (i, colour[i])
            corner = p.evaluate(
                "([x, y]) => Array.from(document.getElementById('graph-canvas').getContext('2d')"
                ".getImageData(Math.floor(x + 3.5), Math.floor(y - 3.5), 1, 1).data)",
                list(xy[i]),
            )
            assert corner[:3] == [154, 154, 154]  # near a square's corner, where a circle of radius 4.2 does not reach
        elif k == "feature":
            assert colour[i][:3] != [154, 154, 154]
    # hover a feature node: its label, layer, position, activation and influence; click: its edges
    f = kept[kept.kind == "feature"].influence.idxmax()
    box = p.locator("#graph-canvas").bounding_box()
    p.mouse.move(box["x"] + xy[f][0], box["y"] + xy[f][1])
    text = p.locator("#graph-node").text_content()
    assert p.get_attribute("#graph-node", "data-node") == str(f)
    assert kept.label[f] in text and f"feature {kept.feature_or_token_id[f]}" in text
    assert f"layer {kept.layer[f]}" in text and f"position {kept.position[f]}" in text
    assert f"activation {kept.activation[f]:.4f}" in text and "influence" in text
    p.mouse.click(box["x"] + xy[f][0], box["y"] + xy[f][1])
    mine = edges[(edges.source == f) | (edges.target == f)]
    assert p.locator("#graph-node-edge-table tbody tr").count() == min(30, len(mine))
    on = [e for e in drawn(p)["edges"] if e[3]]
    assert len(on) == len(mine)
    p.mouse.click(box["x"] + 3, box["y"] + 3)  # empty space: every edge again
    assert all(e[3] for e in drawn(p)["edges"])
    # the tokens as text, the planted markup included, never parsed
    assert p.locator("#graph-tokens .tok").all_text_contents() == [
        w if k != 1 else EVIL for k, w in enumerate(PROMPT.split())
    ]
    tok1 = int(kept[(kept.kind == "token") & (kept.position == 1)].index[0])
    p.mouse.move(box["x"] + xy[tok1][0], box["y"] + xy[tok1][1])
    assert EVIL in p.locator("#graph-node").text_content()
    assert p.locator("#app img, #app b").count() == 0 and page.dialogs == []
    p.locator("#graph-canvas").screenshot(path=str(tmp_path / "graph_canvas.png"))
    page.clean()


def test_graph_paths_audit_and_head_panels(runs: dict[str, Path], page: Page, tmp_path: Path) -> None:
    out = runs["run"]
    page.open(out / "report.html")
    p = page.page
    paths = pd.read_csv(out / "paths.csv")
    assert p.locator("#graph-paths tbody tr").count() == len(paths)
    assert p.locator("#graph-paths tbody tr td:nth-child(2)").all_text_contents() == list(paths.path)
    p.locator("#graph-paths tbody tr").first.click()  # the path alone is highlighted
    ids = [int(v) for v in paths.nodes[0].split()]
    on = {(int(s), int(t)) for s, t, _, h in drawn(p)["edges"] if h}
    assert on == set(zip(ids[:-1], ids[1:]))
    audit = pd.read_csv(out / "audit.csv")
    rows = p.locator("#graph-audit tbody tr")
    assert rows.count() == len(audit)
    agree_col = list(audit.columns).index("agree") + 1
    shown = p.locator(f"#graph-audit tbody tr td:nth-child({agree_col})").all_text_contents()
    assert shown == sorted(shown) and sorted(shown) == sorted(str(v) for v in audit.agree)  # False first
    # the heads: the table is heads.csv, one panel per head of edge_heads.parquet
    heads = pd.read_parquet(out / "edge_heads.parquet")
    summary = pd.read_csv(out / "heads.csv")
    assert p.locator("#graph-heads tbody tr td:first-child").all_text_contents() == list(summary.carrier)
    panels = p.locator(".graph-head")
    names = [panels.nth(k).get_attribute("data-head") for k in range(panels.count())]
    assert sorted(names) == sorted(set(heads.carrier) - {"composition"})
    qp = pd.read_csv(out / "qk_pairs.csv")
    qa = pd.read_csv(out / "qk_audit.csv")
    for h in names:
        mine = heads[heads.carrier == h]
        box = p.locator(f"#graph-head-{h}")
        if box.get_attribute("open") is None:
            box.locator("summary").click()
        rows = box.locator(f"#graph-head-edges-{h} tbody tr")
        assert rows.count() == min(12, int((mine.loading != 0).sum()))
        big = mine.iloc[int(mine.loading.abs().argmax())]
        first = rows.first.locator("td").all_text_contents()
        assert first[:2] == [shown_label(big.source), shown_label(big.target)]
        assert float(rows.first.locator("td").nth(3).get_attribute("data-value")) == pytest.approx(
            big.loading, rel=1e-6
        )
        for (q, k), grp in qp[qp["head"] == h].groupby(["query_position", "key_position"]):
            for kind in ("pair", "query side", "key side"):
                want = grp[grp.kind == kind]
                t = box.locator(f"#graph-qk-{h}-{q}-{k}-{kind.replace(' ', '-')} tbody tr")
                assert t.count() == len(want)
                vals = [
                    float(v) for v in t.locator("td:nth-child(4)").evaluate_all("es => es.map(e => e.dataset.value)")
                ]
                assert vals == pytest.approx(list(want.contribution), rel=1e-6)
                assert t.locator("td:nth-child(2)").all_text_contents() == list(want.query_part.astype(str))
        a = box.locator(f"#graph-qk-audit-{h} tbody tr")
        assert a.count() == int((qa["head"] == h).sum())
    assert set(qp["head"]) <= set(names) and len(qp)
    assert (
        p.locator(f"#graph-qk-{qp['head'][0]}-{qp.query_position[0]}-{qp.key_position[0]}-pair tbody tr td")
        .nth(1)
        .text_content()
        == EVIL
    )
    assert p.locator("#app img, #app b").count() == 0 and page.dialogs == []
    p.screenshot(path=str(tmp_path / "graph_page.png"), full_page=True)
    page.clean()


def test_graph_without_head_loadings(runs: dict[str, Path], page: Page) -> None:
    out = runs["plain"]
    page.open(out / "report.html")
    p = page.page
    assert not (out / "edge_heads.parquet").exists()
    assert "--head-edges" in p.locator("#graph-heads-panel").text_content()
    assert p.locator(".graph-head").count() == 0
    nodes = pd.read_parquet(out / "nodes.parquet")
    assert int(p.get_attribute("#graph-canvas", "data-nodes")) == int(nodes.kept.sum())
    page.clean()


def test_graph_edge_cap_and_error_toggle(runs: dict[str, Path], page: Page, tmp_path: Path) -> None:
    """A large graph is not drawn whole: the N most important kept edges (default 1000, set in the page), a line
    saying how many of how many, every edge of a clicked node even under the cap, error nodes hidden on request."""
    out = runs["every"]
    page.open(out / "report.html")
    p = page.page
    edges = pd.read_parquet(out / "edges.parquet")
    nodes = pd.read_parquet(out / "nodes.parquet").set_index("node")
    M = len(edges)
    assert M > 200, M  # thresholds 1: every edge of the tiny graph kept
    cap = min(1000, M)
    assert p.evaluate("window.streetlamp.graph.cap()") == cap
    assert int(p.get_attribute("#graph-canvas", "data-edges")) == cap
    assert f"drawing {cap} of the {M} kept edges" in p.locator("#graph-edge-count").text_content()
    p.fill("#graph-edge-cap", "50")
    p.dispatch_event("#graph-edge-cap", "change")
    d = drawn(p)
    assert len(d["edges"]) == 50 and "drawing 50 of the" in p.locator("#graph-edge-count").text_content()
    # the 50 most important as the pruning scores them: share of the target's incoming |weight| (over the kept
    # edges) times the target's influence (plus a logit's probability)
    a = edges.weight.abs()
    reach = nodes.influence.fillna(0) + nodes.logit_probability.fillna(0).where(nodes.kind == "logit", 0)
    total = a.groupby(edges.target).transform("sum")
    score = (a / total.where(total > 0, 1)) * edges.target.map(reach)  # thresholds 1 keep zero edges too: score 0
    top = edges.assign(score=score).nlargest(50, "score")
    assert score.nlargest(51).iloc[-2] > score.nlargest(51).iloc[-1]  # no tie at the cut
    assert {(int(s), int(t)) for s, t, _, _ in d["edges"]} == set(zip(top.source, top.target))
    # a node's edges all drawn when it is clicked, though most are under the cap
    f = int(nodes[nodes.kind == "feature"].influence.idxmax())
    mine = edges[(edges.source == f) | (edges.target == f)]
    xy = {int(n[0]): (n[2], n[3]) for n in d["nodes"]}
    box = p.locator("#graph-canvas").bounding_box()
    p.mouse.click(box["x"] + xy[f][0], box["y"] + xy[f][1])
    on = {(int(s), int(t)) for s, t, _, h in drawn(p)["edges"] if h}
    assert on == set(zip(mine.source, mine.target)) and len(mine) > 0
    p.mouse.click(box["x"] + 3, box["y"] + 3)
    # error nodes and their edges hidden, then shown again
    p.uncheck("#graph-show-errors")
    d = drawn(p)
    kinds = nodes.kind.to_dict()
    assert all(k != "error" for _, k, _, _ in d["nodes"]) and int(p.get_attribute("#graph-canvas", "data-errors")) == 0
    assert all(kinds[int(s)] != "error" and kinds[int(t)] != "error" for s, t, _, _ in d["edges"])
    assert "error nodes and their edges hidden" in p.locator("#graph-edge-count").text_content()
    p.check("#graph-show-errors")
    assert int(p.get_attribute("#graph-canvas", "data-errors")) == int((nodes[nodes.kept].kind == "error").sum())
    p.click("#graph-edge-all")
    assert len(drawn(p)["edges"]) == M
    p.fill("#graph-edge-cap", "300")
    p.dispatch_event("#graph-edge-cap", "change")
    p.locator("#graph-canvas").screenshot(path=str(tmp_path / "graph_cap300.png"))
    page.clean()


def test_graph_long_prompt_is_folded(runs: dict[str, Path], page: Page, tmp_path: Path) -> None:
    """A long prompt (2,048 tokens) does not push the graph off the page: the summary shows its start and end
    and its length, the whole prompt sits in a closed fold, as text (markup in it stays text), and the graph's
    canvas is in the first screen."""
    import shutil

    from streetlamp.report.viewer import write_report

    out = tmp_path / "long"
    shutil.copytree(runs["plain"], out)
    m = json.loads((out / "manifest.json").read_text())
    long = "START " + " ".join(f"w{i}" for i in range(2000)) + f" {EVIL} END"
    m["prompt"] = long
    (out / "manifest.json").write_text(json.dumps(m))
    write_report(out)
    page.open(out / "report.html")
    p = page.page
    summary = p.locator("#graph-summary").text_content()
    assert "START" in summary and "END" in summary and f"{len(long)} characters" in summary
    assert len(summary) < 800, len(summary)
    fold = p.locator("#graph-prompt")
    assert fold.get_attribute("open") is None  # closed
    assert fold.locator("p").text_content() == long  # the whole prompt, markup as text
    assert p.locator("#graph-prompt img").count() == 0
    assert p.locator("#graph-canvas").bounding_box()["y"] < 1000
    p.screenshot(path=str(tmp_path / "graph_long_prompt.png"))
    page.clean()
    # a short prompt has no fold
    page.open(runs["plain"] / "report.html")
    assert page.page.locator("#graph-prompt").count() == 0
    page.clean()
    # a graph wider than the page opens scrolled to its last position, where the logits are
    wide = graph_run(tmp_path, "wide", ["--head-edges", "0", "--no-audit"], prompt=" ".join([PROMPT] * 4))
    page.open(wide / "report.html")
    p = page.page
    box = p.locator("#graph-canvas").locator("xpath=..")
    sw, cw, left = (box.evaluate(f"e => e.{k}") for k in ("scrollWidth", "clientWidth", "scrollLeft"))
    assert sw > cw and left == sw - cw, (sw, cw, left)
    logit = next(n for n in drawn(p)["nodes"] if n[1] == "logit")
    frame, canvas = box.bounding_box(), p.locator("#graph-canvas").bounding_box()
    assert frame["x"] <= canvas["x"] + logit[2] <= frame["x"] + frame["width"]  # the logit node is in view
    p.screenshot(path=str(tmp_path / "graph_wide.png"))
    page.clean()
