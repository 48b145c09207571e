"""The report in Firefox too: Debian's firefox-esr, headless, driven over WebDriver BiDi (Firefox's own
remote protocol; Playwright drives only its patched Firefox builds, which cannot be downloaded here).

Opens an explain report from file://, waits for the page's ready mark, reads the raw numbers it shows
and compares them with arrays.safetensors, and asserts no console error or JavaScript exception.
Without firefox-esr the test skips with one line; with STREETLAMP_REQUIRE_BROWSER=1 it fails instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streetlamp.cli import main
from streetlamp.models.tiny import save_tiny
from streetlamp.store.files import load_arrays
from tests.conftest import free_port


def firefox_path() -> str | None:
    return shutil.which("firefox-esr") or shutil.which("firefox")


def _missing() -> str | None:
    try:
        import websocket  # noqa: F401
    except ImportError:
        return "websocket-client is not installed (pip install -e '.[test]')"
    if firefox_path() is None:
        return "no firefox on PATH (apt-get install firefox-esr; `make test` does it as root)"
    return None


why = _missing()
if why is not None:
    if os.environ.get("STREETLAMP_REQUIRE_BROWSER") == "1":
        pytest.fail(f"Firefox test required (STREETLAMP_REQUIRE_BROWSER=1) but {why}", pytrace=False)
    pytest.skip(f"report Firefox test skipped: {why}", allow_module_level=True)


class BiDi:
    """A minimal WebDriver BiDi client: commands by id, events kept."""

    def __init__(self, url: str) -> None:
        import websocket

        self.ws = websocket.create_connection(url, timeout=60, suppress_origin=True)  # Firefox refuses any Origin
        self.n = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.n:
                if msg.get("type") == "error":
                    raise RuntimeError(f"{method}: {msg.get('error')}: {msg.get('message')}")
                return msg["result"]
            if msg.get("type") == "event":
                self.events.append(msg)

    def eval(self, context: str, expression: str) -> Any:
        r = self.send(
            "script.evaluate",
            {"expression": expression, "target": {"context": context}, "awaitPromise": True},
        )
        if r.get("type") == "exception":
            raise RuntimeError(f"{expression}: {r['exceptionDetails'].get('text')}")
        return r["result"].get("value")


@pytest.fixture(scope="module")
def firefox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BiDi]:
    port, profile = free_port(), tmp_path_factory.mktemp("ffprofile")
    proc = subprocess.Popen(
        [
            firefox_path() or "firefox",
            "--headless",
            "--no-remote",
            "--profile",
            str(profile),
            "--remote-debugging-port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline, err = time.time() + 90, None
        while time.time() < deadline:
            try:
                bidi = BiDi(f"ws://127.0.0.1:{port}/session")
                break
            except OSError as e:  # not listening yet
                err = e
                time.sleep(0.5)
        else:
            raise RuntimeError(f"firefox did not open its remote port: {err}")
        bidi.send("session.new", {"capabilities": {}})
        bidi.send("session.subscribe", {"events": ["log.entryAdded"]})
        yield bidi
        bidi.ws.close()
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_explain_report_in_firefox(firefox: BiDi, tmp_path: Path) -> None:
    ck = save_tiny("bert", tmp_path / "ckpt", seed=1)
    out = tmp_path / "run"
    assert (
        main(["explain", "the movie was not good , but the acting was great .", "--model", str(ck), "--out", str(out)])
        == 0
    )
    att = load_arrays(out / "arrays.safetensors")["attention"].astype(np.float64)
    special = set(json.loads((out / "manifest.json").read_text())["special_positions"])
    ctx = firefox.send("browsingContext.getTree", {})["contexts"][0]["context"]
    firefox.send(
        "browsingContext.navigate",
        {"context": ctx, "url": (out / "report.html").resolve().as_uri() + "#l=1&h=2&t=3&lock=1", "wait": "complete"},
    )
    deadline = time.time() + 60
    while firefox.eval(ctx, "document.body.dataset.ready || ''") != "1":
        assert time.time() < deadline, "the report never became ready in Firefox"
        time.sleep(0.3)
    assert firefox.eval(ctx, "document.querySelector('#layer').value") == "1"
    rows = json.loads(
        firefox.eval(
            ctx,
            "JSON.stringify(Array.from(document.querySelectorAll('#raw tbody tr[data-j]'))"
            ".map(tr => [+tr.dataset.j, +tr.querySelector('td.val').dataset.value]))",
        )
    )
    js = [j for j, _ in rows]
    assert js == [j for j in range(att.shape[2]) if j not in special][: len(js)] and len(js) > 5
    np.testing.assert_allclose([v for _, v in rows], att[1, 2, 3, js], atol=0.5 / 65535 + 1e-6)
    errors = [
        e["params"]
        for e in firefox.events
        if e.get("method") == "log.entryAdded" and e["params"].get("level") == "error"
    ]
    assert errors == [], errors
