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
    ],
)
def test_bad_input_is_one_line_and_no_folder(setup, tmp_path: Path, capsys, extra: list[str], msg: str) -> None:
    out = tmp_path / "o"
    argv = ["experts", "--model", str(setup["moe"]), "--data", str(setup["t"] / "d.txt"), "--out", str(out)]
    extra = [str(setup["llama"]) if x == "LLAMA" else x for x in extra]
    assert main(argv + extra) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1 and not out.exists()
