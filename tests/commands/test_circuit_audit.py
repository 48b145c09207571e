"""``circuit --audit N``: each first-order edge score against exact patching, on N random edges (shared by
every method) and each method's top N by |score|. Checked against the engine called here directly: the
audited edges' exact effects equal ``scores.exact`` on the whole graph, the estimates equal edges.parquet,
and the summary's figures are recomputed from the per-edge rows; ``compare`` on hand-made numbers; the
bound refused before any folder exists."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from streetlamp.cli import main
from streetlamp.interventions.circuits import scores as S
from streetlamp.interventions.circuits.blocks import Blocks
from streetlamp.interventions.circuits.tasks import encode_pairs, read_pairs
from streetlamp.models.loading import load
from streetlamp.models.tiny import save_tiny
from streetlamp.stats import kendall_tau
from tests.conftest import f32_tol

PAIRS = """clean,corrupt,answer,wrong
when mary and john went to the store john gave a drink to,when mary and john went to the store mary gave a drink to, mary, john
the movie was good and the acting,the film was bad and the acting, good, bad
the story was fun and the plot,the story was boring and the plot, fun, boring
"""
N = 6


def test_compare_on_hand_made_numbers() -> None:
    ex = np.array([1.0, -2.0, 0.5, 0.0])
    ap = np.array([0.5, -1.0, 1.0, 0.25])
    c = S.compare(ap, ex)
    assert c["mean_abs_error"] == pytest.approx((0.5 + 1.0 + 0.5 + 0.25) / 4)
    assert c["max_abs_error"] == pytest.approx(1.0) and c["relative_error"] == pytest.approx(0.5)
    # ordered pairs with nonzero differences in both: (0,1) agree, (0,2) disagree (ex 1>0.5, ap 0.5<1),
    # (0,3) agree, (1,2) agree, (1,3) agree, (2,3) agree: 1 of 6 misranked
    assert c["misranked_share"] == pytest.approx(1 / 6)
    assert c["sign_agreement"] == pytest.approx(1.0)  # the exact zero excluded
    assert c["kendall_tau"] == pytest.approx(kendall_tau(ap, ex))
    assert S.compare(-ap, ex)["sign_agreement"] == 0.0


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    t = tmp_path_factory.mktemp("audit")
    (t / "pairs.csv").write_text(PAIRS)
    model = save_tiny("llama", t / "llama", seed=1)
    out = t / "run"
    args = ["circuit", "--model", str(model), "--task", str(t / "pairs.csv"), "--out", str(out), "--methods",
            "eap,eap-gim", "--sizes", "0.2,1", "--bootstrap", "20", "--random", "1", "--paths", "0", "--audit", str(N)]  # fmt: skip
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(args) == 0
    return out, model, buf.getvalue()


def test_audit_tables_equal_the_engine(run: tuple[Path, Path, str]) -> None:
    out, model, printed = run
    summ = pd.read_csv(out / "audit.csv")
    rows = pd.read_parquet(out / "audit_edges.parquet")
    assert set(summ["method"]) == {"eap", "eap-gim"} and set(summ["subset"]) == {"random", "top"}
    assert (summ["n_edges"] == N).all()
    a = load(str(model))
    b = Blocks(a)
    pairs = encode_pairs(a, read_pairs(out / "pairs.csv"))
    ex = S.exact(b, pairs).mean.numpy()
    names = b.graph.edge_names()
    rr, ww = b.graph.edge_index()
    index = {n: (r, w) for n, r, w in zip(names, rr, ww)}
    edges = pd.read_parquet(out / "edges.parquet")
    tol = f32_tol(a.n_layers + 1)  # two float32 routes (other batch compositions) to the same metric
    assert rows.exact.abs().max() > 100 * tol  # the top edges move the metric: the check has teeth
    for x in rows.itertuples():
        r, w = index[(x.source, x.target, x.input)]
        assert abs(x.exact - float(ex[r, w])) <= tol
        # a grouped key/value edge is one edge of the graph, named by its group (edges.parquet: kv_group)
        tgt = edges.kv_group == x.target if ".KV" in x.target else edges.target == x.target
        e = edges[(edges.method == x.method) & (edges.source == x.source) & tgt & (edges.input == x.input)]
        assert x.estimate == pytest.approx(float(e.score.iloc[0]), rel=1e-6, abs=1e-12)
    # the random subset is one set for every method; each method's top subset holds its largest |score|
    rnd = {m: set(map(tuple, g[g.in_random][["source", "target", "input"]].values)) for m, g in rows.groupby("method")}
    assert rnd["eap"] == rnd["eap-gim"] and len(rnd["eap"]) == N
    for m, g in rows.groupby("method"):
        top = g[g.in_top]
        assert len(top) == N
        rest = g[~g.in_top]
        if len(rest):
            assert top.estimate.abs().min() >= rest.estimate.abs().max() - 1e-12
        for subset, sel in (("random", g.in_random), ("top", g.in_top)):
            want = S.compare(g[sel].estimate.to_numpy(), g[sel].exact.to_numpy())
            got = summ[(summ.method == m) & (summ.subset == subset)].iloc[0]
            for k, v in want.items():
                assert got[k] == pytest.approx(v, nan_ok=True)
    assert "audit against exact patching" in printed and "eap-gim on its top" in printed


def test_audit_bound_refused_before_any_folder(tmp_path: Path) -> None:
    (tmp_path / "pairs.csv").write_text(PAIRS)
    model = save_tiny("llama", tmp_path / "llama", seed=1)
    out = tmp_path / "never"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["circuit", "--model", str(model), "--task", str(tmp_path / "pairs.csv"), "--out", str(out),
                   "--audit", "1000", "--exact-max", "100"])  # fmt: skip
    assert rc == 2 and not out.exists()
    assert "--audit 1000" in err.getvalue() and len(err.getvalue().strip().splitlines()) == 1
