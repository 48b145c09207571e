"""Soft erasure (evaluation/soft.py) against the exact expectation over every mask of a short input."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from streetlamp.cli import main
from streetlamp.evaluation.soft import (
    VARIANTS,
    SoftPlan,
    keep_probabilities,
    masked_prob_of,
    normalised_importance,
    soft_erasure,
    soft_from_terms,
    water_fill,
)
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.tiny import save_tiny, tiny_model

TEXT = "the plot was boring and bad"


@pytest.fixture(scope="module")
def sharp() -> ModelAdapter:
    """A tiny float64 BERT whose head is scaled and centred on the empty input (all word embeddings
    zeroed), so that dropping embeddings moves the output by tenths, not by 1e-4."""
    m, t = tiny_model("bert", seed=1)
    m = m.double()
    ids = torch.tensor([t(TEXT)["input_ids"]])
    with torch.no_grad():
        m.classifier.weight.mul_(8000)
        special = torch.tensor([[1.0] + [0.0] * (ids.shape[1] - 2) + [1.0]], dtype=torch.float64)
        lg = m(inputs_embeds=m.get_input_embeddings()(ids) * special[..., None]).logits[0]
        m.classifier.bias.sub_(lg - lg.mean())
    return ModelAdapter(m, t, "tiny-bert-sharp")


def test_water_fill_reaches_every_retained_fraction() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        m = int(rng.integers(1, 12))
        q = rng.random(m) * (rng.random(m) > 0.3)  # some tokens of zero importance
        t = float(rng.random())
        k = water_fill(q, t)
        assert k.mean() == pytest.approx(t, abs=1e-12)
        assert ((k >= 0) & (k <= 1)).all()
        # order kept; below the cap the keep probability is proportional to the importance
        assert (np.diff(k[np.argsort(q, kind="stable")]) >= -1e-15).all()
        free = (k < 1) & (q > 0)
        if free.sum() >= 2 and (k[q == 0] == 0).all():
            ratio = k[free] / q[free]
            assert np.ptp(ratio) < 1e-12
    assert water_fill(np.array([0.0, 1.0, 0.5]), 1.0).tolist() == [1.0, 1.0, 1.0]
    assert water_fill(np.array([0.0, 1.0, 0.5]), 0.0).tolist() == [0.0, 0.0, 0.0]
    # a hand case: q = (1, 0.5, 0), mean 0.25 -> c q = (0.5, 0.25, 0)
    assert water_fill(np.array([1.0, 0.5, 0.0]), 0.25) == pytest.approx([0.5, 0.25, 0.0], abs=1e-15)


def test_keep_probabilities_of_each_variant() -> None:
    rankable = np.array([False, True, True, True, False])
    q = normalised_importance(np.array([9.0, 3.0, -1.0, 1.0, 9.0]), rankable)
    assert q.tolist() == [0.0, 1.0, 0.0, 0.5, 0.0]
    k = keep_probabilities(q, rankable, 0.3)
    assert k["soft_ns"].tolist() == [1.0, 1.0, 0.0, 0.5, 1.0]
    assert k["soft_nc"].tolist() == [1.0, 0.0, 1.0, 0.5, 1.0]
    for v in ("pi_soft_ns", "pi_soft_nc"):
        assert k[v][rankable].mean() == pytest.approx(0.3, abs=1e-12)
        assert k[v][~rankable].tolist() == [1.0, 1.0]
    assert normalised_importance(np.ones(4), np.ones(4, bool)).tolist() == [0.5] * 4


def _embeds_prob(adapter: ModelAdapter, ids: list[int], mask: np.ndarray, cls: int) -> float:
    """F with the token embeddings scaled, through the model's own inputs_embeds (not the edit site)."""
    hf = adapter.hf_model
    t = torch.tensor([ids])
    with torch.no_grad():
        e = hf.get_input_embeddings()(t) * torch.as_tensor(mask, dtype=torch.float64)[None, :, None]
        logits = hf(inputs_embeds=e, attention_mask=torch.ones_like(t)).logits
    return float(torch.softmax(logits.double(), -1)[0, cls])


