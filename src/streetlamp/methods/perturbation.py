"""Shared machinery of the perturbation family (occlusion, SHAP, LIME).

A perturbation method turns one text into *features* (groups of token positions), builds
perturbed copies of the text in which some features are *absent*, and reads the explained
scalar ``F`` (METHODS.md section 4) on each copy. Absent tokens are replaced by a special
token (``mask`` / ``unk`` / ``pad``) or removed (``delete``; the sequence gets shorter). Either
way the perturbed input is one the model never saw in training (out of distribution, seed 002):
every Explanation records the replacement that was actually used.

Everything here is per text (the text's real tokens only), so results do not depend on the
other texts of a batch. Perturbed rows are batched by the token budget ``batch_size``
(:mod:`streetlamp.batching`).

KV-cache reuse on causal LMs (:func:`prefix_forward`): a perturbed row equals the original text
up to its first changed position ``p``, and a causal model's keys and values at positions < p
depend only on those positions. So we run the original text once with ``use_cache=True``, and
for a block of rows sorted by ``p`` we feed only the suffixes from the block's smallest ``p``
with the original's cache cropped to that length. Occluding token i then recomputes only
positions >= i (about half the work of a full recompute for leave-one-out).
"""
from __future__ import annotations

import functools
import inspect
import string
import sys
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ..batching import default_budget, group_by_budget
from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter, Target

Replacement = Literal["mask", "unk", "pad", "delete"]
REPLACEMENTS = ("mask", "unk", "pad", "delete")
GROUPS = ("token", "word")
# When the asked-for special token does not exist (causal LMs have no [MASK]), use the next one.
FALLBACK = {"mask": ("mask", "unk", "pad", "eos"), "unk": ("unk", "pad", "eos"), "pad": ("pad", "eos")}
_PUNCT = set(string.punctuation)


def check_replacement(replacement: str, group: str) -> None:
    if replacement not in REPLACEMENTS:
        raise StreetlampError(f"unknown replacement {replacement!r}; choose one of {', '.join(REPLACEMENTS)}")
    if group not in GROUPS:
        raise StreetlampError(f"unknown group {group!r}; choose one of {', '.join(GROUPS)}")


def replacement_token(adapter: ModelAdapter, replacement: str) -> tuple[str, int | None, str | None]:
    """``(used, token_id, token_string)``: the replacement actually used after the fallback chain.

    ``mask`` falls back to ``unk``, then ``pad``, then ``eos`` (causal LMs usually have no [MASK];
    SmolLM2's ``unk`` is ``<|endoftext|>``; occlusion deletes instead there, see
    :func:`occlusion_replacement`). ``delete`` has no token.
    """
    if replacement == "delete":
        return "delete", None, None
    tok = adapter.tokenizer
    for kind in FALLBACK[replacement]:
        tid = getattr(tok, f"{kind}_token_id", None)
        if tid is not None:
            return kind, int(tid), str(getattr(tok, f"{kind}_token"))
    raise StreetlampError(f"the tokenizer has no {replacement}, unk, pad or eos token; use replacement='delete'")


def occlusion_replacement(adapter: ModelAdapter, replacement: str) -> tuple[str, int | None, str | None]:
    """Like :func:`replacement_token`, but a causal LM without a [MASK] token deletes the token.

    Its stand-ins are document markers (SmolLM2's ``unk`` is ``<|endoftext|>``), and one of them in
    the middle of a prompt wipes the context: every token then looked equally decisive (removing
    any word of "The capital of France is" dropped p(" Paris") by 0.77). Leave-one-out always keeps
    the other tokens, so deletion is well defined there (SHAP/LIME, whose coalitions can remove
    every token, keep the token fallback).
    """
    if replacement == "mask" and adapter.tokenizer.mask_token_id is None and adapter.kind == "causal_lm":
        return "delete", None, None
    return replacement_token(adapter, replacement)


def special_positions(adapter: ModelAdapter, ids: Sequence[int]) -> np.ndarray:
    """Bool ``[n]``: positions holding the tokenizer's special tokens ([CLS], [SEP], <s>, ...)."""
    special = set(int(i) for i in adapter.tokenizer.all_special_ids)
    return np.array([int(i) in special for i in ids], dtype=bool)


