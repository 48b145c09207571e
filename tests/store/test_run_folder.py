"""The one run writer (RunFolder): refusal before work, atomic placement, one manifest header."""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from streetlamp.errors import StreetlampError
from streetlamp.store.files import load_arrays, save_arrays
from streetlamp.store.run_folder import FORMAT_VERSION, RunFolder, manifest_header, utc_now

HEADER = {"streetlamp", "format_version", "created", "command", "versions"}


def _write(rf: RunFolder, value: float = 1.0) -> dict:
    with rf.staging() as w:
        w.add_array("a", np.full((2, 3), value, np.float32), axes=["row", "col"], meaning="filled")
        (w.path / "f.png").write_bytes(b"png")
        w.add_figure(file="f.png", shows="nothing", array="a")
        return w.write_manifest({"model": "m", "seed": 0})


def test_manifest_header_arrays_and_figures(tmp_path: Path) -> None:
    out = tmp_path / "run"
    written = _write(RunFolder(out, "explain"))
    m = json.loads((out / "manifest.json").read_text())
    assert m == json.loads(json.dumps(written))
    assert set(m) == HEADER | {"model", "seed", "arrays", "figures"}
    assert m["streetlamp"] == "explain" and m["format_version"] == FORMAT_VERSION
    assert m["arrays"]["a"] == {
        "axes": ["row", "col"],
        "meaning": "filled",
        "file": "arrays.safetensors",
        "key": "a",
        "shape": [2, 3],
        "dtype": "float32",
    }
    assert m["figures"] == [{"file": "f.png", "shows": "nothing", "array": "a"}]
    assert np.array_equal(load_arrays(out / "arrays.safetensors")["a"], np.ones((2, 3), np.float32))
    assert not list(tmp_path.glob(".run.*"))


def test_same_as_stores_equal_arrays_once(tmp_path: Path) -> None:
    att = np.random.default_rng(0).random((2, 3, 4, 4)).astype(np.float32)
    other = att.copy()
    other[0, 0, 0, 0] += 1.0  # one value differs: stored in full
    with RunFolder(tmp_path / "r", "explain").staging() as w:
        w.add_array("attention", att, axes=["l", "h", "q", "k"], meaning="run")
        w.add_array("attention.attention", att.copy(), axes=["l", "h", "q", "k"], meaning="m", same_as="attention")
        w.add_array("x.attention", other, axes=["l", "h", "q", "k"], meaning="m", same_as="attention")
        w.add_array("y.attention", att.astype(np.float64), axes=["l", "h", "q", "k"], meaning="m", same_as="attention")
        m = w.write_manifest({})
    stored = load_arrays(tmp_path / "r" / "arrays.safetensors")
    assert set(stored) == {"attention", "x.attention", "y.attention"}  # other values, or another dtype
    assert m["arrays"]["attention.attention"]["key"] == "attention"
    assert m["arrays"]["attention.attention"]["same_as"] == "attention"
    assert "same_as" not in m["arrays"]["x.attention"] and m["arrays"]["x.attention"]["key"] == "x.attention"
    for name, d in m["arrays"].items():  # every name reads back through its manifest key
        want = {"x.attention": other, "y.attention": att.astype(np.float64)}.get(name, att)
        assert np.array_equal(stored[d["key"]], want), name


def test_created_is_iso8601_utc() -> None:
    s = utc_now()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", s)
    t = datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert abs((datetime.now(UTC) - t).total_seconds()) < 60
    assert set(manifest_header("x")) == HEADER