def test_monte_carlo_converges_to_the_enumerated_expectation(sharp: ModelAdapter) -> None:
    ids = sharp.encode([TEXT]).input_ids[0].tolist()
    special = sharp.special_mask(ids)
    n = len(ids)
    m = int((~special).sum())
    assert m == 6
    scores = np.random.default_rng(1).standard_normal(n)
    full = float(torch.softmax(sharp.forward(sharp.encode([TEXT])).logits.double(), -1).max())
    cls = int(torch.softmax(sharp.forward(sharp.encode([TEXT])).logits, -1).argmax())
    # the edit-site route equals the inputs_embeds route (float64)
    probe = [np.where(special, 1.0, np.arange(n) % 2).astype(bool), special.copy()]
    got = masked_prob_of(sharp, [ids, ids], probe, np.array([cls, cls]), None)
    for g, mk in zip(got, probe):
        assert g == pytest.approx(_embeds_prob(sharp, ids, mk, cls), abs=1e-12)
    # exact expectation: all 2^m masks of the rankable tokens, weighted by their probability
    pos = np.flatnonzero(~special)
    all_masks = []
    for bits in itertools.product([0, 1], repeat=m):
        mk = special.copy()
        mk[pos] = np.array(bits, bool)
        all_masks.append(mk)
    f_all = np.array([_embeds_prob(sharp, ids, mk, cls) for mk in all_masks])
    f_empty = _embeds_prob(sharp, ids, special.copy(), cls)
    plan = SoftPlan.build(scores, special, None, 0.4, 3000, seed=5)
    f_rows = masked_prob_of(sharp, [ids] * len(plan.rows()), plan.rows(), np.full(len(plan.rows()), cls), None)
    mc, _ = plan.metrics(full, f_rows)
    s = 3000
    index = {tuple(mk.tolist()): i for i, mk in enumerate(all_masks)}
    for i, v in enumerate(VARIANTS):
        k = plan.keep[v]
        w = np.array([np.prod(np.where(mk[pos], k[pos], 1 - k[pos])) for mk in all_masks])
        assert w.sum() == pytest.approx(1.0, abs=1e-12)
        exact = soft_from_terms(full, f_all, w, f_empty, v)
        # every sampled mask is one of the enumerated ones, with the same F
        fs = f_rows[i * s : (i + 1) * s]
        j = [index[tuple(mk.tolist())] for mk in plan.masks[v][:50]]
        assert np.abs(fs[:50] - f_all[j]).max() < 1e-12
        # tolerance from the sample variance of the per-mask term
        drop = np.maximum(0.0, full - fs)
        denom = 1.0 - (1.0 - max(0.0, full - f_empty))
        se = drop.std(ddof=1) / np.sqrt(s) / denom
        assert se > 0
        assert mc[v] == pytest.approx(exact[v], abs=4.5 * se)
        assert abs(exact[v]) > 10 * se or v.endswith("_ns")  # the comparison is not of two zeros
    # an empty input within DENOM_FLOOR of the full one leaves the normalised metrics undefined
    assert np.isnan(soft_from_terms(0.8, np.array([0.5]), np.array([1.0]), 0.8 - 5e-4, "soft_nc")["soft_nc"])
    assert soft_from_terms(0.8, np.array([0.5]), np.array([1.0]), 0.6, "soft_nc")["soft_nc"] == pytest.approx(1.5)
    # the metrics separate the variants far above the Monte Carlo error
    assert abs(mc["soft_nc"] - mc["pi_soft_nc"]) > 0.01


