"""Context attribution: which source of a context did the answer come from (METHODS.md section 15).

A context of sources ``s_1..s_n`` is laid out as ``head + s_1 + ... + s_n + tail + answer`` (each piece
tokenised alone, so removing a source removes exactly its tokens and leaves every other token id as it was;
the head holds the first position, the attention sink, and is never removed). ``L(S)`` is the answer's
log-probability ``sum_j log p(a_j | ...)`` given the sources in ``S`` only (the others deleted), read by the
shared perturbation :class:`~streetlamp.methods.scorer.Scorer` with the KV cache of the unchanged prefix
(a row's tokens before its first removed source are the full text's, so their keys and values are reused)
and the fused kernel. Every method gives token scores or source scores; :func:`aggregate` is the one
token -> source step.

* ``attention`` / ``attention_nosink``: the answer tokens' attention rows, mean over layers and heads and
  answer tokens, summed over each source's tokens; ``nosink`` renormalises each row over the keys other
  than position 0 before the mean. The rows come from one chunked pass
  (:class:`~streetlamp.models.chunked.Recorder`, the recording of ``explain --rows``): no
  ``[head, query, key]`` for a whole layer.
* ``attntrace`` (Wang et al. 2025): the same mean rows, each source scored by the mean of its top-K token
  values; with ``samples`` > 0 averaged over random subsets of ``max(1, floor(fraction * n))`` sources
  (each subset one pass over only those sources), a source's score the mean over the subsets that held it.
* ``rollout``: the registry's rollout (:meth:`~streetlamp.methods.rollout.Rollout.attribute_long`) of the
  position that predicts each answer token, from the stored queries and keys, summed over answer tokens.
* ``gradient_x_input``, ``integrated_gradients``, ``attnlrp``: the registry's methods explaining each
  answer token (its log-probability; AttnLRP its logit) given the text before it, summed over answer
  tokens, then over each source's tokens.
* ``contextcite`` (Cohen-Wang et al. 2024): ``n`` random masks (each source kept with probability 1/2), a
  Lasso (:func:`lasso`) of ``L(mask)`` on the masks; its weights are the scores. :func:`lds` on held-out masks.
* ``leave_one_out``: ``L(all) - L(all minus s_i)``, exact.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter, Target
from ..models.chunked import QKStore, Recorder, Selection, fused_long, record_long
from .long_input import LongInput
from .registry import get_method
from .scorer import Scorer

HEAD = "Answer the question from the context.\n\nContext:\n"
TAIL = "\nQuestion: {question}\nAnswer:"
ATTENTION = ("attention", "attention_nosink", "attntrace")
TOKEN_METHODS = ("rollout", "gradient_x_input", "integrated_gradients", "attnlrp")
ABLATION = ("contextcite", "leave_one_out")
CITE_METHODS = ATTENTION + TOKEN_METHODS + ABLATION
KS = (1, 3, 5)


@dataclass
class Layout:
    """The token ids of a context: ``head``, one list per source, ``tail`` (the question) and ``answer``."""

    head: list[int]
    sources: list[list[int]]
    tail: list[int]
    answer: list[int]

    @property
    def n_sources(self) -> int:
        return len(self.sources)

    def ids(self, keep: np.ndarray | None = None, answer: bool = True) -> torch.Tensor:
        """The text with only the sources in ``keep`` (bool ``[n_sources]``; None: all), with the answer."""
        keep = np.ones(self.n_sources, bool) if keep is None else np.asarray(keep, bool)
        out = list(self.head)
        for k, s in zip(keep, self.sources):
            if k:
                out += s
        out += self.tail + (self.answer if answer else [])
        return torch.tensor(out, dtype=torch.long)

    @property
    def spans(self) -> list[tuple[int, int]]:
        """Each source's ``[start, end)`` in the full text."""
        out, p = [], len(self.head)
        for s in self.sources:
            out.append((p, p + len(s)))
            p += len(s)
        return out

    @property
    def context_end(self) -> int:
        return len(self.head) + sum(len(s) for s in self.sources)

    @property
    def n_tokens(self) -> int:
        return self.context_end + len(self.tail) + len(self.answer)

    @property
    def answer_start(self) -> int:
        return self.n_tokens - len(self.answer)


