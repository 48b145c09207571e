"""``explain --rows/--layers/--heads`` and ``attention-row`` through the CLI, in-process: what is
kept, that rows read back equal the full-tensor run's, and bad input (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import streetlamp
from streetlamp.cli import main
from streetlamp.commands.explain.long import read_rows
from streetlamp.methods.attention import record_attention
from streetlamp.methods.attention_grad import AttentionXGradient
from streetlamp.methods.rollout import residual_attention, rollout_matrix
from streetlamp.models.adapter import Target
from streetlamp.models.tiny import save_tiny
from tests.conftest import f32_tol

TEXT = "the movie was not good , but the acting was great"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("ckpt") / "llama", layers=3)


@pytest.fixture(scope="module")
def full_att(ckpt: Path) -> tuple[np.ndarray, np.ndarray]:
    """Attention [L, H, n, n] and attention x gradient's tokens from the existing full-tensor methods on
    the same checkpoint: the reference."""
    adapter = streetlamp.load(str(ckpt))
    inputs = adapter.encode(TEXT)
    axg = AttentionXGradient().attribute(adapter, inputs, target=Target())[0].scores
    return record_attention(adapter, inputs)[1][0].double().numpy(), axg


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_explain_rows_keeps_what_was_asked_and_reads_back(ckpt, full_att, tmp_path, capsys) -> None:
    out = tmp_path / "o"
    args = ["--model", str(ckpt), "--out", str(out), "--rows", "last,0:2", "--layers", "0,-1", "--heads", "1,3"]
    args += ["--methods", "rollout,attention_x_gradient"]
    rc, stdout, _ = run(capsys, "explain", TEXT, *args)
    assert rc == 0 and "kept attention rows 0..1,10 of layers 0,2, heads 1,3" in stdout
    m = json.loads((out / "manifest.json").read_text())
    assert m["long_context"]["kept"] == {"layers": [0, 2], "heads": [1, 3], "rows": [0, 1, 10]}
    assert {s["layer"] for s in m["long_context"]["shards"]} == {0, 2}
    assert sorted(p.name for p in (out / "qk").iterdir()) == ["L0.safetensors", "L1.safetensors", "L2.safetensors"]
    att, axg = full_att  # float32 model: the chunked and the full path sum in the same order, to eps32 x depth
    tol = f32_tol(3)
    for layer in range(3):  # kept (layers 0, 2) and recomputed (layer 1) rows alike
        np.testing.assert_allclose(read_rows(out, layer, [0, 1, 10]), att[layer][:, [0, 1, 10]], atol=tol, rtol=0)
    arrays = load_file(str(out / "arrays.safetensors"))
    np.testing.assert_allclose(arrays["rollout.tokens"], rollout_matrix(residual_attention(att))[10], atol=tol, rtol=0)
    np.testing.assert_allclose(arrays["attention_x_gradient.tokens"], axg, atol=f32_tol(3, float(np.abs(axg).max())))
    rc, stdout, _ = run(capsys, "attention-row", str(out), "--layer", "1", "--row", "last", "--heads", "2")
    lines = stdout.splitlines()
    assert rc == 0 and lines[1] == "key\ttoken\thead 2" and len(lines) == 2 + 11
    values = np.array([float(l.split("\t")[2]) for l in lines[2:]])
    np.testing.assert_allclose(values, att[1, 2, 10], atol=1e-5, rtol=0)  # printed to 6 significant digits
    rc, stdout, _ = run(capsys, "attention-row", str(out), "--layer", "0", "--row", "3", "--column")
    col = np.array([[float(v) for v in l.split("\t")[2:]] for l in stdout.splitlines()[2:]])  # [query, head]
    np.testing.assert_allclose(col.T, att[0][:, :, 3], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--rows", "11"], "--rows 11 out of range: the text has positions 0..10"),
        (["--rows", "3:40"], "--rows 3:40 out of range"),
        (["--rows", "middle"], "--rows takes last, explained, N or A:B"),
        (["--layers", "3"], "--layers 3 out of range: the model has layers 0..2"),
        (["--layers", "-4"], "--layers -4 out of range"),
        (["--heads", "4"], "--heads 4 out of range: the model has heads 0..3"),
        (
            ["--rows", "last", "--methods", "lime"],
            "runs only rollout, flow, attention_x_gradient, occlusion (not lime)",
        ),
        (
            ["--rows", "last", "--methods", "occlusion", "--occlusion-window", "0"],
            "--occlusion-window must be at least 1 (got 0)",
        ),
        (["--rows", "last", "--methods", "occlusion", "--occlusion-window", "12"], "the text has 11 tokens (1..11)"),
        (["--rows", "last", "--occlusion-window", "2"], "--occlusion-window applies to --methods occlusion"),
        (["--occlusion-window", "2"], "--occlusion-window is for long inputs"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(ckpt, tmp_path, capsys, flags, message) -> None:
    out = tmp_path / "o"
    rc, stdout, stderr = run(capsys, "explain", TEXT, "--model", str(ckpt), "--out", str(out), *flags)
    assert rc == 2 and message in stderr and len(stderr.strip().splitlines()) == 1
    assert not out.exists() and list(tmp_path.iterdir()) == []  # not even a staging folder


def test_explain_rows_occlusion_by_spans(ckpt, tmp_path, capsys) -> None:
    """``--methods occlusion --occlusion-window W``: the span drops written are those of
    :func:`occlusion_spans` (itself tested against plain occlusion and a full recompute), spans of W tokens."""
    from streetlamp.methods.long_occlusion import occlusion_spans

    out = tmp_path / "o"
    args = ["--model", str(ckpt), "--out", str(out), "--rows", "last", "--methods", "occlusion,rollout"]
    rc, stdout, _ = run(capsys, "explain", TEXT, *args, "--occlusion-window", "4")
    assert rc == 0 and "occlusion row 10, top:" in stdout
    arrays = load_file(str(out / "arrays.safetensors"))
    assert arrays["occlusion.spans"].tolist() == [[0, 4], [4, 8], [8, 11]]
    adapter = streetlamp.load(str(ckpt))
    ref = occlusion_spans(adapter, adapter.encode(TEXT), Target(), window=4)
    np.testing.assert_array_equal(arrays["occlusion.drop"], ref.drop)  # same code, same machine
    np.testing.assert_array_equal(arrays["occlusion.tokens"], ref.tokens.astype(np.float32))
    m = json.loads((out / "manifest.json").read_text())
    assert m["parameters"]["occlusion_window"] == 4 and "[MASK]" in m["arrays"]["occlusion.tokens"]["meaning"]
    params = json.dumps({"occlusion": {"replacement": "delete"}})
    rc, _, _ = run(capsys, "explain", TEXT, *args, "--method-params", params, "--out", str(tmp_path / "d"))
    m = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert rc == 0 and "decoder removal" in m["arrays"]["occlusion.tokens"]["meaning"]
    default = load_file(str(tmp_path / "d" / "arrays.safetensors"))["occlusion.spans"]
    assert default.tolist() == [[k, k + 1] for k in range(10)]  # default: 11 tokens in 32 spans -> 1 token each


def test_attention_row_bad_input(ckpt, tmp_path, capsys) -> None:
    out = tmp_path / "o"
    assert run(capsys, "explain", TEXT, "--model", str(ckpt), "--out", str(out), "--rows", "last")[0] == 0
    for argv, message in [
        (["--layer", "3"], "--layer 3 out of range: the recording has layers 0..2"),
        (["--layer", "0", "--row", "11"], "--row 11 out of range"),  # its own option (not explain's --rows)
        (["--layer", "0", "--heads", "9"], "--heads 9 out of range"),
    ]:
        rc, _, stderr = run(capsys, "attention-row", str(out), *argv)
        assert rc == 2 and message in stderr and len(stderr.strip().splitlines()) == 1
    other = tmp_path / "full"
    other.mkdir()
    (other / "manifest.json").write_text(json.dumps({"streetlamp": "explain"}))  # a full-tensor run's manifest
    rc, _, stderr = run(capsys, "attention-row", str(other), "--layer", "0")
    assert rc == 2 and "holds no long-context recording" in stderr


def test_full_tensor_refusal_points_to_rows(ckpt, tmp_path, capsys, monkeypatch) -> None:
    """A text whose full tensors would not fit is refused with the long path named; --rows then runs."""
    import streetlamp.models.memory as memory

    monkeypatch.setattr(memory, "available_bytes", lambda device: 1024)  # as if 1 KiB were free
    out = tmp_path / "o"
    rc, _, stderr = run(capsys, "explain", TEXT, "--model", str(ckpt), "--out", str(out))
    assert rc == 2 and "would not fit; record only some rows (explain --rows explained" in stderr
    assert not out.exists()
    assert run(capsys, "explain", TEXT, "--model", str(ckpt), "--out", str(out), "--rows", "explained")[0] == 0
