"""Circuits and faithfulness: f(full) = 1 and f(empty) = 0 by construction, checked against runs the
engine does not make (the model's own clean and corrupted forwards, the hand-written forward of
test_circuit_scores under mean and zero ablation and for a random circuit); pruning on a hand-built
graph; CPR/CMD on curves with known areas; the bootstrap through stats.py; a planted circuit whose
edges are known by construction, recovered with precision and recall 1 by every method."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.interventions.circuits import faithfulness as F
from streetlamp.interventions.circuits import scores as S
from streetlamp.interventions.circuits.graph import Graph
from streetlamp.interventions.circuits.tasks import encode_pairs
from streetlamp.stats import bootstrap_ci, percentile_interval, resample_indices
from tests.conftest import F64_TOL
from tests.interventions.test_circuit_scores import PAIRS, f64_llama, hand_forward, make, names_of  # noqa: F401

PAIRS3 = PAIRS + [
    PAIRS[1].__class__("the story was fun and the plot", "the story was boring and the plot", " fun", " boring")
]


def _metric(logits: torch.Tensor, pairs) -> np.ndarray:
    rows = torch.arange(len(pairs))
    return (logits[rows, pairs.answer] - logits[rows, pairs.wrong]).double().numpy()


def test_full_is_one_and_empty_is_zero_by_construction() -> None:
    a, b = make("gpt2")
    pairs = encode_pairs(a, PAIRS3)
    e = S.eap(b, pairs)
    sw = F.sweep(b, pairs, e, [0.1, 0.5, 1.0], n_random=2, n_boot=50)
    t = sw.table
    assert t["faithfulness"].iloc[-1] == pytest.approx(1.0, abs=F64_TOL)
    assert t["random_faithfulness"].iloc[-1] == pytest.approx(1.0, abs=F64_TOL)
    # m(M) and m(∅) are the model's clean and corrupted runs (the adapter's forward, not the engine's)
    clean, corrupt = _metric(a.forward(pairs.clean).logits, pairs), _metric(a.forward(pairs.corrupt).logits, pairs)
    assert sw.summary["m_full"] == pytest.approx(clean.mean(), abs=F64_TOL)
    assert sw.summary["m_empty"] == pytest.approx(corrupt.mean(), abs=F64_TOL)
    assert abs(clean.mean() - corrupt.mean()) > 1e-3
    mv = F.circuit_metrics(b, pairs, [b.graph.valid(), torch.zeros_like(b.graph.valid())])
    f = F.faithfulness(mv, mv[1], mv[0])
    assert f[0] == pytest.approx(1.0, abs=F64_TOL) and f[1] == pytest.approx(0.0, abs=F64_TOL)
    assert list(t["n_edges"]) == [int(m.sum()) for m in sw.masks] and t["n_edges"].iloc[-1] == b.graph.n_edges
    assert np.all(t["ci_low"] <= t["faithfulness"] + F64_TOL) and np.all(t["faithfulness"] <= t["ci_high"] + F64_TOL)


def test_empty_circuit_under_patching_is_the_corrupted_run_without_a_masked_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """circuit_metrics takes m(∅) under patching from the corrupted forward it runs for z̃: equal to the
    masked forward with every edge ablated (the pass it replaces), and no masked pass runs for it."""
    a, b = make("gpt2")
    pairs = encode_pairs(a, PAIRS3)
    g = b.graph
    none = torch.zeros_like(g.valid())
    real = F.run_graph
    masked: list[int] = []

    def spy(blocks, ids, am, ablated=None, mask=None, override=None):
        if mask is not None:
            masked.append(mask.shape[0])
        return real(blocks, ids, am, ablated=ablated, mask=mask, override=override)

    monkeypatch.setattr(F, "run_graph", spy)
    mv = F.circuit_metrics(b, pairs, [none, g.valid(), none], batch_size=2)
    assert sum(masked) == len(pairs)  # the full circuit's rows only
    ab = S.ablation_values(b, pairs, "patch")
    with torch.no_grad():
        run = real(b, pairs.clean.input_ids, pairs.clean.attention_mask, ablated=ab, mask=none[None].double())
    want = _metric(run.logits, pairs)
    np.testing.assert_allclose(mv[0], want, rtol=0, atol=F64_TOL)
    np.testing.assert_allclose(mv[2], want, rtol=0, atol=F64_TOL)
    assert np.abs(mv[1] - want).max() > 1e-3


@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_empty_and_random_circuits_match_the_hand_forward(ablation: str, f64_llama: None) -> None:  # noqa: F811
    a, b = make("llama")
    pairs = encode_pairs(a, PAIRS)
    g = b.graph
    W, R = names_of(b)
    rng = np.random.default_rng(0)
    rand = F.random_circuit(g, g.n_edges // 3, rng)
    mv = F.circuit_metrics(b, pairs, [torch.zeros_like(g.valid()), rand], ablation=ablation)
    # the hand forward's ablated values: zeros, or each writer's mean over every real token of the clean prompts
    outs = [hand_forward(a, ids)[1] for ids in pairs.clean.rows()]
    if ablation == "zero":
        abl = {w: torch.zeros(1, a.d_model, dtype=torch.float64) for w in W}
    else:
        abl = {w: torch.cat([o[w] for o in outs]).mean(0, keepdim=True).detach() for w in W}
    r_idx, w_idx = g.edge_index()
    for i, ids in enumerate(pairs.clean.rows()):
        full = {w: v.expand(len(ids), -1) for w, v in abl.items()}
        for c, mask in enumerate([torch.zeros_like(g.valid()), rand]):
            keep = {(W[w], R[r]): int(mask[r, w]) for r, w in zip(r_idx, w_idx)}
            with torch.no_grad():
                lg, _ = hand_forward(a, ids, mask=keep, ablated=full)
            want = float(lg[pairs.answer[i]] - lg[pairs.wrong[i]])
            assert abs(mv[c, i] - want) <= F64_TOL * max(1.0, abs(want))
    clean = _metric(a.forward(pairs.clean).logits, pairs)
    assert np.abs(mv[0] - clean).max() > 1e-3  # ablating every edge changes the metric: not a no-op


def test_prune_keeps_only_edges_on_input_to_logits_paths() -> None:
    g = Graph(2, 2, 2)
    W, R = list(g.writers), [(r.node, r.input) for r in g.readers]
    m = torch.zeros(g.n_readers, g.n_writers, dtype=torch.bool)

    def edge(src: str, node: str, inp: str) -> tuple[int, int]:
        return R.index((node, inp)), W.index(src)

    kept = [edge("embed", "L0.H0", "q"), edge("L0.H0", "L1.H1", "v"), edge("L1.H1", "logits", "logits")]
    dropped = [
        edge("L0.H1", "logits", "logits"),  # L0.H1 has no input from the circuit: unreachable from embed
        edge("embed", "L1.MLP", "mlp"),  # L1.MLP writes to nothing in the circuit
        edge("L0.MLP", "L1.H0", "k"),  # L0.MLP unreachable, L1.H0 dead
    ]
    for r, w in kept + dropped:
        m[r, w] = True
    p = F.prune(g, m)
    assert {(r, w) for r, w in zip(*np.nonzero(p.numpy()))} == set(kept)
    # top_k ranks by |score|, ties in graph order; NaNs last
    s = torch.full((g.n_readers, g.n_writers), float("nan"), dtype=torch.float64)
    s[kept[0]], s[kept[1]], s[dropped[0]] = -3.0, 2.0, 1.0
    t = F.top_k(g, s, 2)
    assert bool(t[kept[0]]) and bool(t[kept[1]]) and int(t.sum()) == 2


def test_areas_and_size_checks() -> None:
    x = np.array([0.1, 0.3, 0.5, 1.0])
    under, from1 = F.areas(x, x)  # f = x on MIB's raw axis: the integral of x over [0.1, 1] = 0.495
    assert under == pytest.approx(0.495, abs=1e-12) and from1 == pytest.approx(0.405, abs=1e-12)
    assert F.areas(x, np.ones(4)) == (pytest.approx(0.9), pytest.approx(0.0))
    for bad in ([0.0], [1.5], [-0.1, 0.5], []):
        with pytest.raises(StreetlampError):
            F.check_fractions(bad)


def test_bootstrap_halves_are_bootstrap_ci() -> None:
    """resample_indices + percentile_interval give bootstrap_ci's interval exactly (one bootstrap)."""
    v = np.random.default_rng(5).normal(size=40)
    m, lo, hi, n = bootstrap_ci(v, n_boot=500, seed=7)
    assert (lo, hi) == percentile_interval(v[resample_indices(40, 500, 7)].mean(1))
    assert lo < m < hi and n == 40


