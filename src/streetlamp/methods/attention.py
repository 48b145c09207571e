"""Raw attention as an explanation (the "streetlight"): views of ``A[layer, head, query, key]``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter, Target, at_least_float32
from ..results import Explanation
from .base import Method


def record_attention(adapter: ModelAdapter, inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits ``[batch, n_out]``, attention ``[batch, layer, head, query, key]``, allowed ``[batch, q, k]``."""
    fwd = adapter.forward(inputs, record=["layers.*.attn.pattern"])
    att = torch.stack([fwd.cache[f"layers.{l}.attn.pattern"] for l in range(adapter.n_layers)], 1)
    return fwd.logits, att, fwd.cache["allowed"]


@dataclass
class Attention(Method):
    """Attention from the explained position to every token.

    ``view``: ``head_mean`` (mean over heads of ``layer``), ``head`` (one ``head`` of ``layer``),
    ``head_max``, or ``layer_mean`` (mean over all layers and heads). ``layer=-1`` is the last layer.
    """

    view: Literal["head_mean", "head", "head_max", "layer_mean"] = "head_mean"
    layer: int = -1
    head: int | None = None

    name = "attention"
    family = "attention"
    description = "raw attention weights from the explained position (the heatmap's claim)"

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        if not -adapter.n_layers <= self.layer < adapter.n_layers:
            raise StreetlampError(f"layer {self.layer} out of range: the model has {adapter.n_layers} layers")
        if self.view == "head" and (self.head is None or not 0 <= self.head < adapter.n_heads):
            raise StreetlampError(f"head {self.head} out of range: the model has {adapter.n_heads} heads per layer")

    def describe_view(self, adapter: ModelAdapter) -> str:
        l = self.layer % adapter.n_layers
        return {
            "head_mean": f"layer {l}, mean over {adapter.n_heads} heads",
            "head": f"layer {l}, head {self.head}",
            "head_max": f"layer {l}, max over {adapter.n_heads} heads",
            "layer_mean": f"mean over all {adapter.n_layers} layers and {adapter.n_heads} heads",
        }[self.view]

    def attribute(
        self, adapter: ModelAdapter, inputs: Inputs, *, target: Target, batch_size: int | None = None, seed: int = 0
    ) -> list[Explanation]:
        self.check(adapter)
        logits, att, allowed = record_attention(adapter, inputs)
        index = adapter.resolve(inputs, target, logits)
        out = []
        for b, n in enumerate(inputs.lengths):
            a = at_least_float32(att[b, :, :, :n, :n]).cpu().numpy()
            l = self.layer % adapter.n_layers
            view = {
                "head_mean": a[l].mean(0),
                "head": a[l, self.head or 0],
                "head_max": a[l].max(0),
                "layer_mean": a.mean((0, 1)),
            }[self.view]
            pos = adapter.explained_position(n)
            out.append(
                self.explanation(
                    adapter,
                    inputs,
                    b,
                    int(index[b]),
                    target,
                    arrays={
                        "tokens": view[pos].astype(np.float32),
                        "attention": a.astype(np.float32),
                        "allowed": allowed[b, :n, :n].cpu().numpy().astype(np.uint8),
                    },
                    axes={
                        "tokens": ["token"],
                        "attention": ["layer", "head", "query", "key"],
                        "allowed": ["query", "key"],
                    },
                    meaning={
                        "tokens": f"attention from position {pos} ({inputs.labels[b][pos]}), "
                        f"{self.describe_view(adapter)}",
                        "attention": "post-softmax attention probabilities, eval mode",
                        "allowed": "1 where the mask lets the query see the key (padding, causal)",
                    },
                    view=self.describe_view(adapter),
                    position=pos,
                )
            )
        return out
