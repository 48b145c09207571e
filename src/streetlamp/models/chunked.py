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
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..errors import StreetlampError
from ..store.files import folder_file

if TYPE_CHECKING:
    from .adapter import ModelAdapter

CHUNKED_IMPLEMENTATION = "streetlamp_chunked"
# one chunk of scores and probabilities, [head, chunk, key], stays near this many bytes
CHUNK_BYTES = 64 << 20
_RECORDER: ContextVar[Recorder | None] = ContextVar("streetlamp_long_recorder", default=None)


def active_recorder() -> Recorder | None:
    return _RECORDER.get()


@dataclass(frozen=True)
class LayerRule:
    """How one layer turns its queries and keys into probabilities."""

    scaling: float
    softcap: float | None
    causal: bool
    window: int | None  # causal: keys i-window+1..i; bidirectional: |i - j| < window
    groups: int  # query heads per key head (repeat_kv)


def allowed_rows(
    r0: int, r1: int, n_keys: int, causal: bool, window: int | None, device: torch.device, k0: int = 0
) -> torch.Tensor:
    """``[r1 - r0, n_keys - k0]`` bool: which keys k0.. queries r0..r1-1 may see under the rule (one text, no padding)."""
    i = torch.arange(r0, r1, device=device)[:, None]
    j = torch.arange(k0, n_keys, device=device)[None, :]
    ok = j <= i if causal else torch.ones(r1 - r0, n_keys - k0, dtype=torch.bool, device=device)
    if window:
        ok = ok & (j > i - int(window)) if causal else ok & ((i - j).abs() < int(window))
    return ok


def key_range(r0: int, r1: int, n: int, rule: LayerRule) -> tuple[int, int]:
    """Keys k0..k1-1 that queries r0..r1-1 may see at all (causal: none after r1 - 1; a window: none
    before r0 - window + 1); the probabilities outside are exactly 0 and are not computed."""
    w = rule.window or n
    k0 = max(0, r0 - w + 1)
    return k0, (r1 if rule.causal else min(n, r1 + w - 1))


def mask_bands(r0: int, r1: int, k0: int, k1: int, rule: LayerRule) -> list[tuple[int, int]]:
    """Key ranges ``[a, b)`` inside ``[k0, k1)`` where some query r0..r1-1 may have a masked key; every
    key outside them is allowed for every query of the chunk (so only these columns are masked). Causal:
    keys after the first query (``j > r0``); a window ``w``: keys before ``r1 - w`` (``j <= i - w``) and,
    bidirectional, from ``r0 + w`` on (``j >= i + w``)."""
    bands = []
    if rule.window:
        bands.append((k0, min(k1, r1 - int(rule.window))))
    if rule.causal:
        bands.append((max(k0, r0 + 1), k1))
    elif rule.window:
        bands.append((max(k0, r0 + int(rule.window)), k1))
    return [(a, b) for a, b in bands if a < b]


def repeat_heads(k: torch.Tensor, groups: int) -> torch.Tensor:
    """``[kv_head, pos, d]`` -> ``[kv_head * groups, pos, d]`` (the attention function's repeat_kv)."""
    if groups == 1:
        return k
    h, s, d = k.shape
    return k[:, None].expand(h, groups, s, d).reshape(h * groups, s, d)


def qk_matmul(q: torch.Tensor, kt: torch.Tensor, out: torch.Tensor) -> None:
    """``out = q @ kt`` (``[head, rows, d] @ [head, d, keys]``). On the CPU through numpy's BLAS: for this
    shape (inner dimension d_head, tens of thousands of keys) OpenBLAS ran 1.7-1.8x faster than torch's
    MKL on the AMD development machine (docs/measurements/longctx.md); elsewhere (other devices, bfloat16 or
    float16, which numpy lacks) torch's matmul."""
    if out.device.type == "cpu" and out.dtype in (torch.float32, torch.float64) and q.dtype == kt.dtype == out.dtype:
        np.matmul(q.detach().numpy(), kt.detach().numpy(), out=out.numpy())
    else:
        torch.matmul(q, kt, out=out)


