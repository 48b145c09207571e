"""Gradient attributions over the token embeddings (site ``embed``).

* ``saliency`` (Simonyan et al., 2014, "Deep Inside Convolutional Networks"; for text e.g.
  Li et al., NAACL 2016): ``s_i = ‖∂F/∂e_i‖₂``, the L2 norm over the embedding dimension.
* ``gradient_x_input`` (Shrikumar et al., 2016 / Kindermans et al., 2016):
  ``s_i = Σ_d e_i,d · ∂F/∂e_i,d``.

``e_i`` is the output of the token-embedding lookup (the ``embed`` site: before position
embeddings and LayerNorm), ``F`` the explained scalar of :class:`~streetlamp.models.adapter.Target`.
Each text is run alone at its own length (no padding), so results do not depend on the batch.
Integrated gradients lives in :mod:`streetlamp.methods.ig` and uses the helpers here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from ..batching import chunks
from ..models.adapter import Inputs, ModelAdapter, Target, at_least_float32
from ..results import Explanation
from .base import CAUSAL_LM, CLASSIFIER, ENCODER_DECODER, Method, ViewAttribution
from .views import SequenceView, View, ids_inputs


@torch.no_grad()
def embed_ids(adapter: ModelAdapter, ids: torch.Tensor) -> torch.Tensor:
    """The ``embed`` site for token ids ``[pos]`` -> ``[pos, d_model]``.

    The site is the output of the token-embedding module (``Session`` hooks exactly that module), so
    the lookup alone gives it; running the whole model to record it cost one forward pass per call."""
    return adapter.embed_tokens(ids)


def scores_at(
    adapter: ModelAdapter, ids: torch.Tensor, emb: torch.Tensor, index: int, target: Target, grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """F and (optionally) ∂F/∂emb for rows of embeddings ``emb`` ``[rows, pos, d]`` of the text ``ids``.

    One forward (and one backward) pass: the rows are independent, so the gradient of ``ΣF``
    is the per-row gradient.
    """
    rows = emb.shape[0]
    x = emb.detach().requires_grad_(grad)
    fwd = adapter.forward(ids_inputs(adapter, ids, rows), edit={"embed": lambda e: x.to(e.dtype)}, grad=grad)
    idx = torch.full((rows,), int(index), dtype=torch.long, device=fwd.logits.device)
    f = adapter.score(fwd.logits, idx, target)
    if not grad:
        return f.detach(), None
    (g,) = torch.autograd.grad(f.sum(), x)
    return f.detach(), g


def text_batches(adapter: ModelAdapter, inputs: Inputs) -> Iterator[tuple[int, torch.Tensor]]:
    """(b, ids ``[pos]`` on the device) for every text, cropped to its real length."""
    for b, n in enumerate(inputs.lengths):
        yield b, inputs.input_ids[b, :n].to(adapter.device)


def resolve_one(adapter: ModelAdapter, ids: torch.Tensor, target: Target, logits: torch.Tensor) -> int:
    """The explained output index for one text (checks range; prediction when ``index`` is None)."""
    return int(adapter.resolve(ids_inputs(adapter, ids.cpu()), target, logits.view(1, -1))[0])


@dataclass
class _PlainGradient(Method):
    family = "gradient"
    needs_gradients = True
    kinds = (CLASSIFIER, CAUSAL_LM, ENCODER_DECODER)

    def _per_token(self, e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def scores_view(self, view: View) -> tuple[torch.Tensor, torch.Tensor]:
        """``F`` ``[k]`` and the per-token scores ``[k, n]`` of every row of ``view`` (the method, once)."""
        e = view.embeddings()
        view.index()  # the explained outputs are resolved before the gradient pass
        f, g = view.gradients(e)
        return f, self._per_token(at_least_float32(e)[None], at_least_float32(g))

    def attribute_view(self, view: View, *, batch_size: int | None = None, seed: int = 0) -> ViewAttribution:
        self.check_view(view)
        _, s = self.scores_view(view)
        return ViewAttribution({"": s.detach().cpu().numpy() * view.allowed})

    def attribute(
        self, adapter: ModelAdapter, inputs: Inputs, *, target: Target, batch_size: int | None = None, seed: int = 0
    ) -> list[Explanation]:
        self.check(adapter)
        out = []
        for b in range(len(inputs)):
            view = SequenceView(adapter, inputs, b, target)
            f, s = self.scores_view(view)
            out.append(
                self.explanation(
                    adapter,
                    inputs,
                    b,
                    int(view.index()[0]),
                    target,
                    arrays={"tokens": s[0].detach().cpu().numpy().astype(np.float32)},
                    axes={"tokens": ["token"]},
                    meaning={"tokens": self.meaning},
                    site="embed",
                    F=float(f[0]),
                )
            )
        return out

    meaning = ""


@dataclass
class Saliency(_PlainGradient):
    """Saliency ``‖∂F/∂e_i‖₂`` over the token embedding ``e_i`` (site ``embed``); always ≥ 0."""

    name = "saliency"
    description = "L2 norm of the gradient of F w.r.t. each token embedding"
    meaning = "||dF/de_i||_2 over the token-embedding dimension (site embed), unsigned"

    def _per_token(self, e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return g.norm(dim=-1)


@dataclass
class GradientXInput(_PlainGradient):
    """Gradient × input ``Σ_d e_i,d ∂F/∂e_i,d`` over the token embedding (site ``embed``); signed."""

    name = "gradient_x_input"
    description = "token embedding times the gradient of F, summed over the embedding dimension"
    meaning = "sum_d e_i * dF/de_i over the token embedding (site embed), signed"

    def _per_token(self, e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return (e * g).sum(-1)


__all__ = ["Saliency", "GradientXInput", "scores_at", "embed_ids", "ids_inputs", "chunks", "resolve_one"]
