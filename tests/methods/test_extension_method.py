"""The method registry is the one place a method is added: a test-only method (one class, one registry
line, registered here at test time) runs through ``streetlamp explain --methods NAME`` end to end, is
listed by ``streetlamp methods``, and passes the conformance suite's own checks on every tiny family.
Without the registry line the same CLI call is refused: nothing else makes the method known."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from streetlamp.cli import main
from streetlamp.methods.base import Method
from streetlamp.methods.registry import REGISTRY
from streetlamp.models.adapter import Inputs, ModelAdapter, Target
from streetlamp.models.tiny import save_tiny
from streetlamp.results import Explanation
from streetlamp.store.files import load_arrays

from . import test_conformance as conformance


# -- a test-only method: the whole module a newcomer writes ----------------------------------------
@dataclass
class Proximity(Method):
    """Each token scores ``1 / (1 + width * |i - p|)``, ``p`` the explained position: no model internals,
    so its numbers are known exactly, and only the registry line makes it reachable."""

    width: float = 1.0
    name = "proximity"
    family = "test"
    description = "closeness of each token to the explained position (a test-only method)"
    kinds = ("classifier", "causal_lm")

    def attribute(
        self, adapter: ModelAdapter, inputs: Inputs, *, target: Target, batch_size: int | None = None, seed: int = 0
    ) -> list[Explanation]:
        self.check(adapter)
        with torch.no_grad():
            logits = adapter.forward(inputs).logits
        index = adapter.resolve(inputs, target, logits)
        out = []
        for b, n in enumerate(inputs.lengths):
            p = adapter.explained_position(n)
            scores = 1.0 / (1.0 + self.width * np.abs(np.arange(n) - p))
            out.append(
                self.explanation(
                    adapter,
                    inputs,
                    b,
                    int(index[b]),
                    target,
                    arrays={"tokens": scores.astype(np.float32)},
                    axes={"tokens": ["token"]},
                    meaning={"tokens": "1 / (1 + width |i - explained position|)"},
                    explained_position=p,
                )
            )
        return out


@pytest.fixture()
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REGISTRY, Proximity.name, Proximity)  # the one registry line


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("bert", tmp_path_factory.mktemp("ext") / "bert", seed=1)


def test_unregistered_the_method_is_refused(bert: Path, tmp_path: Path, capsys) -> None:
    assert "proximity" not in REGISTRY
    rc = main(
        ["explain", "the movie was good", "--model", str(bert), "--methods", "proximity", "--out", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "unknown method 'proximity'" in err and not (tmp_path / "o").exists()


def test_a_registered_method_runs_through_explain(registered, bert: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    argv = ["explain", "the movie was good", "--model", str(bert), "--out", str(out)]
    assert main([*argv, "--methods", "attention,proximity", "--method-params", "proximity.width=0.5"]) == 0
    stdout = capsys.readouterr().out
    assert f"output: {out}/" in stdout
    assert "proximity" in (out / "kendall_tau.csv").read_text()  # in the methods' rank agreement table
    m = json.loads((out / "manifest.json").read_text())
    n = len(m["tokens"])  # [CLS] the movie was good [SEP]
    assert n == 6 and m["parameters"]["methods"]["proximity"] == {"width": 0.5}
    assert m["arrays"]["proximity.tokens"]["axes"] == ["token"]
    got = load_arrays(out / "arrays.safetensors")["proximity.tokens"]
    # BERT reads [CLS]: p = 0, so 1 / (1 + 0.5 i); the values span [0.286, 1], far above float32's ulp
    np.testing.assert_allclose(got, 1.0 / (1.0 + 0.5 * np.arange(n)), rtol=2**-23, atol=0)
    assert (out / "report.html").exists()
    # listed with its parameters by `streetlamp methods`
    assert main(["methods"]) == 0
    listing = capsys.readouterr().out
    assert "proximity" in listing and "width=1.0" in listing


def test_a_registered_method_passes_the_conformance_suite(registered, tiny: ModelAdapter) -> None:
    """The conformance suite's own test functions, applied to the new name on every tiny family."""
    conformance.test_registry_names_are_unique_and_described()
    conformance.test_conformance("proximity", tiny)
    conformance.test_explicit_target("proximity", tiny)
    conformance.test_methods_without_gradients_run_in_inference_mode("proximity", tiny)
    conformance.test_seed_matters_only_for_stochastic_methods("proximity", tiny)
    e = REGISTRY["proximity"]().attribute(tiny, tiny.encode(conformance.TEXTS[:1]), target=Target())[0]
    p = e.info["explained_position"]
    assert e.scores[p] == 1.0 and np.all(e.scores[np.arange(len(e.scores)) != p] <= 0.5)
