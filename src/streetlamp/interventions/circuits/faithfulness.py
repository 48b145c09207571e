"""Circuits and their faithfulness (MIB, Mueller et al. 2025).

* **Circuit at size k**: the k edges first in a ranking (ties: graph order), pruned to what connects the
  input to the logits: an edge stays when its source is reachable from ``embed`` through circuit edges
  and its reader feeds a node from which the logits are reachable. This is the fixed point that MIB's
  ``Graph.prune`` reaches (it drops nodes without an incoming or outgoing edge, then edges without both
  ends, until nothing changes): in a DAG a node keeps both only when it lies on an input-to-logits path.
  Two rankings, as MIB's ``apply_topn(n, absolute)``: by ``|score|`` (``signed=False``) or by
  *signed* contribution, the most helpful first (``signed=True``). A score here is
  ``m(edge ablated) - m(model)`` (negative: the edge carries the behaviour), MIB's is the opposite sign
  (its attribution metric is the loss ``-m``), so the signed ranking puts the most negative first.
* **Size**: ``k = int(fraction * n_edges)`` (:func:`n_at`, MIB's ``int(pct * n_scored_items)``) before
  pruning. ``n_edges`` counts this graph's edges: with grouped-query attention a key/value group's k or v
  input is one edge per writer here and one per query head in MIB's graph (which ungroups the heads), so
  the two counts differ there (:func:`mib_edge_count`); without grouping they are equal.
* **Faithfulness** ``f(C) = (m(C) - m(∅)) / (m(M) - m(∅))``, each ``m`` the metric averaged over the
  prompts, with every edge outside C ablated (its reader fed ``z̃_u``: the corrupted run's output for
  ``patch``, a mean or zero). ``m(M)``: every edge present (the clean run); ``m(∅)``: none.
* **Sweep and areas, MIB's** (``MIB_circuit_track/evaluation.py: evaluate_area_under_curve``, read by
  ``print_results.py``): f at the ten sizes :data:`MIB_FRACTIONS` (0.1 % .. 50 % and 100 %), trapezoids on
  the raw fraction axis, no division by the sweep's width (:func:`areas`). **CPR** = area under f of the
  circuits ranked by signed score (f may exceed 1; higher is better; f = 1 everywhere gives 0.999),
  **CMD** = area under ``|1 - f|`` of the circuits ranked by ``|score|`` (0 is optimal). Other sweeps
  (``areas="sweep"``) integrate the same way over the swept sizes and are named ``area_under`` (signed
  ranking) and ``area_from_1`` (``|score|`` ranking), MIB's names for the raw numbers, never CPR/CMD. The
  100 % circuit is the model (every edge; nothing pruned): its f is 1 with no masked forward. The random
  baseline: circuits of k random edges (a random ranking, signed or not), pruned the same way, scored
  by the same formula draw by draw and averaged.
* **Intervals**: bootstrap over prompts (:func:`streetlamp.stats.resample_indices`) with the circuits
  fixed (found on all prompts): f, CPR and CMD recomputed on every resample. **Inclusion frequency**:
  the share of resamples whose top-k circuit (scores averaged over the resampled prompts) holds the edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...errors import StreetlampError
from ...stats import percentile_interval, resample_indices
from .blocks import Blocks
from .forward import run_graph
from .graph import Graph
from .scores import EdgeScores, ablation_values, metric_values
from .tasks import PairSet

MIB_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # evaluation.py's percentages
AREAS = ("mib", "sweep")


def n_at(fraction: float, n_edges: int) -> int:
    """The edges taken before pruning at ``fraction``: ``int(fraction * n_edges)`` (MIB's arithmetic)."""
    return int(float(fraction) * n_edges)


def mib_edge_count(graph: Graph) -> int:
    """The edges of MIB's graph for this model: a grouped k or v edge counts once per query head."""
    r, _ = graph.edge_index()
    return int(sum(len(graph.readers[i].owners) if graph.readers[i].input in ("k", "v") else 1 for i in r))


def check_areas(mode: str, fractions: list[float] | np.ndarray) -> None:
    """``mib`` needs every one of MIB's ten sizes among ``fractions`` (its areas are over exactly those)."""
    if mode not in AREAS:
        raise StreetlampError(f"unknown areas {mode!r}; choose from {', '.join(AREAS)}")
    if mode != "mib":
        return
    f = np.asarray(fractions, np.float64).reshape(-1)
    missing = [x for x in MIB_FRACTIONS if not np.isclose(f, x, rtol=0, atol=1e-12).any()]
    if 1.0 in missing:
        raise StreetlampError(
            "MIB's areas integrate up to 100% of the edges: add 1.0 to --sizes (MIB's ten sizes are "
            "0.001,0.002,0.005,0.01,0.02,0.05,0.1,0.2,0.5,1), or pass --areas sweep"
        )
    if missing:
        raise StreetlampError(
            f"MIB's areas need its ten sizes; --sizes lacks {','.join(f'{x:g}' for x in missing)} (or pass --areas sweep)"
        )


def default_areas(fractions: list[float] | np.ndarray) -> str:
    """``mib`` when ``fractions`` hold MIB's ten sizes, else ``sweep``."""
    f = np.asarray(fractions, np.float64).reshape(-1)
    return "mib" if all(np.isclose(f, x, rtol=0, atol=1e-12).any() for x in MIB_FRACTIONS) else "sweep"


def mib_subset(fractions: np.ndarray) -> np.ndarray:
    """Indices of MIB's ten sizes in the sorted ``fractions``."""
    return np.array([int(np.flatnonzero(np.isclose(fractions, x, rtol=0, atol=1e-12))[0]) for x in MIB_FRACTIONS])


def check_fractions(fractions: list[float] | np.ndarray) -> np.ndarray:
    f = np.asarray(fractions, np.float64).reshape(-1)
    if f.size == 0:
        raise StreetlampError("give at least one circuit size")
    bad = f[~((f > 0) & (f <= 1))]
    if bad.size:
        raise StreetlampError(f"circuit size {bad[0]:g} is outside (0, 1]: sizes are fractions of the graph's edges")
    return np.sort(f)


def top_k(graph: Graph, scores: torch.Tensor, k: int, signed: bool = False) -> torch.Tensor:
    """``[R, U]`` bool: the k valid edges with the largest |score|, or with ``signed`` the k most negative
    scores (the most helpful: see the module docstring); NaN scores last, ties in graph order."""
    r, w = graph.edge_index()
    v = scores.detach().double().cpu().numpy()[r, w]
    key = -v if signed else np.abs(v)
    key = np.where(np.isnan(key), -np.inf, key)
    order = np.argsort(-key, kind="stable")[: max(0, min(k, len(r)))]
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


def circuit(graph: Graph, scores: torch.Tensor, k: int, signed: bool = False) -> torch.Tensor:
    """The top-k circuit, pruned (``[R, U]`` bool); ``signed``: ranked by signed contribution."""
    return prune(graph, top_k(graph, scores, k, signed))


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
    """(area under f, area under ``|1 - f|``) of a curve over ``fractions``: MIB's trapezoids on the raw
    fraction axis, no division by the width (one size: 0, 0, as MIB's loop adds nothing). MIB's CPR is the
    first of the signed-ranked curve over :data:`MIB_FRACTIONS`, its CMD the second of the |score|-ranked
    one (:func:`mib_areas`)."""
    x = np.asarray(fractions, np.float64)
    f = np.asarray(f, np.float64)
    dx = np.diff(x)
    under = float(np.sum(dx * (f[:-1] + f[1:]) / 2))
    d = np.abs(1.0 - f)
    return under, float(np.sum(dx * (d[:-1] + d[1:]) / 2))


def mib_areas(fractions: np.ndarray, f_signed: np.ndarray, f_abs: np.ndarray) -> tuple[float, float]:
    """MIB's (CPR, CMD) from the two curves over ``fractions`` (which hold MIB's ten sizes; others ignored)."""
    x = np.asarray(fractions, np.float64)
    j = mib_subset(x)
    return areas(x[j], np.asarray(f_signed)[j])[0], areas(x[j], np.asarray(f_abs)[j])[1]


def _area_pair(x: np.ndarray, mode: str, f_signed: np.ndarray, f_abs: np.ndarray) -> tuple[float, float]:
    if mode == "mib":
        return mib_areas(x, f_signed, f_abs)
    return areas(x, f_signed)[0], areas(x, f_abs)[1]


def area_names(mode: str) -> tuple[str, str]:
    """The names of the two areas: MIB's ``cpr``/``cmd`` over its ten sizes, else MIB's raw ``area_under``
    (signed ranking) and ``area_from_1`` (|score| ranking) over the swept sizes."""
    return ("cpr", "cmd") if mode == "mib" else ("area_under", "area_from_1")


@dataclass
class Sweep:
    """A faithfulness sweep: one row per size (``table``), the two areas with intervals (``summary``;
    keys from :func:`area_names`), the |score|-ranked circuits (``masks``) and the signed ones."""

    table: object  # pandas DataFrame
    summary: dict
    masks: list[torch.Tensor]
    signed_masks: list[torch.Tensor] = field(default_factory=list)


def _unique(masks: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[int]]:
    """Distinct edge sets and each input's position among them (one masked forward per distinct set)."""
    keys: dict[bytes, int] = {}
    uniq: list[torch.Tensor] = []
    where = []
    for m in masks:
        k = np.packbits(m.numpy()).tobytes()
        if k not in keys:
            keys[k] = len(uniq)
            uniq.append(m)
        where.append(keys[k])
    return uniq, where


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
    areas_mode: str | None = None,
    select: Any = None,
) -> Sweep:
    """f over ``fractions`` for the circuits of ``scores`` ranked by |score| and by signed score, and for
    random circuits, with bootstrap intervals and the two areas (``areas_mode``: ``mib`` needs MIB's ten
    sizes, :func:`check_areas`; default :func:`default_areas`); ablation and metric are the scores' unless ``ablation`` is given. Each
    distinct edge set runs once: the 100 % circuit is the model's own run (f = 1 exactly), an empty one
    (``int(fraction * n_edges)`` = 0) the empty circuit's. ``select(k, signed)``: the circuit at size k
    (default the pruned top k; :class:`BootstrapSelection` for bootstrapped selection)."""
    import pandas as pd

    x = check_fractions(fractions)
    areas_mode = areas_mode or default_areas(x)
    check_areas(areas_mode, x)
    g = blocks.graph
    ab = ablation or scores.ablation
    E = g.n_edges
    ks = [n_at(fr, E) for fr in x]
    if select is None:  # a circuit per size: the top k by the ranking, pruned (or a selector's, e.g. bootstrapped)

        def select(k: int, signed: bool = False) -> torch.Tensor:
            return circuit(g, scores.mean, k, signed)

    masks = [select(k) for k in ks]
    signed = [select(k, True) for k in ks]
    rng = np.random.default_rng(seed)
    rand = [[random_circuit(g, k, rng) for _ in range(n_random)] for k in ks]
    full, empty = g.valid(), torch.zeros_like(g.valid())
    uniq, where = _unique([full, empty] + masks + signed + [m for ms in rand for m in ms])
    mu = circuit_metrics(blocks, pairs, uniq, ab, scores.metric, batch_size)
    mv = mu[where]
    m_full, m_empty = mv[0], mv[1]
    S_ = len(ks)
    m_c, m_s = mv[2 : 2 + S_], mv[2 + S_ : 2 + 2 * S_]
    m_r = mv[2 + 2 * S_ :].reshape(S_, n_random, len(pairs))
    f, fs = faithfulness(m_c, m_empty, m_full), faithfulness(m_s, m_empty, m_full)
    fr = faithfulness(m_r, m_empty, m_full)  # [sizes, draws]
    idx = resample_indices(len(pairs), n_boot, seed)
    fb = np.stack([faithfulness(m_c[:, i], m_empty[i], m_full[i]) for i in idx])  # [boot, sizes]
    fsb = np.stack([faithfulness(m_s[:, i], m_empty[i], m_full[i]) for i in idx])
    frb = np.stack([faithfulness(m_r[..., i], m_empty[i], m_full[i]) for i in idx])  # [boot, sizes, draws]
    ci = np.array([percentile_interval(fb[:, j], level) for j in range(S_)])
    sci = np.array([percentile_interval(fsb[:, j], level) for j in range(S_)])
    nan2 = (float("nan"), float("nan"))
    rci = np.array([percentile_interval(frb[:, j].mean(-1), level) if n_random else nan2 for j in range(S_)])
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
            "n_edges_signed": [int(m.sum()) for m in signed],
            "faithfulness_signed": fs,
            "signed_ci_low": sci[:, 0],
            "signed_ci_high": sci[:, 1],
            "random_faithfulness": fr.mean(1) if n_random else np.full(S_, np.nan),
            "random_ci_low": rci[:, 0],
            "random_ci_high": rci[:, 1],
        }
    )

    def rand_areas(frs: np.ndarray) -> tuple[float, float]:  # [sizes, draws]: each draw scored, then averaged
        if not n_random:
            return nan2
        a = np.array([_area_pair(x, areas_mode, frs[:, d], frs[:, d]) for d in range(n_random)])
        return float(a[:, 0].mean()), float(a[:, 1].mean())

    a0, a1 = area_names(areas_mode)
    one, two = _area_pair(x, areas_mode, fs, f)
    boot = np.array([_area_pair(x, areas_mode, s_, b) for s_, b in zip(fsb, fb)])
    rnd = rand_areas(fr)
    rboot = np.array([rand_areas(b) for b in frb])
    summary = {
        "method": scores.method,
        "ablation": ab,
        "metric": scores.metric,
        "areas": areas_mode,
        a0: one,
        f"{a0}_ci": percentile_interval(boot[:, 0], level),
        a1: two,
        f"{a1}_ci": percentile_interval(boot[:, 1], level),
        f"random_{a0}": rnd[0],
        f"random_{a0}_ci": percentile_interval(rboot[:, 0], level) if n_random else nan2,
        f"random_{a1}": rnd[1],
        f"random_{a1}_ci": percentile_interval(rboot[:, 1], level) if n_random else nan2,
        "m_full": float(m_full.mean()),
        "m_empty": float(m_empty.mean()),
        "n_prompts": len(pairs),
        "n_boot": n_boot,
        "level": level,
        "n_edges_graph": E,
        "n_edges_mib": mib_edge_count(g),
        "masked_circuits": sum(1 for m in uniq if bool(m.any()) and not torch.equal(m, full)),
    }
    return Sweep(table, summary, masks, signed)


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


