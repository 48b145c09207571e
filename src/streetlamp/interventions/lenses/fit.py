"""Fitting lenses on a corpus, and their held-out KL per row.

**Corpus.** Each text is tokenised without special tokens and preceded by the model's document separator
(:meth:`~streetlamp.models.adapter.ModelAdapter.empty_context_token`); the stream is cut into sequences of
``seq_len`` tokens, shuffled with the seed, and the last ``heldout`` sequences are held out.

**Tuned lens** (Belrose et al. 2023): per row ``r < L`` a translator ``h ↦ h + W_r h + b_r`` (so
``A_r = I + W_r``; ``W_r = 0``, ``b_r = 0`` at the start: the logit lens), trained by Adam on
``Σ_r mean_tokens KL(p_final ‖ softmax(W_U · norm_f(A_r h_r + b_r)))`` with the model frozen, ``steps`` steps
of ``batch_seqs`` sequences each (cycling through the training sequences), in the model's dtype, through the
model's own final-norm module and LM head. Each row's loss is backpropagated on its own (the rows share no
parameter, so the gradient is the same; only one row's ``[tokens, vocab]`` logits are held at a time).

**Jacobian lens** (Gurnee et al. 2026, the estimator of their reference implementation): for a sequence,
a cotangent ``v`` is put on the final residual at every target position ``p' ≥ skip`` at once and pulled
back (one VJP gives every row): the gradient at source position ``p`` is
``vᵀ Σ_{p' ≥ max(p, skip)} ∂h_final[p'] / ∂h_r[p]``; summed over source positions ``p ≥ skip`` and divided by
their number over the corpus, this is ``vᵀ J_r``. ``probes = 0``: the exact ``J_r``, with the ``d`` one-hot
cotangents (``d`` VJPs per sequence, ``dim_batch`` of them per backward pass as rows of one batch); ``probes =
k``: ``k`` Rademacher cotangents per sequence and ``J_r ≈ (1/k) Σ_i v_i (v_iᵀ J_r)`` (unbiased: ``E[v vᵀ] = I``).
No per-token Jacobian is ever formed. The forward and backward run in the model's dtype; sums in float64.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...errors import StreetlampError
from ...models.adapter import Inputs
from ...models.readout import check_lens
from ...progress import bar
from .base import Lens, row_sites

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter


def corpus_sequences(adapter: ModelAdapter, texts: list[str], seq_len: int, seed: int = 0) -> torch.Tensor:
    """``[n, seq_len]`` token ids: the texts, each after the document separator, packed and cut (the
    incomplete tail dropped), in a seeded random order."""
    sep = adapter.empty_context_token()
    stream: list[int] = []
    for t in texts:
        stream.append(sep)
        stream.extend(int(i) for i in adapter.tokenizer(t, add_special_tokens=False)["input_ids"])
    n = len(stream) // seq_len
    if n == 0:
        raise StreetlampError(f"the data has {len(stream)} tokens: fewer than one sequence of --seq-len {seq_len}")
    seqs = torch.tensor(stream[: n * seq_len], dtype=torch.long).view(n, seq_len)
    order = np.random.default_rng(seed).permutation(n)
    return seqs[torch.as_tensor(order)]


def _inputs(adapter: ModelAdapter, seqs: torch.Tensor) -> Inputs:
    return Inputs.from_ids(adapter, seqs, strings=False)


def hidden_rows(adapter: ModelAdapter, seqs: torch.Tensor) -> list[torch.Tensor]:
    """Every row's residual ``[n, seq_len, d]`` for the sequences ``seqs`` (no gradient)."""
    sites = row_sites(adapter.n_layers)
    with torch.no_grad():
        fwd = adapter.forward(_inputs(adapter, seqs), record=sites)
    return [fwd.cache[s] for s in sites]


def row_means(adapter: ModelAdapter, seqs: torch.Tensor, first: int = 1) -> torch.Tensor:
    """``[L + 1, d]`` float64: each row's mean residual over the tokens of ``seqs`` at positions ``>= first``
    (position 0 is the document separator, an attention sink with atypical residuals)."""
    L, d = adapter.n_layers, adapter.d_model
    if seqs.shape[1] <= first:
        raise StreetlampError(f"sequences of {seqs.shape[1]} tokens have no position from {first}")
    total = torch.zeros(L + 1, d, dtype=torch.float64)
    for i in range(seqs.shape[0]):
        rows = hidden_rows(adapter, seqs[i : i + 1])
        total += torch.stack([h[0, first:].double().sum(0).cpu() for h in rows])
    return total / (seqs.shape[0] * (seqs.shape[1] - first))


def model_readout(adapter: ModelAdapter) -> Callable[[torch.Tensor], torch.Tensor]:
    """``h ↦ logits`` through the model's own final-norm module and LM head (its dtype, differentiable),
    then the final soft-cap where it has one: what the model applies to its final residual."""
    from ...models.readout import FINAL_NORM
    from .base import capped

    check_lens(adapter)
    norm: Any = adapter.hf_model.base_model
    for part in FINAL_NORM[adapter.family.name].split("."):
        norm = getattr(norm, part)
    head = adapter.hf_model.get_output_embeddings()
    return lambda h: capped(adapter, head(norm(h)))


def fit_dtype(adapter: ModelAdapter) -> torch.dtype:
    """The model's dtype, refused when it is a 16-bit one (a lens is fitted in float32 or float64)."""
    dtype = next(adapter.hf_model.parameters()).dtype
    if dtype not in (torch.float32, torch.float64):
        raise StreetlampError(f"a lens is fitted in float32 or float64 (the model is {dtype}): pass --dtype float32")
    return dtype


