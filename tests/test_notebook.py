"""The report inline in real notebook front ends, not a hand-made host page.

One Jupyter server (``python -m jupyterlab``; it also serves Notebook 7 at /notebooks/ and, when installed,
nbclassic at /nbclassic/) on 127.0.0.1, a free port and a random token, its root a temporary folder. Each
front end opens its own notebook whose one cell runs ``explain`` on a tiny BERT and leaves the
``ExplainResult`` as the cell's value; Debian's Chromium (tests/helpers/browser.py) runs the cell with Shift+Enter.
Inside the output iframe the report must become ready, show the run's tokens and the numbers of its
``arrays.safetensors``, request nothing and log no error. The kernel is this test's Python with the
checkout's ``src`` on PYTHONPATH (set in the server's environment, which the kernel inherits).

STREETLAMP_NOTEBOOK_SCREENSHOT=docs/figures/viewer_jupyterlab.png saves the JupyterLab page after the run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import free_port
from tests.helpers.browser import browser_fixture, require_browser

require_browser()
if importlib.util.find_spec("jupyterlab") is None or importlib.util.find_spec("ipykernel") is None:
    why = "jupyterlab/ipykernel are not installed (pip install -e '.[test]')"
    if os.environ.get("STREETLAMP_REQUIRE_BROWSER") == "1":
        pytest.fail(f"notebook tests required (STREETLAMP_REQUIRE_BROWSER=1) but {why}", pytrace=False)
    pytest.skip(f"notebook browser tests skipped: {why}", allow_module_level=True)

import nbformat  # noqa: E402
from playwright.sync_api import TimeoutError as PlaywrightTimeout  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from streetlamp.models.tiny import save_tiny  # noqa: E402
from streetlamp.store.files import load_arrays  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"
TEXT = "the movie was not good , but the acting was great ."
KERNEL = "streetlamp-test"  # a kernel spec of our own: this Python, whatever else is installed
CELL = """from pathlib import Path

import streetlamp
from streetlamp.commands.explain import ExplainSettings
from streetlamp.commands.explain.run import explain

