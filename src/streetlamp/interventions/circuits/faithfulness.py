"""Circuits and their faithfulness (MIB, Mueller et al. 2025).

* **Circuit at size k**: the k edges with the largest absolute score (ties: graph order), pruned to
  what connects the input to the logits: an edge stays when its source is reachable from ``embed``
  through circuit edges and its reader feeds a node from which the logits are reachable.
* **Faithfulness** ``f(C) = (m(C) - m(∅)) / (m(M) - m(∅))``, each ``m`` the metric averaged over the
  prompts, with every edge outside C ablated (its reader fed ``z̃_u``: the corrupted run's output for
  ``patch``, a mean or zero). ``m(M)``: every edge present (the clean run); ``m(∅)``: none.
* **Sweep**: f at every size fraction (of all edges); **CPR** = area under f and **CMD** = area between
  f and 1 (``|1 - f|``), trapezoids over the swept fractions divided by the width of the sweep (so f = 1
  everywhere gives CPR 1, CMD 0); the random baseline: circuits of k random edges, pruned the same way.
* **Intervals**: bootstrap over prompts (:func:`streetlamp.stats.resample_indices`) with the circuits
  fixed (found on all prompts): f, CPR and CMD recomputed on every resample. **Inclusion frequency**:
  the share of resamples whose top-k circuit (scores averaged over the resampled prompts) holds the edge.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...errors import StreetlampError
from ...stats import percentile_interval, resample_indices
from .blocks import Blocks
from .forward import run_graph
from .graph import Graph
from .scores import EdgeScores, ablation_values, metric_values
from .tasks import PairSet


def check_fractions(fractions: list[float] | np.ndarray) -> np.ndarray:
    f = np.asarray(fractions, np.float64).reshape(-1)
    if f.size == 0:
        raise StreetlampError("give at least one circuit size")
    bad = f[~((f > 0) & (f <= 1))]
    if bad.size:
        raise StreetlampError(f"circuit size {bad[0]:g} is outside (0, 1]: sizes are fractions of the graph's edges")
    return np.sort(f)


def top_k(graph: Graph, scores: torch.Tensor, k: int) -> torch.Tensor:
    """``[R, U]`` bool: the k valid edges with the largest |score| (NaN scores last; ties in graph order)."""
    r, w = graph.edge_index()
    s = np.abs(np.nan_to_num(scores.detach().double().cpu().numpy()[r, w], nan=-1.0))
    order = np.argsort(-s, kind="stable")[: max(0, min(k, len(r)))]
    m = torch.zeros(graph.n_readers, graph.n_writers, dtype=torch.bool)
    m[r[order], w[order]] = True
    return m


def prune(graph: Graph, mask: torch.Tensor) -> torch.Tensor:
    """The edges of ``mask`` that lie on a path from ``embed`` to the logits (see the module docstring)."""
    m = mask.clone() & graph.valid()
    R, U = graph.n_readers, graph.n_writers
    owners = [graph.readers[i].owners for i in range(R)]
    fwd = np.zeros(U, bool)
    fwd[0] = True
    for i in range(R):  # readers come in forward order: a writer's inputs are settled before it writes
        if (m[i].numpy() & fwd).any():
            for o in owners[i]:
                fwd[o] = True
    alive_r = np.zeros(R, bool)
    alive_r[graph.logits_reader] = True
    alive_w = np.zeros(U, bool)
    for i in reversed(range(R)):
        if i != graph.logits_reader:
            alive_r[i] = any(alive_w[o] for o in owners[i])
        if alive_r[i]:
            alive_w |= m[i].numpy()
    keep = torch.from_numpy(np.outer(alive_r, fwd))
    return m & keep


def circuit(graph: Graph, scores: torch.Tensor, k: int) -> torch.Tensor:
    """The top-k circuit, pruned (``[R, U]`` bool)."""
    return prune(graph, top_k(graph, scores, k))


def random_circuit(graph: Graph, k: int, rng: np.random.Generator) -> torch.Tensor:
    r, w = graph.edge_index()
    pick = rng.choice(len(r), size=min(k, len(r)), replace=False)
    m = torch.zeros(graph.n_readers, graph.n_writers, dtype=torch.bool)
    m[r[pick], w[pick]] = True
    return prune(graph, m)


def circuit_metrics(
    blocks: Blocks,
    pairs: PairSet,
    masks: list[torch.Tensor],
    ablation: str = "patch",
    metric: str = "logit_diff",
    batch_size: int = 32,
    reference: PairSet | None = None,
) -> np.ndarray:
    """``m`` per circuit and prompt ``[len(masks), n]``, every edge outside the circuit ablated.

    The prompts go in blocks of ``max(1, batch_size // len(masks))``: each block's corrupted forward
    (``patch``'s ``z̃``) runs once and serves every circuit, ``batch_size`` rows per masked pass. Under
    ``patch`` an empty circuit feeds every reader the corrupted run's writers, so it *is* the corrupted run:
    its m is that forward's metric, with no masked pass."""
    n = len(pairs)
    out = np.zeros((len(masks), n))
    if batch_size < 1:
        raise StreetlampError(f"batch size must be at least 1, got {batch_size}")
    if not masks or not n:
        return out
    mean_ab = None if ablation == "patch" else ablation_values(blocks, pairs, ablation, reference)
    empty = [c for c, m in enumerate(masks) if not bool(m.any())] if mean_ab is None else []
    live = [c for c in range(len(masks)) if c not in empty]
    per = max(1, batch_size // max(1, len(live)))
    for lo in range(0, n, per):
        block = list(range(lo, min(n, lo + per)))
        ab_block = None
        if mean_ab is None:
            pb = pairs.select(block)
            with torch.no_grad():
                cr = run_graph(blocks, pb.corrupt.input_ids, pb.corrupt.attention_mask)
            ab_block = cr.writers
            if empty:
                m_empty = metric_values(cr.logits, pb.answer, pb.wrong, metric).double().cpu().numpy()
                for c in empty:
                    out[c, block] = m_empty
        jobs = [(c, j) for c in live for j in range(len(block))]
        for start in range(0, len(jobs), batch_size):
            chunk = jobs[start : start + batch_size]
            p = pairs.select([block[j] for _, j in chunk])
            width = p.clean.input_ids.shape[1]  # the block's padded width may be longer than the chunk's
            ab = mean_ab if ab_block is None else ab_block[torch.as_tensor([j for _, j in chunk]), :width]
            mask = torch.stack([masks[c] for c, _ in chunk]).double()
            with torch.no_grad():
                run = run_graph(blocks, p.clean.input_ids, p.clean.attention_mask, ablated=ab, mask=mask)
                mv = metric_values(run.logits, p.answer, p.wrong, metric).double().cpu().numpy()
            for (c, j), v in zip(chunk, mv):
                out[c, block[j]] = v
    return out


def faithfulness(m_c: np.ndarray, m_empty: np.ndarray, m_full: np.ndarray) -> np.ndarray:
    """``(mean m(C) - mean m(∅)) / (mean m(M) - mean m(∅))`` over the last axis (prompts)."""
    lo, hi = m_empty.mean(-1), m_full.mean(-1)
    return (m_c.mean(-1) - lo) / (hi - lo)


def areas(fractions: np.ndarray, f: np.ndarray) -> tuple[float, float]:
    """(CPR, CMD) of a faithfulness curve over ``fractions`` (trapezoids over the sweep's width; one
    size: f and |1 - f| there)."""
    x = np.asarray(fractions, np.float64)
    f = np.asarray(f, np.float64)
    if x.size == 1:
        return float(f[0]), float(abs(1 - f[0]))
    width = x[-1] - x[0]
    return float(np.trapezoid(f, x) / width), float(np.trapezoid(np.abs(1 - f), x) / width)


@dataclass
class Sweep:
    """A faithfulness sweep: one row per size (``table``), CPR / CMD with intervals (``summary``)."""

    table: object  # pandas DataFrame
    summary: dict
    masks: list[torch.Tensor]


def sweep(
    blocks: Blocks,
    pairs: PairSet,
    scores: EdgeScores,
    fractions: list[float] | np.ndarray,
    n_random: int = 3,
    n_boot: int = 200,
    level: float = 0.95,
    seed: int = 0,
    batch_size: int = 32,
    ablation: str | None = None,
) -> Sweep:
    """f over ``fractions`` for the circuits of ``scores`` and for random circuits, with bootstrap
    intervals; ablation and metric are the scores' unless ``ablation`` is given."""
    import pandas as pd

    x = check_fractions(fractions)
    g = blocks.graph
    ab = ablation or scores.ablation
    E = g.n_edges
    ks = [max(1, int(round(fr * E))) for fr in x]
    masks = [circuit(g, scores.mean, k) for k in ks]
    rng = np.random.default_rng(seed)
    rand = [[random_circuit(g, k, rng) for _ in range(n_random)] for k in ks]
    full, empty = g.valid(), torch.zeros_like(g.valid())
    allm = [full, empty] + masks + [m for ms in rand for m in ms]
    mv = circuit_metrics(blocks, pairs, allm, ab, scores.metric, batch_size)
    m_full, m_empty, m_c = mv[0], mv[1], mv[2 : 2 + len(ks)]
    m_r = mv[2 + len(ks) :].reshape(len(ks), n_random, len(pairs)) if n_random else None
    f = faithfulness(m_c, m_empty, m_full)
    fr = faithfulness(m_r, m_empty, m_full).mean(1) if m_r is not None else np.full(len(ks), np.nan)
    idx = resample_indices(len(pairs), n_boot, seed)
    fb = np.stack([faithfulness(m_c[:, i], m_empty[i], m_full[i]) for i in idx])  # [boot, sizes]
    frb = (
        np.stack([faithfulness(m_r[..., i], m_empty[i], m_full[i]).mean(1) for i in idx])
        if m_r is not None
        else np.full_like(fb, np.nan)
    )
    ci = np.array([percentile_interval(fb[:, j], level) for j in range(len(ks))])
    rci = np.array([percentile_interval(frb[:, j], level) for j in range(len(ks))])
    table = pd.DataFrame(
        {
            "method": scores.method,
            "ablation": ab,
            "metric": scores.metric,
            "size_fraction": x,
            "n_edges_requested": ks,
            "n_edges": [int(m.sum()) for m in masks],
            "faithfulness": f,
            "ci_low": ci[:, 0],
            "ci_high": ci[:, 1],
            "random_faithfulness": fr,
            "random_ci_low": rci[:, 0],
            "random_ci_high": rci[:, 1],
        }
    )
    cpr, cmd = areas(x, f)
    boot = np.array([areas(x, b) for b in fb])
    summary = {
        "method": scores.method,
        "ablation": ab,
        "metric": scores.metric,
        "cpr": cpr,
        "cpr_ci": percentile_interval(boot[:, 0], level),
        "cmd": cmd,
        "cmd_ci": percentile_interval(boot[:, 1], level),
        "random_cpr": areas(x, fr)[0],
        "m_full": float(m_full.mean()),
        "m_empty": float(m_empty.mean()),
        "n_prompts": len(pairs),
        "n_boot": n_boot,
        "level": level,
    }
    return Sweep(table, summary, masks)


def inclusion_frequency(
    graph: Graph, scores: EdgeScores, k: int, n_boot: int = 200, seed: int = 0, pruned: bool = True
) -> torch.Tensor:
    """``[R, U]``: the share of bootstrap resamples of the prompts whose top-k circuit holds each edge."""
    per = scores.per_prompt.sum(1) if scores.per_prompt.dim() == 4 else scores.per_prompt
    idx = resample_indices(per.shape[0], n_boot, seed)
    acc = torch.zeros(graph.n_readers, graph.n_writers, dtype=torch.float64)
    for i in idx:
        s = per[torch.as_tensor(i)].mean(0)
        acc += (circuit(graph, s, k) if pruned else top_k(graph, s, k)).double()
    return acc / len(idx)


def precision_recall(found: torch.Tensor, truth: torch.Tensor) -> tuple[float, float]:
    """Edge precision and recall of a circuit ``found`` against a known circuit ``truth`` (``[R, U]`` bool)."""
    tp = float((found & truth).sum())
    nf, nt = float(found.sum()), float(truth.sum())
    return (tp / nf if nf else float("nan")), (tp / nt if nt else float("nan"))
