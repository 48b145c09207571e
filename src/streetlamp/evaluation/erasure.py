"""Erasure metrics (DeYoung et al., ACL 2020, "ERASER"), from a token ranking.

With ``F`` the probability of the explained class ``c`` and ``r_k`` the top-k% tokens of the ranking
(special tokens are never ranked nor removed):

* comprehensiveness ``comp_k = F(x) - F(x \\ r_k)`` (remove the rationale; high = faithful);
* sufficiency ``suff_k = F(x) - F(r_k)`` (keep only the rationale; low = faithful);
* AOPC: the mean of ``comp_k`` / ``suff_k`` over k in {1, 5, 10, 20, 50}% (ERASER's bins);
  ``|r_k| = ceil(k/100 * m)`` of the ``m`` rankable tokens, at least 1 (with floor, 1% of a
  sentence would be no token at all);
* deletion / insertion curves: ``F`` after removing (deletion) or keeping only (insertion) the
  top ``round(f * m)`` tokens for f = 0, 0.1, ..., 1; their area by the trapezoid rule over f
  (deletion area: low = faithful; insertion area: high = faithful).

``replacement="delete"`` removes the tokens from the sequence (ERASER); ``"mask"`` replaces them with
:meth:`~streetlamp.models.adapter.ModelAdapter.replacement_token` (the tokenizer's mask token, or its
fallbacks). The choice is recorded in the manifest. On a causal LM, deletion follows
:class:`~streetlamp.methods.removal.Removal`'s decoder rule (pass ``removal``): a removed first token is
replaced by the document-start token and the explained last position is never ranked nor removed. "Special" means the model's structural special
tokens (:meth:`~streetlamp.models.adapter.ModelAdapter.special_mask`); an [UNK] is erased like any word.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..methods.removal import Removal
from .common import rank_desc

PERCENTS = (1, 5, 10, 20, 50)
CURVE_FRACTIONS = tuple(i / 10 for i in range(11))


def _apply_plain(ids: list[int], remove: set[int], rep: int | None) -> list[int]:
    if rep is None:
        return [t for i, t in enumerate(ids) if i not in remove]
    return [rep if i in remove else t for i, t in enumerate(ids)]


@dataclass
class ErasurePlan:
    """The rows to run for one (example, ranking) and how to turn their outputs into metrics."""

    rows: list[list[int]]
    n_rankable: int

    @staticmethod
    def build(
        ids: list[int], scores: np.ndarray, special: np.ndarray, rep: int | None, removal: Removal | None = None
    ) -> ErasurePlan:
        if removal is not None:
            special = special | removal.protected(len(ids))
            _apply = lambda ids, remove, rep: removal.ids(ids, remove)  # noqa: E731
        else:
            _apply = _apply_plain
        order = rank_desc(np.asarray(scores, dtype=np.float64), ~special)
        m = len(order)
        rows: list[list[int]] = []
        if m == 0:
            return ErasurePlan(rows, 0)
        specials = set(np.flatnonzero(special).tolist())
        all_rankable = set(order.tolist())
        for k in PERCENTS:
            top = set(order[: min(m, max(1, math.ceil(k / 100 * m)))].tolist())
            rows.append(_apply(ids, top, rep))  # comprehensiveness: x \ r_k
            rows.append(_apply(ids, all_rankable - top, rep))  # sufficiency: r_k (+ special tokens)
        for f in CURVE_FRACTIONS:
            top = set(order[: int(round(f * m))].tolist())
            rows.append(_apply(ids, top, rep))  # deletion
            rows.append(_apply(ids, all_rankable - top, rep))  # insertion
        assert all(len(r) >= len(specials) for r in rows)
        return ErasurePlan(rows, m)

    def metrics(self, f_full: float, f_rows: np.ndarray) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        """Scalar metrics and raw curves from ``F`` of the full input and of every planned row."""
        if self.n_rankable == 0:
            return {}, {}
        nk = len(PERCENTS)
        comp = f_full - f_rows[0 : 2 * nk : 2]
        suff = f_full - f_rows[1 : 2 * nk : 2]
        dele = f_rows[2 * nk :: 2]
        ins = f_rows[2 * nk + 1 :: 2]
        x = np.array(CURVE_FRACTIONS)
        m: dict[str, float] = {f"comprehensiveness@{k}": float(c) for k, c in zip(PERCENTS, comp)}
        m.update({f"sufficiency@{k}": float(s) for k, s in zip(PERCENTS, suff)})
        m["aopc_comprehensiveness"] = float(comp.mean())
        m["aopc_sufficiency"] = float(suff.mean())
        m["deletion_area"] = float(np.trapezoid(dele, x))
        m["insertion_area"] = float(np.trapezoid(ins, x))
        arrays = {
            "comprehensiveness": comp.astype(np.float32),
            "sufficiency": suff.astype(np.float32),
            "deletion_curve": dele.astype(np.float32),
            "insertion_curve": ins.astype(np.float32),
        }
        return m, arrays
