"""Mixture-of-experts sites: the router's logits and weights, each expert's output, the shared expert.

A MoE block (transformers 5) routes the flattened hidden states ``[token, d_model]``: its router returns
``(logits [token, expert], weights [token, k], indices [token, k])`` and its fused experts module computes
``experts(hidden, indices, weights)``, looping over the experts hit and adding each one's weighted output
per token in expert order. The hooks here expose that as named sites of shape ``[batch, pos, ...]``:

- ``layers.{l}.router.logits``: editing them re-routes with the family's own rule (:func:`route`);
- ``layers.{l}.router.weights``: the weight each expert gets (0 where not routed), dense over the experts;
  an edit routes with exactly the edited weights (an expert with weight 0 is not computed, one with a
  non-zero weight is, whether or not the router chose it);
- ``layers.{l}.experts.out``: ``[batch, pos, expert, d_model]``, each expert's weighted output (0 where not
  routed); computed once per expert on the tokens routed to it, in the module's own token order, in place of
  the module's loop (each expert runs once: Mixtral's loop body where the module's forward is Mixtral's, else
  the module called on that expert's tokens), the block's output added up as the module adds it, so the sum over
  experts in expert order is the module's output bit for bit;
- ``layers.{l}.shared_expert.out``: Qwen-MoE's shared expert's output before its sigmoid gate.

With nothing edited the block's output is unchanged (the hooks return the module's own outputs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from .families import Experts
from .sites import submodule

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

    from .trace import Session

__all__ = ["dense_weights", "expert_hooks", "route", "sparse_weights"]


def route(
    logits: torch.Tensor, top_k: int, rule: str, renormalise: bool, dtype: torch.dtype = torch.float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights [token, k], indices [token, k])`` of router ``logits [token, expert]`` by the family's rule,
    as its router computes them (``softmax_topk``: softmax in float32 over every expert, the top k, renormalised
    when ``renormalise``; ``topk_softmax``: the top k logits, a softmax over them). ``dtype``: the softmax's
    (the routers' own is float32; the circuit engine's expert nodes pass float64 in a float64 model)."""
    if rule == "topk_softmax":
        top, idx = torch.topk(logits, top_k, dim=-1)
        return torch.softmax(top, dim=1, dtype=top.dtype), idx
    probs = torch.softmax(logits, dim=-1, dtype=dtype)
    top, idx = torch.topk(probs, top_k, dim=-1)
    if renormalise:
        top = top / top.sum(dim=-1, keepdim=True)
    return top.to(logits.dtype), idx


def dense_weights(weights: torch.Tensor, indices: torch.Tensor, n_experts: int) -> torch.Tensor:
    """``[token, expert]``: each expert's routing weight (0 where not routed)."""
    return torch.zeros(weights.shape[0], n_experts, dtype=weights.dtype, device=weights.device).scatter(
        1, indices, weights
    )


def sparse_weights(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights [token, k], indices [token, k])`` routing exactly ``dense [token, expert]``: every expert with a
    non-zero weight, k the most any token has (at least 1); a token with fewer is padded with an expert at
    weight 0, whose contribution is exactly 0."""
    nz = dense != 0
    k = max(1, int(nz.sum(-1).max())) if dense.numel() else 1
    # non-zero experts first, each group in expert order (a stable sort of the flags)
    order = torch.sort((~nz).to(torch.int8), dim=-1, stable=True).indices[:, :k]
    return dense.gather(1, order), order


# the experts modules whose forward is Mixtral's loop (transformers 5: the same source in each), which
# :func:`_experts_per_expert` runs itself, op for op, without the module's per-call mask and buffers;
# tests/interventions/test_experts.py checks it against the module's own loop bit for bit
MIXTRAL_LOOP = frozenset({"MixtralExperts", "Qwen2MoeExperts", "Qwen3MoeExperts", "OlmoeExperts"})


def _experts_per_expert(
    experts: nn.Module,
    forward: Callable[..., torch.Tensor],
    hidden: torch.Tensor,
    indices: torch.Tensor,
    weights: torch.Tensor,
    n_experts: int,
    total: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[token, expert, d_model]`` weighted outputs, each expert run once on the tokens routed to it (in the
    module's order: by top-k slot, then token) by the module's own ``forward`` (or, for :data:`MIXTRAL_LOOP`
    modules, by the loop body of that forward), and (``total``) their sum as the module adds them: into zeros,
    per expert in expert order, ``index_add_`` over the expert's tokens (bit for bit the module's output, without
    a second pass over the ``[token, expert, d_model]`` tensor)."""
    n_tok, d = hidden.shape
    per = hidden.new_zeros(n_experts, n_tok, d)  # expert-major while filled (contiguous rows), token-major after
    out = torch.zeros_like(hidden) if total else None
    # every (slot, token) pair at once, grouped by expert and kept in (slot, token) order within an expert:
    # what ``torch.where(indices.t() == e)`` gives per expert, without one full-size comparison per expert
    flat = indices.t().reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=n_experts).tolist()
    loop = type(experts).__name__ in MIXTRAL_LOOP
    start = 0
    for e, c in enumerate(counts[:n_experts]):
        if not c:
            continue
        pick = order[start : start + c]
        start += c
        slot, tok = pick // n_tok, pick % n_tok
        if loop:  # Mixtral's loop body for expert e, as written there
            m: Any = experts
            gate, up = nn.functional.linear(hidden[tok], m.gate_up_proj[e]).chunk(2, dim=-1)
            y = nn.functional.linear(m.act_fn(gate) * up, m.down_proj[e])
            y = (y * weights[tok, slot, None]).to(hidden.dtype)
        else:
            ids = torch.full((c, 1), e, dtype=indices.dtype, device=indices.device)
            y = forward(hidden[tok], ids, weights[tok, slot][:, None]).to(hidden.dtype)
        per[e].index_add_(0, tok, y)
        if out is not None:
            out.index_add_(0, tok, y)
    return per.transpose(0, 1).contiguous(), out


