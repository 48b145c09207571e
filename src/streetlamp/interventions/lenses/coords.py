"""Coordinate interventions in a lens's token directions (the Jacobian lens's ablate and swap).

**Lens vectors.** The readout of row ``r`` is ``W_U · norm_f(A_r h + b_r)``; to first order (the norm's
scale held fixed) token ``t``'s logit reads ``h`` along ``v_t = A_rᵀ u_t``, with ``u_t = W_U[t]`` the
unembedding row as the model stores it (the final norm's weight not folded in). These are the rows of
``W_U A_r`` ("J-lens vectors" for the Jacobian lens, ``A_r = J_r``; the logit lens's are the unembedding
rows themselves).

**Ablate** (token set ``T``): for each ``t`` in ``T`` in turn, with ``v̂ = v_t / ‖v_t‖``,
``h ← h − (h·v̂) v̂`` (a sequential projection, the form of TransformerLens's ``JacobianLens.ablation_hooks``;
for one token it is the orthogonal projection off ``v_t``).

**Swap** (source ``s``, target ``t``, strength ``α``): with ``V = [v_s, v_t]`` ``[d, 2]`` and coordinates
``c = V⁺ h`` (pseudo-inverse), ``h ← h + α V (σ(c) − c)`` where ``σ`` exchanges the two coordinates; the
component of ``h`` outside ``span{v_s, v_t}`` is untouched, ``α = 1`` exchanges them, ``α = 2`` is the
"double-strength" swap (TransformerLens's ``swap_hooks``, which implements the paper's coordinate swap).

**Measured** (:func:`coordinate_effects`): per row ``r`` the edit is applied to row ``r``'s residual at the
explained position of the **same prompt**, the rest of the model runs (one batch row per residual row),
and the output's log-probabilities of the tokens are compared with the unedited run's, beside what the
lens itself predicts (its readout of the edited vector against its readout of the original) and the
KL(original output ‖ edited output).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...errors import StreetlampError
from ...methods.gradient import ids_inputs
from ...models.adapter import Inputs
from ...models.readout import unembedding
from ..engine import Intervention
from ..engine import run as run_edited
from .base import Lens, read_final, row_label, row_sites

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter

KINDS = ("ablate", "swap")


def lens_vectors(adapter: ModelAdapter, lens: Lens, row: int, tokens: list[int]) -> torch.Tensor:
    """``[len(tokens), d]`` float64: ``v_t = A_rowᵀ W_U[t]`` (``W_U[t]`` itself where the row is the identity)."""
    w, _ = unembedding(adapter)
    u = w[torch.as_tensor(tokens)].double().cpu()
    a = lens.A[row] if row < lens.n_layers else None
    return u if a is None else u @ a.double().cpu()


def ablate(h: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
    """``h`` ``[..., d]`` with each of ``vectors`` ``[k, d]`` projected out in turn (unit-normalised)."""
    out = h.double()
    for v in vectors.double().to(out.device):
        n = v.norm()
        if not n > 0:
            raise StreetlampError("a lens vector is zero: its direction cannot be ablated")
        u = v / n
        out = out - (out @ u)[..., None] * u
    return out


def swap(h: torch.Tensor, v_source: torch.Tensor, v_target: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """``h + α V (σ(c) − c)``, ``V = [v_source, v_target]``, ``c = V⁺ h`` (module docstring)."""
    V = torch.stack([v_source, v_target], 1).double().to(h.device)  # [d, 2]
    c = h.double() @ torch.linalg.pinv(V).t()  # [..., 2]
    return h.double() + alpha * ((c.flip(-1) - c) @ V.t())


def edit_of(
    adapter: ModelAdapter, lens: Lens, row: int, kind: str, tokens: list[int], alpha: float
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The edit ``h ↦ h'`` of row ``row`` (float64 in, float64 out)."""
    V = lens_vectors(adapter, lens, row, tokens)
    if kind == "ablate":
        return lambda h: ablate(h, V)
    if kind == "swap":
        if len(tokens) != 2 or tokens[0] == tokens[1]:
            raise StreetlampError("--swap takes two different tokens, SOURCE,TARGET")
        return lambda h: swap(h, V[0], V[1], alpha)
    raise StreetlampError(f"unknown coordinate intervention {kind!r} (ablate or swap)")


