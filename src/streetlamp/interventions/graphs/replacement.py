"""The local replacement model of an attribution graph (METHODS.md §13; Ameisen et al. 2025, circuit-tracer).

On one prompt, the model with

- every MLP replaced by its transcoder (the :class:`~streetlamp.models.features.FeatureSet` attached to the
  adapter): the MLP's output is ``a W_dec + b_dec (+ x W_skip) + err``, with the features ``a`` and the
  reconstruction error ``err`` held at their clean values (nodes of the graph, not functions of the input);
  a layer without a transcoder keeps its whole MLP output as its error node;
- every attention pattern frozen at the clean run (the softmax output detached: the heads are linear maps
  of their values);
- every normalisation's denominator frozen (LayerNorm's std, RMSNorm's rms, the final norm and Gemma's
  sandwich and q/k norms alike: the scale detached, so each norm is linear in its input)

is linear between its nodes (token embeddings, features, errors, logits). Forward values are the model's,
bit for bit (only gradients change); edges are read by backward passes (:mod:`.attribution`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from ...errors import StreetlampError
from ...models.features import feature_site

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter
    from ...models.features import FeatureSet

__all__ = ["check_replacement", "frozen_norms", "frozen_weights", "transcoder_layers"]


def check_replacement(adapter: ModelAdapter) -> FeatureSet:
    """The attached feature set, or one line saying why the replacement model cannot be built."""
    fs = adapter.features
    if not adapter.kind.causal or adapter.kind.stacks != 1:
        raise StreetlampError(
            f"{adapter.name}: an attribution graph explains a next-token logit; it needs a one-stack causal LM, "
            f"not a {adapter.kind.name}"
        )
    if fs is None:
        raise StreetlampError("an attribution graph needs a dictionary: pass --features FOLDER (transcoders)")
    fs.check(adapter)
    if not transcoder_layers(adapter):
        raise StreetlampError(
            f"{fs.source or 'the feature set'} has no transcoder (dictionaries at 'mlp'): the replacement model "
            "replaces MLPs by transcoders; SAEs on the residual stream are not graph nodes"
        )
    if adapter.family.experts is not None:
        raise StreetlampError(
            f"{adapter.family.name}: a mixture-of-experts MLP routes each token through a nonlinear router; the "
            "replacement model here replaces dense MLPs only"
        )
    return fs


def transcoder_layers(adapter: ModelAdapter) -> list[int]:
    fs = adapter.features
    return [] if fs is None else sorted(l for l in range(adapter.n_layers) if fs.get(l, "mlp") is not None)


@contextmanager
def frozen_norms(adapter: ModelAdapter) -> Iterator[None]:
    """Every LayerNorm / RMSNorm of the model with its denominator detached for the ``with`` block (forward
    values unchanged, the norm linear in its input for gradients): AttnLRP's identity rule on norms
    (:mod:`streetlamp.models.relevance`), reused."""
    from ...models import sites
    from ...models.relevance import _norm_hook, _norm_kind

    offset = sites.norm_gain_offset(adapter.family.name)
    handles = []
    try:
        for m in adapter.hf_model.modules():
            kind = _norm_kind(m)
            if kind is not None:
                handles.append(m.register_forward_hook(_norm_hook(kind, offset if kind == "rmsnorm" else 0.0)))
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def frozen_weights(adapter: ModelAdapter) -> Iterator[None]:
    """The model's parameters with ``requires_grad`` off for the ``with`` block: a pass built inside saves no
    layer input for a weight gradient (a graph's rows need the gradients at its nodes only), so the retained
    forward pass holds the patterns, norm scales and what the nodes' own gradients need. Restored on exit (a
    retained graph built inside keeps working)."""
    params = [p for p in adapter.hf_model.parameters() if p.requires_grad]
    try:
        for p in params:
            p.requires_grad_(False)
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def freeze_edits(
    adapter: ModelAdapter,
    sinks: dict[str, torch.Tensor],
    stash: dict[int, torch.Tensor],
) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Site edits that make the forward pass the replacement model's: patterns detached, features and errors
    detached (their values kept in ``stash`` with the encoder's graph, as targets), a zero leaf added at
    ``embed`` and at every ``layers.{l}.mlp.out`` (``sinks``: the gradient there is what a source written
    at that site does)."""
    edits: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
    have = set(transcoder_layers(adapter))

    def sink(name: str, detach: bool) -> Callable[[torch.Tensor], torch.Tensor]:
        def fn(x: torch.Tensor) -> torch.Tensor:
            z = torch.zeros_like(x, requires_grad=True)
            sinks[name] = z
            return (x.detach() if detach else x) + z

        return fn

    def keep(layer: int) -> Callable[[torch.Tensor], torch.Tensor]:
        def fn(a: torch.Tensor) -> torch.Tensor:
            stash[layer] = a
            return a.detach()

        return fn

    edits["embed"] = sink("embed", True)
    for l in range(adapter.n_layers):
        edits[f"layers.{l}.attn.pattern"] = torch.Tensor.detach
        if l in have:
            edits[feature_site(l, "mlp")] = keep(l)
            edits[feature_site(l, "mlp", True)] = torch.Tensor.detach
        # with a transcoder the output is a.detach() W_dec + b_dec (+ x W_skip: its gradient kept) + err.detach()
        edits[f"layers.{l}.mlp.out"] = sink(f"layers.{l}.mlp.out", l not in have)
    return edits
