"""``streetlamp graph``: the graph's tables (nodes.parquet, edges.parquet, paths.csv, audit.csv; with head
loadings edge_heads.parquet and heads.csv, with QK qk_pairs.csv and qk_audit.csv), its Neuronpedia JSON
(graph.json, graph-metadata.json), the report view's arrays (:mod:`.view`) and the manifest."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ...interventions.graphs import attribute, graph_scores, prune
from ...interventions.graphs.audit import audit, audit_lines
from ...interventions.graphs.heads import cross_position_edges, head_lines, head_loadings
from ...interventions.graphs.neuronpedia import graph_json
from ...interventions.graphs.pruning import top_paths
from ...interventions.graphs.qk_audit import qk_audit, qk_audit_lines, qk_explain, qk_heads, qk_pairs
from ...models.adapter import ModelAdapter
from ...store.run_folder import RunFolder
from . import GraphSettings
from .view import add_view, head_summary


@dataclass
class GraphResult:
    out: Path
    replacement: float
    completeness: float
    n_nodes: int
    n_edges: int
    paths: pd.DataFrame
    audit: pd.DataFrame
    lines_: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return self.lines_ + [f"output: {self.out}/"]


def _decode(adapter: ModelAdapter, ids: list[int]) -> list[str]:
    return [str(adapter.tokenizer.decode([int(i)])) for i in ids]


def run(adapter: ModelAdapter, s: GraphSettings, out: RunFolder, options: Any) -> GraphResult:
    fs = adapter.features
    assert fs is not None  # validate attached it
    ids = adapter.encode([s.text]).input_ids[0]
    t0 = time.perf_counter()
    g = attribute(
        adapter,
        ids,
        max_logits=s.max_logits,
        logit_prob=s.logit_prob,
        batch_size=s.rows,
        max_feature_nodes=s.max_feature_nodes,
        zero_bos=s.zero_bos,
        progress=True,
        rows_memory=s.rows_memory_gb * 2**30,
    )
    t_graph = time.perf_counter() - t0
    p = prune(g, s.node_threshold, s.edge_threshold)
    rep, comp = graph_scores(g)
    N = g.n_nodes
    kinds = [g.kind(i) for i in range(N)]
    where = [g.where(i) for i in range(N)]
    labels = np.array([g.label(i) for i in range(N)], dtype=object)  # once per node; edges index it
    feat = np.full(N, -1, dtype=np.int64)
    feat[: g.n_features] = g.features[:, 2]
    feat[g.logit_start :] = g.logit_ids
    act = np.full(N, np.nan)
    act[: g.n_features] = g.activations
    prob = np.full(N, np.nan)
    prob[g.logit_start :] = g.logit_probs
    nodes = pd.DataFrame(
        {
            "node": np.arange(N),
            "kind": kinds,
            "layer": [w[0] for w in where],
            "position": [w[1] for w in where],
            "feature_or_token_id": feat,
            "label": labels,
            "activation": act,
            "logit_probability": prob,
            "influence": p.node_influence.numpy(),
            "cumulative_influence": p.cumulative.numpy(),
            "kept": p.node_mask.numpy(),
        }
    )
    t_idx, s_idx, r_idx = p.edges()
    edges = pd.DataFrame(
        {
            "source": s_idx,
            "target": t_idx,
            "weight": g.rows.numpy()[r_idx, s_idx].astype(np.float64),  # float32 as stored, cast per edge
            "source_label": labels[s_idx],
            "target_label": labels[t_idx],
        }
    )
    paths = top_paths(g, p, s.top)
    path_rows = []
    for rank, (score, path) in enumerate(paths, 1):
        signed = float(np.prod([g.weight(path[i + 1], path[i]) for i in range(len(path) - 1)], dtype=np.float64))
        path_rows.append(
            {
                "rank": rank,
                "path": " -> ".join(g.label(i) for i in path),
                "influence_share": score,
                "edge_weight_product": signed,
                "length": len(path) - 1,
                "nodes": " ".join(map(str, path)),
            }
        )
    paths_df = pd.DataFrame(
        path_rows, columns=["rank", "path", "influence_share", "edge_weight_product", "length", "nodes"]
    )
    t1 = time.perf_counter()
    heads_df = (
        head_loadings(adapter, ids, g, cross_position_edges(g, p, s.head_edges), batch_size=s.rows, progress=True)
        if s.head_edges
        else None
    )
    t_heads = time.perf_counter() - t1
    t1 = time.perf_counter()
    audit_df = audit(adapter, g, p, top=s.top) if s.audit else pd.DataFrame()
    qk_df = pairs_df = None
    if heads_df is not None and s.qk_heads:
        chosen = qk_heads(heads_df, s.qk_heads)
        explained = qk_explain(adapter, g, chosen, top=s.top, batch_size=s.rows)
        pairs_df = qk_pairs(explained, chosen, top=s.top)
        if s.audit:
            qk_df = qk_audit(adapter, g, chosen, batch_size=s.rows, explained=explained)
    t_audit = time.perf_counter() - t1
    tokens = _decode(adapter, g.ids)
    logit_strings = _decode(adapter, [int(i) for i in g.logit_ids])
    slug = out.out.name or "graph"
    js = graph_json(
        g,
        p,
        slug=slug,
        scan=f"streetlamp:{Path(fs.source).name or 'features'}",
        prompt=s.text,
        token_strings=tokens,
        logit_strings=logit_strings,
        node_threshold=s.node_threshold,
        transcoder_list=[f"{fs.source}#layer{d.layer}" for d in fs if d.where == "mlp"],
    )
    lines = [
        f"{adapter.name}, {g.n_pos} tokens, next token {g.logit_labels[0]!r} (p={g.logit_probs[0]:.3f}); "
        f"{g.n_active} active features ({g.n_features} in the graph), {g.n_logits} logit nodes; "
        f"{t_graph:.1f}s for the graph",
        f"replacement score {rep:.3f} (share of the tokens' and errors' influence on the logits that the tokens "
        f"have), completeness {comp:.3f} (influence-weighted share of inputs not straight from an error)",
        f"pruned (node threshold {s.node_threshold:g}, edge threshold {s.edge_threshold:g}): "
        f"{int(p.node_mask.sum())} of {N} nodes, {len(edges)} edges",
        "top paths into the top logit (share of its influence):",
    ]
    for r in path_rows:
        lines.append(f"  {r['influence_share']:.4f}  {r['path']}")
    if heads_df is not None:
        lines += head_lines(heads_df, s.top)
    if s.audit:
        lines += audit_lines(audit_df)
    if qk_df is not None:
        lines += qk_audit_lines(qk_df)
    with out.staging() as w:
        nodes.to_parquet(w.path / "nodes.parquet", index=False)
        edges.to_parquet(w.path / "edges.parquet", index=False)
        paths_df.to_csv(w.path / "paths.csv", index=False)
        if heads_df is not None:
            heads_df.to_parquet(w.path / "edge_heads.parquet", index=False)
            head_summary(heads_df).to_csv(w.path / "heads.csv", index=False)
        if pairs_df is not None:
            pairs_df.to_csv(w.path / "qk_pairs.csv", index=False)
        if s.audit:
            audit_df.to_csv(w.path / "audit.csv", index=False)
        if qk_df is not None:
            qk_df.to_csv(w.path / "qk_audit.csv", index=False)
        (w.path / "graph.json").write_text(json.dumps(js))  # no indent: the C encoder (76 MB at 66 tokens)
        (w.path / "graph-metadata.json").write_text(json.dumps({"graphs": [js["metadata"]]}, indent=2))
        view = add_view(w, nodes, edges, heads_df, g.n_layers, adapter.n_heads)
        w.write_manifest(
            {
                "model": adapter.name,
                "features": fs.describe(),
                "parameters": s.to_dict(),
                "prompt": s.text,
                "tokens": tokens,
                "scores": {"replacement": rep, "completeness": comp},
                "graph": {
                    "n_active_features": g.n_active,
                    "n_feature_nodes": g.n_features,
                    "n_nodes": N,
                    "n_kept_nodes": int(p.node_mask.sum()),
                    "n_kept_edges": len(edges),
                    "logits": [
                        {"token": lab, "id": int(i), "probability": float(q)}
                        for lab, i, q in zip(g.logit_labels, g.logit_ids, g.logit_probs)
                    ],
                    "zero_bos": g.info["zero_bos"],
                    "rows_buffer_bytes": g.info["rows_bytes"],
                    "rows_buffer_on_disk": g.info["rows_on_disk"],
                    "seconds": t_graph,
                    "audit_seconds": t_audit,
                    "head_loadings_seconds": t_heads,
                    "n_edges_split_over_heads": 0
                    if heads_df is None
                    else int(heads_df.groupby(["target_node", "source_node"]).ngroups),
                },
                "graph_view": view,
                "replacement_model": "MLPs replaced by the transcoders (features and errors fixed nodes), attention "
                "patterns and every norm's denominator frozen at the clean run; an edge is the source's direct "
                "linear effect on the target's pre-activation (a logit: its demeaned value) through that model",
                "files": {
                    "nodes.parquet": "every node of the graph (features, errors, tokens, logits in circuit-tracer's "
                    "order): kind, layer, position, feature index or token id, activation, influence on the "
                    "logits, cumulative influence share, kept by pruning",
                    "edges.parquet": "the kept edges: source and target node, weight (direct effect), labels",
                    "paths.csv": "the kept paths into the top logit with the largest share of its influence",
                    **(
                        {
                            "edge_heads.parquet": "head loadings: each kept cross-position edge (the --head-edges "
                            "largest) split over the heads whose OV path alone carries part of it (loading = the "
                            "edge through that head and no other) plus a 'composition' row (paths through two or "
                            "more heads); per edge the loadings sum to edge_weight"
                        }
                        if heads_df is not None
                        else {}
                    ),
                    **(
                        {
                            "audit.csv": "the graph's claims against the real model (a feature zeroed): predicted "
                            "direct and total change, measured change, ratio, sign_right, agree; disagreements first"
                        }
                        if s.audit
                        else {}
                    ),
                    **(
                        {
                            "qk_audit.csv": "why the heads carrying the top edges attended, checked: the top "
                            "query-side and key-side feature of the head's score at (target, source position) "
                            "zeroed in the real model; predicted (replacement model) vs measured attention and "
                            "score shift, sign_right, agree; disagreements first"
                        }
                        if qk_df is not None
                        else {}
                    ),
                    **(
                        {
                            "heads.csv": "per carrier of edge_heads.parquet (a head, or composition): edges it "
                            "carries, summed loading, summed |loading| and its share of all carriers', the edge "
                            "it carries most of"
                        }
                        if heads_df is not None
                        else {}
                    ),
                    **(
                        {
                            "qk_pairs.csv": "why each head carrying a top edge attended (the --qk-heads heads at "
                            "the edge's target and source positions), in node units: the top (query-side part, "
                            "key-side part) pairs of its score, then the top query-side and key-side parts, an "
                            "'other parts' row holding the rest (each side's rows sum to the score)"
                        }
                        if pairs_df is not None
                        else {}
                    ),
                    "graph.json": "the pruned graph in circuit-tracer's Neuronpedia format",
                    "graph-metadata.json": "the graph list circuit-tracer's local viewer reads",
                },
            }
        )
    return GraphResult(out.out, rep, comp, int(p.node_mask.sum()), len(edges), paths_df, audit_df, lines)