class BootstrapSelection:
    """Bootstrapped edge selection (Nikankin et al. 2025, arXiv 2510.25786, MIB shared task): an edge is
    chosen by how often it is among the top k over bootstrap resamples of the prompts, not by one run's
    score. Each resample's scores are the mean of its prompts' per-prompt scores (no forward); at size k
    the circuit is the k edges of highest **inclusion frequency** (the share of resamples whose unpruned
    top k, by the same ranking, holds the edge; ties by the all-data ranking), then pruned like
    :func:`circuit`. ``signed``: the signed ranking (CPR's), else |score| (CMD's)."""

    def __init__(self, graph: Graph, scores: EdgeScores, n_boot: int = 200, seed: int = 0) -> None:
        per = scores.per_prompt.sum(1) if scores.per_prompt.dim() == 4 else scores.per_prompt
        r, w = graph.edge_index()
        v = per.double().cpu().numpy()[:, r, w]  # [n, E]
        idx = resample_indices(v.shape[0], n_boot, seed)
        self.graph, self.r, self.w = graph, r, w
        self.mean = np.nan_to_num(v.mean(0), nan=0.0)
        self.ranks: dict[bool, np.ndarray] = {}
        for signed in (False, True):
            rk = np.empty((len(idx), v.shape[1]), np.int32)
            for b, i in enumerate(idx):
                m = np.nan_to_num(v[i].mean(0), nan=0.0)
                key = -m if signed else np.abs(m)
                order = np.argsort(-key, kind="stable")
                rk[b, order] = np.arange(len(order), dtype=np.int32)
            self.ranks[signed] = rk

    def inclusion(self, k: int, signed: bool = False) -> np.ndarray:
        """``[E]``: the share of resamples whose unpruned top k holds each edge (edge_index order)."""
        return (self.ranks[signed] < k).mean(0)

    def __call__(self, k: int, signed: bool = False) -> torch.Tensor:
        inc = self.inclusion(k, signed)
        tie = -self.mean if signed else np.abs(self.mean)
        order = np.lexsort((-tie, -inc))[: max(0, min(k, len(inc)))]  # inclusion first, then the ranking
        m = torch.zeros(self.graph.n_readers, self.graph.n_writers, dtype=torch.bool)
        m[self.r[order], self.w[order]] = True
        return prune(self.graph, m)


def precision_recall(found: torch.Tensor, truth: torch.Tensor) -> tuple[float, float]:
    """Edge precision and recall of a circuit ``found`` against a known circuit ``truth`` (``[R, U]`` bool)."""
    tp = float((found & truth).sum())
    nf, nt = float(found.sum()), float(truth.sum())
    return (tp / nf if nf else float("nan")), (tp / nt if nt else float("nan"))
