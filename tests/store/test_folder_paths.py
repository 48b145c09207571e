"""A run folder from elsewhere cannot make streetlamp read a file outside it: every attack on the names a
manifest holds (absolute path, ``..``, a symlink to an outside file or folder, a FIFO or a folder where a
file belongs, a sibling folder sharing the name's prefix) is refused by ``streetlamp report DIR`` in one line
with exit 2 and no report.html; the run store, the long-context reader and ``attention-row`` refuse the same.
Each attack has a control: the same folder with the file inside it is read, so a refusal is not a blanket one."""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from streetlamp.cli import main
from streetlamp.errors import StreetlampError
from streetlamp.models.tiny import save_tiny
from streetlamp.store.files import folder_file
from streetlamp.store.run_store import RunStore, read_metrics

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
SECRET = "secret-of-the-reporting-machine"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Files of 'this machine', outside every run folder: a PNG, a CSV, a safetensors file, a JSON manifest."""
    d = tmp_path / "home"
    d.mkdir()
    (d / "secret.png").write_bytes(PNG + SECRET.encode())
    (d / "secret.csv").write_text(f"key\n{SECRET}\n")
    save_file({"attention": np.full((1, 1, 2, 2), 0.5, np.float32)}, str(d / "secret.safetensors"))
    (d / "manifest.json").write_text(json.dumps({"streetlamp": "probe", "tables": [], "note": SECRET}))
    return d


def generic(tmp_path: Path, name: str = "run", figures: list | None = None, files: dict | None = None) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "manifest.json").write_text(
        json.dumps({"streetlamp": "probe", "figures": figures or [], "files": files or {}})
    )
    return folder


def report_refused(capsys: pytest.CaptureFixture, folder: Path, message: str) -> None:
    assert main(["report", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("streetlamp: error:") and message in err, err
    assert not (folder / "report.html").exists() and not list(folder.glob(".report.html.tmp-*"))


def report_ok(capsys: pytest.CaptureFixture, folder: Path) -> str:
    assert main(["report", str(folder)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    return (folder / "report.html").read_text()


ESCAPES = "leads outside the run folder"


def attack(kind: str, tmp_path: Path, outside: Path) -> tuple[Path, str]:
    """A crafted run folder and the words its refusal must contain."""
    if kind == "absolute_png":
        return generic(tmp_path, figures=[{"file": str(outside / "secret.png"), "shows": "x"}]), "an absolute path"
    if kind == "absolute_csv":
        return generic(tmp_path, files={str(outside / "secret.csv"): "x"}), "an absolute path"
    if kind == "dotdot_csv":
        return generic(tmp_path, files={"../home/secret.csv": "x"}), ESCAPES
    if kind == "dotdot_inner":  # goes down, then up past the folder
        f = generic(tmp_path, figures=["sub/../../home/secret.png"])
        (f / "sub").mkdir()
        return f, ESCAPES
    if kind == "symlink_file":
        f = generic(tmp_path, figures=[{"file": "fig.png", "shows": "x"}])
        (f / "fig.png").symlink_to(outside / "secret.png")
        return f, ESCAPES
    if kind == "symlink_dir":
        f = generic(tmp_path, files={"tables/secret.csv": "x"})
        (f / "tables").symlink_to(outside, target_is_directory=True)
        return f, ESCAPES
    if kind == "relative_symlink":
        f = generic(tmp_path, files={"t.csv": "x"})
        (f / "t.csv").symlink_to("../home/secret.csv")
        return f, ESCAPES
    if kind == "fifo":
        f = generic(tmp_path, figures=[{"file": "fig.png", "shows": "x"}])
        os.mkfifo(f / "fig.png")  # reading it would block the report forever
        return f, "not a regular file"
    if kind == "dir_for_file":
        f = generic(tmp_path, files={"t.csv": "x"})
        (f / "t.csv").mkdir()
        return f, "not a regular file"
    if kind == "sibling_prefix":  # 'run2' starts with 'run': a string-prefix check would let it through
        sib = tmp_path / "run2"
        sib.mkdir()
        shutil.copy(outside / "secret.csv", sib / "secret.csv")
        return generic(tmp_path, files={"../run2/secret.csv": "x"}), ESCAPES
    if kind == "manifest_symlink":
        f = tmp_path / "run"
        f.mkdir()
        (f / "manifest.json").symlink_to(outside / "manifest.json")
        return f, ESCAPES
    raise AssertionError(kind)


ATTACKS = [
    "absolute_png",
    "absolute_csv",
    "dotdot_csv",
    "dotdot_inner",
    "symlink_file",
    "symlink_dir",
    "relative_symlink",
    "fifo",
    "dir_for_file",
    "sibling_prefix",
    "manifest_symlink",
]


@pytest.mark.parametrize("kind", ATTACKS)
def test_report_refuses_every_attack(kind: str, tmp_path: Path, outside: Path, capsys: pytest.CaptureFixture) -> None:
    folder, message = attack(kind, tmp_path, outside)
    report_refused(capsys, folder, message)


def test_report_reads_the_same_files_inside_the_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The control: a PNG, a CSV in a subfolder, an inner symlink and ``sub/../`` are all read."""
    f = generic(
        tmp_path,
        figures=[{"file": "fig.png", "shows": "x"}, {"file": "link.png", "shows": "y"}],
        files={"tables/t.csv": "z", "tables/../u.csv": "w"},
    )
    (f / "fig.png").write_bytes(PNG)
    (f / "link.png").symlink_to("fig.png")
    (f / "tables").mkdir()
    (f / "tables" / "t.csv").write_text(f"key\n{SECRET}-t\n")
    (f / "u.csv").write_text(f"key\n{SECRET}-u\n")
    html = report_ok(capsys, f)
    assert html.count("data:image/png;base64," + base64.b64encode(PNG).decode()) == 2
    assert f"{SECRET}-t" in html and f"{SECRET}-u" in html


