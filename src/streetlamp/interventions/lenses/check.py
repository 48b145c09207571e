"""Each lens checked against intervention, per prompt and layer.

A lens reads from row ``r``'s residual ``h_r`` at the explained position what that residual "will make the
model say". The causal test: put ``h_r`` into a **neutral context** (by default the model's document
separator twice: ``<sep> <sep>``, the patched vector at the second position, which sees only a start of
document) at the same row, run the rest of the model, and read the real output there. Per row:

* ``top1_match``: the lens's top token is the patched run's top token;
* ``kl``: KL(patched outcome ‖ lens readout) in nats (float64 log-softmax);
* ``rank_lens`` / ``rank_patched``: rank (0 = top) of the target token (default: the model's prediction on
  the prompt) under the lens and under the patched outcome;
* ``disagrees``: the lens's top token is not the patched run's.

At the last row (the final residual) the patched run reads ``h_L`` through the final norm and unembedding:
every lens agrees there exactly (KL 0, a test). Each patched run is one row of one batch (an
:class:`~streetlamp.interventions.engine.Intervention` per row, at that row's site and the last position).

**The baseline variant** (:func:`check_baseline`): in the **same prompt**, row ``r``'s residual at the
explained position is replaced by a baseline vector ``μ_r`` (the neutral context's residual at that row and
its last position, or the mean residual of the lens's fit corpus: ``BASELINES``) and the rest of the model
runs. What ``h_r`` does to the output is then ``Δ_model = log p(prompt) - log p(h_r → μ_r)`` over the
vocabulary; what the lens says it does is ``Δ_lens = log q(h_r) - log q(μ_r)``, with ``q`` the lens's readout.
Per row:

* ``top1_match``: the token ``h_r`` promotes most is the same under both (argmax ``Δ_lens`` = argmax
  ``Δ_model``; the log-softmax shift is a constant, so this is the argmax of the logit differences);
* ``kl_model`` = KL(p(prompt) ‖ p(h_r → μ_r)): how much the replacement changes the output; ``kl_lens`` =
  KL(q(h_r) ‖ q(μ_r)): how much the lens says it does (Belrose et al.'s causal-fidelity comparison);
* ``rank_lens`` / ``rank_model``: rank (0 = most promoted) of the target token under ``Δ_lens`` / ``Δ_model``;
* ``disagrees``: not ``top1_match``.

At the last row the replaced run reads ``μ_L`` through the model's readout, which is the lens's readout
there: ``Δ_lens = Δ_model`` and every lens agrees (a test).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...errors import StreetlampError
from ...methods.gradient import ids_inputs
from ...models.adapter import Inputs
from ..engine import Intervention
from ..engine import run as run_edited
from .base import Lens, read_final, row_label, row_sites

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter

BASELINES = ("neutral", "mean")
BASELINE_COLUMNS = [
    "row",
    "layer",
    "baseline",
    "lens_top",
    "model_top",
    "top1_match",
    "kl_model",
    "kl_lens",
    "rank_lens",
    "rank_model",
    "disagrees",
]
COLUMNS = [
    "row",
    "layer",
    "lens_top",
    "patched_top",
    "top1_match",
    "kl_patched_lens",
    "rank_lens",
    "rank_patched",
    "disagrees",
]


def neutral_ids(adapter: ModelAdapter, text: str | None) -> list[int]:
    """The neutral context's tokens: ``text`` tokenised as the model reads it, or ``<sep> <sep>``."""
    if text:
        ids = adapter.encode(text).input_ids[0].tolist()
    else:
        ids = [adapter.empty_context_token()] * 2
    return ids


def _rank(logits: torch.Tensor, index: int) -> np.ndarray:
    return (logits > logits[..., index : index + 1]).sum(-1).cpu().numpy()


