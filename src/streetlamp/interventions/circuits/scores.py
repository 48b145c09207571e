"""Edge scores: EAP, EAP-IG (inputs or activations interpolated), exact edge patching, node scores and
the audit of a first-order score against exact patching.

Every score estimates or measures ``m(edge ablated) - m(clean)`` per prompt, in the metric's units
(logit or probability difference of answer over wrong): negative = the edge carries the behaviour.

* **EAP** (Syed et al. 2023): ``(z̃_u - z_u) · ∂m/∂x_r`` at the clean run, summed over positions;
  one ablated (corrupted) forward, one clean forward, one backward for every edge.
* **EAP-IG** (Hanna et al. 2024): the gradient averaged over ``steps`` points ``α_k = k / steps``
  (k = 1 .. steps: the right Riemann sum, so ``steps=1`` is EAP; the reference code uses
  k = 0 .. steps-1). ``inputs``: the embeddings interpolated, ``ẽ + α (e - ẽ)``, everything else
  recomputed. ``activations``: for each writer block (the embeddings, one layer's heads, one MLP) in
  turn its outputs are set to ``z̃ + α (z - z̃)`` and the edges *from* that block take the gradients
  at their readers (``blocks × steps`` passes).
* **Exact**: one forward per edge with only that edge's reader fed ``z̃_u`` (batched, ``batch_size``
  rows per pass).
* **Nodes**: a writer's score is the sum of its out-edges' first-order scores (exactly its own
  first-order attribution, since ``z_u`` reaches the output only through its readers); exact node
  patching ablates every out-edge of the node at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

import numpy as np
import torch

from ...errors import StreetlampError
from ...stats import kendall_tau
from .blocks import Blocks
from .forward import GraphRun, run_graph
from .graph import Graph
from .tasks import PairSet

Ablation = Literal["patch", "mean", "zero"]
ABLATIONS = ("patch", "mean", "zero")
METRICS = ("logit_diff", "prob_diff")
T = TypeVar("T")


def metric_values(logits: torch.Tensor, answer: torch.Tensor, wrong: torch.Tensor, metric: str) -> torch.Tensor:
    """Per-row metric ``[b]``: logit or probability of ``answer`` minus that of ``wrong``."""
    if metric not in METRICS:
        raise StreetlampError(f"unknown metric {metric!r}; choose from {', '.join(METRICS)}")
    q = (
        logits
        if metric == "logit_diff"
        else torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
    )
    rows = torch.arange(q.shape[0], device=q.device)
    return q[rows, answer.to(q.device)] - q[rows, wrong.to(q.device)]


@dataclass
class EdgeScores:
    """Per-prompt scores ``[n, R, U]`` (``[n, s, R, U]`` per position); NaN where no edge exists or
    none was scored. ``mean`` averages over prompts (and sums positions)."""

    method: str
    per_prompt: torch.Tensor
    ablation: str
    metric: str

    @property
    def mean(self) -> torch.Tensor:
        s = self.per_prompt
        if s.dim() == 4:
            s = s.sum(1)
        return s.mean(0)


def ablation_values(
    blocks: Blocks, pairs: PairSet, ablation: str, reference: PairSet | None = None, rows: list[int] | None = None
) -> torch.Tensor:
    """``z̃``: the writers' outputs of the corrupted prompts (``patch``, ``[b, s, U, d]``), their mean
    over every real token of ``reference`` (default: the clean prompts; ``mean``, ``[1, 1, U, d]``), or
    zeros (``zero``)."""
    if ablation not in ABLATIONS:
        raise StreetlampError(f"unknown ablation {ablation!r}; choose from {', '.join(ABLATIONS)}")
    g, a = blocks.graph, blocks.adapter
    if ablation == "zero":
        return torch.zeros(1, 1, g.n_writers, a.d_model, dtype=a.hf_model.dtype, device=a.device)
    with torch.no_grad():
        if ablation == "patch":
            p = pairs if rows is None else pairs.select(rows)
            return run_graph(blocks, p.corrupt.input_ids, p.corrupt.attention_mask).writers
        ref = reference.clean if reference is not None else pairs.clean
        w = run_graph(blocks, ref.input_ids, ref.attention_mask).writers
        real = ref.attention_mask.bool().to(w.device)
        return w[real].mean(0)[None, None]


def _chunks(n: int, size: int) -> list[list[int]]:
    if size < 1:
        raise StreetlampError(f"batch size must be at least 1, got {size}")
    return [list(range(i, min(n, i + size))) for i in range(0, n, size)]


def _reader_grads(
    blocks: Blocks, p: PairSet, metric: str, override: dict[str, torch.Tensor] | None = None
) -> tuple[GraphRun, list[torch.Tensor | None]]:
    """One clean forward (with ``override``) and one backward: ``∂m/∂x_r`` per reader tensor of
    :attr:`GraphRun.readers` (None for readers fed only by overridden constants)."""
    run = run_graph(blocks, p.clean.input_ids, p.clean.attention_mask, override=override)
    m = metric_values(run.logits, p.answer, p.wrong, metric).sum()
    live = [x.requires_grad for x in run.readers]  # readers fed only by overridden constants have none
    got = iter(torch.autograd.grad(m, [x for x, ok in zip(run.readers, live) if ok], allow_unused=True))
    return run, [next(got) if ok else None for ok in live]


def _flat_grad(gr: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """A reader group's gradient ``[b, s, r, d]`` as ``[b, r, s·d]`` in ``dt``: the layout of the edge
    products' batched matrix product."""
    b, s, r, d = gr.shape
    return gr.to(dt).permute(0, 2, 1, 3).reshape(b, r, s * d)


