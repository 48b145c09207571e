"""The command registry is the one place a command is added: a test-only command registered here
(one settings dataclass, one ``run``, one Command, one registry line) works end to end through the
CLI and the Python API; the README's command table and the report views follow the registry."""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from streetlamp import commands
from streetlamp.cli import build_parser, main
from streetlamp.commands import COMMANDS, Command, Lines
from streetlamp.models.tiny import save_tiny
from streetlamp.settings import Settings, at_least, option

ROOT = Path(__file__).resolve().parents[2]


# -- a test-only command: one module's worth of code and one registry line ---------------------------
@dataclass
class EchoSettings(Settings):
    text: str = option("", positional=True, help="the text whose token count is stored")
    copies: int = option(2, help="rows of the stored array")

    def check(self) -> None:
        super().check()
        at_least(self.copies, 1, "--copies")

    def validate(self, adapter) -> None:
        if adapter.kind != "classifier":
            raise ValueError("unreachable in this test")


def run_echo(adapter, s: EchoSettings, out, opts) -> Lines:
    n = len(adapter.encode(s.text).tokens[0])
    with out.staging() as w:
        w.add_array("n_tokens", np.full(s.copies, n), axes=["copy"], meaning="tokens of the text, once per copy")
        w.write_manifest({"model": adapter.name, "text": s.text, "seed": s.seed})
    return Lines([f"echo: {n} tokens x {s.copies}"], out.out)


ECHO = Command("echo", "store a text's token count", EchoSettings, run_echo, views=("generic",))


@pytest.fixture()
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands, "COMMANDS", [*COMMANDS, ECHO])


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("bert", tmp_path_factory.mktemp("cmd") / "bert", seed=1)


