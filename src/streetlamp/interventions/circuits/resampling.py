"""Error bars for a circuit along three resampling axes (issue 24 item 4; METHODS.md §9).

Each resample **re-discovers** the circuit (scores on the resample, top-k, pruned) and measures its
faithfulness on the resample, so the intervals hold the whole pipeline's variance, not only the metric's:

* ``prompts``: a bootstrap over the prompts (:func:`streetlamp.stats.resample_indices` over the n pairs);
  a prompt's scores do not depend on the other prompts, so the resample's scores are the mean of its
  prompts' per-prompt scores.
* ``templates``: a cluster bootstrap over the templates: the templates are resampled with replacement
  (``resample_indices`` over the t templates) and a resample holds every prompt of each drawn template
  (a template drawn twice, twice).
* ``corrupt``: the clean prompts, answers and metric fixed, the corrupted inputs drawn afresh
  (:func:`.tasks.resample_corrupt`): scores, the circuits and ``m(∅)`` are recomputed for each draw.
  Only for ``patch`` ablation (mean and zero never read the corrupted prompts).

Per axis and size: f of each resample's circuit, its percentile interval
(:func:`streetlamp.stats.percentile_interval`), per resample the two raw-axis areas of its |score|-ranked
curve (:func:`.faithfulness.areas`: ``area_under`` and ``area_from_1``, MIB's CMD when the sizes are
MIB's ten; MIB's CPR ranks by signed score, which the resamples do not, so it is not named) and their
intervals; at the
chosen size, each edge's **inclusion frequency** (the share of resamples whose circuit holds it), the
**Jaccard index** ``|A ∩ B| / |A ∪ B|`` of each resampled circuit with the all-data circuit, and the
**mean pairwise Jaccard** over every pair of resampled circuits (:func:`pairwise_jaccard`: arXiv
2510.00845's stability statistic, its bar 0.8 over at least 100 resamples).

What a resample costs (``measure``): a prompt or template resample's circuits are its prompts' stored
per-prompt scores averaged, top k, pruned: no forward. Its faithfulness needs masked forwards, one per
(distinct circuit, distinct prompt) not measured before (:class:`Measured`): ``measure="all"`` at every
size, ``"chosen"`` at the chosen size only (the verdict's), ``"none"`` not at all (f and the areas NaN;
Jaccard, pairwise Jaccard and inclusion only, and no verdict). The corrupted axis re-scores every
resample (one ``score_fn`` call, every size cut from it) whatever ``measure`` says; the command's EAP
score function reuses the clean forward and backward there (:class:`.scores.EapCleanReuse`). ``forwards`` in the summary counts the (circuit,
prompt) masked forwards the resamples ran.

**Stability verdict** (one rule, :data:`STABLE_JACCARD`, :data:`STABLE_F_WIDTH`): a circuit is *stable*
along an axis when its resampled circuits share on average at least half of their edges with the
all-data one (mean Jaccard >= 0.5) **and** its faithfulness interval at that size is at most 0.25 wide;
otherwise *not stable*, with the failed part named (and never stable when the all-data circuit at that
size is empty after pruning). Without faithfulness (``measure="none"``) there is no verdict (``stable`` None).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ... import progress
from ...errors import StreetlampError
from ...models.adapter import ModelAdapter
from ...stats import percentile_interval, resample_indices
from .blocks import Blocks
from .faithfulness import areas, check_fractions, circuit, circuit_metrics, faithfulness, n_at
from .scores import EdgeScores
from .tasks import PairSet, TaskPair, encode_pairs, resample_corrupt

AXES = ("prompts", "templates", "corrupt")
STABLE_JACCARD = 0.5
STABLE_F_WIDTH = 0.25
MEASURES = ("all", "chosen", "none")


def jaccard(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a ∩ b| / |a ∪ b|`` of two edge sets (``[R, U]`` bool); 1 when both are empty."""
    u = int((a | b).sum())
    return float((a & b).sum()) / u if u else 1.0


