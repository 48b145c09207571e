"""streetlamp serve end to end: a real uvicorn server on a free 127.0.0.1 port, Debian's Chromium driven by
Playwright. The numbers the page shows after a click equal what the library computes for the edited text,
and a head ablation equals `streetlamp heads`; hostile text stays text; no request leaves the server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.browser import ARGS, chromium_path, require_browser

require_browser()
pytest.importorskip("uvicorn")

from playwright.sync_api import expect  # noqa: E402
from scipy.spatial.distance import cosine  # noqa: E402

from streetlamp.cli import main  # noqa: E402
from streetlamp.commands.serve.app import Limits, create_app  # noqa: E402
from streetlamp.models.adapter import Inputs, ModelAdapter  # noqa: E402
from streetlamp.store.files import load_arrays  # noqa: E402
from tests.conftest import free_port  # noqa: E402

TOKEN = "browser-test-token-0123456789"
TEXT = "The movie was not good, but the acting was great."
PAIR = (
    "The animal didn't cross the street because it was too tired.",
    "The animal didn't cross the street because it was too wide.",
)
HOSTILE = "</script><img src=x onerror=alert(1)> <b>bold</b> \x07 great"


@pytest.fixture(scope="module")
def server(minilm: ModelAdapter, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import uvicorn

    port = free_port()
    app = create_app(
        {"minilm-sentiment": minilm}, TOKEN, "127.0.0.1", port, Limits(), tmp_path_factory.mktemp("serve-runs")
    )
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    for _ in range(600):
        if srv.started:
            break
        time.sleep(0.05)
    assert srv.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    t.join(15)


@pytest.fixture(scope="module")
def page(server: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=ARGS)
        pg = b.new_context(viewport={"width": 1300, "height": 1000}).new_page()
        pg.problems = []  # type: ignore[attr-defined]
        pg.on("console", lambda m: pg.problems.append(f"console: {m.text}") if m.type == "error" else None)
        pg.on("pageerror", lambda e: pg.problems.append(f"pageerror: {e}"))
        pg.on("dialog", lambda d: (pg.problems.append(f"dialog: {d.message}"), d.dismiss()))
        pg.on(
            "request",
            lambda r: (
                None if r.url.startswith((server + "/", "data:", "blob:")) else pg.problems.append(f"request: {r.url}")
            ),
        )
        pg.goto(f"{server}/?token={TOKEN}")
        pg.wait_for_selector("#live-explain")
        assert pg.url == server + "/"  # the token left the address bar (it is a cookie now)
        try:
            yield pg
        finally:
            b.close()


def run(pg: Any, click: str) -> None:
    pg.evaluate("document.getElementById('live-status').dataset.state = 'clicked'")
    pg.click(click)
    # (selectors, not wait_for_function: the page's CSP forbids the eval that one needs)
    pg.wait_for_selector("#live-status[data-state='done'], #live-status[data-state='error']", timeout=120_000)


def probs(adapter: ModelAdapter, inputs: Inputs) -> torch.Tensor:
    with torch.no_grad():
        return torch.softmax(adapter.forward(inputs).logits[0].double(), -1)


def test_type_click_remove_replace(page: Any, minilm: ModelAdapter) -> None:
    page.fill("#live-text", TEXT)
    run(page, "#live-explain")
    assert page.get_attribute("#live-status", "data-state") == "done", page.text_content("#live-error")
    p0 = probs(minilm, minilm.encode(TEXT))
    assert float(page.get_attribute("#live-pred", "data-prob")) == pytest.approx(float(p0.max()), abs=1e-6)
    ids = minilm.encode(TEXT).rows()[0]
    pos = minilm.encode(TEXT).tokens[0].index("not")
    page.click(f"#live-view .tok[data-i='{pos}']")
    assert '"not" selected' in page.text_content("#live-token")
    run(page, "#live-remove")
    edited = ids[:pos] + ids[pos + 1 :]
    p1 = probs(minilm, Inputs.from_ids(minilm, [edited]))
    assert page.get_attribute("#edit-pred", "data-label") == minilm.output_label(int(p1.argmax()))
    assert float(page.get_attribute("#edit-pred", "data-prob")) == pytest.approx(float(p1.max()), abs=1e-6)
    k = int(p0.argmax())
    assert float(page.get_attribute("#edit-explained-prob", "data-value")) == pytest.approx(float(p1[k]), abs=1e-6)
    strip = page.eval_on_selector_all("#live-view .tok", "els => els.map(e => e.textContent)")
    assert "not" not in strip and len(strip) == len(edited)  # the edited input's explain view is shown
    assert page.locator("#edit-table tbody tr").count() == minilm.n_layers + 1
    page.click("#live-reset")
    page.wait_for_selector("#live-reset[disabled]", state="attached")
    page.click(f"#live-view .tok[data-i='{pos + 1}']")  # "good" -> a typed replacement
    page.fill("#live-replace-input", "bad")
    run(page, "#live-replace")
    rep = ids[: pos + 1] + [minilm.tokenizer.convert_tokens_to_ids("bad")] + ids[pos + 2 :]
    p2 = probs(minilm, Inputs.from_ids(minilm, [rep]))
    assert float(page.get_attribute("#edit-pred", "data-prob")) == pytest.approx(float(p2.max()), abs=1e-6)
    assert page.problems == []  # type: ignore[attr-defined]


def hf(adapter: ModelAdapter, ids: list[int]) -> Any:
    """Hugging Face's own outputs (hidden states, attentions) for token ids, without the adapter."""
    with torch.no_grad():
        return adapter.hf_model(input_ids=torch.tensor([ids]), output_hidden_states=True, output_attentions=True)


