"""``streetlamp graph``: the run folder (nodes/edges Parquet, paths and audit CSV, the Neuronpedia JSON in
circuit-tracer's schema) and its refusals (one line, exit 2, no folder)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from streetlamp.cli import main
from streetlamp.models.dictionaries import save_features
from streetlamp.models.features import Dictionary, FeatureSet
from streetlamp.models.tiny import save_tiny

PROMPT = "when mary and john went to the store , john gave a drink to"

# circuit-tracer's frontend/graph_models.py (Metadata, QParams, Node, Link; the Model's fields), transcribed:
# field -> the JSON types it may take
METADATA = {
    "slug": (str,),
    "scan": (str,),
    "transcoder_list": (list,),
    "prompt_tokens": (list,),
    "prompt": (str,),
    "node_threshold": (float, int, type(None)),
}
QPARAMS = {"pinnedIds": (list,), "supernodes": (list,), "linkType": (str,), "clickedId": (str,), "sg_pos": (str,)}
NODE = {
    "node_id": (str,),
    "feature": (int,),
    "layer": (str,),
    "ctx_idx": (int,),
    "feature_type": (str,),
    "token_prob": (float, int),
    "is_target_logit": (bool,),
    "run_idx": (int,),
    "reverse_ctx_idx": (int,),
    "jsNodeId": (str,),
    "clerp": (str,),
    "influence": (float, int, type(None)),
    "activation": (float, int, type(None)),
}
LINK = {"source": (str,), "target": (str,), "weight": (float, int)}
FEATURE_TYPES = {"cross layer transcoder", "mlp reconstruction error", "embedding", "logit"}


def _typed(obj: dict, schema: dict, what: str) -> None:
    assert list(obj) == list(schema), (what, list(obj))
    for k, types in schema.items():
        v = obj[k]
        assert isinstance(v, types) and not (bool in (type(v),) and bool not in types), (what, k, v)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    t = tmp_path_factory.mktemp("graph")
    g = torch.Generator().manual_seed(0)
    dicts = {
        (l, "mlp"): Dictionary(
            l,
            "mlp",
            torch.randn(32, 48, generator=g) / 6,
            torch.zeros(48) - 0.2,
            torch.randn(48, 32, generator=g) / 7,
            torch.zeros(32),
        )
        for l in range(2)
    }
    save_features(FeatureSet(dicts, source="random"), t / "features")
    sae = {
        (0, "resid_pre"): Dictionary(
            0, "resid_pre", torch.zeros(32, 8), torch.zeros(8), torch.zeros(8, 32), torch.zeros(32)
        )
    }
    save_features(FeatureSet(sae, source="sae"), t / "sae")
    wide = {(0, "mlp"): Dictionary(0, "mlp", torch.zeros(64, 8), torch.zeros(8), torch.zeros(8, 64), torch.zeros(64))}
    save_features(FeatureSet(wide, source="wide"), t / "wide")
    return {
        "llama": save_tiny("llama", t / "llama", seed=1),
        "bert": save_tiny("bert", t / "bert", seed=1),
        "features": t / "features",
        "sae": t / "sae",
        "wide": t / "wide",
    }


def test_graph_run_folder(setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    argv = ["graph", PROMPT, "--model", str(setup["llama"]), "--features", str(setup["features"]), "--out", str(out)]
    assert main(argv + ["--top", "3"]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "replacement score" in printed and "completeness" in printed and "top paths" in printed
    assert "disagree" in printed
    nodes = pd.read_parquet(out / "nodes.parquet")
    assert set(nodes["kind"]) == {"feature", "error", "token", "logit"}
    assert (nodes[nodes.kind.isin(["token", "logit"])]["kept"]).all()
    edges = pd.read_parquet(out / "edges.parquet")
    assert set(edges.columns) == {"source", "target", "weight", "source_label", "target_label"} and len(edges)
    audit = pd.read_csv(out / "audit.csv")
    assert {"predicted_total", "measured", "agree", "sign_right"} <= set(audit.columns)
    assert list(audit["agree"]) == sorted(audit["agree"])  # disagreements first
    heads = pd.read_parquet(out / "edge_heads.parquet")
    assert len(heads) and "composition" in set(heads.carrier)
    per_edge = heads.groupby(["target_node", "source_node"])
    assert (per_edge.loading.sum() - per_edge.edge_weight.first()).abs().max() <= 1e-9 * heads.edge_weight.abs().max()
    assert (heads.source_position != heads.target_position).all()
    assert "heads carrying" in printed
    qk = pd.read_csv(out / "qk_audit.csv")
    assert len(qk) and {"predicted_attention_shift", "measured_attention_shift", "agree"} <= set(qk.columns)
    assert list(qk["agree"]) == sorted(qk["agree"]) and "why the heads attended" in printed
    m = json.loads((out / "manifest.json").read_text())
    # heads.csv: one row per carrier of edge_heads.parquet, its sums, shares summing to 1
    hs = pd.read_csv(out / "heads.csv")
    assert sorted(hs.carrier) == sorted(set(heads.carrier))
    assert list(hs.abs_loading_sum) == sorted(hs.abs_loading_sum, reverse=True)
    for r in hs.itertuples():
        mine = heads[heads.carrier == r.carrier]
        assert r.edges == int((mine.loading != 0).sum())
        assert r.loading_sum == pytest.approx(mine.loading.sum(), rel=1e-9, abs=1e-12)
        assert r.abs_loading_sum == pytest.approx(mine.loading.abs().sum(), rel=1e-9)
        assert r.largest_loading == pytest.approx(mine.loading.iloc[mine.loading.abs().argmax()], rel=1e-9)
    assert hs.share_of_abs_loading.sum() == pytest.approx(1.0)
    # qk_pairs.csv: the QK attribution of the audited heads, at an edge they carry most of; each side's rows
    # (the top parts and "other parts") sum to the score; it is feature_qk's, recomputed here
    pairs = pd.read_csv(out / "qk_pairs.csv")
    assert set(qk["head"]) <= set(pairs["head"])
    carried = set(zip(heads.carrier, heads.target_position, heads.source_position))
    from streetlamp.interventions.graphs.qk import feature_qk
    from streetlamp.models.dictionaries import load_features
    from streetlamp.models.loading import load

    adapter = load(str(setup["llama"]))
    adapter.attach_features(load_features(str(setup["features"])))
    ids = adapter.encode([PROMPT]).input_ids[0]
    for (h, qp, kp), grp in pairs.groupby(["head", "query_position", "key_position"]):
        assert (h, qp, kp) in carried
        score = grp.score.iloc[0]
        for side in ("query side", "key side"):
            rows = grp[grp.kind == side]
            assert list(rows["rank"]) == list(range(1, len(rows) + 1)) and len(rows) == 3 + 1  # --top 3, the rest
            assert rows.contribution.sum() == pytest.approx(score, rel=1e-6, abs=1e-9)
        pr = grp[grp.kind == "pair"]
        assert list(pr.contribution.abs()) == sorted(pr.contribution.abs(), reverse=True)
        fq = feature_qk(adapter, ids, int(grp.layer.iloc[0]), int(grp.head_index.iloc[0]), qp, kp, top=3)
        assert score == pytest.approx(fq.score, rel=1e-9)
        assert list(zip(pr.query_part, pr.key_part)) == [(a, b) for a, b, _ in fq.pairs]
        assert pr.contribution.to_numpy() == pytest.approx([v for _, _, v in fq.pairs], rel=1e-9)
    # the report view's arrays: the kept nodes and edges, the split edges' loadings (summing to the edge)
    from streetlamp.store.files import load_arrays

    arr = load_arrays(out / "arrays.safetensors")
    kept = nodes[nodes.kept]
    assert list(arr["node_id"]) == list(kept.node) and list(arr["node_position"]) == list(kept.position)
    assert list(arr["edge_source"]) == list(edges.source) and list(arr["edge_target"]) == list(edges.target)
    assert arr["edge_weight"] == pytest.approx(edges.weight.to_numpy())
    assert m["graph_view"]["labels"] == list(kept.label)
    total = arr["head_loading"].sum((1, 2)) + arr["head_composition"]
    assert total == pytest.approx(arr["head_edge_weight"], rel=1e-9, abs=1e-9)
    assert (out / "report.html").is_file() and m["files"].keys() >= {"heads.csv", "qk_pairs.csv"}
    paths = pd.read_csv(out / "paths.csv")
    assert len(paths) and paths["path"].str.endswith(nodes[nodes.kind == "logit"].label.iloc[0]).all()
    assert 0 <= m["scores"]["replacement"] <= 1 and 0 <= m["scores"]["completeness"] <= 1
    # the Neuronpedia JSON, against circuit-tracer's schema
    js = json.loads((out / "graph.json").read_text())
    assert list(js) == ["metadata", "qParams", "nodes", "links"]
    _typed(js["metadata"], METADATA, "metadata")
    _typed(js["qParams"], QPARAMS, "qParams")
    ids = set()
    for n in js["nodes"]:
        _typed(n, NODE, "node")
        assert n["feature_type"] in FEATURE_TYPES
        ids.add(n["node_id"])
    assert len(ids) == len(js["nodes"])
    for e in js["links"]:
        _typed(e, LINK, "link")
        assert e["source"] in ids and e["target"] in ids
    logits = [n for n in js["nodes"] if n["feature_type"] == "logit"]
    assert sum(n["is_target_logit"] for n in logits) == 1 and all(n["layer"] == "3" for n in logits)
    assert len([n for n in js["nodes"] if n["feature_type"] == "embedding"]) == len(js["metadata"]["prompt_tokens"])
    meta = json.loads((out / "graph-metadata.json").read_text())
    assert meta == {"graphs": [js["metadata"]]}


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--node-threshold", "0"], "outside (0, 1]"),
        (["--edge-threshold", "1.5"], "outside (0, 1]"),
        (["--features", "/nonexistent/dict"], "not a folder"),
        ([], "needs --features"),
        (["--features", "{sae}"], "no transcoder"),
        (["--features", "{wide}"], "a dictionary for another model"),
        (["--model", "{bert}", "--features", "{features}"], "causal LM"),
        (["--features", "{features}", "--long"], "at most"),
    ],
)
def test_graph_refusals(
    setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, extra: list[str], needle: str
) -> None:
    out = tmp_path / "run"
    text = PROMPT
    if "--long" in extra:
        extra = [e for e in extra if e != "--long"]
        text = " ".join(["the"] * 5000)
    extra = [e.format(**{k: str(v) for k, v in setup.items()}) for e in extra]
    args = ["graph", text, "--model", str(setup["llama"])]
    if "--features" not in extra and needle != "needs --features":
        args += ["--features", str(setup["features"])]
    rc = main(args + extra + ["--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and needle in err and len(err.splitlines()) == 1, err
    assert not out.exists()