def pairwise_jaccard(masks: list[torch.Tensor] | torch.Tensor) -> float:
    """Mean Jaccard index over every unordered pair of the edge sets ``masks`` (each ``[R, U]`` bool; two
    empty sets count 1, as :func:`jaccard`): arXiv 2510.00845's stability statistic. Intersections by one
    matrix product of the 0/1 sets (exact integers in float64 below 2**53 edges)."""
    m = torch.stack([torch.as_tensor(x).reshape(-1) for x in masks]).double()  # [n, edges]
    n = m.shape[0]
    if n < 2:
        raise StreetlampError(f"pairwise Jaccard needs at least 2 edge sets, got {n}")
    inter = m @ m.T
    size = m.sum(1)
    union = size[:, None] + size[None, :] - inter
    j = torch.where(union > 0, inter / union.clamp(min=1), torch.ones_like(inter))
    iu = torch.triu_indices(n, n, 1)
    return float(j[iu[0], iu[1]].mean())


def template_resamples(templates: list[int], n: int, seed: int) -> list[np.ndarray]:
    """Cluster bootstrap: ``n`` resamples of the distinct templates (with replacement), each the prompt
    indices of every drawn template, in draw order."""
    ts = sorted(set(templates))
    rows = {t: [i for i, x in enumerate(templates) if x == t] for t in ts}
    return [np.array([i for j in draw for i in rows[ts[j]]]) for draw in resample_indices(len(ts), n, seed)]


def corrupt_resamples(adapter: ModelAdapter, task: str, raw: list[TaskPair], n: int, seed: int) -> list[PairSet]:
    """``n`` encoded pair sets with resampled corrupted inputs (:func:`.tasks.resample_corrupt`, seeds
    ``seed + 1 .. seed + n``). A redrawn corruption whose token length differs from its clean prompt's is
    put back to the pair's own corrupted prompt."""
    out = []
    clean_len = adapter.encode([p.clean for p in raw]).lengths
    for r in range(n):
        new = resample_corrupt(task, raw, seed + 1 + r)
        lens = adapter.encode([p.corrupt for p in new]).lengths
        fixed = [q if m == c else p for p, q, m, c in zip(raw, new, lens, clean_len)]
        out.append(encode_pairs(adapter, fixed))
    return out


class Measured:
    """``m(C)`` per prompt of every edge set measured so far on one pair set, keyed by the set's bytes:
    a resample that selects a circuit already measured on some of its prompts reuses those values and
    runs only the missing (circuit, prompt) forwards. ``reused`` counts the (circuit, prompt) values
    served from the cache."""

    def __init__(self, blocks: Blocks, pairs: PairSet, ablation: str, metric: str, batch_size: int) -> None:
        self.blocks, self.pairs, self.metric, self.batch_size = blocks, pairs, metric, batch_size
        self.ablation = ablation
        self.values: dict[bytes, np.ndarray] = {}  # key -> [n] (NaN: not measured yet)
        self.reused = 0
        self.computed = 0  # (circuit, prompt) values measured by a masked forward

    def __call__(self, masks: list[torch.Tensor], rows: list[int]) -> np.ndarray:
        """``[len(masks), len(rows)]``: m of each circuit on prompts ``rows`` (distinct indices)."""
        keys = [np.packbits(m.numpy()).tobytes() for m in masks]
        for k in keys:
            self.values.setdefault(k, np.full(len(self.pairs), np.nan))
        todo: dict[tuple[int, ...], list[bytes]] = {}  # the prompts still missing -> the circuits missing them
        for k in dict.fromkeys(keys):
            miss = tuple(i for i in rows if np.isnan(self.values[k][i]))
            self.reused += len(rows) - len(miss)
            if miss:
                todo.setdefault(miss, []).append(k)
        by_key = dict(zip(keys, masks))
        for miss, ks in todo.items():  # mean ablation keeps the all-data reference, as m(∅) does
            self.computed += len(miss) * len(ks)
            mv = circuit_metrics(
                self.blocks, self.pairs.select(list(miss)), [by_key[k] for k in ks], self.ablation, self.metric,
                self.batch_size, reference=self.pairs,
            )  # fmt: skip
            for k, v in zip(ks, mv):
                self.values[k][list(miss)] = v
        return np.stack([self.values[k][rows] for k in keys])


