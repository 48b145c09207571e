"""Attention in query chunks: long inputs in bounded memory, with exact rows on request.

A forward pass under :func:`record_long` never holds ``[head, query, key]`` for a whole layer: the
attention function (:mod:`streetlamp.models.attention`) hands each layer to :meth:`Recorder.attend`,
which computes the probabilities ``chunk`` query rows at a time (``[head, chunk, key]``), multiplies
them into the values and keeps only what was asked:

* the rows ``rows`` of heads ``heads`` at layers ``layers`` (``attention/L{l}_{r0}-{r1}.safetensors``,
  one shard per query chunk that holds a kept row, written as the pass goes);
* per layer the queries and keys exactly as the attention function sees them (after RoPE, q/k norms
  and biases; keys before ``repeat_kv``, whose copy is pure indexing), in ``qk/L{l}.safetensors``,
  and the rule that turns them into probabilities (:class:`LayerRule`: scaling, soft-cap, causal,
  sliding window). :func:`pattern_rows` applied to them gives the recorded rows again, bit for bit
  on the same machine (the same code runs in both places).

The probabilities are those of the eager path: ``softmax(cap(q kᵀ · scaling) + mask)`` in float32
(float64 when the model runs in double), masked cells exactly 0. Masks are not stored: the mask
transformers builds for the chunked implementation (``sdpa_mask``: None for plain causal or
bidirectional text, a boolean ``[query, key]`` for sliding-window layers) is checked, chunk by
chunk, against the rule, and a mask the rule does not describe (padding) is refused.

The files are written and read back by :mod:`streetlamp.store.qk` (:class:`~streetlamp.store.qk.QKStore`);
the row arithmetic is :mod:`streetlamp.models.pattern`'s and the mask rule :mod:`streetlamp.models.masks`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..errors import StreetlampError
from ..store.qk import QKStore, make_dirs, qk_file, write_qk, write_shard
from .attention import fused_attention, sdpa, streetlamp_attention
from .context import active_recorder, recording
from .masks import allowed
from .pattern import CHUNK_BYTES, LayerRule, Scratch, chunk_rows, pattern_block, pattern_rows, repeat_heads

if TYPE_CHECKING:
    from .adapter import ModelAdapter

# the stored recording's reader and the row arithmetic live in store/qk.py and models/pattern.py; their
# names stay importable from here (long-context methods, runners and tests import them from this module)
__all__ = [
    "CHUNKED_IMPLEMENTATION",
    "CHUNK_BYTES",
    "LayerRule",
    "QKStore",
    "Recorder",
    "Scratch",
    "Selection",
    "active_recorder",
    "chunk_rows",
    "fused_long",
    "pattern_block",
    "pattern_rows",
    "record_long",
    "register_chunked",
]
CHUNKED_IMPLEMENTATION = "streetlamp_chunked"


@dataclass
class Selection:
    """What a long recording keeps: layers, heads and query rows (sorted, in range, checked by the caller)."""

    layers: list[int]
    heads: list[int]
    rows: list[int]


class Recorder:
    """Computes every layer's attention in query chunks; keeps the selected rows and q/k on disk."""

    def __init__(
        self,
        adapter: ModelAdapter,
        folder: Path,
        selection: Selection,
        chunk: int | None = None,
        fused: bool = True,
        keep_qk: bool = True,
    ) -> None:
        self.adapter = adapter
        self.keep_qk = keep_qk  # False: only the kept rows' shards are written (no stored queries and keys)
        self.fused = fused
        self.scratch = Scratch()
        self.folder = Path(folder)
        self.sel = selection
        self.chunk = chunk
        self._layer_of = {id(m): i for i, m in enumerate(adapter.attn_modules)}
        self.rules: dict[int, LayerRule] = {}
        self.shards: list[dict[str, Any]] = []
        self.n_tokens: int | None = None
        self.step: int | None = None
        # attention x gradient of one row (grad_row, default the last) at one layer (grad_layer)
        self.grad_layer: int | None = None
        self.grad_row: int | None = None
        self.z_leaf: torch.Tensor | None = None
        self.grad_pattern: torch.Tensor | None = None
        self.grad_values: torch.Tensor | None = None
        make_dirs(self.folder)

    def attend(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float,
        softcap: float | None,
        sliding_window: int | None,
        groups: int,
    ) -> torch.Tensor:
        """The attention output ``[1, pos, head, d_head]`` (keys/values not yet repeated)."""
        layer = self._layer_of.get(id(module))
        if layer is None:
            raise StreetlampError("chunked attention: a module that is not one of the model's attention layers")
        if query.shape[0] != 1:
            raise StreetlampError("long-context recording runs one text at a time (batch 1)")
        n = query.shape[2]
        if key.shape[2] != n:
            raise StreetlampError("long-context recording needs queries and keys of the same length (no cache)")
        self.n_tokens = n
        rule = LayerRule(
            float(scaling),
            None if softcap is None else float(softcap),
            bool(getattr(module, "is_causal", False)),
            int(sliding_window) if sliding_window else None,
            groups,
        )
        self.rules[layer] = rule
        q, k = query[0].detach(), key[0].detach()
        if self.keep_qk:
            write_qk(self.folder, layer, q, k)
        kr = repeat_heads(key[0], groups)
        v = repeat_heads(value[0], groups)
        step = self.chunk or chunk_rows(query.shape[1], n, max(4, query.element_size()))
        self.step = step
        if attention_mask is not None:
            for r0 in range(0, n, step):
                self._check_mask(attention_mask, r0, min(n, r0 + step), n, rule, layer)
        keep = layer in self.sel.layers
        rows = torch.tensor(self.sel.rows if keep else [], dtype=torch.long)
        fused = self.fused and rule.softcap is None  # SDPA has no soft-cap: Gemma 2's layers run chunked
        if fused:
            out = self._fused(module, query, kr, v, attention_mask, rule)
        else:
            out = torch.empty(query.shape[1], n, value.shape[-1], dtype=value.dtype, device=value.device)
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            here = rows[(rows >= r0) & (rows < r1)]
            if fused and not len(here):
                continue  # the layer's output came from SDPA; only chunks holding a kept row are computed
            block, k0 = pattern_block(query[0], kr, r0, r1, rule, self.scratch)
            if not fused:
                out[:, r0:r1] = torch.matmul(block, v[:, k0 : k0 + block.shape[-1]])
            if len(here):
                self._write_shard(layer, block, k0, n, here - r0, here)
        if layer == self.grad_layer:
            return self._grad_leaf(out, v, query[0], kr, rule)
        return out.transpose(0, 1)[None]

    def _fused(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        rule: LayerRule,
    ) -> torch.Tensor:
        """The layer's output ``[head, pos, d_head]`` from the fused kernel (no ``[head, query, key]``
        tensor): the recorder's own rule gives the mask (causal, window), so none is built for plain text."""
        out = sdpa(module, query, k[None], v[None], mask, rule.scaling, 0.0, rule.window)  # [1, pos, head, d]
        return out[0].transpose(0, 1)

    def _grad_leaf(
        self, out: torch.Tensor, v: torch.Tensor, q: torch.Tensor, k: torch.Tensor, rule: LayerRule
    ) -> torch.Tensor:
        """At ``grad_layer``: keep the explained row ``A[:, pos]`` and the values, and return the layer's
        output as a leaf that requires grad; gradient tracking is switched on from here to the end of
        the pass (nothing before this layer is in the graph). ``∂F/∂A[h, pos, j] = ∂F/∂z[pos, h] · v[h, j]``."""
        pos = int(self.grad_row if self.grad_row is not None else out.shape[1] - 1)
        self.grad_pattern = pattern_rows(q, k, pos, pos + 1, rule)[:, 0].detach()  # [head, key]
        self.grad_values = v.detach()
        z = out.transpose(0, 1)[None].detach().requires_grad_(True)
        self.z_leaf = z
        torch.set_grad_enabled(True)  # restored by the caller's no_grad block when the pass ends
        return z

    def attention_x_gradient(self, f: torch.Tensor) -> torch.Tensor:
        """``A ⊙ ∂F/∂A`` ``[head, key]`` of the explained row at ``grad_layer`` for the scalar ``f``."""
        if self.z_leaf is None or self.grad_pattern is None or self.grad_values is None:
            raise RuntimeError("attention_x_gradient needs a pass recorded with grad_layer set")
        (g,) = torch.autograd.grad(f, [self.z_leaf])
        pos = int(self.grad_row if self.grad_row is not None else g.shape[1] - 1)
        dfda = torch.einsum("hd,hjd->hj", g[0, pos], self.grad_values)
        return self.grad_pattern * dfda

    def _check_mask(self, mask: torch.Tensor, r0: int, r1: int, n: int, rule: LayerRule, layer: int) -> None:
        m = mask[0, 0, r0:r1, :n] if mask.dim() == 4 else mask[r0:r1, :n]
        ok = m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min / 2
        if not torch.equal(ok, allowed(r0, r1, 0, n, rule.causal, rule.window, ok.device)):
            raise StreetlampError(
                f"layer {layer}: the attention mask is not the causal/sliding-window rule streetlamp stores "
                "(padding?); long-context recording takes one unpadded text"
            )

    def _write_shard(
        self, layer: int, block: torch.Tensor, k0: int, n: int, local: torch.Tensor, rows: torch.Tensor
    ) -> None:
        heads = torch.tensor(self.sel.heads, dtype=torch.long)
        part = torch.zeros(len(heads), len(local), n, dtype=block.dtype)
        part[:, :, k0 : k0 + block.shape[-1]] = block.detach()[heads][:, local].cpu()
        name = write_shard(self.folder, layer, part, int(rows[0]), int(rows[-1]))
        self.shards.append({"file": name, "layer": layer, "rows": rows.tolist(), "heads": list(self.sel.heads)})

    def describe(self) -> dict[str, Any]:
        """The manifest's ``long_context`` section: what was kept, where, and how to recompute rows."""
        return {
            "n_tokens": self.n_tokens,
            "n_heads": self.adapter.n_heads,
            "chunk": self.step,
            "kept": {"layers": self.sel.layers, "heads": self.sel.heads, "rows": self.sel.rows},
            "shards": self.shards,
            "shard_axes": ["head", "query", "key"],
            "qk": {
                "files": {str(l): qk_file(l) for l in sorted(self.rules)},
                "axes": {"query": ["head", "pos", "d_head"], "key": ["kv_head", "pos", "d_head"]},
                "rules": {str(l): asdict(r) for l, r in sorted(self.rules.items())},
                "meaning": "queries and keys as the attention function sees them (after RoPE, q/k norms, biases); "
                "keys before repeat_kv (query head h uses key head h // groups). Probabilities of query i: "
                "softmax(cap(q_i k^T * scaling) masked by the rule) where cap(s) = softcap * tanh(s / softcap); "
                "causal: keys j <= i; window w: causal j > i - w, bidirectional |i - j| < w",
            },
        }


