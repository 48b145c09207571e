"""Peer libraries the comparisons need (inseq, lxt, Ray): a missing peer skips its test with one line, or,
with ``STREETLAMP_REQUIRE_PEERS=1`` (set by .ci/run), fails it, as STREETLAMP_REQUIRE_BROWSER does for
the browsers (tests/helpers/browser.py): a comparison that silently did not run is not a comparison."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def required() -> bool:
    return os.environ.get("STREETLAMP_REQUIRE_PEERS") == "1"


def missing_peer(why: str, module_level: bool = False) -> None:
    """Skip (or, when peers are required, fail) because ``why``."""
    if required():
        pytest.fail(f"peer comparison required (STREETLAMP_REQUIRE_PEERS=1) but {why}", pytrace=False)
    pytest.skip(f"peer comparison skipped: {why}", allow_module_level=module_level)


def require_module(name: str) -> ModuleType:
    """``pytest.importorskip(name)``, failing instead where peers are required."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        missing_peer(f"{name} cannot be imported ({e}); `make setup` installs it")
        raise  # unreachable: skip and fail raise
