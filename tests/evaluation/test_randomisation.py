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
from streetlamp.models.adapter import ModelAdapter, Target
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
    from streetlamp.commands.evaluate import EvaluateSettings
    from streetlamp.commands.evaluate.run import evaluate
    from streetlamp.models.loading import load

    ckpt = save_tiny("bert", tmp_path / "bert", seed=1)
    adapter = load(str(ckpt))
    data = tmp_path / "d.csv"
    data.write_text("text,label\nthe movie was good,pos\nthe plot was bad,neg\na fun film,pos\n")
    before = weights_hash(adapter.hf_model)
    s = EvaluateSettings(
        data=str(data), chunk_size=2, methods=["attention", "gradient_x_input"], randomisation="both", soft_samples=2
    )
    r = evaluate(adapter, s, tmp_path / "run")
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
    again = evaluate(adapter, s, tmp_path / "run")
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


def test_a_fixed_target_explains_the_trained_prediction_on_every_copy() -> None:
    """``--randomisation-target trained``: each randomised copy explains the trained model's class. Checked
    analytically on a two-class model, where p(c) = 1 - p(1 - c) makes gradient x input of the other class the
    exact negative: an example whose prediction the copy flips gets rho negated against the own-prediction
    run, an unflipped one the same rho, and the absolute-score rho is the same for both."""
    from streetlamp.evaluation.randomisation import randomisation_rows

    m, t = tiny_model("bert", seed=2, layers=3)
    torch.manual_seed(0)
    m.classifier = torch.nn.Linear(m.config.hidden_size, 2)  # the tiny recipe has three classes
    with torch.no_grad():  # a head whose prediction the last stage (embed, seed 1) flips and the others keep
        m.classifier.bias.zero_()
        m.classifier.weight.mul_(10)
    m.config.num_labels, m.num_labels = 2, 2
    m.config.id2label, m.config.label2id = {0: "neg", 1: "pos"}, {"neg": 0, "pos": 1}
    adapter = ModelAdapter(m.double(), t, "tiny-bert")
    assert adapter.n_outputs == 2
    texts = ["the movie was good", "the plot was bad", "a fun film", "a dull and slow story", "great acting"]
    texts += ["bad film", "the music was fun", "a good plot", "slow and dull", "the story was great"]
    inputs = adapter.encode(texts)
    with torch.no_grad():
        trained = [int(i) for i in adapter.forward(inputs).logits.argmax(-1)]
    method = {"gradient_x_input": {}}
    exps = REGISTRY["gradient_x_input"]().attribute(adapter, inputs, target=Target(), batch_size=None, seed=0)
    scores = {"gradient_x_input": [np.asarray(x.scores, np.float64) for x in exps]}
    specials = [adapter.special_mask(r) for r in inputs.rows()]

    def rows(targets: list[int] | None) -> dict[tuple[int, str], float]:
        got = randomisation_rows(adapter, inputs, scores, specials, method, "cascading", 1, None, targets=targets)
        return {(b, k): v for b, _, k, v in got}

    own, fixed = rows(None), rows(trained)
    assert own.keys() == fixed.keys()
    flips = kept = 0
    for stage, copy_ in randomised_copies(adapter, "cascading", 1):
        with torch.no_grad():
            pred = [int(i) for i in copy_.forward(inputs).logits.argmax(-1)]
        for b in range(len(texts)):
            k = f"mprt_cascading_spearman@{stage}"
            r_own, r_fixed = own[(b, k)], fixed[(b, k)]
            expect = r_fixed if pred[b] == trained[b] else -r_fixed
            assert r_own == pytest.approx(expect, abs=1e-9)
            ka = f"mprt_cascading_spearman_abs@{stage}"
            assert own[(b, ka)] == pytest.approx(fixed[(b, ka)], abs=1e-9)
            if abs(r_fixed) > 0.1:  # far from 0: here the sign comparison could fail
                flips += pred[b] != trained[b]
                kept += pred[b] == trained[b]
    assert flips >= 3 and kept >= 3, (flips, kept)  # both cases occur, each with a rho far from 0


def test_an_unknown_randomisation_target_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    argv = ["evaluate", "--model", "tiny-bert", "--data", "movies", "--out", str(out), "--randomisation", "cascading"]
    assert main([*argv, "--randomisation-target", "sideways"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--randomisation-target" in err[0] and "trained" in err[0]
    assert not out.exists()
    alone = [a for a in argv if a not in ("--randomisation", "cascading")]
    assert main([*alone, "--randomisation-target", "trained"]) == 2  # nothing randomised to explain
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs --randomisation" in err[0]
    assert not out.exists()


def test_evaluate_with_a_fixed_target_explains_the_trained_predictions(tmp_path: Path) -> None:
    """The run wires the trained model's predictions through: its rho rows equal the direct computation
    with those targets, its settings store the choice, and summary.md says what the copies explained."""
    import json

    from streetlamp.commands.evaluate import EvaluateSettings
    from streetlamp.commands.evaluate.run import evaluate
    from streetlamp.evaluation.randomisation import randomisation_rows
    from streetlamp.models.loading import load

    ckpt = save_tiny("bert", tmp_path / "bert", seed=1)
    adapter = load(str(ckpt))
    texts = ["the movie was good", "the plot was bad", "a fun film"]
    data = tmp_path / "d.csv"
    data.write_text("text,label\n" + "".join(f"{t},pos\n" for t in texts))
    s = EvaluateSettings(
        data=str(data),
        chunk_size=3,
        methods=["gradient_x_input"],
        randomisation="cascading",
        randomisation_target="trained",
        soft=False,
    )
    r = evaluate(adapter, s, tmp_path / "run")
    inputs = adapter.encode(texts)
    with torch.no_grad():
        trained = [int(i) for i in adapter.forward(inputs).logits.argmax(-1)]
    exps = REGISTRY["gradient_x_input"]().attribute(adapter, inputs, target=Target(), batch_size=None, seed=0)
    scores = {"gradient_x_input": [np.asarray(x.scores, np.float64) for x in exps]}
    specials = [adapter.special_mask(x) for x in inputs.rows()]
    direct = randomisation_rows(
        adapter, inputs, scores, specials, {"gradient_x_input": {}}, "cascading", 0, None, targets=trained
    )
    want = pd.DataFrame(direct, columns=["b", "method", "metric", "value"]).groupby("metric")["value"].mean()
    got = r.summary.set_index("metric")["mean"]
    for metric, v in want.items():
        assert got[metric] == pytest.approx(v, abs=1e-5)  # float32 model: stored means of three rhos
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert '"randomisation_target": "trained"' in json.dumps(manifest)
    assert "explains the trained model's prediction (a fixed target)" in (tmp_path / "run" / "summary.md").read_text()
