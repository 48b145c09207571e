"""``streetlamp atlas`` end to end on a tiny model: outputs, resumption (a killed run recomputes nothing),
bad input (one line, exit 2, no folder)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from streetlamp.cli import main
from streetlamp.commands.atlas import AtlasSettings
from streetlamp.models.tiny import WORDS, save_tiny


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    t = tmp_path_factory.mktemp("atlas")
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(WORDS, int(rng.integers(3, 9)))) for _ in range(10)]
    (t / "d.txt").write_text("\n".join(lines) + "\n")
    (t / "one.txt").write_text("the movie was good\n")
    (t / "empty.csv").write_text("text,label\n")
    (t / "long.txt").write_text(" ".join(["the movie"] * 400) + "\n")
    (t / "bad.csv").write_bytes(b"\xff\xfe\x00garbage\x00\n")
    return {"llama": save_tiny("llama", t / "llama", seed=1), "bert": save_tiny("bert", t / "bert", seed=1), "t": t}


def run(argv: list[str]) -> int:
    return main(["atlas", *argv])


def test_outputs(setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    d = setup["t"] / "d.txt"
    assert run(["--model", str(setup["llama"]), "--data", f"{d},{d}", "--out", str(out), "--chunk-size", "6"]) == 0
    printed = capsys.readouterr().out
    assert "most prominent, least used heads" in printed and "unremarkable but used heads" in printed
    t = pd.read_parquet(out / "atlas.parquet")
    assert len(t) == 20 * 2 * 4 and t.exact.all() and set(t.audit) == {"all"}  # two copies of the file: 20 sequences
    assert {"entropy", "sink", "induction", "concentration", "kl_explained", "kl_mean", "dloss", "dla"} <= set(t)
    a = t[t.sequence < 10].sort_values(["layer", "head", "sequence"]).kl_explained.to_numpy()
    b = t[t.sequence >= 10].sort_values(["layer", "head", "sequence"]).kl_explained.to_numpy()
    # the same text gives the same effect wherever it sits in the corpus, up to float32 rounding of the
    # log-probs that batches of other widths change (eps32 x |log p| <= 2^-23 x 8 per term, KL a p-weighted sum)
    tol = 2.0**-23 * 8
    np.testing.assert_allclose(a, b, rtol=0, atol=tol)
    assert np.median(a) > 10 * tol
    s = pd.read_csv(out / "heads.csv")
    assert len(s) == 8 and {"layer", "head", "rho", "rho_low", "rho_high", "streetlight", "unremarkable_used"} <= set(s)
    m = json.loads((out / "manifest.json").read_text())
    assert m["streetlamp"] == "atlas" and "every real token of the 20 sequences" in m["ablation"]["reference"]
    assert (out / "report.html").is_file()


def test_classifier_and_estimate(setup: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["--model", str(setup["bert"]), "--data", str(setup["t"] / "d.txt"), "--out", str(out)]
    assert run(argv + ["--exact-share", "0.25", "--exact-top", "1", "--ablation", "zero"]) == 0
    t = pd.read_parquet(out / "atlas.parquet")
    n = len(t)
    assert (t.audit == "random").sum() == round(0.25 * n)
    assert (t.groupby(["layer", "head"]).apply(lambda g: (g.audit != "").sum()) >= 1).all()
    assert t.kl_mean.isna().all() and t.dla.isna().all()  # a classifier: no next-token loss, no readout
    assert t[~t.exact].kl_explained.isna().all() and t[t.exact].kl_explained.notna().all()


def test_killed_run_recomputes_nothing(setup: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import streetlamp.commands.atlas.run as R
    from streetlamp.models.loading import load

    adapter = load(setup["llama"])
    kw = dict(data=str(setup["t"] / "d.txt"), exact_share=0.3, exact_top=1, chunk_size=3, seed=1)
    st = AtlasSettings(**kw)
    ref = R.run_atlas(adapter, st, tmp_path / "ref")
    assert ref.computed == {"stats": 4, "estimate": 4, "exact": 4}
    real, calls = R.work, []

    def dying(adapter, job, ctx):
        if job[0] == "estimate" and len([c for c in calls if c == "estimate"]) == 2:
            raise KeyboardInterrupt  # killed in the middle of the second pass
        calls.append(job[0])
        return real(adapter, job, ctx)

    monkeypatch.setattr(R, "work", dying)
    with pytest.raises(KeyboardInterrupt):
        R.run_atlas(adapter, st, tmp_path / "run")
    monkeypatch.setattr(R, "work", real)
    again = R.run_atlas(adapter, st, tmp_path / "run")
    assert again.computed == {"stats": 0, "estimate": 2, "exact": 4}
    pd.testing.assert_frame_equal(
        pd.read_parquet(tmp_path / "run" / "atlas.parquet"), pd.read_parquet(tmp_path / "ref" / "atlas.parquet")
    )
    done = R.run_atlas(adapter, st, tmp_path / "run")
    assert done.computed == {"stats": 0, "estimate": 0, "exact": 0}
    with pytest.raises(Exception, match="other settings"):
        R.run_atlas(adapter, AtlasSettings(**{**kw, "ablation": "zero"}), tmp_path / "run")


@pytest.mark.parametrize(
    "extra, why",
    [
        (["--data", "{t}/empty.csv"], "no"),
        (["--data", "{t}/missing.csv"], "no dataset"),
        (["--data", "{t}/bad.csv"], ""),
        (["--data", "{t}/long.txt"], "--truncate"),
        (["--data", "{t}/one.txt", "--ablation", "resample"], "at least 2"),
        (["--data", "{t}/d.txt", "--ablation", "resample", "--limit", "1"], "at least 2"),
        (["--data", "{t}/d.txt", "--exact-share", "1.5"], "--exact-share must be at most 1 (got 1.5)"),
        (["--data", "{t}/d.txt", "--exact-share", "-0.1"], "--exact-share must be at least 0 (got -0.1)"),
    ],
)
def test_bad_input(
    setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, extra: list[str], why: str
) -> None:
    out = tmp_path / "run"
    argv = ["--model", str(setup["llama"]), "--out", str(out)] + [x.format(t=setup["t"]) for x in extra]
    assert run(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and why in err and "Traceback" not in err
    assert not out.exists()


def test_dtype_is_a_stored_setting(setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``--dtype`` (the placement every model command shares) runs the atlas in bfloat16 and is compared on
    resume: a float32 rerun of a bfloat16 store is refused in one line naming it; a store made before the
    option (no dtype in its settings) resumes as the float32 it was."""
    out = tmp_path / "run"
    argv = ["--model", str(setup["llama"]), "--data", str(setup["t"] / "d.txt"), "--ablation", "zero", "--limit", "4"]
    assert run([*argv, "--out", str(out), "--dtype", "bfloat16"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["model_info"]["dtype"] == m["settings"]["model"]["dtype"] == "bfloat16"
    assert np.isfinite(pd.read_parquet(out / "atlas.parquet").kl_explained).all()
    capsys.readouterr()
    assert run([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "model.dtype: stored 'bfloat16', now 'float32'" in err
    old = tmp_path / "old"
    assert run([*argv, "--out", str(old)]) == 0
    m = json.loads((old / "manifest.json").read_text())
    del m["settings"]["model"]["dtype"]
    (old / "manifest.json").write_text(json.dumps(m))
    capsys.readouterr()
    assert run([*argv, "--out", str(old)]) == 0
    assert "chunks computed now: stats 0, estimate 0, exact 0" in capsys.readouterr().out


def test_truncate_cuts_long_sequences(setup: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["--model", str(setup["llama"]), "--data", str(setup["t"] / "long.txt"), "--out", str(out), "--truncate"]
    assert run(argv + ["--ablation", "zero"]) == 0
    assert json.loads((out / "manifest.json").read_text())["n_cut_to_max_tokens"] == 1


def test_compare_task_writes_the_comparison(
    setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """--compare-task on a finished run computes only the comparison: task_compare.csv per head and its ρ
    (equal to scipy's) in the manifest; a bad task is refused before anything is written."""
    from scipy.stats import spearmanr

    t = setup["t"]
    (t / "pairs.csv").write_text(
        "clean,corrupt,answer,wrong\n"
        "when mary and john went to the store john gave a drink to,when mary and john went to the store he gave a drink to, mary, john\n"
        "the movie was good but the plot was,the film was bad but the plot was, fun, boring\n"
        "the acting was great and the story was,the acting was terrible and the story was, fun, boring\n"
    )
    out = tmp_path / "run"
    argv = ["--model", str(setup["llama"]), "--data", str(t / "d.txt"), "--out", str(out), "--ablation", "zero"]
    assert run(argv) == 0
    capsys.readouterr()
    assert run(argv + ["--compare-task", str(t / "pairs.csv")]) == 0
    printed = capsys.readouterr().out
    assert "chunks computed now: stats 0, estimate 0, exact 0" in printed and "Spearman rho" in printed
    c = pd.read_csv(out / "task_compare.csv")
    assert len(c) == 8 and {"layer", "head", "task_ablate", "task_patch", "corpus_effect", "task_rank"} <= set(c)
    info = json.loads((out / "manifest.json").read_text())["task_compare"]
    rho = spearmanr(c.task_ablate_abs, c.corpus_effect).statistic
    assert info["n_prompts"] == 3 and abs(info["ablate"]["spearman_rho"] - rho) < 1e-12
    assert info["ablate"]["rho_low"] <= rho <= info["ablate"]["rho_high"] and c.task_ablate_abs.max() > 1e-3
    bad = tmp_path / "bad"
    assert (
        run(["--model", str(setup["llama"]), "--data", str(t / "d.txt"), "--out", str(bad), "--compare-task", "nope"])
        == 2
    )
    assert (
        run(["--model", str(setup["llama"]), "--data", str(t / "d.txt"), "--out", str(bad), "--compare-task", "ioi"])
        == 2
    )
    assert not bad.exists() and "Traceback" not in capsys.readouterr().err


def test_parquet_is_float32_and_keeps_the_summaries(setup: dict[str, Path], tmp_path: Path) -> None:
    """atlas.parquet stores the statistics and effects as float32, each the float32 rounding of the value
    the run computed (its float64 parts); heads.csv is computed before the cast, and recomputing it from the
    file moves it by no more than that rounding allows, far inside its bootstrap intervals."""
    from streetlamp.commands.atlas.outputs import EFFECTS
    from streetlamp.commands.atlas.run import run_atlas
    from streetlamp.interventions.atlas_stats import STATS
    from streetlamp.interventions.atlas_use import summarise
    from streetlamp.models.loading import load

    kw = dict(data=str(setup["t"] / "d.txt"), exact_share=0.5, exact_top=1, chunk_size=4, seed=1)
    res = run_atlas(load(setup["llama"]), AtlasSettings(**kw), tmp_path / "run")
    t = pd.read_parquet(res.out / "atlas.parquet")
    floats = [*STATS, "dlogp_est", "dla", *EFFECTS, "prominence_decile", "effect_decile"]
    assert [k for k in floats if t[k].dtype != np.float32] == []
    assert [k for k in ("layer", "head", "sequence", "pred") if t[k].dtype != np.int64] == [] and t.exact.dtype == bool
    key = ["sequence", "layer", "head"]
    parts = res.out / "parts"
    p64 = pd.concat([pd.read_parquet(f) for f in sorted(parts.glob("stats-*.parquet"))])
    x64 = pd.concat([pd.read_parquet(f) for f in sorted(parts.glob("exact-*.parquet"))])
    assert (p64.prominence.dtype, x64.kl_explained.dtype) == (np.float64, np.float64)
    m = t.merge(p64, on=key, suffixes=("", "_64")).merge(x64, on=key, how="left", suffixes=("", "_64"))
    for k in (*STATS, "kl_explained", "dlogp"):  # exactly the float32 rounding of what was computed
        np.testing.assert_array_equal(m[k].to_numpy(), m[f"{k}_64"].astype(np.float32).to_numpy(), err_msg=k)
    ub = m[m.audit.isin(["all", "random"])]
    for _, g in ub.groupby(["layer", "head"]):  # no order changed, so the rank correlations are the same
        for k in ("prominence", "kl_explained"):
            assert (g[k].rank().to_numpy() == g[f"{k}_64"].rank().to_numpy()).all(), k

    s, r = pd.read_csv(res.out / "heads.csv"), summarise(t, 1e-3, 0.5, seed=1)
    u = 2.0**-24  # float32's relative rounding: a mean or a resampled mean's quantile moves <= u max|x|
    big = {k: float(np.nanmax(np.abs(t[k].astype(np.float64)))) for k in ("dlogp_est", "dlogp", "kl_explained")}
    source = {k: k for k in (*STATS, "dlogp_est", "dla", "kl_mean", "dloss", "dlogp")}
    source |= {"abs_dlogp_est": "dlogp_est", "effect": "kl_explained", "effect_low": "kl_explained"}
    source |= {"effect_high": "kl_explained"}
    for col, k in source.items():
        tol = 2 * u * float(np.nanmax(np.abs(t[k].astype(np.float64))))
        np.testing.assert_allclose(r[col], s[col], rtol=0, atol=tol, err_msg=col)
    np.testing.assert_allclose(r.est_mae, s.est_mae, rtol=0, atol=4 * u * (big["dlogp_est"] + big["dlogp"]))
    for col in ("rho", "rho_low", "rho_high"):
        np.testing.assert_allclose(r[col], s[col], rtol=0, atol=1e-12, err_msg=col)
    for i, g in t[t.exact].groupby(["layer", "head"]):  # Pearson r: |dr| <= 4u (max|x|/sd x + max|y|/sd y)
        e, x = g.dlogp_est.to_numpy(np.float64), g.dlogp.to_numpy(np.float64)
        want, got = (float(d.est_r[(d.layer == i[0]) & (d["head"] == i[1])].iloc[0]) for d in (s, r))
        if np.isnan(want):
            assert np.isnan(got)
            continue
        assert abs(got - want) <= 4 * u * (np.abs(e).max() / e.std() + np.abs(x).max() / x.std())
    cols = ["n_exact", "n_audited", "n_prominent_unused", "n_diffuse_used", "streetlight", "unremarkable_used"]
    pd.testing.assert_frame_equal(r[[*cols, "estimate_poor"]], s[[*cols, "estimate_poor"]])
    width = (s.effect_high - s.effect_low).dropna()
    assert len(width) == 8 and 2 * u * big["kl_explained"] < 1e-3 * width.min()  # rounding far inside the intervals


def test_sink_column_is_gu_sink_share_of_recorded_attention(
    setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """heads.csv's ``first_token`` per head = numpy over Hugging Face's own attentions (eager, each text
    alone, tokens as the tokenizer gives them, cut by --max-tokens): attention to the first token averaged
    over every query, then over texts; ``sink_head`` and the manifest's ``sink_share`` (Sink₁^0.3) follow."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "run"
    d = setup["t"] / "d.txt"
    argv = ["--model", str(setup["llama"]), "--data", str(d), "--out", str(out), "--max-tokens", "6"]
    assert run([*argv, "--exact-share", "0", "--exact-top", "0"]) == 0
    printed = capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(setup["llama"], attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(setup["llama"])
    alpha = []
    for text in d.read_text().splitlines():
        ids = tok(text, truncation=True, max_length=6)["input_ids"]
        with torch.no_grad():
            att = model(torch.tensor([ids]), output_attentions=True).attentions
        alpha.append(np.stack([x[0, :, :, 0].double().numpy().mean(-1) for x in att]))  # [L, H]
    want = np.stack(alpha).mean(0).reshape(-1)
    s = pd.read_csv(out / "heads.csv").sort_values(["layer", "head"])
    # float32 attention in both: weights in [0, 1] from two softmax implementations, a few ulps of 1 apart
    np.testing.assert_allclose(s.first_token, want, rtol=0, atol=1e-6)
    # (random tiny weights attend nearly uniformly: with 3-6 tokens every head's α¹ is about 0.42 > 0.3)
    assert s.sink_head.tolist() == (want > 0.3).tolist()
    m = json.loads((out / "manifest.json").read_text())
    assert m["atlas"]["sink_share"] == pytest.approx((want > 0.3).mean(), abs=0) and m["atlas"]["sink_eps"] == 0.3
    assert f"Sink1^0.3 = {(want > 0.3).mean():.3f}: {int((want > 0.3).sum())} of {len(want)} heads" in printed
