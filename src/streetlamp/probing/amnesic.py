"""Amnesic probing (Elazar et al., TACL 2021): is the probed property *used*?

Remove the property from one site's representation and let the rest of the model run from the
edited representation (through the intervention engine, :func:`streetlamp.interventions.engine.run`);
measure how much the output changes, against removing random directions of the same rank.

* The eraser is LEACE (Belrose et al., NeurIPS 2023, "LEACE: Perfect linear concept erasure in
  closed form") from the ``concept-erasure`` package: ``r(x) = x - W^+ P W (x - mu)``, with
  ``W`` the whitening of the training items' covariance and ``P`` the orthogonal projection on
  the column space of ``W Sigma_xz`` (``z`` = one-hot labels). After it, every class has the
  same mean, so no linear probe beats a constant one on the fitting data, and among all affine
  maps with that property it moves ``x`` the least in mean squared distance. We fit it in
  float64 without the package's trace constraint (which mixes in a non-erasing projection) and
  with a singular-value cut of 1e-9 (the package's 0.01 drops rare classes).
* The random control projects out ``rank`` random orthonormal directions around the same mean:
  ``x - (x - mu) U U^T``, ``U`` ``[d, rank]`` drawn from a Gaussian and orthonormalised (seeded).
* Where: token-level properties are erased at the labelled words' sub-tokens (where the
  eraser's guarantee holds: it was fitted on them), or with ``erase_at="all"`` at every position
  (as Elazar et al., whose part-of-speech labels cover every token); sentence-level ones at the
  pooled position (``first``/``last``; ``mean`` pooling: every
  position, which erases the mean exactly because the eraser is affine).
* Output change over the held-out texts: mean KL(p_original || p_edited) of the explained output
  distribution (class probabilities; next-token for a causal LM), the share of top-1 outputs that
  stay the same, and accuracy against gold labels where the task has them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from ..extras import require
from ..interventions.engine import Intervention, run
from ..models.adapter import Inputs, ModelAdapter

Where = Literal["all", "first", "last", "items"]


@dataclass
class Eraser:
    """An affine eraser ``x - (x - bias) @ right.T @ left.T`` (rank = ``right.shape[0]``)."""

    left: torch.Tensor  # [d, r]
    right: torch.Tensor  # [r, d]
    bias: torch.Tensor  # [d]
    kind: str

    @property
    def rank(self) -> int:
        return int(self.right.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.rank == 0:
            return x
        x64 = x.double()
        # the eraser is fitted on the host; the activations it edits live on the model's device
        bias, right, left = (t.to(x.device) for t in (self.bias, self.right, self.left))
        out = x64 - ((x64 - bias) @ right.T) @ left.T
        return out.to(x.dtype)

    def apply_np(self, X: np.ndarray) -> np.ndarray:
        return self(torch.as_tensor(np.asarray(X, np.float64))).numpy()


def fit_leace(X: np.ndarray, y: np.ndarray, n_classes: int, shrinkage: bool = True) -> Eraser:
    """LEACE eraser of the one-hot labels ``y`` from ``X [n, d]`` (float64, ``concept-erasure``)."""
    require("probe", "concept_erasure")
    from concept_erasure import LeaceFitter

    x = torch.as_tensor(np.asarray(X, np.float64))
    z = torch.nn.functional.one_hot(torch.as_tensor(np.asarray(y, np.int64)), n_classes).double()
    fitter = LeaceFitter(
        x.shape[1], n_classes, dtype=torch.float64, constrain_cov_trace=False, shrinkage=shrinkage, svd_tol=1e-9
    )
    fitter.update(x, z)
    e = fitter.eraser
    # drop the zeroed columns the package keeps (singular values under the cut)
    keep = e.proj_left.abs().sum(0) > 0
    return Eraser(
        e.proj_left[:, keep],
        e.proj_right[keep],
        e.bias if e.bias is not None else torch.zeros(x.shape[1], dtype=torch.float64),
        "leace",
    )


def random_eraser(d: int, rank: int, bias: torch.Tensor, seed: int) -> Eraser:
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(d, max(rank, 1), generator=g, dtype=torch.float64))
    u = u[:, :rank]
    return Eraser(u, u.T.contiguous(), bias.double(), "random")


def identity_eraser(d: int) -> Eraser:
    z = torch.zeros(d, 0, dtype=torch.float64)
    return Eraser(z, z.T.contiguous(), torch.zeros(d, dtype=torch.float64), "none")


def _edit(
    eraser: Eraser, where: Where, lengths: list[int], cells: list[tuple[int, int]] | None = None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``where``: every position, the first / last real one, or the given ``(row, pos)`` cells."""

    def fn(a: torch.Tensor) -> torch.Tensor:
        if where == "all":
            return eraser(a)
        new = a.clone()
        if where == "items":
            assert cells is not None
            rows, cols = (
                (torch.as_tensor(c, dtype=torch.long) for c in zip(*cells))
                if cells
                else (torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))
            )
        else:
            rows = torch.arange(a.shape[0])
            cols = (
                torch.zeros(a.shape[0], dtype=torch.long)
                if where == "first"
                else torch.as_tensor(lengths, dtype=torch.long) - 1
            )
        new[rows, cols] = eraser(a[rows, cols])
        return new

    return fn


def edited_logits(
    adapter: ModelAdapter,
    batches: list[Inputs],
    site: str,
    eraser: Eraser,
    where: Where,
    cells: list[list[tuple[int, int]]] | None = None,
) -> torch.Tensor:
    """Explained logits ``[n, n_outputs]`` with ``site`` replaced by ``eraser(site)`` (engine run);
    ``cells[b]`` = the ``(row, position)`` cells of batch b to edit when ``where == "items"``."""
    out = []
    for b, inp in enumerate(batches):
        iv = Intervention(site, _edit(eraser, where, inp.lengths, cells[b] if cells else None))
        out.append(run(adapter, inp, [iv]).logits.detach().double().cpu())
    return torch.cat(out)


@dataclass
class OutputChange:
    kl: float  # mean KL(original || edited), nats
    agree: float  # share of top-1 outputs unchanged
    accuracy: float  # against gold targets (nan without them)


def output_change(original: torch.Tensor, edited: torch.Tensor, targets: np.ndarray | None) -> OutputChange:
    lp0 = torch.log_softmax(original.double(), -1)
    lp1 = torch.log_softmax(edited.double(), -1)
    kl = (lp0.exp() * (lp0 - lp1)).sum(-1).clamp_min(0.0)
    agree = (original.argmax(-1) == edited.argmax(-1)).double().mean()
    acc = float("nan") if targets is None else float((edited.argmax(-1).numpy() == targets).mean())
    return OutputChange(float(kl.mean()), float(agree), acc)
