"""The CLI in-process: the main job, outputs, and every bad input in one clear line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from streetlamp.cli import main
from streetlamp.models.tiny import save_tiny


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    return {f: save_tiny(f, root / f) for f in ("bert", "llama")}


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_explain_writes_manifest_arrays_figures(
    ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, family: str
) -> None:
    out = tmp_path / "o"
    rc, stdout, _ = run(
        capsys,
        "explain",
        "the movie was not good , but the acting was great",
        "--model",
        str(ckpts[family]),
        "--out",
        str(out),
        "--layer",
        "1",
        "--head",
        "2",
    )
    assert rc == 0
    assert str(out) in stdout and "attention here means" in stdout and "occlusion" in stdout
    m = json.loads((out / "manifest.json").read_text())
    arrays = load_file(str(out / "arrays.safetensors"))
    n = len(m["tokens"])
    assert arrays["attention"].shape == (2, 4, n, n)
    assert m["arrays"]["attention"]["axes"] == ["layer", "head", "query", "key"]
    assert m["colour_scales"]["attention"]["vmin"] == 0.0
    assert {f["file"] for f in m["figures"]} >= {
        "attention_L1_H2.png",
        "attention_grid.png",
        "attention_head_mean.png",
        "methods_comparison.png",
        "kendall_tau.csv",
    }
    assert "attention" in m["methods"] and m["arrays"]["attention.tokens"]["axes"] == ["token"]
    for f in m["figures"]:
        assert (out / f["file"]).stat().st_size > (1000 if f["file"].endswith(".png") else 10)
    assert {"torch", "transformers", "streetlamp"} <= set(m["versions"])
    allowed = arrays["allowed"].astype(bool)
    assert np.all(arrays["attention"][:, :, ~allowed] == 0)
    if family == "llama":
        assert m["target"]["label"] == m["prediction"]["label"]  # next token by default
        assert not allowed[0, 1]
    assert not list(tmp_path.glob(".o.partial-*"))


def test_models_lists_embedded(capsys: pytest.CaptureFixture) -> None:
    rc, out, _ = run(capsys, "models")
    assert rc == 0 and "minilm-sentiment" in out and "smollm2-135m" in out
    assert out.count("(default)") == 1 and "minilm-sentiment" in out.splitlines()[0]


def test_methods_lists_every_method_with_its_parameters(capsys: pytest.CaptureFixture) -> None:
    from streetlamp.methods.registry import REGISTRY

    rc, out, _ = run(capsys, "methods")
    assert rc == 0
    for name in REGISTRY:
        assert name in out
    assert "rule='auto'" in out and "replacement='mask'" in out and "--method-params" in out


BAD = [
    (["explain", "   "], "empty text"),
    (["explain", "hi", "--model", "no-such-model"], "minilm-sentiment"),
    (["explain", "the movie", "--model", "{bert}", "--layer", "7"], "layer 7 out of range"),
    (["explain", "the movie", "--model", "{bert}", "--layer", "0", "--head", "9"], "head 9 out of range"),
    (["explain", "the movie", "--model", "{bert}", "--target", "amazing"], "unknown target"),
    (["explain", "the movie", "--model", "{llama}", "--target", "the movie"], "give one token"),
    (["explain", "the " * 80, "--model", "{bert}"], "--truncate"),
]


@pytest.mark.parametrize("argv,expect", BAD)
def test_bad_input_one_line_no_traceback(
    ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str], expect: str
) -> None:
    argv = [a.format(**{k: str(v) for k, v in ckpts.items()}) for a in argv] + ["--out", str(tmp_path / "o")]
    rc, _, err = run(capsys, *argv)
    assert rc == 2
    assert expect in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_truncate_flag_is_recorded(ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rc, _, _ = run(
        capsys, "explain", "the " * 80, "--model", str(ckpts["bert"]), "--truncate", "--out", str(tmp_path / "o")
    )
    assert rc == 0
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert m["truncated"] is True and m["parameters"]["truncate"] is True and len(m["tokens"]) == 64
    assert m["tokens"][0] == "[CLS]" and m["tokens"][-1] == "[SEP]"


def test_refuses_non_empty_out_unless_overwrite(
    ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    rc, _, err = run(capsys, "explain", "the movie", "--model", str(ckpts["bert"]), "--out", str(out))
    assert rc == 2 and "--overwrite" in err and (out / "keep.txt").read_text() == "precious"
    rc, _, _ = run(capsys, "explain", "the movie", "--model", str(ckpts["bert"]), "--out", str(out), "--overwrite")
    assert rc == 0 and not (out / "keep.txt").exists() and (out / "manifest.json").exists()


def test_unsupported_checkpoints(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "pegasus"
    bad.mkdir()
    (bad / "config.json").write_text(
        json.dumps({"model_type": "pegasus", "architectures": ["PegasusForConditionalGeneration"]})
    )
    rc, _, err = run(capsys, "explain", "hi", "--model", str(bad), "--out", str(tmp_path / "o"))
    assert rc == 2 and "not supported" in err and "bert" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, err = run(capsys, "explain", "hi", "--model", str(empty), "--out", str(tmp_path / "o"))
    assert rc == 2 and "config.json" in err


def test_method_params_reach_the_methods_and_the_manifest(
    ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "mp"
    params = {"occlusion": {"replacement": "unk"}, "integrated_gradients": {"rule": "panels", "baseline": "mask"}}
    code, stdout, _ = run(
        capsys,
        "explain",
        "the movie was not good",
        "--model",
        str(ckpts["bert"]),
        "--methods",
        "occlusion,integrated_gradients",
        "--method-params",
        json.dumps(params),
        "--out",
        str(out),
    )
    assert code == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["parameters"]["methods"]["occlusion"]["replacement"] == "unk"
    assert m["methods"]["occlusion"]["replacement_token"] == "[UNK]"
    assert m["parameters"]["methods"]["integrated_gradients"]["rule"] == "panels"
    assert "[MASK]" in m["methods"]["integrated_gradients"]["baseline_used"]
    # the default run (no --methods) takes them too, and the summary names the replacement
    code, stdout, _ = run(
        capsys,
        "explain",
        "the movie was not good",
        "--model",
        str(ckpts["bert"]),
        "--method-params",
        '{"occlusion": {"replacement": "unk"}}',
        "--out",
        str(tmp_path / "d"),
    )
    assert code == 0 and "[UNK]" in stdout
    for bad, msg in [
        ("{not json", "not JSON"),
        ('{"occlusion": 3}', "object of objects"),
        ('{"shap": {}}', "not among the methods"),
        ('{"occlusion": {"nope": 1}}', "bad parameters"),
        ('{"occlusion": {"replacement": "foo"}}', "unknown replacement"),
    ]:
        code, _, err = run(
            capsys,
            "explain",
            "the movie",
            "--model",
            str(ckpts["bert"]),
            "--methods",
            "occlusion",
            "--method-params",
            bad,
            "--out",
            str(tmp_path / "bad"),
        )
        assert code == 2 and msg in err and not (tmp_path / "bad").exists(), (bad, err)
