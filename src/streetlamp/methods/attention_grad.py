"""Attention weighted by gradients: attention × gradient, and Hao et al.'s attention attribution.

Both give per-edge scores ``[layer, head, query, key]``. Their token-level ``tokens`` aggregate is
the same for both: the **last layer's row of the explained position, summed over heads**,
``tokens[j] = Σ_h X[L-1, h, pos, j]`` (the same row the ``attention`` method shows by default, so
the three are comparable). For attention attribution this row sums (up to the Riemann error) to
``F(A) − F(0·A_{L-1})`` whenever only the explained position's last-layer row reaches the output
([CLS] classifiers, causal LMs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from ..batching import chunks
from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter, Target
from ..results import Explanation
from .base import Method
from .long_input import LongInput, LongRow
from .rollout import attention_gradient_texts

try:
    from tqdm import tqdm  # text bars everywhere (tqdm.auto warns in notebooks without ipywidgets)
except ImportError:  # pragma: no cover
    tqdm = None

TOKENS_MEANING = "sum over heads of the last layer's row of position {pos} ({label})"


@dataclass
class AttentionXGradient(Method):
    """Attention × gradient ``A ⊙ ∂F/∂A`` per layer and head (the signal Jain & Wallace 2019 and
    Serrano & Smith 2019 compare with raw attention): a first-order estimate of how F changes
    when each attention edge is removed."""

    name = "attention_x_gradient"
    family = "attention"
    description = "attention times its gradient, A * dF/dA, per layer and head"
    needs_gradients = True
    long_input = True
    long_needs_graph = True

    def attribute_long(self, long: LongInput) -> LongRow:
        """The last layer's row of the explained position from the recorder of the one chunked pass (the pass
        kept the graph from the last layer's attention output on: ``long_needs_graph``)."""
        assert long.logits is not None and long.recorder is not None
        row, index = long_row(long.adapter, long.inputs, long.target, long.logits, long.recorder)
        pos = long.position
        return LongRow(
            row,
            f"sum over heads of the last layer's row {pos} of A ⊙ dF/dA, dF/dA[h, {pos}, j] = dF/dz[{pos}, h] · v[h, j] "
            f"(F = {long.target.describe(long.adapter, index)})",
        )

    def attribute(
        self, adapter: ModelAdapter, inputs: Inputs, *, target: Target, batch_size: int | None = None, seed: int = 0
    ) -> list[Explanation]:
        self.check(adapter)
        out: list[Explanation | None] = [None] * len(inputs)
        for b, sub, k, a, g, index in attention_gradient_texts(adapter, inputs, target, batch_size):
            axg = a * g
            pos = adapter.explained_position(a.shape[-1])
            out[b] = self.explanation(
                adapter,
                sub,
                k,
                index,
                target,
                arrays={
                    "tokens": axg[-1, :, pos].sum(0).astype(np.float32),
                    "attention_x_gradient": axg.astype(np.float32),
                },
                axes={"tokens": ["token"], "attention_x_gradient": ["layer", "head", "query", "key"]},
                meaning={
                    "tokens": TOKENS_MEANING.format(pos=pos, label=inputs.labels[b][pos]) + " of A ⊙ dF/dA",
                    "attention_x_gradient": "A ⊙ dF/dA (post-softmax attention times its gradient)",
                },
                position=pos,
            )
        return [e for e in out if e is not None]


def long_row(
    adapter: ModelAdapter, inputs: Inputs, target: Target, logits: torch.Tensor, recorder: Any
) -> tuple[np.ndarray, int]:
    """Attention x gradient of the explained row at the last layer, summed over heads (the ``tokens`` of
    :class:`AttentionXGradient`) ``[seq]``, from a long recording's graph-carrying logits and its recorder
    (:meth:`~streetlamp.models.chunked.Recorder.attention_x_gradient`); and the explained output."""
    index = adapter.resolve(inputs, target, logits.detach())
    with torch.enable_grad():
        f = adapter.score(logits, index.to(logits.device), target).sum()
        axg = recorder.attention_x_gradient(f)
    return axg.sum(0).double().cpu().numpy(), int(index[0])


NO_COMPLETENESS = (
    "cannot hold for this family: each layer's attention output is RMS-normalised before the residual, so "
    "scaling the layer's attention by any α > 0 leaves the output unchanged (the attributions sum to about 0) "
    "while α = 0 removes the layer; completeness_error is then -(F(A) - F(0·A_l)), not a Riemann error"
)