def _strategy(edit: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda a: edit(a).to(a.dtype)  # the engine's mask keeps only the row's explained position


def coordinate_effects(
    adapter: ModelAdapter, ids: torch.Tensor, lens: Lens, kind: str, tokens: list[int], alpha: float = 1.0
) -> dict[str, Any]:
    """The edit at every row (module docstring); ``tokens``: the ablated tokens, or (source, target)."""
    L = adapter.n_layers
    sites = row_sites(L)
    ids = ids.view(-1).cpu()
    edits = [edit_of(adapter, lens, r, kind, tokens, alpha) for r in range(L + 1)]
    tok = torch.as_tensor(tokens)
    with torch.no_grad():
        fwd = adapter.forward(ids_inputs(adapter, ids), record=sites)
        h = [fwd.cache[s][0, -1].double() for s in sites]
        lp0 = torch.log_softmax(fwd.logits[0].double(), -1)
        rows = Inputs.from_ids(adapter, [ids.tolist()] * (L + 1), strings=False)
        ivs = [Intervention(sites[r], _strategy(edits[r]), pos=len(ids) - 1, rows=[r]) for r in range(L + 1)]
        lp1 = torch.log_softmax(run_edited(adapter, rows, ivs).logits.double(), -1)  # [row, vocab]
        lq0 = torch.log_softmax(read_final(adapter, torch.stack([lens.transform(r, h[r]) for r in range(L + 1)])), -1)
        edited = torch.stack([edits[r](h[r]) for r in range(L + 1)])
        lq1 = torch.log_softmax(
            read_final(adapter, torch.stack([lens.transform(r, edited[r]) for r in range(L + 1)])), -1
        )
    kl = (lp0.exp() * (lp0 - lp1)).sum(-1).clamp_min(0).cpu().numpy()
    out = {
        "kind": kind,
        "tokens": list(tokens),
        "alpha": alpha,
        "model_before": lp0[tok].cpu().numpy(),  # [token]
        "model_after": lp1[:, tok].cpu().numpy(),  # [row, token]
        "lens_before": lq0[:, tok].cpu().numpy(),
        "lens_after": lq1[:, tok].cpu().numpy(),
        "kl": kl,
        "top_after": lp1.argmax(-1).cpu().numpy(),
        "edit_norm": (edited - torch.stack(h)).norm(dim=-1).cpu().numpy(),
    }
    return out


def effect_rows(adapter: ModelAdapter, res: dict[str, Any]) -> list[dict[str, Any]]:
    """The CSV rows of :func:`coordinate_effects`: one per residual row, columns per token."""
    names = ["source", "target"] if res["kind"] == "swap" else [f"token{i}" for i in range(len(res["tokens"]))]
    rows = []
    for r in range(len(res["kl"])):
        row: dict[str, Any] = {"row": r, "layer": row_label(r), "intervention": res["kind"], "alpha": res["alpha"]}
        for j, n in enumerate(names):
            row[n] = adapter.output_label(res["tokens"][j])
            row[f"dlogp_{n}_model"] = float(res["model_after"][r, j] - res["model_before"][j])
            row[f"dlogp_{n}_lens"] = float(res["lens_after"][r, j] - res["lens_before"][r, j])
        row["kl_model"] = float(res["kl"][r])
        row["top_after"] = adapter.output_label(int(res["top_after"][r]))
        row["edit_norm"] = float(res["edit_norm"][r])
        rows.append(row)
    return rows


def effect_arrays(res: dict[str, Any]) -> dict[str, np.ndarray]:
    return {
        "dlogp_model": res["model_after"] - res["model_before"][None],
        "dlogp_lens": res["lens_after"] - res["lens_before"],
        "kl": res["kl"],
    }