def _edge_products(
    blocks: Blocks,
    delta: torch.Tensor,
    grads: list[torch.Tensor | None],
    per_position: bool,
    sources: slice | None = None,
    flat: bool = False,
) -> torch.Tensor:
    """``Σ_s δ_u · g_r`` ``[b, R, U]`` (``[b, s, R, U]``) for every edge, or only the edges from writers
    ``sources`` (the other columns 0, never multiplied). ``flat``: ``grads`` are already
    :func:`_flat_grad`'s layout (not per position)."""
    g = blocks.graph
    b, s, U, d = delta.shape
    shape = (b, s, g.n_readers, U) if per_position else (b, g.n_readers, U)
    # scores in float32 at least (a bfloat16 model's products summed in float32, not rounded to bfloat16)
    dt = torch.promote_types(delta.dtype, torch.float32)
    delta = delta.to(dt)
    out = torch.zeros(shape, dtype=dt, device=delta.device)
    lo, hi = (0, U) if sources is None else (sources.start, sources.stop)
    if flat and per_position:
        raise StreetlampError("flattened gradients serve the summed scores only, not per position")
    # [b, U, s·d] once, so each reader group's products are one batched matrix product
    flat_d = None if per_position else delta.permute(0, 2, 1, 3).reshape(b, U, s * d)
    from .forward import reader_slices

    for rr, gr in zip(reader_slices(blocks), grads):
        n = min(g.n_upstream(rr.start), hi)
        if gr is None or n <= lo:
            continue
        if per_position:
            out[..., rr.start : rr.stop, lo:n] = torch.einsum("bsud,bsrd->bsru", delta[:, :, lo:n], gr.to(dt))
        else:
            assert flat_d is not None
            gflat = gr if flat else _flat_grad(gr, dt)
            out[:, rr.start : rr.stop, lo:n] = torch.bmm(gflat, flat_d[:, lo:n].transpose(1, 2))
    return out


def gradient_scores(
    blocks: Blocks,
    p: PairSet,
    ablated: torch.Tensor,
    metric: str,
    per_position: bool,
    override: dict[str, torch.Tensor] | None = None,
    sources: slice | None = None,
    delta: torch.Tensor | None = None,
) -> torch.Tensor:
    """``Σ_s δ_u · ∂m/∂x_r`` ``[b, R, U]`` (``[b, s, R, U]``) at one clean forward with ``override``,
    ``δ = z̃ - z`` (``delta``, or from this forward's writers when it has no override); only edges
    from writers ``sources`` when given (others 0)."""
    run, grads = _reader_grads(blocks, p, metric, override)
    if delta is None:
        delta = delta_of(p, ablated, run.writers.detach())
    return _edge_products(blocks, delta, grads, per_position, sources)