def test_a_missing_listed_figure_is_skipped_not_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    f = generic(tmp_path, figures=[{"file": "gone.png", "shows": "x"}])
    assert "gone.png" in report_ok(capsys, f)


@pytest.fixture(scope="module")
def explain_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("e")
    ckpt = save_tiny("gpt2", root / "gpt2", seed=1)
    out = root / "run"
    assert (
        main(["explain", "the movie was not good", "--model", str(ckpt), "--methods", "attention", "--out", str(out)])
        == 0
    )
    return out


def test_explain_arrays_symlinked_out_are_refused(
    explain_run: Path, tmp_path: Path, outside: Path, capsys: pytest.CaptureFixture
) -> None:
    dst = tmp_path / "copy"
    shutil.copytree(explain_run, dst)
    (dst / "report.html").unlink()
    assert SECRET not in report_ok(capsys, dst)  # control: the folder's own arrays are read
    (dst / "report.html").unlink()
    (dst / "arrays.safetensors").unlink()
    (dst / "arrays.safetensors").symlink_to(outside / "secret.safetensors")
    report_refused(capsys, dst, ESCAPES)


def test_long_context_shard_outside_is_refused(
    explain_run: Path, tmp_path: Path, outside: Path, capsys: pytest.CaptureFixture
) -> None:
    dst = tmp_path / "copy"
    shutil.copytree(explain_run, dst)
    (dst / "report.html").unlink()
    m = json.loads((dst / "manifest.json").read_text())
    shard = {"file": str(outside / "secret.safetensors"), "layer": 0, "rows": [0], "heads": [0]}
    m["long_context"] = {"kept": {"layers": [0], "heads": [0], "rows": [0]}, "shards": [shard]}
    (dst / "manifest.json").write_text(json.dumps(m))
    report_refused(capsys, dst, "an absolute path")


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("l")
    ckpt = save_tiny("llama", root / "llama", layers=2)
    out = root / "run"
    argv = ["explain", "a b c d e", "--model", str(ckpt), "--out", str(out), "--rows", "last", "--layers", "0"]
    assert main([*argv, "--methods", "rollout"]) == 0
    return out


