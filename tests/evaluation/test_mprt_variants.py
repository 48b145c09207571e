"""Smooth MPRT and Efficient MPRT (evaluation/mprt_variants.py): the entropy against hand-computed values,
the embedding noise against its definition, both metrics against an independent float64 computation
(Hugging Face's own attention on hand-built noisy embeddings, scipy's Spearman and entropy), resume, and
the refusals."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import entropy as scipy_entropy
from scipy.stats import spearmanr

from streetlamp.cli import main
from streetlamp.errors import StreetlampError
from streetlamp.evaluation.mprt_variants import (
    Variants,
    embedding_noise,
    entropy_rise,
    histogram_entropy,
    noise_sigma,
    smooth_stages,
    token_noise,
)
from streetlamp.evaluation.randomisation import fully_randomised, randomisation_rows, randomised_copies
from streetlamp.methods.registry import get_method
from streetlamp.models.adapter import Inputs, ModelAdapter, Target
from streetlamp.models.tiny import save_tiny, tiny_model
from tests.conftest import F64_TOL

TEXTS = ["the movie was good and the plot was good", "the plot was bad", "a fun film"]


@pytest.fixture(scope="module")
def bert() -> ModelAdapter:
    m, t = tiny_model("bert", seed=2, layers=2)
    return ModelAdapter(m.double(), t, "tiny-bert-f64")


def test_histogram_entropy_hand_computed() -> None:
    assert histogram_entropy(np.array([0.0, 0, 1, 1]), 2) == pytest.approx(math.log(2), abs=1e-15)
    assert histogram_entropy(np.array([0.0, 1, 2, 3]), 4) == pytest.approx(math.log(4), abs=1e-15)
    h3 = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))  # counts [3, 1]
    assert histogram_entropy(np.array([0.0, 0.1, 0.2, 1.0]), 2) == pytest.approx(h3, abs=1e-15)
    assert histogram_entropy(np.full(5, 0.3), 10) == 0.0  # one bin
    special = np.array([True, False, False, False, False, True])
    got = entropy_rise(np.array([9.0, 0, 0.1, 0.2, 1, -9]), np.array([-5.0, 0, 1, 2, 3, 5]), special, 2)
    assert got["emprt_entropy_trained"] == pytest.approx(h3, abs=1e-15)
    assert got["emprt_entropy_random"] == pytest.approx(math.log(2), abs=1e-15)
    assert got["emprt_rise"] == pytest.approx((math.log(2) - h3) / h3, abs=1e-14)
    assert got["emprt_rise"] > 0.2  # far from 0: the test can tell a rise from none
    assert math.isnan(entropy_rise(np.ones(4), np.arange(4.0), np.zeros(4, bool), 3)["emprt_rise"])
    assert math.isnan(entropy_rise(np.ones(3), np.arange(3.0), np.array([True, False, True]), 3)["emprt_rise"])


def test_token_noise_and_the_hook(bert: ModelAdapter) -> None:
    ids = bert.tokenizer(TEXTS[0])["input_ids"]
    assert len(set(ids)) < len(ids)  # a repeated token
    z = token_noise(5, 0, ids, bert.d_model)
    assert set(z) == set(ids)
    allz = torch.stack(list(z.values())).numpy().ravel()
    assert abs(allz.mean()) < 4 / math.sqrt(allz.size) and abs(allz.std() - 1) < 0.1  # N(0, 1)
    other = token_noise(5, 1, ids, bert.d_model)
    assert all(not torch.equal(z[t], other[t]) for t in z)  # each draw its own noise
    assert all(torch.equal(z[t], token_noise(5, 0, ids, bert.d_model)[t]) for t in z)  # seeded
    row = torch.tensor(ids + [bert.tokenizer.mask_token_id])  # the mask id is not in the example
    sigma = 0.37
    clean = bert.embed_tokens(row).detach()
    with embedding_noise(bert, sigma, z):
        noisy = bert.embed_tokens(row).detach()
    after = bert.embed_tokens(row).detach()
    assert torch.equal(after, clean)  # the hook is gone
    want = torch.stack([sigma * z[int(t)] for t in ids] + [torch.zeros(bert.d_model, dtype=torch.float64)])
    torch.testing.assert_close(noisy - clean, want, rtol=0, atol=F64_TOL)
    e = bert.embed_tokens(torch.tensor(ids)).detach().double()
    assert noise_sigma(bert, ids, 0.1) == pytest.approx(0.1 * float(e.max() - e.min()), abs=1e-15)


def _hf_attention(adapter: ModelAdapter, ids: list[int], eps: torch.Tensor | None) -> np.ndarray:
    """The ``attention`` method's scores by hand: Hugging Face's last-layer [CLS] row, mean over heads,
    on word embeddings looked up from the weight matrix plus ``eps``."""
    hf = adapter.hf_model
    x = hf.bert.embeddings.word_embeddings.weight[torch.tensor(ids)].detach()[None]
    if eps is not None:
        x = x + eps[None]
    with torch.no_grad():
        out = hf(inputs_embeds=x, output_attentions=True)
    return out.attentions[-1][0].mean(0)[0].numpy()


def _rho(a: np.ndarray, b: np.ndarray, special: np.ndarray) -> float:
    return float(spearmanr(a[~special], b[~special]).statistic)


def test_smooth_mprt_against_an_independent_float64_computation(bert: ModelAdapter) -> None:
    inputs = bert.encode(TEXTS)
    rows = inputs.rows()
    specials = [bert.special_mask(r) for r in rows]
    scores = {
        "attention": [
            np.asarray(x.scores, np.float64) for x in get_method("attention").attribute(bert, inputs, target=Target())
        ]
    }
    seeds, n, noise = [11, 12, 13], 3, 0.1
    v = Variants(smooth=n, noise=noise, stages="top,embed")
    got = randomisation_rows(bert, inputs, scores, specials, {"attention": {}}, "cascading", 4, None, v, seeds)
    got_d = {(b, k): x for b, _, k, x in got}
    stages = dict(randomised_copies(bert, "cascading", 4))
    assert smooth_stages("top,embed", list(stages)) == {"layer.1", "embed"}
    assert not any(k.startswith("smprt") and k.endswith(("@head", "@layer.0")) for _, k in got_d)
    for b, ids in enumerate(rows):
        e = bert.hf_model.bert.embeddings.word_embeddings.weight[torch.tensor(ids)].detach()
        sigma = noise * float(e.max() - e.min())
        eps = [sigma * torch.stack([token_noise(seeds[b], d, ids, bert.d_model)[t] for t in ids]) for d in range(n - 1)]

        def smooth(adapter: ModelAdapter) -> np.ndarray:
            return (sum(_hf_attention(adapter, ids, x) for x in eps) + _hf_attention(adapter, ids, None)) / n

        trained = smooth(bert)
        assert np.abs(trained - _hf_attention(bert, ids, None)).max() > 1e4 * F64_TOL  # the noise moves it
        for stage in ("layer.1", "embed"):
            rnd = smooth(stages[stage])
            want = _rho(trained, rnd, specials[b])
            want_abs = _rho(abs(trained), abs(rnd), specials[b])
            assert got_d[(b, f"smprt_cascading_spearman@{stage}")] == pytest.approx(want, abs=F64_TOL)
            assert got_d[(b, f"smprt_cascading_spearman_abs@{stage}")] == pytest.approx(want_abs, abs=F64_TOL)
            plain = _rho(_hf_attention(bert, ids, None), _hf_attention(stages[stage], ids, None), specials[b])
            assert got_d[(b, f"mprt_cascading_spearman@{stage}")] == pytest.approx(plain, abs=F64_TOL)


def test_efficient_mprt_against_an_independent_computation(bert: ModelAdapter) -> None:
    inputs = bert.encode(TEXTS)
    rows = inputs.rows()
    specials = [bert.special_mask(r) for r in rows]
    scores = {
        "attention": [
            np.asarray(x.scores, np.float64) for x in get_method("attention").attribute(bert, inputs, target=Target())
        ]
    }
    full = fully_randomised(bert, 4)
    last = list(randomised_copies(bert, "cascading", 4))[-1][1]
    fp, lp = dict(full.hf_model.named_parameters()), dict(last.hf_model.named_parameters())
    assert all(torch.equal(fp[k], lp[k]) for k in fp)  # the cascading embed stage is the fully random model
    v = Variants(efficient=True, bins=4)
    alone = randomisation_rows(bert, inputs, scores, specials, {"attention": {}}, "", 4, None, v, [1, 2, 3])
    assert {k for _, _, k, _ in alone} == {"emprt_rise", "emprt_entropy_trained", "emprt_entropy_random"}
    both = randomisation_rows(bert, inputs, scores, specials, {"attention": {}}, "cascading", 4, None, v, [1, 2, 3])
    reused = {(b, k): x for b, _, k, x in both if k.startswith("emprt")}
    for b, ids in enumerate(rows):
        keep = ~specials[b]
        h = [scipy_entropy(np.histogram(_hf_attention(m, ids, None)[keep], bins=4)[0]) for m in (bert, full)]
        assert h[0] > 0.3
        got = {k: x for bb, _, k, x in alone if bb == b}
        assert got["emprt_entropy_trained"] == pytest.approx(h[0], abs=F64_TOL)
        assert got["emprt_entropy_random"] == pytest.approx(h[1], abs=F64_TOL)
        assert got["emprt_rise"] == pytest.approx((h[1] - h[0]) / h[0], abs=F64_TOL)
        assert all(reused[(b, k)] == pytest.approx(x, abs=F64_TOL) for k, x in got.items())


def test_evaluate_with_both_variants_resumes_and_writes_the_tables(tmp_path: Path) -> None:
    from streetlamp.commands.evaluate import EvaluateSettings
    from streetlamp.commands.evaluate.run import evaluate
    from streetlamp.models.loading import load

    ckpt = save_tiny("bert", tmp_path / "bert", seed=1)
    adapter = load(str(ckpt))
    data = tmp_path / "d.csv"
    data.write_text("text,label\nthe movie was good,pos\nthe plot was bad,neg\na fun film,pos\n")
    s = EvaluateSettings(
        data=str(data),
        chunk_size=2,
        methods=["attention", "gradient_x_input"],
        randomisation="cascading",
        soft=False,
        smooth_mprt=2,
        smooth_mprt_stages="embed",
        efficient_mprt=True,
    )
    r = evaluate(adapter, s, tmp_path / "run")
    df = r.summary
    for metric in ("smprt_cascading_spearman@embed", "smprt_cascading_spearman_abs@embed", "emprt_rise"):
        got = df[df.metric == metric]
        assert set(got.method) == {"attention", "gradient_x_input"} and (got.n == 3).all()
    assert df[df.metric == "smprt_cascading_spearman@head"].empty  # only the stages asked for
    rt = pd.read_csv(tmp_path / "run" / "randomisation.csv")
    assert set(rt.test) == {"mprt", "smprt", "emprt"}
    assert set(rt[rt.test == "emprt"].statistic) == {"rise", "entropy_trained", "entropy_random"}
    v = pd.read_csv(tmp_path / "run" / "randomisation_verdict.csv")
    assert set(v.test) == {"mprt", "smprt", "emprt"}
    assert set(v[v.test == "emprt"].stage) == {"embed"}
    md = (tmp_path / "run" / "summary.md").read_text()
    assert "## Smooth MPRT (cascading)" in md and "## Efficient MPRT" in md
    assert evaluate(adapter, s, tmp_path / "run").n_computed_chunks == 0
    changed = EvaluateSettings(**{**s.__dict__, "smooth_mprt": 3})
    with pytest.raises(StreetlampError, match="smooth_mprt"):
        evaluate(adapter, changed, tmp_path / "run")
    # Efficient MPRT alone: no --randomisation, only its own rows
    alone = EvaluateSettings(
        data=str(data), chunk_size=2, methods=["attention"], soft=False, efficient_mprt=True, efficient_mprt_bins=4
    )
    r2 = evaluate(adapter, alone, tmp_path / "run2")
    assert not r2.summary[r2.summary.metric.str.startswith("emprt_")].empty
    assert r2.summary[r2.summary.metric.str.startswith("mprt_")].empty
    assert "emprt" in set(pd.read_csv(tmp_path / "run2" / "randomisation_verdict.csv").test)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--randomisation", "cascading", "--smooth-mprt", "1"], "--smooth-mprt"),
        (["--randomisation", "cascading", "--smooth-mprt", "-2"], "--smooth-mprt"),
        (["--smooth-mprt", "3"], "needs --randomisation"),
        (["--randomisation", "cascading", "--smooth-mprt", "3", "--smooth-mprt-noise", "0"], "--smooth-mprt-noise"),
        (["--randomisation", "cascading", "--smooth-mprt", "3", "--smooth-mprt-noise", "nan"], "--smooth-mprt-noise"),
        (["--randomisation", "cascading", "--smooth-mprt", "3", "--smooth-mprt-stages", "layer.9"], "layer.9"),
        (["--efficient-mprt", "--efficient-mprt-bins", "1"], "--efficient-mprt-bins"),
    ],
)
def test_bad_variant_settings_exit_2_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture, extra: list[str], needle: str
) -> None:
    out = tmp_path / "run"
    ckpt = str(save_tiny("bert", tmp_path / "bert", seed=1))  # a real model: stages are checked against it
    capsys.readouterr()  # saving may print a progress bar
    code = main(["evaluate", "--model", ckpt, "--data", "movies", "--sample", "2", "--out", str(out), *extra])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not out.exists()


def test_efficient_mprt_of_a_weight_free_method_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streetlamp.methods.registry import REGISTRY
    from tests.evaluation.test_randomisation import _WeightFree

    monkeypatch.setitem(REGISTRY, "weight_free_test", _WeightFree)
    out = tmp_path / "run"
    argv = ["evaluate", "--model", "tiny-bert", "--data", "movies", "--out", str(out), "--efficient-mprt"]
    assert main([*argv, "--methods", "attention,weight_free_test"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "weight_free_test" in err[0] and "--efficient-mprt" in err[0]
    assert not out.exists()


def test_inputs_of_one_example_give_the_batched_scores(bert: ModelAdapter) -> None:
    """Smooth MPRT explains one example at a time; the clean explanation it averages in is the batched one."""
    inputs = bert.encode(TEXTS)
    m = get_method("attention")
    batched = m.attribute(bert, inputs, target=Target())
    for b in range(len(TEXTS)):
        one = m.attribute(bert, Inputs.select(inputs, [b]), target=Target())[0]
        np.testing.assert_allclose(one.scores, batched[b].scores, rtol=0, atol=F64_TOL)