def _add_grads(acc: list[torch.Tensor | None] | None, grads: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    if acc is None:
        return grads
    return [a if g_ is None else g_ if a is None else a + g_ for a, g_ in zip(acc, grads)]


def delta_of(p: PairSet, ablated: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    """``δ = z̃ − z`` per writer, zero at padded positions."""
    real = p.clean.attention_mask.to(clean.device, clean.dtype)[:, :, None, None]
    return (ablated.to(clean.dtype).expand_as(clean) - clean) * real


def _delta(blocks: Blocks, p: PairSet, ablated: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        clean = run_graph(blocks, p.clean.input_ids, p.clean.attention_mask).writers
    return delta_of(p, ablated, clean), clean


def per_batch(
    blocks: Blocks,
    pairs: PairSet,
    ablation: str,
    batch_size: int,
    reference: PairSet | None,
    score: Callable[[PairSet, torch.Tensor], T],
) -> list[T]:
    """The chunk loop every first-order score shares: ``score(p, z̃)`` on each ``batch_size`` rows ``p``
    of ``pairs``, with ``z̃`` their corrupted run's writers (``patch``) or the one mean / zero value
    computed once (:func:`ablation_values`); the per-chunk results in order."""
    mean_ab = None if ablation == "patch" else ablation_values(blocks, pairs, ablation, reference)
    out = []
    for rows in _chunks(len(pairs), batch_size):
        p = pairs.select(rows)
        ab = ablation_values(blocks, pairs, "patch", rows=rows) if mean_ab is None else mean_ab
        out.append(score(p, ab))
    return out


def finish_scores(blocks: Blocks, parts: list[torch.Tensor], method: str, ablation: str, metric: str) -> EdgeScores:
    """The per-prompt score blocks joined into :class:`EdgeScores` (float32 at least), NaN where the graph
    has no edge."""
    s = torch.cat(parts).detach()
    s = s.to(torch.promote_types(s.dtype, torch.float32))
    valid = blocks.graph.valid().to(s.device)
    s = s.masked_fill(~valid, float("nan"))
    return EdgeScores(method, s, ablation, metric)


def eap(
    blocks: Blocks,
    pairs: PairSet,
    metric: str = "logit_diff",
    ablation: str = "patch",
    per_position: bool = False,
    batch_size: int = 16,
    reference: PairSet | None = None,
) -> EdgeScores:
    """EAP scores of every edge, per prompt."""

    def score(p: PairSet, ab: torch.Tensor) -> torch.Tensor:
        return gradient_scores(blocks, p, ab, metric, per_position)

    return finish_scores(
        blocks, per_batch(blocks, pairs, ablation, batch_size, reference, score), "eap", ablation, metric
    )


def same_clean(p: PairSet, q: PairSet) -> bool:
    """Whether two pair sets share their clean prompts (ids and padding), answers and wrong answers."""
    return (
        len(p) == len(q)
        and torch.equal(p.clean.input_ids, q.clean.input_ids)
        and torch.equal(p.clean.attention_mask, q.clean.attention_mask)
        and torch.equal(p.answer, q.answer)
        and torch.equal(p.wrong, q.wrong)
    )


class EapCleanReuse:
    """EAP of pair sets that share ``pairs``' clean prompts, answers and wrong answers and differ only in
    their corrupted prompts (the corrupt resampling axis, :mod:`.resampling`). EAP's score
    ``Σ_s (z̃_u − z_u) · ∂m/∂x_r`` takes its gradient at the clean run, and the clean writers ``z_u`` are the
    clean run's too, so only ``z̃`` depends on the corrupted prompts: the clean forward and backward run once
    here (per ``batch_size`` chunk, the chunks :func:`eap` would use), their writers and gradients kept, and
    a call runs the corrupted forward (no gradients) and the edge products. The same operations on the same
    chunks as :func:`eap` (``ablation="patch"``, summed over positions), so the same per-prompt scores.

    Holds every prompt's reader gradients and writers: ``(R + U) · n · s · d`` floats (float32 at least;
    1.3 + 0.8 GB for SmolLM2-135M on 64 IOI prompts of 18 tokens)."""

    def __init__(self, blocks: Blocks, pairs: PairSet, metric: str = "logit_diff", batch_size: int = 16) -> None:
        self.blocks, self.pairs, self.metric = blocks, pairs, metric
        self.chunks = _chunks(len(pairs), batch_size)
        self.stored: list[tuple[torch.Tensor, list[torch.Tensor | None]]] = []  # per chunk: z, flat ∂m/∂x_r
        for rows in self.chunks:
            run, grads = _reader_grads(blocks, pairs.select(rows), metric)
            clean = run.writers.detach()
            dt = torch.promote_types(clean.dtype, torch.float32)
            self.stored.append((clean, [None if gr is None else _flat_grad(gr, dt) for gr in grads]))
            del run, grads

    def __call__(self, q: PairSet) -> EdgeScores:
        """EAP of ``q`` (its clean side ``pairs``', checked), per prompt."""
        if not same_clean(q, self.pairs):
            raise StreetlampError("reused clean gradients: the pairs' clean prompts or answers differ from the stored")
        parts = []
        for rows, (clean, gflat) in zip(self.chunks, self.stored):
            ab = ablation_values(self.blocks, q, "patch", rows=rows)
            delta = delta_of(q.select(rows), ab, clean)
            parts.append(_edge_products(self.blocks, delta, gflat, False, flat=True))
        return finish_scores(self.blocks, parts, "eap", "patch", self.metric)


def eap_ig(
    blocks: Blocks,
    pairs: PairSet,
    steps: int = 5,
    mode: str = "inputs",
    metric: str = "logit_diff",
    ablation: str = "patch",
    per_position: bool = False,
    batch_size: int = 16,
    reference: PairSet | None = None,
) -> EdgeScores:
    """EAP-IG with the inputs (``mode="inputs"``) or each block's activations (``"activations"``)
    interpolated from the ablated value to the clean one, ``steps`` points each."""
    if steps < 1:
        raise StreetlampError(f"steps must be at least 1, got {steps}")
    if mode not in ("inputs", "activations"):
        raise StreetlampError(f"unknown EAP-IG mode {mode!r}; choose inputs or activations")
    g = blocks.graph
    todo = [("embed", slice(0, 1))] if mode == "inputs" else g.blocks()

    def score(p: PairSet, ab: torch.Tensor) -> torch.Tensor:
        # The edge products are linear in the gradient, so each block's gradients are summed over its steps
        # and multiplied once, only on the block's own columns. Inputs: the clean writers (for δ) are the
        # α = 1 step's own run (its embeddings are the clean ones), so no separate clean forward.
        if mode == "inputs":
            with torch.no_grad():
                clean = blocks.embed(p.clean.input_ids.to(blocks.adapter.device))[:, :, None]
            delta = None
        else:
            delta, clean = _delta(blocks, p, ab)
            clean = clean.detach()
        acc = None
        for name, sl in todo:
            z = clean if mode == "inputs" else clean[:, :, sl]
            za = ab[:, :, sl].to(z.dtype).expand_as(z)
            gsum = None
            for k in range(steps, 0, -1):  # α = 1 first
                a = k / steps
                # a leaf that requires grad, so readers fed only by it still carry gradients
                point = z if k == steps else za + a * (z - za)
                run, grads = _reader_grads(blocks, p, metric, {name: point.detach().clone().requires_grad_(True)})
                if delta is None:
                    delta = delta_of(p, ab, run.writers.detach())
                gsum = _add_grads(gsum, grads)
                del run
            assert gsum is not None and delta is not None
            s = _edge_products(blocks, delta, gsum, per_position, None if mode == "inputs" else sl)
            acc = s if acc is None else acc + s
        assert acc is not None
        return acc / steps

    parts = per_batch(blocks, pairs, ablation, batch_size, reference, score)
    return finish_scores(blocks, parts, f"eap-ig-{mode}", ablation, metric)


def _masked_metric(blocks: Blocks, p: PairSet, ablated: torch.Tensor, mask: torch.Tensor, metric: str) -> torch.Tensor:
    with torch.no_grad():
        run = run_graph(blocks, p.clean.input_ids, p.clean.attention_mask, ablated=ablated, mask=mask)
        return metric_values(run.logits, p.answer, p.wrong, metric)


def clean_metric(blocks: Blocks, pairs: PairSet, metric: str = "logit_diff") -> torch.Tensor:
    with torch.no_grad():
        run = run_graph(blocks, pairs.clean.input_ids, pairs.clean.attention_mask)
        return metric_values(run.logits, pairs.answer, pairs.wrong, metric)


def exact(
    blocks: Blocks,
    pairs: PairSet,
    metric: str = "logit_diff",
    ablation: str = "patch",
    edges: tuple[np.ndarray, np.ndarray] | None = None,
    batch_size: int = 32,
    reference: PairSet | None = None,
) -> EdgeScores:
    """``m(edge ablated) - m(clean)`` per prompt for ``edges`` (reader, writer) indices (default: every
    edge); one forward per (prompt, edge), ``batch_size`` of them per pass. NaN for unscored edges."""
    return _exact_masks(blocks, pairs, metric, ablation, edges, batch_size, reference, node=False)


def exact_nodes(
    blocks: Blocks, pairs: PairSet, metric: str = "logit_diff", ablation: str = "patch", batch_size: int = 32
) -> torch.Tensor:
    """``m(node ablated) - m(clean)`` ``[n, U]``: every out-edge of writer u ablated at once."""
    g = blocks.graph
    cols = np.arange(g.n_writers)
    s = _exact_masks(blocks, pairs, metric, ablation, (np.zeros_like(cols), cols), batch_size, None, node=True)
    return s.per_prompt[:, 0]


def _exact_masks(
    blocks: Blocks,
    pairs: PairSet,
    metric: str,
    ablation: str,
    edges: tuple[np.ndarray, np.ndarray] | None,
    batch_size: int,
    reference: PairSet | None,
    node: bool,
) -> EdgeScores:
    g = blocks.graph
    valid = g.valid()
    rr, ww = edges if edges is not None else g.edge_index()
    rr, ww = np.asarray(rr), np.asarray(ww)
    if not node and not bool(valid[rr, ww].all()):
        raise StreetlampError("exact: some (reader, writer) pairs are not edges of the graph")
    n, E = len(pairs), len(rr)
    base = clean_metric(blocks, pairs, metric)
    mean_ab = None if ablation == "patch" else ablation_values(blocks, pairs, ablation, reference)
    out = torch.full((n, g.n_readers, g.n_writers), float("nan"), dtype=torch.float64)
    jobs = [(i, e) for i in range(n) for e in range(E)]
    for chunk in _chunks(len(jobs), batch_size):
        idx = [jobs[c][0] for c in chunk]
        p = pairs.select(idx)
        ab = ablation_values(blocks, pairs, "patch", rows=idx) if mean_ab is None else mean_ab
        mask = valid.to(torch.float64)[None].repeat(len(chunk), 1, 1)
        for row, c in enumerate(chunk):
            e = jobs[c][1]
            if node:
                mask[row, :, ww[e]] = 0
            else:
                mask[row, rr[e], ww[e]] = 0
        mv = _masked_metric(blocks, p, ab, mask, metric).double().cpu()
        for row, c in enumerate(chunk):
            i, e = jobs[c]
            out[i, rr[e], ww[e]] = mv[row] - base[i].double().cpu()
    return EdgeScores("exact-nodes" if node else "exact", out, ablation, metric)


def node_scores(scores: EdgeScores) -> torch.Tensor:
    """First-order node scores ``[n, U]``: each writer's out-edges summed."""
    s = scores.per_prompt
    if s.dim() == 4:
        s = s.sum(1)
    return torch.nan_to_num(s).sum(1)


def compare(estimate: np.ndarray, exact_: np.ndarray) -> dict:
    """A first-order estimate against exact patching on the same edges: mean and max absolute error (and the
    max relative to the largest exact effect), Kendall's tau, the share of misranked edge pairs (pairs
    ordered one way by the estimate and the other by patching, ties in either excluded) and the share of
    edges whose sign agrees (edges with an exact effect of exactly 0 excluded)."""
    ap, ex = np.asarray(estimate, np.float64), np.asarray(exact_, np.float64)
    err = np.abs(ap - ex)
    di, dj = np.subtract.outer(ex, ex), np.subtract.outer(ap, ap)
    upper = np.triu(np.ones_like(di, dtype=bool), 1) & (di != 0) & (dj != 0)
    mis = float((np.sign(di) != np.sign(dj))[upper].mean()) if upper.any() else float("nan")
    nz = ex != 0
    return {
        "mean_abs_error": float(err.mean()) if len(err) else float("nan"),
        "max_abs_error": float(err.max()) if len(err) else float("nan"),
        "relative_error": float(err.max() / max(np.abs(ex).max(), 1e-300)) if len(err) else float("nan"),
        "kendall_tau": kendall_tau(ap, ex),
        "misranked_share": mis,
        "sign_agreement": float((np.sign(ap[nz]) == np.sign(ex[nz])).mean()) if nz.any() else float("nan"),
    }


def audit(
    blocks: Blocks,
    pairs: PairSet,
    approx: EdgeScores,
    n_edges: int = 50,
    seed: int = 0,
    batch_size: int = 32,
    exact_fn: Callable[..., EdgeScores] = exact,
) -> dict:
    """Exact patching on ``n_edges`` random edges vs the first-order ``approx`` (mean over prompts):
    the subset, both scores and :func:`compare`'s errors and rank agreement."""
    g = blocks.graph
    rr, ww = g.edge_index()
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(len(rr), size=min(n_edges, len(rr)), replace=False))
    sub = (rr[pick], ww[pick])
    ex = exact_fn(blocks, pairs, approx.metric, approx.ablation, sub, batch_size).mean.numpy()[sub]
    ap = approx.mean.double().cpu().numpy()[sub]
    names = g.edge_names()
    return {"edges": [names[i] for i in pick], "exact": ex, "estimate": ap, **compare(ap, ex)}


def audit_edges(
    graph: Graph, approx: list[EdgeScores], n_random: int, n_top: int, seed: int = 0
) -> dict[str, np.ndarray]:
    """The edges an audit patches, as indices into :meth:`Graph.edge_index`: ``random`` (``n_random`` drawn
    with ``seed``, the same for every method) and, per method, ``top:<method>`` (its ``n_top`` edges of largest
    |mean score|: where a circuit is chosen, so where an estimate's error matters most)."""
    rr, ww = graph.edge_index()
    rng = np.random.default_rng(seed)
    out = {"random": np.sort(rng.choice(len(rr), size=min(n_random, len(rr)), replace=False))}
    for sc in approx:
        m = np.nan_to_num(np.abs(sc.mean.double().cpu().numpy()[rr, ww]), nan=-1.0)
        out[f"top:{sc.method}"] = np.sort(np.argsort(-m, kind="stable")[: min(n_top, len(rr))])
    return out


def audit_many(
    blocks: Blocks,
    pairs: PairSet,
    approx: list[EdgeScores],
    n_random: int = 50,
    n_top: int = 50,
    seed: int = 0,
    batch_size: int = 32,
    exact_fn: Callable[..., EdgeScores] = exact,
) -> tuple[list[dict], list[dict]]:
    """Every first-order method in ``approx`` (one ablation and metric) against exact patching, on the edges
    of :func:`audit_edges` (each edge patched once, whichever methods pick it). Returns one row per (method,
    edge) (source, target, input, in_random, in_top, estimate, exact) and one summary row per (method,
    subset) with :func:`compare`'s figures."""
    if not approx:
        return [], []
    g = blocks.graph
    rr, ww = g.edge_index()
    subsets = audit_edges(g, approx, n_random, n_top, seed)
    union = np.unique(np.concatenate(list(subsets.values())))
    a0 = approx[0]
    ex_all = exact_fn(blocks, pairs, a0.metric, a0.ablation, (rr[union], ww[union]), batch_size).mean.numpy()
    ex = ex_all[rr[union], ww[union]]
    names = g.edge_names()
    rows, summary = [], []
    for sc in approx:
        if (sc.metric, sc.ablation) != (a0.metric, a0.ablation):
            raise StreetlampError("audit_many: every method must share one metric and ablation")
        ap = sc.mean.double().cpu().numpy()[rr[union], ww[union]]
        top = set(subsets[f"top:{sc.method}"].tolist())
        rnd = set(subsets["random"].tolist())
        for j, e in enumerate(union):
            src, tgt, inp = names[e]
            rows.append(
                {"method": sc.method, "source": src, "target": tgt, "input": inp, "in_random": e in rnd,
                 "in_top": e in top, "estimate": float(ap[j]), "exact": float(ex[j])}
            )  # fmt: skip
        for subset, pick in (("random", subsets["random"]), ("top", subsets[f"top:{sc.method}"])):
            at = np.searchsorted(union, pick)
            summary.append({"method": sc.method, "subset": subset, "n_edges": len(pick), **compare(ap[at], ex[at])})
    return rows, summary
