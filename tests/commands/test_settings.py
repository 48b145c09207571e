"""Settings are checked before any work and before any output exists; the token budget reaches
heads, prune, patch and mediate, and batching by it does not change what they compute."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from streetlamp.cli import main
from streetlamp.models.tiny import WORDS, save_tiny


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    t = tmp_path_factory.mktemp("settings")
    data = t / "d.csv"
    data.write_text(
        "text,label\n"
        + "\n".join(f"{WORDS[i]} {WORDS[i + 1]} {WORDS[i + 2]},{['neg', 'neu', 'pos'][i % 3]}" for i in range(8))
        + "\n"
    )
    return {"bert": save_tiny("bert", t / "bert", seed=1), "gpt2": save_tiny("gpt2", t / "gpt2", seed=1), "data": data}


EVAL = [
    "evaluate",
    "--model",
    "{bert}",
    "--data",
    "{data}",
    "--methods",
    "attention",
    "--adv-steps",
    "2",
    "--permutations",
    "2",
    "--limit",
    "3",
]
BAD = [
    (EVAL + ["--flip-layers", "foo"], "--flip-layers must be last, all or a layer number"),
    (EVAL + ["--cf-layers", "foo"], "--cf-layers must be last, all or a layer number"),
    (EVAL + ["--flip-layers", "99"], "--flip-layers 99 out of range: the model has layers 0..1"),
    (EVAL + ["--cf-layers", "-1"], "--cf-layers -1 out of range"),
    (EVAL + ["--chunk-size", "0"], "--chunk-size must be at least 1"),
    (EVAL + ["--batch-size", "0"], "--batch-size must be at least 1"),
    (EVAL + ["--eps", "0"], "--eps must be greater than 0 (got 0)"),
    (["heads", "the movie", "--model", "{bert}", "--batch-size", "-5"], "--batch-size must be at least 1"),
    (["heads", "--model", "{bert}"], "give a TEXT or --data FILE"),
    (["prune", "--data", "{data}", "--order", "attention,bogus", "--model", "{bert}"], "unknown order 'bogus'"),
    (["prune", "--data", "{data}", "--model", "{gpt2}"], "needs a classifier"),
    (["patch", "--clean", "a b", "--corrupt", "b a", "--sites", "heads,nope", "--model", "{gpt2}"], "nope"),
    (
        [
            "patch",
            "--clean",
            "when mary went",
            "--corrupt",
            "when john went",
            "--paths",
            "--receiver",
            "9.0",
            "--model",
            "{gpt2}",
        ],
        "receiver 9.0 out of range",
    ),
    (["mediate", "--prompts", "0", "--model", "{gpt2}"], "--prompts must be at least 1"),
    (["mediate", "--model", "{bert}"], "needs a causal LM"),
    (["explain-generation", "the movie", "--model", "{bert}"], "needs a causal LM"),
    (
        ["explain-generation", "the movie", "--new-tokens", "0", "--model", "{gpt2}"],
        "--new-tokens must be at least 1 (got 0)",
    ),
    (["benchmark", "--tasks", "keyword", "--n-examples", "0"], "--n-examples must be at least 1"),
]


@pytest.mark.parametrize("argv,expect", BAD, ids=[" ".join(a[0:1] + a[-2:]) for a, _ in BAD])
def test_bad_setting_exit_2_one_line_no_folder(
    setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str], expect: str
) -> None:
    argv = [a.format(**{k: str(v) for k, v in setup.items()}) for a in argv] + ["--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expect in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()


def test_bad_layer_then_corrected_rerun(setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The refused run leaves no run store behind, so the corrected command is not refused."""
    argv = [a.format(**{k: str(v) for k, v in setup.items()}) for a in EVAL] + ["--out", str(tmp_path / "r")]
    assert main(argv + ["--flip-layers", "2"]) == 2
    assert not (tmp_path / "r").exists()
    assert main(argv + ["--flip-layers", "1"]) == 0
    m = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert m["settings"]["settings"]["flip_layers"] == "1"


def test_flip_layers_never_wrap() -> None:
    from streetlamp.errors import StreetlampError
    from streetlamp.evaluation.flip import flip_layers
    from streetlamp.models.adapter import ModelAdapter
    from streetlamp.models.tiny import tiny_model

    adapter = ModelAdapter(*tiny_model("bert", seed=1), "tiny-bert")
    assert flip_layers(adapter, "all") == [0, 1] and flip_layers(adapter, "last") == [1]
    assert flip_layers(adapter, "0") == [0]
    for spec in ("2", "-1", "99", "foo"):
        with pytest.raises(StreetlampError):
            flip_layers(adapter, spec)


def test_batched_engine_equals_one_pass() -> None:
    """Patching and mediation in passes of a few tokens give what one pass gives. A row's forward does
    not depend on the other rows; only float32 rounding of the kernels' blocking differs, so logits
    agree to ~1e-5 (float32 eps x depth x |logit|), and normalised scores to that over the
    normalisation's denominator |LD_clean - LD_corrupt|."""
    from streetlamp.interventions import engine, mediation, patching
    from streetlamp.models.adapter import ModelAdapter
    from streetlamp.models.tiny import tiny_model

    adapter = ModelAdapter(*tiny_model("gpt2", seed=1), "tiny-gpt2")
    pair = patching.make_pair(adapter, "when mary and john went to", "when john and mary went to")
    n = pair.clean.lengths[0]
    rows = engine.repeat_inputs(pair.corrupt, 5)
    ivs = [engine.Intervention("layers.0.resid_pre", engine.zero, pos=h, rows=[h]) for h in range(5)]
    one = engine.run(adapter, rows, ivs, record=["layers.1.mlp.out"])
    few = engine.run_batched(adapter, rows, ivs, 2 * n, record=["layers.1.mlp.out"])  # passes of 2, 2, 1 rows
    assert (one.logits[0] - one.logits[1]).abs().max() > 1e-3  # the rows do differ
    np.testing.assert_allclose(few.logits, one.logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(few.cache["layers.1.mlp.out"], one.cache["layers.1.mlp.out"], rtol=1e-5, atol=1e-5)
    tol = 2e-5 / abs(pair.ld_clean - pair.ld_corrupt)
    one_p, few_p = (
        patching.activation_patching(adapter, pair),
        patching.activation_patching(adapter, pair, batch_size=2 * n),
    )
    for k in one_p:
        np.testing.assert_allclose(few_p[k], one_p[k], rtol=0, atol=tol)
    np.testing.assert_allclose(
        patching.path_patching(adapter, pair, batch_size=n), patching.path_patching(adapter, pair), rtol=0, atol=tol
    )
    pr = [mediation.Prompt("the nurse said that", "the doctor said that", " she", " he")]
    a, b = mediation.mediation(adapter, pr, batch_size=5), mediation.mediation(adapter, pr)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-5)


def test_batch_size_reaches_heads_and_is_recorded(
    setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from streetlamp.store.files import load_arrays

    base = [
        "heads",
        "--data",
        str(setup["data"]),
        "--no-attribution",
        "--ablation",
        "mean",
        "--model",
        str(setup["bert"]),
    ]
    assert main(base + ["--out", str(tmp_path / "a")]) == 0
    assert main(base + ["--out", str(tmp_path / "b"), "--batch-size", "8"]) == 0  # one text per pass
    a, b = load_arrays(tmp_path / "a" / "arrays.safetensors"), load_arrays(tmp_path / "b" / "arrays.safetensors")
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-6)
    m = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert m["parameters"]["batch_size"] == 8
