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
positions >= i (about half the work of a full recompute for leave-one-out). On a short text those blocks
are small passes (a pass of few tokens costs mostly the reading of every weight), so the suffixes can
instead be packed end to end, each from its own first changed position
(:mod:`streetlamp.models.packed`): a long one and the short ones fill each batch row, and the positions
computed are exactly the changed ones. A cost model in token positions (:meth:`Scorer._cost`) picks the
cheaper plan; both give the full recompute's numbers to float rounding.
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
from ..models.packed import packable, packed_forward
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
    if replacement == "mask" and adapter.tokenizer.mask_token_id is None and adapter.kind.removal == "causal":
        return "delete", None, None
    return adapter.replacement_token(replacement)


# one forward pass costs about this many token positions besides its tokens (each weight is read once per
# pass: on SmolLM2 with one CPU thread ~45 ms, a position ~3 ms); used only to choose between two plans
PASS_COST = 16


@dataclass
class Block:
    """One forward pass of the cache path: rows ``idx`` computed from position ``start``, or with ``packs``
    their suffixes packed end to end (one list of row indices per batch row)."""

    start: int
    idx: list[int]
    packs: list[list[int]] | None = None


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
    # the cache path's plan: ``auto`` (the cheaper by :meth:`_cost`), ``shared`` (blocks from one start) or
    # ``packed`` (suffixes end to end, where exact); the numbers are the same up to float rounding
    plan: Literal["auto", "shared", "packed"] = "auto"
    # ``answer`` > 0: the text's last ``answer`` tokens are an answer, and ``F`` of a row is the answer's
    # log-probability given what precedes it, ``sum_j log p(a_j | row[: len - answer + j])`` (the target is
    # not read; every row must end with the same answer). Causal LMs only; cached blocks from one start.
    answer: int = 0

    def __post_init__(self) -> None:
        if self.answer:
            if not self.adapter.kind.causal:
                raise StreetlampError("an answer's log-probability needs a causal LM")
            if not 0 < self.answer < len(self.ids):
                raise StreetlampError(f"the answer needs 1..{len(self.ids) - 1} tokens (got {self.answer})")
            self.use_cache, self.plan = True, "shared"
        self.use_cache = self.use_cache and self.adapter.kind.causal
        self.budget = self.budget if self.budget is not None else default_budget(self.adapter.device)
        self.n_rows = 0  # perturbed rows evaluated (for the record)
        self.n_positions = 0  # token positions computed (for the record)
        self.n_passes = 0  # forward passes over perturbed rows
        one = Inputs.from_ids(self.adapter, [self.ids], strings=False)
        if self.answer:
            logits, self.cache = self.adapter.prefix_forward(one, keep_cache=True, tail=self.answer + 1)
            self.kl = False
            self.index = self.ids[-self.answer :].clone()
            self.base = float(self._answer_score(logits)[0])
            return
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
        first: list[int] = []
        if not self.use_cache:
            blocks = [Block(0, g) for g in group_by_budget([len(r) for r in rows], self.budget)]
            self.n_passes += len(blocks)
        else:
            first = self._first(rows)
            blocks = self._cache_blocks(rows, first)
            packed = self._packed_blocks(rows, first) if self.plan != "shared" else None
            if packed is not None and (
                self.plan == "packed" or self._cost(packed, rows, first) < self._cost(blocks, rows, first)
            ):
                blocks = packed
            self.n_passes += len(blocks)
        with _progress(len(rows), self.desc) as bar:
            for block in blocks:
                out[block.idx] = self._run(block, rows, first)
                bar.update(len(block.idx))
        return out

    def _run(self, block: Block, all_rows: Sequence[torch.Tensor], first: list[int]) -> np.ndarray:
        rows = [all_rows[i] for i in block.idx]
        if block.packs is not None:
            segs = [[(first[i], all_rows[i][first[i] :]) for i in pack] for pack in block.packs]
            self.n_positions += sum(len(s) for pack in segs for _, s in pack)
            logits = packed_forward(self.adapter, self.ids, self.cache, segs)
        else:
            start = block.start
            batch = Inputs.from_ids(self.adapter, [r[start:] for r in rows], strings=False)
            self.n_positions += sum(batch.lengths)
            if start == 0 and not self.use_cache:
                logits = self.adapter.forward(batch).logits
            else:
                tail = self.answer + 1 if self.answer else None
                logits, _ = self.adapter.prefix_forward(batch, self.cache if start else None, start, tail=tail)
        if self.answer:
            return self._answer_score(logits)
        if self.kl:
            ref = self.ref.to(logits.device)
            kl = (ref.exp() * (ref - torch.log_softmax(logits.double(), -1))).sum(-1)
            return (-kl).cpu().numpy()
        index = self.index.expand(len(rows))
        return self.adapter.score(logits, index, self.target).double().cpu().numpy()

    def _answer_score(self, logits: torch.Tensor) -> np.ndarray:
        """The answer's log-probability per row from the logits ``[rows, answer + 1, vocab]`` of each row's
        last ``answer + 1`` positions (the last one predicts past the answer and is not read)."""
        logp = torch.log_softmax(logits[:, :-1].double(), -1)
        idx = self.index.to(logp.device)[None, :, None].expand(logp.shape[0], -1, 1)
        return logp.gather(2, idx)[..., 0].sum(1).cpu().numpy()

    def _first(self, rows: Sequence[torch.Tensor]) -> list[int]:
        """Each row's first position that differs from the text (at least its last token is computed; with an
        answer, the positions that predict it)."""
        n = len(self.ids)
        keep = self.answer + 1 if self.answer else 1
        first = []
        for r in rows:
            if self.answer and not torch.equal(r[-self.answer :], self.ids[-self.answer :]):
                raise StreetlampError("every row must end with the answer")
            m = min(len(r), n)
            diff = torch.nonzero(r[:m] != self.ids[:m])
            p = int(diff[0]) if len(diff) else m
            first.append(max(0, min(p, len(r) - keep)))
        return first

    def _cache_blocks(self, rows: Sequence[torch.Tensor], first: list[int]) -> list[Block]:
        """Rows sorted by their first changed position, grouped so rows x suffix length fits the budget; a
        block's rows are computed from the block's first position."""
        assert self.budget is not None  # set in __post_init__
        order = sorted(range(len(rows)), key=lambda i: first[i])
        blocks: list[Block] = []
        cur: list[int] = []
        for i in order:
            if cur:
                s = first[cur[0]]
                width = max(len(rows[j]) for j in cur + [i]) - s
                # split on the budget, and when recomputing [s, first[i]) would waste over ~1/8 of the row
                if (len(cur) + 1) * width > self.budget or first[i] - s > max(2, width // 8):
                    blocks.append(Block(s, cur))
                    cur = []
            cur.append(i)
        if cur:
            blocks.append(Block(first[cur[0]], cur))
        return blocks

    def _packed_blocks(self, rows: Sequence[torch.Tensor], first: list[int]) -> list[Block] | None:
        """Each row's suffix alone, packed end to end (:mod:`streetlamp.models.packed`): the longest
        remaining suffix opens a batch row as wide as the longest suffix of all, the shortest remaining ones
        fill it; batch rows are grouped within the budget. None where packing would not be exact."""
        assert self.budget is not None
        if not packable(self.adapter, max(len(self.ids), max(len(r) for r in rows))):
            return None
        length = [len(r) - p for r, p in zip(rows, first)]
        order = sorted(range(len(rows)), key=lambda i: -length[i])
        cap = length[order[0]]
        packs: list[list[int]] = []
        lo, hi = 0, len(order) - 1
        while lo <= hi:
            pack, used = [order[lo]], length[order[lo]]
            lo += 1
            while lo <= hi and used + length[order[hi]] <= cap:
                pack.append(order[hi])
                used += length[order[hi]]
                hi -= 1
            packs.append(pack)
        blocks: list[Block] = []
        cur: list[list[int]] = []
        for pack in packs:
            if cur and (len(cur) + 1) * max(sum(length[i] for i in p) for p in cur + [pack]) > self.budget:
                blocks.append(Block(0, [i for p in cur for i in p], cur))
                cur = []
            cur.append(pack)
        if cur:
            blocks.append(Block(0, [i for p in cur for i in p], cur))
        return blocks

    def _cost(self, blocks: list[Block], rows: Sequence[torch.Tensor], first: list[int]) -> float:
        """A plan's cost in token positions: the padded rectangle of every pass, each position's attention
        over its keys (about ``keys / (6 d_model)`` positions' worth of matrix products), and
        :data:`PASS_COST` per pass (reading every weight once)."""
        beta = 1.0 / (6 * self.adapter.d_model)
        total = 0.0
        for b in blocks:
            if b.packs is not None:
                width = max(sum(len(rows[i]) - first[i] for i in pack) for pack in b.packs)
                n_rows, keys = len(b.packs), max(first[i] for i in b.idx) + width
            else:
                width = max(len(rows[i]) for i in b.idx) - b.start
                n_rows, keys = len(b.idx), b.start + width
            total += PASS_COST + n_rows * width * (1 + beta * keys)
        return total


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
