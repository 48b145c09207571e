"""The graph as the JSON that circuit-tracer writes for Neuronpedia's graph viewer (``create_graph_files``:
its ``Metadata``, ``QParams``, ``Node``, ``Link`` models, transcribed), so a pruned graph opens in that viewer.

``{"metadata": {slug, scan, transcoder_list, prompt_tokens, prompt, node_threshold}, "qParams": {pinnedIds,
supernodes, linkType, clickedId, sg_pos}, "nodes": [...], "links": [{source, target, weight}]}``. Nodes are the
kept ones (tokens and logits always) that a kept link touches; a node's ``influence`` is its cumulative
influence share (the pruning's sort order). Node ids as circuit-tracer names them: a feature
``{layer}_{feature}_{pos}``, an error ``0_{layer}_{pos}``, a token ``E_{token id}_{pos}``, a logit
``{n_layers + 1}_{token id}_{pos}``. A feature's ``feature`` number is its index (no layer offset: the offset
exists only for circuit-tracer's preset transcoder sets).
"""

from __future__ import annotations

from typing import Any

from .attribution import Graph
from .pruning import Pruned

__all__ = ["NODE_FIELDS", "graph_json", "process_token"]

# circuit-tracer's Node model, in its field order, with its defaults
NODE_FIELDS: dict[str, Any] = {
    "node_id": None,
    "feature": None,
    "layer": None,
    "ctx_idx": None,
    "feature_type": None,
    "token_prob": 0.0,
    "is_target_logit": False,
    "run_idx": 0,
    "reverse_ctx_idx": 0,
    "jsNodeId": None,
    "clerp": "",
    "influence": None,
    "activation": None,
}


def process_token(token: str) -> str:
    return token.replace("\n", "⏎").replace("\t", "→").replace("\r", "↵")


def _node(**kw: Any) -> dict[str, Any]:
    out = {k: kw.get(k, v) for k, v in NODE_FIELDS.items()}
    if out["jsNodeId"] is None:
        out["jsNodeId"] = out["node_id"]
    return out


def graph_json(
    graph: Graph,
    pruned: Pruned,
    *,
    slug: str,
    scan: str,
    prompt: str,
    token_strings: list[str],
    logit_strings: list[str],
    node_threshold: float | None = None,
    transcoder_list: list[str] | None = None,
) -> dict[str, Any]:
    """The Neuronpedia graph JSON of a pruned graph (``token_strings``: the decoded prompt tokens)."""
    nodes: dict[int, dict[str, Any]] = {}
    cum = pruned.cumulative
    for i in map(int, pruned.node_mask.nonzero().view(-1).tolist()):
        kind = graph.kind(i)
        l, p = graph.where(i)
        infl = float(cum[i])
        if kind == "feature":
            f = int(graph.features[i, 2])
            nodes[i] = _node(
                node_id=f"{l}_{f}_{p}",
                feature=f,
                layer=str(l),
                ctx_idx=p,
                feature_type="cross layer transcoder",
                jsNodeId=f"{l}_{f}-0",
                influence=infl,
                activation=float(graph.activations[i]),
            )
        elif kind == "error":
            nodes[i] = _node(
                node_id=f"0_{l}_{p}",
                feature=-1,
                layer=str(l),
                ctx_idx=p,
                feature_type="mlp reconstruction error",
                jsNodeId=f"{l}_{p}-0",
                influence=infl,
            )
        elif kind == "token":
            v = int(graph.ids[p])
            nodes[i] = _node(
                node_id=f"E_{v}_{p}",
                feature=p,
                layer="E",
                ctx_idx=p,
                feature_type="embedding",
                jsNodeId=f"E_{v}-{p}",
                influence=infl,
            )
        else:
            k = i - graph.logit_start
            v, prob = int(graph.logit_ids[k]), float(graph.logit_probs[k])
            layer = str(graph.n_layers + 1)
            nodes[i] = _node(
                node_id=f"{layer}_{v}_{p}",
                feature=v,
                layer=layer,
                ctx_idx=p,
                feature_type="logit",
                token_prob=prob,
                is_target_logit=k == 0,
                jsNodeId=f"L_{v}-{p}",
                clerp=f'Output "{process_token(logit_strings[k])}" (p={prob:.3f})',
            )
    A = graph.rows
    links = [
        {"source": nodes[s]["node_id"], "target": nodes[t]["node_id"], "weight": float(A[r, s])}
        for t, s, r in zip(*(x.tolist() for x in pruned.edges()))
        if s in nodes and t in nodes
    ]
    used = {e["source"] for e in links} | {e["target"] for e in links}
    kept = [n for n in nodes.values() if n["node_id"] in used or n["feature_type"] in ("embedding", "logit")]
    return {
        "metadata": {
            "slug": slug,
            "scan": scan,
            "transcoder_list": list(transcoder_list or []),
            "prompt_tokens": [process_token(t) for t in token_strings],
            "prompt": prompt,
            "node_threshold": node_threshold,
        },
        "qParams": {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""},
        "nodes": kept,
        "links": links,
    }