def _planted():
    """Tiny GPT-2 with every head's W_O zeroed except L0.H1 and L1.H0, and both MLPs' outputs zeroed: only
    embed, L0.H1 and L1.H0 write, so the circuit is the edges among them and into the logits."""
    a, b = make("gpt2", seed=3)
    H, dh = a.n_heads, a.d_model // a.n_heads
    with torch.no_grad():
        for l, layer in enumerate(a.hf_model.transformer.h):
            live = {0: 1, 1: 0}[l]
            for h in range(H):
                if h != live:
                    layer.attn.c_proj.weight[h * dh : (h + 1) * dh] = 0
            layer.attn.c_proj.weight.mul_(20.0)  # the live heads matter: effects far above rounding
            layer.mlp.c_proj.weight.zero_()
            layer.mlp.c_proj.bias.zero_()
    g = b.graph
    alive = {"embed", "L0.H1", "L1.H0"}
    truth = torch.zeros(g.n_readers, g.n_writers, dtype=torch.bool)
    for r, w in zip(*g.edge_index()):
        rd = g.readers[r]
        owners = {g.writers[o] for o in rd.owners} | ({"logits"} if rd.input == "logits" else set())
        truth[r, w] = g.writers[w] in alive and bool(owners & (alive | {"logits"}))
    # every pair's corruption keeps the last token, and the last layer's queries and the logits are read at
    # the last position only: the embeddings' direct edges into them carry no difference
    for node, inp in (("L1.H0", "q"), ("logits", "logits")):
        r = [(x.node, x.input) for x in g.readers].index((node, inp))
        truth[r, 0] = False
    return a, b, truth


