"""Scoring explanations against planted tokens, and the faithfulness metrics of the leaderboard.

Token scores are ranked by magnitude ``|score|`` (a method may give the deciding tokens large
negative scores for the explained class, e.g. ``not`` in ``not good``); only the words of the
text are ranked: ``[CLS]`` and ``[SEP]`` can never be planted and are left out.

* average precision ``sum_n (R_n - R_{n-1}) P_n`` over the distinct score thresholds (ties share
  a threshold, as in scikit-learn's ``average_precision_score``), per example, then averaged. A
  random ranking scores ``E[AP]``, a little above the base rate on short texts.
* AUPRC: the trapezoid area under the precision-recall curve (ERASER's and ferret's number).
* precision@k: ``k`` = number of planted tokens; expected fraction of the top-``k`` that are planted
  (ties at the cut broken at random). All three from :mod:`streetlamp.stats`.
* edge share: the share of ``sum |score|`` on the sequence's first and last tokens (``[CLS]`` and
  ``[SEP]`` here, never planted; ``2 / n`` if scores were uniform). AttnLRP is known to pile relevance
  on the first and last tokens; this column measures that skew for every method instead of assuming it.
* Comprehensiveness / sufficiency (DeYoung et al., ACL 2020, ERASER), AOPC over {1,5,10,20,50}%,
  tokens deleted, computed by :mod:`streetlamp.evaluation.erasure` on the method's signed scores.
"""

from __future__ import annotations

import numpy as np

from ..evaluation.common import output_probs
from ..evaluation.erasure import ErasurePlan
from ..models.adapter import Inputs, ModelAdapter
from ..stats import auprc, average_precision, precision_at_k

__all__ = ["auprc", "average_precision", "precision_at_k", "word_scores", "edge_share", "erasure_metrics"]


def word_scores(token_scores: np.ndarray) -> np.ndarray:
    """|score| of the words: drop ``[CLS]`` (first) and ``[SEP]`` (last)."""
    return np.abs(np.asarray(token_scores, dtype=np.float64)[1:-1])


def edge_share(token_scores: np.ndarray) -> float:
    """Share of ``sum |score|`` on the first and last tokens; 0 when every score is 0."""
    a = np.abs(np.asarray(token_scores, dtype=np.float64))
    total = a.sum()
    return float((a[0] + a[-1]) / total) if total > 0 and a.size > 1 else 0.0


def erasure_metrics(
    adapter: ModelAdapter, inputs: Inputs, scores: list[np.ndarray], index: np.ndarray, budget: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per-example comprehensiveness and sufficiency AOPC of the signed token scores (ranked by
    value, special tokens never removed), using streetlamp.evaluation's ERASER implementation."""
    ids = inputs.rows()
    plans = [
        ErasurePlan.build(r, np.asarray(s, np.float64), adapter.special_mask(r), None) for r, s in zip(ids, scores)
    ]
    rows = [list(r) for r in ids] + [row for p in plans for row in p.rows]
    probs = output_probs(adapter, rows, budget)
    full = probs[np.arange(len(ids)), index]
    comp, suff = np.zeros(len(ids)), np.zeros(len(ids))
    at = len(ids)
    for b, p in enumerate(plans):
        f = probs[at : at + len(p.rows), index[b]]
        at += len(p.rows)
        m, _ = p.metrics(float(full[b]), f)
        comp[b], suff[b] = m["aopc_comprehensiveness"], m["aopc_sufficiency"]
    return comp, suff
