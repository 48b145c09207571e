"""The graph's claims checked on the real model (issue 39 item 3).

For each audited feature ``s`` the graph predicts what zeroing it does: the direct change ``−A[t, s]`` at every
target, carried on through the graph's feature nodes as the replacement model would (each feature's output
moves with its pre-activation, slope 1 while it stays active; errors and tokens fixed):
``Δ = (I − M)^{-1} d`` with ``d = −A[:, s]`` and ``M[t, u] = A[t, u] / a_u`` for feature columns ``u`` (0
elsewhere). The measurement zeroes the same feature at its position in the **original model** with the
transcoders spliced (the engine's feature site: its decoder contribution removed, every other MLP the real
one, attention recomputed) and reads the same quantity: the top logit's demeaned value
``logit − mean logit`` (the graph's logit node) or a downstream feature's activation.

A row agrees when the measured change has the predicted sign and lies within a factor ``tolerance`` (default
2) of the prediction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ...models.adapter import Inputs, ModelAdapter
from ...models.features import feature_site
from ..engine import Intervention, repeat_inputs, run, zero
from .attribution import Graph
from .pruning import Pruned

__all__ = ["AUDIT_COLUMNS", "audit", "audit_lines", "propagate", "propagate_many"]

AUDIT_COLUMNS = [
    "claim",
    "source",
    "target",
    "predicted_direct",
    "predicted_total",
    "measured",
    "ratio",
    "sign_right",
    "agree",
    "source_node",
    "target_node",
]


def propagate(graph: Graph, s: int, A: torch.Tensor | None = None) -> np.ndarray:
    """The change at every node when source ``s`` is set to zero, through the graph (see the module). ``A``: the
    graph's rows in float64 when the caller has them (one copy for many sources)."""
    return propagate_many(graph, [s], A)[:, 0]


def propagate_many(graph: Graph, sources: list[int], A: torch.Tensor | None = None) -> np.ndarray:
    """:func:`propagate` for several sources at once, ``[n_nodes, len(sources)]`` (one matrix product a step
    instead of one matrix-vector product per source); ``M v`` is ``A (scale · v)``, so no scaled copy is made.
    Only features and logits change (errors and tokens have no inputs)."""
    if A is None:
        A = graph.rows.double()
    rn = graph.row_nodes
    nf = graph.n_features
    scale = 1.0 / torch.as_tensor(graph.activations, dtype=torch.float64)[:, None]  # nonzero (a JumpReLU's may be < 0)
    cur = -A[:, sources]
    total = cur.clone()
    for _ in range(graph.n_layers + 2):  # a feature reaches at most one layer further per step
        cur = A[:, :nf] @ (scale * cur[:nf])  # the only sources that change are features (rows[:nf])
        if not cur.any():
            break
        total += cur
    out = np.zeros((graph.n_nodes, len(sources)))
    out[rn.numpy()] = total.numpy()
    return out


@dataclass
class _Claim:
    source: int
    target: int


