"""Interventions on a causal LM that leave a prefix of the text untouched, run from the first changed position.

A causal LM's position ``q`` reads only positions ``<= q``. An intervention whose first effect is at
position ``start`` -- the explained (last) query row replaced (permuted or adversarial attention), key ``j``
zeroed in every query row (rows before ``j`` never see it), token ``i`` deleted -- leaves positions
``< start`` as they were in every layer, so their keys and values are those of the unedited text. Such a row
is run as its suffix after the text's cached prefix (:meth:`~streetlamp.models.adapter.ModelAdapter.prefix_forward`):
the same outputs (up to floating-point reassociation) for ``n - start`` positions instead of ``n``.

Edits see the suffix's pattern ``[rows, heads, q_len, start + width]``: query index ``r`` is position
``start + r``, key index ``k`` is position ``k``.

``streetlamp replicate`` uses it for the edits of the explained row only (permutations, the adversarial
search: one position instead of ``n``). On CPU, one call per deletion or zeroed key (each its own start)
cost more than the padded batch of full rows it replaced (the weights are read once per call), so
leave-one-out and zeroing stay full-row batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..models.adapter import Inputs, ModelAdapter

# builds the site edits of one group of rows (their indices) given the key width of the group's pattern
PrefixEdit = Callable[[list[int], int], dict]


class PrefixRunner:
    """One text's KV cache and the rows that share it (``ids``: the text's token ids, specials included)."""

    def __init__(self, adapter: ModelAdapter, ids: Sequence[int]) -> None:
        self.adapter = adapter
        self.ids = [int(t) for t in ids]
        with torch.no_grad():
            one = Inputs.from_ids(adapter, [self.ids], strings=False)
            _, self.cache = adapter.prefix_forward(one, keep_cache=True)

    def logits(
        self, start: int, suffixes: Sequence[Sequence[int]], edit: dict | None = None, grad: bool = False
    ) -> torch.Tensor:
        """Next-token logits ``[rows, vocab]`` of ``text[:start] + suffix`` for each suffix (non-empty)."""
        inp = Inputs.from_ids(self.adapter, suffixes, strings=False)
        with self.adapter.session(edit=edit):
            logits, _ = self.adapter.prefix_forward(inp, self.cache if start else None, start, grad=grad)
        return logits

    @torch.no_grad()
    def map(
        self,
        starts: Sequence[int],
        suffixes: Sequence[Sequence[int]],
        fn: Callable[[list[int], torch.Tensor], torch.Tensor],
        width: int,
        edit: PrefixEdit | None = None,
    ) -> np.ndarray:
        """``fn(group, probs)`` (softmax in float64) for every row ``text[:starts[r]] + suffixes[r]``,
        rows grouped by start, ``[rows, width]`` float64 (as :func:`.common.output_map`)."""
        out = np.zeros((len(starts), width), dtype=np.float64)
        groups: dict[int, list[int]] = {}
        for r, st in enumerate(starts):
            groups.setdefault(int(st), []).append(r)
        for st, group in groups.items():
            k_width = st + max(len(suffixes[r]) for r in group)
            e = edit(group, k_width) if edit is not None else None
            logits = self.logits(st, [suffixes[r] for r in group], e or None)
            out[group] = fn(group, torch.softmax(logits.double(), -1)).reshape(len(group), width).cpu().numpy()
        return out


def prefix_runners(adapter: ModelAdapter, rows: Sequence[Sequence[int]], enabled: bool) -> list[PrefixRunner] | None:
    """One runner per text on a causal LM when ``enabled``, else None (the full-row path)."""
    if not enabled or not adapter.kind.causal:
        return None
    return [PrefixRunner(adapter, r) for r in rows]
