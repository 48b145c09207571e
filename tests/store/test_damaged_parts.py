"""Resume over damaged parts (issue 35 item 2): a part counts as done only when it reads. A truncated part of
``circuit``'s checkpoint, of ``atlas`` or of ``evaluate`` is recomputed with one warning line, and the
resumed run's tables equal a clean run's; a finished atlas whose ``atlas.parquet`` was truncated is rebuilt.
Also the atlas' ``parts/`` symlinked out of its run folder (issue 35 item 1): refused, nothing outside
read or written."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from streetlamp.cli import main
from streetlamp.errors import StreetlampError
from streetlamp.models.tiny import WORDS, save_tiny
from streetlamp.store import read_metrics
from streetlamp.store.parts import part_done, read_part

PAIRS = """clean,corrupt,answer,wrong
when mary and john went to the store john gave a drink to,when mary and john went to the store mary gave a drink to, mary, john
the movie was good and the acting,the film was bad and the acting, good, bad
the story was fun and the plot,the story was boring and the plot, fun, boring
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    t = tmp_path_factory.mktemp("damaged")
    rng = np.random.default_rng(0)
    (t / "d.txt").write_text("\n".join(" ".join(rng.choice(WORDS, int(rng.integers(3, 9)))) for _ in range(10)) + "\n")
    (t / "pairs.csv").write_text(PAIRS)
    lines = ["text,label"] + [f"{' '.join(rng.choice(WORDS, 5))},{['neg', 'pos'][i % 2]}" for i in range(3)]
    (t / "d.csv").write_text("\n".join(lines) + "\n")
    return {"t": t, "llama": save_tiny("llama", t / "llama", seed=1), "bert": save_tiny("bert", t / "bert", seed=1)}