def word_starts(tokens: Sequence[str], special: np.ndarray) -> np.ndarray:
    """Bool ``[n]``: where a word begins.

    WordPiece marks continuations with a ``##`` prefix; byte-level BPE (``Ġ``) and SentencePiece
    (``▁``) mark word *starts* instead. The marker style is read from the tokens themselves: if any
    token starts with ``Ġ``/``▁`` the text uses start markers, otherwise ``##`` continuations
    (a word-level tokenizer then makes every token a word). With start markers, a token made only
    of punctuation, the first token, and the token after a special token also start a word.
    """
    start_marked = any(t.startswith(("Ġ", "▁")) for t in tokens)
    out = np.zeros(len(tokens), dtype=bool)
    for i, t in enumerate(tokens):
        if special[i] or i == 0 or special[i - 1]:
            out[i] = True
        elif start_marked:
            bare = t.lstrip("Ġ▁")
            out[i] = t != bare or (bool(bare) and all(c in _PUNCT for c in bare))
        else:
            out[i] = not t.startswith("##")
    return out


def feature_groups(adapter: ModelAdapter, ids: Sequence[int], tokens: Sequence[str], group: str,
                   include_special: bool) -> tuple[np.ndarray, list[np.ndarray]]:
    """``groups`` ``[n]`` (feature id per position, -1 = never perturbed) and the features' positions."""
    special = special_positions(adapter, ids)
    n = len(ids)
    starts = word_starts(tokens, special) if group == "word" else np.ones(n, dtype=bool)
    groups = np.full(n, -1, dtype=np.int32)
    g = -1
    for i in range(n):
        if special[i]:
            if include_special:
                g += 1
                groups[i] = g
            continue
        if i == 0 or starts[i] or groups[i - 1] == -1:
            g += 1
        groups[i] = g
    feats = [np.flatnonzero(groups == k) for k in range(g + 1)]
    return groups, feats


def perturbed_row(ids: torch.Tensor, absent: np.ndarray, token_id: int | None) -> torch.Tensor:
    """The text's ids with the positions in ``absent`` (bool ``[n]``) replaced, or removed if ``token_id`` is None."""
    keep = torch.from_numpy(absent)
    if token_id is None:
        return ids[~keep]
    row = ids.clone()
    row[keep] = token_id
    return row


