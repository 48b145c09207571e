"""Light against use, per head: does where a head looks predict what removing it changes?

Input: the atlas table, one row per (layer, head, sequence) (:mod:`.atlas_stats` columns, the effects of
:mod:`.atlas_effects`, ``exact`` and ``audit``: ``all`` (every pair exact), ``random`` (the random share),
``top`` (a top-estimated pair), ``""`` (estimate only)). The *unbiased* exact rows of a head are those
with ``audit`` in (``all``, ``random``): the top-estimated ones are chosen by their effect and would bias a
mean or a correlation. Per head:

* ``effect``: mean ``kl_explained`` over its unbiased exact rows with a percentile bootstrap interval
  (:func:`streetlamp.stats.bootstrap_ci`, sequences the units);
* ``rho``: Spearman's correlation across those sequences between ``prominence`` and ``kl_explained``
  (Pearson's of their ranks), with a bootstrap interval (:func:`streetlamp.stats.resample_indices`, the
  ranks of the full sample, NaN resamples dropped);
* the estimate's error on every audited pair of the head: ``est_r`` (Pearson of ``dlogp_est`` against the
  exact ``dlogp``) and ``est_mae`` (mean absolute error); ``estimate_poor`` when ``est_r < 0.5`` or
  ``est_mae > 0.5 · mean |dlogp|`` (at least 3 audited pairs);
* ``n_prominent_unused``: sequences with ``prominence >= striking`` but ``kl_explained < floor``;
  ``n_diffuse_used``: ``prominence < striking / 2`` but ``kl_explained >= floor`` (unbiased exact rows);
* flags (rules): **streetlight** = mean ``prominence >= striking`` and the effect's upper bound
  ``< floor`` (a striking pattern whose removal is within noise of zero across the corpus);
  **unremarkable_used** = mean ``prominence`` below the median over heads, the effect's lower bound
  ``>= floor`` and its mean in the top quarter of heads;
  **sink_head** = mean ``first_token`` (attention to the first token averaged over every query, the first
  included, then over sequences: Gu et al.'s α¹) above :data:`SINK_EPS` (0.3); the share of heads so
  flagged, :func:`sink_share`, is Gu et al.'s Sink₁^ε (arXiv 2410.10781, ε = 0.3; theirs on 64-token
  inputs: cut the corpus with ``--max-tokens 64`` to compare);
* ``head_type``: the largest of the mean ``previous_token``, ``duplicate_token``, ``induction``, ``sink``
  scores when it is at least 0.5, else ``""``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..stats import bootstrap_ci, percentile_interval, resample_indices
from .atlas_stats import STATS

TYPES = ("previous_token", "duplicate_token", "induction", "sink")


def _ranks(x: np.ndarray) -> np.ndarray:
    return pd.Series(x).rank().to_numpy()


def spearman_ci(a: np.ndarray, b: np.ndarray, n_boot: int, seed: int) -> tuple[float, float, float]:
    """Spearman's rho of ``a`` and ``b`` and its bootstrap interval (NaN with fewer than 3 pairs)."""
    ok = ~(np.isnan(a) | np.isnan(b))
    a, b = a[ok], b[ok]
    if len(a) < 3:
        return float("nan"), float("nan"), float("nan")
    ra, rb = _ranks(a), _ranks(b)

    def pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        x = x - x.mean(-1, keepdims=True)
        y = y - y.mean(-1, keepdims=True)
        den = np.sqrt((x * x).sum(-1) * (y * y).sum(-1))
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, (x * y).sum(-1) / np.where(den > 0, den, 1), np.nan)

    rho = float(pearson(ra, rb))
    idx = resample_indices(len(a), n_boot, seed)
    lo, hi = percentile_interval(pearson(ra[idx], rb[idx]))
    return rho, lo, hi


SINK_EPS = 0.3  # Sink₁^ε's threshold (Gu et al. 2024)


