"""Integrated gradients inside evaluate (evaluation/common.evaluate_params): Clenshaw–Curtis on a classifier when
the run names no rule, the run's own parameters (``auto``) for an example it does not converge on, and ``auto``
untouched on a causal LM; on tiny float64 models."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import streetlamp.evaluation.pipeline as pipe_mod
from streetlamp.evaluation.common import IG_CLASSIFIER_RULE, evaluate_params
from streetlamp.evaluation.pipeline import ChunkExample, EvalSettings, evaluate_chunk
from streetlamp.methods.registry import get_method
from streetlamp.models.adapter import Inputs, ModelAdapter, Target
from streetlamp.models.kinds import CAUSAL_LM, CLASSIFIER, ENCODER_DECODER
from streetlamp.models.tiny import tiny_model

TEXTS = ["the movie was not good , but the acting was great .", "i loved it a lot"]
IG = "integrated_gradients"


def adapter_of(family: str) -> ModelAdapter:
    m, t = tiny_model(family, seed=3, layers=2)
    return ModelAdapter(m.double(), t, f"tiny-{family}")


def test_evaluate_params_choose_the_rule_only_for_ig_on_a_classifier_without_one() -> None:
    run = {IG: {"tolerance": 1e-4}, "occlusion": {"window": 2}}
    assert evaluate_params(run, IG, CLASSIFIER) == {"tolerance": 1e-4, "rule": IG_CLASSIFIER_RULE}
    assert run[IG] == {"tolerance": 1e-4}  # the run's settings are not touched
    assert evaluate_params({IG: {"rule": "auto"}}, IG, CLASSIFIER) == {"rule": "auto"}
    assert evaluate_params(run, IG, CAUSAL_LM) == {"tolerance": 1e-4}
    assert evaluate_params(run, IG, ENCODER_DECODER) == {"tolerance": 1e-4}
    assert evaluate_params(run, "occlusion", CLASSIFIER) == {"window": 2}
    assert evaluate_params({}, IG, CLASSIFIER) == {"rule": IG_CLASSIFIER_RULE}


def _examples(a: ModelAdapter) -> tuple[list[ChunkExample], Inputs]:
    enc = a.encode(TEXTS)
    ids = [enc.input_ids[i, : enc.lengths[i]].tolist() for i in range(len(TEXTS))]
    ex = [ChunkExample(index=i, id=f"ex{i}", ids=r, text=t, gold=0) for i, (r, t) in enumerate(zip(ids, TEXTS))]
    return ex, Inputs.from_ids(a, ids, TEXTS)


def _ig(a: ModelAdapter, inputs: Inputs, **params: object) -> list[np.ndarray]:
    return [np.asarray(x.scores) for x in get_method(IG, **params).attribute(a, inputs, target=Target())]


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_evaluate_ig_tokens_are_those_of_the_chosen_rule(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    a = adapter_of(family)
    ex, inputs = _examples(a)
    built: list[dict] = []
    real = pipe_mod.get_method

    def spy(name: str, **params: object):  # noqa: ANN202
        built.append(dict(params))
        return real(name, **params)

    monkeypatch.setattr(pipe_mod, "get_method", spy)
    _, arrays = evaluate_chunk(a, ex, EvalSettings(methods=[IG], soft=False, adv_steps=1))
    rule = IG_CLASSIFIER_RULE if a.kind == "classifier" else "auto"
    assert built == ([{"rule": rule}] if a.kind == "classifier" else [{}])  # built once: every example converged
    want = _ig(a, inputs, rule=rule)
    for b, e in enumerate(ex):
        got = arrays[e.id][f"{IG}.tokens"]
        np.testing.assert_allclose(got, want[b], rtol=1e-6, atol=1e-7 * np.abs(want[b]).max())


def test_an_example_the_chosen_rule_misses_is_redone_with_the_runs_parameters() -> None:
    a = adapter_of("bert")
    ex, inputs = _examples(a)
    own = {"steps": 1, "max_steps": 1}  # one Clenshaw–Curtis interval: 15-35% off; auto's coarse pass has 4
    with pytest.warns(UserWarning, match="clenshaw_curtis"):
        cc = get_method(IG, rule=IG_CLASSIFIER_RULE, **own).attribute(a, inputs, target=Target())
    assert not any(x.info["converged"] for x in cc)
    s = EvalSettings(methods=[IG], method_params={IG: own}, soft=False, adv_steps=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, arrays = evaluate_chunk(a, ex, s)
    assert not [w for w in caught if "clenshaw_curtis" in str(w.message)]  # the missed rule's warning is dropped
    want = _ig(a, inputs, **own)  # the run's own parameters: rule auto
    for b, e in enumerate(ex):
        np.testing.assert_allclose(arrays[e.id][f"{IG}.tokens"], want[b], rtol=1e-6, atol=1e-7 * np.abs(want[b]).max())
        assert np.abs(want[b] - np.asarray(cc[b].scores)).max() > 1e-2 * np.abs(want[b]).max()
