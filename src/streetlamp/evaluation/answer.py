"""Faithfulness of a whole generated answer (``evaluate --answer-tokens N`` on a causal LM).

The answer ``a = a_1..a_N`` is the model's greedy continuation of the prompt ``x``. Each method explains
every answer token ``a_j`` on its own prefix ``x + a_<j`` (target ``a_j``, probability; the call
``explain-generation`` makes), and its scores on the **prompt** positions rank the prompt tokens for that
token. Erasure removes prompt tokens only (the :class:`~streetlamp.methods.removal.Removal` rule: on a
decoder the first token is replaced by the document-start token and the prompt's last token, where the
answer starts, is never removed) and re-runs the model with the original answer **forced**:
``x' + a``. With ``r_k(j)`` the top-k% prompt tokens for ``a_j`` (ERASER's bins, :mod:`.erasure`):

* per token: ``comp_k(j) = p(a_j | x, a_<j) - p(a_j | x \\ r_k(j), a_<j)`` and
  ``suff_k(j) = p(a_j | x, a_<j) - p(a_j | r_k(j), a_<j)``;
* ``answer_comprehensiveness@k`` / ``answer_sufficiency@k``: the **mean over the N answer tokens**;
  ``answer_aopc_*``: that mean averaged over the bins too;
* whole answer: the prompt ranked by the **sum over answer tokens** of their scores, and
  ``answer_logprob_comprehensiveness@k = log p(a | x) - log p(a | x \\ r_k)`` (log p(a | ·) = Σ_j log
  p(a_j | ·, a_<j)), the same for sufficiency, and their AOPC;
* decision flip: the **greedy answer changes** after removing ``r_k`` (whole-answer ranking):
  ``answer_flipped@k`` (0/1) and ``answer_flip_fraction`` (the smallest bin k/100 that flips it, NaN if
  none). Under forced decoding this needs no generation: greedy decoding from ``x'`` reproduces ``a``
  exactly when ``argmax p(· | x', a_<j) = a_j`` at every j (tested against generation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from ..batching import group_by_budget
from ..methods.base import Method
from ..methods.prefixes import per_prefix
from ..methods.removal import Removal
from ..models.adapter import Inputs, ModelAdapter
from .common import rank_desc
from .erasure import PERCENTS

MAX_ANSWER_TOKENS = 64


@torch.no_grad()
def forced_answer(
    adapter: ModelAdapter, prompts: Sequence[Sequence[int]], answer: Sequence[int], budget: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """For each prompt row ``x'``: ``log p(a_j | x', a_<j)`` ``[rows, N]`` (float64) and whether greedy decoding
    from ``x'`` gives ``a`` (bool ``[rows]``), from one forced forward of ``x' + a`` per row."""
    n = len(answer)
    ans = torch.as_tensor(list(answer), dtype=torch.long)
    rows = [list(p) + list(answer) for p in prompts]
    logp = np.zeros((len(rows), n))
    same = np.zeros(len(rows), dtype=bool)
    for group in group_by_budget([len(r) for r in rows], budget, adapter.device):
        inp = Inputs.from_ids(adapter, [rows[i] for i in group], strings=False)
        dev = adapter.device
        with adapter.session():
            logits = adapter.hf_model(
                input_ids=inp.input_ids.to(dev), attention_mask=inp.attention_mask.to(dev)
            ).logits  # [g, width, vocab]
        # a_j is read after position len(x') - 1 + j
        pos = torch.tensor([[len(prompts[i]) - 1 + j for j in range(n)] for i in group], device=logits.device)
        at = logits[torch.arange(len(group), device=logits.device)[:, None], pos].double()  # [g, N, vocab]
        lp = torch.log_softmax(at, -1)
        a = ans.to(lp.device).expand(len(group), -1)
        logp[group] = lp.gather(2, a[..., None])[..., 0].cpu().numpy()
        same[group] = (at.argmax(-1) == a).all(1).cpu().numpy()
    return logp, same


def answer_scores(
    adapter: ModelAdapter,
    method: Method,
    prompt: Sequence[int],
    answer: Sequence[int],
    budget: int | None,
    seed: int,
) -> np.ndarray:
    """``[N, len(prompt)]``: the method's scores of answer token j (on its prefix) at the prompt positions."""
    full = torch.tensor([*prompt, *answer], dtype=torch.long)
    exps = per_prefix(adapter, method, full, len(prompt), "prob", budget, seed)
    return np.stack([np.asarray(e.scores, np.float64)[: len(prompt)] for e in exps])