def test_refuses_before_work(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(StreetlampError, match="not empty"):
        RunFolder(tmp_path / "full", "heads")
    (tmp_path / "file").write_text("x")
    with pytest.raises(StreetlampError, match="not a folder"):
        RunFolder(tmp_path / "file", "heads", overwrite=True)
    (tmp_path / "empty").mkdir()
    _write(RunFolder(tmp_path / "empty", "heads"))  # an empty folder is fine
    assert (tmp_path / "empty" / "manifest.json").exists()
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"


def test_overwrite_replaces_the_whole_folder(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _write(RunFolder(out, "patch"), 1.0)
    (out / "stale.txt").write_text("old")
    _write(RunFolder(out, "patch", overwrite=True), 2.0)
    assert not (out / "stale.txt").exists()
    assert load_arrays(out / "arrays.safetensors")["a"][0, 0] == 2.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_failure_leaves_nothing_and_keeps_the_old_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _write(RunFolder(out, "prune"), 1.0)
    rf = RunFolder(out, "prune", overwrite=True)
    with pytest.raises(ZeroDivisionError):
        with rf.staging() as w:
            w.add_array("a", np.zeros(2), axes=["x"], meaning="")
            1 / 0  # noqa: B018 - deliberate error inside the staging block
    assert load_arrays(out / "arrays.safetensors")["a"][0, 0] == 1.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    with pytest.raises(RuntimeError, match="without write_manifest"):
        with RunFolder(tmp_path / "new", "prune").staging():
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_writer_checks_its_input(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with RunFolder(tmp_path / "r", "x").staging() as w:
            with pytest.raises(ValueError, match="one axis name per dimension"):
                w.add_array("a", np.zeros((2, 2)), axes=["x"], meaning="")
            w.add_array("a", np.zeros(2), axes=["x"], meaning="")
            with pytest.raises(ValueError, match="twice"):
                w.add_array("a", np.zeros(2), axes=["x"], meaning="")
            with pytest.raises(FileNotFoundError):
                w.add_figure(file="missing.png", shows="")
            w.write_manifest({})
            w.add_array("b", np.zeros(2), axes=["x"], meaning="")  # after the manifest: refused
    assert not (tmp_path / "r").exists()


def test_after_write_sees_the_complete_folder(tmp_path: Path) -> None:
    seen: list[set[str]] = []

    class Hooked(RunFolder):
        def _write_report(self, path: Path) -> None:
            seen.append({p.name for p in path.iterdir()})
            (path / "report.html").write_text("<p>report</p>")

    _write(Hooked(tmp_path / "run", "explain"))
    assert seen == [{"manifest.json", "arrays.safetensors", "f.png"}]
    assert (tmp_path / "run" / "report.html").exists()


def test_folder_and_arrays_get_the_modes_open_and_mkdir_give(tmp_path: Path) -> None:
    # safetensors creates its file 0600 and mkdtemp its folder 0700: a finished run must be as readable as a
    # file open() writes and a folder mkdir makes under the same umask (whatever this machine's umask is)
    (tmp_path / "plain.txt").write_text("x")
    (tmp_path / "plain").mkdir()
    _write(RunFolder(tmp_path / "run", "explain"))
    file_mode = (tmp_path / "plain.txt").stat().st_mode & 0o777
    dir_mode = (tmp_path / "plain").stat().st_mode & 0o777
    assert (tmp_path / "run").stat().st_mode & 0o777 == dir_mode
    for f in ("arrays.safetensors", "manifest.json"):
        assert (tmp_path / "run" / f).stat().st_mode & 0o777 == file_mode, f
    save_arrays(tmp_path / "a.safetensors", {"a": np.zeros(2)})
    assert (tmp_path / "a.safetensors").stat().st_mode & 0o777 == file_mode


def test_a_folder_written_meanwhile_is_never_replaced(tmp_path: Path) -> None:
    """Time of check, time of use: ``out`` is checked at the start and the run moves into place at the end;
    another run that finished into the same ``out`` in between keeps its results (issue 35 item 1)."""
    out = tmp_path / "run"
    rf = RunFolder(out, "circuit")  # checked: absent
    with pytest.raises(StreetlampError, match="written by someone else while this run worked"):
        with rf.staging() as w:
            _write(RunFolder(out, "circuit"), 7.0)  # the other run lands first
            w.add_array("a", np.zeros(2), axes=["x"], meaning="")
            w.write_manifest({})
    assert load_arrays(out / "arrays.safetensors")["a"][0, 0] == 7.0  # the other run's results, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no staging folder left


def test_two_concurrent_writers_one_lands_one_refuses(tmp_path: Path) -> None:
    """Two real writers into one ``out`` at once, both past every check before either moves into place:
    exactly one lands, whole; the other refuses in one line."""
    import threading

    out = tmp_path / "run"
    both_staged = threading.Barrier(2)
    outcome: dict[float, str] = {}

    def writer(value: float) -> None:
        rf = RunFolder(out, "circuit")
        try:
            with rf.staging() as w:
                w.add_array("a", np.full(3, value), axes=["x"], meaning="")
                w.write_manifest({"value": value})
                both_staged.wait(timeout=30)
            outcome[value] = "landed"
        except StreetlampError as e:
            outcome[value] = str(e)

    threads = [threading.Thread(target=writer, args=(v,)) for v in (1.0, 2.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    landed = [v for v, o in outcome.items() if o == "landed"]
    assert len(outcome) == 2 and len(landed) == 1, outcome
    (lost,) = set(outcome) - set(landed)
    assert "written by someone else" in outcome[lost]
    m = json.loads((out / "manifest.json").read_text())
    assert m["value"] == landed[0] and np.all(load_arrays(out / "arrays.safetensors")["a"] == landed[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def _unwritable(tmp_path: Path) -> list[Path]:
    """Folders this process cannot create anything in: a read-only folder (a mode is no bar to root) and,
    on Linux, sysfs (``mkdir`` there fails with EPERM, even for root)."""
    out = []
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        out.append(ro)
    if Path("/sys/kernel").is_dir():
        out.append(Path("/sys"))
    return out


def test_an_output_that_cannot_be_created_is_refused_before_work(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    places = [tmp_path / "afile" / "x", tmp_path / "afile" / "deeper" / "x"]
    places += [d / "run" for d in _unwritable(tmp_path)] + [d / "sub" / "run" for d in _unwritable(tmp_path)]
    assert len(places) >= 3
    for out in places:
        with pytest.raises(StreetlampError, match=f"cannot write {re.escape(str(out))}: "):
            RunFolder(out, "explain")
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("ro")) == ["afile"]
