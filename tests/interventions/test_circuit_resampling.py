"""Error bars along three resampling axes (prompts, templates, corrupted inputs), checked against a hand
recomputation of every resample: its prompts drawn with stats.resample_indices by hand (a cluster bootstrap
over templates written out), its scores averaged with numpy, its top-k circuit ranked by a numpy argsort
and pruned, its metrics from circuit_metrics on the duplicated prompt list (no de-duplication), f, CPR,
CMD, the Jaccard index (with the all-data circuit, and the mean over every pair of resampled circuits)
from Python sets and the inclusion frequency from a count; a planted circuit is stable on every axis (f
exactly 1, Jaccard 1, inclusion 1), noise scores are not; a resample measuring no faithfulness runs no
forward."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.interventions.circuits import faithfulness as F
from streetlamp.interventions.circuits import resampling as RS
from streetlamp.interventions.circuits import scores as S
from streetlamp.interventions.circuits import tasks as T
from streetlamp.interventions.circuits.tasks import TaskPair, encode_pairs
from streetlamp.stats import resample_indices
from tests.conftest import F64_TOL, assert_same_route
from tests.interventions.test_circuit_faithfulness import _planted
from tests.interventions.test_circuit_scores import f64_llama, make  # noqa: F401

# three templates; within each the prompts have one token length and end on the same word (so a corrupted
# prompt moved to another pair of its template is a valid corruption of it)
RAW = [
    TaskPair("the movie was good and the plot", "the movie was bad and the plot", " good", " bad", 0),
    TaskPair("the film was great and the plot", "the film was terrible and the plot", " great", " terrible", 0),
    TaskPair("i loved the story and the film", "i hated the story and the film", " loved", " hated", 1),
    TaskPair("i loved it and the story film", "i hated it and the story film", " fun", " boring", 1),
    TaskPair(
        "when mary and john went to the store , john gave a drink to",
        "when mary and john went to the store , mary gave a drink to",
        " mary",
        " john",
        2,
    ),
    TaskPair(
        "when john and mary went to the store , mary gave a drink to",
        "when john and mary went to the store , john gave a drink to",
        " john",
        " mary",
        2,
    ),
]
SIZES = [0.05, 0.2, 0.6]


def _hand_circuit(g, mean: np.ndarray, k: int) -> torch.Tensor:
    r, w = g.edge_index()
    order = np.argsort(-np.abs(mean[r, w]), kind="stable")[:k]
    m = torch.zeros(g.n_readers, g.n_writers, dtype=torch.bool)
    m[r[order], w[order]] = True
    return F.prune(g, m)


def _edge_set(m: torch.Tensor) -> set[tuple[int, int]]:
    return {(int(i), int(j)) for i, j in zip(*np.nonzero(m.numpy()))}


def _hand_pairwise(sets: list[set]) -> float:
    """Mean Jaccard over every unordered pair of Python edge sets (two empty sets: 1)."""
    js = [len(a & b) / len(a | b) if a | b else 1.0 for i, a in enumerate(sets) for b in sets[i + 1 :]]
    return sum(js) / len(js)


def _hand_axis(b, pairs_of, per_of, m_full_of, ks, n, every=None):
    """f [n, sizes], Jaccard [n, sizes], circuits at the last size, for resample r's pairs / per-prompt scores
    (``every``, a list: each resample's circuits at every size appended)."""
    g = b.graph
    f, jac, last = np.zeros((n, len(ks))), np.zeros((n, len(ks))), []
    for r in range(n):
        p, per, m_full = pairs_of(r), per_of(r), m_full_of(r)
        masks = [_hand_circuit(g, np.nan_to_num(per.mean(0), nan=0.0), k) for k in ks]
        mv = F.circuit_metrics(b, p, [torch.zeros_like(g.valid())] + masks)
        lo = mv[0].mean()
        f[r] = [(mv[1 + j].mean() - lo) / (m_full - lo) for j in range(len(ks))]
        jac[r] = [len(_edge_set(m) & A) / len(_edge_set(m) | A) for m, A in zip(masks, BASE)]
        last.append(masks[-1])
        if every is not None:
            every.append(masks)
    return f, jac, last


BASE: list[set] = []


def _same_scores(got: np.ndarray, want: np.ndarray) -> None:
    """Two routes to the same scores: NaN (no edge) at the same places, the rest to float64 rounding."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert_same_route(np.nan_to_num(got), np.nan_to_num(want))


@pytest.mark.parametrize("axis", ["prompts", "templates"])
def test_prompt_and_template_axes_match_a_hand_recomputation(axis: str) -> None:
    a, b = make("gpt2")
    pairs = encode_pairs(a, RAW)
    g = b.graph
    e = S.eap(b, pairs)
    n = 6
    res = RS.resample(b, pairs, e, SIZES, axis, n=n, seed=3)
    ks = [int(fr * g.n_edges) for fr in SIZES]
    per = e.per_prompt.double().numpy()
    if axis == "prompts":
        draws = list(resample_indices(len(pairs), n, 3))
    else:  # templates 0, 1, 2 drawn with replacement; each brings its two prompts, in order
        groups = {0: [0, 1], 1: [2, 3], 2: [4, 5]}
        draws = [np.array(sum((groups[t] for t in d), [])) for d in resample_indices(3, n, 3)]
        assert all(len(d) == 6 for d in draws) and any(len(set(d)) < 6 for d in draws)
    BASE[:] = [_edge_set(_hand_circuit(g, np.nan_to_num(per.mean(0)), k)) for k in ks]
    full = F.circuit_metrics(b, pairs, [g.valid()])[0]
    every: list[list[torch.Tensor]] = []
    f, jac, last = _hand_axis(
        b, lambda r: pairs.select(draws[r].tolist()), lambda r: per[draws[r]], lambda r: full[draws[r]].mean(), ks, n,
        every,
    )  # fmt: skip
    np.testing.assert_allclose(res.f, f, rtol=0, atol=F64_TOL)
    np.testing.assert_allclose(res.jaccard, jac, rtol=0, atol=0)
    pw = [_hand_pairwise([_edge_set(c[j]) for c in every]) for j in range(len(ks))]
    np.testing.assert_allclose(res.pairwise, pw, rtol=0, atol=1e-15)
    assert res.table["jaccard_pairwise"].tolist() == res.pairwise.tolist()
    assert res.summary["jaccard_pairwise"] == res.pairwise[-1] and 0 < min(pw) < 1  # not all equal, not disjoint
    assert np.ptp(f[:, 0]) > 1e-3  # the resamples differ: the comparison is not of constants
    inc = sum(m.double() for m in last) / n
    torch.testing.assert_close(res.inclusion, inc, rtol=0, atol=0)
    x = np.array(SIZES)
    under = [np.trapezoid(fr, x) for fr in f]  # MIB's raw fraction axis: no division by the sweep's width
    from1 = [np.trapezoid(np.abs(1 - fr), x) for fr in f]
    np.testing.assert_allclose(res.area_under, under, atol=1e-12)
    np.testing.assert_allclose(res.area_from_1, from1, atol=1e-12)
    lo, hi = np.quantile(f[:, 1], [0.025, 0.975])
    t = res.table
    assert t["ci_low"].iloc[1] == pytest.approx(lo, abs=1e-12) and t["ci_high"].iloc[1] == pytest.approx(hi, abs=1e-12)
    assert res.summary["area_under_ci"] == pytest.approx(tuple(np.quantile(under, [0.025, 0.975])), abs=1e-12)
    assert res.summary["jaccard_mean"] == pytest.approx(jac[:, -1].mean(), abs=1e-12)


def test_pairwise_jaccard_is_the_mean_over_every_pair_of_python_sets() -> None:
    rng = np.random.default_rng(0)
    masks = [torch.from_numpy(rng.random((5, 7)) < p) for p in (0.1, 0.3, 0.5, 0.5, 0.9)]
    masks += [torch.zeros(5, 7, dtype=torch.bool), torch.zeros(5, 7, dtype=torch.bool)]  # two empty sets: 1
    want = _hand_pairwise([_edge_set(m) for m in masks])
    assert RS.pairwise_jaccard(masks) == pytest.approx(want, abs=1e-15)
    assert RS.pairwise_jaccard(masks[:2]) == pytest.approx(RS.jaccard(masks[0], masks[1]), abs=1e-15)
    assert RS.pairwise_jaccard([masks[2]] * 3) == 1.0
    with pytest.raises(StreetlampError, match="at least 2"):
        RS.pairwise_jaccard(masks[:1])


@pytest.mark.parametrize("axis", ["prompts", "corrupt"])
def test_resamples_without_faithfulness_run_no_forward(monkeypatch: pytest.MonkeyPatch, axis: str) -> None:
    """measure='none': the circuits, Jaccard, pairwise Jaccard and inclusion of measure='all', and not one
    prompt through the model (an embedding hook counts them) outside the corrupt axis's re-scoring;
    'chosen': f at the chosen size only, equal to 'all''s, its forward count the (circuit, prompt) pairs
    handed to circuit_metrics."""
    a, b = make("gpt2")
    pairs = encode_pairs(a, RAW)
    e = S.eap(b, pairs)
    sets = RS.corrupt_resamples(a, "pairs.csv", RAW, 4, seed=0) if axis == "corrupt" else None
    kw = dict(n=4, seed=1, at=0.2, corrupt_sets=sets, score_fn=lambda p: S.eap(b, p))
    full = RS.resample(b, pairs, e, SIZES, axis, **kw)  # type: ignore[arg-type]
    rows = [0]
    hook = a.embed_module.register_forward_hook(lambda m, i, o: rows.__setitem__(0, rows[0] + o.shape[0]))
    scored = [0]
    real_metrics, real_score = RS.circuit_metrics, kw["score_fn"]
    handed = [0]

    def counting(blocks, p, masks, *args, **kwargs):
        handed[0] += len(masks) * len(p)
        return real_metrics(blocks, p, masks, *args, **kwargs)

    def rescore(p):
        before = rows[0]
        out = real_score(p)  # type: ignore[operator]
        scored[0] += rows[0] - before
        return out

    monkeypatch.setattr(RS, "circuit_metrics", counting)
    try:
        none = RS.resample(b, pairs, e, SIZES, axis, **{**kw, "score_fn": rescore}, measure="none")  # type: ignore[arg-type]
        assert rows[0] == scored[0] and handed[0] == 0 and none.summary["forwards"] == 0
        if axis == "prompts":
            assert rows[0] == 0
        chosen = RS.resample(b, pairs, e, SIZES, axis, **{**kw, "score_fn": rescore}, measure="chosen")  # type: ignore[arg-type]
    finally:
        hook.remove()
    assert chosen.summary["forwards"] == handed[0] > 0
    for r in (none, chosen):
        np.testing.assert_array_equal(r.jaccard, full.jaccard)
        np.testing.assert_array_equal(r.pairwise, full.pairwise)
        torch.testing.assert_close(r.inclusion, full.inclusion, rtol=0, atol=0)
    assert np.isnan(none.f).all() and none.summary["stable"] is None and "no verdict" in none.summary["verdict"]
    np.testing.assert_allclose(chosen.f[:, 1], full.f[:, 1], rtol=0, atol=F64_TOL)
    assert np.isnan(chosen.f[:, [0, 2]]).all() and chosen.summary["stable"] == full.summary["stable"]
    assert np.isnan(chosen.area_under).all() and full.summary["forwards"] > chosen.summary["forwards"]
    with pytest.raises(StreetlampError, match="unknown resample measure"):
        RS.resample(b, pairs, e, SIZES, "prompts", n=2, measure="some")


def test_corrupt_axis_rescores_each_draw_and_keeps_the_clean_run() -> None:
    a, b = make("gpt2")
    pairs = encode_pairs(a, RAW)
    g = b.graph
    n = 4
    sets = RS.corrupt_resamples(a, "pairs.csv", RAW, n, seed=0)
    for p in sets:  # the clean prompts and answers are the same; the corrupted ones were moved within templates
        assert torch.equal(p.clean.input_ids, pairs.clean.input_ids) and torch.equal(p.answer, pairs.answer)
    assert any(not torch.equal(p.corrupt.input_ids, pairs.corrupt.input_ids) for p in sets)
    e = S.eap(b, pairs)
    res = RS.resample(b, pairs, e, SIZES, "corrupt", n=n, corrupt_sets=sets, score_fn=lambda p: S.eap(b, p))
    ks = [int(fr * g.n_edges) for fr in SIZES]
    BASE[:] = [_edge_set(_hand_circuit(g, np.nan_to_num(e.mean.double().numpy()), k)) for k in ks]
    full = F.circuit_metrics(b, pairs, [g.valid()])[0].mean()
    f, jac, last = _hand_axis(
        b, lambda r: sets[r], lambda r: S.eap(b, sets[r]).per_prompt.double().numpy(), lambda r: full, ks, n
    )
    np.testing.assert_allclose(res.f, f, rtol=0, atol=F64_TOL)
    np.testing.assert_allclose(res.jaccard, jac, rtol=0, atol=0)
    torch.testing.assert_close(res.inclusion, sum(m.double() for m in last) / n, rtol=0, atol=0)
    with pytest.raises(StreetlampError, match="patch ablation"):
        RS.resample(b, pairs, S.eap(b, pairs, ablation="zero"), SIZES, "corrupt", n=2, corrupt_sets=sets)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_reused_clean_gradients_give_a_full_eap_pass_scores(family: str, f64_llama) -> None:  # noqa: F811
    """The corrupt axis's EAP with the clean forward and backward run once (scores.EapCleanReuse) equals a
    whole EAP pass (S.eap: its own clean forward, backward and corrupted forward) on each resample, prompt
    by prompt and edge by edge, to float64 rounding (two chunkings: 4 rows here, 16 there). The resamples'
    scores differ from the original corruption's by far more, so a reuse that kept the corrupted run (or
    took its gradients anywhere but the clean run) would fail; a set whose clean side differs is refused."""
    a, b = make(family)
    pairs = encode_pairs(a, RAW)
    sets = RS.corrupt_resamples(a, "pairs.csv", RAW, 4, seed=0)
    reuse = S.EapCleanReuse(b, pairs, batch_size=4)
    orig = S.eap(b, pairs).per_prompt.numpy()
    moved = 0.0
    for q in [pairs, *sets]:
        got, want = reuse(q).per_prompt.numpy(), S.eap(b, q).per_prompt.numpy()
        assert got.dtype == want.dtype == np.float64
        _same_scores(got, want)
        moved = max(moved, float(np.nanmax(np.abs(want - orig))))
    assert moved > 1e-3 * float(np.nanmax(np.abs(orig))) and moved > 1e-3  # the corruption matters
    other = encode_pairs(a, RAW[1:] + RAW[:1])
    with pytest.raises(StreetlampError, match="clean prompts or answers differ"):
        reuse(other)


def test_corrupt_axis_scores_each_resample_once() -> None:
    """One score pass per corrupt resample, whatever the number of sizes (each size's circuit is cut from the
    same scores)."""
    a, b = make("gpt2")
    pairs = encode_pairs(a, RAW)
    sets = RS.corrupt_resamples(a, "pairs.csv", RAW, 3, seed=0)
    calls: list[int] = []

    def count(p):
        calls.append(1)
        return S.eap(b, p)

    RS.resample(b, pairs, S.eap(b, pairs), SIZES, "corrupt", n=3, corrupt_sets=sets, score_fn=count, measure="none")
    assert len(calls) == 3 and len(SIZES) > 1


def test_resample_rescorer_reuses_the_clean_run_for_eap_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's score function of --resample: EAP under patching on sets with the clean side of the pairs
    builds one EapCleanReuse (at the first call) and serves every corrupt resample from it; the scores are
    edge_scores' own. A set with other clean prompts (a prompt resample) and other methods are scored afresh."""
    from streetlamp.commands.circuit import methods as M

    a, b = make("gpt2")
    pairs = encode_pairs(a, RAW)
    sets = RS.corrupt_resamples(a, "pairs.csv", RAW, 3, seed=0)
    built: list[int] = []
    real = S.EapCleanReuse

    class Counting(real):  # type: ignore[misc,valid-type]
        def __init__(self, *args, **kw):
            built.append(1)
            super().__init__(*args, **kw)

    monkeypatch.setattr(S, "EapCleanReuse", Counting)
    for method in ("eap", "eap-ig-inputs"):
        fn = M.rescorer(b, pairs, method, "patch", "logit_diff", 2, None)
        for q in [*sets, pairs.select([1, 0, 2, 3, 4, 5])]:
            want = M.edge_scores(b, q, method, "patch", "logit_diff", 2, 16).per_prompt.numpy()
            _same_scores(fn(q).per_prompt.numpy(), want)
        assert len(built) == 1, method  # eap built one; eap-ig-inputs none
    fn = M.rescorer(b, pairs, "eap", "mean", "logit_diff", 2, None)
    fn(sets[0])
    assert len(built) == 1


