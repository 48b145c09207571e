"""scripts/mutate.py (``make mutate``) fails loudly (issue 35, item 12): a wrong module or test path is one
line and exit 2; a mutmut run that fails, or that leaves mutants unchecked, exits 1 with the log's tail and
keeps its scratch folder; tests in sub-folders reach the scratch folder whole. mutmut itself is replaced by a
shell script here (a real run takes minutes: docs/developing.md records one)."""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("mutate_script", ROOT / "scripts" / "mutate.py")
assert spec is not None and spec.loader is not None
mutate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mutate)

MODULE, TEST = "src/streetlamp/probing/control.py", "tests/probing/test_probe_control.py"


def fake_mutmut(tmp_path: Path, monkeypatch, run_rc: int, results: str) -> None:
    exe = tmp_path / "mutmut"
    exe.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = run ]; then echo "Stopping early: the first run failed"; exit {run_rc}; fi\n'
        f"printf '{results}'\n"
    )
    exe.chmod(0o755)
    monkeypatch.setattr(mutate.shutil, "which", lambda name, path=None: str(exe))
    (tmp_path / "scratch").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "scratch"))


def kept(tmp_path: Path) -> Path:
    (work,) = (tmp_path / "scratch").iterdir()
    return work


@pytest.mark.parametrize(
    "args, says",
    [
        (["--modules", "src/streetlamp/nothing.py", "--tests", TEST], "MODULES: src/streetlamp/nothing.py"),
        (["--modules", "README.md", "--tests", TEST], "MODULES: README.md"),
        (["--modules", MODULE, "--tests", "test_probe_control.py"], "TESTS: test_probe_control.py"),
    ],
)
def test_a_wrong_path_is_one_line_and_exit_2(args: list[str], says: str, capsys) -> None:
    assert mutate.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mutate: {says}") and err.count("\n") == 1


def test_no_module_changed_is_exit_2_naming_modules(monkeypatch, capsys) -> None:
    monkeypatch.setattr(mutate, "changed_modules", lambda: [])
    assert mutate.main(["--tests", TEST]) == 2
    assert "MODULES=" in capsys.readouterr().err


def test_a_failed_mutmut_run_exits_1_and_keeps_a_complete_scratch_folder(tmp_path, monkeypatch, capsys) -> None:
    fake_mutmut(tmp_path, monkeypatch, 1, "    streetlamp.probing.control.x__mutmut_1: not checked\\n")
    assert mutate.main(["--modules", MODULE, "--tests", TEST]) == 1
    err = capsys.readouterr().err
    assert "FAILED (mutmut run exited 1)" in err and "Stopping early: the first run failed" in err
    work = kept(tmp_path)
    assert str(work) in err
    # tests/ whole (sub-folders, their conftest and helpers), the selection by its path under tests/
    for f in ROOT.joinpath("tests").rglob("*.py"):
        assert (work / f.relative_to(ROOT)).is_file(), f
    cfg = tomllib.loads((work / "pyproject.toml").read_text())
    assert cfg["tool"]["mutmut"]["pytest_add_cli_args_test_selection"] == [TEST]
    assert cfg["tool"]["mutmut"]["only_mutate"] == [MODULE]
    assert cfg["tool"]["pytest"]["ini_options"]["markers"]  # the project's pytest settings came along
    shutil.rmtree(work)


def test_unchecked_mutants_after_a_clean_exit_are_a_failure(tmp_path, monkeypatch, capsys) -> None:
    rows = "    m__mutmut_1: killed\\n    m__mutmut_2: not checked\\n"
    fake_mutmut(tmp_path, monkeypatch, 0, rows)
    assert mutate.main(["--modules", MODULE, "--tests", TEST]) == 1
    assert "1 mutants not checked" in capsys.readouterr().err
    shutil.rmtree(kept(tmp_path))


def test_a_complete_run_exits_0_and_lists_the_survivors(tmp_path, monkeypatch, capsys) -> None:
    rows = "    m__mutmut_1: killed\\n    m__mutmut_2: survived\\n    m__mutmut_3: no tests\\n"
    fake_mutmut(tmp_path, monkeypatch, 0, rows)
    assert mutate.main(["--modules", MODULE, "--tests", TEST]) == 0
    out = capsys.readouterr().out
    assert "3 mutants" in out and "1 killed" in out and "1 survived" in out and "survived: m__mutmut_2" in out
    assert not any((tmp_path / "scratch").iterdir())  # removed after a complete run
