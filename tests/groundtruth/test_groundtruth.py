"""Ground truth without the shipped weights: generators, tokenizer, scoring, the deception penalty."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.groundtruth import leaderboard as lb
from streetlamp.groundtruth.tasks import (
    ANIMAL,
    COLOURS,
    CREATURES,
    FRUIT,
    MARKERS,
    NEGATIVE,
    NEGATOR,
    POSITIVE,
    TASKS,
    get_task,
    parse_tasks,
    planted_mask,
)
from streetlamp.groundtruth.train import TrainConfig, batch_inputs, build_model, deception_penalty, forward_with_mass

DECIDING = {
    "keyword": set(FRUIT + ANIMAL),
    "order": set(MARKERS),
    "negation": set(POSITIVE + NEGATIVE),
    "together": set(COLOURS + CREATURES),
}


@pytest.mark.parametrize("name", list(TASKS))
def test_generators_plant_what_they_say(name: str) -> None:
    task = get_task(name)
    examples = task.generate(600, seed=1)
    labels = np.array([e.label for e in examples])
    assert 0.3 < labels.mean() < 0.7
    for e in examples:
        planted_words = [e.words[i] for i in e.planted]
        assert task.rule(planted_words) == e.label  # the label is a function of the planted words
        deciding = [i for i, w in enumerate(e.words) if w in DECIDING[name]]
        assert set(deciding) <= set(e.planted), "a deciding word outside the planted positions"
        if name == "negation":
            assert len(deciding) == 1
            negated = e.planted[0] != deciding[0]
            assert negated == (e.words[deciding[0] - 1] == NEGATOR)
            # the label from first principles: sentiment flipped by an adjacent `not` only
            assert e.label == int((e.words[deciding[0]] in POSITIVE) != negated)
        if name == "order":
            assert e.label == int(e.words.index("alpha") < e.words.index("omega"))
        if name == "together":
            c = next(w for w in e.words if w in COLOURS)
            a = next(w for w in e.words if w in CREATURES)
            assert e.label == int((c, a) in (("red", "cat"), ("blue", "dog")))
    if name == "negation":  # `not` occurs exactly where it negates
        assert all((NEGATOR in e.words) == (len(e.planted) == 2) for e in examples)


def test_same_seed_same_data_and_bad_names() -> None:
    a = [e.text for e in TASKS["order"].generate(20, seed=5)]
    assert a == [e.text for e in TASKS["order"].generate(20, seed=5)]
    assert a != [e.text for e in TASKS["order"].generate(20, seed=6)]
    with pytest.raises(StreetlampError):
        parse_tasks("keyword,nope")
    assert parse_tasks("all") == list(TASKS)


def test_tokenizer_maps_word_i_to_token_i_plus_1() -> None:
    adapter = build_model(TASKS["negation"], TrainConfig(), seed=0)
    for e in TASKS["negation"].generate(20, seed=2):
        inputs = adapter.encode(e.text)
        assert inputs.tokens[0] == ["[CLS]"] + e.words + ["[SEP]"]
        m = planted_mask(e, inputs.lengths[0])
        assert [inputs.tokens[0][i] for i in np.flatnonzero(m)] == [e.words[p] for p in e.planted]


def simple_ap(scores: np.ndarray, rel: np.ndarray) -> float:
    """Independent AP for distinct scores: mean precision at the rank of each relevant item."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    hits, total = 0, 0.0
    for rank, i in enumerate(order, 1):
        if rel[i]:
            hits += 1
            total += hits / rank
    return total / rel.sum()


def test_average_precision_and_precision_at_k() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(3, 12))
        rel = np.zeros(n, bool)
        rel[rng.choice(n, size=int(rng.integers(1, n)), replace=False)] = True
        s = rng.random(n)
        assert lb.average_precision(s, rel) == pytest.approx(simple_ap(s, rel))
    rel = np.array([0, 1, 0, 1], bool)
    assert lb.average_precision(np.array([0.1, 0.9, 0.2, 0.8]), rel) == 1.0  # oracle
    # ties: one threshold holding everything = precision of the whole list
    assert lb.average_precision(np.ones(4), rel) == pytest.approx(0.5)
    assert lb.precision_at_k(np.array([0.1, 0.9, 0.2, 0.8]), rel) == 1.0
    assert lb.precision_at_k(np.array([0.9, 0.1, 0.8, 0.2]), rel) == 0.0
    assert lb.word_scores(np.array([5.0, -1.0, 2.0, 7.0])).tolist() == [1.0, 2.0]


def test_edge_share() -> None:
    """Share of |score| mass on the first and last tokens, by hand."""
    assert lb.edge_share(np.array([-3.0, 1.0, 0.0, 2.0, 4.0])) == pytest.approx(7 / 10)
    assert lb.edge_share(np.array([0.0, 5.0, 0.0])) == 0.0
    assert lb.edge_share(np.zeros(4)) == 0.0  # no mass anywhere: no skew to report
    assert lb.edge_share(np.ones(8)) == pytest.approx(2 / 8)  # uniform: the edge_share_uniform column


