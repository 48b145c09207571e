"""``streetlamp explain-generation``: IG of every generated token, written as one matrix."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from streetlamp.cli import main
from streetlamp.methods.gradient import ids_inputs
from streetlamp.methods.ig import IntegratedGradients
from streetlamp.models.loading import load
from streetlamp.models.tiny import save_tiny
from streetlamp.store.files import load_arrays


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("gpt2", tmp_path_factory.mktemp("m") / "tiny-gpt2", seed=2)


def test_matrix_rows_are_each_targets_own_ig(gpt2_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "g"
    params = {"rule": "gauss_legendre", "steps": 8, "adaptive": False}
    assert (
        main(
            [
                "explain-generation",
                "the movie was not",
                "--model",
                str(gpt2_dir),
                "--new-tokens",
                "3",
                "--ig-params",
                json.dumps(params),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    stdout = capsys.readouterr().out
    a = load_arrays(out / "arrays.safetensors")
    m = json.loads((out / "manifest.json").read_text())
    mat, allowed, gen = a["integrated_gradients.matrix"], a["allowed"], a["generated_ids"].tolist()
    assert mat.shape == allowed.shape == (3, len(m["tokens"])) and len(gen) == 3
    assert m["parameters"]["integrated_gradients"]["rule"] == "gauss_legendre"
    assert (out / "generation.png").exists() and "continuation" in stdout
    # independent: a separate IG per target over its own prefix (no shared path) gives each row
    adapter = load(str(gpt2_dir))
    prompt = adapter.encode("the movie was not").input_ids[0]
    full = torch.cat([prompt, torch.tensor(gen)])
    ig = IntegratedGradients(**params)
    from streetlamp.models.adapter import Target

    for j in range(3):
        n = len(prompt) + j
        sep = ig.attribute(adapter, ids_inputs(adapter, full[:n]), target=Target(gen[j], None, "logprob"))[0]
        assert allowed[j].sum() == n and np.all(mat[j, n:] == 0)
        np.testing.assert_allclose(mat[j, :n], sep.scores, rtol=1e-4, atol=1e-6)
    # greedy: each generated token is the argmax after its prefix
    with torch.no_grad():
        for j in range(3):
            n = len(prompt) + j
            assert int(adapter.hf_model(input_ids=full[None, :n]).logits[0, -1].argmax()) == gen[j]


def test_default_rule_and_bad_input(gpt2_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "d"
    assert (
        main(["explain-generation", "i loved it", "--model", str(gpt2_dir), "--new-tokens", "2", "--out", str(out)])
        == 0
    )
    m = json.loads((out / "manifest.json").read_text())
    assert m["parameters"]["integrated_gradients"]["rule"] == "panels"
    assert all(p["converged"] for p in m["per_token"])
    capsys.readouterr()
    bert = save_tiny("bert", tmp_path / "tiny-bert", seed=1)
    for argv, msg in [
        (["--model", str(bert)], "needs a causal LM"),
        (["--new-tokens", "0"], "--new-tokens"),
        (["--ig-params", '{"nope": 1}'], "bad parameters"),
        (["--ig-params", "[1]"], "object"),
    ]:
        args = ["explain-generation", "the movie", "--model", str(gpt2_dir), "--out", str(tmp_path / "bad"), *argv]
        assert main(args) == 2, argv
        err = capsys.readouterr().err
        assert msg in err and not (tmp_path / "bad").exists(), (argv, err)
