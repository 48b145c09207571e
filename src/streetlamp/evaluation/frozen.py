"""Edited rows whose edits all sit at layer ``l`` or above: the layers below ``l`` run once.

An edit of layer ``l``'s attention pattern (a zeroed item, a permuted or adversarial explained row) leaves
every layer below ``l`` exactly as in the unedited pass: their outputs depend on the input ids alone. So
the text (or the padded batch of texts) runs once recording each lower layer's output, and while
:func:`frozen_below` is active those layers return their recorded output (expanded to the rows of a
batch of copies of one text) instead of recomputing it; the embeddings and layers ``>= l`` run as usual,
with the edits. The same numbers up to floating-point reassociation of the batch (one text run alone
vs. the same text repeated in a batch), for ``L - l`` layers instead of ``L`` per row: with the default
``last`` layer, one layer per decision-flip row and per step of the adversarial search.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ..models.adapter import Inputs, ModelAdapter


def _rows_of(args: tuple, kwargs: dict) -> int:
    h = args[0] if args else kwargs.get("hidden_states")
    return int(h.shape[0]) if isinstance(h, torch.Tensor) else -1


def _expand(out: Any, rows: int) -> Any:
    if isinstance(out, torch.Tensor):
        if out.shape[0] == rows:
            return out
        if out.shape[0] != 1:
            raise RuntimeError(f"frozen layer recorded for {out.shape[0]} rows, called with {rows}")
        return out.expand(rows, *out.shape[1:])
    if isinstance(out, tuple):
        return tuple(_expand(o, rows) for o in out)
    return out


@contextmanager
def frozen_below(adapter: ModelAdapter, inputs: Inputs, layer: int) -> Iterator[None]:
    """Layers ``< layer`` replay their outputs on ``inputs`` (one text, or the exact batch run later)."""
    mods = adapter.layer_modules[:layer]
    if not mods:
        yield
        return
    outs: list[Any] = [None] * len(mods)

    def keep(i: int):  # noqa: ANN202
        def hook(_m: torch.nn.Module, _a: tuple, out: Any) -> None:
            outs[i] = (
                tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in out)
                if isinstance(out, tuple)
                else (out.detach() if isinstance(out, torch.Tensor) else out)
            )

        return hook

    handles = [m.register_forward_hook(keep(i)) for i, m in enumerate(mods)]
    try:
        with torch.no_grad():
            adapter.forward(inputs)
    finally:
        for h in handles:
            h.remove()
    for i, m in enumerate(mods):
        m.forward = lambda *a, _o=outs[i], **k: _expand(_o, _rows_of(a, k))  # type: ignore[method-assign]
    try:
        yield
    finally:
        for m in mods:
            del m.forward
