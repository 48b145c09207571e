"""Decision flips by zeroing attention items (Serrano & Smith, ACL 2019, "Is Attention Interpretable?").

Items are the key positions of a text. Zeroing item ``j`` sets ``A[l, h, q, j] = 0`` for every head
and query row of the chosen layers (``last``: the final layer, the analogue of the paper's single
attention layer feeding the classifier; ``all``: every layer) and renormalises each row over the
items left (a row with nothing left keeps its weights). Items are zeroed cumulatively in the order of
a ranking; ``flip_fraction`` is ``k / n`` for the first ``k`` at which the argmax changes (NaN and
``flipped = 0`` when it never does before only one item is left). Rankings:

* ``attention``: attention paid by the explained position ([CLS] or last token) to the item, mean
  over heads (and over the chosen layers) -- the heatmap's claim;
* ``gradient``: ``sum_{l,h,q} dF/dA[l,h,q,j]`` (F = probability of the predicted class);
* ``attention_x_gradient``: ``sum_{l,h,q} A * dF/dA`` (first-order estimate of zeroing the item);
* ``random``: a seeded permutation;
* every evaluated method's token scores (e.g. ``integrated_gradients``), item j = token j.

Also the JS divergence (bits) between the output distribution and the output with only the
top-attention item zeroed (``js_top``) vs one random other item zeroed (``js_random``).
The paper's attention is a single layer over RNN states; here the layer set is a parameter.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..models.adapter import Forward, Inputs, ModelAdapter, at_least_float32
from ..settings import layers_of
from ..stats import js_divergence_t
from .common import output_map, unique_rows
from .frozen import FrozenRecords, frozen_below

INTERNAL_RANKINGS = ("attention", "gradient", "attention_x_gradient", "random")


def flip_layers(adapter: ModelAdapter, spec: str) -> list[int]:
    return layers_of(adapter, spec)  # last, all or a layer number in range (no wrapping)


def attention_item_scores(
    adapter: ModelAdapter, inp: Inputs, pred: Sequence[int], layers: list[int], fwd: Forward | None = None
) -> list[dict[str, np.ndarray]]:
    """attention / gradient / attention x gradient item scores per text, one padded batch; ``fwd``: that
    batch's forward pass already run with the ``layers``' patterns recorded in the graph (``keep_grad``)."""
    sites = [f"layers.{l}.attn.pattern" for l in layers]
    if fwd is None:
        fwd = adapter.forward(inp, record=sites, keep_grad=True, grad=True)
    idx = torch.as_tensor(list(pred), dtype=torch.long)
    f = torch.softmax(at_least_float32(fwd.logits), -1).gather(1, idx.view(-1, 1).to(fwd.logits.device)).sum()
    pats = [fwd.cache[s] for s in sites]
    grads = torch.autograd.grad(f, pats)
    out = []
    for b, n in enumerate(inp.lengths):
        pos = adapter.explained_position(n)
        a = torch.stack([p[b, :, :n, :n].detach() for p in pats]).double()  # [L, H, q, k]
        g = torch.stack([gr[b, :, :n, :n] for gr in grads]).double()
        out.append(
            {
                "attention": a[:, :, pos, :].mean((0, 1)).cpu().numpy(),
                "gradient": g.sum((0, 1, 2)).cpu().numpy(),
                "attention_x_gradient": (a * g).sum((0, 1, 2)).cpu().numpy(),
            }
        )
    return out


def _zero_edit(keep: list[np.ndarray], layers: list[int]):
    """Edit builder: rows' keep masks ``[rows, n]`` applied at the chosen layers, then renormalised."""

    def build(group: list[int], width: int) -> dict:
        k = torch.ones((len(group), width), dtype=torch.float32)
        for r, i in enumerate(group):
            k[r, : keep[i].shape[0]] = torch.as_tensor(keep[i], dtype=torch.float32)

        def fn(p: torch.Tensor) -> torch.Tensor:
            kk = k.to(p.device, p.dtype)[:, None, None, :]
            z = p * kk
            s = z.sum(-1, keepdim=True)
            return torch.where(s > 0, z / s.clamp_min(torch.finfo(p.dtype).tiny), p)

        return {f"layers.{l}.attn.pattern": fn for l in layers}

    return build


