"""``streetlamp experts`` end to end on a tiny Mixtral checkpoint: every table read back and checked against the
audit called directly, the README row and manifest, and bad input refused in one line with no folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from streetlamp.cli import main
from streetlamp.interventions import experts as X
from streetlamp.models.adapter import Inputs
from streetlamp.models.loading import load
from streetlamp.models.tiny import save_tiny

TEXTS = ["the movie was good and the plot was fun", "a film with great acting", "the story was boring"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    t = tmp_path_factory.mktemp("experts")
    (t / "d.txt").write_text("\n".join(TEXTS) + "\n")
    return {"t": t, "moe": save_tiny("mixtral", t / "moe", seed=2), "llama": save_tiny("llama", t / "llama", seed=2)}


def test_tables_equal_the_audit(setup: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    out = setup["t"] / "run"
    argv = ["experts", "--model", str(setup["moe"]), "--data", str(setup["t"] / "d.txt"), "--out", str(out)]
    assert main(argv + ["--max-tokens", "6", "--bootstrap", "50"]) == 0
    printed = capsys.readouterr().out
    assert "streetlight experts" in printed and "agreement" in printed
    t = pd.read_csv(out / "experts.csv")
    tok = pd.read_parquet(out / "tokens.parquet")
    a = load(str(setup["moe"]))
    full = a.encode(TEXTS)
    inputs = Inputs.from_ids(a, [r[:6] for r in full.rows()], TEXTS)
    res = X.audit(a, inputs)
    np.testing.assert_allclose(t.kl_removed_mean, res.kl_per_text.mean(0).reshape(-1), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(t.routing_frequency, res.frequency.reshape(-1), rtol=0, atol=1e-12)
    assert (
        (t.kl_removed_ci_low <= t.kl_removed_mean + 1e-12) & (t.kl_removed_mean <= t.kl_removed_ci_high + 1e-12)
    ).all()
    assert len(tok) == res.token_rows.shape[0] == int(res.frequency.sum() * res.n_tokens + 0.5)
    np.testing.assert_allclose(tok.kl_removed_at_token, res.token_rows[:, 5], rtol=1e-6, atol=1e-9)
    share = 2 / 4
    want = (t.routing_frequency >= share) & (t.kl_removed_ci_high < 1e-3)
    assert (t.streetlight == want).all()
    m = json.loads((out / "manifest.json").read_text())
    assert m["streetlamp"] == "experts" and "not renormalised" in m["removal"] and m["n_texts"] == 3


@pytest.mark.parametrize(
    "extra,msg",
    [
        (["--limit", "0"], "--limit must be at least 1 (got 0)"),
        (["--floor", "nan"], "--floor must be a finite number"),
        (["--model", "LLAMA"], "is not a mixture of experts"),
        (["--layers", "2"], "--layers 2 out of range: the model has layers 0..1"),
        (["--experts", "0,4"], "--experts 4 out of range: the model has experts 0..3"),
        (["--experts", "x"], "--experts takes comma-separated expert numbers or 'all'"),
        (["--remove", "1.4"], "expert 4 out of range: layer 1 has experts 0..3"),
        (["--remove", "3.0"], "layer 3 out of range: the model has layers 0..1"),
        (["--remove", "1"], "bad expert '1': write LAYER.EXPERT"),
        (["--top-k", "5"], "top-k 5 is not possible: the model's layers have 4 experts (top-k 1..4)"),
        (["--top-k", "0"], "--top-k must be at least 1 (got 0)"),
        (["--remove", "0.0,0.1,0.2,0.3"], "--remove takes all 4 experts of layer 0: every token would be routed"),
        (["--top-k", "1", "--remove", "TOP1"], "takes every expert of some token: it would be routed nowhere"),
        (["--top-k", "1", "--renormalise"], "some token's only expert: removing it leaves nothing to renormalise"),
    ],
)
def test_bad_input_is_one_line_and_no_folder(setup, tmp_path: Path, capsys, extra: list[str], msg: str) -> None:
    out = tmp_path / "o"
    argv = ["experts", "--model", str(setup["moe"]), "--data", str(setup["t"] / "d.txt"), "--out", str(out)]
    extra = [str(setup["llama"]) if x == "LLAMA" else _top1(setup) if x == "TOP1" else x for x in extra]
    assert main(argv + extra) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1 and not out.exists()


def _top1(setup: dict[str, Path]) -> str:
    """``0.E`` for an expert some token of the corpus is routed to alone at top-k 1 (its only expert)."""
    a = load(str(setup["moe"]))
    inputs = a.encode(TEXTS)
    with X.routed_top_k(a, 1):
        w = a.forward(inputs, record=["layers.0.router.weights"]).cache["layers.0.router.weights"]
    return f"0.{int(w[0, 0].argmax())}"


def test_routing_options_equal_the_audit(setup: dict[str, Path]) -> None:
    """--layers, --experts, --top-k, --remove and --batch-tokens reach the audit: the table is the audit's, called
    directly with the same arguments (which tests/interventions/test_experts.py checks by weight surgery)."""
    out = setup["t"] / "opts"
    argv = ["experts", "--model", str(setup["moe"]), "--data", str(setup["t"] / "d.txt"), "--out", str(out)]
    opts = ["--layers", "1", "--experts", "0,2,3", "--top-k", "3", "--remove", "1.3", "--batch-tokens", "10"]
    assert main(argv + opts + ["--max-tokens", "6", "--bootstrap", "20"]) == 0
    t = pd.read_csv(out / "experts.csv")
    assert list(zip(t.layer, t.expert, strict=True)) == [(1, 0), (1, 2)]  # 1.3 is removed throughout
    a = load(str(setup["moe"]))
    full = a.encode(TEXTS)
    inputs = Inputs.from_ids(a, [r[:6] for r in full.rows()], TEXTS)
    res = X.audit(a, inputs, layers=[1], experts=[0, 2, 3], top_k=3, removed=[(1, 3)], batch_tokens=10)
    np.testing.assert_allclose(t.kl_removed_mean, res.kl_per_text[:, 1, [0, 2]].mean(0), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(t.routing_frequency, res.frequency[1, [0, 2]], rtol=0, atol=1e-12)
    tok = pd.read_parquet(out / "tokens.parquet")
    np.testing.assert_allclose(tok.kl_removed_at_token, res.token_rows[:, 5], rtol=1e-6, atol=1e-9)
    m = json.loads((out / "manifest.json").read_text())
    assert m["top_k"] == 3 and m["removed_throughout"] == ["1.3"] and m["forwards"] == res.forwards
    assert (t.streetlight == ((t.routing_frequency >= 3 / 4) & (t.kl_removed_ci_high < 1e-3))).all()
