"""Edited rows whose edits all sit at layer ``l`` or above: the layers below ``l`` run once.

An edit of layer ``l``'s attention pattern (a zeroed item, a permuted or adversarial explained row) leaves
every layer below ``l`` exactly as in the unedited pass: their outputs depend on the input ids alone. So
the text (or the padded batch of texts) runs once recording each lower layer's output, and while
:func:`frozen_below` is active those layers return their recorded output (expanded to the rows of a
batch of copies of one text) instead of recomputing it; the embeddings and layers ``>= l`` run as usual,
with the edits. The same numbers up to floating-point reassociation of the batch (one text run alone
vs. the same text repeated in a batch), for ``L - l`` layers instead of ``L`` per row: with the default
``last`` layer, one layer per decision-flip row and per step of the adversarial search. A
:class:`FrozenRecords` shared by several blocks records each exact input once (evaluate: the decision
flip, the permutations and the adversarial search of a text replay one record, taken during the pass that
gives the output distribution and the attention items).
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


def _detached(out: Any) -> Any:
    if isinstance(out, tuple):
        return tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in out)
    return out.detach() if isinstance(out, torch.Tensor) else out


def _key(inputs: Inputs) -> tuple:
    return (tuple(inputs.input_ids.shape), inputs.input_ids.numpy().tobytes(), inputs.attention_mask.numpy().tobytes())


class FrozenRecords:
    """Layer outputs recorded once per exact input batch and replayed by every :func:`frozen_below` given them.

    The decision flip, the permutations and the adversarial search of one text all edit the same layer: with
    one ``FrozenRecords`` the text's lower layers are recorded once, not once per metric, and
    :meth:`capture` records them during a forward pass the caller runs anyway (evaluate's reference pass).
    ``runs`` counts the recording passes this object ran itself."""

    def __init__(self) -> None:
        self._outs: dict[tuple, list[Any]] = {}
        self.runs = 0

    def get(self, inputs: Inputs, layer: int) -> list[Any] | None:
        outs = self._outs.get(_key(inputs))
        return outs[:layer] if outs is not None and len(outs) >= layer else None

    @contextmanager
    def capture(self, adapter: ModelAdapter, inputs: Inputs, layers: int) -> Iterator[None]:
        """Keep the outputs of layers ``< layers`` of the one forward pass on ``inputs`` run inside the block."""
        mods = adapter.layer_modules[:layers]
        outs: list[Any] = [None] * len(mods)

        def keep(i: int):  # noqa: ANN202
            def hook(_m: torch.nn.Module, _a: tuple, out: Any) -> None:
                outs[i] = _detached(out)

            return hook

        handles = [m.register_forward_hook(keep(i)) for i, m in enumerate(mods)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()
        if mods and all(o is not None for o in outs):
            self._outs[_key(inputs)] = outs

    def record(self, adapter: ModelAdapter, inputs: Inputs, layer: int) -> list[Any]:
        outs = self.get(inputs, layer)
        if outs is None:
            with self.capture(adapter, inputs, layer), torch.no_grad():
                adapter.forward(inputs)
            self.runs += 1
            outs = self._outs[_key(inputs)]
        return outs


@contextmanager
def frozen_below(
    adapter: ModelAdapter, inputs: Inputs, layer: int, records: FrozenRecords | None = None
) -> Iterator[None]:
    """Layers ``< layer`` replay their outputs on ``inputs`` (one text, or the exact batch run later); with
    ``records`` the outputs come from (or go to) that shared record instead of a pass of this block's own."""
    mods = adapter.layer_modules[:layer]
    if not mods:
        yield
        return
    outs = (records if records is not None else FrozenRecords()).record(adapter, inputs, layer)
    for i, m in enumerate(mods):
        m.forward = lambda *a, _o=outs[i], **k: _expand(_o, _rows_of(a, k))  # type: ignore[method-assign]
    try:
        yield
    finally:
        for m in mods:
            del m.forward
