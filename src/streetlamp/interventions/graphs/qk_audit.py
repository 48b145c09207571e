"""The QK attribution checked on the real model (issue 39 item 3): why a head attended, ablated.

For a head that carries a top edge of the graph (its largest head loading, :mod:`.heads`), at the edge's
(query, key) = (target position, source position): :func:`~.qk.feature_qk` splits the head's score over the
graph's nodes; the top query-side feature ``X`` (largest ``|q_i(X) · k_j|``) and the top key-side feature ``Y``
(largest ``|q_i · k_j(Y)|``) are each zeroed.

**Prediction** (the replacement model: patterns of earlier layers and every norm's denominator frozen, so the
residual entering the head's layer moves linearly with the feature): the score change at (i, j) is the bilinear
``(q − q(X)) · (k − k(X)) · scale − q · k · scale`` from the QK parts; the attention shift comes from the whole
row: the feature's effect on the layer's input at every position (a forward-mode derivative through the
replacement model: a double backward pass), the norm linearised with the clean scale, queries and keys
recomputed, soft-cap, mask and softmax applied exactly. **Measurement**: the same feature zeroed at its position
in the original model (transcoders spliced at the engine's feature site, attention and norms recomputed), the
head's attention weight at (i, j) read, and its score recomputed from the recorded residual. A row agrees when
the measured attention shift has the predicted sign and lies within a factor ``tolerance`` (2) of it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ...models.adapter import Inputs, ModelAdapter
from ...models.features import feature_site
from ...models.readout import (
    attention_scaling,
    attention_softcap,
    check_lens,
    pre_attn_norm,
    query_key,
    sliding_window,
)
from ..engine import Intervention, check_layer_head, run, zero
from .attribution import Graph, Replacement
from .qk import FeatureQK, feature_qk

__all__ = [
    "QK_AUDIT_COLUMNS",
    "QK_PAIRS_COLUMNS",
    "predicted_row",
    "qk_audit",
    "qk_audit_lines",
    "qk_explain",
    "qk_heads",
    "qk_pairs",
]

QK_AUDIT_COLUMNS = [
    "side",
    "head",
    "query_position",
    "key_position",
    "feature",
    "edge",
    "clean_attention",
    "predicted_attention_shift",
    "measured_attention_shift",
    "ratio",
    "sign_right",
    "agree",
    "predicted_score_shift",
    "measured_score_shift",
    "qk_share",
    "layer",
    "head_index",
    "feature_layer",
    "feature_position",
    "feature_index",
]


def _row_scores(adapter: ModelAdapter, layer: int, head: int, query: int, z: torch.Tensor, full: torch.Tensor):
    """Raw scores ``[key]`` of the query's row for a normalised input ``z`` (q/k norms at ``full``'s scale)."""
    q, k = query_key(adapter, layer, z, bias=True, full=full)
    return (k[: query + 1, head] @ q[query, head]) * attention_scaling(adapter, layer)


def _softmax_row(adapter: ModelAdapter, layer: int, query: int, raw: torch.Tensor) -> torch.Tensor:
    cap = attention_softcap(adapter, layer)
    s = torch.tanh(raw / cap) * cap if cap else raw.clone()
    w = sliding_window(adapter, layer)
    if w is not None:
        s[: max(0, query - w + 1)] = -torch.inf
    return torch.softmax(s, -1)


def predicted_row(
    adapter: ModelAdapter,
    ids: torch.Tensor,
    layer: int,
    head: int,
    query: int,
    feat: tuple[int, int, int],
    zero_bos: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(clean raw scores, predicted raw scores, clean softmax row, predicted softmax row) of the head's row at
    ``query`` when feature ``feat`` = (layer, position, index) is zeroed in the replacement model."""
    site = f"layers.{layer}.resid_pre"
    rep = Replacement(adapter, ids, 1, zero_bos, record=(site,))
    x = rep.cache[site][0]  # [n, d] in the graph
    l, p, f = feat
    fs = adapter.features
    assert fs is not None
    tc = fs.get(l, "mlp")
    assert tc is not None
    a = rep.cache[feature_site(l, "mlp")][0, p, f].detach()
    W_dec = tc.params(x)["W_dec"]
    assert W_dec is not None
    v = a * W_dec[f]
    u = torch.zeros_like(x, requires_grad=True)
    (g,) = torch.autograd.grad(x, rep.sinks[f"layers.{l}.mlp.out"], grad_outputs=u, create_graph=True)
    (jv,) = torch.autograd.grad((g[0, p] * v).sum(), u)  # d x / d (the feature's write), applied to its write
    x0 = x.detach().double()
    norm = pre_attn_norm(adapter, layer)
    scale = norm.scale(x0)
    z0 = norm(x0)
    z1 = norm.linear(x0 - jv.double(), scale) + norm.beta(x0.shape[-1])
    raw0 = _row_scores(adapter, layer, head, query, z0, z0)
    raw1 = _row_scores(adapter, layer, head, query, z1, z0)
    return raw0, raw1, _softmax_row(adapter, layer, query, raw0), _softmax_row(adapter, layer, query, raw1)


