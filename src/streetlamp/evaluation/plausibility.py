"""Plausibility against human rationales (DeYoung et al., ACL 2020; Jacovi & Goldberg, ACL 2020
separate plausibility from faithfulness).

The human rationale (character spans) becomes a mask over the model's tokens (a token is in it when
its character span overlaps an evidence span; the model's structural special tokens never are). For
a method's token scores over the other tokens (all from :mod:`streetlamp.stats`, tie-aware: tokens
with equal scores share a threshold, so no metric depends on the order of tied tokens):

* ``average_precision``: ``sum_n (R_n - R_{n-1}) P_n`` over the distinct score thresholds
  (scikit-learn's ``average_precision_score``);
* ``auprc``: the trapezoid area under the precision-recall curve, as ERASER and ferret report it
  (``sklearn.metrics.auc(recall, precision)``); lower than average precision in general;
* ``token_f1``: F1 of the top-k tokens, k = the number of rationale tokens (ERASER's hard
  rationale from soft scores when k is the human length); with ties at the cut, its expectation
  over random tie-breaking (precision = recall = expected precision@k);
* ``iou_f1``: ERASER's IOU F1: contiguous runs of predicted / human tokens are spans, a predicted
  span matches when its IOU with some human span is >= 0.5; F1 of span precision and recall. The
  predicted tokens are those scoring at least the k-th score, so a tie at the cut keeps every tied
  token (order-free; the span has no simple expectation over tie-breaks).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..models.adapter import ModelAdapter
from ..stats import auprc, average_precision, precision_at_k


def rationale_mask(
    adapter: ModelAdapter, text: str, ids: Sequence[int], spans: Sequence[tuple[int, int]]
) -> np.ndarray | None:
    """Token mask of the rationale, or None when offsets are unavailable or do not line up."""
    try:
        enc = adapter.tokenizer(text, return_offsets_mapping=True, truncation=True, max_length=len(ids))
    except (NotImplementedError, ValueError):
        return None
    if list(enc["input_ids"]) != list(ids):
        return None
    special = adapter.special_mask(ids)
    out = np.zeros(len(ids), dtype=bool)
    for i, (s, e) in enumerate(enc["offset_mapping"]):
        if special[i] or e <= s:
            continue
        out[i] = any(s < se and ss < e for ss, se in spans)
    return out


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    out, start = [], None
    for i, m in enumerate(list(mask) + [False]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def _iou(a: tuple[int, int], b: tuple[int, int]) -> float:
    inter = max(0, min(a[1], b[1]) - max(a[0], b[0]))
    return inter / (max(a[1], b[1]) - min(a[0], b[0]))


def _f1(p: float, r: float) -> float:
    return 0.0 if p + r == 0 else 2 * p * r / (p + r)


def plausibility(scores: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """Metrics over rankable tokens: ``scores`` and ``gold`` already restricted to them."""
    gold = np.asarray(gold, bool)
    k = int(gold.sum())
    if k == 0:
        return {}
    s = np.asarray(scores, np.float64)
    pred = s >= np.sort(s)[::-1][k - 1]
    p_at_k = precision_at_k(scores, gold, k)  # = recall@k, since k = |gold|
    token_f1 = _f1(p_at_k, p_at_k)
    ps, gs = _runs(pred), _runs(gold)
    pm = sum(any(_iou(p, g) >= 0.5 for g in gs) for p in ps)
    gm = sum(any(_iou(p, g) >= 0.5 for p in ps) for g in gs)
    return {
        "average_precision": average_precision(scores, gold),
        "auprc": auprc(scores, gold),
        "token_f1": token_f1,
        "iou_f1": _f1(pm / len(ps), gm / len(gs)),
    }