def test_oracle_is_one_and_random_is_its_expectation() -> None:
    """Random rankings average to the exact E[AP] (by enumerating permutations), near the base rate."""
    examples = TASKS["order"].generate(3000, seed=3)
    rng = np.random.default_rng(0)
    aps, expected, base = [], [], []
    exact: dict[tuple[int, int], float] = {}
    for e in examples:
        rel = planted_mask(e, len(e.words) + 2)[1:-1]
        assert lb.average_precision(rel.astype(float) + 0.01 * rng.random(len(rel)), rel) == 1.0
        aps.append(lb.average_precision(rng.random(len(rel)), rel))
        key = (len(rel), int(rel.sum()))
        if key not in exact:  # E[AP]: every placement of the k relevant items among n ranks, equally likely
            n, k = key
            ranked = np.arange(n, 0, -1).astype(float)
            exact[key] = float(
                np.mean([simple_ap(ranked, np.isin(np.arange(n), c)) for c in itertools.combinations(range(n), k)])
            )
        expected.append(exact[key])
        base.append(rel.mean())
    assert np.mean(aps) == pytest.approx(np.mean(expected), abs=0.015)
    assert abs(np.mean(aps) - np.mean(base)) < 0.25  # near the base rate (E[AP] > base rate on short texts)


def test_penalty_uses_the_patterns_the_model_uses() -> None:
    """Planted mass from the recorded streetlamp patterns equals Hugging Face eager attentions,
    the penalty matches a direct computation, and it has a gradient for every attention weight."""
    task = TASKS["keyword"]
    adapter = build_model(task, TrainConfig(), seed=0)
    examples = task.generate(6, seed=4)
    inputs, y, planted = batch_inputs(adapter, examples)
    logits, mass = forward_with_mass(adapter, inputs, planted, grad=True)
    import copy

    twin = copy.deepcopy(adapter.hf_model)
    twin.set_attn_implementation("eager")
    with torch.no_grad():
        out = twin(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask, output_attentions=True)
    for l, att in enumerate(out.attentions):
        direct = (att * planted[:, None, None, :]).sum(-1)
        torch.testing.assert_close(mass[:, l].detach(), direct, atol=1e-6, rtol=1e-5)
    qm = inputs.attention_mask.float()
    want = 0.0
    for b in range(len(examples)):
        n = int(qm[b].sum())
        want += sum(
            float(-torch.log(1 - mass[b, l, h, :n].detach()).mean() - torch.log(1 - mass[b, l, h, 0].detach()))
            for l in range(2)
            for h in range(2)
        )
    pen = deception_penalty(mass, inputs.attention_mask)
    assert float(pen) == pytest.approx(want / len(examples), rel=1e-5)
    pen.backward()
    q = adapter.hf_model.bert.encoder.layer[0].attention.self.query.weight
    assert q.grad is not None and q.grad.abs().sum() > 0


def test_diagnostics_js_and_seed_variance() -> None:
    from scipy.spatial.distance import jensenshannon

    from streetlamp.groundtruth import diagnostics as dg

    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(7), 5), rng.dirichlet(np.ones(7), 5)
    np.testing.assert_allclose(dg.js_divergence(p, q), jensenshannon(p, q, base=2, axis=-1) ** 2, atol=1e-12)
    task = TASKS["keyword"]
    a, b = (build_model(task, TrainConfig(), seed=s) for s in (0, 1))
    ex = task.generate(20, seed=1)
    same = dg.seed_variance([a, a], ex)
    assert same["attention_jsd"] == pytest.approx(0, abs=1e-9) and same["prediction_agreement"] == 1.0
    diff = dg.seed_variance([a, b], ex)
    assert diff["attention_jsd"] > 1e-7  # two random inits: near-uniform attention, but not equal
    att, probs = dg.cls_attention(a, ex)
    np.testing.assert_allclose(att.sum(1), 1, atol=1e-5)  # a distribution over the real tokens
    acc = dg.frozen_attention_mlp(a, task.generate(200, seed=2), ex, {"random_model": b}, steps=20)
    assert set(acc) == {"learned", "uniform", "random_model"} and all(0 <= v <= 1 for v in acc.values())


def test_layer_seed_variance_matches_heads_across_trainings() -> None:
    """A copy of a model with its two heads swapped (query/key/value rows and output columns permuted) has the
    same outputs: matched per-head JSD 0, while the unmatched heads differ; a different init is > 0."""
    from streetlamp.groundtruth import diagnostics as dg

    task = TASKS["keyword"]
    a, b = (build_model(task, TrainConfig(), seed=s) for s in (0, 1))
    swapped = build_model(task, TrainConfig(), seed=0)
    d = TrainConfig().d_model // TrainConfig().heads
    perm = torch.cat([torch.arange(d, 2 * d), torch.arange(0, d)])
    with torch.no_grad():
        for layer in swapped.hf_model.bert.encoder.layer:
            for lin in (layer.attention.self.query, layer.attention.self.key, layer.attention.self.value):
                lin.weight.copy_(lin.weight[perm])
                lin.bias.copy_(lin.bias[perm])
            out = layer.attention.output.dense
            out.weight.copy_(out.weight[:, perm])
    ex = task.generate(12, seed=3)
    ra, rs = dg.cls_rows(a, ex, 1), dg.cls_rows(swapped, ex, 1)
    np.testing.assert_allclose(rs[:, ::-1], ra, atol=1e-6)  # the heads really are swapped
    same = dg.layer_seed_variance([a, swapped], ex, 1)
    assert same["matched_head_jsd"] == pytest.approx(0, abs=1e-9)
    assert same["head_mean_jsd"] == pytest.approx(0, abs=1e-9)
    unmatched = float(np.mean(dg.js_divergence(ra, rs)))
    assert unmatched > 1e-6  # so the matching did something
    diff = dg.layer_seed_variance([a, b], ex, 1)
    assert diff["matched_head_jsd"] > 1e-7 and diff["pairs"] == 1
