"""STREETLAMP_REQUIRE_PEERS=1 turns a missing peer library (inseq, lxt, Ray) from a skip into a failure."""

from __future__ import annotations

import pytest

from tests.helpers.peers import missing_peer, require_module


def test_a_missing_peer_skips_or_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREETLAMP_REQUIRE_PEERS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no_such_peer_29"):
        require_module("no_such_peer_29")
    monkeypatch.setenv("STREETLAMP_REQUIRE_PEERS", "1")
    with pytest.raises(pytest.fail.Exception, match="STREETLAMP_REQUIRE_PEERS=1"):
        require_module("no_such_peer_29")
    with pytest.raises(pytest.fail.Exception, match="inseq"):
        missing_peer("inseq not installed", module_level=True)
    assert require_module("json").dumps([]) == "[]"  # a present module is returned