def test_planted_circuit_is_stable_on_every_axis() -> None:
    a, b, truth = _planted()
    raw = [dataclasses.replace(p, template=i // 2) for i, p in enumerate(RAW)]
    pairs = encode_pairs(a, raw)
    g = b.graph
    size = int(truth.sum()) / g.n_edges
    ex = S.exact(b, pairs)
    sets = RS.corrupt_resamples(a, "pairs.csv", raw, 3, seed=0)
    for axis in RS.AXES:
        res = RS.resample(b, pairs, ex, [size], axis, n=3, corrupt_sets=sets, score_fn=lambda p: S.exact(b, p), at=size)
        # the planted circuit is the model: every resample finds it and it is faithful exactly
        assert np.abs(res.f - 1).max() <= F64_TOL and (res.jaccard == 1).all(), axis
        assert bool((res.inclusion[truth] == 1).all()) and bool((res.inclusion[~truth] == 0).all())
        assert res.summary["stable"] and res.summary["verdict"].startswith("stable")


def test_noise_scores_are_not_stable() -> None:
    a, b = make("gpt2")
    pairs = encode_pairs(a, RAW)
    e = S.eap(b, pairs)
    noise = torch.randn(e.per_prompt.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    fake = S.EdgeScores("noise", noise.masked_fill(~b.graph.valid(), float("nan")), "patch", "logit_diff")
    res = RS.resample(b, pairs, fake, [0.2, 0.3], "prompts", n=8, at=0.3)
    assert res.summary["jaccard_mean"] < RS.STABLE_JACCARD
    assert not res.summary["stable"] and "NOT stable" in res.summary["verdict"] and "Jaccard" in res.summary["verdict"]


def test_verdict_rule_and_bad_input() -> None:
    assert RS.verdict(0.6, 0.1)[0] and RS.verdict(0.5, 0.25)[0]
    ok, why = RS.verdict(0.4, 0.1)
    assert not ok and "0.40" in why and "interval" not in why
    ok, why = RS.verdict(0.9, 0.3)
    assert not ok and "0.30 wide" in why and "Jaccard" not in why
    assert RS.jaccard(torch.tensor([True, True, False]), torch.tensor([True, False, True])) == pytest.approx(1 / 3)
    a, b = make("gpt2")
    pairs = encode_pairs(a, RAW)
    e = S.eap(b, pairs)
    for kw, msg in (
        (dict(axis="bootstrap"), "unknown resampling axis"),
        (dict(axis="prompts", n=1), "at least 2"),
        (dict(axis="prompts", at=0.3), "not one of the swept"),
        (dict(axis="corrupt"), "resampled pair sets"),
    ):
        with pytest.raises(StreetlampError, match=msg):
            RS.resample(b, pairs, e, SIZES, **kw)  # type: ignore[arg-type]


def test_resampled_corruptions_keep_the_task_structure() -> None:
    ioi = T.ioi(20, seed=0)
    new = T.resample_corrupt("ioi", ioi, seed=5)
    assert sum(p.corrupt != q.corrupt for p, q in zip(ioi, new)) >= 10
    for p, q in zip(ioi, new):
        assert (q.clean, q.answer, q.wrong, q.template) == (p.clean, p.answer, p.wrong, p.template)
        wc, wk = p.clean.split(), q.corrupt.split()
        (i,) = [j for j, (x, y) in enumerate(zip(wc, wk)) if x != y]
        assert wc[i].rstrip(",.") == p.wrong.strip() and wk[i].rstrip(",.") not in wc and wk[i].rstrip(",.") in T.NAMES
    ind = T.induction(12, seed=1, length=4)
    for p, q in zip(ind, T.resample_corrupt("induction", ind, seed=2)):
        assert (q.clean, q.answer, q.wrong) == (p.clean, p.answer, p.wrong)
        seq = p.clean.split()[-3:] + [p.answer.strip()]
        changed = [y for x, y in zip(p.clean.split(), q.corrupt.split()) if x != y]
        assert len(changed) == 4 and not set(changed) & set(seq)
        assert q.corrupt.split()[-3:] == seq[:-1] and len(q.corrupt.split()) == len(p.clean.split())
    gt = T.greater_than(30, seed=0)
    for p, q in zip(gt, T.resample_corrupt("greater-than", gt, seed=0)):
        ((_, new_y),) = [(x, y) for x, y in zip(p.clean.split(), q.corrupt.split()) if x != y]
        assert new_y.startswith("170") and int(new_y[2:]) < int(p.wrong) < int(p.answer)
    # any other task: the corrupted prompts are permuted within each template
    perm = T.resample_corrupt("pairs.csv", RAW, seed=1)
    for t in (0, 1, 2):
        assert sorted(p.corrupt for p in perm if p.template == t) == sorted(p.corrupt for p in RAW if p.template == t)
    assert [p.clean for p in perm] == [p.clean for p in RAW]


def test_circuit_command_writes_stability_that_matches_the_engine(tmp_path) -> None:
    import contextlib
    import csv
    import io

    import pandas as pd

    from streetlamp.cli import main
    from streetlamp.models.loading import load
    from streetlamp.models.tiny import save_tiny

    model = save_tiny("gpt2", tmp_path / "gpt2", seed=1)
    with (tmp_path / "pairs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["clean", "corrupt", "answer", "wrong", "template"])
        w.writerows([[p.clean, p.corrupt, p.answer, p.wrong, p.template] for p in RAW])
    out = tmp_path / "run"
    args = ["circuit", "--model", str(model), "--task", str(tmp_path / "pairs.csv"), "--out", str(out), "--limit", "6"]
    args += ["--methods", "eap,flow-routes,eap-qk", "--sizes", "0.2,0.6", "--size", "0.6", "--bootstrap", "10"]
    args += ["--resample", "prompts,templates,corrupt", "--resamples", "3", "--seed", "2"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(args) == 0
    st = pd.read_csv(out / "stability.csv")
    assert len(st) == 3 * 3 * 2 and set(st["axis"]) == set(RS.AXES)
    assert {"faithfulness_mean", "ci_low", "ci_high", "jaccard_mean", "area_under_ci_low", "stable"} <= set(st.columns)
    printed = buf.getvalue()
    assert printed.count("resampled prompts") == 3 and "stable" in printed
    # the run's prompt-axis numbers are the engine's on the same model and pairs
    a = load(model)
    b = RS.Blocks(a)
    pairs = encode_pairs(a, RAW)
    direct = RS.resample(b, pairs, S.eap(b, pairs), [0.2, 0.6], "prompts", n=3, seed=2, at=0.6)
    got = st[(st["axis"] == "prompts") & (st["method"] == "eap")]
    np.testing.assert_allclose(got["faithfulness_mean"], direct.f.mean(0), rtol=1e-5, atol=1e-6)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        bad = [x.replace("prompts,templates,corrupt", "bootstrap") for x in args]
        assert main([x if x != str(out) else str(tmp_path / "bad") for x in bad]) == 2
    assert not (tmp_path / "bad").exists()


def test_measured_runs_each_circuit_and_prompt_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache of m(C) per prompt: every (circuit, prompt) asked for is run once, a repeated circuit (an
    equal mask, not the same object) is served from the cache, and the values are circuit_metrics' own."""
    a, b = make("gpt2")
    pairs = encode_pairs(a, RAW)
    g = b.graph
    rng = np.random.default_rng(0)
    A, B, C = (F.random_circuit(g, max(2, g.n_edges // 4), rng) for _ in range(3))
    assert not torch.equal(A, B) and not torch.equal(A, C) and not torch.equal(B, C)
    ran: list[tuple[bytes, str]] = []
    real = RS.circuit_metrics

    def counting(blocks, p, masks, *args, **kw):
        ran.extend((m.numpy().tobytes(), t) for m in masks for t in p.clean.texts)
        return real(blocks, p, masks, *args, **kw)

    monkeypatch.setattr(RS, "circuit_metrics", counting)
    measured = RS.Measured(b, pairs, "patch", "logit_diff", 5)
    v1 = measured([A, B], [0, 1, 2])
    v2 = measured([A.clone(), C, B], [4, 1, 2, 3])
    calls = (([A, B], [0, 1, 2]), ([A, C, B], [4, 1, 2, 3]))
    asked = {(m.numpy().tobytes(), pairs.clean.texts[i]) for ms, rows in calls for m in ms for i in rows}
    assert len(ran) == len(set(ran)) == len(asked) and set(ran) == asked
    assert measured.reused == 2 + 2  # A and B on prompts 1 and 2
    want = F.circuit_metrics(b, pairs, [A, B, C])
    np.testing.assert_allclose(v1, want[:2, [0, 1, 2]], rtol=0, atol=F64_TOL)
    np.testing.assert_allclose(v2, want[[0, 2, 1]][:, [4, 1, 2, 3]], rtol=0, atol=F64_TOL)
    assert np.abs(want[:, :5] - want[:, :5].mean()).max() > 1e-3  # the values differ: not a comparison of constants


def test_circuit_command_resamples_without_faithfulness(tmp_path) -> None:
    """--resample-faithfulness none: stability.csv holds the pairwise Jaccard of the engine's resamples, f
    NaN, no verdict; the printed line names the statistic and 0 forwards."""
    import contextlib
    import csv
    import io
    import json

    import pandas as pd

    from streetlamp.cli import main
    from streetlamp.models.loading import load
    from streetlamp.models.tiny import save_tiny

    model = save_tiny("gpt2", tmp_path / "gpt2", seed=1)
    with (tmp_path / "pairs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["clean", "corrupt", "answer", "wrong", "template"])
        w.writerows([[p.clean, p.corrupt, p.answer, p.wrong, p.template] for p in RAW])
    out = tmp_path / "run"
    args = ["circuit", "--model", str(model), "--task", str(tmp_path / "pairs.csv"), "--out", str(out), "--limit", "6"]
    args += ["--methods", "eap", "--sizes", "0.2,0.6", "--size", "0.6", "--bootstrap", "10", "--paths", "0"]
    args += ["--resample", "prompts,templates", "--resamples", "4", "--seed", "2", "--resample-faithfulness", "none"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(args) == 0
    st = pd.read_csv(out / "stability.csv")
    assert len(st) == 2 * 2 and st["faithfulness_mean"].isna().all() and st["stable"].isna().all()
    a = load(model)
    b = RS.Blocks(a)
    pairs = encode_pairs(a, RAW)
    direct = RS.resample(b, pairs, S.eap(b, pairs), [0.2, 0.6], "prompts", n=4, seed=2, at=0.6, measure="none")
    got = st[st["axis"] == "prompts"]
    np.testing.assert_allclose(got["jaccard_pairwise"], direct.pairwise, rtol=0, atol=1e-12)
    printed = buf.getvalue()
    assert printed.count("mean pairwise Jaccard at 0.6") == 2 and "0 masked prompt forwards" in printed
    man = json.loads((out / "manifest.json").read_text())
    assert man["parameters"]["resample_faithfulness"] == "none"
    assert man["stability"]["eap"]["prompts"]["jaccard_pairwise"] == pytest.approx(direct.pairwise[-1], abs=1e-12)