def truncate(p: Path) -> None:
    """Cut a file to half its bytes, as a full disk or a cut copy leaves it."""
    b = p.read_bytes()
    assert len(b) > 16
    p.write_bytes(b[: len(b) // 2])


def warnings_of(err: str) -> list[str]:
    return [line for line in err.splitlines() if "is damaged" in line]


def test_the_rule(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Missing: not done, silently. Damaged (each format a part is written in): not done, one warning line,
    removed. Whole: done, read."""
    from streetlamp.store.files import save_arrays

    pd.DataFrame({"a": [1.0, 2.0]}).to_parquet(tmp_path / "p.parquet")
    save_arrays(tmp_path / "a.safetensors", {"x": np.arange(40, dtype=np.float32)})
    pd.DataFrame({"a": range(50)}).to_csv(tmp_path / "h.csv", index=False)
    (tmp_path / "r.jsonl").write_text('{"a": 1}\n{"b": [1, 2, 3, 4, 5, 6]}\n')
    names = ["p.parquet", "a.safetensors", "r.jsonl"]
    assert all(part_done(tmp_path, n) for n in [*names, "h.csv"]) and not part_done(tmp_path, "none.parquet")
    assert capsys.readouterr().err == ""
    for n in names:
        truncate(tmp_path / n)
        assert read_part(tmp_path, n) is None and not (tmp_path / n).exists()
    assert len(warnings_of(capsys.readouterr().err)) == 3


def test_circuit_resumes_over_a_truncated_stage(
    setup: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``arrays/stage0.safetensors`` of the checkpoint (the first method's edge scores) truncated after an
    interrupted run: the rerun warns once, recomputes those scores, and writes a clean run's tables."""
    import streetlamp.commands.circuit.run as RC
    from streetlamp.commands.circuit.resume import resume_folder

    args = ["circuit", "--model", str(setup["llama"]), "--task", str(setup["t"] / "pairs.csv")]
    args += ["--methods", "eap", "--sizes", "0.1,1", "--bootstrap", "10", "--random", "1"]
    scores: list[str] = []
    real_scores, real_sweep = RC.edge_scores, RC.F.sweep
    stop = True

    def count_scores(*a, **k):
        scores.append(a[2])
        return real_scores(*a, **k)

    def sweep(*a, **k):
        if stop:
            raise KeyboardInterrupt
        return real_sweep(*a, **k)

    monkeypatch.setattr(RC, "edge_scores", count_scores)
    monkeypatch.setattr(RC.F, "sweep", sweep)
    out = tmp_path / "r"
    assert main(args + ["--out", str(out)]) == 130
    stage0 = resume_folder(out) / "arrays" / "stage0.safetensors"
    truncate(stage0)
    capsys.readouterr()
    stop, scores[:] = False, []
    assert main(args + ["--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert len(warnings_of(err)) == 1 and "stage0.safetensors" in err and "Traceback" not in err
    assert scores == ["eap"]  # recomputed, not read from the damaged file
    assert main(args + ["--out", str(tmp_path / "fresh")]) == 0
    pd.testing.assert_frame_equal(
        pd.read_parquet(out / "edges.parquet"), pd.read_parquet(tmp_path / "fresh" / "edges.parquet")
    )
    pd.testing.assert_frame_equal(
        pd.read_csv(out / "faithfulness.csv"), pd.read_csv(tmp_path / "fresh" / "faithfulness.csv")
    )


@pytest.fixture(scope="module")
def atlas_ref(setup: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("atlas") / "ref"
    assert main(atlas_args(setup, out)) == 0
    return out


def atlas_args(setup: dict[str, Path], out: Path) -> list[str]:
    return ["atlas", "--model", str(setup["llama"]), "--data", str(setup["t"] / "d.txt"), "--out", str(out),
            "--chunk-size", "3", "--exact-share", "0.3", "--exact-top", "1"]  # fmt: skip


def test_atlas_resumes_over_damaged_parts(
    setup: dict[str, Path], atlas_ref: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "run"
    shutil.copytree(atlas_ref, out)
    truncate(out / "parts" / "estimate-000001.parquet")
    truncate(out / "parts" / "zsum-000002.safetensors")
    capsys.readouterr()
    assert main(atlas_args(setup, out)) == 0
    cap = capsys.readouterr()
    assert len(warnings_of(cap.err)) == 2 and "Traceback" not in cap.err
    assert "chunks computed now: stats 1, estimate 1, exact 0" in cap.out
    pd.testing.assert_frame_equal(pd.read_parquet(out / "atlas.parquet"), pd.read_parquet(atlas_ref / "atlas.parquet"))


def test_a_finished_atlas_with_a_truncated_table_is_rebuilt(
    setup: dict[str, Path], atlas_ref: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "run"
    shutil.copytree(atlas_ref, out)
    truncate(out / "atlas.parquet")
    capsys.readouterr()
    assert main(atlas_args(setup, out)) == 0
    cap = capsys.readouterr()
    assert len(warnings_of(cap.err)) == 1 and "atlas.parquet" in cap.err
    assert "chunks computed now: stats 0, estimate 0, exact 0" in cap.out
    pd.testing.assert_frame_equal(pd.read_parquet(out / "atlas.parquet"), pd.read_parquet(atlas_ref / "atlas.parquet"))


def test_atlas_parts_symlinked_out_are_refused(
    setup: dict[str, Path], atlas_ref: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A run folder whose ``parts/`` is a symlink to a folder outside it (copied from elsewhere, or planted):
    the resume neither reads those parts nor writes into that folder."""
    out, outside = tmp_path / "run", tmp_path / "outside"
    shutil.copytree(atlas_ref, out)
    shutil.move(out / "parts", outside)
    (outside / "estimate-000001.parquet").unlink()  # would be written if the rerun followed the link
    before = sorted(p.name for p in outside.iterdir())
    (out / "parts").symlink_to(outside, target_is_directory=True)
    capsys.readouterr()
    assert main(atlas_args(setup, out)) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "leads outside the run folder" in err
    assert sorted(p.name for p in outside.iterdir()) == before


def test_evaluate_resumes_over_a_truncated_metrics_part(
    setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    args = ["evaluate", "--model", str(setup["bert"]), "--data", str(setup["t"] / "d.csv"), "--methods", "attention"]
    args += ["--adv-steps", "2", "--permutations", "2", "--chunk-size", "1"]
    out = tmp_path / "run"
    assert main(args + ["--out", str(out)]) == 0
    ref = read_metrics(out)
    truncate(out / "metrics" / "part-000001.parquet")
    capsys.readouterr()
    assert main(args + ["--out", str(out)]) == 0
    cap = capsys.readouterr()
    assert len(warnings_of(cap.err)) == 1 and "part-000001.parquet" in cap.err and "Traceback" not in cap.err
    assert "1 chunks computed now" in cap.out
    key = ["example_id", "method", "metric"]
    got = read_metrics(out).sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, ref.sort_values(key).reset_index(drop=True))


def test_store_subfolders_symlinked_out_are_refused(tmp_path: Path) -> None:
    from streetlamp.store import RunStore

    out, outside = tmp_path / "run", tmp_path / "outside"
    RunStore.open(out, {"a": 1}, {})
    outside.mkdir()
    shutil.rmtree(out / "metrics")
    (out / "metrics").symlink_to(outside, target_is_directory=True)
    with pytest.raises(StreetlampError, match="leads outside"):
        RunStore.open(out, {"a": 1}, {})
    assert list(outside.iterdir()) == []
