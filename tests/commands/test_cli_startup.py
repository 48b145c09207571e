"""``streetlamp --help`` and ``streetlamp COMMAND --help`` import neither torch nor transformers
(the parser is built from the command registry, whose modules import only settings and specs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from streetlamp.commands import COMMANDS

PROBE = """
import sys
from streetlamp.cli import main
try:
    main({argv!r})
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("torch", "transformers", "numpy", "pandas", "matplotlib") if m in sys.modules)
print("HEAVY", heavy, "EXIT", code, file=sys.stderr)
"""


def run_help(argv: list[str]) -> tuple[str, str]:
    env_src = str(Path(__file__).resolve().parents[2] / "src")
    p = subprocess.run(
        [sys.executable, "-c", PROBE.format(argv=argv)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": env_src, "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    return p.stdout, p.stderr


@pytest.mark.parametrize("command", [None] + [c.name for c in COMMANDS])
def test_help_imports_no_torch(command: str | None) -> None:
    out, err = run_help(["--help"] if command is None else [command, "--help"])
    assert "HEAVY [] EXIT 0" in err, err
    assert out.startswith("usage: streetlamp") and (command is None or f"streetlamp {command}" in out)


def test_a_bad_flag_is_refused_before_torch_too() -> None:
    _, err = run_help(["explain", "x", "--nope"])
    assert "unrecognized arguments: --nope" in err and "HEAVY [] EXIT 2" in err
