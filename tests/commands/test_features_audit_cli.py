"""``streetlamp features-audit``: the tables hold what the library computes (checked against the library's
functions, themselves checked against a hand-written forward in tests/interventions/test_feature_interventions.py),
every row states its error mode, the steering alpha is the stated multiple of the feature's activation, and bad
input is one line, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from streetlamp.cli import main
from streetlamp.commands.features_audit.sentiment import sentiment
from streetlamp.interventions import features as FI
from streetlamp.interventions.circuits.tasks import encode_pairs, read_pairs
from streetlamp.models.dictionaries import load_features, save_features
from streetlamp.models.features import Dictionary, FeatureSet
from streetlamp.models.loading import load
from streetlamp.models.tiny import save_tiny

PAIRS = (
    "clean,corrupt,answer,wrong\n"
    "when mary and john went to the store john gave a drink to,when mary and john went to the store mary gave a "
    "drink to, mary, john\n"
    "the movie was good and the acting,the film was bad and the acting, good, bad\n"
)


def dictionary(layer: int, where: str, d: int, width: int, seed: int) -> Dictionary:
    g = torch.Generator().manual_seed(seed)
    return Dictionary(
        layer,
        where,  # type: ignore[arg-type]
        torch.randn(d, width, generator=g) / d**0.5,
        torch.randn(width, generator=g) * 0.1,
        torch.randn(width, d, generator=g) / width**0.5,
        torch.randn(d, generator=g) * 0.1,
        b_dec_in=where == "resid_pre",
    )


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    t = tmp_path_factory.mktemp("faudit")
    pairs = t / "pairs.csv"
    pairs.write_text(PAIRS)
    fs = FeatureSet(
        {(0, "mlp"): dictionary(0, "mlp", 32, 64, 1), (1, "resid_pre"): dictionary(1, "resid_pre", 32, 64, 2)}
    )
    save_features(fs, t / "dict")
    wrong = FeatureSet({(0, "mlp"): dictionary(0, "mlp", 16, 64, 1)})
    save_features(wrong, t / "wrong")
    return {"llama": save_tiny("llama", t / "llama", seed=1), "pairs": pairs, "dict": t / "dict", "wrong": t / "wrong"}


def test_tables_are_the_library_numbers(setup: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["features-audit", "--model", str(setup["llama"]), "--features", str(setup["dict"])]
    argv += ["--task", str(setup["pairs"]), "--top", "6", "--edits", "patch,zero,steer", "--error", "both"]
    argv += ["--steer", "0.5", "--out", str(out)]
    assert main(argv) == 0
    audit = pd.read_csv(out / "audit.csv")
    summary = pd.read_csv(out / "summary.csv")
    wide = pd.read_csv(out / "features.csv")
    assert set(audit.error) == {"recomputed", "frozen"} and set(audit.edit) == {"patch", "zero", "steer"}
    assert len(audit) == 6 * 3 * 2 and len(summary) == 3 * 2 and len(wide) == 6
    m = json.loads((out / "manifest.json").read_text())
    assert set(m["error"]) == {"recomputed", "frozen"} and "pooled" not in m["edits"]["zero"]
    # the same numbers from the library, on the same model, dictionaries and pairs
    a = load(setup["llama"]).to("cpu")
    a.attach_features(load_features(setup["dict"]))
    pairs = encode_pairs(a, read_pairs(setup["pairs"]))
    feats = FI.most_active(a, pairs.clean, 6)
    assert list(wide.feature) == [f.name for f in feats]
    act = FI.activity(a, pairs.clean)
    alpha = {f: 0.5 * float(act[f.site]["max"][f.index]) for f in feats}
    for how in ("patch", "zero", "steer"):
        spec = FI.EditSpec(how, alpha=alpha)
        for err in ("recomputed", "frozen"):
            rows = audit[(audit.edit == how) & (audit.error == err)]
            ex = FI.exact(a, pairs, feats, spec, error=err)
            at = FI.attribution(a, pairs, feats, spec, error=err)
            np.testing.assert_allclose(rows.exact, ex.mean(0), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(rows.attribution, at.mean(0), rtol=1e-5, atol=1e-6)
            s = summary[(summary.edit == how) & (summary.error == err)].iloc[0]
            want = FI.audit(at.mean(0), ex.mean(0), [f.name for f in feats], 10)
            assert s.spearman_rho == pytest.approx(want["spearman_rho"], abs=1e-6)
            assert s.top_by_exact == ";".join(want["top_by_exact"])
    steer = audit[(audit.edit == "steer") & (audit.error == "recomputed")]
    np.testing.assert_allclose(steer.alpha, [alpha[f] for f in feats], rtol=1e-6)
    assert audit[audit.edit != "steer"].alpha.isna().all()


def test_the_python_api(setup: dict[str, Path], tmp_path: Path) -> None:
    import streetlamp

    r = streetlamp.features_audit(
        model=str(setup["llama"]), features=str(setup["dict"]), task=str(setup["pairs"]), top=3, edits="zero,mean",
        error="frozen", out=str(tmp_path / "api"),
    )  # fmt: skip
    assert set(r.summary.edit) == {"zero", "mean"} and set(r.summary.error) == {"frozen"}
    assert set(r.arrays) >= {"exact.zero.frozen", "attribution.mean.frozen", "metric_clean"}
    assert r.arrays["exact.zero.frozen"].shape == (2, 3)


def test_select_by_attribution(setup: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "sel"
    argv = ["features-audit", "--model", str(setup["llama"]), "--features", str(setup["dict"]), "--task"]
    argv += [str(setup["pairs"]), "--top", "3", "--edits", "zero", "--select", "attribution", "--out", str(out)]
    assert main(argv) == 0
    a = load(setup["llama"]).to("cpu")
    a.attach_features(load_features(setup["dict"]))
    pairs = encode_pairs(a, read_pairs(setup["pairs"]))
    wide = pd.read_csv(out / "features.csv")
    assert list(wide.feature) == [f.name for f in FI.most_attributed(a, pairs, 3)]
    assert sorted(wide.rank_activation) == [1, 2, 3]
    assert "zero-ablating" in json.loads((out / "manifest.json").read_text())["selection"]


def test_sentiment_pairs_have_equal_lengths_and_both_polarities() -> None:
    pairs = sentiment(8, seed=0, n_tokens=lambda s: len(s.split()))
    assert {p.answer for p in pairs} == {" good", " bad"}
    for p in pairs:
        assert len(p.clean.split()) == len(p.corrupt.split()) and p.clean != p.corrupt
        assert p.answer != p.wrong


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "--features DICT is required"),
        (["--features", "/nonexistent/dict"], "not a folder"),
        (["--features", "WRONG"], "d_model=32"),
        (["--features", "DICT", "--edits", "zero,scale"], "unknown scale"),
        (["--features", "DICT", "--task", "nonsense"], "--task 'nonsense'"),
    ],
)
def test_bad_input_is_one_line_and_nothing_written(
    setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, extra: list[str], message: str
) -> None:
    extra = [str(setup["wrong"]) if x == "WRONG" else str(setup["dict"]) if x == "DICT" else x for x in extra]
    out = tmp_path / "bad"
    argv = ["features-audit", "--model", str(setup["llama"]), "--task", str(setup["pairs"]), *extra]
    if "--task" in extra[:-1]:
        argv = ["features-audit", "--model", str(setup["llama"]), *extra]
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_the_report_page_shows_the_tables(setup: dict[str, Path], tmp_path: Path) -> None:
    """The generic view of the run folder in Chromium: no error, the three tables and their columns shown."""
    from tests.helpers.browser import Page, browser_fixture, require_browser

    require_browser()
    out = tmp_path / "view"
    argv = ["features-audit", "--model", str(setup["llama"]), "--features", str(setup["dict"]), "--task"]
    assert main([*argv, str(setup["pairs"]), "--top", "3", "--edits", "zero,patch", "--out", str(out)]) == 0
    for browser in browser_fixture():
        ctx = browser.new_context(viewport={"width": 1300, "height": 900})
        page = Page(ctx.new_page()).open(out / "report.html")
        text = page.page.text_content("body") or ""
        for name in ("audit.csv", "features.csv", "summary.csv", "exact_ci_low", "spearman_rho", "recomputed"):
            assert name in text, name
        first = pd.read_csv(out / "features.csv").feature.iloc[0]
        assert first in text
        page.page.screenshot(path=str(out / "view.png"), full_page=True)
        page.clean()
        ctx.close()