def cells(page: Any, sel: str) -> list[float]:
    return [float(v) for v in page.eval_on_selector_all(sel, "els => els.map(e => e.getAttribute('data-value'))")]


def test_edit_chain_undo_reset(page: Any, minilm: ModelAdapter) -> None:
    """Remove "not", then replace "good" in the edited text: the second edit applies on top of the first; the
    history, the numbers and the hidden-state change (against the original text) are what the model gives."""
    page.fill("#live-text", TEXT)
    run(page, "#live-explain")
    enc = minilm.encode(TEXT)
    ids, pos = enc.rows()[0], enc.tokens[0].index("not")
    page.click(f"#live-view .tok[data-i='{pos}']")
    run(page, "#live-remove")
    page.click(f"#live-view .tok[data-i='{pos}']")  # the edited text's strip: "good" moved to "not"'s place
    assert '"good" selected' in page.text_content("#live-token")
    page.fill("#live-replace-input", "bad")
    run(page, "#live-replace")
    assert page.get_attribute("#live-status", "data-state") == "done", page.text_content("#live-error")
    one = ids[:pos] + ids[pos + 1 :]
    two = one[:pos] + [minilm.tokenizer.convert_tokens_to_ids("bad")] + one[pos + 1 :]
    o0, o1, o2 = hf(minilm, ids), hf(minilm, one), hf(minilm, two)
    p0, p1, p2 = (torch.softmax(o.logits[0].double(), -1) for o in (o0, o1, o2))
    k = int(p0.argmax())
    history = page.eval_on_selector_all("#edit-history li", "els => els.map(e => +e.dataset.prob)")
    assert history == pytest.approx([float(p0[k]), float(p1[k]), float(p2[k])], abs=1e-6)
    assert "replaced by" in page.text_content("#edit-history li:nth-child(3)")
    assert float(page.get_attribute("#edit-pred", "data-prob")) == pytest.approx(float(p2.max()), abs=1e-6)
    strip = page.eval_on_selector_all("#live-view .tok", "els => els.map(e => e.textContent)")
    assert len(strip) == len(two) and "bad" in strip and "not" not in strip and "good" not in strip
    # per layer, against the original text: the explained position ([CLS]) and the replaced token ("good" was
    # at pos + 1 in the original, it is at pos now)
    h0, h2 = o0.hidden_states, o2.hidden_states
    shown_cls = cells(page, "#edit-table tbody tr td:nth-child(5)")
    shown_tok = cells(page, "#edit-table tbody tr td:nth-child(6)")
    want_cls = [cosine(h0[l][0, 0].double().numpy(), h2[l][0, 0].double().numpy()) for l in range(len(h0))]
    want_tok = [cosine(h0[l][0, pos + 1].double().numpy(), h2[l][0, pos].double().numpy()) for l in range(len(h0))]
    assert shown_cls == pytest.approx(want_cls, abs=1e-5) and shown_tok == pytest.approx(want_tok, abs=1e-5)
    page.click("#live-undo")  # back to the first edit, as it was computed
    expect(page.locator("#edit-history li")).to_have_count(2)
    expect(page.locator("#live-view .tok")).to_have_count(len(one))
    page.wait_for_function(  # the view re-renders asynchronously: wait for the restored number, then compare
        "want => Math.abs(+document.querySelector('#edit-pred').dataset.prob - want) < 1e-6", arg=float(p1.max())
    )
    assert float(page.get_attribute("#edit-pred", "data-prob")) == pytest.approx(float(p1.max()), abs=1e-6)
    page.click("#live-reset")  # back to the original text
    expect(page.locator("#edit-history")).to_have_count(0)
    expect(page.locator("#live-view .tok")).to_have_count(len(ids))
    assert float(page.get_attribute("#live-pred", "data-prob")) == pytest.approx(float(p0.max()), abs=1e-6)
    assert page.problems == []  # type: ignore[attr-defined]


