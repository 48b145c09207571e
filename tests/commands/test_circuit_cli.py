"""``streetlamp circuit`` through ``streetlamp.cli.main`` on a tiny grouped-query Llama (4 heads, 2
key/value groups): every stored table read back with pandas and checked against the circuit engine's
functions called here directly (the scores, f at the smallest size, f = 1 at full size, CPR/CMD, the
per-edge bootstrap intervals against ``stats.bootstrap_ci``, inclusion frequencies), the MIB JSON
against the Parquet circuit, and bad input refused in one line, exit 2, with no folder written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from streetlamp.cli import main
from streetlamp.interventions.circuits import faithfulness as F
from streetlamp.interventions.circuits import scores as S
from streetlamp.interventions.circuits.blocks import Blocks
from streetlamp.interventions.circuits.tasks import encode_pairs, read_pairs
from streetlamp.models.loading import load
from streetlamp.models.tiny import save_tiny
from streetlamp.stats import bootstrap_ci
from tests.conftest import f32_tol

PAIRS = """clean,corrupt,answer,wrong
when mary and john went to the store john gave a drink to,when mary and john went to the store mary gave a drink to, mary, john
the movie was good and the acting,the film was bad and the acting, good, bad
the story was fun and the plot,the story was boring and the plot, fun, boring
when john and mary went to the store mary gave a drink to,when john and mary went to the store john gave a drink to, john, mary
"""
SIZES = [0.05, 0.2, 1.0]
BOOT = 40


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    t = tmp_path_factory.mktemp("circuit")
    (t / "pairs.csv").write_text(PAIRS)
    (t / "nocorrupt.csv").write_text(
        "clean,answer,wrong\n" + "\n".join(",".join(r.split(",")[i] for i in (0, 2, 3)) for r in PAIRS.splitlines()[1:])
    )
    return {"dir": t, "llama": save_tiny("llama", t / "llama", seed=1), "bert": save_tiny("bert", t / "bert", seed=1)}


@pytest.fixture(scope="module")
def run(setup: dict[str, Path]) -> tuple[Path, str]:
    out = setup["dir"] / "run"
    args = ["circuit", "--model", str(setup["llama"]), "--task", str(setup["dir"] / "pairs.csv"), "--out", str(out)]
    args += ["--methods", "eap,exact", "--sizes", ",".join(map(str, SIZES)), "--bootstrap", str(BOOT), "--seed", "3"]
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(args) == 0
    return out, buf.getvalue()


@pytest.fixture(scope="module")
def engine(setup: dict[str, Path]):
    a = load(setup["llama"])
    b = Blocks(a)
    pairs = encode_pairs(a, read_pairs(setup["dir"] / "pairs.csv"))
    return a, b, pairs


def test_tables_match_the_engine(run: tuple[Path, str], engine) -> None:
    out, printed = run
    a, b, pairs = engine
    g = b.graph
    # float32 rounding relative to the size of the quantities compared (the tiny model's logit differences
    # and edge scores are ~1e-2, so the tolerance is scaled to them: f32_tol is for O(1) values)
    scale = float(np.abs(S.eap(b, pairs).mean.double().nan_to_num().numpy()).max())
    tol = f32_tol(a.n_layers) * scale
    edges = pd.read_parquet(out / "edges.parquet")
    assert {"source", "target", "input", "score", "method", "ci_low", "ci_high", "inclusion", "in_circuit"} <= set(
        edges.columns
    )
    assert set(edges["input"]) == {"q", "k", "v", "mlp", "logits"} and set(edges["method"]) == {"eap", "exact"}
    assert "L0.KV1" in set(edges["kv_group"]) and {"embed", "L1.MLP", "L0.H3"} <= set(edges["source"])
    # heads only: a key/value group's k/v edge is a row under each of its 2 heads, every column equal
    assert edges["target"].str.match(r"^(L\d+\.H\d+|L\d+\.MLP|logits)$").all()
    kv = edges[edges["kv_group"] != ""]
    assert set(kv["input"]) == {"k", "v"} and (kv.groupby(["method", "edge"]).size() == 2).all()
    same = ["source", "input", "kv_group", "score", "ci_low", "ci_high", "inclusion", "in_circuit"]
    assert (kv.groupby(["method", "edge"])[same].nunique(dropna=False) == 1).all().all()
    assert (edges["target"] == "logits").sum() == 2 * g.n_writers  # every writer reaches the logits, per method
    want = {"eap": S.eap(b, pairs), "exact": S.exact(b, pairs)}
    r, w = g.edge_index()
    for name, sc in want.items():
        e = edges[edges["method"] == name]
        assert e["edge"].nunique() == g.n_edges and len(e) == g.n_edges + (kv["method"] == name).sum() // 2
        e = e.drop_duplicates("edge")  # one row per edge of the model, in edge_index order
        assert list(e["edge"]) == list(range(g.n_edges))
        ref = sc.mean.double().numpy()[r, w]
        assert np.abs(ref).max() > 1e3 * tol  # the scores compared are far above the tolerance
        np.testing.assert_allclose(e["score"].to_numpy(), ref, rtol=0, atol=tol)
        # per-edge intervals: the bootstrap of stats.bootstrap_ci on that edge's per-prompt scores
        per = sc.per_prompt.double().numpy()
        for i in np.argsort(-np.abs(ref))[:5]:
            _, lo, hi, n = bootstrap_ci(per[:, r[i], w[i]], BOOT, 0.95, seed=3)
            assert n == len(pairs)
            assert e["ci_low"].iloc[i] == pytest.approx(lo, abs=tol) and e["ci_high"].iloc[i] == pytest.approx(
                hi, abs=tol
            )
    ft = pd.read_csv(out / "faithfulness.csv")
    assert {"method", "size_fraction", "n_edges", "faithfulness", "ci_low", "ci_high", "random_faithfulness"} <= set(
        ft.columns
    )
    mv = F.circuit_metrics(b, pairs, [g.valid(), torch.zeros_like(g.valid())])
    gap = abs(mv[0].mean() - mv[1].mean())
    assert gap > 1e3 * tol
    ftol = 4 * f32_tol(a.n_layers) * max(scale, gap) / gap  # f is a ratio over m(model) - m(empty)
    for name, sc in want.items():
        t = ft[ft["method"] == name].sort_values("size_fraction")
        assert list(t["size_fraction"]) == SIZES
        assert t["faithfulness"].iloc[-1] == pytest.approx(1.0, abs=ftol)  # the full circuit is the model
        k = int(SIZES[0] * g.n_edges)
        m = F.circuit(g, sc.mean, k)
        assert t["n_edges"].iloc[0] == int(m.sum())
        f0 = F.faithfulness(F.circuit_metrics(b, pairs, [m])[0], mv[1], mv[0])
        assert abs(f0 - 1) > 10 * ftol  # the small circuit is not trivially faithful
        assert t["faithfulness"].iloc[0] == pytest.approx(f0, abs=ftol)
        assert np.all(t["ci_low"] <= t["faithfulness"] + ftol) and np.all(t["faithfulness"] <= t["ci_high"] + ftol)
        ar = pd.read_csv(out / "areas.csv").set_index("method").loc[name]
        # three sizes, not MIB's ten: MIB's raw-axis formula over them, under other names than cpr / cmd
        under = F.areas(np.array(SIZES), t["faithfulness_signed"].to_numpy())[0]
        from1 = F.areas(np.array(SIZES), t["faithfulness"].to_numpy())[1]
        assert "cpr" not in ar.index and "cmd" not in ar.index
        assert ar["area_under"] == pytest.approx(under, abs=1e-12)
        assert ar["area_from_1"] == pytest.approx(from1, abs=1e-12)
        assert ar["area_under_ci_low"] <= ar["area_under_ci_high"] and ar["ablation"] == "patch"
    m = json.loads((out / "manifest.json").read_text())
    chosen = m["parameters"]["size"]
    assert chosen in SIZES and m["task"]["n_prompts"] == 4 and m["methods"] == ["eap", "exact"] and m["seed"] == 3
    assert m["model"]["kv_heads"] == 2 and set(m["files"]) >= {"edges.parquet", "faithfulness.csv", "areas.csv"}
    # inclusion frequency at the chosen size and membership
    e = edges[edges["method"] == "eap"]
    e1 = e.drop_duplicates("edge")
    k = int(chosen * g.n_edges)
    inc = F.inclusion_frequency(g, want["eap"], k, BOOT, 3).numpy()[r, w]
    np.testing.assert_allclose(e1["inclusion"].to_numpy(), inc, atol=1e-12)
    np.testing.assert_array_equal(e1["in_circuit"].to_numpy(), F.circuit(g, want["eap"].mean, k).numpy()[r, w])
    row = ft[(ft["method"] == "eap") & np.isclose(ft["size_fraction"], chosen)].iloc[0]
    assert f"faithfulness {row['faithfulness']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]" in printed
    assert "heads and MLPs it joins:" in printed and f"output: {out}/" in printed
    # the report: the generic view's tables are the stored ones, the curves figure is listed
    assert [t["title"].split(" (")[0] for t in m["tables"]][:1] == ["faithfulness over circuit sizes"]
    top = m["tables"][1]
    assert top["title"].startswith("top edges of the eap circuit") and len(top["rows"]) == min(
        20, int(e["in_circuit"].sum())
    )
    assert {tuple(r[:3]) for r in top["rows"]} <= set(
        map(tuple, e[e["in_circuit"]][["source", "target", "input"]].values)
    )
    assert [f["file"] for f in m["figures"]] == ["faithfulness.png"] and (out / "faithfulness.png").is_file()
    html = (out / "report.html").read_text()
    assert "top edges of the eap circuit" in html


def test_mib_json_is_the_parquet_circuit(run: tuple[Path, str], engine) -> None:
    """The JSON circuit is the Parquet one in MIB's names, scores in MIB's sign (its attribution metric is
    the loss -m, so its score is -(m(edge ablated) - m(model)) and its signed top-n keeps the highest)."""
    out, _ = run
    g = engine[1].graph
    edges = pd.read_parquet(out / "edges.parquet")
    d = json.loads((out / "circuit.eap.json").read_text())
    assert set(d) == {"cfg", "nodes", "edges"} and d["cfg"]["n_heads"] == 4 and d["cfg"]["n_layers"] == 2
    assert "input" in d["nodes"] and "a1.h3" in d["nodes"] and "m0" in d["nodes"] and d["nodes"]["logits"]["in_graph"]
    e = edges[edges["method"] == "eap"]

    def mib(n: str) -> list[str]:  # the Parquet lists a key/value group's edge under each of its heads already
        if n in ("embed", "logits"):
            return ["input" if n == "embed" else "logits"]
        layer, rest = n.split(".")
        assert rest == "MLP" or rest.startswith("H"), n
        return [f"m{layer[1:]}"] if rest == "MLP" else [f"a{layer[1:]}.h{rest[1:]}"]

    names = set()
    for x in e[e["in_circuit"]].itertuples():
        for t in mib(x.target):
            key = f"{mib(x.source)[0]}->{t}" + (f"<{x.input}>" if x.input in "qkv" else "")
            assert d["edges"][key]["in_graph"] and d["edges"][key]["score"] == pytest.approx(-x.score, abs=1e-12)
            names.add(key)
    assert names and {k for k, v in d["edges"].items() if v["in_graph"]} == names
    # MIB's ungrouped edge count: per layer 3 inputs per head + the MLP, and the logits
    H = g.n_heads
    n_mib = sum(g.layer_start(l) * 3 * H + g.layer_start(l) + H for l in range(g.n_layers)) + g.n_writers
    assert len(d["edges"]) == n_mib


def test_paths_table_is_exact_patching_of_the_named_paths(run: tuple[Path, str], engine) -> None:
    """paths.csv: the top paths of rollout, attention attribution, ALTI and the eap circuit, each row's
    patch effect and interval = exact edge patching of that edge (the engine here, and the run's own
    ``exact`` scores), the matters / agree rule from the stated threshold, disagreements first."""
    out, printed = run
    a, b, pairs = engine
    g = b.graph
    t = pd.read_csv(out / "paths.csv")
    assert list(t.columns) == [
        "source_method", "sender", "receiver", "input", "kv_group", "positions", "tokens", "matrix_score",
        "matrix_share", "matrix_rank", "patch_effect", "patch_ci_low", "patch_ci_high", "relative_effect",
        "matters", "agree",
    ]  # fmt: skip
    t["kv_group"] = t["kv_group"].fillna("")
    for x in t.itertuples():  # a group's receiver is named by its heads, the group beside it
        i = g.reader_index(x.receiver, x.input)
        assert x.receiver == ",".join(g.target_heads(i)) and x.kv_group == g.kv_group(i)
        assert all(h.startswith("L") and ".H" in h for h in x.receiver.split(",")) or x.receiver == "logits"
    assert set(t["source_method"]) == {"rollout", "attention_attribution", "alti", "circuit:eap"}
    assert (t.groupby("source_method").size() == 10).all()
    mat = t[~t["source_method"].str.startswith("circuit:")]
    assert set(mat["input"]) <= {"v", "logits"} and mat["sender"].str.match(r"L\d+\.H\d+$").all()
    idx = [(g.reader_index(x.receiver, x.input), g.writers.index(x.sender)) for x in t.itertuples()]
    rr, ww = np.array([i for i, _ in idx]), np.array([j for _, j in idx])
    ex = S.exact(b, pairs, edges=(rr, ww)).per_prompt.double().numpy()[:, rr, ww]  # [prompts, rows]
    tol = f32_tol(a.n_layers) * float(np.abs(ex).max())
    assert np.abs(ex.mean(0)).max() > 1e3 * tol
    np.testing.assert_allclose(t["patch_effect"], ex.mean(0), atol=tol, rtol=0)
    for k in range(0, len(t), 7):
        _, lo, hi, _ = bootstrap_ci(ex[:, k], BOOT, 0.95, seed=3)
        assert t["patch_ci_low"].iloc[k] == pytest.approx(lo, abs=tol)
        assert t["patch_ci_high"].iloc[k] == pytest.approx(hi, abs=tol)
    edges = pd.read_parquet(out / "edges.parquet").set_index(["method", "source", "target", "input"])
    for x in t.itertuples():  # the run's own exact scores of the same edge (under each head); the circuit rows' eap
        for h in x.receiver.split(","):
            assert edges.loc[("exact", x.sender, h, x.input), "score"] == pytest.approx(x.patch_effect, abs=tol)
            if x.source_method == "circuit:eap":
                assert edges.loc[("eap", x.sender, h, x.input), "score"] == pytest.approx(x.matrix_score)
    ar = pd.read_csv(out / "areas.csv").set_index("method").loc["eap"]
    gap = ar["m_full"] - ar["m_empty"]
    excl = (t["patch_ci_low"] > 0) | (t["patch_ci_high"] < 0)
    matters = (t["patch_effect"].abs() >= 0.01 * abs(gap)) & excl
    assert list(t["matters"]) == list(matters)
    signs = np.sign(t["patch_effect"]) == np.sign(t["matrix_score"])
    want = matters & (~t["source_method"].str.startswith("circuit:") | signs)
    assert list(t["agree"]) == list(want) and 0 < want.sum() < len(t)
    assert list(t["agree"]) == sorted(t["agree"])  # disagreements first
    lines = [x for x in printed.splitlines() if x.startswith(("  DISAGREE", "  agree "))]
    assert len(lines) == len(t) and [x.startswith("  agree") for x in lines] == list(t["agree"])
    assert f"{(~t['agree']).sum()} of {len(t)} disagree" in printed
    m = json.loads((out / "manifest.json").read_text())
    assert "paths.csv" in m["files"] and m["parameters"]["paths"] == 10


class Interrupted(Exception):
    """Raised mid-run by the test (as a kill would stop it)."""


def test_interrupted_run_resumes_without_recomputing(
    setup: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run stopped in the second method's sweep leaves no run folder and a checkpoint of its finished
    stages; the rerun recomputes only what was not finished (the second method's scores are reloaded,
    not recomputed) and writes the same tables as an uninterrupted run; the checkpoint is then gone."""
    import streetlamp.commands.circuit.run as RC
    from streetlamp.commands.circuit.resume import resume_folder

    args = ["circuit", "--model", str(setup["llama"]), "--task", str(setup["dir"] / "pairs.csv")]
    args += ["--methods", "eap,exact", "--sizes", "0.1,1", "--bootstrap", "10", "--paths", "2", "--random", "1"]
    scores, sweeps = [], []
    real_scores, real_sweep = RC.edge_scores, RC.F.sweep

    def count_scores(*a, **k):
        scores.append(a[2])
        return real_scores(*a, **k)

    def sweep(blocks, pairs, sc, *a, **k):
        sweeps.append(sc.method)
        if stop and sc.method == "exact":
            raise Interrupted
        return real_sweep(blocks, pairs, sc, *a, **k)

    monkeypatch.setattr(RC, "edge_scores", count_scores)
    monkeypatch.setattr(RC.F, "sweep", sweep)
    out = tmp_path / "r"
    stop = True
    with pytest.raises(Interrupted):
        main(args + ["--out", str(out)])
    assert not out.exists() and scores == ["eap", "exact"] and sweeps == ["eap", "exact"]
    ck = resume_folder(out)
    # done: eap's scores and sweep, exact's scores (each stage's Parquet part is written last)
    parts = sorted(p.name for p in (ck / "metrics").iterdir())
    assert parts == [f"part-00000{i}.parquet" for i in range(3)] and (ck / "arrays" / "stage2.safetensors").is_file()
    # the rerun computes only the exact method's sweep and what follows it
    scores.clear(), sweeps.clear()
    stop = False
    assert main(args + ["--out", str(out)]) == 0
    assert scores == [] and sweeps == ["exact"] and not ck.exists()
    # a fresh run gives the same tables
    scores.clear()
    fresh = tmp_path / "fresh"
    assert main(args + ["--out", str(fresh)]) == 0 and scores == ["eap", "exact"]
    for name in ("faithfulness.csv", "areas.csv", "paths.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(out / name), pd.read_csv(fresh / name))
    pd.testing.assert_frame_equal(pd.read_parquet(out / "edges.parquet"), pd.read_parquet(fresh / "edges.parquet"))


def test_interrupted_resampling_resumes_without_recomputing(
    setup: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each (method, --resample axis) is a checkpointed stage: a run stopped in the first method's second
    axis keeps its first axis, the rerun recomputes only the three unfinished axes, and stability.csv and
    the manifest's stability summary equal an uninterrupted run's."""
    import streetlamp.interventions.circuits.resampling as RS
    from streetlamp.commands.circuit.resume import resume_folder

    args = ["circuit", "--model", str(setup["llama"]), "--task", str(setup["dir"] / "pairs.csv"), "--paths", "0"]
    args += ["--methods", "eap,eap-ig", "--sizes", "0.1,1", "--bootstrap", "10", "--random", "1"]
    args += ["--resample", "prompts,corrupt", "--resamples", "3"]
    real = RS.stability
    calls: list[tuple[str, str]] = []

    def stability(blocks, task, raw, pairs, scores, fractions, axes, *a, **k):
        calls.append((scores.method, *axes))
        if stop and (scores.method, *axes) == ("eap", "corrupt"):
            raise Interrupted
        return real(blocks, task, raw, pairs, scores, fractions, axes, *a, **k)

    monkeypatch.setattr(RS, "stability", stability)
    out = tmp_path / "r"
    stop = True
    with pytest.raises(Interrupted):
        main(args + ["--out", str(out)])
    assert not out.exists() and calls == [("eap", "prompts"), ("eap", "corrupt")]
    calls.clear()
    stop = False
    assert main(args + ["--out", str(out)]) == 0
    rest = [("eap", "corrupt"), ("eap-ig-inputs", "prompts"), ("eap-ig-inputs", "corrupt")]
    assert calls == rest and not resume_folder(out).exists()
    calls.clear()
    fresh = tmp_path / "fresh"
    assert main(args + ["--out", str(fresh)]) == 0 and calls == [("eap", "prompts"), *rest]
    got, want = pd.read_csv(out / "stability.csv"), pd.read_csv(fresh / "stability.csv")
    assert len(got) == 8 and set(got["method"]) == {"eap", "eap-ig-inputs"}
    assert set(got["axis"]) == {"prompts", "corrupt"}
    pd.testing.assert_frame_equal(got, want)
    m_got, m_want = (json.loads((d / "manifest.json").read_text()) for d in (out, fresh))
    assert m_got["stability"] == m_want["stability"]
    assert m_got["parameters"]["resample"] == ["prompts", "corrupt"] and m_got["parameters"]["resamples"] == 3
    for method in ("eap", "eap-ig-inputs"):
        st = m_got["stability"][method]
        assert set(st) == {"prompts", "corrupt"} and st["prompts"]["n_resamples"] == 3
        # size 1 is every edge, the circuit measured as m(M) before the first resample: each resample's
        # prompts are served from that measurement, so the count is at least the resamples' distinct prompts
        assert st["prompts"]["reused_measurements"] >= 3
        assert st["corrupt"]["reused_measurements"] == 0  # a fresh pair set per draw: nothing to reuse
        assert isinstance(st["prompts"]["stable"], bool) and st["prompts"]["verdict"]


def test_a_checkpoint_of_other_settings_is_discarded(
    setup: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import streetlamp.commands.circuit.run as RC
    from streetlamp.commands.circuit.resume import resume_folder

    args = ["circuit", "--model", str(setup["llama"]), "--task", str(setup["dir"] / "pairs.csv"), "--paths", "0"]
    args += ["--methods", "eap", "--sizes", "0.1,1", "--bootstrap", "10", "--random", "1"]
    real_sweep = RC.F.sweep

    def sweep(*a, **k):
        raise Interrupted

    monkeypatch.setattr(RC.F, "sweep", sweep)
    out = tmp_path / "r"
    with pytest.raises(Interrupted):
        main(args + ["--out", str(out)])
    assert (resume_folder(out) / "metrics" / "part-000000.parquet").is_file()
    monkeypatch.setattr(RC.F, "sweep", real_sweep)
    calls = []
    real_scores = RC.edge_scores
    monkeypatch.setattr(RC, "edge_scores", lambda *a, **k: calls.append(a[3]) or real_scores(*a, **k))
    assert main([*args, "--ablation", "zero", "--out", str(out)]) == 0  # other settings: computed afresh
    assert calls == ["zero"] and not resume_folder(out).exists()
    assert set(pd.read_csv(out / "faithfulness.csv")["ablation"]) == {"zero"}


def test_mean_ablation_runs_without_corrupted_prompts(setup: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "m"
    args = ["circuit", "--model", str(setup["llama"]), "--task", str(setup["dir"] / "nocorrupt.csv")]
    assert (
        main(
            args
            + ["--out", str(out), "--ablation", "mean", "--methods", "eap", "--sizes", "0.1,1", "--bootstrap", "20"]
        )
        == 0
    )
    ft = pd.read_csv(out / "faithfulness.csv")
    assert set(ft["ablation"]) == {"mean"} and ft["faithfulness"].iloc[-1] == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize(
    "task, extra, message",
    [
        ("lengths", [], "must have the same token length"),
        ("answer", [], "is 2 tokens"),
        ("ioi-x", [], "unknown task 'ioi-x'"),
        (None, ["--methods", "eap,acdc"], "unknown circuit method(s) ['acdc']"),
        (None, ["--sizes", "0.1,1.5"], "circuit size 1.5 is outside (0, 1]"),
        (None, ["--sizes", "0"], "circuit size 0 is outside (0, 1]"),
        (None, ["--size", "0"], "--size must be greater than 0 (got 0)"),
        ("nocorrupt", [], "--ablation patch needs corrupted prompts"),
        ("missing.csv", [], "does not exist"),
        (None, ["--model", "bert"], "is not supported: its residual stream is normalised after each block"),
        ("wrong", [], "the wrong answer ' mary john' is 2 tokens"),
        ("same", [], "the answer and the wrong answer are the same token"),
        ("empty", [], "need a header with columns clean,corrupt,answer,wrong and at least one row"),
        (None, ["--sizes", "abc"], "bad circuit size 'abc'"),
        (None, ["--sizes", "nan"], "circuit size nan is outside (0, 1]"),
        (None, ["--size", "1.5"], "--size must be at most 1 (got 1.5)"),
        (None, ["--path-methods", "rollout,lime"], "unknown path method(s) ['lime']"),
        (None, ["--path-threshold", "1.5"], "--path-threshold must be less than 1 (got 1.5)"),
        (None, ["--paths", "-1"], "--paths"),
        (None, ["--limit", "0"], "--limit"),
        (None, ["--methods", "exact", "--exact-max", "10"], "above --exact-max 10"),
        (None, ["--areas", "mib", "--sizes", "0.1,0.5"], "MIB's areas integrate up to 100% of the edges: add 1.0"),
        (None, ["--areas", "mib", "--sizes", "0.1,1"], "MIB's areas need its ten sizes; --sizes lacks 0.001,"),
    ],
)
def test_bad_input(
    setup: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    task: str | None,
    extra: list[str],
    message: str,
) -> None:
    d = setup["dir"]
    rows = PAIRS.splitlines()
    files = {
        "lengths": rows[0] + "\nthe movie was good,the movie was very good, good, bad\n",
        "answer": rows[0] + "\nthe movie was good,the movie was bad, mary john, bad\n",
        "wrong": rows[0] + "\nthe movie was good,the movie was bad, good, mary john\n",
        "same": rows[0] + "\nthe movie was good,the movie was bad, good, good\n",
        "empty": rows[0] + "\n",
    }
    if task in files:
        (tmp_path / f"{task}.csv").write_text(files[task])
        spec = str(tmp_path / f"{task}.csv")
    elif task == "nocorrupt":
        spec = str(d / "nocorrupt.csv")
    elif task is None:
        spec = str(d / "pairs.csv")
    else:
        spec = task if "." not in task else str(tmp_path / task)
    model = str(setup["bert"] if "bert" in extra else setup["llama"])
    extra = [x for x in extra if x != "bert" and x != "--model"]
    out = tmp_path / "bad"
    assert main(["circuit", "--model", model, "--task", spec, "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.strip().count("\n") == 0, err
    assert not out.exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--ablation", "resample"], "--ablation must be one of patch, mean, zero (got 'resample')"),
        (["--metric", "kl"], "--metric must be one of logit_diff, prob_diff (got 'kl')"),
    ],
)
def test_bad_choices_one_line_exit_2(
    setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, extra: list[str], message: str
) -> None:
    """A value outside an option's choices is refused by the settings' declared choices (the same line the
    Python API raises): one line, exit 2, nothing written."""
    out = tmp_path / "bad"
    argv = ["circuit", "--model", str(setup["llama"]), "--task", str(setup["dir"] / "pairs.csv"), "--out", str(out)]
    assert main([*argv, *extra]) == 2
    assert capsys.readouterr().err.strip() == f"streetlamp: error: {message}" and not out.exists()


@pytest.mark.slow
def test_ioi_on_smollm2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "ioi"
    args = ["circuit", "--model", "smollm2-135m", "--task", "ioi", "--limit", "3", "--methods", "eap"]
    assert main(args + ["--sizes", "0.01,0.1,1", "--bootstrap", "20", "--random", "1", "--out", str(out)]) == 0
    ft = pd.read_csv(out / "faithfulness.csv")
    assert ft["faithfulness"].iloc[-1] == pytest.approx(1.0, abs=1e-3)
    s = json.loads((out / "manifest.json").read_text())["summary"]["eap"]
    assert s["m_full"] - s["m_empty"] > 0.5  # the model does IOI: the clean logit difference beats the corrupted one
    e = pd.read_parquet(out / "edges.parquet")
    assert e["edge"].nunique() == json.loads((out / "manifest.json").read_text())["parameters"]["graph"]["edges"]
    assert "L0.KV0" in set(e["kv_group"])  # SmolLM2: 9 heads in 3 key/value groups
    assert set(e[e["kv_group"] == "L0.KV0"]["target"]) == {"L0.H0", "L0.H1", "L0.H2"}
    assert "faithfulness" in capsys.readouterr().out


def test_a_circuit_file_is_evaluated_as_mib_ranks_it(run: tuple[Path, str], setup: dict[str, Path], tmp_path: Path):
    """--circuit-file reads a MIB JSON circuit (here the run's own EAP circuit, scores in MIB's sign): the
    method 'file' has EAP's scores back, so the same circuits at every size and the same faithfulness."""
    first, _ = run
    out = tmp_path / "file"
    args = ["circuit", "--model", str(setup["llama"]), "--task", str(setup["dir"] / "pairs.csv"), "--out", str(out)]
    args += ["--methods", "eap", "--sizes", ",".join(map(str, SIZES)), "--bootstrap", "10", "--random", "0"]
    assert main(args + ["--circuit-file", str(first / "circuit.eap.json"), "--paths", "0"]) == 0
    ft = pd.read_csv(out / "faithfulness.csv")
    a, b = ft[ft["method"] == "eap"].reset_index(), ft[ft["method"] == "file"].reset_index()
    assert len(b) == len(SIZES)
    cols = ["n_edges", "faithfulness", "n_edges_signed", "faithfulness_signed"]
    pd.testing.assert_frame_equal(a[cols], b[cols], check_exact=True)
    e = pd.read_parquet(out / "edges.parquet")
    np.testing.assert_array_equal(e[e["method"] == "file"]["score"], e[e["method"] == "eap"]["score"])
    assert json.loads((out / "manifest.json").read_text())["methods"] == ["eap", "file"]


def _ioi_row(io: str, s: str, c: str) -> dict:
    return {
        "prompt": f"when {io.strip()} and {s.strip()} went to the store {s.strip()} gave a drink to",
        "metadata": {"indirect_object": io, "subject": s, "random_c": c},
        "s2_io_flip_counterfactual": {
            "prompt": f"when {io.strip()} and {s.strip()} went to the store {io.strip()} gave a drink to"
        },
    }


def test_mib_task_file_runs(setup: dict[str, Path], tmp_path: Path) -> None:
    p = tmp_path / "ioi.jsonl"
    p.write_text("\n".join(json.dumps(_ioi_row(*r)) for r in [("mary", "john", "tom"), ("john", "mary", "tom")]))
    out = tmp_path / "mibrun"
    args = ["circuit", "--model", str(setup["llama"]), "--task", str(p), "--mib-task", "ioi", "--out", str(out)]
    more = ["--sizes", "0.2,1", "--bootstrap", "5", "--random", "0", "--paths", "0", "--bootstrap-selection"]
    assert main(args + ["--methods", "eap", *more]) == 0
    pr = pd.read_csv(out / "pairs.csv")
    assert list(pr["answer"]) == [" mary", " john"] and list(pr["wrong"]) == [" john", " mary"]
    # bootstrapped selection: its own curve and areas beside the plain top k
    ft = pd.read_csv(out / "faithfulness.csv")
    assert set(ft["method"]) == {"eap", "eap:bootstrapped"}
    assert ft[ft["method"] == "eap:bootstrapped"]["faithfulness"].iloc[-1] == 1.0
    assert set(pd.read_csv(out / "areas.csv")["method"]) == {"eap", "eap:bootstrapped"}


@pytest.mark.parametrize("case", ["other-model", "no-field", "multi-token", "no-file"])
def test_bad_mib_input(setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, case: str) -> None:
    """A circuit file for another model, a MIB file with a missing field or an answer of several tokens:
    one line, exit 2, no folder."""
    tok = load(setup["llama"]).tokenizer

    def n(s: str) -> int:
        return len(tok(s, add_special_tokens=False)["input_ids"])

    args = ["circuit", "--model", str(setup["llama"]), "--methods", "eap", "--sizes", "0.2,1"]
    rows = [_ioi_row("mary", "john", "tom")]
    if case == "other-model":
        c = tmp_path / "c.json"
        c.write_text(json.dumps({"cfg": {"n_layers": 12, "n_heads": 12, "d_model": 768}, "nodes": {}, "edges": {}}))
        args += ["--task", str(setup["dir"] / "pairs.csv"), "--circuit-file", str(c)]
        message = "is for another model (n_layers 12, n_heads 12, d_model 768); this model has n_layers 2, n_heads 4"
    elif case == "no-file":
        args += ["--task", str(setup["dir"] / "pairs.csv"), "--circuit-file", str(tmp_path / "none.json")]
        message = "does not exist"
    else:
        if case == "no-field":
            del rows[0]["s2_io_flip_counterfactual"]
            message = "row 1: no field 's2_io_flip_counterfactual.prompt'"
        else:  # names of equal token length (MIB's filter keeps them) but more than one token each
            trio = ["mary john", "john mary", "mary mary"]  # the tiny tokenizer reads words
            assert n(" " + trio[0]) == n(" " + trio[1]) == n(" " + trio[2]) == 2
            rows = [_ioi_row(*trio)]
            message = f"the answer ' {trio[0]}' is {n(' ' + trio[0])} tokens"
        f = tmp_path / "rows.jsonl"
        f.write_text(json.dumps(rows[0]))
        args += ["--task", str(f), "--mib-task", "ioi"]
    out = tmp_path / "bad"
    capsys.readouterr()  # loading the tokenizer above printed its progress
    assert main(args + ["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.strip().count("\n") == 0, err
    assert not out.exists()
