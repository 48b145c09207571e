"""The one reader of user files (:mod:`streetlamp.data.files`, issue 35 item 4), and every command that reads a
user file routed through it: a UTF-8 byte-order mark (Excel's "CSV UTF-8") is read as the same file without
it; random bytes are one clear line, not a ``UnicodeDecodeError``; a FIFO is refused at once, not waited on;
a text-only corpus CSV is a corpus for ``atlas`` and ``lens-fit``."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from streetlamp.cli import main
from streetlamp.data import load_dataset
from streetlamp.data.files import read_csv, read_text, user_file
from streetlamp.errors import StreetlampError
from streetlamp.models.tiny import WORDS, save_tiny

BOM = b"\xef\xbb\xbf"
PAIRS = (
    "clean,corrupt,answer,wrong\n"
    "when mary and john went to the store john gave a drink to,when mary and john went to the store mary gave a "
    "drink to, mary, john\nthe movie was good and the acting,the film was bad and the acting, good, bad\n"
)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    t = tmp_path_factory.mktemp("files")
    rng = np.random.default_rng(0)
    rows = [" ".join(rng.choice(WORDS, 9)) for _ in range(24)]
    (t / "labelled.csv").write_text(
        "text,label\n" + "".join(f"{r},{['neg', 'pos'][i % 2]}\n" for i, r in enumerate(rows))
    )
    (t / "bom.csv").write_bytes(BOM + (t / "labelled.csv").read_bytes())
    (t / "textonly.csv").write_text("text\n" + "".join(f"{r}\n" for r in rows))
    (t / "pairs.csv").write_text(PAIRS)
    (t / "bompairs.csv").write_bytes(BOM + PAIRS.encode())
    noise = np.random.default_rng(1).integers(0, 256, 3000, dtype=np.uint8).tobytes()
    for name in ("noise.txt", "noise.csv", "noise.jsonl"):
        (t / name).write_bytes(b"\x84" + noise)  # 0x84: never the first byte of UTF-8
    for name in ("fifo.csv", "fifo.txt", "fifo.jsonl"):
        os.mkfifo(t / name)
    return {"t": t, "llama": save_tiny("llama", t / "llama", seed=1), "bert": save_tiny("bert", t / "bert", seed=1)}


@pytest.fixture()
def unblock(files: dict[str, Path]) -> Iterator[None]:
    """Should a reader open a FIFO (the bug), a writer comes after 5 s and closes it, so the test fails
    on the time it took instead of hanging the suite."""
    stop = threading.Event()

    def writer() -> None:
        if stop.wait(5):
            return
        while not stop.wait(0.2):
            for name in ("fifo.csv", "fifo.txt", "fifo.jsonl"):
                try:
                    fd = os.open(files["t"] / name, os.O_WRONLY | os.O_NONBLOCK)  # fails (ENXIO) with no reader
                    os.close(fd)
                except OSError:
                    pass

    th = threading.Thread(target=writer, daemon=True)
    th.start()
    yield
    stop.set()
    th.join()


def test_the_reader(files: dict[str, Path], unblock: None) -> None:
    t = files["t"]
    assert read_csv(t / "bom.csv") == read_csv(t / "labelled.csv")  # the mark is not part of "text"
    assert read_csv(t / "bom.csv")[0] == ["text", "label"]
    with pytest.raises(StreetlampError, match=r"noise.txt: not UTF-8 text \(byte 0 is 0x84"):
        read_text(t / "noise.txt")
    t0 = time.monotonic()
    with pytest.raises(StreetlampError, match=r"fifo.csv is a FIFO \(named pipe\): give a regular file"):
        read_csv(t / "fifo.csv", "data file")
    assert time.monotonic() - t0 < 2
    with pytest.raises(StreetlampError, match="is a folder"):
        user_file(t)
    with pytest.raises(StreetlampError, match="does not exist"):
        user_file(t / "missing.csv")
    (t / "nul.txt").write_bytes(b"abc\x00def")
    with pytest.raises(StreetlampError, match="NUL"):
        read_text(t / "nul.txt")


def test_datasets(files: dict[str, Path]) -> None:
    t = files["t"]
    assert load_dataset(str(t / "bom.csv")).hash() != load_dataset(str(t / "labelled.csv")).hash()  # ids: the stem
    assert [(e.text, e.label) for e in load_dataset(str(t / "bom.csv")).examples] == [
        (e.text, e.label) for e in load_dataset(str(t / "labelled.csv")).examples
    ]
    corpus = load_dataset(str(t / "textonly.csv"), labels=False)
    assert [e.text for e in corpus.examples] == [e.text for e in load_dataset(str(t / "labelled.csv")).examples]
    assert {e.label for e in corpus.examples} == {""}
    with pytest.raises(StreetlampError, match="no label column") as e:
        load_dataset(str(t / "textonly.csv"))
    assert "--" not in str(e.value)  # the data layer names no flag unless the command has it
    with pytest.raises(StreetlampError, match="name it with --label-column"):
        load_dataset(str(t / "textonly.csv"), column_flags=True)


def test_bom_pairs_are_the_same_pairs(files: dict[str, Path]) -> None:
    from streetlamp.commands.circuit.run import task_pairs
    from streetlamp.interventions.circuits.tasks import read_pairs

    t = files["t"]
    assert task_pairs(str(t / "bompairs.csv"), 10, 0, "patch") == task_pairs(str(t / "pairs.csv"), 10, 0, "patch")
    assert read_pairs(t / "bompairs.csv") == read_pairs(t / "pairs.csv") and len(read_pairs(t / "pairs.csv")) == 2


CASES = [
    # (command and its arguments, the words of its one line); {t}: the files, {llama}/{bert}: tiny models
    (["circuit", "--model", "{llama}", "--task", "{t}/noise.csv"], "not UTF-8 text"),
    (["circuit", "--model", "{llama}", "--task", "{t}/fifo.csv"], "is a FIFO"),
    (["atlas", "--model", "{llama}", "--data", "{t}/noise.txt"], "not UTF-8 text"),
    (["atlas", "--model", "{llama}", "--data", "{t}/noise.csv"], "not UTF-8 text"),
    (["atlas", "--model", "{llama}", "--data", "{t}/fifo.txt"], "is a FIFO"),
    (["lens-fit", "--model", "{llama}", "--lens", "tuned", "--data", "{t}/fifo.csv"], "is a FIFO"),
    (["lens-fit", "--model", "{llama}", "--lens", "tuned", "--data", "{t}/noise.jsonl"], "not UTF-8 text"),
    (["evaluate", "--model", "{bert}", "--data", "{t}/fifo.csv"], "is a FIFO"),
    (["evaluate", "--model", "{bert}", "--data", "{t}/fifo.jsonl"], "is a FIFO"),
    (["evaluate", "--model", "{bert}", "--data", "{t}/noise.csv"], "not UTF-8 text"),
    (["evaluate", "--model", "{bert}", "--data", "{t}/labelled.csv", "--ffidelity-train", "{t}/fifo.csv"], "is a FIFO"),
    (["heads", "--model", "{bert}", "--data", "{t}/fifo.txt"], "is a FIFO"),
    (["heads", "--model", "{bert}", "--data", "{t}/noise.txt"], "not UTF-8 text"),
    (["probe", "--model", "{bert}", "--task", "{t}/fifo.csv"], "is a FIFO"),
    (["probe", "--model", "{bert}", "--task", "{t}/noise.jsonl"], "not UTF-8 text"),
]


@pytest.mark.parametrize("argv, why", CASES, ids=[f"{c[0][0]}-{Path(c[0][-1]).name}" for c in CASES])
def test_commands_refuse_in_one_line(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, unblock: None, argv: list[str], why: str
) -> None:
    out = tmp_path / "run"
    args = [a.format(t=files["t"], llama=files["llama"], bert=files["bert"]) for a in argv]
    t0 = time.monotonic()
    assert main([*args, "--out", str(out)]) == 2
    assert time.monotonic() - t0 < 4.5  # the FIFO's writer comes at 5 s: nothing waited on it
    err = capsys.readouterr().err.strip()
    errors = [line for line in err.splitlines() if "error" in line.lower()]  # (probe prints its progress)
    assert len(errors) == 1 and why in errors[0] and "Traceback" not in err, err
    assert not out.exists()


def test_a_text_only_corpus_is_a_corpus(files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``atlas`` and ``lens-fit`` read text, no labels: a CSV with only a text column is accepted, and gives
    the atlas the same sequences as the labelled file."""
    import pandas as pd

    t, llama = files["t"], str(files["llama"])
    for name in ("textonly.csv", "labelled.csv"):
        argv = ["atlas", "--model", llama, "--data", str(t / name), "--out", str(tmp_path / name), "--limit", "4"]
        assert main([*argv, "--ablation", "zero"]) == 0, capsys.readouterr().err
    a, b = (pd.read_parquet(tmp_path / n / "atlas.parquet") for n in ("textonly.csv", "labelled.csv"))
    pd.testing.assert_frame_equal(a.drop(columns="example_id"), b.drop(columns="example_id"))
    argv = [
        "lens-fit",
        "--model",
        llama,
        "--lens",
        "tuned",
        "--data",
        str(t / "textonly.csv"),
        "--out",
        str(tmp_path / "lens"),
    ]
    assert main([*argv, "--seq-len", "20", "--heldout", "2", "--steps", "2"]) == 0, capsys.readouterr().err
    assert (tmp_path / "lens" / "lens.safetensors").is_file()