def test_minimal_pair_side_by_side(page: Any, minilm: ModelAdapter) -> None:
    """Both texts' explain views (the report's, one frame each), the outputs and their difference, and the
    difference of attention per layer and head, read off the page and computed through Hugging Face's model."""
    page.fill("#live-pair-a", PAIR[0])
    page.fill("#live-pair-b", PAIR[1])
    run(page, "#live-pair-go")
    assert page.get_attribute("#live-status", "data-state") == "done", page.text_content("#live-error")
    page.wait_for_selector("#live-pair-views[data-shown='1']", timeout=120_000)
    ia, ib = minilm.encode(PAIR[0]), minilm.encode(PAIR[1])
    for side, text, inp in (("a", PAIR[0], ia), ("b", PAIR[1], ib)):
        fr = page.frame_locator(f"#pair-frame-{side}")
        expect(fr.locator("#text")).to_have_text(text)
        expect(fr.locator(".tok")).to_have_count(inp.lengths[0])
        expect(fr.locator("#grid canvas.thumb").first).to_be_visible()
    box_a, box_b = page.locator("#pair-frame-a").bounding_box(), page.locator("#pair-frame-b").bounding_box()
    assert box_a["x"] + box_a["width"] <= box_b["x"] and abs(box_a["y"] - box_b["y"]) < 1  # side by side
    oa, ob = hf(minilm, ia.rows()[0]), hf(minilm, ib.rows()[0])
    pa, pb = torch.softmax(oa.logits[0].double(), -1), torch.softmax(ob.logits[0].double(), -1)
    rows = {
        tr.get_attribute("data-key"): [float(td.get_attribute("data-value")) for td in tr.query_selector_all("td")[1:]]
        for tr in page.query_selector_all("#pair-outputs tbody tr")
    }
    assert rows == {
        str(i): pytest.approx([float(pa[i]), float(pb[i]), float(pb[i] - pa[i])], abs=1e-6) for i in range(len(pa))
    }
    diff = [j for j in range(ia.lengths[0]) if ia.rows()[0][j] != ib.rows()[0][j]]
    assert len(diff) == 1 and ia.tokens[0][diff[0]] == "tired" and ib.tokens[0][diff[0]] == "wide"
    att_a, att_b = torch.stack(oa.attentions)[:, 0].double(), torch.stack(ob.attentions)[:, 0].double()
    tv = 0.5 * (att_b[:, :, 0] - att_a[:, :, 0]).abs().sum(-1)  # [layer, head], the [CLS] rows
    on = att_b[:, :, 0, diff[0]] - att_a[:, :, 0, diff[0]]
    for grid, want in (("pair-tv", tv), ("pair-diff", on)):
        c = page.locator(f"#{grid}")
        box, (L, H) = c.bounding_box(), want.shape
        for l, h in ((0, 0), (2, 5), (L - 1, H - 1)):
            c.hover(position={"x": (h + 0.5) * box["width"] / H, "y": (l + 0.5) * box["height"] / L})
            assert f"layer {l}, head {h}:" in page.text_content(f"#{grid}-value")
            assert float(page.get_attribute(f"#{grid}-value", "data-value")) == pytest.approx(
                float(want[l, h]), abs=1e-6
            )
    assert page.problems == []  # type: ignore[attr-defined]


