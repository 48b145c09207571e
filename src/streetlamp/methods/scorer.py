"""Reading ``F`` on perturbed copies of a text: the scorer shared by occlusion, SHAP and LIME.

A perturbation method turns one text into *features* (groups of token positions,
:mod:`streetlamp.methods.features`), builds
perturbed copies of the text in which some features are *absent*, and reads the explained
scalar ``F`` (METHODS.md section 4) on each copy. Absent tokens are replaced by a special
token (``mask`` / ``unk`` / ``pad``) or removed (``delete``; the sequence gets shorter). Either
way the perturbed input is one the model never saw in training (out of distribution, seed 002):
every Explanation records the replacement that was actually used.

Everything here is per text (the text's real tokens only), so results do not depend on the
other texts of a batch. Perturbed rows are batched by the token budget ``batch_size``
(:mod:`streetlamp.batching`).

KV-cache reuse on causal LMs (:meth:`~streetlamp.models.adapter.ModelAdapter.prefix_forward`): a perturbed row equals the original text
up to its first changed position ``p``, and a causal model's keys and values at positions < p
depend only on those positions. So we run the original text once with ``use_cache=True``, and
for a block of rows sorted by ``p`` we feed only the suffixes from the block's smallest ``p``
with the original's cache cropped to that length. Occluding token i then recomputes only
positions >= i (about half the work of a full recompute for leave-one-out).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from .. import progress
from ..batching import default_budget, group_by_budget
from ..errors import StreetlampError
from ..models.adapter import KL, Inputs, ModelAdapter, Target
from .features import GROUPS

Replacement = Literal["mask", "unk", "pad", "delete"]
REPLACEMENTS = ("mask", "unk", "pad", "delete")


def check_replacement(replacement: str, group: str) -> None:
    if replacement not in REPLACEMENTS:
        raise StreetlampError(f"unknown replacement {replacement!r}; choose one of {', '.join(REPLACEMENTS)}")
    if group not in GROUPS:
        raise StreetlampError(f"unknown group {group!r}; choose one of {', '.join(GROUPS)}")


def occlusion_replacement(adapter: ModelAdapter, replacement: str) -> tuple[str, int | None, str | None]:
    """Like :meth:`ModelAdapter.replacement_token`, but a causal LM without a [MASK] token deletes the token.

    Its stand-ins are document markers (SmolLM2's ``unk`` is ``<|endoftext|>``), and one of them in
    the middle of a prompt wipes the context: every token then looked equally decisive (removing
    any word of "The capital of France is" dropped p(" Paris") by 0.77). Leave-one-out always keeps
    the other tokens, so deletion is well defined there (SHAP/LIME, whose coalitions can remove
    every token, keep the token fallback).
    """
    if replacement == "mask" and adapter.tokenizer.mask_token_id is None and adapter.kind == "causal_lm":
        return "delete", None, None
    return adapter.replacement_token(replacement)


def _progress(total: int, desc: str) -> progress.Bar:
    return progress.bar(total, desc, file=sys.stderr, leave=False, disable=total < 16, delay=2.0)


@dataclass
class Scorer:
    """Reads ``F`` for perturbed copies of one text (1-D ``ids``, real tokens only)."""

    adapter: ModelAdapter
    ids: torch.Tensor
    target: Target
    budget: int | None
    use_cache: bool = False
    desc: str = "perturbations"

    def __post_init__(self) -> None:
        self.use_cache = self.use_cache and self.adapter.kind == "causal_lm"
        self.budget = self.budget if self.budget is not None else default_budget(self.adapter.device)
        self.n_rows = 0  # perturbed rows evaluated (for the record)
        self.n_positions = 0  # token positions computed (for the record)
        one = Inputs.from_ids(self.adapter, [self.ids], strings=False)
        if self.use_cache:
            logits, self.cache = self.adapter.prefix_forward(one, keep_cache=True)
        else:
            logits = self.adapter.forward(one).logits
        self.kl = self.target.quantity == KL
        if self.kl:  # F(x') = -KL(p(.|x) || p(.|x')); F(x) = 0
            self.ref = torch.log_softmax(logits[0].double(), -1)
            self.index = self.adapter.resolve(one, Target(self.target.index), logits)
            self.base = 0.0
            return
        self.index = self.adapter.resolve(one, self.target, logits)
        self.base = float(self.adapter.score(logits, self.index, self.target)[0])

    def __call__(self, rows: Sequence[torch.Tensor]) -> np.ndarray:
        """``F`` of each row (1-D id tensors, lengths may differ), float64 ``[len(rows)]``."""
        out = np.empty(len(rows), dtype=np.float64)
        if not rows:
            return out
        if any(len(r) == 0 for r in rows):
            raise StreetlampError("a perturbation removed every token of the text; use a replacement token")
        self.n_rows += len(rows)
        blocks = (
            self._cache_blocks(rows)
            if self.use_cache
            else [(0, g) for g in group_by_budget([len(r) for r in rows], self.budget)]
        )
        with _progress(len(rows), self.desc) as bar:
            for start, idx in blocks:
                out[idx] = self._run(start, [rows[i] for i in idx])
                bar.update(len(idx))
        return out

    def _run(self, start: int, rows: list[torch.Tensor]) -> np.ndarray:
        batch = Inputs.from_ids(self.adapter, [r[start:] for r in rows], strings=False)
        self.n_positions += sum(batch.lengths)
        index = self.index.expand(len(rows))
        if start == 0 and not self.use_cache:
            logits = self.adapter.forward(batch).logits
        else:
            logits, _ = self.adapter.prefix_forward(batch, self.cache if start else None, start)
        if self.kl:
            ref = self.ref.to(logits.device)
            kl = (ref.exp() * (ref - torch.log_softmax(logits.double(), -1))).sum(-1)
            return (-kl).cpu().numpy()
        return self.adapter.score(logits, index, self.target).double().cpu().numpy()

    def _cache_blocks(self, rows: Sequence[torch.Tensor]) -> list[tuple[int, list[int]]]:
        """Rows sorted by their first changed position, grouped so rows x suffix length fits the budget."""
        assert self.budget is not None  # set in __post_init__
        n = len(self.ids)
        first = []
        for r in rows:
            m = min(len(r), n)
            diff = torch.nonzero(r[:m] != self.ids[:m])
            p = int(diff[0]) if len(diff) else m
            first.append(min(p, len(r) - 1))  # at least the last token is computed
        order = sorted(range(len(rows)), key=lambda i: first[i])
        blocks: list[tuple[int, list[int]]] = []
        cur: list[int] = []
        for i in order:
            if cur:
                s = first[cur[0]]
                width = max(len(rows[j]) for j in cur + [i]) - s
                # split on the budget, and when recomputing [s, first[i]) would waste over ~1/8 of the row
                if (len(cur) + 1) * width > self.budget or first[i] - s > max(2, width // 8):
                    blocks.append((s, cur))
                    cur = []
            cur.append(i)
        if cur:
            blocks.append((first[cur[0]], cur))
        return blocks


def explanation_common(method_name: str, used: str, token: str | None, requested: str) -> dict:
    """The info every perturbation Explanation carries about what replaced absent tokens."""
    what = "absent tokens removed (sequence shortened)" if used == "delete" else f"absent tokens replaced by {token!r}"
    note = "" if used == requested else f" ({requested} not in the vocabulary: fell back to {used})"
    return {
        "replacement": requested,
        "replacement_used": used,
        "replacement_token": token,
        "replacement_note": f"{method_name}: {what}{note}; perturbed inputs are out of distribution",
    }
