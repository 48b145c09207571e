"""Model-parameter randomisation (evaluation/randomisation.py): the right parameters redrawn on a copy,
the original untouched, Spearman's rho against scipy, the verdict rule, and the refusals."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr

from streetlamp.cli import main
from streetlamp.evaluation.randomisation import (
    THRESHOLD,
    _generator,
    randomised_copies,
    stage_parameters,
    top_block,
    verdicts,
)
from streetlamp.methods.attention import Attention
from streetlamp.methods.registry import REGISTRY
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.tiny import save_tiny, tiny_model
from streetlamp.stats import spearman_rho
from tests.helpers.weights import weights_hash


@pytest.fixture()
def bert() -> ModelAdapter:
    m, t = tiny_model("bert", seed=2, layers=3)
    return ModelAdapter(m, t, "tiny-bert")


def test_spearman_matches_scipy() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(3, 20))
        a = rng.integers(0, 5, n).astype(float)  # ties
        b = a + rng.standard_normal(n)
        assert spearman_rho(a, b) == pytest.approx(spearmanr(a, b).statistic, abs=1e-12)
    ex = np.array([True, False, False, False, True])
    a, b = np.array([9.0, 1, 2, 3, -9]), np.array([-9.0, 3, 2, 1, 9])
    assert spearman_rho(a, b, ex) == pytest.approx(-1.0, abs=1e-15)
    assert np.isnan(spearman_rho(np.ones(4), np.arange(4.0)))


def test_stages_cover_every_parameter_once(bert: ModelAdapter) -> None:
    st = stage_parameters(bert)
    assert list(st) == ["head", "layer.2", "layer.1", "layer.0", "embed"]
    names = [n for v in st.values() for n in v]
    assert sorted(names) == sorted(n for n, _ in bert.hf_model.named_parameters())
    assert set(st["head"]) == {
        "bert.pooler.dense.weight",
        "bert.pooler.dense.bias",
        "classifier.weight",
        "classifier.bias",
    }
    assert all(n.startswith("bert.encoder.layer.1.") for n in st["layer.1"])
    assert all(n.startswith("bert.embeddings.") for n in st["embed"])


def _changed(orig: torch.nn.Module, new: torch.nn.Module) -> set[str]:
    o = dict(orig.named_parameters())
    return {n for n, p in new.named_parameters() if not torch.equal(p, o[n])}


def test_randomisation_changes_the_right_parameters_on_a_copy(bert: ModelAdapter) -> None:
    before = weights_hash(bert.hf_model)
    st = stage_parameters(bert)
    order = list(st)
    for mode in ("cascading", "independent"):
        for k, (stage, rnd) in enumerate(randomised_copies(bert, mode, seed=7)):
            assert stage == order[k]
            assert rnd.hf_model is not bert.hf_model
            want = {n for s in order[: k + 1] for n in st[s]} if mode == "cascading" else set(st[stage])
            assert _changed(bert.hf_model, rnd.hf_model) == want
            # a hand check of one redrawn tensor: mean + std * z from the named generator
            name = sorted(want)[0]
            p0 = dict(bert.hf_model.named_parameters())[name].detach().double()
            z = torch.randn(p0.shape, generator=_generator(7, name), dtype=torch.float64)
            std = float(p0.std()) if p0.numel() > 1 and float(p0.std()) > 0 else 0.02
            expect = (float(p0.mean()) + std * z).float()
            assert torch.equal(dict(rnd.hf_model.named_parameters())[name].detach(), expect)
    assert weights_hash(bert.hf_model) == before


def test_the_same_stage_is_the_same_model_in_every_call(bert: ModelAdapter) -> None:
    a = dict(next(iter(randomised_copies(bert, "cascading", 3)))[1].hf_model.named_parameters())
    b = dict(next(iter(randomised_copies(bert, "independent", 3)))[1].hf_model.named_parameters())
    assert all(torch.equal(a[n], b[n]) for n in a)  # stage 0 is the head alone in both modes


def test_verdict_rule() -> None:
    rng = np.random.default_rng(0)
    rows = []
    for method, centre in (("low", 0.0), ("high", 0.95), ("mid", THRESHOLD)):
        for i in range(40):
            v = centre + 0.02 * rng.standard_normal() if method != "mid" else (0.0 if i % 2 else 1.0)
            rows.append((f"e{i}", method, "mprt_cascading_spearman@embed", v))
    v = verdicts(pd.DataFrame(rows, columns=["example_id", "method", "metric", "value"])).set_index("method")
    assert set(v.stage) == {"embed"}
    assert v.loc["low", "verdict"] == "pass"
    assert v.loc["high", "verdict"] == "fail"
    assert v.loc["mid", "verdict"] == "inconclusive"


def test_evaluate_with_randomisation_leaves_the_model_untouched(tmp_path: Path) -> None:
    from streetlamp.evaluation.pipeline import EvalSettings
    from streetlamp.models.loading import load
    from streetlamp.runners.evaluate import evaluate

    ckpt = save_tiny("bert", tmp_path / "bert", seed=1)
    adapter = load(str(ckpt))
    data = tmp_path / "d.csv"
    data.write_text("text,label\nthe movie was good,pos\nthe plot was bad,neg\na fun film,pos\n")
    before = weights_hash(adapter.hf_model)
    s = EvalSettings(methods=["attention", "gradient_x_input"], randomisation="both", soft_samples=2)
    r = evaluate(str(ckpt), str(data), tmp_path / "run", s, chunk_size=2, adapter=adapter)
    assert weights_hash(adapter.hf_model) == before
    df = r.summary
    for mode in ("cascading", "independent"):
        for stage in ("head", "layer.1", "layer.0", "embed"):
            got = df[df.metric == f"mprt_{mode}_spearman@{stage}"]
            assert set(got.method) == {"attention", "gradient_x_input"}
            assert (got.n == 3).all()
    # randomising only the head cannot change attention (it is computed below the head)
    att = df[(df.method == "attention") & (df.metric == "mprt_cascading_spearman@head")]
    assert float(att["mean"].iloc[0]) == pytest.approx(1.0, abs=1e-12)
    rt = pd.read_csv(tmp_path / "run" / "randomisation.csv")
    assert {"method", "mode", "statistic", "stage", "mean", "ci_low", "ci_high", "n"} <= set(rt.columns)
    v = pd.read_csv(tmp_path / "run" / "randomisation_verdict.csv")
    assert set(v.method) == {"attention", "gradient_x_input"}
    assert set(v.verdict) <= {"pass", "fail", "inconclusive"}
    assert set(v.stage) == {"head", "layer.1", "layer.0", "embed"}
    assert top_block(["embed", "head", "layer.0", "layer.1"]) == "layer.1"
    md = (tmp_path / "run" / "summary.md").read_text()
    assert "rho@layer.1 [95% interval] | verdict | rho@embed" in md
    again = evaluate(str(ckpt), str(data), tmp_path / "run", s, chunk_size=2, adapter=adapter)
    assert again.n_computed_chunks == 0


class _WeightFree(Attention):
    name: ClassVar[str] = "weight_free_test"
    uses_weights: ClassVar[bool] = False


def test_randomisation_of_a_weight_free_method_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(REGISTRY, "weight_free_test", _WeightFree)
    out = tmp_path / "run"
    argv = ["evaluate", "--model", "tiny-bert", "--data", "movies", "--out", str(out)]
    code = main([*argv, "--methods", "attention,weight_free_test", "--randomisation", "cascading"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "weight_free_test" in err[0] and "weights" in err[0]
    assert not out.exists()
    assert main([*argv, "--randomisation", "sideways"]) == 2
    assert "--randomisation" in capsys.readouterr().err
    assert not out.exists()