def test_a_registered_command_runs_end_to_end(registered, bert: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["echo", "the movie was good", "--model", str(bert), "--copies", "3", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out.splitlines()
    m = json.loads((out / "manifest.json").read_text())
    assert m["streetlamp"] == "echo" and m["text"] == "the movie was good" and m["seed"] == 0
    from streetlamp.store.files import load_arrays

    n = load_arrays(out / "arrays.safetensors")["n_tokens"]
    assert n.tolist() == [6, 6, 6]  # [CLS] the movie was good [SEP]
    assert stdout == ["echo: 6 tokens x 3", f"report: {out / 'report.html'}"]
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")  # the pipeline wrote it
    # the shared options came with it, declared once: --seed, --batch-size, --device, --dtype, --overwrite ...
    assert main(["echo", "the movie", "--model", str(bert), "--seed", "5", "--out", str(out), "--overwrite"]) == 0
    assert json.loads((out / "manifest.json").read_text())["seed"] == 5


@pytest.mark.parametrize(
    "extra,msg",
    [
        (["--copies", "0"], "--copies must be at least 1"),
        (["--batch-size", "0"], "--batch-size must be at least 1"),
        (["--max-memory", "cpu=1GiB"], "need --device-map auto"),
    ],
)
def test_a_registered_command_refuses_in_one_line(
    registered, bert: Path, tmp_path: Path, capsys, extra: list[str], msg: str
) -> None:
    assert main(["echo", "the movie", "--model", str(bert), "--out", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1 and not (tmp_path / "o").exists()


def test_a_registered_command_in_the_python_api(registered, bert: Path) -> None:
    from streetlamp.api import function_of, names

    assert names()["echo"] is ECHO
    res = function_of(ECHO)("a good movie", model=str(bert), copies=2)
    assert res.arrays["n_tokens"].tolist() == [5, 5] and res.lines() == ["echo: 5 tokens x 2"]
    assert "<iframe" in res._repr_html_() and res.out.name.startswith("streetlamp-echo-")


def test_registry_is_consistent() -> None:
    names = [c.name for c in COMMANDS]
    assert len(set(names)) == len(names)
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    assert list(sub.choices) == names  # the parser is the registry
    for c in COMMANDS:
        assert c.help and callable(c.run) and c.writes in ("folder", "store", None)
        for f in dataclasses.fields(c.settings):  # every field is the user's, with its metadata (or says not)
            assert "cli" in f.metadata, (c.name, f.name)


def test_constants_that_keep_help_import_free_match_their_sources() -> None:
    from streetlamp.commands.replicate import DATASETS
    from streetlamp.commands.replicate import run as replicate
    from streetlamp.models.loading import DEFAULT_MODEL
    from streetlamp.settings import DEFAULT_MODEL as SETTINGS_DEFAULT

    assert SETTINGS_DEFAULT == DEFAULT_MODEL and DATASETS == replicate.DATASETS


def test_readme_command_table_is_the_registry() -> None:
    """Every registered command has a row in README.md's command table, and every row names one."""
    text = (ROOT / "README.md").read_text()
    table = text.split("## Commands", 1)[1].split("\n\n|", 1)[1].split("\n\n", 1)[0]
    rows = [r for r in table.splitlines() if r.startswith("| `streetlamp")]
    named = set()
    for r in rows:
        first = r.split("` |", 1)[0]
        named |= set(re.findall(r"streetlamp ([a-z][a-z-]*)", first)) | set(re.findall(r"\\\| ([a-z][a-z-]+)", first))
    assert named == {c.name for c in COMMANDS}


def test_every_declared_view_exists_in_the_viewer() -> None:
    static = ROOT / "src" / "streetlamp" / "report" / "viewer" / "static"
    js = "\n".join(p.read_text() for p in static.glob("*.js"))
    defined = set(re.findall(r"""V\["([\w-]+)"\]\s*=""", js)) | set(re.findall(r"\bviews\.(\w+)\s*=", js))
    defined |= set(re.findall(r"\b(?:VIEWS|V)\.(\w+)\s*=", js))
    assert {"explain", "generic"} <= defined
    for c in COMMANDS:
        assert set(c.views) <= defined, (c.name, set(c.views) - defined)
        if c.name in defined:  # the page opens the view named after the manifest's command
            assert c.name in c.views, c.name
        if c.writes is not None and c.name != "replicate":  # replicate's folder has summary files, no report
            assert c.views, c.name


def test_store_never_imports_report() -> None:
    """Storage never renders: no module of store/ imports report/, at module level or in a function;
    the command pipeline writes report.html after the run."""
    import ast

    store = ROOT / "src" / "streetlamp" / "store"
    for f in store.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                target = "." * node.level + (node.module or "")
                assert "report" not in target.split("."), (f.name, target)
            elif isinstance(node, ast.Import):
                assert not any(".report" in a.name for a in node.names), f.name


def test_a_run_folder_written_outside_the_pipeline_has_no_report(bert: Path, tmp_path: Path) -> None:
    """The runner writes results only; the pipeline (CLI, API) adds report.html; `report DIR` still builds it."""
    from streetlamp.commands.explain import ExplainSettings
    from streetlamp.commands.explain.run import explain
    from streetlamp.models.loading import load

    res = explain(
        load(str(bert)), ExplainSettings.from_values(text="the movie was good", methods=["attention"]), tmp_path / "e"
    )
    assert (res.out / "manifest.json").exists() and not (res.out / "report.html").exists()
    assert main(["report", str(res.out)]) == 0 and (res.out / "report.html").exists()


def test_settings_and_specs_stay_on_the_lowest_floor() -> None:
    """settings.py and specs.py import nothing of streetlamp but errors and specs, lazily or not (only
    ``if TYPE_CHECKING`` is exempt): the registry checks live in commands/checks.py, above them."""
    import ast

    for name in ("settings.py", "specs.py"):
        tree = ast.parse((ROOT / "src" / "streetlamp" / name).read_text())
        skip = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
            for n in ast.walk(node)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level and id(node) not in skip:
                assert node.module in ("errors", "specs"), (name, node.module)
