"""Per-family facts of the attention block that the context-mixing methods (norm, ALTI, value
zeroing) need beyond the sites.

The named sites already give the value vectors (``layers.{l}.attn.v``, per query head, *with*
the value bias b_V and, for pre-LN families, *after* the pre-attention LayerNorm/RMSNorm) and
the attention block's output (``layers.{l}.attn.out``, with b_O). What they do not give is:

* where the LayerNorm around the attention block sits (:class:`NormPlacement`): **post-LN** (BERT, RoBERTa, DistilBERT:
  ``LN(x + Attn(x))``), **pre-LN** (GPT-2: LayerNorm; Llama family: RMSNorm:
  ``x + Attn(LN(x))``) or **sandwich** (Gemma 2 and 3: ``x + N(Attn(RMSNorm(x)))``, a second RMSNorm
  on the attention output before the residual add), and for post-LN / sandwich the norm's
  parameters;
* W_O per head (``sites.output_matrix``) and b_O.

The placement is each family's ``norm`` (:mod:`streetlamp.models.families`); this module holds the three
small accessors; nothing else touches these module paths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..errors import StreetlampError
from .adapter import at_least_float32
from .families import FamilyTable, NormPlacement
from .sites import output_matrix

if TYPE_CHECKING:
    from .adapter import ModelAdapter


# family -> its norm placement (the ``norm`` of each family object), for callers of the old table
DECOMPOSE: FamilyTable[NormPlacement] = FamilyTable(lambda f: f.norm)


def placement(adapter: ModelAdapter) -> NormPlacement:
    """The family's norm placement, or a StreetlampError naming the supported families."""
    p = DECOMPOSE.get(adapter.family.name)  # the registered family's ``norm``
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