def sink_share(summary: pd.DataFrame) -> float:
    """Sink₁^ε of the atlas: the share of heads flagged ``sink_head`` (NaN without the column)."""
    if "sink_head" not in summary or "first_token" not in summary or summary["first_token"].isna().all():
        return float("nan")
    return float(summary["sink_head"].mean())


def summarise(df: pd.DataFrame, floor: float, striking: float, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """The per-head summary (module docstring), one row per (layer, head)."""
    rows = []
    for (l, h), g in df.groupby(["layer", "head"], sort=True):
        r: dict = {"layer": int(l), "head": int(h)}
        for k in (*STATS, "dlogp_est", "dla"):  # (first_token is missing from a table recorded before it)
            r[k] = float(np.nanmean(g[k])) if k in g and g[k].notna().any() else float("nan")
        r["abs_dlogp_est"] = float(np.nanmean(np.abs(g["dlogp_est"])))
        ub = g[g.audit.isin(["all", "random"])]
        kl = ub["kl_explained"].to_numpy(np.float64)
        r["effect"], r["effect_low"], r["effect_high"], r["n_exact"] = bootstrap_ci(kl, n_boot, seed=seed)
        for k in ("kl_mean", "dloss", "dlogp"):
            r[k] = float(np.nanmean(ub[k])) if len(ub) and ub[k].notna().any() else float("nan")
        r["rho"], r["rho_low"], r["rho_high"] = spearman_ci(ub["prominence"].to_numpy(np.float64), kl, n_boot, seed)
        au = g[g.exact]
        est, ex = au["dlogp_est"].to_numpy(np.float64), au["dlogp"].to_numpy(np.float64)
        r["n_audited"] = int(len(au))
        if len(au) >= 3 and est.std() > 0 and ex.std() > 0:
            r["est_r"] = float(np.corrcoef(est, ex)[0, 1])
        else:
            r["est_r"] = float("nan")
        r["est_mae"] = float(np.mean(np.abs(est - ex))) if len(au) else float("nan")
        scale = float(np.mean(np.abs(ex))) if len(au) else float("nan")
        r["estimate_poor"] = bool(len(au) >= 3 and (not r["est_r"] >= 0.5 or r["est_mae"] > 0.5 * scale))
        prom = ub["prominence"].to_numpy(np.float64)
        r["n_prominent_unused"] = int(((prom >= striking) & (kl < floor)).sum())
        r["n_diffuse_used"] = int(((prom < striking / 2) & (kl >= floor)).sum())
        types = {t: r[t] for t in TYPES}
        best = max(types, key=lambda t: -np.inf if np.isnan(types[t]) else types[t])
        r["head_type"] = best if types[best] >= 0.5 else ""
        rows.append(r)
    s = pd.DataFrame(rows)
    s["streetlight"] = (s.prominence >= striking) & (s.effect_high < floor)
    s["sink_head"] = s["first_token"] > SINK_EPS
    eff_q = np.nanquantile(s.effect, 0.75) if s.effect.notna().any() else np.nan
    s["unremarkable_used"] = (s.prominence < np.nanmedian(s.prominence)) & (s.effect_low >= floor) & (s.effect >= eff_q)
    return s


def top_sequences(g: pd.DataFrame, k: int, by_effect: str) -> tuple[list[int], list[int]]:
    """A head's top ``k`` sequences by ``prominence`` and by ``by_effect`` (largest first, NaN last)."""
    att = g.sort_values("prominence", ascending=False, na_position="last").sequence.head(k)
    eff = g.assign(_e=g[by_effect].abs()).sort_values("_e", ascending=False, na_position="last").sequence.head(k)
    return [int(x) for x in att], [int(x) for x in eff]


def deciles(x: pd.Series) -> pd.Series:
    """Decile 1..10 of each value within its head (10 = the top tenth), NaN where the value is."""
    return np.ceil(x.rank(pct=True) * 10).clip(1, 10)