def register_chunked() -> str:
    """Register the chunked implementation (the same attention function; masks from ``sdpa_mask``,
    which are None or boolean instead of a float ``[query, key]`` tensor)."""
    AttentionInterface.register(CHUNKED_IMPLEMENTATION, streetlamp_attention)
    AttentionMaskInterface.register(CHUNKED_IMPLEMENTATION, sdpa_mask)
    return CHUNKED_IMPLEMENTATION


def _configs(model: torch.nn.Module) -> list[Any]:
    cfg = model.config  # type: ignore[union-attr]
    subs = [getattr(cfg, n, None) for n in ("text_config", "decoder", "encoder")]
    return [c for c in [cfg, *subs] if c is not None and hasattr(c, "_attn_implementation")]


@contextmanager
def _chunked_masks(adapter: ModelAdapter) -> Iterator[None]:
    """Inside this block the model builds ``sdpa_mask`` masks (None or boolean, never a float [S, S])."""
    register_chunked()
    configs = _configs(adapter.hf_model)
    before = [c._attn_implementation for c in configs]
    try:
        for c in configs:
            c._attn_implementation = CHUNKED_IMPLEMENTATION
        yield
    finally:
        for c, b in zip(configs, before):
            c._attn_implementation = b


@contextmanager
def record_long(adapter: ModelAdapter, recorder: Recorder) -> Iterator[Recorder]:
    """Run the model's forward passes inside this block through ``recorder`` (chunked attention)."""
    with recording(recorder), _chunked_masks(adapter):
        yield recorder


@contextmanager
def fused_long(adapter: ModelAdapter) -> Iterator[None]:
    """Forward passes that need no attention weights, on long inputs: the fused kernel
    (:func:`~streetlamp.models.attention.fused_attention`) with the masks built for it (None for
    one causal text, so no ``[S, S]`` tensor exists at all)."""
    with _chunked_masks(adapter), fused_attention():
        yield