@dataclass
class AttentionAttribution(Method):
    """Self-attention attribution (Hao, Dong, Wei & Xu, AAAI 2021, eq. 2): for each layer l, scale
    that layer's attention (all heads together) to ``α·A_l``, other layers untouched, and
    ``Attr_l = A_l ⊙ (1/m) Σ_{k=1..m} ∂F/∂X |_{X = (k/m)·A_l}`` (right Riemann sum, ``m = steps``,
    as in the paper). By completeness ``Σ Attr_l ≈ F(A) − F(0·A_l)``; the exact gap per layer is
    returned as ``completeness_error``. ``head_scores[l, h]`` is the max (Hao's choice) or the sum
    of head h's entries.

    Where a layer's attention output is RMS-normalised before the residual (Gemma 2/3), F(α·A_l) is the
    same for every α > 0 and jumps at α = 0: every point of the path but its start gives the same output,
    so ``Σ Attr_l`` is 0 up to the norm's epsilon (Euler: ``Σ A ∂F/∂A = 0`` for a function of degree 0)
    while ``F(A) − F(0·A_l)`` is not. Completeness cannot hold there; the explanation says so.
    """

    steps: int = 20
    head_score: Literal["max", "sum"] = "max"

    name = "attention_attribution"
    family = "attention"
    description = "Hao et al. 2021: integrated gradients over each layer's attention scaled from 0 to A"
    needs_gradients = True
    reports_completeness = True

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        if not isinstance(self.steps, int) or self.steps < 1:
            raise StreetlampError(f"attention_attribution steps must be an integer >= 1, not {self.steps!r}")
        if self.head_score not in ("max", "sum"):
            raise StreetlampError(f"head_score must be 'max' or 'sum', not {self.head_score!r}")

    def attribute(
        self, adapter: ModelAdapter, inputs: Inputs, *, target: Target, batch_size: int | None = None, seed: int = 0
    ) -> list[Explanation]:
        self.check(adapter)
        index = adapter.resolve(inputs, target)
        L, m = adapter.n_layers, self.steps
        bar = None
        total_rows = sum(L * (m + 1) for _ in inputs.lengths)
        if tqdm is not None and total_rows * max(inputs.lengths) > 20000:
            bar = tqdm(total=total_rows, desc="attention_attribution", unit="pass", leave=False, delay=2.0)
        out = []
        try:
            for b, n in enumerate(inputs.lengths):
                one = inputs.select([b])
                attr, gap = self._one_text(adapter, one, int(index[b]), target, batch_size, bar)
                pos = adapter.explained_position(n)
                heads = attr.max((2, 3)) if self.head_score == "max" else attr.sum((2, 3))
                out.append(
                    self.explanation(
                        adapter,
                        inputs,
                        b,
                        int(index[b]),
                        target,
                        arrays={
                            "tokens": attr[-1, :, pos].sum(0).astype(np.float32),
                            "attention_attribution": attr.astype(np.float32),
                            "head_scores": heads.astype(np.float32),
                            "completeness_error": gap.astype(np.float32),
                        },
                        axes={
                            "tokens": ["token"],
                            "attention_attribution": ["layer", "head", "query", "key"],
                            "head_scores": ["layer", "head"],
                            "completeness_error": ["layer"],
                        },
                        meaning={
                            "tokens": TOKENS_MEANING.format(pos=pos, label=inputs.labels[b][pos]) + " of Attr_l",
                            "attention_attribution": f"Attr_l = A_l ⊙ mean over α=k/{m} of dF/dX at X=α·A_l",
                            "head_scores": f"{self.head_score} of each head's attribution entries",
                            "completeness_error": "Σ Attr_l − (F(A) − F(0·A_l)) per layer (Riemann error)",
                        },
                        position=pos,
                        steps=m,
                        **({"completeness": NO_COMPLETENESS} if adapter.family.normed_attention_output else {}),
                    )
                )
        finally:
            if bar is not None:
                bar.close()
        return out

    def _one_text(
        self, adapter: ModelAdapter, one: Inputs, index: int, target: Target, batch_size: int | None, bar
    ) -> tuple[np.ndarray, np.ndarray]:
        """Attribution ``[L, H, n, n]`` and per-layer completeness gap for one unpadded text."""
        L, m, n = adapter.n_layers, self.steps, one.lengths[0]
        dev = adapter.device
        # rows: (layer l, k) with α = k/m for k = 1..m, plus k = 0 for F(0·A_l)
        jobs = [(l, k) for l in range(L) for k in range(m + 1)]
        sites = [f"layers.{l}.attn.pattern" for l in range(L)]
        grad_sum = torch.zeros(L, adapter.n_heads, n, n, dtype=torch.float64)
        f_zero = np.zeros(L)
        f_full = 0.0
        att = None
        for sl in chunks(len(jobs), n, batch_size, dev):
            part = jobs[sl]
            rows = len(part)
            alpha = torch.ones(rows, L, dtype=torch.float64)
            for r, (l, k) in enumerate(part):
                alpha[r, l] = k / m
            batch = one.repeat(rows)
            edits = {s: _scale(alpha[:, l]) for l, s in enumerate(sites)}
            fwd = adapter.forward(batch, record=sites, edit=edits, keep_grad=True, grad=True)
            idx = torch.full((rows,), index, dtype=torch.long, device=fwd.logits.device)
            f = adapter.score(fwd.logits, idx, target)
            pats = [fwd.cache[s] for s in sites]
            grads = torch.autograd.grad(f.sum(), pats, allow_unused=True)
            for r, (l, k) in enumerate(part):
                if k == 0:
                    f_zero[l] = float(f[r].detach())
                elif grads[l] is not None:
                    grad_sum[l] += grads[l][r].detach().double().cpu()
                if k == m and att is None:  # α = 1: the recorded pattern is A itself
                    att = torch.stack([p[r].detach().double().cpu() for p in pats])
                    f_full = float(f[r].detach())
            if bar is not None:
                bar.update(rows)
        assert att is not None
        attr = (att * grad_sum / m).numpy()
        gap = attr.sum((1, 2, 3)) - (f_full - f_zero)
        return attr, gap


def _scale(alpha: torch.Tensor):
    def fn(p: torch.Tensor) -> torch.Tensor:
        return p * alpha.to(device=p.device, dtype=p.dtype).view(-1, 1, 1, 1)

    return fn