def test_methods_share_the_empty_row_and_each_equals_its_own_plan(
    sharp: ModelAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    import streetlamp.evaluation.soft as soft

    texts = [TEXT, "a fine and moving film"]
    ids = [sharp.encode([t]).input_ids[0].tolist() for t in texts]
    specials = [sharp.special_mask(i) for i in ids]
    rng = np.random.default_rng(3)
    scores = {m: [rng.standard_normal(len(i)) for i in ids] for m in ("a", "b", "c")}
    pred = np.zeros(2, dtype=np.int64)
    f_full = np.array([0.7, 0.6])
    ran: list[int] = []
    real = soft.masked_prob_of

    def counted(adapter, rows, masks, index, budget):  # the real computation, its row count recorded
        ran.append(len(rows))
        return real(adapter, rows, masks, index, budget)

    monkeypatch.setattr(soft, "masked_prob_of", counted)
    got = soft_erasure(sharp, ids, scores, specials, None, f_full, pred, 0.5, 4, [11, 12], None)
    per_plan = len(VARIANTS) * 4 + 1
    assert ran[0] <= 3 * 2 * per_plan - 2 * 2  # the empty row once per example, not once per method
    for mi, name in enumerate(scores):
        for b in range(2):
            plan = SoftPlan.build(scores[name][b], specials[b], None, 0.5, 4, [11, 12][b] * 7919 + mi)
            f = real(sharp, [ids[b]] * len(plan.rows()), plan.rows(), np.zeros(len(plan.rows()), np.int64), None)
            want, arrays = plan.metrics(float(f_full[b]), f)
            have, have_arrays = got[(name, b)]
            assert have.keys() == want.keys()
            for k in want:
                assert have[k] == pytest.approx(want[k], abs=1e-12, nan_ok=True)
            np.testing.assert_array_equal(have_arrays["soft_f"], arrays["soft_f"])


def test_soft_metrics_in_a_run_and_resume_recomputes_nothing(tmp_path: Path) -> None:
    from streetlamp.commands.evaluate import EvaluateSettings
    from streetlamp.commands.evaluate.run import evaluate
    from streetlamp.settings import RunOptions

    ckpt = save_tiny("bert", tmp_path / "bert", seed=1)
    data = tmp_path / "d.csv"
    data.write_text("text,label\nthe movie was good,pos\nthe plot was bad,neg\na fun film,pos\n")
    s = EvaluateSettings(data=str(data), chunk_size=2, methods=["attention", "occlusion"], soft_samples=4, soft_pi=0.5)
    r = evaluate(None, s, tmp_path / "run", RunOptions(model=str(ckpt)))
    df = r.summary
    for v in (*VARIANTS, "soft_comprehensiveness", "pi_soft_sufficiency"):
        assert set(df[df.metric == v].method) == {"attention", "occlusion"}
    table = (tmp_path / "run" / "faithfulness.csv").read_text().splitlines()
    assert table[0].startswith("method,metric,mean,ci_low,ci_high,n")
    assert any(line.startswith("attention,pi_soft_nc,") for line in table)
    assert "## Hard and soft erasure, F-Fidelity" in (tmp_path / "run" / "summary.md").read_text()
    again = evaluate(None, s, tmp_path / "run", RunOptions(model=str(ckpt)))
    assert again.n_computed_chunks == 0
    assert again.summary.equals(r.summary)


@pytest.mark.parametrize("bad", [["--soft-pi", "0"], ["--soft-pi", "1.5"], ["--soft-samples", "0"]])
def test_bad_soft_settings_exit_2_and_write_nothing(
    bad: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "run"
    code = main(["evaluate", "--model", "tiny-bert", "--data", "movies", "--out", str(out), *bad])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--soft-" in err[0]
    assert not out.exists()


def test_no_soft_leaves_the_metrics_and_the_stored_settings_out(tmp_path: Path) -> None:
    """``--no-soft``: no soft rows, and the stored settings are those of a store made before the option
    (so such a store resumes with it)."""
    import json

    from streetlamp.evaluation.pipeline import EvalSettings

    assert not {"soft", "soft_samples", "soft_pi"} & set(EvalSettings(methods=["attention"], soft=False).to_dict())
    ckpt = save_tiny("bert", tmp_path / "bert", seed=1)
    data = tmp_path / "d.csv"
    data.write_text("text,label\nthe movie was good,pos\n")
    out = tmp_path / "run"
    argv = ["evaluate", "--model", str(ckpt), "--data", str(data), "--out", str(out), "--methods", "attention"]
    assert main([*argv, "--no-soft", "--adv-steps", "1", "--permutations", "1"]) == 0
    stored = json.loads((out / "manifest.json").read_text())["settings"]["settings"]
    assert "soft" not in stored and "soft_samples" not in stored
    import pandas as pd

    assert not pd.read_parquet(out / "metrics").metric.isin(VARIANTS).any()
