"""QK attributions in feature units (Kamath, Ameisen et al. 2025; METHODS.md §13): why a head attended from a
query to a key, as a bilinear sum over (query-side node, key-side node) pairs of the attribution graph.

Through the replacement model (:mod:`.replacement`) the residual stream entering layer ``l`` at position ``i`` is
a sum of what every node writes there, ``x_i = Σ_X c_i(X) + r_i``: features, error nodes and token embeddings
(each read by backward passes from the ``d`` components of ``x_i``; a node reaches ``i`` directly or through
frozen heads of earlier layers), and ``r_i`` what no node carries (``b_dec``'s, output biases, position
embeddings). From there the machinery is :mod:`streetlamp.interventions.qk`'s, with nodes as its parts: the
pre-attention norm linearised with the token's own scale (``lin_i``), ``q_i(X) = R_i W_Q lin_i(c_i(X))`` via
:func:`~streetlamp.models.readout.query_key` with ``bias=False`` (RoPE applied at position ``i``: exact,
the rotation is linear), the bias part ``R_i (W_Q β + b_Q)`` as there, and
``s_ij = Σ_{X, Y} q_i(X) · k_j(Y) · scale`` exactly. The table is reported as each node's query-side share
``q_i(X) · k_j · scale`` (summing to the score over X), key-side share ``q_i · k_j(Y) · scale``, and the top pairs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ...errors import StreetlampError
from ...models.adapter import ModelAdapter
from ...models.readout import attention_scaling, check_lens, pre_attn_norm, query_key
from ..engine import check_layer_head
from .attribution import Replacement
from .replacement import check_replacement

__all__ = ["FeatureQK", "feature_qk"]


@dataclass
class FeatureQK:
    layer: int
    head: int
    query: int
    key: int
    labels: list[str]  # one per part: the nodes, then "not a node (biases)", then "b_Q/b_K and norm bias"
    q_side: np.ndarray  # [part] q_i(X) · k_j · scale: sums to score
    k_side: np.ndarray  # [part] q_i · k_j(Y) · scale: sums to score
    pairs: list[tuple[str, str, float]]  # the top (query part, key part, q_i(X) · k_j(Y) · scale)
    score: float  # the head's pre-softmax score recomputed from the weights (before any soft-cap)
    pattern: float  # the model's attention weight from query to key
    q_parts: np.ndarray  # [part, d_head] q_i(X), rotated (RoPE at the query's position)
    k_parts: np.ndarray  # [part, d_head] k_j(Y), rotated at the key's position
    features: list[tuple[int, int, int]] = field(default_factory=list)  # (layer, pos, feature) of the first parts
    scale: float = 1.0  # the head's score scale (q · k · scale)


def _labels(rep: Replacement, adapter: ModelAdapter, ids: torch.Tensor) -> list[str]:
    toks = [adapter.token_label(t) for t in adapter.tokenizer.convert_ids_to_tokens(ids.tolist())]
    out = [f"L{l} F{f} @{p}" for l, p, f in rep.feats]
    out += [f"L{l} error @{p}" for l in range(rep.L) for p in range(rep.n)]
    out += [f"token {toks[p]!r} @{p}" for p in range(rep.n)]
    return out


def _qk_map(adapter: ModelAdapter, layer: int, head: int, pos: int, full: torch.Tensor, side: int) -> torch.Tensor:
    """``[d_head, d]``: the linear map from a normalised input at position ``pos`` to the head's rotated query
    (side 0) or key (side 1) there (qk.py's query_key, bias left out, applied to the basis vectors)."""
    d = full.shape[-1]
    cols = []
    for c in range(d):
        z = torch.zeros(pos + 1, d, dtype=torch.float64, device=full.device)
        z[pos, c] = 1.0
        cols.append(query_key(adapter, layer, z, bias=False, full=full[: pos + 1])[side][pos, head])
    return torch.stack(cols, 1)


def feature_qk(
    adapter: ModelAdapter,
    ids: torch.Tensor,
    layer: int,
    head: int,
    query: int,
    key: int | None = None,
    *,
    top: int = 10,
    batch_size: int = 4,
    zero_bos: bool = True,
    rep: Replacement | None = None,
) -> FeatureQK:
    """Head (layer, head)'s score from ``query`` to ``key`` (default: where it attends most) in node units.
    ``rep``: a retained replacement pass on ``ids`` (``batch_size`` copies, the same ``zero_bos``) that records
    ``layers.{layer}.resid_pre`` and ``layers.{layer}.attn.pattern``, shared by several heads (one forward pass
    instead of one per head; the same values)."""
    check_replacement(adapter)
    check_lens(adapter)
    check_layer_head(adapter, layer, head)
    ids = ids.view(-1).cpu()
    n = int(ids.shape[0])
    if not 0 <= query < n:
        raise StreetlampError(f"query position {query} out of range: the text has positions 0..{n - 1}")
    site = f"layers.{layer}.resid_pre"
    d = adapter.d_model
    B = max(1, int(batch_size))
    if rep is None:
        rep = Replacement(adapter, ids, B, zero_bos, record=(site, f"layers.{layer}.attn.pattern"))
    row = rep.cache[f"layers.{layer}.attn.pattern"][0, head, query].double().cpu().numpy()
    if key is None:
        key = int(np.argmax(row))
    if not 0 <= key <= query:
        raise StreetlampError(f"key position {key} is not visible from query {query}")
    x = rep.cache[site]  # [B, n, d], in the graph
    x0 = x[0].detach().double()
    norm = pre_attn_norm(adapter, layer)
    scale = norm.scale(x0)  # [n, 1]
    z = norm(x0)
    s = attention_scaling(adapter, layer)
    eye = torch.eye(d, dtype=torch.float64, device=x0.device)
    side_vecs = []
    for side, pos in ((0, query), (1, key)):
        M = _qk_map(adapter, layer, head, pos, z, side)  # [d_head, d]
        # the whole linear map from the residual at ``pos`` to the rotated query / key there (the norm linearised
        # with the token's own scale): every node's part of q_i (k_j) is P applied to what it writes at ``pos``,
        # so the rows are read for the d_head coordinates of P x, not for the d coordinates of x
        P = norm.linear(eye, scale[pos]) @ M.t()  # [d, d_head]
        Px = P.to(x.dtype)
        rows = []
        for r0 in range(0, P.shape[1], B):
            rs = list(range(r0, min(P.shape[1], r0 + B)))
            rows.append(rep.rows([x[b, pos] @ Px[:, r] for b, r in enumerate(rs)], dtype=torch.float64))
        parts = torch.cat(rows).t().to(x0.device)  # [n_cols, d_head]
        rest = x0[pos] @ P - parts.sum(0)  # what no node carries
        bias_in = norm.beta(d).expand_as(x0)
        qb = query_key(adapter, layer, bias_in, bias=True, full=z)[side][pos, head]
        side_vecs.append(torch.cat([parts, rest[None], qb[None]]))  # [P, d_head]
    Q, K = side_vecs
    q_tot, k_tot = Q.sum(0), K.sum(0)
    score = float(q_tot @ k_tot * s)
    q_side = (Q @ k_tot * s).cpu().numpy()
    k_side = (K @ q_tot * s).cpu().numpy()
    labels = _labels(rep, adapter, ids) + ["not a node (biases)", "b_Q/b_K and norm bias"]
    qi = np.argsort(-np.abs(q_side), kind="stable")[: 4 * top]
    ki = np.argsort(-np.abs(k_side), kind="stable")[: 4 * top]
    T = (Q[qi] @ K[ki].t() * s).cpu().numpy()
    flat = np.argsort(-np.abs(T), axis=None, kind="stable")[:top]
    pairs = []
    for f in flat:
        a, b = np.unravel_index(f, T.shape)
        pairs.append((labels[qi[a]], labels[ki[b]], float(T[a, b])))
    return FeatureQK(
        layer,
        head,
        query,
        key,
        labels,
        q_side,
        k_side,
        pairs,
        score,
        float(row[key]),
        Q.cpu().numpy(),
        K.cpu().numpy(),
        features=list(rep.feats),
        scale=s,
    )
