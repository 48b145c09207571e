"""``streetlamp explain-generation``: every generated token attributed by each method, one matrix per method."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from streetlamp.cli import main
from streetlamp.commands.explain import GenerationSettings
from streetlamp.commands.explain.generation import CAUSAL_IG_BASELINE, GENERATION_IG, explain_generation
from streetlamp.methods.gradient import ids_inputs
from streetlamp.methods.ig import IntegratedGradients
from streetlamp.methods.registry import get_method
from streetlamp.models.adapter import ModelAdapter, Target
from streetlamp.models.loading import load
from streetlamp.models.tiny import save_tiny, tiny_model
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
    ig = IntegratedGradients(**{**CAUSAL_IG_BASELINE, **params})  # this command's baseline (document start)
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
    assert "methods" not in m and "methods" not in m["parameters"]  # the IG-only manifest is as before
    # the default is IG's shared path with this command's rule, exactly (the same computation as before --methods)
    adapter = load(str(gpt2_dir))
    exps = IntegratedGradients(**GENERATION_IG, **CAUSAL_IG_BASELINE).attribute_sequence(
        adapter, "i loved it", 2, target=Target(quantity="logprob"), batched_grads=True
    )
    a = load_arrays(out / "arrays.safetensors")
    assert a["generated_ids"].tolist() == [e.info["target"]["index"] for e in exps]
    for j, e in enumerate(exps):
        np.testing.assert_array_equal(a["integrated_gradients.matrix"][j, : len(e.scores)], e.scores)
    capsys.readouterr()
    bert = save_tiny("bert", tmp_path / "tiny-bert", seed=1)
    for argv, msg in [
        (["--model", str(bert)], "needs a causal LM"),
        (["--new-tokens", "0"], "--new-tokens"),
        (["--ig-params", '{"nope": 1}'], "bad parameters"),
        (["--ig-params", "[1]"], "object"),
        (["--new-tokens", "65"], "--new-tokens must be at most 64 (got 65)"),
        (["--methods", "attention,nope"], "unknown method 'nope'"),
        (["--methods", "occlusion", "--ig-params", '{"steps": 4}'], "not among --methods"),
        (["--methods", "occlusion", "--method-params", '{"occlusion": {"nope": 1}}'], "bad parameters"),
        (["--continuation", "ing"], "does not re-tokenise"),  # "movieing" is not "movie" + "ing"
        (["--continuation", " zebra"], "cannot encode"),  # not in the tiny vocabulary
        (["--continuation", "   "], "empty --continuation"),
    ]:
        args = ["explain-generation", "the movie", "--model", str(gpt2_dir), "--out", str(tmp_path / "bad"), *argv]
        assert main(args) == 2, argv
        err = capsys.readouterr().err
        assert msg in err and err.strip().count("\n") == 0 and not (tmp_path / "bad").exists(), (argv, err)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_each_methods_rows_are_that_method_on_each_prefix(family: str, tmp_path: Path) -> None:
    """Row j of ``<method>.matrix`` is the method called on its own on prompt + generated[:j], explaining token j."""
    model, tok = tiny_model(family, seed=3)
    adapter = ModelAdapter(model.double(), tok, f"tiny-{family}")
    names = ["attention", "occlusion", "gradient_x_input"]
    res = explain_generation(
        adapter,
        GenerationSettings.from_values(prompt="the movie was not", new_tokens=3, methods=names, quantity="logit"),
        tmp_path / "g",
    )
    a = load_arrays(tmp_path / "g" / "arrays.safetensors")
    m = json.loads((tmp_path / "g" / "manifest.json").read_text())
    gen = a["generated_ids"].tolist()
    prompt = adapter.encode("the movie was not").input_ids[0]
    full = torch.cat([prompt, torch.tensor(gen)])
    assert "integrated_gradients.matrix" not in a and "completeness" not in a
    assert set(m["methods"]) == set(names) and res.matrices.keys() == set(names)
    for name in names:
        mat = a[f"{name}.matrix"]
        assert mat.shape == (3, len(full) - 1) and (tmp_path / "g" / m["methods"][name]["figure"]).exists()
        for j in range(3):
            n = len(prompt) + j
            want = get_method(name).attribute(
                adapter, ids_inputs(adapter, full[:n]), target=Target(gen[j], None, "logit")
            )
            # stored as float32: one rounding of float64 values
            np.testing.assert_allclose(mat[j, :n], want[0].scores, rtol=2 * np.finfo(np.float32).eps, atol=1e-30)
            assert np.all(mat[j, n:] == 0) and a["allowed"][j].sum() == n
            assert m["methods"][name]["explained"][j] == want[0].info["target"]["explained"]
    assert not np.allclose(a["occlusion.matrix"], a["attention.matrix"])  # the rows do differ between methods
    with torch.no_grad():  # greedy: each generated token is the argmax after its prefix
        for j in range(3):
            assert int(adapter.hf_model(input_ids=full[None, : len(prompt) + j]).logits[0, -1].argmax()) == gen[j]


def test_forced_continuation(gpt2_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "f"
    argv = ["explain-generation", "the movie was", "--model", str(gpt2_dir), "--out", str(out)]
    assert main([*argv, "--continuation", " not good at all", "--methods", "occlusion,attention"]) == 2  # "at", "all"
    assert "cannot encode" in capsys.readouterr().err and not out.exists()
    assert main([*argv, "--continuation", " not good", "--methods", "occlusion,attention"]) == 0
    a = load_arrays(out / "arrays.safetensors")
    m = json.loads((out / "manifest.json").read_text())
    adapter = load(str(gpt2_dir))
    ids = adapter.tokenizer("the movie was not good")["input_ids"]
    p = len(adapter.tokenizer("the movie was")["input_ids"])
    assert a["generated_ids"].tolist() == ids[p:] and m["continuation"] == "given"
    assert m["generated"] == [adapter.tokenizer.decode([i]) for i in ids[p:]]
    full = torch.tensor(ids)
    want = get_method("occlusion").attribute(
        adapter, ids_inputs(adapter, full[:-1]), target=Target(ids[-1], None, "logprob")
    )
    np.testing.assert_allclose(a["occlusion.matrix"][-1], want[0].scores, rtol=1e-5, atol=1e-7)
