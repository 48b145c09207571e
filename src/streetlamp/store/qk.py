"""A long-context recording on disk: the kept attention rows' shards and every layer's queries and keys.

The recorder (:class:`streetlamp.models.chunked.Recorder`) writes, as the forward pass goes,
``qk/L{l}.safetensors`` (``query`` ``[head, pos, d_head]``, ``key`` ``[kv_head, pos, d_head]``) per layer and
``attention/L{l}_{r0}-{r1}.safetensors`` (``pattern`` ``[head, query, key]``) per query chunk holding a kept
row; the manifest's ``long_context`` section names them with the rules that turn queries and keys into
probabilities. :class:`QKStore` reads them back: any attention row or column, recomputed on demand by the
recorder's own code (:mod:`streetlamp.models.pattern`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..errors import StreetlampError
from ..models.pattern import LayerRule, Scratch, chunk_rows, pattern_rows, repeat_heads
from .files import folder_file, umask_mode

QK_DIR, SHARD_DIR = "qk", "attention"


def qk_file(layer: int) -> str:
    """The queries-and-keys file of ``layer``, relative to the run folder."""
    return f"{QK_DIR}/L{layer}.safetensors"


def make_dirs(folder: Path) -> None:
    (folder / QK_DIR).mkdir(parents=True, exist_ok=True)
    (folder / SHARD_DIR).mkdir(parents=True, exist_ok=True)


def write_qk(folder: Path, layer: int, query: torch.Tensor, key: torch.Tensor) -> None:
    """Layer ``layer``'s queries ``[head, pos, d]`` and keys ``[kv_head, pos, d]`` (moved to the CPU)."""
    save_file({"query": query.contiguous().cpu(), "key": key.contiguous().cpu()}, str(folder / qk_file(layer)))
    umask_mode(folder / qk_file(layer))


def write_shard(folder: Path, layer: int, pattern: torch.Tensor, first: int, last: int) -> str:
    """One shard of kept rows ``first..last`` of ``layer`` (``pattern`` ``[head, row, key]``); its file name."""
    name = f"{SHARD_DIR}/L{layer}_{first}-{last}.safetensors"
    save_file({"pattern": pattern}, str(folder / name))
    umask_mode(folder / name)
    return name


def _inside(folder: Path, name: object) -> Path:
    """``folder / name``, refused when it leads outside the recording's folder (it may come from elsewhere)."""
    p = folder_file(folder, name)
    assert p is not None
    return p


class QKStore:
    """The stored queries, keys and rules of a long recording: any attention row or column, on demand."""

    def __init__(
        self, folder: Path | str, section: dict[str, Any] | None = None, device: torch.device | str | None = None
    ) -> None:
        self.folder = Path(folder)
        self.device = torch.device(device) if device is not None else None  # where rows are recomputed
        if section is None:
            manifest = json.loads(_inside(self.folder, "manifest.json").read_text())
            if "long_context" not in manifest:
                raise StreetlampError(
                    f"{folder} holds no long-context recording (write one with `streetlamp explain TEXT --rows ...`)"
                )
            section = manifest["long_context"]
        self.section = section
        self.rules = {int(l): LayerRule(**r) for l, r in section["qk"]["rules"].items()}
        self.n_tokens = int(section["n_tokens"])
        self.n_layers = len(self.rules)
        self.scratch = Scratch()

    def load(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, LayerRule]:
        """Queries ``[head, pos, d]``, repeated keys ``[head, pos, d]`` and the rule of ``layer``."""
        if layer not in self.rules:
            raise StreetlampError(f"layer {layer} out of range: the recording has layers 0..{self.n_layers - 1}")
        rule = self.rules[layer]
        with safe_open(str(_inside(self.folder, self.section["qk"]["files"][str(layer)])), framework="pt") as f:
            q, k = f.get_tensor("query"), f.get_tensor("key")
        if self.device is not None:
            q, k = q.to(self.device), k.to(self.device)
        return q, repeat_heads(k, rule.groups), rule

    def rows(self, layer: int, rows: list[int], heads: list[int] | None = None) -> torch.Tensor:
        """Attention ``[head, len(rows), key]`` of query ``rows`` at ``layer`` (all heads unless ``heads``)."""
        self._check(rows, "row")
        q, k, rule = self.load(layer)
        step = self.chunk_size(q)
        got: dict[int, torch.Tensor] = {}
        for c in sorted({r // step for r in rows}):  # the recording's chunks: the same matmul shapes
            r0, r1 = c * step, min(self.n_tokens, (c + 1) * step)
            p = pattern_rows(q, k, r0, r1, rule, self.scratch)
            got.update({r: p[:, r - r0] for r in rows if r0 <= r < r1})
        out = torch.stack([got[r] for r in rows], 1)
        return out if heads is None else out[torch.tensor(heads)]

    def chunk_size(self, q: torch.Tensor) -> int:
        return int(self.section.get("chunk") or chunk_rows(q.shape[0], self.n_tokens, max(4, q.element_size())))

    def chunks(self, layer: int, chunk: int | None = None) -> Iterator[tuple[int, int, torch.Tensor]]:
        """``(r0, r1, probs [head, r1 - r0, key])`` over all query rows of ``layer``, chunk by chunk."""
        q, k, rule = self.load(layer)
        step = chunk or self.chunk_size(q)
        for r0 in range(0, self.n_tokens, step):
            r1 = min(self.n_tokens, r0 + step)
            yield r0, r1, pattern_rows(q, k, r0, r1, rule, self.scratch)

    def column(self, layer: int, key: int, chunk: int | None = None) -> torch.Tensor:
        """Attention ``[head, query]`` every query pays to ``key`` at ``layer`` (rows recomputed chunk by chunk)."""
        self._check([key], "column")
        return torch.cat([p[:, :, key] for _, _, p in self.chunks(layer, chunk)], 1)

    def _check(self, idx: list[int], what: str) -> None:
        bad = [i for i in idx if not 0 <= i < self.n_tokens]
        if bad:
            raise StreetlampError(f"{what} {bad[0]} out of range: the recording has positions 0..{self.n_tokens - 1}")