adapter = streetlamp.load("ckpt")
explain(adapter, ExplainSettings.from_values(text={text!r}, methods=["attention", "occlusion"]), Path({out!r}))"""


@dataclass(frozen=True)
class FrontEnd:
    module: str  # the package that serves it
    url: str  # path under the server, {nb} = the notebook's name
    idle: str  # present once the kernel is started and idle
    editor: str  # the first cell's editor
    prompt: str  # the first cell's prompt: "[*]" or "[1]" once it runs
    output: str  # the iframe in the cell's output


FRONT_ENDS = {
    "jupyterlab": FrontEnd(
        "jupyterlab",
        "lab/tree/{nb}",
        ".jp-Notebook-ExecutionIndicator[data-status='idle']",
        ".jp-Cell .jp-InputArea-editor",
        ".jp-Cell .jp-InputPrompt",
        ".jp-OutputArea-output iframe",
    ),
    "notebook7": FrontEnd(
        "notebook",
        "notebooks/{nb}",
        ".jp-Notebook-ExecutionIndicator[data-status='idle']",
        ".jp-Cell .jp-InputArea-editor",
        ".jp-Cell .jp-InputPrompt",
        ".jp-OutputArea-output iframe",
    ),
    "nbclassic": FrontEnd(
        "nbclassic",
        "nbclassic/notebooks/{nb}",
        "#kernel_indicator_icon.kernel_idle_icon",
        ".cell .CodeMirror",
        ".cell .input_prompt",
        ".output_area iframe",
    ),
}


@dataclass(frozen=True)
class Server:
    origin: str
    token: str
    root: Path
    log: Path


def isolated_env(home: Path) -> dict[str, str]:
    """The server's environment: this Python and the checkout's src for the kernel, Jupyter's config,
    data, runtime and settings in ``home`` (never the user's), Jupyter news off (no request leaves)."""
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
    )
    dirs = {k: home / k.lower() for k in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR")}
    dirs["JUPYTERLAB_SETTINGS_DIR"] = home / "lab-settings"
    dirs["JUPYTERLAB_WORKSPACES_DIR"] = home / "lab-workspaces"
    for k, d in dirs.items():
        d.mkdir(parents=True, exist_ok=True)
        env[k] = str(d)
    spec = dirs["JUPYTER_DATA_DIR"] / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"}))
    news = dirs["JUPYTERLAB_SETTINGS_DIR"] / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    return env


def write_notebook(path: Path, out: str) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CELL.format(text=TEXT, out=out))])
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": KERNEL, "language": "python"}
    nbformat.write(nb, path)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("notebooks")
    save_tiny("bert", root / "ckpt", seed=1)
    for name in FRONT_ENDS:
        write_notebook(root / f"{name}.ipynb", f"run-{name}")
    home = tmp_path_factory.mktemp("jupyter-home")
    port, token = free_port(), secrets.token_hex(24)
    log = home / "server.log"
    argv = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}"]
    argv += ["--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}"]
    argv += ["--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-root")  # containers and CI run as root; the server refuses otherwise
    with log.open("w") as sink:
        proc = subprocess.Popen(argv, env=isolated_env(home), cwd=root, stdout=sink, stderr=subprocess.STDOUT)
    origin = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the Jupyter server exited ({proc.returncode}): {log.read_text()[-2000:]}", pytrace=False)
            try:
                with urllib.request.urlopen(f"{origin}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the Jupyter server did not answer in 180 s: {log.read_text()[-2000:]}", pytrace=False)
            time.sleep(0.5)
        yield Server(origin, token, root, log)
    finally:
        proc.terminate()  # SIGTERM: the server shuts its kernels down, then exits
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def run_first_cell(page: Any, fe: FrontEnd) -> None:
    """Ctrl+Enter in the first cell until its prompt shows it queued or run: a key press in the moment
    between "idle" and the kernel's connection is dropped by the front end, so press again."""
    started = "e => /[*0-9]/.test(e.textContent)"
    for _ in range(6):
        page.click(fe.editor)
        page.keyboard.press("Control+Enter")
        try:
            page.wait_for_function(
                f"() => ({started})(document.querySelector({json.dumps(fe.prompt)}))", timeout=15_000
            )
            return
        except PlaywrightTimeout:
            continue
    raise AssertionError(f"the first cell never started: {page.text_content(fe.prompt)!r}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from browser_fixture()


@pytest.mark.parametrize("name", list(FRONT_ENDS))
def test_report_runs_in_a_real_notebook(server: Server, browser: Any, name: str) -> None:
    fe = FRONT_ENDS[name]
    if importlib.util.find_spec(fe.module) is None:
        pytest.skip(f"{fe.module} is not installed")
    ctx = browser.new_context(viewport={"width": 1300, "height": 1000})
    try:
        page = ctx.new_page()
        errors: list[str] = []
        requests: list[str] = []
        # the front end's own messages and errors come from the server's scripts (Notebook 7.6 throws one
        # while loading its settings); anything else (about:srcdoc, a CSP refusal) is the report's
        page.on(
            "console",
            lambda m: (
                errors.append(f"console: {m.text} at {m.location}")
                if m.type == "error" and not m.location.get("url", "").startswith(server.origin)
                else None
            ),
        )
        page.on(
            "pageerror",
            lambda e: None if server.origin in (e.stack or "") else errors.append(f"pageerror: {e} {e.stack}"),
        )
        page.on(
            "request", lambda r: None if r.url.startswith((server.origin, "data:", "blob:")) else requests.append(r.url)
        )
        page.goto(f"{server.origin}/{fe.url.format(nb=name + '.ipynb')}?token={server.token}")
        page.wait_for_selector(fe.idle, timeout=180_000)
        run_first_cell(page, fe)
        try:
            iframe = page.wait_for_selector(fe.output, timeout=300_000)
        except PlaywrightTimeout:
            page.screenshot(path=server.log.with_name(f"{name}-failed.png"))
            said = page.evaluate("document.body.innerText").splitlines()
            raise AssertionError(
                f"no report iframe in the output; see {server.log}; the page says: {said[-40:]}"
            ) from None
        assert iframe is not None
        assert iframe.get_attribute("sandbox") == "allow-scripts allow-downloads"  # not rewritten by a sanitiser
        frame = iframe.content_frame()
        assert frame is not None
        frame.wait_for_selector("body[data-ready='1']", timeout=60_000)

        folder = server.root / f"run-{name}"
        manifest = json.loads((folder / "manifest.json").read_text())
        assert manifest["text"] == TEXT
        tok = AutoTokenizer.from_pretrained(str(server.root / "ckpt"))  # the tokens, independently of streetlamp
        assert manifest["tokens"] == tok.convert_ids_to_tokens(tok(TEXT)["input_ids"])
        strip = frame.eval_on_selector_all("#tokens .tok", "es => es.map(e => e.textContent)")
        assert strip == manifest["token_labels"] and len(strip) == len(manifest["tokens"]) > 10
        att = load_arrays(folder / "arrays.safetensors")["attention"].astype(np.float64)
        assert att.shape[:2] == (2, 4) and att.shape[-1] == len(strip)  # the tiny BERT: 2 layers x 4 heads
        frame.select_option("#layer", "1")
        frame.select_option("#head", "2")
        err = 0.5 / 65535 + 1e-6  # 16-bit fixed point, see pack.py
        for t in (0, 3, len(strip) - 2):
            frame.hover(f"#tokens .tok[data-i='{t}']")
            rows = frame.eval_on_selector_all(
                "#raw tbody tr[data-j]",
                "trs => trs.map(tr => [+tr.dataset.j, +tr.querySelector('td.val').dataset.value])",
            )  # one row per listed key (special tokens hidden by default); all 14 fit in the list's view
            keys = [j for j, _ in rows]
            assert set(keys) >= set(range(len(strip))) - set(manifest["special_positions"]), keys
            np.testing.assert_allclose([v for _, v in rows], att[1, 2, t, keys], atol=err)
        assert frame.evaluate("window.streetlamp.errors") == []
        kernels = {x["path"]: x["kernel"]["name"] for x in api(server, "sessions")}
        assert kernels[f"{name}.ipynb"] == KERNEL  # our kernel spec: this Python
        assert errors == [] and requests == []
        shot = os.environ.get("STREETLAMP_NOTEBOOK_SCREENSHOT")
        if shot and name == "jupyterlab":
            page.screenshot(path=shot)
        # the listeners do see the frame: an error logged and one thrown inside it are both recorded
        frame.evaluate("console.error('probe'); setTimeout(() => { throw new Error('probe') })")
        for _ in range(100):  # events are delivered while Playwright waits
            if len(errors) >= 2:
                break
            page.wait_for_timeout(100)
        assert len(errors) == 2 and all("probe" in e for e in errors), errors
    finally:
        ctx.close()
        stop_kernel(server, f"{name}.ipynb")


def api(server: Server, path: str, method: str = "GET") -> Any:
    req = urllib.request.Request(f"{server.origin}/api/{path}", method=method)
    req.add_header("Authorization", f"token {server.token}")
    with urllib.request.urlopen(req, timeout=30) as r:
        body = r.read()
    return json.loads(body) if body else None


def stop_kernel(server: Server, notebook: str) -> None:
    """Shut the notebook's session and kernel down now (each holds a torch process's memory)."""
    for s in api(server, "sessions"):
        if s["path"] == notebook:
            api(server, f"sessions/{s['id']}", "DELETE")
