"""A lens: for every residual row ``r`` of a pre-norm causal LM (row 0: the residual entering layer 0, i.e.
the embedding; row ``l + 1``: ``resid_post`` of layer ``l``; row ``L``: the final residual) a map
``h ↦ A_r h + b_r`` and then the model's own readout ``W_U · norm_f(·) + b_U`` (and its final soft-cap).

* **logit lens**: ``A_r = I``, ``b_r = 0`` for every row;
* **tuned lens** (Belrose et al. 2023): ``A_r``, ``b_r`` trained, identity-initialised;
* **Jacobian lens** (Gurnee et al. 2026): ``A_r = J_r``, the corpus-averaged Jacobian of the final residual
  with respect to row ``r``, ``b_r = 0``.

Row ``L`` is the identity for every lens by construction (nothing is stored for it), so every lens reads
the model's own logits from the final residual.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ...models.readout import check_lens, final_norm, final_softcap, unembed

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter

KINDS = ("logit", "tuned", "jacobian")


def row_sites(n_layers: int) -> list[str]:
    """The site of each residual row: ``layers.0.resid_pre``, then ``layers.{l}.resid_post``."""
    return ["layers.0.resid_pre"] + [f"layers.{l}.resid_post" for l in range(n_layers)]


def row_label(r: int) -> str:
    return "embed" if r == 0 else str(r - 1)


@dataclass
class Lens:
    """One affine map per row ``0 .. L-1`` (``A`` ``[d, d]``, ``b`` ``[d]``, float64 on the CPU; None: the
    identity / zero); row ``L`` is always the identity. ``info``: how it was made (the lens folder's record).
    ``mean``: ``[L + 1, d]`` float64, each row's mean residual over the fit corpus (``lens --check`` with
    ``--baseline mean``), or None where the lens has none (the logit lens, an older or converted folder)."""

    kind: str
    n_layers: int
    d_model: int
    A: list[torch.Tensor | None]
    b: list[torch.Tensor | None]
    info: dict[str, Any] = field(default_factory=dict)
    mean: torch.Tensor | None = None

    @classmethod
    def identity(cls, kind: str, n_layers: int, d_model: int, info: dict[str, Any] | None = None) -> Lens:
        return cls(kind, n_layers, d_model, [None] * n_layers, [None] * n_layers, dict(info or {}))

    @classmethod
    def logit(cls, adapter: ModelAdapter) -> Lens:
        check_lens(adapter)
        return cls.identity("logit", adapter.n_layers, adapter.d_model)

    def transform(self, row: int, h: torch.Tensor) -> torch.Tensor:
        """``A_row h + b_row`` for ``h`` ``[..., d]`` (float64); ``h`` itself (as float64) at the identity."""
        h = h.double()
        if row >= self.n_layers:
            return h
        a, b = self.A[row], self.b[row]
        if a is not None:
            h = h @ a.to(h.device).t()
        if b is not None:
            h = h + b.to(h.device)
        return h

    def to_arrays(self) -> dict[str, torch.Tensor]:
        """The stored tensors (``A.{r}``, ``b.{r}``) of the rows that are not the identity, and ``mean``."""
        out: dict[str, torch.Tensor] = {}
        for r in range(self.n_layers):
            if self.A[r] is not None:
                out[f"A.{r}"] = self.A[r].double().contiguous()  # type: ignore[union-attr]
            if self.b[r] is not None:
                out[f"b.{r}"] = self.b[r].double().contiguous()  # type: ignore[union-attr]
        if self.mean is not None:
            out["mean"] = self.mean.double().contiguous()
        return out


def capped(adapter: ModelAdapter, logits: torch.Tensor) -> torch.Tensor:
    """The model's final-logit soft-cap applied to unembedded logits (identity without one)."""
    cap = final_softcap(adapter)
    return torch.tanh(logits / cap) * cap if cap else logits


def readout(adapter: ModelAdapter, lens: Lens, row: int, h: torch.Tensor) -> torch.Tensor:
    """Logits ``[..., vocab]`` (float64) that ``lens`` reads from row ``row``'s residual ``h`` ``[..., d]``:
    the final norm and unembedding of ``A h + b``, then the model's final soft-cap where it has one."""
    return read_final(adapter, lens.transform(row, h))


def read_final(adapter: ModelAdapter, h: torch.Tensor) -> torch.Tensor:
    """The model's readout of final-residual vectors ``h`` ``[..., d]``: final norm, unembedding, soft-cap (float64)."""
    return capped(adapter, unembed(adapter, final_norm(adapter)(h)))


def unembed_hash(adapter: ModelAdapter) -> str:
    """sha256 of the unembedding (and its bias) as float32 little-endian bytes: the same for a float32 model
    and its float64 copy, different for another model's unembedding of the same shape."""
    import hashlib

    import numpy as np

    from ...models.readout import unembedding

    w, b = unembedding(adapter)
    h = hashlib.sha256(np.ascontiguousarray(w.detach().float().cpu().numpy()).astype("<f4").tobytes())
    if b is not None:
        h.update(np.ascontiguousarray(b.detach().float().cpu().numpy()).astype("<f4").tobytes())
    return h.hexdigest()