def _tops(order: np.ndarray) -> list[set[int]]:
    m = len(order)
    return [set(order[: min(m, max(1, math.ceil(k / 100 * m)))].tolist()) for k in PERCENTS]


def answer_erasure(
    prompt: list[int],
    answer: list[int],
    scores: np.ndarray,
    special: np.ndarray,
    removal: Removal,
    run: object,
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """The metrics of one (example, method) from the per-token scores ``[N, len(prompt)]``.

    ``run(prompts) -> (logp [rows, N], same [rows])`` is :func:`forced_answer` bound to the model."""
    n = len(answer)
    special = special | removal.protected(len(prompt))
    rankable = set(np.flatnonzero(~special).tolist())
    if not rankable:
        return {}, {}
    rows: list[list[int]] = [list(prompt)]
    for j in range(n):  # per token: comp and suff rows per bin
        for top in _tops(rank_desc(scores[j], ~special)):
            rows += [removal.ids(prompt, top), removal.ids(prompt, rankable - top)]
    whole = _tops(rank_desc(scores.sum(0), ~special))
    for top in whole:
        rows += [removal.ids(prompt, top), removal.ids(prompt, rankable - top)]
    logp, same = run(rows)  # type: ignore[operator]
    nk = len(PERCENTS)
    p0 = np.exp(logp[0])  # [N]
    per = np.exp(logp[1 : 1 + 2 * nk * n]).reshape(n, nk, 2, n)  # [token j, bin, comp/suff, answer position]
    pj = per[np.arange(n), :, :, np.arange(n)]  # [j, bin, 2]: p(a_j) in the rows built for a_j
    comp = p0[:, None] - pj[:, :, 0]  # [N, bins]
    suff = p0[:, None] - pj[:, :, 1]
    lw = logp[1 + 2 * nk * n :].sum(1).reshape(nk, 2)  # whole answer log-prob per bin, comp/suff
    lp0 = float(logp[0].sum())
    flipped = ~same[1 + 2 * nk * n :].reshape(nk, 2)[:, 0]
    m: dict[str, float] = {}
    for i, k in enumerate(PERCENTS):
        m[f"answer_comprehensiveness@{k}"] = float(comp[:, i].mean())
        m[f"answer_sufficiency@{k}"] = float(suff[:, i].mean())
        m[f"answer_logprob_comprehensiveness@{k}"] = lp0 - float(lw[i, 0])
        m[f"answer_logprob_sufficiency@{k}"] = lp0 - float(lw[i, 1])
        m[f"answer_flipped@{k}"] = float(flipped[i])
    m["answer_aopc_comprehensiveness"] = float(comp.mean())
    m["answer_aopc_sufficiency"] = float(suff.mean())
    m["answer_logprob_aopc_comprehensiveness"] = float((lp0 - lw[:, 0]).mean())
    m["answer_logprob_aopc_sufficiency"] = float((lp0 - lw[:, 1]).mean())
    first = np.flatnonzero(flipped)
    m["answer_flip_fraction"] = PERCENTS[first[0]] / 100 if len(first) else float("nan")
    m["answer_logprob"] = lp0
    arrays = {
        "answer_comprehensiveness": comp.astype(np.float32),
        "answer_sufficiency": suff.astype(np.float32),
        "answer_scores": scores.astype(np.float32),
    }
    return m, arrays


def evaluate_answers(
    adapter: ModelAdapter,
    prompts: Sequence[Sequence[int]],
    methods: dict[str, Method],
    n_answer: int,
    removal: Removal,
    budget: int | None,
    seed: int,
) -> list[tuple[list[int], dict[str, dict[str, float]], dict[str, np.ndarray]]]:
    """Per prompt: the greedy answer, ``{method: metrics}`` and the arrays to store."""
    out = []
    for prompt in prompts:
        prompt = list(prompt)
        answer = adapter.generate(torch.tensor(prompt, dtype=torch.long), n_answer)
        special = adapter.special_mask(prompt)
        run = lambda rows, answer=answer: forced_answer(adapter, rows, answer, budget)  # noqa: E731
        mets: dict[str, dict[str, float]] = {}
        arrays: dict[str, np.ndarray] = {"answer_ids": np.asarray(answer, np.int64)}
        for name, m in methods.items():
            sc = answer_scores(adapter, m, prompt, answer, budget, seed)
            mets[name], arr = answer_erasure(prompt, answer, sc, special, removal, run)
            arrays.update({f"{name}.{k}": v for k, v in arr.items()})
        out.append((answer, mets, arrays))
    return out