class _Restore:
    """A handle whose ``remove`` gives the experts module back its class's forward."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def remove(self) -> None:
        self.module.__dict__.pop("forward", None)


def expert_hooks(session: Session, layer: int, layer_module: nn.Module, spec: Experts) -> list[RemovableHandle]:
    """The hooks exposing layer ``layer``'s router and expert sites to ``session`` (only those it records or
    edits)."""
    prefix = f"layers.{layer}"
    wants = session.wants
    names = {s: f"{prefix}.{s}" for s in ("router.logits", "router.weights", "experts.out", "shared_expert.out")}
    if not any(wants(n) for n in names.values()):
        return []
    block = submodule(layer_module, spec.block)
    router = submodule(layer_module, spec.router)
    experts = submodule(layer_module, spec.experts)
    n_experts = int(getattr(experts, "num_experts", 0) or getattr(router, "num_experts", 0))
    shape: dict[str, tuple[int, int]] = {}
    handles = []

    def block_pre(module: nn.Module, args: tuple) -> None:
        shape["bp"] = tuple(args[0].shape[:2])  # type: ignore[assignment]

    def as_site(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(*shape["bp"], *x.shape[1:])

    def router_hook(module: nn.Module, args: tuple, output: tuple) -> tuple:
        logits, weights, indices = output
        n = logits.shape[0]
        if wants(names["router.logits"]):
            view = as_site(logits)
            new = session.site(names["router.logits"], view)
            if new is not view:
                new = new.reshape(n, -1)
                if not torch.equal(new, logits):
                    top_k = int(getattr(module, "top_k", indices.shape[-1]))
                    weights, indices = route(new, top_k, spec.rule, bool(getattr(module, "norm_topk_prob", True)))
                logits = new
        if wants(names["router.weights"]):
            d = dense_weights(weights, indices, n_experts)
            view = as_site(d)
            new = session.site(names["router.weights"], view)
            if new is not view:
                new = new.reshape(n, -1)
                if not torch.equal(new, d):
                    weights, indices = sparse_weights(new)
        return logits, weights, indices

    own = type(experts).forward.__get__(experts)  # the class's forward, bound: called once per expert below

    def experts_forward(hidden: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        # in place of the module's forward while recorded or edited: each expert computed once (not the module's
        # loop and then each expert again); unedited, the block's output is summed as the module sums it
        # (index_add_ per expert in expert order: bit for bit the module's output; tests/models/test_sites.py);
        # edited, the edited outputs' sum over experts in expert order (x + 0 = x: the same rule)
        edited = names["experts.out"] in session.edits
        per, out = _experts_per_expert(experts, own, hidden, indices, weights, n_experts, total=not edited)
        view = as_site(per)
        new = session.site(names["experts.out"], view)
        if out is not None and new is view:
            return out
        new = new.reshape(per.shape)
        out = torch.zeros_like(hidden)
        for e in range(n_experts):
            out = out + new[:, e].to(out.dtype)
        return out

    def shared_hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return session.site(names["shared_expert.out"], as_site(output)).reshape(output.shape)

    handles.append(block.register_forward_pre_hook(block_pre))
    if wants(names["router.logits"]) or wants(names["router.weights"]):
        handles.append(router.register_forward_hook(router_hook))
    if wants(names["experts.out"]):
        experts.forward = experts_forward  # type: ignore[method-assign]  # an instance attribute, removed below
        handles.append(cast("RemovableHandle", _Restore(experts)))
    if spec.shared_expert is not None and wants(names["shared_expert.out"]):
        handles.append(submodule(layer_module, spec.shared_expert).register_forward_hook(shared_hook))
    return handles