def test_progress_in_the_page(page: Any, minilm: ModelAdapter, monkeypatch: pytest.MonkeyPatch) -> None:
    """Occlusion held after its second batch of perturbed rows: the page shows the stage and 6/12 rows."""
    from streetlamp.methods import scorer

    n = minilm.encode(TEXT).lengths[0]
    rows = n - 2  # every token but [CLS] and [SEP]
    monkeypatch.setattr(scorer, "default_budget", lambda device="cpu": 3 * n)  # three rows per forward pass
    reached, release, calls = threading.Event(), threading.Event(), [0]
    run_batch = scorer.Scorer._run

    def held(self: Any, *args: Any) -> Any:
        calls[0] += 1
        if calls[0] == 3:
            reached.set()
            release.wait(120)
        return run_batch(self, *args)

    monkeypatch.setattr(scorer.Scorer, "_run", held)
    try:
        page.fill("#live-text", TEXT)
        page.evaluate("document.getElementById('live-status').dataset.state = 'clicked'")
        page.click("#live-explain")
        assert reached.wait(120)
        page.wait_for_selector("#live-status[data-done='6']", timeout=60_000)
        assert f"explain: occlusion (occlusion 6/{rows})" in page.text_content("#live-status")
        assert page.get_attribute("#live-status", "data-total") == str(rows)
        assert page.get_attribute("#live-progress", "value") == "6"
        assert page.get_attribute("#live-progress", "max") == str(rows)
    finally:
        release.set()
    page.wait_for_selector("#live-status[data-state='done']", timeout=120_000)
    assert page.problems == []  # type: ignore[attr-defined]


def test_ablate_heads_equals_streetlamp_heads(page: Any, minilm: ModelAdapter, tmp_path: Path) -> None:
    out = tmp_path / "heads"
    assert main(["heads", TEXT, "--model", "minilm-sentiment", "--out", str(out)]) == 0
    ref = load_arrays(out / "arrays.safetensors")["ablation"]
    page.fill("#live-text", TEXT)
    run(page, "#live-explain")
    page.click("#live-view canvas.thumb[data-l='5'][data-h='3']")
    page.wait_for_selector("#ablate-table", timeout=120_000)
    page.wait_for_selector("#live-status[data-state='done']", timeout=120_000)
    assert float(page.get_attribute("#ablate-joint", "data-value")) == pytest.approx(float(ref[5, 3]), abs=1e-5)
    page.click("#live-view canvas.thumb[data-l='0'][data-h='7']")  # a second head: both, and each alone
    page.wait_for_selector("#ablate-table tbody tr:nth-child(2)", timeout=120_000)
    page.wait_for_selector("#live-status[data-state='done']", timeout=120_000)
    shown = {
        tr.get_attribute("data-key"): float(tr.query_selector_all("td")[5].get_attribute("data-value"))
        for tr in page.query_selector_all("#ablate-table tbody tr")
    }
    assert shown == pytest.approx({"5.3": float(ref[5, 3]), "0.7": float(ref[0, 7])}, abs=1e-5)
    page.click("#live-save")
    page.wait_for_selector("#live-saved[data-folder]")
    folder = page.get_attribute("#live-saved", "data-folder")
    assert main(["report", folder]) == 0
    assert page.problems == []  # type: ignore[attr-defined]


def test_hostile_text_is_text(page: Any) -> None:
    page.fill("#live-text", "x " * 5000)  # 10,000 characters: more tokens than the model's positions
    run(page, "#live-explain")
    assert page.get_attribute("#live-status", "data-state") == "error"
    assert "tokens but minilm-sentiment takes at most 512" in page.text_content("#live-error")
    assert page.problems == [  # type: ignore[attr-defined]
        "console: Failed to load resource: the server responded with a status of 400 (Bad Request)"
    ]  # Chromium's own line
    page.problems.clear()  # type: ignore[attr-defined]
    page.fill("#live-text", HOSTILE)
    run(page, "#live-explain")
    assert page.get_attribute("#live-status", "data-state") == "done"
    assert page.text_content("#live-view #text") == HOSTILE  # the explain view's text, as text
    assert page.locator("img[src='x']").count() == 0 and page.locator("b", has_text="bold").count() == 0
    strip = "".join(page.eval_on_selector_all("#live-view .tok", "els => els.map(e => e.textContent)"))
    assert "</script>" in strip and "<b>" in strip  # shown as characters, never parsed
    page.fill("#live-pair-a", HOSTILE)
    page.fill("#live-pair-b", HOSTILE.replace("great", "awful"))
    run(page, "#live-pair-go")
    assert page.text_content("#pair-a-text") == HOSTILE
    assert page.locator("#pair-tv").count() == 1  # same length: the per-head difference grid
    assert page.problems == []  # type: ignore[attr-defined]