def verdict(jaccard_mean: float, f_width: float) -> tuple[bool, str]:
    """The stability rule of the module docstring: (stable, a plain sentence)."""
    why = []
    if not jaccard_mean >= STABLE_JACCARD:
        why.append(
            f"its resampled circuits share on average {jaccard_mean:.2f} of their edges with it "
            f"(Jaccard; rule >= {STABLE_JACCARD})"
        )
    if not f_width <= STABLE_F_WIDTH:
        why.append(f"its faithfulness interval is {f_width:.2f} wide (rule <= {STABLE_F_WIDTH})")
    if why:
        return False, "NOT stable: " + "; ".join(why)
    return True, (
        f"stable: mean Jaccard {jaccard_mean:.2f} >= {STABLE_JACCARD}, faithfulness interval {f_width:.2f} wide "
        f"<= {STABLE_F_WIDTH}"
    )


@dataclass
class Resampled:
    """One axis's resamples: ``f`` ``[n, sizes]`` (NaN where not measured), ``area_under``/``area_from_1``
    ``[n]``, ``jaccard`` ``[n, sizes]`` (with the all-data circuit), ``pairwise`` ``[sizes]`` (mean pairwise
    Jaccard among the resampled circuits), ``inclusion`` ``[R, U]`` at the chosen size, ``table`` (one row
    per size), ``summary``."""

    axis: str
    fractions: np.ndarray
    f: np.ndarray
    area_under: np.ndarray
    area_from_1: np.ndarray
    jaccard: np.ndarray
    pairwise: np.ndarray
    inclusion: torch.Tensor
    table: object  # pandas DataFrame
    summary: dict