def _ids(adapter: ModelAdapter, text: str, special: bool = False) -> list[int]:
    return list(adapter.tokenizer(text, add_special_tokens=special)["input_ids"])


def layout(
    adapter: ModelAdapter, sources: list[str], question: str, answer: list[int] | None = None, prefix: str = ""
) -> Layout:
    """The context's layout: the head with the tokenizer's own specials (a BOS where it adds one), each
    source as ``text + "\\n"``, the question's tail (then ``prefix``, the answer's start the model continues:
    ``Answer: The code word of Mira is``); ``answer`` token ids (empty until known)."""
    head = _ids(adapter, HEAD, special=True)
    tail = TAIL.format(question=question) + (" " + prefix.strip() if prefix.strip() else "")
    return Layout(head, [_ids(adapter, s + "\n") for s in sources], _ids(adapter, tail), list(answer or []))


def answer_ids(adapter: ModelAdapter, answer: str) -> list[int]:
    """The answer's token ids as they follow ``Answer:`` (a leading space)."""
    ids = _ids(adapter, " " + answer.strip())
    if not ids:
        raise StreetlampError(f"--answer {answer!r} has no tokens for this tokenizer")
    return ids


def fit_window(adapter: ModelAdapter, lay: Layout, truncate: bool, reserve: int) -> tuple[Layout, list[int]]:
    """``lay`` within the model's window (``reserve`` answer tokens still to come): refused when over it,
    unless ``truncate``, which drops whole sources from the end; the dropped sources' indices."""
    limit = adapter.max_positions
    need = lay.n_tokens + (0 if lay.answer else reserve)
    if need <= limit:
        return lay, []
    if not truncate:
        raise StreetlampError(
            f"the context is {need} tokens but the model takes at most {limit}; pass --truncate to drop sources "
            "from the end"
        )
    kept = list(lay.sources)
    while kept and need > limit:
        need -= len(kept.pop())
    if not kept:
        raise StreetlampError(f"the question and answer alone take {need} tokens: over the model's {limit}")
    cut = list(range(len(kept), lay.n_sources))
    return Layout(lay.head, kept, lay.tail, lay.answer), cut


def generate_answer(adapter: ModelAdapter, lay: Layout, max_tokens: int) -> list[int]:
    """The model's greedy answer, up to its first line break or EOS (neither included)."""
    new = adapter.generate(lay.ids(answer=False), max_tokens)
    out: list[int] = []
    for t in new:
        if t in adapter.eos_token_ids or "\n" in adapter.tokenizer.decode([t]):
            break
        out.append(t)
    if not out or not str(adapter.tokenizer.decode(out)).strip():
        raise StreetlampError("the model's answer is empty (its first token ends the line); give --answer")
    return out


# -- the one aggregation ------------------------------------------------------------------------------------
def aggregate(tokens: np.ndarray, spans: list[tuple[int, int]], top: int | None = None) -> np.ndarray:
    """Token scores ``[token]`` -> source scores ``[source]``: the sum over each source's tokens, or with
    ``top`` the mean of its ``top`` largest token scores (AttnTrace's top-K average)."""
    t = np.asarray(tokens, np.float64)
    out = np.empty(len(spans))
    for i, (s, e) in enumerate(spans):
        v = t[s:e]
        if top is None:
            out[i] = v.sum()
        else:
            k = min(top, len(v))
            out[i] = np.sort(v)[len(v) - k :].mean() if k else 0.0
    return out


