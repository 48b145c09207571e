"""Packaging: the extras of pyproject.toml are the ones streetlamp/extras.py names; a command whose extra is
missing says which ``pip install 'streetlamp[...]'`` to run, in one line, exit 2, before loading a model or
writing anything (simulated by hiding the module); the core runs ``explain`` and ``report`` with every
extra's packages hidden."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from streetlamp.cli import main
from streetlamp.errors import StreetlampError
from streetlamp.extras import EXTRAS, require
from streetlamp.models.tiny import save_tiny
from tests.helpers.cot_helpers import write_questions
from tests.store.test_store import write_data

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = sorted(m for _, table in EXTRAS.values() for m in table)


def dist_name(req: str) -> str:
    for sep in "<>=[; ":
        req = req.split(sep)[0]
    return req.lower()


def test_pyproject_extras_match_extras_py() -> None:
    p = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {dist_name(r) for r in p["dependencies"]}
    opt = p["optional-dependencies"]
    for extra, (_, table) in EXTRAS.items():
        assert {dist_name(r) for r in opt[extra]} == set(table.values()), extra
        assert not core & set(table.values()), f"{extra}'s packages must not be core dependencies"
    assert opt["all"] == ["streetlamp[" + ",".join(EXTRAS) + "]"]
    make = (ROOT / "Makefile").read_text()
    assert "-e '.[test," + ",".join(EXTRAS) + "]'" in make  # `make test` installs every extra


def hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """As if ``modules`` were not installed: ``import m`` raises ImportError and find_spec finds nothing."""
    for m in modules:
        monkeypatch.setitem(sys.modules, m, None)


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_require_names_the_pip_install(extra: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _, table = EXTRAS[extra]
    require(extra)  # installed here (make test installs every extra)
    gone = next(iter(table))
    hide(monkeypatch, gone)
    with pytest.raises(StreetlampError) as e:
        require(extra)
    msg = str(e.value)
    assert "\n" not in msg and f"pip install 'streetlamp[{extra}]'" in msg and table[gone] in msg


def run(capsys: pytest.CaptureFixture, argv: list[str]) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err


def one_line(err: str, extra: str) -> bool:
    return err.count("\n") == 1 and err.startswith("streetlamp: error:") and f"'streetlamp[{extra}]'" in err


def test_serve_without_its_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    hide(monkeypatch, "uvicorn")
    rc, err = run(capsys, ["serve", "--model", "no-such-model-is-loaded"])  # refused before any model loads
    assert rc == 2 and one_line(err, "serve") and "uvicorn" in err


def test_ray_engine_without_its_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    data = write_data(tmp_path / "d.csv", 4)
    hide(monkeypatch, "ray")
    out = tmp_path / "r"
    rc, err = run(
        capsys, ["evaluate", "--model", "no-such-model", "--data", str(data), "--engine", "ray", "--out", str(out)]
    )
    assert rc == 2 and one_line(err, "ray") and not out.exists()


def test_cot_endpoint_without_its_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    data = write_questions(tmp_path / "q.jsonl", 2)
    hide(monkeypatch, "httpx")
    out = tmp_path / "r"
    rc, err = run(capsys, ["cot", "--endpoint", "http://127.0.0.1:9/v1", "--data", str(data), "--out", str(out)])
    assert rc == 2 and one_line(err, "cot") and "httpx" in err and not out.exists()


def test_probe_without_its_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    hide(monkeypatch, "concept_erasure")
    out = tmp_path / "r"
    rc, err = run(capsys, ["probe", "--task", "sentiment", "--model", "no-such-model", "--out", str(out)])
    assert rc == 2 and one_line(err, "probe") and "concept-erasure" in err and not out.exists()
    from streetlamp.probing.tasks import spacy_pipeline

    hide(monkeypatch, "spacy")
    with pytest.raises(StreetlampError, match=r"pip install 'streetlamp\[probe\]'"):
        spacy_pipeline()


BLOCKER = """
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {hidden!r}:
            raise ImportError(f"{{name}} is hidden (not an installed extra)")
sys.meta_path.insert(0, Hide())
from streetlamp.cli import main
rc = main({argv!r})
sys.exit(rc)
"""


def test_core_commands_run_with_every_extra_hidden(tmp_path: Path) -> None:
    """explain (its report included) and report in a fresh interpreter where no extra's package imports."""
    ckpt = save_tiny("bert", tmp_path / "bert", seed=1)
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for argv in (
        ["explain", "the movie was good", "--model", str(ckpt), "--methods", "attention,occlusion", "--out", str(out)],
        ["report", str(out)],
    ):
        code = BLOCKER.format(hidden=HIDDEN, argv=argv)
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
    assert (out / "report.html").stat().st_size > 10_000
    probe = BLOCKER.format(hidden=HIDDEN, argv=["serve", "--model", str(ckpt)])  # the blocker itself works
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 2 and "pip install 'streetlamp[serve]'" in p.stderr


def test_every_data_file_is_package_data() -> None:
    """Each tracked non-Python file under src/streetlamp matches a [tool.setuptools.package-data] glob, so the
    wheel carries it (the slow end-to-end check is `make wheel-check`, run by .ci/run)."""
    import fnmatch

    p = subprocess.run(["git", "ls-files", "src/streetlamp"], cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip("not a git checkout")
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["streetlamp"]
    files = [f.removeprefix("src/streetlamp/") for f in p.stdout.split() if not f.endswith((".py", ".typed"))]
    assert len(files) > 10  # the embedded weights, the viewer's assets, the bundled data
    unpackaged = [
        f for f in files if not any(fnmatch.fnmatchcase(f, g) and f.count("/") == g.count("/") for g in globs)
    ]
    assert not unpackaged, f"not in the wheel: {unpackaged}; add a glob to pyproject.toml's package-data"


def test_no_tracked_file_is_a_symlink() -> None:
    """A committed symlink (a venv linked in from another worktree) points outside a fresh clone, and `make`
    then fails on it: stop 32's CI failed on a tracked `.tl-venv -> /work/main/.tl-venv`."""
    p = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip("not a git checkout")
    links = [line.split("\t", 1)[1] for line in p.stdout.splitlines() if line.startswith("120000 ")]
    assert not links, f"tracked symlinks: {links}"