def _pad(rows: Sequence[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for j, r in enumerate(rows):
        ids[j, : len(r)] = r
        mask[j, : len(r)] = 1
    return ids, mask


def _progress(total: int, desc: str) -> tqdm:
    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False, disable=total < 16, delay=2.0)


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
        self.pad_id = int(self.adapter.tokenizer.pad_token_id)
        self.n_rows = 0  # perturbed rows evaluated (for the record)
        self.n_positions = 0  # token positions computed (for the record)
        if self.use_cache:
            logits, self.cache = prefix_forward(self.adapter, self.ids[None],
                                                torch.ones(1, len(self.ids), dtype=torch.long), keep_cache=True)
        else:
            logits = self.adapter.forward(self._inputs(self.ids[None], torch.ones(1, len(self.ids),
                                                                                  dtype=torch.long))).logits
        self.index = self.adapter.resolve(self._inputs(self.ids[None], torch.ones_like(self.ids)[None]),
                                          self.target, logits)
        self.base = float(self.adapter.score(logits, self.index, self.target)[0])

    def _inputs(self, ids: torch.Tensor, mask: torch.Tensor) -> Inputs:
        k = ids.shape[0]
        return Inputs(ids, mask, [[]] * k, [[]] * k, [""] * k)

    def __call__(self, rows: Sequence[torch.Tensor]) -> np.ndarray:
        """``F`` of each row (1-D id tensors, lengths may differ), float64 ``[len(rows)]``."""
        out = np.empty(len(rows), dtype=np.float64)
        if not rows:
            return out
        if any(len(r) == 0 for r in rows):
            raise StreetlampError("a perturbation removed every token of the text; use a replacement token")
        self.n_rows += len(rows)
        blocks = self._cache_blocks(rows) if self.use_cache else [
            (0, g) for g in group_by_budget([len(r) for r in rows], self.budget)]
        with _progress(len(rows), self.desc) as bar:
            for start, idx in blocks:
                out[idx] = self._run(start, [rows[i] for i in idx])
                bar.update(len(idx))
        return out

    def _run(self, start: int, rows: list[torch.Tensor]) -> np.ndarray:
        ids, mask = _pad([r[start:] for r in rows], self.pad_id)
        self.n_positions += int(mask.sum())
        index = self.index.expand(len(rows))
        if start == 0 and not self.use_cache:
            logits = self.adapter.forward(self._inputs(ids, mask)).logits
        else:
            logits, _ = prefix_forward(self.adapter, ids, mask, self.cache if start else None, start)
        return self.adapter.score(logits, index, self.target).double().cpu().numpy()

    def _cache_blocks(self, rows: Sequence[torch.Tensor]) -> list[tuple[int, list[int]]]:
        """Rows sorted by their first changed position, grouped so rows x suffix length fits the budget."""
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


@functools.lru_cache(maxsize=None)
def cache_keyword(model_class: type) -> str:
    """The KV-cache argument (and output field) of a base model's forward: transformers renamed
    ``past_key_values`` to ``cache`` within 5.x, and ``**kwargs`` would swallow the wrong one (the
    prefix silently ignored), so ask the signature, once per class."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


@torch.no_grad()
def prefix_forward(adapter: ModelAdapter, ids: torch.Tensor, mask: torch.Tensor, cache: list | None = None,
                   start: int = 0, keep_cache: bool = False) -> tuple[torch.Tensor, list]:
    """Causal LM only: next-token logits after each row's last real token, reusing a cached prefix.

    This is the one place the perturbation methods call ``adapter.hf_model`` directly (the adapter
    has no KV-cache API): ``ids``/``mask`` ``[rows, width]`` are right-padded *suffixes* that start
    at position ``start``; ``cache`` is the per-layer ``(keys, values)`` list returned by an earlier
    call on the full original text (``start == 0``), cropped here to its first ``start`` positions and
    shared by every row (expanded, not recomputed). Positions follow from the cache length, so
    RoPE / learned positions are those of the full text. The registered streetlamp attention function
    handles ``q_len < k_len`` (the causal mask is offset by the cache). Only the hidden state of each
    row's last real token goes through the LM head (not ``[rows, width, vocab]`` logits).

    Returns the logits ``[rows, vocab]`` and, with ``keep_cache``, this call's cache as
    ``[(keys, values)]`` per layer (else ``[]``).
    """
    from transformers import DynamicCache

    dev = adapter.device
    rows = ids.shape[0]
    past = None
    full_mask = mask
    if start:
        assert cache is not None
        past = DynamicCache(ddp_cache_data=[(k[:, :, :start].expand(rows, -1, -1, -1),
                                             v[:, :, :start].expand(rows, -1, -1, -1)) for k, v in cache])
        full_mask = torch.cat([torch.ones(rows, start, dtype=mask.dtype), mask], 1)
    elif keep_cache:
        # a cache without the config keeps every position in every layer: with the config, sliding-window
        # layers (Gemma, Mistral) would keep only the last window's keys, and the prefix cropped above
        # (the first ``start`` positions) would be the wrong ones; the window stays in the mask
        past = DynamicCache()
    base = adapter.hf_model.base_model
    name = cache_keyword(type(base))
    out = base(input_ids=ids.to(dev), attention_mask=full_mask.to(dev), use_cache=keep_cache or past is not None,
               **{name: past})
    last = mask.sum(1).to(dev) - 1
    hidden = out.last_hidden_state[torch.arange(rows, device=dev), last]
    logits = adapter.hf_model.get_output_embeddings()(hidden)
    cap = getattr(adapter.hf_model.config, "final_logit_softcapping", None)
    if cap:  # Gemma 2/3 cap the LM head's logits as the model's own forward does
        logits = torch.tanh(logits / cap) * cap
    new_cache = [(layer.keys, layer.values) for layer in getattr(out, name).layers] if keep_cache else []
    return logits, new_cache


def explanation_common(method_name: str, used: str, token: str | None, requested: str) -> dict:
    """The info every perturbation Explanation carries about what replaced absent tokens."""
    what = "absent tokens removed (sequence shortened)" if used == "delete" else f"absent tokens replaced by {token!r}"
    note = "" if used == requested else f" ({requested} not in the vocabulary: fell back to {used})"
    return {"replacement": requested, "replacement_used": used, "replacement_token": token,
            "replacement_note": f"{method_name}: {what}{note}; perturbed inputs are out of distribution"}