def ranking(scores: np.ndarray) -> np.ndarray:
    """Source indices by decreasing score (ties: the earlier source first)."""
    s = np.asarray(scores, np.float64)
    return np.lexsort((np.arange(len(s)), -s))


# -- cost ---------------------------------------------------------------------------------------------------
@dataclass
class Cost:
    """What a method cost: model passes (with a graph, for a backward), perturbed rows, seconds."""

    forward_passes: int = 0
    passes_with_gradient: int = 0
    ablation_rows: int = 0
    seconds: float = 0.0


@contextmanager
def counting(adapter: ModelAdapter) -> Iterator[Cost]:
    """Counts the base model's forward passes in the block (those with autograd on separately) and its time."""
    cost = Cost()

    def hook(module: Any, args: Any) -> None:
        cost.forward_passes += 1
        cost.passes_with_gradient += int(torch.is_grad_enabled())

    base = adapter.hf_model.base_model
    h = base.register_forward_pre_hook(hook)
    t0 = time.perf_counter()
    try:
        yield cost
    finally:
        cost.seconds = time.perf_counter() - t0
        h.remove()


# -- L(mask) --------------------------------------------------------------------------------------------------
class AnswerScore:
    """``L(mask)``: the answer's log-probability with only the masked-in sources, memoised per mask,
    through the shared :class:`Scorer` (prefix KV cache, fused attention)."""

    def __init__(self, adapter: ModelAdapter, lay: Layout, batch_size: int | None) -> None:
        self.adapter, self.lay = adapter, lay
        with torch.no_grad(), fused_long(adapter):
            self.scorer = Scorer(adapter, lay.ids(), Target(), batch_size, use_cache=True, answer=len(lay.answer))
        self.full = float(self.scorer.base)
        self.forget()

    def forget(self) -> None:
        """Drop the memoised values (but ``L(all)``): the next method pays for its own rows."""
        self.memo: dict[bytes, float] = {np.ones(self.lay.n_sources, bool).tobytes(): self.full}

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        masks = np.atleast_2d(np.asarray(masks, bool))
        todo = {m.tobytes(): m for m in masks if m.tobytes() not in self.memo}
        if todo:
            keys = list(todo)
            with torch.no_grad(), fused_long(self.adapter):
                vals = self.scorer([self.lay.ids(todo[k]) for k in keys])
            self.memo.update(zip(keys, (float(v) for v in vals)))
        return np.array([self.memo[m.tobytes()] for m in masks])


def leave_one_out(score: AnswerScore) -> np.ndarray:
    """``L(all) - L(all minus s_i)`` per source."""
    n = score.lay.n_sources
    masks = ~np.eye(n, dtype=bool)
    return score.full - score(masks)


def lasso(
    x: np.ndarray, y: np.ndarray, alpha: float, max_iter: int = 100_000, tol: float = 1e-12
) -> tuple[np.ndarray, float]:
    """Weights and intercept minimising ``(1/2n)·||y - b - x w||² + alpha·||w||₁`` by cyclic coordinate
    descent on the centred problem (scikit-learn's ``Lasso`` objective, with an intercept), until no weight
    moves by more than ``tol``."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    n, p = x.shape
    xm, ym = x.mean(0), y.mean()
    xc, r = x - xm, y - ym
    col = (xc**2).sum(0) / n
    w = np.zeros(p)
    for _ in range(max_iter):
        moved = 0.0
        for j in range(p):
            if col[j] == 0:
                continue
            rho = xc[:, j] @ r / n + col[j] * w[j]
            new = math.copysign(max(abs(rho) - alpha, 0.0), rho) / col[j]
            if new != w[j]:
                r -= xc[:, j] * (new - w[j])
                moved = max(moved, abs(new - w[j]))
                w[j] = new
        if moved <= tol:
            break
    return w, float(ym - xm @ w)


def random_masks(rng: np.random.Generator, n_masks: int, n_sources: int) -> np.ndarray:
    """``[n_masks, n_sources]`` bool: each source kept with probability 1/2."""
    return rng.random((n_masks, n_sources)) < 0.5


def lds(pred: np.ndarray, true: np.ndarray) -> float:
    """Linear datamodeling score: Spearman rank correlation of surrogate and true ``L`` (NaN if constant)."""
    from scipy.stats import spearmanr

    if len(pred) < 2 or np.ptp(pred) == 0 or np.ptp(true) == 0:
        return float("nan")
    return float(spearmanr(pred, true).statistic)


@dataclass
class ContextCite:
    """The surrogate: masks, their ``L``, the Lasso's weights and intercept, and its LDS on held-out masks."""

    masks: np.ndarray
    values: np.ndarray
    weights: np.ndarray
    intercept: float
    held_masks: np.ndarray
    held_values: np.ndarray
    lds: float


