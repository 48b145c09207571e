"""Scoring explanations against planted tokens, and the faithfulness metrics of the leaderboard.

Token scores are ranked by magnitude ``|score|`` (a method may give the deciding tokens large
negative scores for the explained class, e.g. ``not`` in ``not good``); only the words of the
text are ranked: ``[CLS]`` and ``[SEP]`` can never be planted and are left out.

* AUPRC: average precision ``sum_n (R_n - R_{n-1}) P_n`` over the distinct score thresholds
  (ties share a threshold, as in scikit-learn's ``average_precision_score``), per example, then
  averaged. A random ranking scores ``E[AP]``, a little above the base rate on short texts.
* precision@k: ``k`` = number of planted tokens; fraction of the top-``k`` that are planted.
* Comprehensiveness / sufficiency (DeYoung et al., ACL 2020, ERASER): ``p(x) - p(x without the
  top-k words)`` and ``p(x) - p(only the top-k words)`` for the explained class, AOPC = mean over
  ``k`` = max(1, round(f * n_words)) for f in {1, 5, 10, 20, 50}%. Words are deleted from the text.
  ERASER's AOPC also averages in the k = 0 bin (which is 0); we average over the five bins only.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..models.adapter import ModelAdapter

BINS = (0.01, 0.05, 0.10, 0.20, 0.50)


def average_precision(scores: np.ndarray, relevant: np.ndarray) -> float:
    """Tie-aware average precision of ranking ``scores`` (higher first) against bool ``relevant``."""
    scores = np.asarray(scores, dtype=np.float64)
    rel = np.asarray(relevant, dtype=bool)
    if rel.sum() == 0:
        raise ValueError("average precision needs at least one relevant item")
    order = np.argsort(-scores, kind="mergesort")
    s, r = scores[order], rel[order]
    last = np.r_[np.nonzero(np.diff(s))[0], len(s) - 1]  # last index of each distinct threshold
    tp = np.cumsum(r)[last]
    precision = tp / (last + 1)
    recall = tp / rel.sum()
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def precision_at_k(scores: np.ndarray, relevant: np.ndarray, k: int | None = None) -> float:
    rel = np.asarray(relevant, dtype=bool)
    k = int(rel.sum()) if k is None else k
    top = np.argsort(-np.asarray(scores, dtype=np.float64), kind="mergesort")[:k]
    return float(rel[top].mean())


def word_scores(token_scores: np.ndarray) -> np.ndarray:
    """|score| of the words: drop ``[CLS]`` (first) and ``[SEP]`` (last)."""
    return np.abs(np.asarray(token_scores, dtype=np.float64)[1:-1])


@torch.no_grad()
def class_probs(adapter: ModelAdapter, texts: Sequence[str], index: np.ndarray, chunk: int = 512) -> np.ndarray:
    out = []
    for s in range(0, len(texts), chunk):
        logits = adapter.forward(adapter.encode(list(texts[s:s + chunk]))).logits
        p = torch.softmax(logits.float(), -1).cpu().numpy()
        out.append(p[np.arange(len(p)), index[s:s + chunk]])
    return np.concatenate(out)


def erasure_metrics(adapter: ModelAdapter, words: list[list[str]], scores: list[np.ndarray],
                    index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-example comprehensiveness and sufficiency AOPC for word scores (ranked by value)."""
    base = class_probs(adapter, [" ".join(w) for w in words], index)
    comp = np.zeros(len(words))
    suff = np.zeros(len(words))
    for f in BINS:
        removed, kept = [], []
        for w, s in zip(words, scores):
            k = max(1, int(round(f * len(w))))
            top = set(np.argsort(-s, kind="mergesort")[:k].tolist())
            removed.append(" ".join(x for i, x in enumerate(w) if i not in top))
            kept.append(" ".join(x for i, x in enumerate(w) if i in top))
        comp += base - class_probs(adapter, removed, index)
        suff += base - class_probs(adapter, kept, index)
    return comp / len(BINS), suff / len(BINS)
