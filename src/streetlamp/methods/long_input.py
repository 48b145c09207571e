"""The long-input capability (``Method.long_input``): what a method reads from one long text recorded in
bounded memory by ``explain --rows/--layers/--heads`` (:mod:`streetlamp.commands.explain.long`).

The runner finds the methods by registry query (:func:`~streetlamp.methods.registry.long_methods`), checks each against the text
(:meth:`~streetlamp.methods.base.Method.check_long`) before anything is written, records once (one chunked
pass; with the last layer's graph when a method declares ``long_needs_graph``), and asks each method for the
explained row (:meth:`~streetlamp.methods.base.Method.attribute_long`). The long implementations are the
methods' own: rollout and flow from the stored queries and keys (:mod:`.long_rows`), attention x gradient
from the recorder, occlusion by spans (:mod:`.long_occlusion`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..models.adapter import Inputs, ModelAdapter, Target

if TYPE_CHECKING:
    from ..models.chunked import QKStore, Recorder


@dataclass
class LongInput:
    """One long text: its inputs and explained position, the run's settings for the long implementations
    (``window``: occlusion's span length, None = the default), and after the recording pass the stored
    queries and keys (``store``), the recorder and the explained logits (with the graph when asked)."""

    adapter: ModelAdapter
    inputs: Inputs
    target: Target
    position: int
    chunk: int | None = None
    window: int | None = None
    store: QKStore | None = None
    recorder: Recorder | None = None
    logits: torch.Tensor | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.inputs.lengths[0])


@dataclass
class LongRow:
    """A long-input method's explained row ``tokens`` ``[token]``, its meaning, extra arrays (name -> (array,
    axes, meaning, extra manifest fields)) and the run parameters it adds."""

    tokens: np.ndarray
    meaning: str
    arrays: dict[str, tuple[np.ndarray, list[str], str, dict[str, Any]]] = field(default_factory=dict)
    parameters: dict[str, Any] = field(default_factory=dict)
