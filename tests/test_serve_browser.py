"""streetlamp serve end to end: a real uvicorn server on a free 127.0.0.1 port, Debian's Chromium driven by
Playwright. The numbers the page shows after a click equal what the library computes for the edited text,
and a head ablation equals `streetlamp heads`; hostile text stays text; no request leaves the server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from .browser import ARGS, chromium_path, require_browser

require_browser()
pytest.importorskip("uvicorn")

from streetlamp.cli import main  # noqa: E402
from streetlamp.models.adapter import Inputs, ModelAdapter  # noqa: E402
from streetlamp.serve.app import Limits, create_app  # noqa: E402
from streetlamp.store.files import load_arrays  # noqa: E402

TOKEN = "browser-test-token-0123456789"
TEXT = "The movie was not good, but the acting was great."
HOSTILE = "</script><img src=x onerror=alert(1)> <b>bold</b> \x07 great"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    page.click("#live-back")
    page.wait_for_selector("#live-back[hidden]", state="attached")
    page.click(f"#live-view .tok[data-i='{pos + 1}']")  # "good" -> a typed replacement
    page.fill("#live-replace-input", "bad")
    run(page, "#live-replace")
    rep = ids[: pos + 1] + [minilm.tokenizer.convert_tokens_to_ids("bad")] + ids[pos + 2 :]
    p2 = probs(minilm, Inputs.from_ids(minilm, [rep]))
    assert float(page.get_attribute("#edit-pred", "data-prob")) == pytest.approx(float(p2.max()), abs=1e-6)
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