def _kl(logp: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) per token ``[...]`` from ``log p`` and q's logits (float32 at least)."""
    logq = torch.log_softmax(logits_q.float() if logits_q.dtype in (torch.float16, torch.bfloat16) else logits_q, -1)
    return (logp.exp() * (logp - logq)).sum(-1)


def fit_tuned(
    adapter: ModelAdapter,
    train: torch.Tensor,
    *,
    steps: int,
    lr: float,
    batch_seqs: int,
    seed: int = 0,
) -> tuple[Lens, list[float]]:
    """A tuned lens trained on the sequences ``train`` ``[n, seq_len]``; also the loss (sum over rows of the
    mean token KL, nats) of each step."""
    L, d = adapter.n_layers, adapter.d_model
    dtype = fit_dtype(adapter)
    dev = adapter.device
    torch.manual_seed(seed)
    W = [torch.zeros(d, d, dtype=dtype, device=dev, requires_grad=True) for _ in range(L)]
    b = [torch.zeros(d, dtype=dtype, device=dev, requires_grad=True) for _ in range(L)]
    opt = torch.optim.Adam([*W, *b], lr=lr)
    read = model_readout(adapter)
    losses: list[float] = []
    n = train.shape[0]
    with bar(steps, "tuned lens: Adam steps") as pb:
        for step in range(steps):
            idx = [(step * batch_seqs + i) % n for i in range(batch_seqs)]
            rows = hidden_rows(adapter, train[idx])
            with torch.no_grad():
                logp = torch.log_softmax(read(rows[L]).to(dtype), -1)
            opt.zero_grad(set_to_none=True)
            total = 0.0
            for r in range(L):
                h = rows[r]
                loss = _kl(logp, read(h + h @ W[r].t() + b[r])).mean()
                loss.backward()
                total += float(loss.detach())
            opt.step()
            losses.append(total)
            pb.update(1)
    eye = torch.eye(d, dtype=torch.float64)
    A: list[torch.Tensor | None] = [eye + w.detach().double().cpu() for w in W]
    B: list[torch.Tensor | None] = [x.detach().double().cpu() for x in b]
    return Lens("tuned", L, d, A, B), losses


def fit_jacobian(
    adapter: ModelAdapter,
    train: torch.Tensor,
    *,
    probes: int = 0,
    skip_first: int = 16,
    dim_batch: int = 32,
    seed: int = 0,
) -> Lens:
    """The Jacobian lens averaged over the sequences ``train`` ``[n, seq_len]`` (module docstring)."""
    L, d = adapter.n_layers, adapter.d_model
    n, T = train.shape
    if T <= skip_first:
        raise StreetlampError(f"--seq-len {T} leaves no position after --skip-first {skip_first}")
    sites = row_sites(L)
    gen = torch.Generator().manual_seed(seed)
    sums = [torch.zeros(d, d, dtype=torch.float64) for _ in range(L)]
    fit_dtype(adapter)
    per_seq = d if probes == 0 else probes
    leaf = {sites[0]: lambda a: a.detach().requires_grad_(True)}  # row 0 has no graph above it
    with bar(n * -(-per_seq // dim_batch), "jacobian lens: backward passes") as pb:
        for s in range(n):
            if probes == 0:
                V = torch.eye(d, dtype=torch.float64)
            else:
                V = (torch.randint(0, 2, (probes, d), generator=gen) * 2 - 1).double()
            for c0 in range(0, per_seq, dim_batch):
                v = V[c0 : c0 + dim_batch]
                k = v.shape[0]
                inputs = _inputs(adapter, train[s : s + 1].expand(k, T))
                fwd = adapter.forward(inputs, record=sites, edit=leaf, keep_grad=True)
                hs = [fwd.cache[x] for x in sites]
                g_out = torch.zeros_like(hs[L])
                g_out[:, skip_first:] = v.to(g_out.device, g_out.dtype)[:, None]
                grads = torch.autograd.grad(hs[L], hs[:L], grad_outputs=g_out)
                for r in range(L):
                    S = grads[r][:, skip_first:].double().sum(1).cpu()  # [k, d]: v_iᵀ Σ_p Σ_p' ∂h_f[p']/∂h_r[p]
                    if probes == 0:
                        sums[r][c0 : c0 + k] += S
                    else:
                        sums[r] += v.t() @ S / probes
                del fwd, hs, grads
                pb.update(1)
    count = n * (T - skip_first)
    A: list[torch.Tensor | None] = [x / count for x in sums]
    return Lens("jacobian", L, d, A, [None] * L)


def heldout_kl(adapter: ModelAdapter, lenses: dict[str, Lens], seqs: torch.Tensor, skip_first: int = 0) -> dict:
    """Mean KL(p_final ‖ lens readout) per row over the tokens of ``seqs`` (positions from ``skip_first``),
    for each lens (float64 log-softmax of the readout through the model's own modules, the lens map in float64)."""
    L = adapter.n_layers
    read = model_readout(adapter)
    out = {name: np.zeros(L + 1) for name in lenses}
    tokens = 0
    for i in range(seqs.shape[0]):
        rows = hidden_rows(adapter, seqs[i : i + 1])
        with torch.no_grad():
            final = read(rows[L][0, skip_first:])
            logp = torch.log_softmax(final.double(), -1)
            tokens += logp.shape[0]
            for name, lens in lenses.items():
                for r in range(L + 1):
                    h = lens.transform(r, rows[r][0, skip_first:]).to(rows[r].dtype)
                    out[name][r] += float(_kl(logp, read(h).double()).sum())
    return {"kl": {k: v / tokens for k, v in out.items()}, "tokens": tokens}