def resample(
    blocks: Blocks,
    pairs: PairSet,
    scores: EdgeScores,
    fractions: list[float] | np.ndarray,
    axis: str,
    n: int = 20,
    seed: int = 0,
    at: float | None = None,
    level: float = 0.95,
    batch_size: int = 32,
    corrupt_sets: list[PairSet] | None = None,
    score_fn: Callable[[PairSet], EdgeScores] | None = None,
    measure: str = "all",
) -> Resampled:
    """Resample along ``axis`` (``prompts``, ``templates``, ``corrupt``) ``n`` times; ``scores`` are the
    all-data scores (per prompt). ``at``: the size (one of ``fractions``; default the largest) of the
    inclusion frequency and the verdict. ``corrupt``: give ``corrupt_sets`` (the pairs with resampled
    corrupted inputs, the clean prompts unchanged) and ``score_fn`` (the method on a pair set).
    ``measure``: the sizes whose faithfulness each resample measures (``all``, ``chosen``, ``none``)."""
    import pandas as pd

    if axis not in AXES:
        raise StreetlampError(f"unknown resampling axis {axis!r}; choose from {', '.join(AXES)}")
    if n < 2:
        raise StreetlampError(f"resampling needs at least 2 resamples, got {n}")
    if measure not in MEASURES:
        raise StreetlampError(f"unknown resample measure {measure!r}; choose from {', '.join(MEASURES)}")
    x = check_fractions(fractions)
    at = float(x[-1]) if at is None else float(at)
    if not np.isclose(x, at).any():
        raise StreetlampError(f"the chosen size {at:g} is not one of the swept sizes")
    ja = int(np.flatnonzero(np.isclose(x, at))[0])
    g, ab, metric = blocks.graph, scores.ablation, scores.metric
    ks = [n_at(fr, g.n_edges) for fr in x]
    meas = {"all": list(range(len(ks))), "chosen": [ja], "none": []}[measure]  # the sizes whose f is measured
    per = scores.per_prompt.sum(1) if scores.per_prompt.dim() == 4 else scores.per_prompt
    base = [circuit(g, scores.mean, k) for k in ks]
    full, empty = g.valid(), torch.zeros_like(g.valid())
    f = np.full((n, len(ks)), np.nan)
    jac = np.zeros((n, len(ks)))
    kept: list[list[torch.Tensor]] = []  # each resample's circuits, for the pairwise Jaccard
    forwards = 0  # (circuit, prompt) masked forwards of the resamples' faithfulness
    inc = torch.zeros(g.n_readers, g.n_writers, dtype=torch.float64)
    reused = 0  # (circuit, prompt) values served by :class:`Measured` (prompts and templates axes)
    desc = f"circuit {scores.method}: resampling {axis}"
    if axis == "corrupt":
        if ab != "patch":
            raise StreetlampError(f"resampling the corrupted inputs needs patch ablation (the scores use {ab})")
        if corrupt_sets is None or score_fn is None or len(corrupt_sets) < n:
            raise StreetlampError(f"the corrupt axis needs {n} resampled pair sets and a score function")
        m_full = circuit_metrics(blocks, pairs, [full], ab, metric, batch_size)[0] if meas else None
        forwards += len(pairs) if meas else 0
        with progress.bar(n, desc) as bar:
            for r in range(n):
                p = corrupt_sets[r]
                mean = score_fn(p).mean  # one score pass per resample, every size cut from it
                masks = [circuit(g, mean, k) for k in ks]
                kept.append(masks)
                if m_full is not None:
                    mv = circuit_metrics(blocks, p, [empty] + [masks[j] for j in meas], ab, metric, batch_size)
                    forwards += len(p) * (1 + len(meas))  # m(∅) under patching: the corrupted forward
                    f[r, meas] = faithfulness(mv[1:], mv[0], m_full)
                jac[r] = [jaccard(m, b) for m, b in zip(masks, base)]
                inc += masks[ja].double()
                bar.update()
    else:
        draws = (
            list(resample_indices(len(pairs), n, seed))
            if axis == "prompts"
            else template_resamples(pairs.templates, n, seed)
        )
        measured = Measured(blocks, pairs, ab, metric, batch_size)
        mv0 = measured([full, empty], list(range(len(pairs)))) if meas else None
        with progress.bar(n, desc) as bar:
            for r, idx in enumerate(draws):
                uniq, inv = np.unique(idx, return_inverse=True)
                masks = [circuit(g, per[torch.as_tensor(idx)].mean(0), k) for k in ks]
                kept.append(masks)
                if meas:
                    assert mv0 is not None
                    mv = measured([masks[j] for j in meas], uniq.tolist())[:, inv]
                    f[r, meas] = faithfulness(mv, mv0[1][idx], mv0[0][idx])
                reused, forwards = measured.reused, measured.computed
                jac[r] = [jaccard(m, b) for m, b in zip(masks, base)]
                inc += masks[ja].double()
                bar.update()
    inc /= n
    pair = np.array([pairwise_jaccard([c[j] for c in kept]) for j in range(len(ks))])
    nan2 = (float("nan"), float("nan"))
    ab_areas = np.array([areas(x, fr) if measure == "all" else nan2 for fr in f])
    ci = np.array([percentile_interval(f[:, j], level) if j in meas else nan2 for j in range(len(ks))])
    jci = np.array([percentile_interval(jac[:, j], level) for j in range(len(ks))])
    table = pd.DataFrame(
        {
            "axis": axis,
            "method": scores.method,
            "ablation": ab,
            "size_fraction": x,
            "n_edges_requested": ks,
            "faithfulness_mean": f.mean(0),  # NaN at a size not measured
            "ci_low": ci[:, 0],
            "ci_high": ci[:, 1],
            "jaccard_mean": jac.mean(0),
            "jaccard_ci_low": jci[:, 0],
            "jaccard_ci_high": jci[:, 1],
            "jaccard_pairwise": pair,
            "n_resamples": n,
        }
    )
    in_base = base[ja]
    stable: bool | None
    stable, why = verdict(float(jac[:, ja].mean()), float(ci[ja, 1] - ci[ja, 0]))
    if not meas:
        stable, why = None, "no verdict: faithfulness not measured on the resamples (Jaccard only)"
    elif not bool(in_base.any()):
        stable, why = (
            False,
            "NOT stable: no circuit at this size (its top edges join nothing from the input to the logits)",
        )
    summary = {
        "axis": axis,
        "method": scores.method,
        "size": at,
        "n_resamples": n,
        "level": level,
        "area_under_mean": float(ab_areas[:, 0].mean()),
        "area_under_ci": percentile_interval(ab_areas[:, 0], level),
        "area_from_1_mean": float(ab_areas[:, 1].mean()),
        "area_from_1_ci": percentile_interval(ab_areas[:, 1], level),
        "jaccard_mean": float(jac[:, ja].mean()),
        "jaccard_pairwise": float(pair[ja]),
        "measure": measure,
        "forwards": int(forwards),
        "inclusion_of_circuit": float(inc[in_base].mean()) if bool(in_base.any()) else float("nan"),
        "stable": stable,
        "verdict": why,
        "reused_measurements": reused,
    }
    return Resampled(axis, x, f, ab_areas[:, 0], ab_areas[:, 1], jac, pair, inc, table, summary)


