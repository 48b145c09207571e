"""Why a head attends there: QK attribution, joined with what the head's output does.

For head ``h`` of layer ``l``, query ``i`` and key ``j``, the pre-softmax score is
``s_ij = q_i · k_j · scale`` with ``q_i = R_i W_Q norm(x_i) + R_i b_Q`` (``R_i`` the rotary
rotation, identity for GPT-2) and likewise ``k_j``. The layer's input is a sum of upstream parts,
``x = embed + Σ_{l'<l} (Σ_h head_l',h + b_O,l' + mlp_l')``. With the pre-attention norm
linearised with each token's own scale (``norm(x_i) = Σ_c lin_i(c_i) + β``, exact at that token),
``q_i = Σ_c q_i(c) + q_i(bias)`` with ``q_i(c) = R_i W_Q lin_i(c_i)`` and
``q_i(bias) = R_i (W_Q β + b_Q)``, and the score splits exactly into
``s_ij = Σ_{c, c'} q_i(c) · k_j(c') · scale``: a ``[query part, key part]`` table.

Per family (facts in :mod:`streetlamp.models.readout`): the parts are what each component *writes* into
the residual stream (Gemma's sandwich norms: a head's write linearised with the scale of its layer's
whole attention output, as in direct logit attribution); Qwen3's and Gemma 3's per-head
``q_norm``/``k_norm`` are linearised with the scale of the whole query / key of that token and head
(``q_i(c) = R_i (W_Q lin_i(c_i)) / rms(q_i) · γ_q``), like the other norms: exact for the sum;
Phi-3's fused ``qkv_proj`` is split into its W_Q and W_K rows. **Gemma 2's attention-logit soft-cap**
``cap · tanh(s / cap)`` is not linear: the table splits the score **before** the cap, ``s_ij``
(``score``); ``capped_score`` is what enters the softmax. Sliding-window layers mask keys outside the
window (``row_scores`` -inf there; such a key cannot be chosen).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import StreetlampError
from ..methods.gradient import ids_inputs
from ..models.adapter import ModelAdapter, Target
from ..models.attention_block import output_weights
from ..models.readout import (
    attention_scaling,
    attention_softcap,
    check_lens,
    pre_attn_norm,
    query_key,
    sliding_window,
)
from .engine import Intervention, check_layer_head, run, zero
from .lens import attn_writes, direct_logit_attribution, mlp_writes


@dataclass
class QKAttribution:
    layer: int
    head: int
    query: int
    key: int
    parts: list[str]  # names of the upstream parts (the last is "bias")
    table: np.ndarray  # [query part, key part], sums to score
    score: float  # the head's score q·k·scale recomputed from the weights (before any soft-cap)
    pattern_row: np.ndarray  # the model's attention of this head from the query, [key]
    row_scores: np.ndarray  # recomputed pre-softmax scores of the whole row [key], soft-capped (masked keys: -inf)
    capped_score: float = float("nan")  # the score as it enters the softmax (= score without a soft-cap)
    softcap: float | None = None  # the layer's attention-logit soft-cap (Gemma 2)


def _parts(adapter: ModelAdapter, cache: dict[str, torch.Tensor], layer: int) -> tuple[list[str], torch.Tensor]:
    """Names and values ``[part, pos, d]`` of everything written to the residual before ``layer``."""
    names, vals = ["embed"], [cache["layers.0.resid_pre"][0]]
    for l in range(layer):
        out_l = cache[f"layers.{l}.attn.out"][0]  # [pos, d]
        ho = attn_writes(adapter, l, cache[f"layers.{l}.attn.head_out"][0].transpose(0, 1), out_l)  # [head, pos, d]
        for h in range(adapter.n_heads):
            names.append(f"L{l}H{h}")
            vals.append(ho[h])
        _, b_o = output_weights(adapter, l)
        if b_o is not None:
            names.append(f"L{l} attn bias")
            vals.append(attn_writes(adapter, l, b_o.to(ho.device).expand_as(ho[0]), out_l))
        names.append(f"L{l} MLP")
        vals.append(mlp_writes(adapter, l, cache[f"layers.{l}.mlp.out"][0]))
    return names, torch.stack([v.double() for v in vals])


def qk_attribution(
    adapter: ModelAdapter, ids: torch.Tensor, layer: int, head: int, query: int, key: int | None = None
) -> QKAttribution:
    """Split head (layer, head)'s score from ``query`` to ``key`` (default: where it attends most)."""
    check_lens(adapter)
    check_layer_head(adapter, layer, head)
    ids = ids.view(-1)
    n = ids.shape[0]
    if not 0 <= query < n:
        raise StreetlampError(f"query position {query} out of range: the text has positions 0..{n - 1}")
    sites = ["layers.0.resid_pre", f"layers.{layer}.resid_pre", f"layers.{layer}.attn.pattern"] + [
        f"layers.{l}.{s}" for l in range(layer) for s in ("attn.head_out", "attn.out", "mlp.out")
    ]
    with torch.no_grad():
        fwd = adapter.forward(ids_inputs(adapter, ids), record=sites)
        row = fwd.cache[f"layers.{layer}.attn.pattern"][0, head, query].double().cpu().numpy()
        window = sliding_window(adapter, layer)
        first = 0 if window is None else max(0, query - window + 1)
        if key is None:
            key = int(np.argmax(row))
        if not first <= key <= query:
            raise StreetlampError(
                f"key position {key} is not visible from query {query} "
                f"({'causal' if window is None else f'sliding window {window}'}: {first}..{query})"
            )
        names, parts = _parts(adapter, fwd.cache, layer)
        norm = pre_attn_norm(adapter, layer)
        x = fwd.cache[f"layers.{layer}.resid_pre"][0].double()
        scale = norm.scale(x)  # [pos, 1]: each token's own
        lin = norm.linear(parts, scale[None])  # [part, pos, d]
        P = lin.shape[0]
        q_parts, k_parts = [], []
        z = norm(x)
        for p in range(P):
            q, k = query_key(adapter, layer, lin[p], bias=False, full=z)
            q_parts.append(q[query, head])
            k_parts.append(k[key, head])
        bias_in = norm.beta(x.shape[-1]).expand_as(x)
        qb, kb = query_key(adapter, layer, bias_in, bias=True, full=z)
        names = names + ["bias"]
        q_parts.append(qb[query, head])
        k_parts.append(kb[key, head])
        s = attention_scaling(adapter, layer)
        table = (torch.stack(q_parts) @ torch.stack(k_parts).t() * s).cpu().numpy()
        qf, kf = query_key(adapter, layer, z, bias=True)
        raw = (kf[:, head] @ qf[query, head]) * s
        cap = attention_softcap(adapter, layer)
        scores = torch.tanh(raw / cap) * cap if cap else raw.clone()
        scores[query + 1 :] = -np.inf
        scores[:first] = -np.inf
    return QKAttribution(
        layer,
        head,
        query,
        key,
        names,
        table,
        float(raw[key]),
        row,
        scores.cpu().numpy(),
        capped_score=float(scores[key]),
        softcap=cap,
    )


