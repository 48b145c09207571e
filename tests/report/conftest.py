"""The report's browser tests share one Chromium per module and one fresh page (1300 × 900) per test.

A module that needs another viewport or context defines its own `page`; each module still calls
`require_browser()` at import so it skips (or fails under STREETLAMP_REQUIRE_BROWSER=1) with one line.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.browser import Page, browser_fixture


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from browser_fixture()


@pytest.fixture()
def page(browser: Any) -> Iterator[Page]:
    ctx = browser.new_context(viewport={"width": 1300, "height": 900}, accept_downloads=True)
    pg = Page(ctx.new_page())
    yield pg
    ctx.close()