def qk_heads(heads: pd.DataFrame, top: int) -> list[tuple[int, int, int, int, str]]:
    """(layer, head, query, key, edge label) for the ``top`` largest edges' largest-loading heads, distinct."""
    out: list[tuple[int, int, int, int, str]] = []
    seen = set()
    for _, grp in heads.groupby(["target_node", "source_node"], sort=False):
        hs = grp[grp.carrier != "composition"]
        if not len(hs):
            continue
        r = hs.iloc[int(np.argmax(hs.loading.abs().to_numpy()))]
        key = (int(r["layer"]), int(r["head"]), int(r["target_position"]), int(r["source_position"]))
        if key in seen:
            continue
        seen.add(key)
        out.append((*key, f"{r['source']} -> {r['target']}"))
        if len(out) >= top:
            break
    return out


def qk_explain(
    adapter: ModelAdapter,
    graph: Graph,
    heads: list[tuple[int, int, int, int, str]],
    *,
    top: int = 10,
    batch_size: int = 4,
) -> list[FeatureQK]:
    """:func:`~.qk.feature_qk` for each of ``heads`` (from :func:`qk_heads`) at its edge's (query, key)."""
    ids = torch.as_tensor(graph.ids)
    zero_bos = bool(graph.info.get("zero_bos", False))
    if not heads:
        return []
    check_lens(adapter)
    for layer, head, *_ in heads:
        check_layer_head(adapter, layer, head)
    # one retained replacement pass for every head (it records each head's layer input and pattern)
    layers = sorted({layer for layer, *_ in heads})
    record = tuple(s for l in layers for s in (f"layers.{l}.resid_pre", f"layers.{l}.attn.pattern"))
    rep = Replacement(adapter, ids.view(-1).cpu(), max(1, int(batch_size)), zero_bos, record=record)
    return [
        feature_qk(adapter, ids, layer, head, query, key, top=top, batch_size=batch_size, zero_bos=zero_bos, rep=rep)
        for layer, head, query, key, _ in heads
    ]


QK_PAIRS_COLUMNS = [
    "head",
    "query_position",
    "key_position",
    "edge",
    "attention",
    "score",
    "kind",
    "rank",
    "query_part",
    "key_part",
    "contribution",
    "share_of_score",
    "layer",
    "head_index",
]


def qk_pairs(explained: list[FeatureQK], heads: list[tuple[int, int, int, int, str]], top: int = 10) -> pd.DataFrame:
    """Why each head attended, in node units (the QK attribution of :func:`qk_explain`), one table: per head,
    ``kind`` "pair" rows (the top (query-side part, key-side part) terms ``q_i(X) · k_j(Y) · scale``, largest
    first), then "query side" rows (the ``top`` largest ``q_i(X) · k_j · scale``, then one "other parts" row
    holding the rest, so a head's query-side rows sum to its score) and "key side" rows alike."""
    rows = []
    for fq, (_, _, _, _, edge) in zip(explained, heads):
        base = {
            "head": f"L{fq.layer}H{fq.head}",
            "query_position": fq.query,
            "key_position": fq.key,
            "edge": edge,
            "attention": fq.pattern,
            "score": fq.score,
            "layer": fq.layer,
            "head_index": fq.head,
        }
        for r, (qp, kp, v) in enumerate(fq.pairs, 1):
            rows.append({**base, "kind": "pair", "rank": r, "query_part": qp, "key_part": kp, "contribution": v})
        for kind, share, col, other in (
            ("query side", fq.q_side, "query_part", "key_part"),
            ("key side", fq.k_side, "key_part", "query_part"),
        ):
            order = np.argsort(-np.abs(share), kind="stable")
            for r, i in enumerate(order[:top], 1):
                rows.append(
                    {
                        **base,
                        "kind": kind,
                        "rank": r,
                        col: fq.labels[i],
                        other: "(all)",
                        "contribution": float(share[i]),
                    }
                )
            rest = order[top:]
            if len(rest):
                rows.append(
                    {
                        **base,
                        "kind": kind,
                        "rank": top + 1,
                        col: f"other parts ({len(rest)})",
                        other: "(all)",
                        "contribution": float(share[rest].sum()),
                    }
                )
    table = pd.DataFrame(rows, columns=QK_PAIRS_COLUMNS)
    table["share_of_score"] = table["contribution"] / table["score"].where(table["score"] != 0)
    return table


