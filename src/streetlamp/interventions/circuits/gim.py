"""GIM, gradient interaction modifications (Edin et al. 2025, arXiv 2505.17630; corticph/gim), in the
circuit engine: the forward is the model's own, only the backward pass changes, so EAP and EAP-IG take
their gradients ``∂m/∂x_r`` under GIM (methods ``eap-gim``, ``eap-ig-gim``). The rules, with corticph/gim's
defaults:

* **Norm freezing**: every LayerNorm / RMSNorm (each layer's two, the final one, Qwen3's per-head q/k
  norms) computes its statistic (LayerNorm's standard deviation, RMSNorm's root mean square) as a
  constant in the backward pass (LayerNorm's mean is not frozen, as in corticph/gim).
* **Softmax backward temperature** ``T`` (2): the attention softmax's forward is unchanged; its backward
  is ``s_T ⊙ (g − ⟨g, s_T⟩)`` with ``s_T = softmax(x / T)`` (no ``1/T`` factor: corticph/gim's rule).
* **Q/K/V gradient scales** (0.25, 0.25, 0.5): the gradients reaching the queries, keys and values (after
  their projections and RoPE) are multiplied by these.
* **Gated MLP** (0.5, 0.5): the gradients through a gated MLP's ``gate_proj`` and ``up_proj`` outputs are
  halved (both factors of the product); plain MLPs (GPT-2) unchanged; a fused ``gate_up_proj`` (Phi-3) is
  refused.

Everything is applied to one :class:`.blocks.Blocks` inside :func:`gim` and removed on exit. A GIM score
is still a first-order estimate of ``m(edge ablated) - m(model)`` and is audited against exact
patching like EAP (:func:`.scores.audit`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from ...errors import StreetlampError
from .blocks import Blocks

_SOFTMAX = torch.softmax  # the real one: :func:`gim` swaps ``torch.softmax`` while an attention pattern is made
TEMPERATURE, Q_SCALE, K_SCALE, V_SCALE, GATE_SCALE, UP_SCALE = 2.0, 0.25, 0.25, 0.5, 0.5, 0.5


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g * ctx.scale, None


def scale_grad(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x`` in the forward; its gradient times ``scale`` in the backward."""
    return x if scale == 1.0 else _ScaleGrad.apply(x, float(scale))


class _SoftmaxT(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, T: float) -> torch.Tensor:
        ctx.dim, ctx.T = dim, T
        ctx.save_for_backward(x)
        return _SOFTMAX(x, dim)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (x,) = ctx.saved_tensors
        s = _SOFTMAX(x / ctx.T, ctx.dim)
        return s * (g - (g * s).sum(ctx.dim, keepdim=True)), None, None


def softmax_t(x: torch.Tensor, dim: int, T: float) -> torch.Tensor:
    """``softmax(x)`` whose backward is the softmax Jacobian at ``x / T`` (see the module docstring)."""
    return _SoftmaxT.apply(x, dim, float(T))


def _frozen_norm(mod: nn.Module) -> Any:
    """A forward for ``mod`` (LayerNorm or an RMSNorm) with its statistic detached: the same values."""
    if isinstance(mod, nn.LayerNorm):

        def layer_norm(x: torch.Tensor) -> torch.Tensor:
            dims = tuple(range(-len(mod.normalized_shape), 0))
            mean = x.mean(dims, keepdim=True)
            std = ((x - mean).pow(2).mean(dims, keepdim=True) + mod.eps).sqrt().detach()
            y = (x - mean) / std
            if mod.weight is not None:
                y = y * mod.weight
            return y + mod.bias if mod.bias is not None else y

        return layer_norm
    eps = getattr(mod, "variance_epsilon", getattr(mod, "eps", None))
    weight = getattr(mod, "weight", None)
    if eps is None:
        raise TypeError(f"GIM: no rule for the norm {type(mod).__name__}")
    offset = 1.0 if type(mod).__name__.startswith("Gemma") else 0.0  # Gemma's RMSNorm scales by 1 + w

    def rms_norm(x: torch.Tensor) -> torch.Tensor:
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        rms = (xf.pow(2).mean(-1, keepdim=True) + float(eps)).sqrt().detach()
        y = (xf / rms).to(x.dtype)
        return y * (offset + weight) if weight is not None else y

    return rms_norm


def _norm_modules(blocks: Blocks) -> list[nn.Module]:
    out: list[nn.Module] = []
    for l in range(blocks.graph.n_layers):
        out += list(blocks._norms(l))
        attn: Any = blocks.adapter.attn_modules[l]
        out += [m for m in (getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)) if m is not None]
    base = blocks.base
    for name in ("ln_f", "norm", "final_norm"):
        m = getattr(base, name, None)
        if isinstance(m, nn.Module):
            out.append(m)
    return list({id(m): m for m in out}.values())


@contextlib.contextmanager
def gim(
    blocks: Blocks,
    temperature: float = TEMPERATURE,
    q_scale: float = Q_SCALE,
    k_scale: float = K_SCALE,
    v_scale: float = V_SCALE,
    gate_scale: float = GATE_SCALE,
    up_scale: float = UP_SCALE,
    freeze_norm: bool = True,
) -> Iterator[Blocks]:
    """GIM's backward on ``blocks`` inside the block (see the module docstring); the forward's values are
    the model's own. Each rule is off at its neutral value (``temperature=1``, a scale of 1,
    ``freeze_norm=False``)."""
    undo: list[Any] = []
    try:
        if freeze_norm:
            for m in _norm_modules(blocks):
                m.forward = _frozen_norm(m)  # type: ignore[method-assign]
                undo.append(lambda m=m: m.__dict__.pop("forward", None))
        orig_qk, orig_v, orig_pattern = blocks.queries_keys, blocks._value, blocks.pattern

        def queries_keys(l: int, xq: torch.Tensor, xk: torch.Tensor, cs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            q, k = orig_qk(l, xq, xk, cs)
            return scale_grad(q, q_scale), scale_grad(k, k_scale)

        def value(l: int, xv: torch.Tensor) -> torch.Tensor:
            return scale_grad(orig_v(l, xv), v_scale)

        def pattern(l: int, q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
            if temperature == 1.0:
                return orig_pattern(l, q, k, allowed)

            def patched(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
                return softmax_t(x.to(dtype) if dtype is not None else x, dim, temperature)

            torch.softmax = patched  # type: ignore[assignment]
            try:
                return orig_pattern(l, q, k, allowed)
            finally:
                torch.softmax = _SOFTMAX

        blocks.queries_keys, blocks._value, blocks.pattern = queries_keys, value, pattern  # type: ignore[method-assign]
        undo.append(lambda: [blocks.__dict__.pop(n, None) for n in ("queries_keys", "_value", "pattern")])
        for layer in blocks.layers:
            mlp = getattr(layer, "mlp", None)
            if getattr(mlp, "gate_up_proj", None) is not None:  # Phi-3: gate and up in one projection
                raise StreetlampError("GIM: a fused gate_up_proj MLP (Phi-3) has no gate/up rule here yet")
            for name, s in (("gate_proj", gate_scale), ("up_proj", up_scale)):
                lin = getattr(mlp, name, None)
                if isinstance(lin, nn.Module) and s != 1.0:
                    h = lin.register_forward_hook(lambda mod, inp, out, s=s: scale_grad(out, s))
                    undo.append(h.remove)
        yield blocks
    finally:
        for f in reversed(undo):
            f()
