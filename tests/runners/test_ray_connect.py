"""``--engine ray`` with a cluster address that cannot be used (issue 35 item 6): one line naming the
address, exit 2, within the connect timeout, and no run folder (nor circuit's checkpoint) left behind:
a ``ray://`` address without Ray Client's package, and an address nothing listens on (which made
``ray.init`` retry for minutes)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

from streetlamp.cli import main
from streetlamp.errors import StreetlampError
from streetlamp.models.tiny import save_tiny
from tests.conftest import free_port
from tests.helpers.peers import require_module


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    require_module("ray")
    t = tmp_path_factory.mktemp("rayconnect")
    (t / "d.csv").write_text("text,label\nthe movie was good,positive\nthe film was bad,negative\n")
    (t / "d.txt").write_text("the movie was good\nthe film was bad\n")
    (t / "pairs.csv").write_text(
        "clean,corrupt,answer,wrong\nthe movie was good and the acting,the film was bad and the acting, good, bad\n"
    )
    return {"t": t, "bert": save_tiny("bert", t / "bert", seed=1), "llama": save_tiny("llama", t / "llama", seed=1)}


def commands(s: dict[str, Path]) -> dict[str, list[str]]:
    t = s["t"]
    return {
        "evaluate": ["evaluate", "--model", str(s["bert"]), "--data", str(t / "d.csv"), "--methods", "attention"],
        "atlas": ["atlas", "--model", str(s["llama"]), "--data", str(t / "d.txt")],
        "circuit": ["circuit", "--model", str(s["llama"]), "--task", str(t / "pairs.csv"), "--methods", "eap"],
    }


@pytest.mark.parametrize("command", ["evaluate", "atlas", "circuit"])
@pytest.mark.parametrize("kind", ["refused", "client"])
def test_an_unusable_address_is_one_line_and_no_folder(
    setup: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    command: str,
    kind: str,
) -> None:
    import ray

    address = f"127.0.0.1:{free_port()}" if kind == "refused" else f"ray://127.0.0.1:{free_port()}"
    if kind == "client":  # as where ray[client] (grpc) is not installed, whatever this machine has
        real = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "grpc" else real(n, *a))
    out = tmp_path / "run"
    t0 = time.monotonic()
    code = main([*commands(setup)[command], "--engine", "ray", "--ray-address", address, "--out", str(out)])
    took = time.monotonic() - t0
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if line.startswith("streetlamp:")]
    assert code == 2 and len(lines) == 1 and address in lines[0] and "Traceback" not in err, err
    assert ("Connection refused" if kind == "refused" else "pip install 'ray[client]'") in lines[0]
    assert took < 60  # the connect timeout is 10 s; the model load and the checks take the rest
    assert not ray.is_initialized()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no run folder, no hidden checkpoint


def test_a_silent_address_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """An address that accepts nothing and refuses nothing (a dropped packet): the probe waits ``timeout``,
    not Ray's minutes of retries. A listening socket that never accepts stands in: its backlog full, the
    kernel leaves further connection attempts unanswered."""
    import socket

    require_module("ray")
    from streetlamp.commands.ray_engine import connect

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(0)
        port = srv.getsockname()[1]
        fill = []
        for _ in range(8):  # fill the backlog
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(("127.0.0.1", port))
            fill.append(c)
        t0 = time.monotonic()
        try:
            with pytest.raises(StreetlampError, match=rf"127\.0\.0\.1:{port} \(no answer; waited at most 1 s\)"):
                connect(f"127.0.0.1:{port}", timeout=1.0)
        finally:
            for c in fill:
                c.close()
        assert time.monotonic() - t0 < 5
