"""Expert interventions and the expert audit: does the router's weight say which expert matters?
(METHODS.md §14.)

Every edit goes through the one patching engine (:mod:`.engine`) at a MoE layer's sites (models/moe.py):

* :func:`remove` -- take expert ``e`` out of the tokens' top-k at ``layers.{l}.router.weights``. Without
  renormalisation the other experts keep their weights (the layer's expert mass falls by ``w_e``); with it they
  are rescaled to the token's original total, ``w'_j = w_j * sum(w) / (sum(w) - w_e)`` (for Mixtral's
  renormalised top-k: the remaining weights sum to 1 again). Removing a token's only expert with renormalisation
  is refused (nothing to renormalise onto). :func:`remove_set` takes several experts out together and refuses to
  leave a token with no expert at all; :func:`routed_top_k` makes every router pick k experts by its own rule.
* :func:`force` -- route the tokens to expert ``e``: ``only`` gives it the token's whole routing mass and no
  other expert; ``swap`` puts it in place of the token's lowest-weighted chosen expert, at that weight.
* zero / mean ablation of an expert's output and patching from a corrupted run are the engine's own strategies
  at ``layers.{l}.experts.out`` / ``router.weights`` with ``head=e`` (the expert axis).

:func:`audit` is the routing-versus-removal table of ``streetlamp experts``: per (layer, expert) the routing
frequency and mean weight over the real tokens of a corpus beside the effect of removing the expert (KL of the
next-token distribution, per text, with bootstrap intervals), and per (token, expert routed) the router weight
beside the effect of removing that expert for that token alone (one forward per (layer, expert, batch of token
copies drawn from all texts), never one per token nor per text).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from ..batching import rows_per_batch
from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter
from ..models.sites import submodule
from . import engine
from .engine import Intervention, Strategy

__all__ = [
    "AuditResult",
    "audit",
    "force",
    "kl_rows",
    "n_experts_of",
    "parse_experts",
    "remove",
    "remove_at",
    "remove_set",
    "routed_top_k",
]


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


def check_top_k(adapter: ModelAdapter, top_k: int) -> None:
    """A top-k the model's routers can take: 1..n_experts."""
    n = n_experts_of(adapter)
    if not 1 <= top_k <= n:
        raise StreetlampError(f"top-k {top_k} is not possible: the model's layers have {n} experts (top-k 1..{n})")


def parse_experts(spec: str, adapter: ModelAdapter) -> list[tuple[int, int]]:
    """``"L.E[,L.E...]"`` -> distinct (layer, expert) pairs, each checked against the model."""
    out: list[tuple[int, int]] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        try:
            layer, expert = (int(x) for x in part.split("."))
        except ValueError:
            raise StreetlampError(f"bad expert {part!r}: write LAYER.EXPERT, e.g. 1.3") from None
        check_expert(adapter, layer, expert)
        out.append((layer, expert))
    return list(dict.fromkeys(out))


@contextmanager
def routed_top_k(adapter: ModelAdapter, top_k: int | None) -> Iterator[None]:
    """Every router of the model picks its ``top_k`` experts (None: the checkpoint's own) while in the block: the
    routers' own ``top_k``, so the family's rule (softmax, top-k, renormalisation) is unchanged."""
    if top_k is None:
        yield
        return
    check_top_k(adapter, top_k)
    spec = adapter.family.experts
    assert spec is not None
    routers = [submodule(m, spec.router) for m in adapter.layer_modules]
    saved = [r.top_k for r in routers]
    try:
        for r in routers:
            setattr(r, "top_k", top_k)  # noqa: B010  # a plain int attribute of the router
        yield
    finally:
        for r, k in zip(routers, saved, strict=True):
            setattr(r, "top_k", k)  # noqa: B010


def remove_set(experts: Sequence[int], renormalise: bool = False) -> Strategy:
    """Strategy at ``router.weights``: every expert in ``experts`` taken out of the tokens' top-k together (the
    others kept or rescaled as :func:`remove`). A token left with no expert is refused in one line, renormalised
    or not: the block would compute nothing for it, which no routing rule does."""
    gone = sorted(set(experts))

    def fn(w: torch.Tensor) -> torch.Tensor:
        out = w.clone()
        out[..., gone] = 0
        had = (w != 0).any(-1)
        if bool((had & ~(out != 0).any(-1)).any()):
            raise StreetlampError(
                f"removing experts {', '.join(map(str, gone))} takes every expert of some token: it would be routed "
                "nowhere (remove fewer, or zero mlp.out to ablate the whole block)"
            )
        if renormalise:
            total, rest = w.sum(-1, keepdim=True), out.sum(-1, keepdim=True)
            out = torch.where(rest != 0, out * (total / torch.where(rest != 0, rest, 1)), out)
        return out

    return fn


