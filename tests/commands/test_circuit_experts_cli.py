"""``streetlamp circuit --expert-nodes`` on the tiny Mixtral (4 experts, 2 per token): the stored tables read
back and checked against the circuit engine called here directly on the expert graph (EAP and exact scores per
edge, the audit's estimates and exact effects, f = 1 at full size), the expert nodes and the router's input in
every table, and the option refused in one line (exit 2, no folder) where it cannot apply."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from streetlamp.cli import main
from streetlamp.interventions.circuits import scores as S
from streetlamp.interventions.circuits.blocks import Blocks
from streetlamp.interventions.circuits.graph import Graph
from streetlamp.interventions.circuits.tasks import encode_pairs, read_pairs
from streetlamp.models.loading import load
from streetlamp.models.tiny import save_tiny
from tests.conftest import f32_tol

PAIRS = """clean,corrupt,answer,wrong
when mary and john went to the store john gave a drink to,when mary and john went to the store mary gave a drink to, mary, john
the movie was good and the acting,the film was bad and the acting, good, bad
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    t = tmp_path_factory.mktemp("circuit_experts")
    (t / "pairs.csv").write_text(PAIRS)
    return {"dir": t, "mixtral": save_tiny("mixtral", t / "mixtral", seed=1), "llama": save_tiny("llama", t / "llama")}


def test_expert_nodes_run_matches_the_engine(setup: dict[str, Path]) -> None:
    out = setup["dir"] / "run"
    args = ["circuit", "--model", str(setup["mixtral"]), "--task", str(setup["dir"] / "pairs.csv"), "--out", str(out)]
    args += ["--expert-nodes", "--methods", "eap,exact", "--sizes", "0.1,1.0", "--bootstrap", "20", "--audit", "12"]
    args += ["--paths", "0", "--random", "1"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(args) == 0
    a = load(setup["mixtral"])
    b = Blocks(a, experts=True)
    g = b.graph
    assert g == Graph(2, 4, 2, experts=(4, 4), shared=(False, False)) and g.n_edges == 187
    pairs = encode_pairs(a, read_pairs(setup["dir"] / "pairs.csv"))
    m = json.loads((out / "manifest.json").read_text())
    assert m["parameters"]["expert_nodes"] is True
    assert m["parameters"]["graph"] == {"writers": 17, "readers": 27, "edges": 187}
    edges = pd.read_parquet(out / "edges.parquet")
    experts = {f"L{l}.E{e}" for l in range(2) for e in range(4)}
    assert experts <= set(edges["source"]) and experts | {"L0.router", "L1.router"} <= set(edges["target"])
    assert set(edges["input"]) == {"q", "k", "v", "router", "mlp", "logits"}
    r, w = g.edge_index()
    want = {"eap": S.eap(b, pairs), "exact": S.exact(b, pairs)}
    scale = float(np.abs(want["exact"].mean.double().nan_to_num().numpy()).max())
    tol = f32_tol(a.n_layers) * max(scale, 1e-2)
    for name, sc in want.items():
        e = edges[edges["method"] == name].drop_duplicates("edge")
        assert list(e["edge"]) == list(range(g.n_edges))
        ref = sc.mean.double().numpy()[r, w]
        np.testing.assert_allclose(e["score"].to_numpy(), ref, rtol=0, atol=tol)
        touch = e["source"].isin(experts) | e["input"].eq("router")
        assert np.abs(ref[touch.to_numpy()]).max() > 1e3 * tol  # the expert edges carry real scores
    # the last layer's experts feed only the logits: patching that edge is patching the node
    nodes = S.exact_nodes(b, pairs).double().numpy().mean(0)
    ex = edges[(edges["method"] == "exact") & edges["source"].str.startswith("L1.E")].drop_duplicates("edge")
    assert set(ex["target"]) == {"logits"}
    np.testing.assert_allclose(ex["score"].to_numpy(), nodes[[g.writers.index(s) for s in ex["source"]]], atol=tol)
    ft = pd.read_csv(out / "faithfulness.csv")
    full = ft[ft["size_fraction"] == 1.0]
    np.testing.assert_allclose(full["faithfulness"].to_numpy(), 1.0, atol=1e-4)
    # the audit: eap's estimate is its edges.parquet score, the exact effect the exact method's, experts among them
    au = pd.read_parquet(out / "audit_edges.parquet")
    assert set(au["method"]) == {"eap"}
    one = edges.drop_duplicates(["method", "edge"]).copy()
    one["node"] = one["kv_group"].where(one["kv_group"] != "", one["target"])  # the audit names a group's reader
    sc_of = one.set_index(["method", "source", "node", "input"])["score"]
    for x in au.itertuples():
        key = (x.source, x.target, x.input)
        assert x.estimate == pytest.approx(sc_of[("eap", *key)], abs=tol)
        assert x.exact == pytest.approx(sc_of[("exact", *key)], abs=tol)
    assert (au["source"].isin(experts) | au["input"].eq("router") | au["target"].isin(experts)).any()
    assert "audit against exact patching" in buf.getvalue()


@pytest.mark.parametrize(
    "model, extra, message",
    [
        ("llama", [], "(llama) is no mixture-of-experts model: it has no experts"),
        ("mixtral", ["--methods", "flow-routes"], "--expert-nodes: flow-routes (its contribution split"),
        ("mixtral", ["--methods", "eap,eap-gim"], "--expert-nodes: eap-gim (GIM has no rule"),
    ],
)
def test_expert_nodes_bad_input(
    setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, model: str, extra: list[str], message: str
) -> None:
    out = tmp_path / "bad"
    argv = ["circuit", "--model", str(setup[model]), "--task", str(setup["dir"] / "pairs.csv"), "--out", str(out)]
    assert main([*argv, "--expert-nodes", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("streetlamp: error: ") and "\n" not in err and message in err, err
    assert not out.exists()
