"""Raw attention as an explanation (the "streetlight"): views of ``A[layer, head, query, key]``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter, Target
from ..results import Explanation
from .base import CAUSAL_LM, CLASSIFIER, ENCODER_DECODER, Method, ViewAttribution
from .views import SequenceView, View


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
    kinds = (CLASSIFIER, CAUSAL_LM, ENCODER_DECODER)

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        self._check_range(adapter.n_layers, adapter.n_heads, "the model")

    def check_view(self, view: View) -> None:
        super().check_view(view)
        self._check_range(*view.attention_stack())

    def _check_range(self, n_layers: int, n_heads: int, what: str) -> None:
        if not -n_layers <= self.layer < n_layers:
            raise StreetlampError(f"layer {self.layer} out of range: {what} has {n_layers} layers")
        if self.view == "head" and (self.head is None or not 0 <= self.head < n_heads):
            raise StreetlampError(f"head {self.head} out of range: {what} has {n_heads} heads per layer")

    def describe_view(self, adapter: ModelAdapter) -> str:
        l = self.layer % adapter.n_layers
        return {
            "head_mean": f"layer {l}, mean over {adapter.n_heads} heads",
            "head": f"layer {l}, head {self.head}",
            "head_max": f"layer {l}, max over {adapter.n_heads} heads",
            "layer_mean": f"mean over all {adapter.n_layers} layers and {adapter.n_heads} heads",
        }[self.view]

    def reduce(self, a: np.ndarray) -> np.ndarray:
        """The method's view of ``[layer, head, query, key]`` -> ``[query, key]``."""
        l = self.layer % a.shape[0]
        return {
            "head_mean": lambda: a[l].mean(0),
            "head": lambda: a[l, self.head or 0],
            "head_max": lambda: a[l].max(0),
            "layer_mean": lambda: a.mean((0, 1)),
        }[self.view]()

    def attend(self, view: View) -> tuple[dict[str, np.ndarray], list, dict]:
        """The method, once: per attention site family, the explained rows' attention placed in the view's
        columns ``[k, n]``; the blocks and the view's extra arrays."""
        blocks, extra = view.attention()
        mats = {}
        for blk in blocks:
            mat = np.zeros((view.k, view.n))
            mat[:, blk.columns] = self.reduce(blk.pattern)[blk.queries]
            mats[blk.site] = mat
        return mats, blocks, extra

    def attribute_view(self, view: View, *, batch_size: int | None = None, seed: int = 0) -> ViewAttribution:
        self.check_view(view)
        with torch.no_grad():
            mats, _, extra = self.attend(view)
        return ViewAttribution(mats, extra)

    def attribute(
        self, adapter: ModelAdapter, inputs: Inputs, *, target: Target, batch_size: int | None = None, seed: int = 0
    ) -> list[Explanation]:
        self.check(adapter)
        logits, att, allowed = record_attention(adapter, inputs)
        index = adapter.resolve(inputs, target, logits)
        out = []
        for b in range(len(inputs)):
            view = SequenceView(adapter, inputs, b, target).recorded(att[b], allowed[b], index[b])
            mats, blocks, extra = self.attend(view)
            pos = blocks[0].queries[0]
            out.append(
                self.explanation(
                    adapter,
                    inputs,
                    b,
                    int(index[b]),
                    target,
                    arrays={
                        "tokens": mats[""][0].astype(np.float32),
                        "attention": blocks[0].pattern.astype(np.float32),
                        "allowed": extra["allowed"][0],
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
                        "allowed": extra["allowed"][2],
                    },
                    view=self.describe_view(adapter),
                    position=pos,
                )
            )
        return out
