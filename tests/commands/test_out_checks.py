"""An output that cannot be written is refused before any work, in one line, exit 2 (issue 35 item 1):
``--out`` under a file or under a folder this process cannot write, for every command that writes a run
folder (one-shot and resumable). "Before any work": the model is never loaded (``place`` fails the test);
and two stores made at once into one folder with other settings: the second refuses, the first's
manifest is kept."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import streetlamp.commands.base as B
from streetlamp.cli import main
from streetlamp.commands import COMMANDS
from streetlamp.errors import StreetlampError
from streetlamp.store import RunStore

ARGS = {
    "explain": ["the movie was good"],
    "lens": ["the movie was good"],
    "circuit": ["--task", "ioi"],
    "atlas": ["--data", "{t}/d.txt"],
    "evaluate": ["--data", "{t}/d.csv"],
    "heads": ["--data", "{t}/d.csv"],
    "lens-fit": ["--data", "{t}/d.txt", "--lens", "tuned"],
    "explain-generation": ["the movie was"],
    "prune": ["--data", "{t}/d.csv"],
    "patch": ["--clean", "the movie was good", "--corrupt", "the movie was bad"],
    "mediate": [],
    "features-fit": ["--data", "{t}/d.txt", "--kind", "transcoder"],
    "replicate": ["--data", "movies"],
    "benchmark": ["--tasks", "keyword"],
    "cot": ["--data", "{t}/d.txt"],
    "probe": ["--task", "category"],
    "experts": ["--data", "{t}/d.txt"],
    "features-audit": ["--features", "{t}", "--task", "ioi"],
    "cite": ["--context", "{t}/d.txt", "--question", "what was good"],
    "cite-bench": ["--data", "{t}/bench.jsonl"],
    "graph": ["the movie was", "--features", "{t}"],
    "features": ["the movie was", "--features", "{t}"],
}


def unwritable(tmp_path: Path) -> list[Path]:
    (tmp_path / "afile").write_text("x")
    out = [tmp_path / "afile"]
    if os.geteuid() != 0:  # a mode is no bar to root
        (tmp_path / "ro").mkdir()
        (tmp_path / "ro").chmod(0o555)
        out.append(tmp_path / "ro")
    if Path("/sys/kernel").is_dir():  # sysfs: mkdir fails with EPERM, even for root
        out.append(Path("/sys"))
    return out


@pytest.mark.parametrize("command", sorted(ARGS))
def test_unwritable_out_is_refused_before_the_model_loads(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def place(*a, **k):
        raise AssertionError("the model was loaded before the output was checked")

    monkeypatch.setattr(B, "place", place)
    (tmp_path / "d.txt").write_text("the movie was good\n")
    (tmp_path / "d.csv").write_text("text,label\nthe movie was good,positive\n")
    (tmp_path / "bench.jsonl").write_text(
        '{"sources": ["the movie was good."], "question": "what", "answer": "movie", "planted": [0], "kind": "k"}\n'
    )
    extra = [a.format(t=tmp_path) for a in ARGS[command]]
    extra += (
        ["--model", "minilm-sentiment"]
        if "--model" in COMMANDS[[c.name for c in COMMANDS].index(command)].flags()
        else []
    )
    for base in unwritable(tmp_path):
        for out in (base / "run", base / "deeper" / "run"):
            assert main([command, *extra, "--out", str(out)]) == 2, out
            err = capsys.readouterr().err.strip()
            assert err.startswith(f"streetlamp: error: cannot write {out}: ") and len(err.splitlines()) == 1, err


def test_every_writing_command_is_covered() -> None:
    """Every command that writes a run folder or store (from the registry: a command added later fails here
    until it has its arguments in ARGS)."""
    writing = {c.name for c in COMMANDS if c.writes in ("folder", "store")}
    assert set(ARGS) == writing, (
        f"add to ARGS: {sorted(writing - set(ARGS))}; not writing: {sorted(set(ARGS) - writing)}"
    )


def test_two_stores_made_at_once_with_other_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both runs find no manifest; the other one creates its manifest in between: this one must not
    replace it (its parts would then mix with the other run's), it compares and refuses."""
    import streetlamp.store.run_store as RS

    out = tmp_path / "run"
    real = RS.manifest_header
    calls: list[int] = []

    def header(command: str) -> dict:
        if not calls:
            calls.append(1)
            other = {**real(command), "settings": {"seed": 2}, "who": "other"}
            (out / "manifest.json").write_text(json.dumps(other))  # the other run lands its manifest first
        return real(command)

    monkeypatch.setattr(RS, "manifest_header", header)
    with pytest.raises(StreetlampError, match="other settings"):
        RunStore.open(out, {"seed": 1}, {"who": "this"})
    m = json.loads((out / "manifest.json").read_text())
    assert m["settings"] == {"seed": 2} and m["who"] == "other"
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left
    assert RunStore.open(out, {"seed": 2}, {}).manifest()["who"] == "other"  # the same settings: resumed
