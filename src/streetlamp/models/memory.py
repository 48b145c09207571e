"""A memory estimate before a run: refuse one that would not fit, with the numbers, unless forced.

The estimate is a sum of three terms, each from the model's own sizes (nothing measured):

* **weights**: every parameter and buffer as loaded (already in memory when the check runs);
* **recorded attention**: ``[layer, head, seq, seq]`` per text in the run's dtype on the model's
  device, plus the float32 copy the results keep (``explain`` records every layer and head);
* **activations**: a forward pass that keeps its graph for a gradient (integrated gradients,
  gradient x input): per layer the residual stream, q/k/v/z and the attention output (``8 d_model``
  per token), the MLP's hidden layer (``3 d_ffn``: gate, up and their product) and the scores and
  probabilities ``2 heads x seq`` per token, times the token budget's rows of that length.

The check compares what the run still needs (attention + activations) with what is free now
(``MemAvailable`` of /proc/meminfo on CPU, ``torch.cuda.mem_get_info`` on a GPU).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from ..errors import StreetlampError

GIB = float(1 << 30)


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    attention: int
    activations: int
    available: int | None
    shape: tuple[int, int, int, int]  # [layer, head, seq, seq]
    dtype: str

    @property
    def needed(self) -> int:
        """Bytes the run still allocates (the weights are already loaded)."""
        return self.attention + self.activations

    def line(self) -> str:
        avail = f"{self.available / GIB:.2f} GiB free" if self.available is not None else "free memory unknown"
        l, h, s, _ = self.shape
        return (
            f"memory estimate: weights {self.weights / GIB:.2f} GiB (loaded) + recorded attention "
            f"[{l}, {h}, {s}, {s}] {self.attention / GIB:.2f} GiB + activations {self.activations / GIB:.2f} GiB "
            f"({self.dtype}); the run needs {self.needed / GIB:.2f} GiB more, {avail}"
        )


def available_bytes(device: torch.device) -> int | None:
    """Free memory on ``device`` now, or None where it cannot be read."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for row in f:
                if row.startswith("MemAvailable:"):
                    return int(row.split()[1]) * 1024
    except OSError:
        pass
    return None


def estimate(adapter, n_tokens: int, record_attention: bool = True, rows: int = 1) -> MemoryEstimate:  # noqa: ANN001
    """The three terms for a run over ``n_tokens`` tokens, ``rows`` sequences at a time."""
    model = adapter.hf_model
    weights = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    p = next(model.parameters())
    b = p.element_size()
    L, H, S, d = adapter.n_layers, adapter.n_heads, int(n_tokens), adapter.d_model
    cfg = model.config
    ffn = int(
        getattr(cfg, "intermediate_size", None)
        or getattr(cfg, "n_inner", None)
        or getattr(cfg, "hidden_dim", None)
        or 4 * d
    )
    cells = L * H * S * S
    attention = cells * (b + 4) if record_attention else 0
    activations = rows * L * S * (8 * d + 3 * ffn + 2 * H * S) * b
    return MemoryEstimate(
        weights, attention, activations, available_bytes(p.device), (L, H, S, S), str(p.dtype).replace("torch.", "")
    )


def check_memory(adapter, n_tokens: int, force: bool, record_attention: bool = True) -> MemoryEstimate:  # noqa: ANN001
    """Refuse (StreetlampError with the estimate) when the run would not fit, unless ``force``."""
    est = estimate(adapter, n_tokens, record_attention)
    if est.available is not None and est.needed > est.available:
        if not force:
            raise StreetlampError(
                f"{est.line()}: would not fit; "
                + (
                    "record only some rows (explain --rows explained, docs/long-context.md), "
                    if record_attention
                    else ""
                )
                + "shorten the text, use --dtype bfloat16/float16 or a GPU, or pass --force to run anyway"
            )
        print(f"streetlamp: warning: {est.line()} (--force: running anyway)", file=sys.stderr)
    return est