def context_cite(score: AnswerScore, n_ablations: int, n_held: int, alpha: float, seed: int) -> ContextCite:
    rng = np.random.default_rng(seed)
    n = score.lay.n_sources
    masks = random_masks(rng, n_ablations, n)
    held = random_masks(rng, n_held, n)
    vals = score(masks)
    w, b = lasso(masks.astype(np.float64), vals, alpha)
    held_vals = score(held) if n_held else np.zeros(0)
    pred = b + held.astype(np.float64) @ w
    return ContextCite(masks, vals, w, b, held, held_vals, lds(pred, held_vals) if n_held else float("nan"))


# -- attention rows -------------------------------------------------------------------------------------------
def attention_rows(
    adapter: ModelAdapter, ids: torch.Tensor, rows: list[int], folder: Path, keep_qk: bool = False
) -> tuple[np.ndarray, Recorder]:
    """Attention ``[layer, head, len(rows), key]`` of query ``rows`` (float64), from one chunked pass of
    ``ids`` recorded into ``folder`` (``keep_qk``: also the queries and keys, for rollout)."""
    n_layers, n_heads = adapter.n_layers, adapter.n_heads
    rec = Recorder(
        adapter, folder, Selection(list(range(n_layers)), list(range(n_heads)), sorted(rows)), keep_qk=keep_qk
    )
    with torch.no_grad(), record_long(adapter, rec):
        adapter.forward(Inputs.from_ids(adapter, [ids], strings=False))
    from safetensors import safe_open

    out = np.zeros((n_layers, n_heads, len(rows), len(ids)))
    where = {r: i for i, r in enumerate(rows)}
    for s in rec.shards:
        with safe_open(str(folder / s["file"]), framework="pt") as f:
            p = f.get_tensor("pattern").double().numpy()
        for i, r in enumerate(s["rows"]):
            out[s["layer"], :, where[r]] = p[:, i]
    return out, rec


def mean_rows(rows: np.ndarray, sink: bool = True) -> np.ndarray:
    """The mean over layers, heads and rows of ``[layer, head, row, key]``; ``sink=False``: each row first
    renormalised over the keys other than position 0 (the attention sink set aside)."""
    if not sink:
        rest = 1.0 - rows[..., :1]
        rows = np.where(rest > 0, rows / np.where(rest > 0, rest, 1.0), 0.0)
        rows[..., 0] = 0.0
    return rows.mean((0, 1, 2))