def decision_flip(
    adapter: ModelAdapter,
    inp: Inputs,
    probs: np.ndarray,
    rankings: list[dict[str, np.ndarray]],
    layers: list[int],
    seeds: Sequence[int],
    budget: int | None,
    records: FrozenRecords | None = None,
) -> list[dict[str, dict[str, float]]]:
    """Per text: ranking name -> {flip_fraction, flipped, [js_top, js_random]}.

    ``rankings[b]`` maps a ranking name to item scores ``[n_b]``; ``random`` is added here. ``records``: the
    lower layers' outputs shared with other metrics of the same texts (frozen.py)."""
    rows = inp.rows()
    plan_rows: list[list[int]] = []
    keeps: list[np.ndarray] = []
    where: list[tuple[int, str, int]] = []  # (text, ranking, k) per planned row
    for b, ids in enumerate(rows):
        n = len(ids)
        rng = np.random.default_rng(seeds[b])
        ranks = dict(rankings[b])
        ranks["random"] = rng.permutation(n).astype(np.float64)[::-1].copy()
        rankings[b] = ranks
        for name, s in ranks.items():
            order = np.argsort(-np.asarray(s, np.float64), kind="stable")
            keep = np.ones(n, dtype=np.float32)
            for k in range(1, n):
                keep = keep.copy()
                keep[order[k - 1]] = 0.0
                plan_rows.append(ids)
                keeps.append(keep)
                where.append((b, name, k))
        if n > 1:  # JS: the top attention item vs a random other item
            top = int(np.argmax(rankings[b]["attention"]))
            other = int(rng.choice([j for j in range(n) if j != top]))
            for name, j in (("js_top", top), ("js_random", other)):
                keep = np.ones(n, dtype=np.float32)
                keep[j] = 0.0
                plan_rows.append(ids)
                keeps.append(keep)
                where.append((b, name, 1))
    out: list[dict[str, dict[str, float]]] = [
        {name: {"flip_fraction": float("nan"), "flipped": 0.0} for name in rankings[b]} for b in range(len(rows))
    ]
    if not plan_rows:
        return out
    owner = np.array([b for b, _, _ in where])
    ref = torch.as_tensor(np.asarray(probs, np.float64))

    def reduce(group: list[int], p: torch.Tensor) -> torch.Tensor:
        # per row: the argmax and the JS divergence from the unedited output (a causal LM's
        # vocabulary makes keeping every row's distribution too large)
        return torch.stack([p.argmax(-1).double(), js_divergence_t(p, ref[owner[group]].to(p.device))], 1)

    # every row of text b is b's ids with keys zeroed at ``layers``: the layers below run once (frozen.py), and
    # rankings that zero the same items at step k (a shared top item, js_top = attention's first row) share a row
    res = np.zeros((len(plan_rows), 2))
    for b in range(len(rows)):
        mine = np.flatnonzero(owner == b)
        if not len(mine):
            continue
        firsts, where_u = unique_rows([keeps[i].tobytes() for i in mine])
        every, mine = mine, mine[firsts]

        def reduce_b(group: list[int], p: torch.Tensor, mine: np.ndarray = mine) -> torch.Tensor:
            return reduce(mine[group].tolist(), p)

        with frozen_below(adapter, Inputs.from_ids(adapter, [rows[b]], strings=False), min(layers), records):
            res[every] = output_map(
                adapter, [plan_rows[i] for i in mine], budget, reduce_b, 2, _zero_edit([keeps[i] for i in mine], layers)
            )[where_u]
    for r, (b, name, k) in enumerate(where):
        if name in ("js_top", "js_random"):
            out[b]["attention"][name] = float(res[r, 1])
            continue
        d = out[b][name]
        if not d["flipped"] and int(res[r, 0]) != int(np.argmax(probs[b])):
            d["flipped"] = 1.0
            d["flip_fraction"] = k / len(rows[b])
    return out