def test_planted_circuit_is_recovered_by_every_method() -> None:
    a, b, truth = _planted()
    pairs = encode_pairs(a, PAIRS3)
    k = int(truth.sum())
    ex = S.exact(b, pairs)
    assert ex.mean[truth].abs().min() > 1e-6 and torch.nan_to_num(ex.mean[~truth]).abs().max() <= F64_TOL
    for sc in (S.eap(b, pairs), S.eap_ig(b, pairs, steps=3), S.eap_ig(b, pairs, steps=2, mode="activations"), ex):
        found = F.circuit(b.graph, sc.mean, k)
        assert F.precision_recall(found, truth) == (1.0, 1.0), sc.method
    # the planted circuit is the whole model: faithfulness 1 (m(∅) far from m(M))
    mv = F.circuit_metrics(b, pairs, [b.graph.valid(), torch.zeros_like(truth), truth])
    assert abs(mv[0].mean() - mv[1].mean()) > 1e-2
    assert F.faithfulness(mv[2], mv[1], mv[0]) == pytest.approx(1.0, abs=1e-9)
    # resampling the prompts never changes it: inclusion frequency 1 on the planted edges, 0 elsewhere
    freq = F.inclusion_frequency(b.graph, ex, k, n_boot=20)
    assert bool((freq[truth] == 1).all()) and bool((freq[~truth] == 0).all())


def test_per_position_scores_sum_to_the_summed_ones() -> None:
    a, b = make("gpt2")
    pairs = encode_pairs(a, PAIRS)
    e, p = S.eap(b, pairs), S.eap(b, pairs, per_position=True)
    v = b.graph.valid()
    assert p.per_prompt.shape[1] == pairs.clean.input_ids.shape[1]
    torch.testing.assert_close(p.per_prompt.sum(1)[:, v], e.per_prompt[:, v], rtol=0, atol=F64_TOL)
    torch.testing.assert_close(p.mean[v], e.mean[v], rtol=0, atol=F64_TOL)