@pytest.mark.parametrize("what", ["qk", "shard", "control"])
def test_attention_row_refuses_files_outside(
    what: str, long_run: Path, tmp_path: Path, outside: Path, capsys: pytest.CaptureFixture
) -> None:
    """``attention-row`` reads a kept shard (layer 0) or recomputes from qk/ (layer 1): both through the check."""
    dst = tmp_path / "copy"
    shutil.copytree(long_run, dst)
    m = json.loads((dst / "manifest.json").read_text())
    if what == "qk":
        m["long_context"]["qk"]["files"]["1"] = str(outside / "secret.safetensors")
    elif what == "shard":
        m["long_context"]["shards"][0]["file"] = "../home/secret.safetensors"
    (dst / "manifest.json").write_text(json.dumps(m))
    layer = "1" if what == "qk" else "0"
    rc = main(["attention-row", str(dst), "--layer", layer, "--row", "last"])
    cap = capsys.readouterr()
    if what == "control":
        assert rc == 0 and len(cap.out.splitlines()) == 2 + 5
    else:
        msg = "an absolute path" if what == "qk" else ESCAPES
        assert rc == 2 and cap.err.count("\n") == 1 and msg in cap.err, cap.err


def _store(tmp_path: Path) -> Path:
    s = RunStore.open(tmp_path / "ev", {"model": "m"}, {}, command="evaluate")
    s.write_records(0, [{"id": "ex1"}])
    s.write_chunk(0, [("ex1", "attention", "aopc", 0.5)], {"ex1": {"scores": np.arange(3.0)}})
    return s.folder


@pytest.mark.parametrize("what", ["metrics_dir", "metrics_part", "arrays_file", "records", "manifest", "control"])
def test_run_store_refuses_files_outside(
    what: str, tmp_path: Path, outside: Path, capsys: pytest.CaptureFixture
) -> None:
    """The resumable store (evaluate, replicate, cot): its report, its metrics, its records, its resume."""
    f = _store(tmp_path)
    other = _store(outside)  # a second store outside: real Parquet and safetensors files to point at
    if what == "metrics_dir":
        shutil.rmtree(f / "metrics")
        (f / "metrics").symlink_to(other / "metrics", target_is_directory=True)
    elif what == "metrics_part":
        (f / "metrics" / "part-000001.parquet").symlink_to(other / "metrics" / "part-000000.parquet")
    elif what == "arrays_file":
        (f / "arrays" / "ex1.safetensors").unlink()
        (f / "arrays" / "ex1.safetensors").symlink_to(other / "arrays" / "ex1.safetensors")
    elif what == "records":
        (f / "records" / "part-000000.jsonl").unlink()
        (f / "records" / "part-000000.jsonl").symlink_to(other / "records" / "part-000000.jsonl")
    elif what == "manifest":
        (f / "manifest.json").unlink()
        (f / "manifest.json").symlink_to(other / "manifest.json")
    if what == "control":
        assert read_metrics(f).value.tolist() == [0.5] and RunStore(f).records() == [{"id": "ex1"}]
        assert RunStore.open(f, {"model": "m"}, {}).manifest()["settings"] == {"model": "m"}  # resume
        report_ok(capsys, f)
        return
    if what != "records":  # the report reads everything but the records
        report_refused(capsys, f, ESCAPES)
    read = {
        "metrics_dir": lambda: read_metrics(f),
        "metrics_part": lambda: read_metrics(f),
        "records": lambda: RunStore(f).records(),
        "manifest": lambda: RunStore.open(f, {"model": "m"}, {}),  # a resume reads the stored settings
        "arrays_file": lambda: folder_file(f, "arrays/ex1.safetensors"),
    }[what]
    with pytest.raises(StreetlampError, match=ESCAPES):
        read()


def test_folder_file_rules(tmp_path: Path) -> None:
    f = tmp_path / "run"
    (f / "a").mkdir(parents=True)
    (f / "a" / "x.csv").write_text("k\n")
    assert folder_file(f, "a/x.csv") == (f / "a" / "x.csv").resolve()
    assert folder_file(f, "a/../a/x.csv") == (f / "a" / "x.csv").resolve()
    assert folder_file(f, "a", kind="dir") == (f / "a").resolve()
    assert folder_file(f, "nothing.csv", missing_ok=True) is None
    for bad, msg in [
        ("a", "not a regular file"),
        ("nothing.csv", "is missing"),
        (3, "not a file name"),
        ("", "not a file name"),
    ]:
        with pytest.raises(StreetlampError, match=msg):
            folder_file(f, bad)
    link = tmp_path / "link"  # the folder itself reached through a symlink: names inside it still pass
    link.symlink_to(f, target_is_directory=True)
    assert folder_file(link, "a/x.csv") == (f / "a" / "x.csv").resolve()