def qk_audit(
    adapter: ModelAdapter,
    graph: Graph,
    heads: list[tuple[int, int, int, int, str]],
    *,
    tolerance: float = 2.0,
    batch_size: int = 4,
    explained: list[FeatureQK] | None = None,
) -> pd.DataFrame:
    """One row per (head, side): the top query-side / key-side feature zeroed, predicted vs measured.
    ``explained``: :func:`qk_explain`'s result for ``heads`` when already computed."""
    ids = torch.as_tensor(graph.ids)
    zero_bos = bool(graph.info.get("zero_bos", False))
    inputs = Inputs.from_ids(adapter, [graph.ids])
    if explained is None:
        explained = qk_explain(adapter, graph, heads, batch_size=batch_size)
    rows = []
    for (layer, head, query, key, edge), fq in zip(heads, explained):
        nf = len(fq.features)
        if not nf:
            continue
        Q, K = torch.as_tensor(fq.q_parts), torch.as_tensor(fq.k_parts)
        q, k = Q.sum(0), K.sum(0)
        below = np.array([fl < layer for fl, _, _ in fq.features])  # only earlier layers' features reach the head
        picks = []
        for side, share in (("query", fq.q_side[:nf]), ("key", fq.k_side[:nf])):
            mag = np.where(below, np.abs(share), 0.0)
            if mag.max(initial=0.0) > 0:
                picks.append((side, int(np.argmax(mag))))
        if not picks:
            continue
        site = f"layers.{layer}.resid_pre"
        pat = f"layers.{layer}.attn.pattern"
        with torch.no_grad():
            clean = run(adapter, inputs, [], record=[site, pat])
        norm = pre_attn_norm(adapter, layer)
        xc = clean.cache[site][0].double()
        raw_c = _row_scores(adapter, layer, head, query, norm(xc), norm(xc))
        for side, i in picks:
            feat = fq.features[i]
            bilinear = float(((q - Q[i]) @ (k - K[i]) - q @ k) * fq.scale)
            _, _, p0, p1 = predicted_row(adapter, ids, layer, head, query, feat, zero_bos)
            l, p, f = feat
            with torch.no_grad():
                m = run(
                    adapter, inputs, [Intervention(feature_site(l, "mlp"), zero, head=f, pos=p)], record=[site, pat]
                )
            xm = m.cache[site][0].double()
            raw_m = _row_scores(adapter, layer, head, query, norm(xm), norm(xm))
            a_clean = float(clean.cache[pat][0, head, query, key])
            meas = float(m.cache[pat][0, head, query, key]) - a_clean
            pred = float(p1[key] - p0[key])
            ratio = meas / pred if pred != 0 else float("nan")
            sign = bool(pred != 0 and np.sign(meas) == np.sign(pred))
            rows.append(
                {
                    "side": side,
                    "head": f"L{layer}H{head}",
                    "query_position": query,
                    "key_position": key,
                    "feature": f"L{l} F{f} @{p}",
                    "edge": edge,
                    "clean_attention": a_clean,
                    "predicted_attention_shift": pred,
                    "measured_attention_shift": meas,
                    "ratio": ratio,
                    "sign_right": sign,
                    "agree": bool(sign and 1 / tolerance <= ratio <= tolerance),
                    "predicted_score_shift": bilinear,
                    "measured_score_shift": float(raw_m[key] - raw_c[key]),
                    "qk_share": float(fq.q_side[i] if side == "query" else fq.k_side[i]),
                    "layer": layer,
                    "head_index": head,
                    "feature_layer": l,
                    "feature_position": p,
                    "feature_index": f,
                }
            )
    table = pd.DataFrame(rows, columns=QK_AUDIT_COLUMNS)
    return table.sort_values(["agree"], kind="stable").reset_index(drop=True)


def qk_audit_lines(table: pd.DataFrame, tolerance: float = 2.0) -> list[str]:
    if not len(table):
        return ["QK audit: no head with a feature on either side to ablate"]
    n_ok = int(table["agree"].sum())
    out = [
        f"why the heads attended, checked on the real model by zeroing the top query-side / key-side feature: "
        f"{n_ok} of {len(table)} agree (attention shift with the predicted sign, within x{tolerance:g}; sign right "
        f"in {table['sign_right'].mean():.0%}):"
    ]
    for x in table.itertuples():
        out.append(
            f"  {'agree   ' if x.agree else 'DISAGREE'} {x.head} {x.query_position}->{x.key_position} "
            f"(attention {x.clean_attention:.3f}), {x.side}-side {x.feature} zeroed: the graph says attention "
            f"{x.predicted_attention_shift:+.4g} (score {x.predicted_score_shift:+.4g}); the model moves "
            f"{x.measured_attention_shift:+.4g} (score {x.measured_score_shift:+.4g})"
        )
    return out
