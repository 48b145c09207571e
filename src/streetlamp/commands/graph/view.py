"""What the graph report view (``static/graph.js``) draws, written by the command: the view never recomputes.

Arrays (``arrays.safetensors``): the kept nodes of ``nodes.parquet`` (``node_id``, ``node_kind`` as an index
into ``graph_view.kinds``, ``node_layer``, ``node_position``, ``node_feature``, ``node_activation``,
``node_influence``, ``node_probability``), the kept edges of ``edges.parquet`` (``edge_source``,
``edge_target`` as node ids, ``edge_weight``) and, with head loadings, the split edges
(``head_edge_source``, ``head_edge_target``, ``head_edge_weight``) with their loadings per head
(``head_loading`` ``[split edge, layer, head]``, 0 where a head carries none) and composition terms. The
kept nodes' labels go in the manifest's ``graph_view`` (text: the page renders them as text).
``heads.csv``: :func:`head_summary`, one row per carrier of ``edge_heads.parquet``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

KINDS = ["feature", "error", "token", "logit"]

HEAD_SUMMARY_COLUMNS = [
    "carrier",
    "layer",
    "head",
    "edges",
    "loading_sum",
    "abs_loading_sum",
    "share_of_abs_loading",
    "largest_edge",
    "largest_loading",
]


def head_summary(heads: pd.DataFrame) -> pd.DataFrame:
    """Per carrier (a head, or "composition") of the head-loadings table: how many split edges it carries
    (nonzero loading), its summed loading, summed |loading| and that sum's share of all carriers' (the shares
    sum to 1), and the edge it carries most of; largest share first."""
    if not len(heads):
        return pd.DataFrame(columns=HEAD_SUMMARY_COLUMNS)
    h = heads.assign(abs_loading=heads["loading"].abs(), edge=heads["source"] + " -> " + heads["target"])
    total = float(h["abs_loading"].sum())
    rows = []
    for carrier, grp in h.groupby("carrier", sort=False):
        big = grp.loc[grp["abs_loading"].idxmax()]
        rows.append(
            {
                "carrier": carrier,
                "layer": int(grp["layer"].iloc[0]),
                "head": int(grp["head"].iloc[0]),
                "edges": int((grp["loading"] != 0).sum()),
                "loading_sum": float(grp["loading"].sum()),
                "abs_loading_sum": float(grp["abs_loading"].sum()),
                "share_of_abs_loading": float(grp["abs_loading"].sum()) / total if total > 0 else float("nan"),
                "largest_edge": big["edge"],
                "largest_loading": float(big["loading"]),
            }
        )
    out = pd.DataFrame(rows, columns=HEAD_SUMMARY_COLUMNS)
    return out.sort_values("abs_loading_sum", ascending=False, kind="stable").reset_index(drop=True)


def add_view(
    w: Any, nodes: pd.DataFrame, edges: pd.DataFrame, heads: pd.DataFrame | None, n_layers: int, n_heads: int
) -> dict:
    """Add the view's arrays to the run writer ``w``; returns the manifest's ``graph_view`` section."""
    kept = nodes[nodes["kept"]]
    code = {k: i for i, k in enumerate(KINDS)}
    N = ["node"]
    w.add_array("node_id", kept["node"].to_numpy(np.int64), axes=N, meaning="the kept nodes' ids (nodes.parquet)")
    w.add_array("node_kind", kept["kind"].map(code).to_numpy(np.int64), axes=N,
                meaning="0 feature, 1 error, 2 token, 3 logit (graph_view.kinds)")  # fmt: skip
    w.add_array("node_layer", kept["layer"].to_numpy(np.int64), axes=N,
                meaning="layer (a token: -1; a logit: the number of layers)")  # fmt: skip
    w.add_array("node_position", kept["position"].to_numpy(np.int64), axes=N, meaning="token position")
    w.add_array("node_feature", kept["feature_or_token_id"].to_numpy(np.int64), axes=N,
                meaning="feature index (a feature), token id (a logit), -1 otherwise")  # fmt: skip
    w.add_array("node_activation", kept["activation"].to_numpy(np.float64), axes=N,
                meaning="a feature's activation (NaN for other kinds)")  # fmt: skip
    w.add_array("node_influence", kept["influence"].to_numpy(np.float64), axes=N,
                meaning="influence on the logits (circuit-tracer's, from the logit probabilities)")  # fmt: skip
    w.add_array("node_probability", kept["logit_probability"].to_numpy(np.float64), axes=N,
                meaning="a logit's probability (NaN for other kinds)")  # fmt: skip
    E = ["edge"]
    w.add_array("edge_source", edges["source"].to_numpy(np.int64), axes=E, meaning="kept edge: source node id")
    w.add_array("edge_target", edges["target"].to_numpy(np.int64), axes=E, meaning="kept edge: target node id")
    w.add_array("edge_weight", edges["weight"].to_numpy(np.float64), axes=E,
                meaning="kept edge: the source's direct effect on the target")  # fmt: skip
    section: dict[str, Any] = {
        "kinds": KINDS,
        "labels": kept["label"].astype(str).tolist(),
        "n_layers": int(n_layers),
        "n_heads": int(n_heads),
        "heads": heads is not None,
    }
    if heads is not None:
        split = heads.drop_duplicates(["target_node", "source_node"])
        index = {(int(t), int(s)): i for i, (t, s) in enumerate(zip(split["target_node"], split["source_node"]))}
        load = np.zeros((len(split), n_layers, n_heads))
        comp = np.zeros(len(split))
        for r in heads.itertuples():
            i = index[(int(r.target_node), int(r.source_node))]
            if r.carrier == "composition":
                comp[i] = r.loading
            else:
                load[i, int(r.layer), int(r.head)] = r.loading
        S = ["split_edge"]
        w.add_array("head_edge_source", split["source_node"].to_numpy(np.int64), axes=S,
                    meaning="an edge split over heads (edge_heads.parquet): source node id")  # fmt: skip
        w.add_array("head_edge_target", split["target_node"].to_numpy(np.int64), axes=S,
                    meaning="an edge split over heads: target node id")  # fmt: skip
        w.add_array("head_edge_weight", split["edge_weight"].to_numpy(np.float64), axes=S,
                    meaning="an edge split over heads: its weight (float64 recomputation)")  # fmt: skip
        w.add_array("head_loading", load, axes=[*S, "layer", "head"],
                    meaning="the edge carried by that head's OV path alone (0: none)")  # fmt: skip
        w.add_array("head_composition", comp, axes=S,
                    meaning="the edge's paths through two or more heads (edge - sum of loadings)")  # fmt: skip
    return section
