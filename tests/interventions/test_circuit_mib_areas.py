"""MIB's areas, exactly (issue 37 item 1): the area function against a transcription of the arithmetic of
MIB's ``evaluate_area_under_curve`` (hannamw/MIB-circuit-track, ``MIB_circuit_track/evaluation.py``: a
loop of trapezoids on the raw fraction axis) on hand-made curves; the signed and |score| rankings of
MIB's ``apply_topn``; ``int(pct * n_edges)``; pruning against a transcription of MIB's ``Graph.prune``
fixed point; and a whole sweep on a tiny model whose CPR / CMD / random baseline are recomputed here from
its own circuits and forwards."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.interventions.circuits import faithfulness as F
from streetlamp.interventions.circuits import scores as S
from streetlamp.interventions.circuits.graph import Graph
from streetlamp.interventions.circuits.tasks import encode_pairs
from tests.conftest import F64_TOL
from tests.interventions.test_circuit_faithfulness import PAIRS3
from tests.interventions.test_circuit_scores import make

PCT = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1)  # evaluation.py's percentages, as written there


def mib_loop(percentages, faithfulnesses) -> tuple[float, float]:
    """The arithmetic of evaluate_area_under_curve (log_scale False), one trapezoid at a time."""
    area_under, area_from_1 = 0.0, 0.0
    for i in range(len(faithfulnesses) - 1):
        x1, x2 = percentages[i], percentages[i + 1]
        area_from_1 += (x2 - x1) * ((abs(1.0 - faithfulnesses[i]) + abs(1.0 - faithfulnesses[i + 1])) / 2)
        area_under += (x2 - x1) * ((faithfulnesses[i] + faithfulnesses[i + 1]) / 2)
    return area_under, area_from_1


CURVES = {
    "one everywhere": [1.0] * 10,
    "above one": [0.2, 0.6, 1.4, 1.9, 2.3, 2.1, 1.7, 1.3, 1.1, 1.0],
    "negative": [-0.5, -0.8, -0.3, 0.1, 0.4, 0.7, 0.9, 1.0, 1.0, 1.0],
    "zero then one": [0.0] * 9 + [1.0],
}


@pytest.mark.parametrize("name", list(CURVES))
def test_areas_are_mibs_arithmetic(name: str) -> None:
    f = CURVES[name]
    under, from1 = F.areas(np.array(PCT, float), np.array(f))
    want = mib_loop(PCT, f)
    # the same ten products summed in another order: a few ulps of the largest term (< 3)
    assert under == pytest.approx(want[0], abs=1e-14) and from1 == pytest.approx(want[1], abs=1e-14)
    if name == "one everywhere":  # the anchors: CPR 0.999 (the axis starts at 0.001), CMD 0
        assert under == pytest.approx(0.999, abs=1e-15) and from1 == 0.0
    # MIB's CPR is the signed curve's area_under, CMD the |score| curve's area_from_1; extra sizes are not used
    x = np.array(sorted(PCT + (0.3, 0.7)), float)
    fs = np.interp(x, PCT, f) + np.isin(x, (0.3, 0.7)) * 5.0  # the extra points would change any area
    fa = fs[::-1].copy()
    j = F.mib_subset(x)
    assert F.mib_areas(x, fs, fa) == (
        pytest.approx(mib_loop(PCT, list(fs[j]))[0], abs=1e-14),
        pytest.approx(mib_loop(PCT, list(fa[j]))[1], abs=1e-14),
    )


def test_the_old_width_normalised_area_is_gone() -> None:
    """Not the mean over the sweep's width: f = x over [0.1, 1] is 0.55 * 0.9 on MIB's raw axis."""
    x = np.array([0.1, 0.3, 0.5, 1.0])
    assert F.areas(x, x) == (pytest.approx(0.495, abs=1e-15), pytest.approx(0.405, abs=1e-15))
    assert F.areas(np.array([0.2]), np.array([0.7])) == (0.0, 0.0)  # MIB's loop adds nothing for one point


def test_check_areas() -> None:
    F.check_areas("mib", F.MIB_FRACTIONS)
    F.check_areas("mib", list(F.MIB_FRACTIONS) + [0.3])
    F.check_areas("sweep", [0.1, 0.5])
    with pytest.raises(StreetlampError, match=r"add 1\.0 to --sizes"):
        F.check_areas("mib", F.MIB_FRACTIONS[:-1])
    with pytest.raises(StreetlampError, match=r"lacks 0\.002,0\.5"):
        F.check_areas("mib", [x for x in F.MIB_FRACTIONS if x not in (0.002, 0.5)])
    with pytest.raises(StreetlampError, match="unknown areas"):
        F.check_areas("trapezoid", F.MIB_FRACTIONS)


def test_sizes_and_rankings_are_mibs() -> None:
    # int(pct * n), MIB's float arithmetic: 0.29 * 100 is 28.999999999999996
    assert F.n_at(0.29, 100) == 28 and F.n_at(0.001, 999) == 0 and F.n_at(1.0, 12345) == 12345
    g = Graph(2, 2, 2)
    r, w = g.edge_index()
    s = torch.full((g.n_readers, g.n_writers), float("nan"), dtype=torch.float64)
    vals = np.zeros(len(r))
    vals[:4] = [-3.0, 2.5, -1.0, 0.5]  # the rest 0
    s[r, w] = torch.tensor(vals)
    s[r[5], w[5]] = float("nan")  # a NaN score goes last in both rankings

    def chosen(m: torch.Tensor) -> set[int]:
        return {i for i in range(len(r)) if bool(m[r[i], w[i]])}

    assert chosen(F.top_k(g, s, 3)) == {0, 1, 2}  # |score|: 3, 2.5, 1
    assert chosen(F.top_k(g, s, 2, signed=True)) == {0, 2}  # m(edge ablated) - m(model): most negative first
    assert chosen(F.top_k(g, s, 3, signed=True)) == {0, 2, 4}  # then the zeros, in graph order, before 0.5
    assert 5 not in chosen(F.top_k(g, s, len(r) - 1, signed=True)) and 5 not in chosen(F.top_k(g, s, len(r) - 1))


def mib_prune(g: Graph, mask: np.ndarray) -> np.ndarray:
    """MIB's Graph.prune on this graph (no key/value groups: the graphs are the same): drop the nodes without
    an outgoing edge or an incoming one (the input always has one), then the edges whose source or reader's
    node is gone (the logits always stay), until nothing changes."""
    m = mask.copy()
    U = g.n_writers
    nodes = np.ones(U, bool)
    while True:
        out = m.any(0)
        inc = np.zeros(U, bool)
        for i, rd in enumerate(g.readers):
            if m[i].any():
                inc[list(rd.owners)] = True
        inc[0] = True
        new = out & inc
        same = bool((new == nodes).all())
        nodes = new
        reader_alive = np.array([rd.input == "logits" or bool(nodes[list(rd.owners)].any()) for rd in g.readers])
        m &= np.outer(reader_alive, nodes)
        if same:
            return m


def test_prune_is_mibs_fixed_point() -> None:
    g = Graph(3, 2, 2)
    valid = g.valid().numpy()
    rng = np.random.default_rng(0)
    for density in (0.02, 0.05, 0.1, 0.3):
        for _ in range(25):
            m = (rng.random(valid.shape) < density) & valid
            np.testing.assert_array_equal(F.prune(g, torch.from_numpy(m)).numpy(), mib_prune(g, m))


def test_mib_edge_count() -> None:
    assert F.mib_edge_count(Graph(2, 4, 4)) == Graph(2, 4, 4).n_edges
    g = Graph(2, 4, 2)  # each k and v edge into a group of 2 heads is 2 of MIB's edges
    want = Graph(2, 4, 4).n_edges  # MIB's graph ungroups the heads: the ungrouped graph's count
    assert F.mib_edge_count(g) == want and g.n_edges < want


@pytest.fixture(scope="module")
def tiny():
    a, b = make("gpt2")
    pairs = encode_pairs(a, PAIRS3)
    return a, b, pairs, S.eap(b, pairs)


def test_sweep_is_mibs_evaluation(tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, pairs, e = tiny
    g = b.graph
    real = F.circuit_metrics
    seen: list[int] = []

    def spy(blocks, p, masks, *args, **kw):
        seen.append(len(masks))
        return real(blocks, p, masks, *args, **kw)

    monkeypatch.setattr(F, "circuit_metrics", spy)
    sw = F.sweep(b, pairs, e, F.MIB_FRACTIONS, n_random=2, n_boot=30, seed=4)
    t = sw.table
    E = g.n_edges
    assert list(t["n_edges_requested"]) == [int(p * E) for p in PCT]
    full, empty = g.valid(), torch.zeros_like(g.valid())
    # the circuits: top int(pct*E) by |score| and by signed score, pruned, and random ones from the same rng
    masks = [F.prune(g, F.top_k(g, e.mean, int(p * E))) for p in PCT]
    signed = [F.prune(g, F.top_k(g, e.mean, int(p * E), signed=True)) for p in PCT]
    rng = np.random.default_rng(4)
    rand = [[F.random_circuit(g, int(p * E), rng) for _ in range(2)] for p in PCT]
    assert all(torch.equal(x, y) for x, y in zip(masks + signed, sw.masks + sw.signed_masks))
    assert torch.equal(masks[-1], full) and torch.equal(signed[-1], full)  # 100%: the model, nothing pruned
    assert any(not torch.equal(x, y) for x, y in zip(masks, signed))  # the two rankings differ here
    # one masked forward per distinct edge set: 100% is the full run, int(0.001 E) = 0 the empty one
    distinct = {np.packbits(m.numpy()).tobytes() for m in [full, empty] + masks + signed + sum(rand, [])}
    assert seen == [len(distinct)]
    mv = real(b, pairs, [full, empty] + masks + signed + sum(rand, []))
    m_full, m_empty = mv[0].mean(), mv[1].mean()
    f = (mv[2:12].mean(1) - m_empty) / (m_full - m_empty)
    fs = (mv[12:22].mean(1) - m_empty) / (m_full - m_empty)
    fr = ((mv[22:].mean(1) - m_empty) / (m_full - m_empty)).reshape(10, 2)
    gap = abs(m_full - m_empty)
    assert gap > 1e-3
    tol = 10 * F64_TOL / gap
    np.testing.assert_allclose(t["faithfulness"], f, atol=tol, rtol=0)
    np.testing.assert_allclose(t["faithfulness_signed"], fs, atol=tol, rtol=0)
    assert t["faithfulness"].iloc[-1] == 1.0 and t["faithfulness_signed"].iloc[-1] == 1.0  # exactly: same run
    sm = sw.summary
    assert sm["areas"] == "mib" and sm["n_edges_graph"] == E
    assert sm["cpr"] == pytest.approx(mib_loop(PCT, list(fs))[0], abs=tol)
    assert sm["cmd"] == pytest.approx(mib_loop(PCT, list(f))[1], abs=tol)
    assert sm["random_cpr"] == pytest.approx(np.mean([mib_loop(PCT, list(fr[:, d]))[0] for d in range(2)]), abs=tol)
    assert sm["random_cmd"] == pytest.approx(np.mean([mib_loop(PCT, list(fr[:, d]))[1] for d in range(2)]), abs=tol)
    for k in ("cpr", "cmd", "random_cpr", "random_cmd"):
        lo, hi = sm[f"{k}_ci"]
        assert lo - tol <= sm[k] <= hi + tol, k
    assert sm["cpr"] != pytest.approx(mib_loop(PCT, list(f))[0], abs=1e-6)  # ranked by sign, not by |score|


def test_sweep_areas_elsewhere_have_other_names(tiny) -> None:
    a, b, pairs, e = tiny
    with pytest.raises(StreetlampError, match=r"add 1\.0"):
        F.sweep(b, pairs, e, [0.1, 0.5], n_random=0, n_boot=5, areas_mode="mib")
    sw = F.sweep(b, pairs, e, [0.1, 0.5], n_random=0, n_boot=5)  # by default: not MIB's ten sizes, so "sweep"
    assert sw.summary["areas"] == "sweep"
    assert "cpr" not in sw.summary and "cmd" not in sw.summary
    t = sw.table
    x = t["size_fraction"].to_numpy()
    assert sw.summary["area_under"] == pytest.approx(mib_loop(x, list(t["faithfulness_signed"]))[0], abs=1e-14)
    assert sw.summary["area_from_1"] == pytest.approx(mib_loop(x, list(t["faithfulness"]))[1], abs=1e-14)


def test_bootstrapped_selection_is_inclusion_over_resamples() -> None:
    """Against a direct recomputation: each resample's mean scores, its unpruned top k by the same ranking
    (F.top_k), the share of resamples holding each edge; the circuit = the k edges of highest inclusion
    (ties by the all-data ranking), pruned. Scores equal on every prompt: the plain circuit exactly."""
    from streetlamp.stats import resample_indices

    g = Graph(2, 2, 2)
    r, w = g.edge_index()
    rng = np.random.default_rng(4)
    per = torch.full((6, g.n_readers, g.n_writers), float("nan"), dtype=torch.float64)
    per[:, r, w] = torch.from_numpy(rng.normal(size=(6, len(r))) * 2 + rng.normal(size=len(r)) * 0.5)
    sc = S.EdgeScores("eap", per, "patch", "logit_diff")
    sel = F.BootstrapSelection(g, sc, n_boot=25, seed=2)
    idx = resample_indices(6, 25, 2)
    for k in (3, 10, 25):
        for signed in (False, True):
            inc = np.mean([F.top_k(g, per[torch.as_tensor(i)].mean(0), k, signed).numpy()[r, w] for i in idx], 0)
            np.testing.assert_allclose(sel.inclusion(k, signed), inc, rtol=0, atol=1e-12)
            tie = sc.mean.numpy()[r, w]
            tie = -tie if signed else np.abs(tie)
            best = sorted(range(len(r)), key=lambda e: (-inc[e], -tie[e], e))[:k]
            m = torch.zeros(g.n_readers, g.n_writers, dtype=torch.bool)
            m[r[best], w[best]] = True
            assert torch.equal(sel(k, signed), F.prune(g, m))
    inc10 = sel.inclusion(10)
    assert ((inc10 > 0) & (inc10 < 1)).any()  # resamples disagree: not a test of constants
    assert not torch.equal(sel(10), F.circuit(g, sc.mean, 10))  # nor of the plain top k
    same = S.EdgeScores("eap", per[:1].expand(6, -1, -1).clone(), "patch", "logit_diff")
    one = F.BootstrapSelection(g, same, n_boot=10, seed=0)
    for k in (3, 10):
        assert torch.equal(one(k), F.circuit(g, same.mean, k)) and torch.equal(
            one(k, True), F.circuit(g, same.mean, k, True)
        )