def head_table(
    adapter: ModelAdapter, ids: torch.Tensor, layer: int, head: int, query: int, index: int, top: int = 5
) -> dict:
    """Where the head looks, why (top QK parts), and whether it matters (zero ablation, DLA), as one
    ``{"title", "columns", "rows"}`` table plus the raw arrays."""
    qk = qk_attribution(adapter, ids, layer, head, query)
    labels = [adapter.token_label(t) for t in adapter.tokenizer.convert_ids_to_tokens(ids.view(-1).tolist())]
    target = Target(index=index, quantity="logit")
    inputs = ids_inputs(adapter, ids.view(-1))
    with torch.no_grad():
        base = adapter.score(adapter.forward(inputs).logits, torch.tensor([index]), target)[0]
        abl = run(adapter, inputs, [Intervention(f"layers.{layer}.attn.z", zero, head=head)])
        ablated = adapter.score(abl.logits, torch.tensor([index]), target)[0]
    dla = direct_logit_attribution(adapter, ids, index)
    rows = []
    for j in np.argsort(-qk.pattern_row, kind="stable")[:top]:
        rows.append(["looks at", f"{j} {labels[j]!r}", float(qk.pattern_row[j])])
    qside, kside = qk.table.sum(1), qk.table.sum(0)
    for name, v in sorted(zip(qk.parts, qside), key=lambda t: -abs(t[1]))[:top]:
        rows.append(["why (query side)", name, float(v)])
    for name, v in sorted(zip(qk.parts, kside), key=lambda t: -abs(t[1]))[:top]:
        rows.append(["why (key side)", name, float(v)])
    flat = np.argsort(-np.abs(qk.table), axis=None, kind="stable")[:top]
    for f in flat:
        a, b = np.unravel_index(f, qk.table.shape)
        rows.append(["why (query x key)", f"{qk.parts[a]} x {qk.parts[b]}", float(qk.table[a, b])])
    rows.append(
        ["score" + (" (before the soft-cap)" if qk.softcap else ""), f"query {query} -> key {qk.key}", qk.score]
    )
    if qk.softcap:
        rows.append([f"score after the soft-cap {qk.softcap:g}·tanh(s/{qk.softcap:g})", "", qk.capped_score])
    rows.append(["matters: zero-ablation effect on logit", adapter.output_label(index), float(ablated - base)])
    rows.append(["matters: direct logit attribution", adapter.output_label(index), float(dla.heads[layer, head])])
    return {
        "table": {
            "title": f"head L{layer}H{head} from query {query} ({labels[query]!r})",
            "columns": ["what", "which", "value"],
            "rows": rows,
        },
        "qk": qk,
        "ablation_effect": float(ablated - base),
        "dla": float(dla.heads[layer, head]),
    }