def audit(
    adapter: ModelAdapter,
    graph: Graph,
    pruned: Pruned,
    *,
    top: int = 10,
    tolerance: float = 2.0,
    batch_size: int = 8,
) -> pd.DataFrame:
    """Audit the ``top`` kept features by influence (their effect on the top logit) and the ``top`` kept
    feature → feature edges by weight (the target's activation), disagreements first."""
    nf = graph.n_features
    keep = pruned.node_mask[:nf].numpy()
    infl = pruned.node_influence[:nf].numpy()
    feats = [int(i) for i in np.argsort(-infl, kind="stable") if keep[i]][:top]
    logit = graph.logit_start
    claims = [_Claim(s, logit) for s in feats]
    em = pruned.edge_mask[:nf, :nf].numpy()
    A = graph.rows[:nf, :nf].double().numpy()
    t_idx, s_idx = np.nonzero(em)
    order = np.argsort(-np.abs(A[t_idx, s_idx]), kind="stable")[:top]
    claims += [_Claim(int(s_idx[k]), int(t_idx[k])) for k in order]
    if not claims:
        return pd.DataFrame(columns=AUDIT_COLUMNS)
    inputs = Inputs.from_ids(adapter, [graph.ids])
    sources = sorted({c.source for c in claims})
    targets = sorted({c.target for c in claims if c.target < nf})
    record = sorted({feature_site(int(graph.features[t, 0]), "mlp") for t in targets})
    top_id = int(graph.logit_ids[0])

    def measure(inp: Inputs, edits: list[Intervention]) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        with torch.no_grad():
            out = run(adapter, inp, edits, record=record)
        lg = out.logits.double()
        dem = (lg[:, top_id] - lg.mean(-1)).cpu().numpy()
        tv = {}
        for t in targets:
            l, p, f = (int(v) for v in graph.features[t])
            tv[t] = out.cache[feature_site(l, "mlp")][:, p, f].double().cpu().numpy()
        return dem, tv

    base_logit, base_t = measure(inputs, [])
    measured: dict[int, tuple[float, dict[int, float]]] = {}
    for s0 in range(0, len(sources), batch_size):
        chunk = sources[s0 : s0 + batch_size]
        inp = repeat_inputs(inputs, len(chunk))
        edits = []
        for r, s in enumerate(chunk):
            l, p, f = (int(v) for v in graph.features[s])
            edits.append(Intervention(feature_site(l, "mlp"), zero, head=f, pos=p, rows=[r]))
        dem, tv = measure(inp, edits)
        for r, s in enumerate(chunk):
            measured[s] = (float(dem[r] - base_logit[0]), {t: float(tv[t][r] - base_t[t][0]) for t in targets})
    rows = []
    A64 = graph.rows.double()
    preds = propagate_many(graph, sources, A64)  # sources: the claims' sources, sorted
    for c in claims:
        pred = preds[:, sources.index(c.source)]
        m_logit, m_t = measured[c.source]
        m = m_logit if c.target == logit else m_t[c.target]
        p_tot = float(pred[c.target])
        ratio = m / p_tot if p_tot != 0 else float("nan")
        sign = bool(np.sign(m) == np.sign(p_tot) and p_tot != 0)
        rows.append(
            {
                "claim": "feature -> logit" if c.target == logit else "feature -> feature",
                "source": graph.label(c.source),
                "target": graph.label(c.target),
                "predicted_direct": -graph.weight(c.target, c.source),
                "predicted_total": p_tot,
                "measured": m,
                "ratio": ratio,
                "sign_right": sign,
                "agree": bool(sign and 1 / tolerance <= ratio <= tolerance),
                "source_node": c.source,
                "target_node": c.target,
            }
        )
    table = pd.DataFrame(rows, columns=AUDIT_COLUMNS)
    return table.sort_values(["agree", "claim"], kind="stable").reset_index(drop=True)


def audit_lines(table: pd.DataFrame, tolerance: float = 2.0) -> list[str]:
    """The printed audit, disagreements first (the layout of ``circuit``'s paths table)."""
    if not len(table):
        return ["audit: no kept feature to audit"]
    n_dis = int((~table["agree"]).sum())
    out = [
        f"the graph's claims checked on the real model by zeroing the feature ({n_dis} of {len(table)} disagree; "
        f"the sign is right in {table['sign_right'].mean():.0%}; a claim agrees when the measured change has its "
        f"sign and lies within x{tolerance:g} of the graph's total effect):"
    ]
    for x in table.itertuples():
        out.append(
            f"  {'agree   ' if x.agree else 'DISAGREE'} {x.claim}: zero {x.source}, {x.target}: the graph says "
            f"{x.predicted_total:+.4g} (direct {x.predicted_direct:+.4g}); the model moves {x.measured:+.4g}"
        )
    return out
