"""A message names only options of the command that printed it (issue 35 item 5).

``circuit`` on a pair longer than the model's window told the user to "pass --truncate", which
``circuit`` does not take (the message came from the model's encoder, shared by every command). The
encoder now asks the running command (``streetlamp.errors.takes``); ``tests/conftest.py`` checks every
error of every command run in the suite against that command's options (:mod:`tests.helpers.flags`)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from streetlamp.cli import main
from streetlamp.commands import COMMANDS, get
from streetlamp.commands.parser import add_command
from streetlamp.errors import takes
from streetlamp.models.tiny import save_tiny
from tests.helpers.flags import foreign_flags

POSITIONS = 64  # the tiny Llama's max_position_embeddings
LONG = " ".join(["the movie was good"] * POSITIONS)  # four windows


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("flags") / "llama", seed=1)


def test_a_commands_flags_are_its_parsers() -> None:
    """``Command.flags()`` (what ``takes`` answers from) is exactly the option list of its parser."""
    sub = argparse.ArgumentParser().add_subparsers()
    for c in COMMANDS:
        p = add_command(sub, c)
        parser = {s for a in p._actions for s in a.option_strings if s.startswith("--")} - {"--help"}
        assert c.flags() == parser, c.name


def test_the_check_itself() -> None:
    circuit = get("circuit")
    assert foreign_flags(circuit, "text 0 is long; pass --truncate to cut it") == ["--truncate"]
    assert foreign_flags(circuit, "lower --bootstrap or --random") == []
    assert foreign_flags(circuit, "convert it with `streetlamp lens-fit --convert DIR`") == []
    assert foreign_flags(circuit, "pip install --no-deps 'ray[client]'") == []
    assert takes("--truncate")  # outside a command (the library called directly) every option counts


@pytest.mark.parametrize(
    "argv",
    [
        lambda t, m: ["circuit", "--model", m, "--task", t / "pairs.csv", "--methods", "eap"],
        lambda t, m: ["lens", LONG, "--model", m],
    ],
    ids=["circuit", "lens"],
)
def test_a_prompt_over_the_window_names_no_option_the_command_lacks(
    argv, llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    long_pair = LONG
    (tmp_path / "pairs.csv").write_text(
        f"clean,corrupt,answer,wrong\n{long_pair},{long_pair.replace('good', 'bad')}, good, bad\n"
    )
    out = tmp_path / "run"
    args = [str(a) for a in argv(tmp_path, str(llama))]
    assert main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("streetlamp: error: text 0 has ") and "\n" not in err, err
    assert f"but the model takes at most {POSITIONS}; " in err and "--truncate" not in err, err
    assert not out.exists()


def test_a_command_with_truncate_still_names_it(llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    assert main(["explain", LONG, "--model", str(llama), "--methods", "attention", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "pass --truncate to cut it" in err and not out.exists(), err
