"""A real browser for the report tests: Debian's Chromium driven by Playwright (never a downloaded build).

Without Chromium or Playwright the browser tests skip with one line; with STREETLAMP_REQUIRE_BROWSER=1
(set by .ci/run) they fail instead.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
LOCAL = ("file:", "data:", "blob:", "about:")


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        p = shutil.which(name)
        if p:
            return p
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


def missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    if chromium_path() is None:
        return "no chromium on PATH (apt-get install chromium; `make test` does it as root)"
    return None


def require_browser() -> None:
    why = missing()
    if why is None:
        return
    if os.environ.get("STREETLAMP_REQUIRE_BROWSER") == "1":
        pytest.fail(f"browser tests required (STREETLAMP_REQUIRE_BROWSER=1) but {why}", pytrace=False)
    pytest.skip(f"report browser tests skipped: {why}", allow_module_level=True)


class Page:
    """A page with every console error, page error, dialog and non-local request recorded."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        page.on("request", lambda r: None if r.url.startswith(LOCAL) else self.requests.append(r.url))
        page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

    def open(self, path: Path, fragment: str = "") -> Page:
        self.page.goto(Path(path).resolve().as_uri() + fragment)
        self.page.wait_for_selector("body[data-ready='1']", timeout=60_000)
        return self

    def clean_events(self) -> None:
        assert self.errors == [], self.errors
        assert self.requests == [], self.requests
        assert self.dialogs == [], self.dialogs

    def clean(self) -> None:
        self.clean_events()
        assert self.page.evaluate("window.streetlamp.errors") == []


def browser_fixture() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=ARGS)
        try:
            yield b
        finally:
            b.close()
