"""AttnLRP's modified backward pass (Achtibat et al., ICML 2024), installed on a model for one context.

AttnLRP can be computed as gradient × input under a modified backward pass (the "efficient"
formulation of the authors' package ``lxt``). Forward values stay bit-identical; only gradients
change:

* **LayerNorm / RMSNorm** (identity rule on the normalised direction): the standard deviation
  (``sqrt(var + eps)``, RMSNorm's ``rsqrt(mean(x²) + eps)``) is treated as a constant, so the
  norm is linear in its input and conserves relevance exactly, eps included;
* **element-wise activations** (GELU, SiLU, tanh, ...; identity rule): the gradient is
  ``act(x) / (x + 1e-10)`` (lxt's epsilon), so ``x · grad = act(x)``;
* **gated MLP products** ``act(gate) * up`` (Llama family, Qwen3, Phi-3's fused ``gate_up_proj``, Gemma's
  GeGLU, ModernBERT's chunked ``Wi``; uniform rule): the gradient into the product is halved, so each
  factor receives half of its relevance (a fused projection is one linear map: the halving at the
  product's output is the same rule);
* **Gemma's RMSNorm** has the gain ``(1 + w)``; Qwen3's and Gemma 3's per-head ``q_norm``/``k_norm``
  are RMSNorms like any other (identity rule, rms held constant) before RoPE;
* **attention-logit soft-capping** ``cap · tanh(s / cap)`` (Gemma 2): an element-wise, monotone
  activation of each score on its own, so it gets the identity rule of the other element-wise
  activations (``s · grad = cap · tanh(s / cap)``): the softmax rule's relevance at the capped
  scores passes unchanged to the raw scores, and from there to Q and K by the uniform rule. The
  gradient stays linear in the downstream gradient, so the quartering at the pattern still equals
  lxt's dividing Q and K by 4;
* **final-logit soft-capping** (Gemma 2 and 3): the same identity rule, so what is explained is the
  model's own (capped) logit ``F = cap · tanh(l / cap)``; the relevance entering the LM head is
  ``F`` (not ``l``), and every relevance is ``F / l`` times the relevance of the uncapped logit ``l``;
* **attention** (uniform rule on both products, softmax rule by Taylor at the input): the
  gradient at the value vectors is halved and at the post-softmax pattern quartered (half for
  ``P·V``, half for ``Q·Kᵀ``; everything between the pattern and Q, K is linear in the gradient,
  so this equals lxt's dividing Q and K by 4). These two go through the named sites
  ``layers.{l}.attn.v`` and ``layers.{l}.attn.pattern`` (:func:`attention_edits`).

The softmax rule does not conserve relevance: row ``i`` of a head absorbs
``Σ_j P_ij g_ij (1 - log P_ij + Σ_k P_ik log P_ik)`` (``g`` the rule's gradient at ``P``, i.e.
half the downstream gradient), the bias term of the paper's Taylor expansion. Biases (and
position embeddings) absorb ``b · ∂F/∂b`` as in any LRP.

Activations applied as plain functions (RoBERTa's classification head ``tanh``, its LM head's
``gelu``) are reached through the modules around them (the family's ``functional_activations``); ReLU's
identity rule equals its gradient, so DistilBERT's inline ``nn.ReLU()`` needs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from . import sites
from .context import relevance_rules_on, rules_on
from .families import FamilyTable

if TYPE_CHECKING:
    from .adapter import ModelAdapter

IDENTITY_EPS = 1e-10  # lxt's epsilon in the identity rule's ratio act(x) / (x + eps)
# the registered families with a gated MLP (each family's ``gated_mlp``), read by relevance_rules
GATED_FAMILIES: FamilyTable[bool] = FamilyTable(lambda f: True if f.gated_mlp else None)
_ELEMENTWISE = (nn.GELU, nn.ReLU, nn.Tanh, nn.SiLU, nn.Sigmoid, nn.LeakyReLU, nn.ELU, nn.Mish, nn.Softplus)


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient multiplied by ``factor`` (lxt's ``divide_gradient``)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor  # type: ignore[attr-defined]
        return x.view_as(x)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g * ctx.factor, None  # type: ignore[attr-defined]


def scale_grad(x: torch.Tensor, factor: float) -> torch.Tensor:
    return _ScaleGrad.apply(x, factor)


def _swap_grad(value: torch.Tensor, surrogate: torch.Tensor) -> torch.Tensor:
    """``value`` exactly, with the gradient of ``surrogate`` (equal to it up to rounding)."""
    return value.detach() + (surrogate - surrogate.detach())


def _identity_rule(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    ratio = (y / (x + IDENTITY_EPS)).detach()
    return _swap_grad(y, x * ratio)


def _is_activation(m: nn.Module) -> bool:
    return type(m).__module__ == "transformers.activations" or isinstance(m, _ELEMENTWISE)


def _norm_kind(m: nn.Module) -> str | None:
    if isinstance(m, nn.LayerNorm):
        return "layernorm"
    if type(m).__name__.endswith("RMSNorm"):
        return "rmsnorm"
    return None


def _norm_hook(kind: str, gain_offset: float) -> Callable:
    def hook(m: Any, args: tuple, out: torch.Tensor) -> torch.Tensor:
        x = args[0]
        if kind == "layernorm":
            c = x - x.mean(-1, keepdim=True)
            std = (c.pow(2).mean(-1, keepdim=True) + m.eps).sqrt().detach()
            s = c / std
            if m.weight is not None:
                s = s * m.weight
            if m.bias is not None:
                s = s + m.bias
        else:
            eps = float(getattr(m, "variance_epsilon", None) or m.eps)
            s = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps).detach() * (gain_offset + m.weight)
        return _swap_grad(out, s.to(out.dtype))

    return hook


def soft_cap(scores: torch.Tensor, cap: float) -> torch.Tensor:
    """``cap · tanh(scores / cap)``; under AttnLRP's rules with the identity rule's gradient."""
    capped = torch.tanh(scores / cap) * cap
    return _identity_rule(scores, capped) if relevance_rules_on() else capped


def _final_cap(model: nn.Module, cap: float) -> list[torch.utils.hooks.RemovableHandle]:
    """Identity rule on the LM head's soft-cap ``cap · tanh(l / cap)`` (applied as plain functions
    between the output embedding and the model's output)."""
    seen: dict[str, torch.Tensor] = {}

    def keep(m: nn.Module, args: tuple, out: torch.Tensor) -> None:
        seen["l"] = out

    def swap(m: nn.Module, args: tuple, out: Any) -> Any:
        pre = seen.pop("l", None)
        if pre is not None and getattr(out, "logits", None) is not None and out.logits.shape == pre.shape:
            out.logits = _identity_rule(pre, out.logits)
        return out

    head = model.get_output_embeddings()  # type: ignore[operator]
    return [head.register_forward_hook(keep), model.register_forward_hook(swap)]


