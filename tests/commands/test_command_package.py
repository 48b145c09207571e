"""A new command is one package plus one registry line (issue 36): a toy package written to disk at test time
(``__init__.py`` with its settings and Command, ``run.py`` with ``run(adapter, settings, out, options)``) is
registered, runs through the CLI and the Python API, keeps ``--help`` free of its run module, and its declared
constraint refuses the same value with the same line from both."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from streetlamp import commands
from streetlamp.models.tiny import save_tiny

INIT = """
from dataclasses import dataclass

from streetlamp.commands.base import Command, lazy
from streetlamp.settings import Settings, option


@dataclass
class CountSettings(Settings):
    text: str = option("", positional=True, help="the text")
    copies: int = option(2, ge=1, le=5, help="rows of the stored array")


COUNT = Command("count", "store a text's token count", CountSettings, lazy(__name__ + ".run"), views=("generic",))
"""
RUN = """
import numpy as np

from streetlamp.commands.base import Lines


def run(adapter, s, out, options):
    n = len(adapter.encode(s.text).tokens[0])
    with out.staging() as w:
        w.add_array("n_tokens", np.full(s.copies, n), axes=["copy"], meaning="tokens of the text, once per copy")
        w.write_manifest({"model": adapter.name, "text": s.text, "seed": s.seed})
    return Lines([f"count: {n} tokens x {s.copies}"], out.out)
"""


@pytest.fixture()
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pkg = tmp_path / "src" / "toycount"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(INIT)
    (pkg / "run.py").write_text(RUN)
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    for m in ("toycount", "toycount.run"):
        sys.modules.pop(m, None)
    mod = importlib.import_module("toycount")
    monkeypatch.setattr(commands, "COMMANDS", [*commands.COMMANDS, mod.COUNT])  # the one registry line
    yield mod.COUNT
    for m in ("toycount", "toycount.run"):
        sys.modules.pop(m, None)


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("bert", tmp_path_factory.mktemp("pkg") / "bert", seed=1)


def test_a_command_package_runs_from_the_cli_and_the_api(toy, bert: Path, tmp_path: Path, capsys) -> None:
    from streetlamp.api import function_of
    from streetlamp.cli import build_parser, main

    build_parser()
    assert "toycount.run" not in sys.modules  # --help builds the parser without importing the run module
    out = tmp_path / "run"
    assert main(["count", "the movie was good", "--model", str(bert), "--copies", "3", "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "count: 6 tokens x 3"
    assert json.loads((out / "manifest.json").read_text())["streetlamp"] == "count"
    assert (out / "report.html").is_file()
    res = function_of(toy)("a good movie", model=str(bert), copies="2")  # the CLI's string works in the API
    assert res.arrays["n_tokens"].tolist() == [5, 5]


@pytest.mark.parametrize(
    "value,msg",
    [
        ("0", "--copies must be at least 1 (got 0)"),
        ("6", "--copies must be at most 5 (got 6)"),
        ("2.5", "--copies must be an integer (got '2.5')"),
        ("ten", "--copies must be an integer (got 'ten')"),
    ],
)
def test_a_declared_constraint_refuses_alike_from_cli_and_api(
    toy, bert: Path, tmp_path: Path, capsys, value: str, msg: str
) -> None:
    from streetlamp.api import function_of
    from streetlamp.cli import main
    from streetlamp.errors import StreetlampError

    out = tmp_path / "o"
    assert main(["count", "the movie", "--model", str(bert), "--copies", value, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1 and not out.exists()
    with pytest.raises(StreetlampError) as e:
        function_of(toy)("the movie", model=str(bert), copies=value, out=str(out))
    assert str(e.value) == msg and not out.exists()