class Scratch:
    """One reusable buffer for a chunk's scores/probabilities. A fresh ``[head, chunk, key]`` tensor per
    chunk costs more than the arithmetic (tens of MiB are mapped and page-faulted anew each time); the
    chunk is computed in place in this buffer instead. A block it returns is valid until the next call."""

    def __init__(self) -> None:
        self.buf: torch.Tensor | None = None

    def view(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        size = 1
        for x in shape:
            size *= x
        b = self.buf
        if b is None or b.dtype != dtype or b.device != device or b.numel() < size:
            b = self.buf = torch.empty(size, dtype=dtype, device=device)
        return b[:size].view(shape)


def pattern_block(
    q: torch.Tensor, k: torch.Tensor, r0: int, r1: int, rule: LayerRule, scratch: Scratch | None = None
) -> tuple[torch.Tensor, int]:
    """Probabilities ``[head, r1 - r0, k1 - k0]`` of query rows r0..r1-1 over the keys they can see
    (:func:`key_range`), and k0; queries ``q`` and repeated keys ``k`` are ``[head, pos, d]``. The
    eager path's arithmetic: ``softmax(cap(q kᵀ · scaling), masked)`` in at least float32. With
    ``scratch`` (float32/float64 models) the block is computed in place in its buffer, bit for bit the
    same numbers, and stays valid until the scratch's next use."""
    k0, k1 = key_range(r0, r1, k.shape[1], rule)
    kt = k[:, k0:k1].transpose(1, 2)
    if scratch is not None and q.dtype in (torch.float32, torch.float64):
        scores = scratch.view((q.shape[0], r1 - r0, k1 - k0), q.dtype, q.device)
        qk_matmul(q[:, r0:r1], kt, scores)
        scores.mul_(rule.scaling)
    else:
        scores = torch.matmul(q[:, r0:r1], kt) * rule.scaling
    if rule.softcap is not None:
        scores.div_(rule.softcap).tanh_().mul_(rule.softcap)
    low = torch.finfo(scores.dtype).min
    for a, b in mask_bands(r0, r1, k0, k1, rule):  # masked cells lie in these columns only
        ok = allowed_rows(r0, r1, b, rule.causal, rule.window, q.device, a)
        scores[:, :, a - k0 : b - k0].masked_fill_(~ok, low)
    dtype = torch.promote_types(scores.dtype, torch.float32)
    if dtype == scores.dtype:
        return torch.softmax(scores, -1, out=scores), k0  # in place: each row's max and sum are read first
    return torch.softmax(scores, -1, dtype=dtype).to(q.dtype), k0


def pattern_rows(
    q: torch.Tensor, k: torch.Tensor, r0: int, r1: int, rule: LayerRule, scratch: Scratch | None = None
) -> torch.Tensor:
    """Probabilities ``[head, r1 - r0, key]`` of query rows r0..r1-1 over every key (zeros where masked)."""
    block, k0 = pattern_block(q, k, r0, r1, rule, scratch)
    out = torch.zeros(q.shape[0], r1 - r0, k.shape[1], dtype=block.dtype, device=block.device)
    out[:, :, k0 : k0 + block.shape[-1]] = block
    return out


def chunk_rows(n_heads: int, n_keys: int, element: int = 4) -> int:
    """Query rows per chunk so that ``[head, rows, key]`` scores stay near :data:`CHUNK_BYTES`."""
    return max(1, min(n_keys, CHUNK_BYTES // max(1, n_heads * n_keys * element)))


@dataclass
class Selection:
    """What a long recording keeps: layers, heads and query rows (sorted, in range, checked by the caller)."""

    layers: list[int]
    heads: list[int]
    rows: list[int]


class Recorder:
    """Computes every layer's attention in query chunks; keeps the selected rows and q/k on disk."""

    def __init__(
        self, adapter: ModelAdapter, folder: Path, selection: Selection, chunk: int | None = None, fused: bool = True
    ) -> None:
        self.adapter = adapter
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
        (self.folder / "qk").mkdir(parents=True, exist_ok=True)
        (self.folder / "attention").mkdir(parents=True, exist_ok=True)

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
        save_file(
            {"query": q.contiguous().cpu(), "key": k.contiguous().cpu()},
            str(self.folder / "qk" / f"L{layer}.safetensors"),
        )
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
        from .attention import _sdpa

        out = _sdpa(module, query, k[None], v[None], mask, rule.scaling, 0.0, rule.window)  # [1, pos, head, d]
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
        if not torch.equal(ok, allowed_rows(r0, r1, n, rule.causal, rule.window, ok.device)):
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
        name = f"attention/L{layer}_{int(rows[0])}-{int(rows[-1])}.safetensors"
        save_file({"pattern": part}, str(self.folder / name))
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
                "files": {str(l): f"qk/L{l}.safetensors" for l in sorted(self.rules)},
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
    from .attention import streetlamp_attention

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
    token = _RECORDER.set(recorder)
    try:
        with _chunked_masks(adapter):
            yield recorder
    finally:
        _RECORDER.reset(token)


@contextmanager
def fused_long(adapter: ModelAdapter) -> Iterator[None]:
    """Forward passes that need no attention weights, on long inputs: the fused kernel
    (:func:`~streetlamp.models.attention.fused_attention`) with the masks built for it (None for
    one causal text, so no ``[S, S]`` tensor exists at all)."""
    from .attention import fused_attention

    with _chunked_masks(adapter), fused_attention():
        yield


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
                raise StreetlampError(f"{folder} holds no long-context recording (run explain with --rows)")
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
