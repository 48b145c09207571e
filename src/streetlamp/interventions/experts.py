"""Expert interventions and the expert audit: does the router's weight say which expert matters?
(METHODS.md §14.)

Every edit goes through the one patching engine (:mod:`.engine`) at a MoE layer's sites (models/moe.py):

* :func:`remove` -- take expert ``e`` out of the tokens' top-k at ``layers.{l}.router.weights``. Without
  renormalisation the other experts keep their weights (the layer's expert mass falls by ``w_e``); with it they
  are rescaled to the token's original total, ``w'_j = w_j * sum(w) / (sum(w) - w_e)`` (for Mixtral's
  renormalised top-k: the remaining weights sum to 1 again). Removing every expert a token has is refused.
* :func:`force` -- route the tokens to expert ``e``: ``only`` gives it the token's whole routing mass and no
  other expert; ``swap`` puts it in place of the token's lowest-weighted chosen expert, at that weight.
* zero / mean ablation of an expert's output and patching from a corrupted run are the engine's own strategies
  at ``layers.{l}.experts.out`` / ``router.weights`` with ``head=e`` (the expert axis).

:func:`audit` is the routing-versus-removal table of ``streetlamp experts``: per (layer, expert) the routing
frequency and mean weight over the real tokens of a corpus beside the effect of removing the expert (KL of the
next-token distribution, per text, with bootstrap intervals), and per (token, expert routed) the router weight
beside the effect of removing that expert for that token alone (one forward per (layer, expert, batch of token
copies), never one per token).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter
from . import engine
from .engine import Intervention, Strategy

__all__ = ["AuditResult", "audit", "force", "kl_rows", "n_experts_of", "remove"]


def n_experts_of(adapter: ModelAdapter) -> int:
    """The number of routed experts of a MoE model; a clear error for a dense one."""
    cfg = adapter.hf_model.config
    n = int(getattr(cfg, "num_experts", 0) or getattr(cfg, "num_local_experts", 0) or 0)
    if adapter.family.experts is None or n < 1:
        raise StreetlampError(
            f"{adapter.name} ({adapter.family.name}) is not a mixture of experts: it has no router to audit"
        )
    return n


def check_expert(adapter: ModelAdapter, layer: int, expert: int) -> None:
    n = n_experts_of(adapter)
    if not 0 <= layer < adapter.n_layers:
        raise StreetlampError(f"layer {layer} out of range: the model has layers 0..{adapter.n_layers - 1}")
    if not 0 <= expert < n:
        raise StreetlampError(f"expert {expert} out of range: layer {layer} has experts 0..{n - 1}")


def remove(expert: int, renormalise: bool = False) -> Strategy:
    """Strategy at ``router.weights`` (applied to every expert of the selected tokens: ``head=None``): expert
    ``expert``'s weight set to 0, the others kept or rescaled to the token's original total."""

    def fn(w: torch.Tensor) -> torch.Tensor:
        out = w.clone()
        out[..., expert] = 0
        if renormalise:
            total, rest = w.sum(-1, keepdim=True), out.sum(-1, keepdim=True)
            routed = w[..., expert] != 0
            if bool((routed & (rest[..., 0] == 0)).any()):
                raise StreetlampError(
                    f"removing expert {expert} leaves a token with no expert to renormalise onto (it was the "
                    "token's only expert)"
                )
            out = torch.where(rest != 0, out * (total / torch.where(rest != 0, rest, 1)), out)
        return out

    return fn


def force(expert: int, mode: str = "only") -> Strategy:
    """Strategy at ``router.weights`` (``head=None``): route the selected tokens to ``expert`` (``only``: the
    token's whole routing mass on it; ``swap``: in place of its lowest-weighted chosen expert, at that weight)."""
    if mode not in ("only", "swap"):
        raise StreetlampError(f"unknown forced route {mode!r}; choose only or swap")

    def fn(w: torch.Tensor) -> torch.Tensor:
        if mode == "only":
            out = torch.zeros_like(w)
            out[..., expert] = w.sum(-1)
            return out
        if bool(((w != 0).sum(-1) == 0).any()):
            raise StreetlampError("a token routed to no expert has no lowest expert to swap")
        masked = torch.where(w != 0, w, torch.full_like(w, float("inf")))
        low = masked.argmin(-1, keepdim=True)
        low_w = w.gather(-1, low)
        chosen = w[..., expert] != 0
        out = w.scatter(-1, low, torch.zeros_like(low_w))
        out[..., expert] = torch.where(chosen, w[..., expert], low_w[..., 0])
        return torch.where(chosen[..., None], w, out)

    return fn


def kl_rows(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last axis from log-probabilities (float64 where given)."""
    return (p_log.exp() * (p_log - q_log)).sum(-1)


@dataclass
class AuditResult:
    """Per (layer, expert): ``frequency``, ``mean_weight`` (0 where not routed), ``kl_per_text`` ``[text, layer,
    expert]``; per routed (text, pos, layer, expert): ``token_rows`` (text, pos, layer, expert, weight, kl)."""

    frequency: np.ndarray  # [layer, expert]: share of real tokens routed to the expert
    mean_weight: np.ndarray  # [layer, expert]: mean routing weight over real tokens
    kl_per_text: np.ndarray  # [text, layer, expert]: mean over the text's positions of KL(clean || removed)
    token_rows: np.ndarray  # [n, 6]: text, pos, layer, expert, router weight, KL at the token's own prediction
    n_tokens: int
    forwards: int


def _log_probs(
    adapter: ModelAdapter, inputs: Inputs, interventions: list[Intervention] | None = None, record: tuple[str, ...] = ()
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Next-token log-probabilities at every position ``[batch, pos, vocab]`` (float64) with ``interventions``
    applied, and the recorded sites."""
    edits = engine.compile_edits(interventions or [])
    dev = adapter.device
    with torch.no_grad(), adapter.session(record, edits, False) as s:
        out = adapter.hf_model(
            input_ids=inputs.input_ids.to(dev), attention_mask=inputs.attention_mask.to(dev), use_cache=False
        )
    return torch.log_softmax(out.logits.to(torch.float64), dim=-1), s.cache


def audit(
    adapter: ModelAdapter,
    inputs: Inputs,
    *,
    renormalise: bool = False,
    tokens: bool = True,
    progress: bool = False,
) -> AuditResult:
    """The expert audit over ``inputs`` (a causal LM's next-token distributions; see the module docstring)."""
    if not adapter.kind.causal:
        raise StreetlampError("the expert audit compares next-token distributions: it needs a causal LM")
    E, L = n_experts_of(adapter), adapter.n_layers
    sites = [f"layers.{l}.router.weights" for l in range(L)]
    lp, cache = _log_probs(adapter, inputs, record=tuple(sites))
    real = inputs.attention_mask.bool().to(lp.device)
    n_real = real.sum(1).clamp(min=1)
    w = torch.stack([cache[s] for s in sites], dim=2).to(torch.float64)  # [b, p, L, E]
    realf = real[..., None, None].to(w.dtype)
    frequency = ((w != 0) * realf).sum((0, 1)) / real.sum()
    mean_weight = (w * realf).sum((0, 1)) / real.sum()
    B = len(inputs)
    kl = torch.zeros(B, L, E, dtype=torch.float64)
    rows: list[list[float]] = []
    forwards = 1
    it = [(l, e) for l in range(L) for e in range(E)]
    if progress:
        from tqdm import tqdm

        it = tqdm(it, desc="removing experts", leave=False)
    for l, e in it:
        routed = (w[:, :, l, e] != 0) & real
        if renormalise and bool((routed & ((w[:, :, l] != 0).sum(-1) == 1)).any()):
            raise StreetlampError(
                f"expert {e} of layer {l} is some token's only expert: it cannot be renormalised away"
            )
        lq, _ = _log_probs(adapter, inputs, [Intervention(sites[l], remove(e, renormalise))])
        forwards += 1
        d = kl_rows(lp, lq) * real
        kl[:, l, e] = (d.sum(1) / n_real).cpu()
        if not tokens:
            continue
        # the expert removed at one token at a time: a batch of copies, copy i edited at its own position
        for b in range(B):
            pos = routed[b].nonzero()[:, 0].tolist()
            if not pos:
                continue
            copies = engine.repeat_inputs(inputs.select([b]), len(pos))
            ivs = [Intervention(sites[l], remove(e, renormalise), pos=p, rows=[i]) for i, p in enumerate(pos)]
            lq, _ = _log_probs(adapter, copies, ivs)
            forwards += 1
            own = kl_rows(lp[b, pos], lq[torch.arange(len(pos)), pos])
            for p, k in zip(pos, own.tolist(), strict=True):
                rows.append([b, p, l, e, float(w[b, p, l, e]), k])
    return AuditResult(
        frequency=frequency.cpu().numpy(),
        mean_weight=mean_weight.cpu().numpy(),
        kl_per_text=kl.numpy(),
        token_rows=np.asarray(rows, dtype=np.float64).reshape(-1, 6),
        n_tokens=int(real.sum()),
        forwards=forwards,
    )