def _put(v: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """The strategy that writes the vector ``v`` ``[d]`` (broadcast; the engine's mask picks row and position)."""

    def fn(a: torch.Tensor) -> torch.Tensor:
        return v.to(a.device, a.dtype).view(1, 1, -1)

    return fn


def check_against_intervention(
    adapter: ModelAdapter, ids: torch.Tensor, lens: Lens, index: int, neutral: list[int] | None = None
) -> dict[str, Any]:
    """The per-row check at the last position of ``ids`` (module docstring); ``index``: the target token."""
    L = adapter.n_layers
    sites = row_sites(L)
    ids = ids.view(-1).cpu()
    neutral = neutral or neutral_ids(adapter, None)
    if not neutral:
        raise StreetlampError("the neutral context has no token")
    with torch.no_grad():
        fwd = adapter.forward(ids_inputs(adapter, ids), record=sites)
        h = [fwd.cache[s][0, -1] for s in sites]
        mapped = torch.stack([lens.transform(r, h[r]) for r in range(L + 1)])  # [row, d] float64
        lens_logits = read_final(adapter, mapped)  # [row, vocab] float64: row r's readout of h_r
        rows = Inputs.from_ids(adapter, [neutral] * (L + 1), strings=False)
        ivs = [Intervention(sites[r], _put(h[r]), pos=len(neutral) - 1, rows=[r]) for r in range(L + 1)]
        patched = run_edited(adapter, rows, ivs).logits.double()  # [row, vocab]: the output at the patched position
    lp_lens = torch.log_softmax(lens_logits, -1)
    lp_patch = torch.log_softmax(patched, -1)
    kl = (lp_patch.exp() * (lp_patch - lp_lens)).sum(-1).clamp_min(0).cpu().numpy()
    lens_top = lens_logits.argmax(-1).cpu().numpy()
    patched_top = patched.argmax(-1).cpu().numpy()
    match = lens_top == patched_top
    out = {
        "lens_top": lens_top,
        "patched_top": patched_top,
        "top1_match": match,
        "kl": kl,
        "rank_lens": _rank(lens_logits, index),
        "rank_patched": _rank(patched, index),
        "lens_logits": lens_logits.cpu().numpy(),
        "patched_logits": patched.cpu().numpy(),
        "neutral": list(neutral),
    }
    out["rows"] = [
        {
            "row": r,
            "layer": row_label(r),
            "lens_top": adapter.output_label(int(lens_top[r])),
            "patched_top": adapter.output_label(int(patched_top[r])),
            "top1_match": bool(match[r]),
            "kl_patched_lens": float(kl[r]),
            "rank_lens": int(out["rank_lens"][r]),
            "rank_patched": int(out["rank_patched"][r]),
            "disagrees": not bool(match[r]),
        }
        for r in range(L + 1)
    ]
    return out


def _kl(lp: torch.Tensor, lq: torch.Tensor) -> np.ndarray:
    """KL(p ‖ q) per row from log-probabilities (float64), clamped at 0 (rounding)."""
    return (lp.exp() * (lp - lq)).sum(-1).clamp_min(0).cpu().numpy()


def neutral_rows(adapter: ModelAdapter, neutral: list[int]) -> torch.Tensor:
    """``[L + 1, d]``: every row's residual at the last position of the neutral context (the baseline
    ``neutral``)."""
    sites = row_sites(adapter.n_layers)
    with torch.no_grad():
        fwd = adapter.forward(Inputs.from_ids(adapter, [neutral], strings=False), record=sites)
    return torch.stack([fwd.cache[s][0, -1].double().cpu() for s in sites])


def check_baseline(
    adapter: ModelAdapter, ids: torch.Tensor, lens: Lens, index: int, baseline: torch.Tensor, name: str
) -> dict[str, Any]:
    """The baseline variant at the last position of ``ids`` (module docstring): ``baseline`` ``[L + 1, d]``
    holds ``μ_r`` per row, ``name`` says which it is (one of ``BASELINES``)."""
    L = adapter.n_layers
    sites = row_sites(L)
    ids = ids.view(-1).cpu()
    if tuple(baseline.shape) != (L + 1, adapter.d_model):
        raise StreetlampError(f"the baseline has shape {tuple(baseline.shape)}, expected {(L + 1, adapter.d_model)}")
    with torch.no_grad():
        inputs = ids_inputs(adapter, ids)
        fwd = adapter.forward(inputs, record=sites)
        h = [fwd.cache[s][0, -1] for s in sites]
        lp_orig = torch.log_softmax(fwd.logits[0].double(), -1)  # [vocab]: the prompt's own output
        q = read_final(adapter, torch.stack([lens.transform(r, h[r]) for r in range(L + 1)]))
        qb = read_final(adapter, torch.stack([lens.transform(r, baseline[r]) for r in range(L + 1)]))
        rows = Inputs.from_ids(adapter, [ids.tolist()] * (L + 1), strings=False)
        ivs = [Intervention(sites[r], _put(baseline[r]), pos=len(ids) - 1, rows=[r]) for r in range(L + 1)]
        replaced = run_edited(adapter, rows, ivs).logits.double()  # [row, vocab]
    lp_rep = torch.log_softmax(replaced, -1)
    lq, lqb = torch.log_softmax(q, -1), torch.log_softmax(qb, -1)
    d_model = lp_orig[None] - lp_rep  # [row, vocab]: what h_r does to the output, by intervention
    d_lens = lq - lqb  # what the lens says h_r does
    lens_top = d_lens.argmax(-1).cpu().numpy()
    model_top = d_model.argmax(-1).cpu().numpy()
    match = lens_top == model_top
    out: dict[str, Any] = {
        "baseline": name,
        "lens_top": lens_top,
        "model_top": model_top,
        "top1_match": match,
        "kl_model": _kl(lp_orig[None].expand_as(lp_rep), lp_rep),
        "kl_lens": _kl(lq, lqb),
        "rank_lens": _rank(d_lens, index),
        "rank_model": _rank(d_model, index),
        "replaced_logits": replaced.cpu().numpy(),
        "effect_model": d_model.cpu().numpy(),
        "effect_lens": d_lens.cpu().numpy(),
        "baseline_vectors": baseline.double().cpu().numpy(),
    }
    out["rows"] = [
        {
            "row": r,
            "layer": row_label(r),
            "baseline": name,
            "lens_top": adapter.output_label(int(lens_top[r])),
            "model_top": adapter.output_label(int(model_top[r])),
            "top1_match": bool(match[r]),
            "kl_model": float(out["kl_model"][r]),
            "kl_lens": float(out["kl_lens"][r]),
            "rank_lens": int(out["rank_lens"][r]),
            "rank_model": int(out["rank_model"][r]),
            "disagrees": not bool(match[r]),
        }
        for r in range(L + 1)
    ]
    return out
