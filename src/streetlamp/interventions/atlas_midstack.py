"""Start a forward pass at layer ``l``: the layers below it return a stored hidden state instead of computing.

An edit at layer ``l`` (a head ablated at ``layers.{l}.attn.z``) leaves everything below ``l`` as in
the clean run, so the ablated pass only needs the hidden state entering layer ``l`` (the clean run's
``layers.{l}.resid_pre``) and layers ``l..L-1``. :func:`start_at` swaps the ``forward`` of layers
``0..l-1`` for stubs inside a ``with`` block: layers ``0..l-2`` hand their input on untouched, layer
``l-1`` returns the stored hidden state; the embeddings, masks and rotary tables are still computed by
the model's own forward (cheap), so this works unchanged for every family whose encoder or decoder
loops over ``adapter.layer_modules`` (all of them: ``tests/interventions/test_atlas.py`` checks the
outputs equal the full forward, edits included, on encoders and decoders). Hooks on the stubbed layers
and their submodules do not fire: record nothing below ``l``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ..models.adapter import Inputs, ModelAdapter


def layer_output_arity(adapter: ModelAdapter, inputs: Inputs) -> int:
    """0 when a layer returns its hidden state as a tensor, else the length of the tuple it returns
    (DeBERTa: ``(hidden, attentions)``), seen on a forward of the first row of ``inputs``."""
    seen: list[Any] = []
    h = adapter.layer_modules[0].register_forward_hook(lambda m, a, o: seen.append(o))
    try:
        with torch.no_grad():
            adapter.forward(inputs.select([0]))
    finally:
        h.remove()
    out = seen[0]
    return len(out) if isinstance(out, tuple) else 0


@contextmanager
def start_at(adapter: ModelAdapter, layer: int, hidden: torch.Tensor, arity: int) -> Iterator[None]:
    """Inside the block, a forward pass of ``hidden.shape[0]`` rows starts at ``layer``: ``hidden``
    ``[rows, pos, d]`` is the state entering it (``arity`` from :func:`layer_output_arity`)."""
    if layer == 0:
        yield
        return

    def wrap(x: torch.Tensor) -> Any:
        return x if arity == 0 else (x, *([None] * (arity - 1)))

    def passthrough(*args: Any, **kwargs: Any) -> Any:
        return wrap(args[0] if args else kwargs["hidden_states"])

    def stored(*args: Any, **kwargs: Any) -> Any:
        x = args[0] if args else kwargs["hidden_states"]
        return wrap(hidden.to(x.device, x.dtype))

    mods = adapter.layer_modules[:layer]
    try:
        for m in mods[:-1]:
            m.forward = passthrough  # type: ignore[method-assign]
        mods[-1].forward = stored  # type: ignore[method-assign]
        yield
    finally:
        for m in mods:
            m.__dict__.pop("forward", None)  # the class's own forward again
