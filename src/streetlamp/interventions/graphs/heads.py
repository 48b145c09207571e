"""Head loadings (Kamath, Ameisen et al. 2025; METHODS.md §13): each cross-position edge of an attribution graph
split over the attention heads that carry it.

In the replacement model (:mod:`.replacement`) the patterns are frozen, so a head is a linear map of its values
and an edge ``s → t`` with ``s`` and ``t`` at different positions is a sum over paths that each pass one or more
heads' OV circuits (a path with no head stays at its position). Give every head's OV path a gate ``α_h``: the
edge is a multilinear polynomial in the gates, ``E(α) = Σ_paths Π_{h ∈ path} α_h · w_path``. Head ``h``'s
**loading** is the sum of the paths that pass through ``h`` and no other head, ``E(only h on) − E(all off)``;
``E(all off) = 0`` for a cross-position edge, and what remains, ``E(all on) − Σ_h loading_h``, is the
**composition** term: paths through two or more heads (OV-OV composition across positions). The loadings and the
composition term sum to the edge exactly. Where one attention layer separates source and target (source at
layer ``l − 1`` or a token, target at layer ``l``) the composition term is zero and a head's loading is also
the edge less the edge with that head knocked out.

Computed with two backward levels through one retained forward pass in which every head's value is cut for
gradients (:class:`~.attribution.Replacement` with ``cut_heads``): the gradient of the target at each
(layer, position, head)'s value is what a value written there does downstream with no other head on the way
(``D``); then, per (target, layer, head), the backward pass from ``Σ_p D_p · v_p`` reaches every node with no
head on the way: the row of that head's loadings for every source. Float64 rows; the edge itself is read
again from an uncut pass (float64) for the composition term.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd
import torch

from ...models.adapter import ModelAdapter
from ...progress import bar as progress_bar
from .attribution import Graph, Replacement
from .pruning import Pruned

__all__ = ["HEAD_COLUMNS", "cross_position_edges", "head_lines", "head_loadings"]

HEAD_COLUMNS = [
    "source",
    "target",
    "source_position",
    "target_position",
    "edge_weight",
    "carrier",
    "layer",
    "head",
    "loading",
    "share_of_edge",
    "source_node",
    "target_node",
]


def cross_position_edges(graph: Graph, pruned: Pruned, limit: int | None = None) -> list[tuple[int, int]]:
    """The kept edges (target, source) whose source and target sit at different positions, by |weight|."""
    t_idx, s_idx, r_idx = pruned.edges()
    pos = graph.positions()
    keep = np.nonzero(pos[t_idx] != pos[s_idx])[0]
    w = np.abs(graph.rows.numpy()[r_idx[keep], s_idx[keep]])
    keep = keep[np.argsort(-w, kind="stable")]  # by |weight|, ties in the edges' order
    if limit is not None:
        keep = keep[:limit]
    return [(int(t_idx[k]), int(s_idx[k])) for k in keep]


def _first_layer(graph: Graph, s: int) -> int:
    """The first attention layer a source's write reaches (a token's: layer 0)."""
    return graph.where(s)[0] + 1 if graph.kind(s) in ("feature", "error") else 0


def _last_layer(graph: Graph, t: int) -> int:
    """The last attention layer that reaches a target (a feature at layer l reads after layer l's attention)."""
    return graph.where(t)[0] if graph.kind(t) == "feature" else graph.n_layers - 1


def head_loadings(
    adapter: ModelAdapter,
    ids: torch.Tensor,
    graph: Graph,
    edges: list[tuple[int, int]],
    *,
    batch_size: int = 4,
    progress: bool = False,
) -> pd.DataFrame:
    """The loadings of every head on each edge ``(target, source)`` of ``graph`` (cross-position edges), one row
    per (edge, head) with a nonzero loading and one "composition" row per edge; columns :data:`HEAD_COLUMNS`."""
    ids = ids.view(-1).cpu()
    if not edges:
        return pd.DataFrame(columns=HEAD_COLUMNS)
    B = max(1, int(batch_size))
    zero_bos = bool(graph.info.get("zero_bos", False))
    targets = sorted({t for t, _ in edges})
    sources_of: dict[int, list[int]] = defaultdict(list)
    for t, s in edges:
        sources_of[t].append(s)
    H = adapter.n_heads

    def at_sources(r: Replacement, parts: list[torch.Tensor], chunk: list[int]) -> list[dict[int, float]]:
        """Per row ``b``: the row of ``parts[b]`` at the sources of target ``chunk[b]`` (only those columns)."""
        cols = sorted({s for t in chunk for s in sources_of[t]})
        rows = r.rows_at(parts, graph, cols)
        at = {s: j for j, s in enumerate(cols)}
        return [{s: float(rows[b, at[s]]) for s in sources_of[t]} for b, t in enumerate(chunk)]

    # the edges again in float64 (the graph stores float32), from an uncut pass
    plain = Replacement(adapter, ids, B, zero_bos)
    edge64: dict[tuple[int, int], float] = {}
    for c in range(0, len(targets), B):
        chunk = targets[c : c + B]
        got = at_sources(plain, [plain.target(graph, t, b) for b, t in enumerate(chunk)], chunk)
        for t, row in zip(chunk, got):
            edge64.update({(t, s): v for s, v in row.items()})
    del plain

    rep = Replacement(adapter, ids, B, zero_bos, cut_heads=True)
    layers = sorted(rep.v_sinks)
    # the (target, layer, head) rows each target needs
    jobs: list[tuple[int, int, int]] = []
    for t in targets:
        lo = min(_first_layer(graph, s) for s in sources_of[t])
        jobs += [(t, l, h) for l in range(lo, _last_layer(graph, t) + 1) for h in range(H)]
    # batched by layer, highest first: a backward pass goes down from its batch's highest layer (no row changes)
    jobs.sort(key=lambda j: -j[1])
    bar = progress_bar(total=len(targets) + len(jobs), desc="head loadings", disable=not progress)
    D: dict[int, list[torch.Tensor]] = {}  # target -> per layer [n, H, d_head] downstream gradients
    for c in range(0, len(targets), B):
        tchunk = targets[c : c + B]
        total = torch.stack([rep.target(graph, t, b) for b, t in enumerate(tchunk)]).sum()
        gs = torch.autograd.grad(total, [rep.v_sinks[l] for l in layers], retain_graph=True, allow_unused=True)
        for b, t in enumerate(tchunk):
            D[t] = [torch.zeros_like(rep.v_sinks[l][0]) if g is None else g[b].detach() for l, g in zip(layers, gs)]
        bar.update(len(tchunk))
    loading: dict[tuple[int, int, int, int], float] = {}  # (target, source, layer, head) -> loading
    for c in range(0, len(jobs), B):
        jchunk = jobs[c : c + B]
        parts = [(D[t][l][:, h] * rep.v_stash[l][b, :, h]).sum() for b, (t, l, h) in enumerate(jchunk)]
        got = at_sources(rep, parts, [t for t, _, _ in jchunk])  # the edges' sources only, not every node
        for (t, l, h), row in zip(jchunk, got):
            loading.update({(t, s, l, h): v for s, v in row.items() if v != 0.0})
        bar.update(len(jchunk))
    bar.bar.close()
    del rep

    by_edge: dict[tuple[int, int], list[tuple[int, int, float]]] = defaultdict(list)
    for (t, s, l, h), v in loading.items():
        by_edge[(t, s)].append((l, h, v))
    out = []
    for t, s in edges:
        e = edge64[(t, s)]
        base = {
            "source": graph.label(s),
            "target": graph.label(t),
            "source_position": graph.where(s)[1],
            "target_position": graph.where(t)[1],
            "edge_weight": e,
            "source_node": s,
            "target_node": t,
        }
        heads = sorted(by_edge[(t, s)], key=lambda x: -abs(x[2]))
        for l, h, v in heads:
            out.append({**base, "carrier": f"L{l}H{h}", "layer": l, "head": h, "loading": v})
        comp = e - sum(v for _, _, v in heads)
        out.append({**base, "carrier": "composition", "layer": -1, "head": -1, "loading": comp})
    table = pd.DataFrame(out)
    table["share_of_edge"] = table["loading"] / table["edge_weight"].where(table["edge_weight"] != 0)
    return table[HEAD_COLUMNS]


def head_lines(table: pd.DataFrame, k: int = 10, heads_per_edge: int = 3) -> list[str]:
    """The printed lines: for the ``k`` largest cross-position edges, the heads that carry most of each."""
    if not len(table):
        return ["head loadings: no kept edge crosses positions"]
    out = [
        "heads carrying the largest cross-position edges (each head's OV path alone; composition: paths "
        "through two or more heads; they sum to the edge):"
    ]
    for _, grp in list(table.groupby(["target_node", "source_node"], sort=False))[:k]:
        first = grp.iloc[0]
        hs = grp[grp.carrier != "composition"].head(heads_per_edge)
        comp = float(grp[grp.carrier == "composition"]["loading"].iloc[0])
        parts = ", ".join(f"{r.carrier} {r.loading:+.4g}" for r in hs.itertuples())
        out.append(
            f"  {first.source} -> {first.target} ({first.edge_weight:+.4g}): {parts or 'no head'}; "
            f"composition {comp:+.4g}"
        )
    return out