def remove_at(expert: int, positions: torch.Tensor, renormalise: bool = False) -> Strategy:
    """Strategy at ``router.weights`` over a batch of copies: copy ``i`` loses ``expert`` at its own position
    ``positions[i]`` only (the per-token audit's edit, one forward for many tokens)."""

    def fn(w: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(w.shape[0], device=w.device)
        pos = positions.to(w.device)
        tok = w[rows, pos]  # [copy, expert]
        new = remove(expert, renormalise)(tok)
        out = w.clone()
        out[rows, pos] = new
        return out

    return fn


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
    layers: Sequence[int] | None = None,
    experts: Sequence[int] | None = None,
    top_k: int | None = None,
    removed: Sequence[tuple[int, int]] = (),
    batch_tokens: int | None = None,
    progress: bool = False,
) -> AuditResult:
    """The expert audit over ``inputs`` (a causal LM's next-token distributions; see the module docstring).

    ``layers`` / ``experts``: the (layer, expert) pairs removed one at a time (default all); ``top_k``: every
    router picks that many experts (:func:`routed_top_k`); ``removed``: (layer, expert) pairs taken out of every
    token throughout, so the audit measures each other expert with them gone (conditional importance). Every
    forward, the clean one included, runs with ``top_k`` and ``removed``. The per-token removals run as batches of
    copies of the texts (copy ``i`` edited at its own token), at most ``batch_tokens`` tokens a forward (None: the
    device's default budget): one forward per (layer, expert, token batch), never one per token nor per text."""
    if not adapter.kind.causal:
        raise StreetlampError("the expert audit compares next-token distributions: it needs a causal LM")
    E, L = n_experts_of(adapter), adapter.n_layers
    for l, e in removed:
        check_expert(adapter, l, e)
    for l in layers or ():
        check_expert(adapter, l, 0)
    for e in experts or ():
        check_expert(adapter, 0, e)
    if top_k is not None:
        check_top_k(adapter, top_k)
    gone = set(removed)
    pairs = [(l, e) for l in (layers or range(L)) for e in (experts or range(E)) if (l, e) not in gone]
    sites = [f"layers.{l}.router.weights" for l in range(L)]
    base = [
        Intervention(sites[l], remove_set([e for m, e in removed if m == l], renormalise))
        for l in sorted({m for m, _ in removed})
    ]
    with routed_top_k(adapter, top_k):
        lp, cache = _log_probs(adapter, inputs, base, record=tuple(sites))
        real = inputs.attention_mask.bool().to(lp.device)
        w = torch.stack([cache[s] for s in sites], dim=2).to(torch.float64)  # [b, p, L, E]
        if renormalise:
            only = ((w != 0).sum(-1) == 1) & real[..., None]  # [b, p, L]: tokens with a single expert
            for l, e in pairs:
                if bool((only[:, :, l] & (w[:, :, l, e] != 0)).any()):
                    raise StreetlampError(
                        f"expert {e} of layer {l} is some token's only expert: removing it leaves nothing to "
                        "renormalise onto (run without --renormalise, or with a larger --top-k)"
                    )
        res = _removals(adapter, inputs, lp, w, real, base, pairs, renormalise, tokens, batch_tokens, progress)
    n_real = real.sum(1).clamp(min=1)
    realf = real[..., None, None].to(w.dtype)
    kl = torch.full((len(inputs), L, E), float("nan"), dtype=torch.float64)
    for (l, e), d in res[0].items():
        kl[:, l, e] = (d.sum(1) / n_real).cpu()
    return AuditResult(
        frequency=(((w != 0) * realf).sum((0, 1)) / real.sum()).cpu().numpy(),
        mean_weight=((w * realf).sum((0, 1)) / real.sum()).cpu().numpy(),
        kl_per_text=kl.numpy(),
        token_rows=np.asarray(res[1], dtype=np.float64).reshape(-1, 6),
        n_tokens=int(real.sum()),
        forwards=res[2],
    )


def _removals(
    adapter: ModelAdapter,
    inputs: Inputs,
    lp: torch.Tensor,
    w: torch.Tensor,
    real: torch.Tensor,
    base: list[Intervention],
    pairs: list[tuple[int, int]],
    renormalise: bool,
    tokens: bool,
    batch_tokens: int | None,
    progress: bool,
) -> tuple[dict[tuple[int, int], torch.Tensor], list[list[float]], int]:
    """Each pair removed at every token of every text (KL per position), and, with ``tokens``, at one token at a
    time (rows: text, pos, layer, expert, weight, KL at that token's own prediction); and the forwards made."""
    per_pos: dict[tuple[int, int], torch.Tensor] = {}
    rows: list[list[float]] = []
    forwards = 1
    it: Sequence[tuple[int, int]] = pairs
    if progress:
        from tqdm import tqdm

        it = tqdm(pairs, desc="removing experts", leave=False)
    width = int(inputs.input_ids.shape[1])
    step = rows_per_batch(width, batch_tokens, adapter.device)
    for l, e in it:
        site = f"layers.{l}.router.weights"
        lq, _ = _log_probs(adapter, inputs, base + [Intervention(site, remove(e, renormalise))])
        forwards += 1
        per_pos[(l, e)] = kl_rows(lp, lq) * real
        if not tokens:
            continue
        where = ((w[:, :, l, e] != 0) & real).nonzero()  # [n, 2]: (text, pos), text-major
        for start in range(0, where.shape[0], step):
            chunk = where[start : start + step]
            b, p = chunk[:, 0], chunk[:, 1]
            copies = inputs.select(b.tolist())
            lq, _ = _log_probs(adapter, copies, base + [Intervention(site, remove_at(e, p, renormalise))])
            forwards += 1
            own = kl_rows(lp[b, p], lq[torch.arange(len(p), device=lq.device), p.to(lq.device)])
            for bi, pi, k in zip(b.tolist(), p.tolist(), own.tolist(), strict=True):
                rows.append([bi, pi, l, e, float(w[bi, pi, l, e]), k])
    return per_pos, rows, forwards
