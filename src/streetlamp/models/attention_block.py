"""Per-family facts of the attention block that the context-mixing methods (norm, ALTI, value
zeroing) need beyond the sites.

The named sites already give the value vectors (``layers.{l}.attn.v``, per query head, *with*
the value bias b_V and, for pre-LN families, *after* the pre-attention LayerNorm/RMSNorm) and
the attention block's output (``layers.{l}.attn.out``, with b_O). What they do not give is:

* where the LayerNorm around the attention block sits: **post-LN** (BERT, RoBERTa, DistilBERT:
  ``LN(x + Attn(x))``), **pre-LN** (GPT-2: LayerNorm; Llama family: RMSNorm:
  ``x + Attn(LN(x))``) or **sandwich** (Gemma 2 and 3: ``x + N(Attn(RMSNorm(x)))``, a second RMSNorm
  on the attention output before the residual add), and for post-LN / sandwich the norm's
  parameters;
* W_O per head (``sites.output_matrix``) and b_O.

This module is that table plus three small accessors; nothing else touches module paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from ..errors import StreetlampError
from .adapter import at_least_float32
from .sites import output_matrix

if TYPE_CHECKING:
    from .adapter import ModelAdapter


@dataclass(frozen=True)
class NormPlacement:
    """``placement``: where the norm around the attention block sits; ``attn_norm``: its path
    relative to a layer module (applied to ``x + Attn`` when post-LN, to ``x`` when pre-LN);
    ``kind``: ``layernorm`` (mean-centred, gamma, beta) or ``rmsnorm`` (gamma only)."""

    placement: Literal["post", "pre", "sandwich"]
    attn_norm: str
    kind: Literal["layernorm", "rmsnorm", "rmsnorm_1p"]  # rmsnorm_1p: Gemma's gain (1 + w)


DECOMPOSE: dict[str, NormPlacement] = {
    "bert": NormPlacement("post", "attention.output.LayerNorm", "layernorm"),
    "roberta": NormPlacement("post", "attention.output.LayerNorm", "layernorm"),
    "distilbert": NormPlacement("post", "sa_layer_norm", "layernorm"),
    "gpt2": NormPlacement("pre", "ln_1", "layernorm"),
    "llama": NormPlacement("pre", "input_layernorm", "rmsnorm"),
    "mistral": NormPlacement("pre", "input_layernorm", "rmsnorm"),
    "qwen2": NormPlacement("pre", "input_layernorm", "rmsnorm"),
    "qwen3": NormPlacement("pre", "input_layernorm", "rmsnorm"),  # q/k norms do not touch the values
    "phi3": NormPlacement("pre", "input_layernorm", "rmsnorm"),
    "modernbert": NormPlacement("pre", "attn_norm", "layernorm"),  # layer 0's attn_norm is the identity
    "gemma2": NormPlacement("sandwich", "post_attention_layernorm", "rmsnorm_1p"),
    "gemma3_text": NormPlacement("sandwich", "post_attention_layernorm", "rmsnorm_1p"),
    "vit": NormPlacement("pre", "layernorm_before", "layernorm"),
    "deberta-v2": NormPlacement("post", "attention.output.LayerNorm", "layernorm"),
}


def placement(adapter: ModelAdapter) -> NormPlacement:
    """The family's norm placement, or a StreetlampError naming the supported families."""
    p = DECOMPOSE.get(adapter.family.name)
    if p is None:
        raise StreetlampError(
            f"no decomposition table for family {adapter.family.name!r}; supported: {', '.join(sorted(DECOMPOSE))}"
        )
    return p


def _module(root: torch.nn.Module, path: str) -> torch.nn.Module:
    m = root
    for part in path.split("."):
        m = m[int(part)] if part.isdigit() else getattr(m, part)  # type: ignore[index]
    return m


def output_weights(adapter: ModelAdapter, layer: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``W_O`` ``[head, d_head, d_model]`` and ``b_O`` ``[d_model]`` (None without a bias), float32."""
    o = adapter.o_proj_modules[layer]
    w = at_least_float32(output_matrix(o, adapter.n_heads).detach())
    b = getattr(o, "bias", None)
    return w, (at_least_float32(b.detach()) if b is not None else None)


def post_norm(adapter: ModelAdapter, layer: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """gamma, beta ``[d_model]`` (float32) and eps of the post-attention LayerNorm (post-LN only)."""
    p = placement(adapter)
    if p.placement != "post" or p.kind != "layernorm":
        raise StreetlampError(f"family {adapter.family.name!r} has no post-attention LayerNorm")
    ln: Any = _module(adapter.layer_modules[layer], p.attn_norm)
    eps = float(getattr(ln, "eps", None) or ln.variance_epsilon)
    return at_least_float32(ln.weight.detach()), at_least_float32(ln.bias.detach()), eps


def sandwich_norm(adapter: ModelAdapter, layer: int) -> tuple[torch.Tensor, float]:
    """Gain ``[d_model]`` (float32; ``1 + w`` for Gemma) and eps of the RMSNorm applied to the
    attention output before the residual add (sandwich placement only)."""
    p = placement(adapter)
    if p.placement != "sandwich":
        raise StreetlampError(f"family {adapter.family.name!r} has no norm on the attention output")
    n: Any = _module(adapter.layer_modules[layer], p.attn_norm)  # an RMSNorm module
    w = at_least_float32(n.weight.detach())
    return (1.0 + w if p.kind == "rmsnorm_1p" else w), float(n.eps)