def attntrace(
    adapter: ModelAdapter,
    lay: Layout,
    folder: Path,
    samples: int,
    fraction: float,
    top: int,
    seed: int,
    full_rows: np.ndarray | None,
) -> np.ndarray:
    """AttnTrace's source scores (see the module docstring); ``full_rows``: the full context's answer rows
    (used when ``samples == 0``)."""
    n = lay.n_sources
    if samples == 0:
        if full_rows is None:
            raise ValueError("AttnTrace without subsampling needs the full context's answer rows")
        return aggregate(mean_rows(full_rows), lay.spans, top)
    rng = np.random.default_rng(seed)
    k = max(1, int(n * fraction))
    total, count = np.zeros(n), np.zeros(n)
    for _ in range(samples):
        idx = np.sort(rng.permutation(n)[:k])
        keep = np.zeros(n, bool)
        keep[idx] = True
        sub = Layout(lay.head, [lay.sources[i] for i in idx], lay.tail, lay.answer)
        rows = list(range(sub.answer_start, sub.n_tokens))
        att, _ = attention_rows(adapter, sub.ids(), rows, folder / "attntrace")
        total[idx] += aggregate(mean_rows(att), sub.spans, top)
        count[idx] += 1
        shutil.rmtree(folder / "attntrace", ignore_errors=True)
    return np.where(count > 0, total / np.maximum(count, 1), 0.0)


# -- the registry's token methods -------------------------------------------------------------------------------
def rollout_tokens(adapter: ModelAdapter, lay: Layout, store: QKStore) -> np.ndarray:
    """Rollout rows of the positions predicting each answer token, summed ``[token]`` (the registry's method)."""
    m = get_method("rollout")
    ids = lay.ids()
    inputs = Inputs.from_ids(adapter, [ids], strings=False)
    out = np.zeros(len(ids))
    for j in range(len(lay.answer)):
        long = LongInput(adapter, inputs, Target(lay.answer[j]), lay.answer_start - 1 + j, store=store)
        m.check_long(long)
        out += m.attribute_long(long).tokens
    return out


def gradient_tokens(
    adapter: ModelAdapter, name: str, lay: Layout, params: dict[str, Any], batch_size: int | None, seed: int
) -> np.ndarray:
    """The registry's method ``name`` explaining each answer token given the text before it (its
    log-probability), token scores summed over answer tokens ``[token]`` (positions after the context hold
    only the tail's and earlier answer tokens' scores)."""
    m = get_method(name, **params)
    ids = lay.ids()
    out = np.zeros(len(ids))
    for j, a in enumerate(lay.answer):
        p = lay.answer_start + j
        inputs = Inputs.from_ids(adapter, [ids[:p]], strings=True)
        ex = m.attribute(adapter, inputs, target=Target(int(a), quantity="logprob"), batch_size=batch_size, seed=seed)[
            0
        ]
        out[:p] += np.asarray(ex.scores, np.float64)
    return out


# -- the court -----------------------------------------------------------------------------------------------------
# the court's rows (``court``), in order: court.csv keeps this header when no k is asked (``--court none``)
COURT_COLUMNS = [
    "method",
    "k",
    "top_sources",
    "logprob_all",
    "logprob_without_top_k",
    "drop_without_top_k",
    "logprob_only_top_k",
    "drop_only_top_k",
]


def court(score: AnswerScore, scores: dict[str, np.ndarray], ks: tuple[int, ...] = KS) -> list[dict[str, Any]]:
    """Per method and k (k <= the number of sources): the answer's log-probability without its top-k sources
    and with only them, and each one's drop from ``L(all)``."""
    n = score.lay.n_sources
    plan = []
    for name, s in scores.items():
        order = ranking(s)
        for k in ks:
            if k > n:
                continue
            top = np.zeros(n, bool)
            top[order[:k]] = True
            plan.append((name, k, order[:k], ~top, top))
    if not plan:
        return []
    vals = score(np.array([p[3] for p in plan] + [p[4] for p in plan]))
    rows = []
    for i, (name, k, idx, _, _) in enumerate(plan):
        without, only = float(vals[i]), float(vals[len(plan) + i])
        rows.append(
            {
                "method": name,
                "k": k,
                "top_sources": " ".join(str(int(j)) for j in idx),
                "logprob_all": score.full,
                "logprob_without_top_k": without,
                "drop_without_top_k": score.full - without,
                "logprob_only_top_k": only,
                "drop_only_top_k": score.full - only,
            }
        )
    return rows