def stability(
    blocks: Blocks,
    task: str,
    raw: list[TaskPair],
    pairs: PairSet,
    scores: EdgeScores,
    fractions: list[float] | np.ndarray,
    axes: list[str],
    n: int,
    seed: int,
    at: float,
    score_fn: Callable[[PairSet], EdgeScores],
    batch_size: int = 32,
    measure: str = "all",
) -> tuple[list[dict], list[str], list[dict]]:
    """Every requested axis for one method: the rows of ``stability.csv`` (one per axis and size, with the
    axis's CPR/CMD intervals and verdict), one plain line per axis and each axis's summary (the verdict in
    words, ``reused_measurements``: the (circuit, prompt) values :class:`Measured` served without a
    forward). An axis the task cannot supply is skipped with a line saying why (one template; corrupted
    inputs under mean or zero ablation) and no summary."""
    rows: list[dict] = []
    lines: list[str] = []
    summaries: list[dict] = []
    for axis in axes:
        if axis == "templates" and len(set(pairs.templates)) < 2:
            lines.append(f"{scores.method}: templates not resampled (the pairs have one template)")
            continue
        if axis == "corrupt" and scores.ablation != "patch":
            lines.append(f"{scores.method}: corrupted inputs not resampled ({scores.ablation} ablation reads none)")
            continue
        sets = corrupt_resamples(blocks.adapter, task, raw, n, seed) if axis == "corrupt" else None
        res = resample(
            blocks, pairs, scores, fractions, axis, n, seed, at, batch_size=batch_size, corrupt_sets=sets,
            score_fn=score_fn, measure=measure,
        )  # fmt: skip
        sm = res.summary
        summaries.append(
            {k: (list(v) if isinstance(v, tuple) else v) for k, v in sm.items()}  # JSON-plain for the manifest
        )
        t: Any = res.table
        extra = {
            "area_under_mean": sm["area_under_mean"],
            "area_under_ci_low": sm["area_under_ci"][0],
            "area_under_ci_high": sm["area_under_ci"][1],
            "area_from_1_mean": sm["area_from_1_mean"],
            "area_from_1_ci_low": sm["area_from_1_ci"][0],
            "area_from_1_ci_high": sm["area_from_1_ci"][1],
            "stable": sm["stable"],
        }
        rows += [{**r, **extra} for r in t.to_dict("records")]
        j = int(np.flatnonzero(np.isclose(res.fractions, at))[0])
        f_part = (
            f"f at {at:g} {t['faithfulness_mean'].iloc[j]:.3f} [{t['ci_low'].iloc[j]:.3f}, {t['ci_high'].iloc[j]:.3f}], "
            if measure != "none"
            else ""
        )
        area_part = (
            f"area under f {sm['area_under_mean']:.3f} [{sm['area_under_ci'][0]:.3f}, {sm['area_under_ci'][1]:.3f}] "
            "(|score| ranking, raw fraction axis); "
            if measure == "all"
            else ""
        )
        lines.append(
            f"{scores.method} over {n} resampled {axis}: {f_part}{area_part}mean pairwise Jaccard at {at:g} "
            f"{sm['jaccard_pairwise']:.3f} (arXiv 2510.00845's bar 0.8), with the all-data circuit "
            f"{sm['jaccard_mean']:.3f}; {sm['forwards']} masked prompt forwards; circuit {sm['verdict']}"
        )
    return rows, lines, summaries
