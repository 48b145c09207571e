"""The seed's workflow, automated (issue 24 item 5): the highest paths that the attribution matrices
and the discovered circuit name, each checked by real edge patching.

**From a token-to-token matrix to a component path.** A matrix method gives, per layer ``l``, a
token-mixing matrix ``C_l`` ``[query i, key j]`` and the part of it each head carries, ``P_{l,h}``
(the rest is the residual, which is no head's):

* ``rollout`` (Abnar & Zuidema): ``C_l = Â_l = (0.5·mean_h A_{l,h} + 0.5·I) / Z`` (the method's own
  :func:`~streetlamp.methods.rollout.residual_attention`), ``P_{l,h} = 0.5·A_{l,h} / (H·Z)``, so
  ``Σ_h P_{l,h} + 0.5·I/Z = C_l`` and ``C_{L-1} ⋯ C_0`` is the method's ``matrix``.
* ``alti`` (Ferrando et al.): ``C_l`` = ALTI's per-layer ``contributions``; off the diagonal a
  route ``j -> i`` is all attention, split among the heads by their Kobayashi norms
  ``‖A_{l,h}[i,j] f_h(x_j)‖`` (the ``norm`` method's ``norm_heads``); the diagonal holds the residual
  and is given to no head.
* ``attention_attribution`` (Hao et al.): ``P_{l,h} = max(Attr_{l,h}, 0)`` (each route's own effect on
  the explained output, as the paper's attribution tree keeps positive routes); it is no flow, so
  routes are chained at the shared position with nothing in between (``C_l = I``).

A path's score is the flow, summed over the source tokens ``D`` where the clean and corrupted
prompts differ (every token when there is no corrupted prompt), to the explained position ``p``:

* sender head ``S = (l, h)`` -> ``logits``: ``Σ_{t∈D} [Out_l · P_{l,h} · In_l]_{p,t}``;
* sender ``S = (l1, h1)`` -> receiver head ``R = (l2, h2)``'s **value** input:
  ``Σ_{t∈D} [Out_{l2} · P_{l2,h2} · Mid · P_{l1,h1} · In_{l1}]_{p,t}``,

with ``In_l = C_{l-1} ⋯ C_0``, ``Mid = C_{l2-1} ⋯ C_{l1+1}``, ``Out_l = C_{L-1} ⋯ C_{l+1}`` (identity
when empty). A token matrix moves values along attention, so it names value inputs only (never q or
k) and never an MLP (an MLP mixes no tokens). With grouped-query attention a key/value group's score is
the sum over its heads. The matrices do not separate a direct write from one relayed by heads in
between (``Mid``), while the patched edge is the direct one: where relays carry the flow the two differ,
which is what the table is for.

**Patching.** Every named edge is patched exactly by the circuit engine
(:func:`streetlamp.interventions.circuits.scores.exact`: that edge alone fed the ablated value),
per prompt; the effect is the mean over prompts with a percentile bootstrap interval. A path
**matters** when ``|effect| >= threshold · |m(model) − m(empty circuit)|`` and its interval excludes
0; a matrix path agrees when it matters; a circuit edge when it matters with the sign its score gave.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from ...interventions.circuits import scores as S
from ...interventions.circuits.graph import Graph
from ...interventions.circuits.tasks import PairSet
from ...methods.registry import get_method
from ...methods.rollout import residual_attention
from ...models.adapter import ModelAdapter, Target

MATRIX_METHODS = ("rollout", "attention_attribution", "alti")


@dataclass
class Routes:
    """One prompt's routes for one method: ``P`` ``[L, H, n, n]`` (head h's part of layer l's route
    ``j -> i``) and ``C`` ``[L, n, n]`` (the layer's whole token matrix; None = identity)."""

    P: np.ndarray
    C: np.ndarray | None


def routes(adapter: ModelAdapter, method: str, one: Any, target: Target, steps: int) -> Routes:
    """The head routes of ``method`` on one unpadded prompt ``one`` (an Inputs of one text), from the
    methods of the registry."""
    if method == "rollout":
        att = get_method("attention").attribute(adapter, one, target=target)[0].arrays["attention"]
        a = att.astype(np.float64)
        C = residual_attention(a, "mean")
        z = (0.5 * a.mean(1) + 0.5 * np.eye(a.shape[-1])[None]).sum(-1)  # [L, n] rollout's row sums
        return Routes(0.5 * a / (a.shape[1] * z[:, None, :, None]), C)
    if method == "alti":
        c = get_method("alti").attribute(adapter, one, target=target)[0].arrays["contributions"].astype(np.float64)
        nh = get_method("norm", per_head=True).attribute(adapter, one, target=target)[0].arrays["norm_heads"]
        nh = nh.astype(np.float64)
        share = nh / np.maximum(nh.sum(1, keepdims=True), 1e-300)
        P = c[:, None] * share
        n = c.shape[-1]
        P[:, :, np.arange(n), np.arange(n)] = 0.0  # the diagonal is the residual's
        return Routes(P, c)
    if method == "attention_attribution":
        e = get_method("attention_attribution", steps=steps).attribute(adapter, one, target=target)[0]
        return Routes(np.clip(e.arrays["attention_attribution"].astype(np.float64), 0, None), None)
    raise ValueError(f"not a matrix method: {method}")


def _chain(C: np.ndarray | None, lo: int, hi: int, n: int) -> np.ndarray:
    """``C_{hi-1} ⋯ C_lo`` (identity when ``hi <= lo`` or ``C`` is None)."""
    r = np.eye(n)
    if C is None:
        return r
    for l in range(lo, hi):
        r = C[l] @ r
    return r


def path_scores(r: Routes, p: int, source: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``logits`` ``[L, H]`` (sender -> logits) and ``heads`` ``[L1, H1, L2, H2]`` (sender -> receiver's
    value input; 0 unless l1 < l2) flows from the source tokens (``source`` ``[n]`` 0/1) to position p."""
    L, H, n, _ = r.P.shape
    u = [_chain(r.C, 0, l, n) @ source for l in range(L)]  # In_l · 1_D
    o = [_chain(r.C, l + 1, L, n)[p] for l in range(L)]  # row p of Out_l
    a = np.stack([r.P[l] @ u[l] for l in range(L)])  # [L, H, n]: what each head writes at each position
    b = np.stack([o[l] @ r.P[l] for l in range(L)])  # [L, H, n]: each head's reading toward p
    logits = np.einsum("lhi,li->lh", a, np.stack(o))
    heads = np.zeros((L, H, L, H))
    for l1 in range(L):
        for l2 in range(l1 + 1, L):
            heads[l1, :, l2, :] = np.einsum("gi,ij,hj->hg", b[l2], _chain(r.C, l1 + 1, l2, n), a[l1])
    return logits, heads


def route_positions(r: Routes, p: int, source: np.ndarray, l1: int, h1: int, l2: int | None, h2: int | None) -> tuple:
    """The dominant source token t and, for a head receiver, the key position i it reads the sender's
    write at: ``(t, i, p)`` (``i`` None for the logits)."""
    L, H, n, _ = r.P.shape
    In = _chain(r.C, 0, l1, n) * source[None]  # [j, t]
    if l2 is None:
        per_t = _chain(r.C, l1 + 1, L, n)[p] @ r.P[l1, h1] @ In
        return int(np.argmax(per_t)), None, p
    assert h2 is not None
    b = _chain(r.C, l2 + 1, L, n)[p] @ r.P[l2, h2]  # [i]
    w = _chain(r.C, l1 + 1, l2, n) @ r.P[l1, h1] @ In  # [i, t]
    per = b[:, None] * w
    i, t = np.unravel_index(int(np.argmax(per)), per.shape)
    return int(t), int(i), p


def source_tokens(pairs: PairSet, k: int) -> np.ndarray:
    """1 where prompt k's clean and corrupted tokens differ (every real token when none differ)."""
    n = pairs.clean.lengths[k]
    d = (pairs.clean.input_ids[k, :n] != pairs.corrupt.input_ids[k, :n]).cpu().numpy().astype(np.float64)
    return d if d.any() else np.ones(n)


def matrix_edges(graph: Graph, logits: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """The path scores as a ``[reader, writer]`` array of the circuit graph (NaN where the matrix names
    no path): sender head -> logits, sender head -> a later head's (or key/value group's) v input."""
    out = np.full((graph.n_readers, graph.n_writers), np.nan)
    L, H = logits.shape
    for l in range(L):
        for h in range(H):
            out[graph.logits_reader, graph.layer_start(l) + h] = logits[l, h]
    for i, rd in enumerate(graph.readers):
        if rd.input != "v":
            continue
        heads_of = [o - graph.layer_start(rd.layer) for o in rd.owners]  # the group's head indices
        for l1 in range(rd.layer):
            for h1 in range(H):
                out[i, graph.layer_start(l1) + h1] = heads[l1, h1, rd.layer, heads_of].sum()
    return out


@dataclass
class PathsResult:
    table: Any  # pandas DataFrame (paths.csv)
    lines: list[str]


def compare_paths(
    adapter: ModelAdapter,
    blocks: Any,
    pairs: PairSet,
    circuit: tuple[str, torch.Tensor, torch.Tensor] | None,
    methods: list[str],
    top: int,
    ablation: str,
    metric: str,
    steps: int,
    threshold: float,
    m_gap: float,
    n_boot: int,
    seed: int,
    rows: int,
    interval: Any,
) -> PathsResult:
    """``paths.csv``: the ``top`` paths of each matrix method and of the circuit (``(name, scores
    [R, U], mask [R, U])``: its in-circuit edges by |score|), each patched exactly. ``interval`` is
    the runner's per-edge bootstrap ``(graph, per_prompt, n_boot, seed) -> (lo, hi)``."""
    import pandas as pd

    g = blocks.graph
    quantity: Literal["logit", "prob"] = "logit" if metric == "logit_diff" else "prob"
    named: list[dict] = []
    for name in methods:
        per_prompt, pos_of = [], []
        for k in range(len(pairs)):
            one = pairs.clean.select([k])
            n = one.lengths[0]
            t = Target(int(pairs.answer[k]), int(pairs.wrong[k]), quantity)
            r = routes(adapter, name, one, t, steps)
            src = source_tokens(pairs, k)
            p = adapter.explained_position(n)
            per_prompt.append(matrix_edges(g, *path_scores(r, p, src)))
            if k == 0:
                pos_of.append((r, p, src, one.labels[0]))
        mean = np.mean(per_prompt, 0)
        total = np.nansum(np.abs(mean))
        flat = np.where(np.isnan(mean), -np.inf, mean)
        order = [f for f in np.argsort(-flat, axis=None)[:top] if np.isfinite(flat.flat[f])]
        r0, p0, src0, labels = pos_of[0]
        for rank, f in enumerate(order, 1):
            i, j = np.unravel_index(int(f), mean.shape)
            rd, w = g.readers[i], g.writers[j]
            l1, h1 = (int(x[1:]) for x in w.split("."))
            if rd.input == "logits":
                pos = route_positions(r0, p0, src0, l1, h1, None, None)
            else:
                h2 = rd.owners[0] - g.layer_start(rd.layer)
                pos = route_positions(r0, p0, src0, l1, h1, rd.layer, h2)
            named.append(
                {
                    "source_method": name,
                    "reader": int(i),
                    "writer": int(j),
                    "matrix_score": float(mean[i, j]),
                    "matrix_share": float(abs(mean[i, j]) / total) if total > 0 else float("nan"),
                    "matrix_rank": rank,
                    "positions": "->".join(str(x) for x in pos if x is not None),
                    "tokens": "->".join(labels[x] for x in pos if x is not None),
                }
            )
    if circuit is not None:
        cname, sc, mask = circuit
        s = sc.detach().double().cpu().numpy()
        m = mask.cpu().numpy()
        flat = np.where(m & ~np.isnan(s), np.abs(s), -np.inf)
        order = [f for f in np.argsort(-flat, axis=None)[:top] if np.isfinite(flat.flat[f])]
        tot = np.nansum(np.abs(s[m]))
        for rank, f in enumerate(order, 1):
            i, j = np.unravel_index(int(f), s.shape)
            named.append(
                {
                    "source_method": f"circuit:{cname}",
                    "reader": int(i),
                    "writer": int(j),
                    "matrix_score": float(s[i, j]),
                    "matrix_share": float(abs(s[i, j]) / tot) if tot > 0 else float("nan"),
                    "matrix_rank": rank,
                    "positions": "all",
                    "tokens": "",
                }
            )
    cols = [
        "source_method", "sender", "receiver", "input", "kv_group", "positions", "tokens", "matrix_score", "matrix_share",
        "matrix_rank", "patch_effect", "patch_ci_low", "patch_ci_high", "relative_effect", "matters", "agree",
    ]  # fmt: skip
    if not named:
        return PathsResult(pd.DataFrame(columns=cols), [])
    edges = sorted({(d["reader"], d["writer"]) for d in named})
    rr, ww = np.array([e[0] for e in edges]), np.array([e[1] for e in edges])
    ex = S.exact(blocks, pairs, metric, ablation, (rr, ww), batch_size=rows)
    effect = ex.mean.double().numpy()
    lo, hi = interval(g, ex.per_prompt, n_boot, seed)
    out = []
    for d in named:
        i, j = d["reader"], d["writer"]
        e, a, b = float(effect[i, j]), float(lo[i, j]), float(hi[i, j])
        excludes = not (np.isfinite(a) and np.isfinite(b)) or a > 0 or b < 0
        matters = bool(abs(e) >= threshold * abs(m_gap) and excludes)
        agree = matters and (not d["source_method"].startswith("circuit:") or np.sign(e) == np.sign(d["matrix_score"]))
        out.append(
            {
                "source_method": d["source_method"],
                "sender": g.writers[j],
                "receiver": g.target_label(i),
                "input": g.readers[i].input,
                "kv_group": g.kv_group(i),
                "positions": d["positions"],
                "tokens": d["tokens"],
                "matrix_score": d["matrix_score"],
                "matrix_share": d["matrix_share"],
                "matrix_rank": d["matrix_rank"],
                "patch_effect": e,
                "patch_ci_low": a,
                "patch_ci_high": b,
                "relative_effect": e / m_gap if m_gap else float("nan"),
                "matters": matters,
                "agree": bool(agree),
            }
        )
    table = pd.DataFrame(out, columns=cols)
    table = table.sort_values(["agree", "source_method", "matrix_rank"], kind="stable").reset_index(drop=True)
    return PathsResult(table, path_lines(table, threshold))


def path_lines(table: Any, threshold: float) -> list[str]:
    """The printed table, disagreements first."""
    if not len(table):
        return []
    n_dis = int((~table["agree"]).sum())
    out = [
        f"paths named by the matrices and the circuit, checked by exact edge patching ({n_dis} of {len(table)} "
        f"disagree; a path matters when it moves the metric by >= {threshold:g} of m(model) - m(empty)):"
    ]
    for x in table.itertuples():
        what = (
            f"score {x.matrix_score:+.4g}"
            if x.source_method.startswith("circuit:")
            else f"carries {x.matrix_share:.1%} of its path flow (rank {x.matrix_rank}; tokens {x.tokens})"
        )
        out.append(
            f"  {'agree   ' if x.agree else 'DISAGREE'} {x.source_method}: {x.sender} -> {x.receiver} ({x.input}) "
            f"{what}; patching it moves the metric by {x.patch_effect:+.4g} [{x.patch_ci_low:+.4g}, "
            f"{x.patch_ci_high:+.4g}] ({x.relative_effect:+.1%} of the full effect)"
        )
    return out