def _act_hook(m: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
    return _identity_rule(args[0], out)


def _halve_input_hook(m: nn.Module, args: tuple) -> tuple:
    return (scale_grad(args[0], 0.5),) + tuple(args[1:])


def _get(root: nn.Module, path: str) -> nn.Module | None:
    m: nn.Module | None = root
    for part in path.split("."):
        m = getattr(m, part, None)
        if m is None:
            return None
    return m


def _functional_pair(before: nn.Module, after: nn.Module) -> list[torch.utils.hooks.RemovableHandle]:
    """Identity rule for ``after(act(before(x)))`` where ``act`` is a plain function."""
    seen: dict[str, torch.Tensor] = {}

    def keep(m: nn.Module, args: tuple, out: torch.Tensor) -> None:
        seen["x"] = out

    def swap(m: nn.Module, args: tuple) -> tuple:
        x = seen.pop("x", None)
        if x is None or x.shape != args[0].shape:
            return args
        return (_identity_rule(x, args[0]),) + tuple(args[1:])

    return [before.register_forward_hook(keep), after.register_forward_pre_hook(swap)]


@contextmanager
def relevance_rules(adapter: ModelAdapter) -> Iterator[None]:
    """Install AttnLRP's module rules (norms, activations, gated products) for the ``with`` block.

    The attention rules go through the named sites: pass :func:`attention_edits` as ``edit``."""
    model = adapter.hf_model
    handles: list[torch.utils.hooks.RemovableHandle] = []
    offset = sites.norm_gain_offset(adapter.family.name)
    with rules_on(), _removing(handles):
        seen: set[int] = set()
        for m in model.modules():
            if id(m) in seen:
                continue
            seen.add(id(m))
            kind = _norm_kind(m)
            if kind is not None:
                handles.append(m.register_forward_hook(_norm_hook(kind, offset if kind == "rmsnorm" else 0.0)))
            elif _is_activation(m):
                handles.append(m.register_forward_hook(_act_hook))
        if adapter.family.name in GATED_FAMILIES:
            for down in adapter.mlp_out_modules:
                handles.append(down.register_forward_pre_hook(_halve_input_hook))
        for before, after in adapter.family.functional_activations:
            mb, ma = _get(model, before), _get(model, after)
            if mb is not None and ma is not None:
                handles.extend(_functional_pair(mb, ma))
        cap = getattr(model.config, "final_logit_softcapping", None)
        if cap and adapter.kind.causal:
            handles.extend(_final_cap(model, float(cap)))
        yield


@contextmanager
def _removing(handles: list[torch.utils.hooks.RemovableHandle]) -> Iterator[None]:
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def attention_edits(n_layers: int) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Site edits for AttnLRP's attention rules: gradient × 1/2 at the values, × 1/4 at the pattern."""
    edits: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
    for l in range(n_layers):
        edits[f"layers.{l}.attn.v"] = lambda v: scale_grad(v, 0.5)
        edits[f"layers.{l}.attn.pattern"] = lambda p: scale_grad(p, 0.25)
    return edits


def softmax_absorbed(pattern: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """Relevance the softmax rule absorbs, per ``[batch, head, query]`` row, from the post-softmax
    pattern ``P`` and the downstream gradient at it (undivided; the rule passes half of it)."""
    p = pattern.to(torch.float64)
    g = grad.to(torch.float64) / 2
    plogp = torch.xlogy(p, p)
    ent = plogp.sum(-1, keepdim=True)  # Σ_k P log P
    return (p * g - g * plogp + p * g * ent).sum(-1)
