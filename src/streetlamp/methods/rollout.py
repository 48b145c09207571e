"""Attention rollout, attention flow (Abnar & Zuidema, ACL 2020) and gradient-weighted rollout
(Chefer, Gur & Wolf, ICCV 2021): attention aggregated across layers into token-to-token maps.

All three work on the real tokens of each text only (padding is cropped before anything is
computed) and return ``matrix`` ``[output_position, token]`` (flow: only with ``rows="all"``) and
``tokens``, the explained position's row (``explained_position``: [CLS] for BERT-style
classifiers, the last token otherwise).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
import torch

from ..batching import group_by_budget
from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter, Target
from ..results import Explanation
from .attention import record_attention
from .base import Method
from .long_input import LongInput, LongRow
from .long_rows import check_flow_size, flow_row, rollout_row
from .maxflow import layered_max_flow

FUSIONS = ("mean", "max", "min")


def discard_lowest(fused: np.ndarray, ratio: float) -> np.ndarray:
    """vit-explain's ``discard_ratio`` (Gildenblat's rollout for ViT, github.com/jacobgil/vit-explain):
    in each layer's head-fused ``[S, S]`` matrix the ``int(S*S*ratio)`` smallest entries are set to 0,
    except entry ``(0, 0)`` ([CLS] to itself, the flat index 0 that its code keeps). Ties are broken by
    position (a stable sort). ``fused`` ``[L, S, S]``; a copy is returned."""
    out = fused.copy()
    s = fused.shape[-1]
    k = int(s * s * ratio)
    if k == 0:
        return out
    for layer in out:
        flat = layer.reshape(-1)
        drop = np.argsort(flat, kind="stable")[:k]
        flat[drop[drop != 0]] = 0.0
    return out


def residual_attention(att: np.ndarray, fusion: str = "mean", discard_ratio: float = 0.0) -> np.ndarray:
    """``Â_l = 0.5·fuse_h A[l] + 0.5·I``, rows renormalised. ``att`` ``[L, H, S, S]`` -> ``[L, S, S]``.
    ``discard_ratio`` > 0 first drops the lowest fused entries (:func:`discard_lowest`)."""
    fused = {"mean": att.mean(1), "max": att.max(1), "min": att.min(1)}[fusion].astype(np.float64)
    if discard_ratio:
        fused = discard_lowest(fused, discard_ratio)
    a = 0.5 * fused + 0.5 * np.eye(att.shape[-1])[None]
    return a / a.sum(-1, keepdims=True)


def rollout_matrix(a_hat: np.ndarray) -> np.ndarray:
    """``R = Â_L · … · Â_1`` for ``a_hat`` ``[L, S, S]``."""
    r = np.eye(a_hat.shape[-1])
    for layer in a_hat:
        r = layer @ r
    return r


def attention_per_text(
    adapter: ModelAdapter, inputs: Inputs, batch_size: int | None
) -> tuple[list[np.ndarray], torch.Tensor]:
    """Attention ``[L, H, n, n]`` (real tokens only) for each text, and the explained output indices'
    logits ``[batch, n_out]``; texts are run in groups that fit the token budget."""
    atts: list[np.ndarray] = [np.empty(0)] * len(inputs)
    logits: list[torch.Tensor | None] = [None] * len(inputs)
    for group in group_by_budget(inputs.lengths, batch_size, adapter.device):
        sub = inputs.select(group)
        lg, att, _ = record_attention(adapter, sub)
        for k, b in enumerate(group):
            n = inputs.lengths[b]
            atts[b] = att[k, :, :, :n, :n].double().cpu().numpy()
            logits[b] = lg[k].detach().float().cpu()
    return atts, torch.stack([x for x in logits if x is not None])


class _AttentionGraphMethod(Method):
    family = "attention"
    fusion: str
    discard_ratio: float

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        if self.fusion not in FUSIONS:
            raise StreetlampError(f"unknown head fusion {self.fusion!r}; choose one of {', '.join(FUSIONS)}")
        r = self.discard_ratio
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r < 1:
            raise StreetlampError(f"discard_ratio must be a number in [0, 1), not {r!r}")

    # -- long inputs: the explained row from the stored queries and keys (:mod:`.long_rows`) -------------
    long_input = True
    long_row: ClassVar[Callable[..., np.ndarray]]  # rollout_row / flow_row

    def check_long(self, long: LongInput) -> None:
        if self.fusion not in FUSIONS:
            raise StreetlampError(f"unknown head fusion {self.fusion!r}; choose one of {', '.join(FUSIONS)}")
        if self.discard_ratio:
            raise StreetlampError(f"{self.name} on long inputs takes no discard_ratio (got {self.discard_ratio})")

    def attribute_long(self, long: LongInput) -> LongRow:
        """Row ``position`` recomputed from the stored queries and keys chunk by chunk."""
        assert long.store is not None
        row = type(self).long_row(long.store, long.position, self.fusion, long.chunk)
        return LongRow(
            row,
            f"{self.name} row of position {long.position}: Â_l = 0.5·{self.fusion}_h A[l] + 0.5·I (rows renormalised), "
            "recomputed from the stored queries and keys chunk by chunk",
        )

    def image_grid(self, adapter: ModelAdapter, row: np.ndarray) -> dict[str, tuple[np.ndarray, list[str], str]]:
        """Image models: the explained row over the patches as the patch grid, divided by its maximum
        (vit-explain's ``mask / mask.max()``); nothing for text models."""
        if adapter.modality != "image":
            return {}
        g = adapter.patch_grid()
        grid = row[1:].reshape(g["patch_rows"], g["patch_cols"])
        top = grid.max()
        return {
            "grid": (
                (grid / top if top > 0 else grid).astype(np.float32),
                ["patch_row", "patch_col"],
                "the explained row's patch entries (no [CLS]) on the patch grid, divided by their maximum",
            )
        }


@dataclass
class Rollout(_AttentionGraphMethod):
    """Attention rollout (Abnar & Zuidema 2020): ``Â_l = 0.5·fuse_h A[l] + 0.5·I`` with rows
    renormalised, ``R = Â_L ⋯ Â_1``; ``R[i, j]`` is the share of output position i that comes from
    input token j. ``fusion``: how heads are combined (``mean`` as in the paper, ``max``, ``min``).
    ``discard_ratio``: drop the lowest fused entries first, as vit-explain does on images
    (:func:`discard_lowest`; its authors' ViT demos use max fusion with 0.9); rows are renormalised
    as in the paper (vit-explain's ``a / a.sum(dim=-1)`` broadcasts over columns instead). On an image
    model the explanation also has ``grid``: the [CLS] row over the patches, on the patch grid."""

    fusion: Literal["mean", "max", "min"] = "mean"
    discard_ratio: float = 0.0

    name = "rollout"
    description = "attention rollout: product of residual-augmented, head-fused attention over layers"
    long_row = staticmethod(rollout_row)

    def attribute(
        self, adapter: ModelAdapter, inputs: Inputs, *, target: Target, batch_size: int | None = None, seed: int = 0
    ) -> list[Explanation]:
        self.check(adapter)
        atts, logits = attention_per_text(adapter, inputs, batch_size)
        index = adapter.resolve(inputs, target, logits)
        out = []
        for b, att in enumerate(atts):
            n = att.shape[-1]
            pos = adapter.explained_position(n)
            r = rollout_matrix(residual_attention(att, self.fusion, self.discard_ratio))
            grid = self.image_grid(adapter, r[pos])
            dropped = f" after dropping the lowest {self.discard_ratio:.0%} of entries" if self.discard_ratio else ""
            out.append(
                self.explanation(
                    adapter,
                    inputs,
                    b,
                    int(index[b]),
                    target,
                    arrays={
                        "tokens": r[pos].astype(np.float32),
                        "matrix": r.astype(np.float32),
                        **{k: v[0] for k, v in grid.items()},
                    },
                    axes={
                        "tokens": ["token"],
                        "matrix": ["output_position", "token"],
                        **{k: v[1] for k, v in grid.items()},
                    },
                    meaning={
                        "tokens": f"rollout row of position {pos} ({inputs.labels[b][pos]}): share of its "
                        "final representation that flows from each input token",
                        "matrix": f"R = Â_L…Â_1, Â_l = 0.5·{self.fusion}_h A[l]{dropped} + 0.5·I, rows renormalised",
                        **{k: v[2] for k, v in grid.items()},
                    },
                    position=pos,
                    target_independent=True,
                )
            )
        return out


@dataclass
class Flow(_AttentionGraphMethod):
    """Attention flow (Abnar & Zuidema 2020): the layered graph with nodes ``(l, i)``, ``l = 0..L``,
    and edges ``(l-1, j) -> (l, i)`` of capacity ``Â_l[i, j]`` (Â as in rollout);
    ``Flow[i, j]`` = value of the maximum flow from ``(0, j)`` to ``(L, i)``, computed exactly by
    :func:`~streetlamp.methods.maxflow.layered_max_flow` (equal to networkx's max-flow to ~1e-12).
    Raw max-flow values, not renormalised (the authors' code divides each row by its sum).
    ``rows="explained"`` (default) computes only the explained position's row; ``"all"`` the matrix.
    ``discard_ratio`` as in :class:`Rollout` (applied to the capacities' fused attention); an image
    model's explanation also has ``grid`` (the explained row over the patch grid)."""

    fusion: Literal["mean", "max", "min"] = "mean"
    rows: Literal["explained", "all"] = "explained"
    discard_ratio: float = 0.0

    name = "flow"
    description = "attention flow: max-flow from each input token to the output through the layered attention graph"

    long_row = staticmethod(flow_row)

    def check_long(self, long: LongInput) -> None:
        super().check_long(long)
        check_flow_size(long.adapter.n_layers, long.n_tokens)

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        if self.rows not in ("explained", "all"):
            raise StreetlampError(f"flow rows must be 'explained' or 'all', not {self.rows!r}")

    def attribute(
        self, adapter: ModelAdapter, inputs: Inputs, *, target: Target, batch_size: int | None = None, seed: int = 0
    ) -> list[Explanation]:
        self.check(adapter)
        atts, logits = attention_per_text(adapter, inputs, batch_size)
        index = adapter.resolve(inputs, target, logits)
        out = []
        for b, att in enumerate(atts):
            n = att.shape[-1]
            pos = adapter.explained_position(n)
            caps = residual_attention(att, self.fusion, self.discard_ratio)
            arrays = {}
            axes = {"tokens": ["token"]}
            meaning = {
                "tokens": f"max-flow value from each input token (layer 0) to position {pos} "
                f"({inputs.labels[b][pos]}) at layer {adapter.n_layers}"
            }
            if self.rows == "all":
                m = layered_max_flow(caps)
                arrays["matrix"] = m.astype(np.float32)
                axes["matrix"] = ["output_position", "token"]
                meaning["matrix"] = "Flow[i, j]: max-flow from (0, j) to (L, i), capacities Â_l[i, j]"
                row = m[pos]
            else:
                row = layered_max_flow(caps, [pos])[0]
            arrays["tokens"] = row.astype(np.float32)
            for k, (v, ax, mean) in self.image_grid(adapter, row).items():
                arrays[k], axes[k], meaning[k] = v, ax, mean
            out.append(
                self.explanation(
                    adapter,
                    inputs,
                    b,
                    int(index[b]),
                    target,
                    arrays=arrays,
                    axes=axes,
                    meaning=meaning,
                    position=pos,
                    target_independent=True,
                )
            )
        return out


@dataclass
class GradientRollout(Method):
    """Gradient-weighted rollout (Chefer, Gur & Wolf, ICCV 2021, eqs. 5-6):
    ``Ā_l = E_h[(∇A_l ⊙ A_l)^+]``, ``R ← R + Ā_l · R`` for l = 1..L from ``R = I``
    (so ``R = (I + Ā_L) ⋯ (I + Ā_1)``; no renormalisation, as in the paper).
    ``∇A_l = ∂F/∂A_l`` of the explained scalar F (the paper uses the target class's logit: pass
    ``Target(quantity="logit")`` to reproduce it exactly; the default F is the probability)."""

    name = "gradient_rollout"
    family = "attention"
    description = "Chefer et al. 2021: rollout of gradient-weighted, positive attention (R <- R + mean_h (grad*A)^+ R)"
    needs_gradients = True

    def attribute(
        self, adapter: ModelAdapter, inputs: Inputs, *, target: Target, batch_size: int | None = None, seed: int = 0
    ) -> list[Explanation]:
        self.check(adapter)
        out: list[Explanation | None] = [None] * len(inputs)
        for b, sub, k, a, g, index in attention_gradient_texts(adapter, inputs, target, batch_size):
            n = a.shape[-1]
            a_bar = np.clip(g * a, 0, None).mean(1)  # [L, n, n]
            r = np.eye(n)
            for layer in a_bar:
                r = r + layer @ r
            pos = adapter.explained_position(n)
            out[b] = self.explanation(
                adapter,
                sub,
                k,
                index,
                target,
                arrays={"tokens": r[pos].astype(np.float32), "matrix": r.astype(np.float32)},
                axes={"tokens": ["token"], "matrix": ["output_position", "token"]},
                meaning={
                    "tokens": f"row {pos} ({inputs.labels[b][pos]}) of R = (I+Ā_L)…(I+Ā_1), "
                    "Ā_l = mean_h (dF/dA_l ⊙ A_l)^+",
                    "matrix": "R = (I+Ā_L)…(I+Ā_1), Ā_l = mean_h (dF/dA_l ⊙ A_l)^+",
                },
                position=pos,
            )
        return [e for e in out if e is not None]


def attention_gradient_texts(
    adapter: ModelAdapter, inputs: Inputs, target: Target, batch_size: int | None
) -> Iterator[tuple[int, Inputs, int, np.ndarray, np.ndarray, int]]:
    """``(b, sub, k, A, dF/dA, index)`` for every text ``b``, batched within the token budget:
    ``sub`` is its batch and ``k`` its row there; ``A`` and ``dF/dA`` are float64 ``[layer, head,
    n, n]`` cropped to the text's length (one forward + backward per batch)."""
    for group in group_by_budget(inputs.lengths, batch_size, adapter.device):
        sub = inputs.select(group)
        att, grad, index = attention_and_gradient(adapter, sub, target)
        for k, b in enumerate(group):
            n = inputs.lengths[b]
            yield (
                b,
                sub,
                k,
                att[k, :, :, :n, :n].double().cpu().numpy(),
                grad[k, :, :, :n, :n].double().cpu().numpy(),
                int(index[k]),
            )


def attention_and_gradient(
    adapter: ModelAdapter, inputs: Inputs, target: Target
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention ``A`` and ``∂F/∂A`` ``[batch, layer, head, query, key]`` and the target indices."""
    sites = [f"layers.{l}.attn.pattern" for l in range(adapter.n_layers)]
    fwd = adapter.forward(inputs, record=sites, keep_grad=True, grad=True)
    index = adapter.resolve(inputs, target, fwd.logits.detach())
    f = adapter.score(fwd.logits, index.to(fwd.logits.device), target)
    pats = [fwd.cache[s] for s in sites]
    grads = torch.autograd.grad(f.sum(), pats, allow_unused=True)
    filled = [torch.zeros_like(p) if g is None else g for p, g in zip(pats, grads)]
    return torch.stack([p.detach() for p in pats], 1), torch.stack(filled, 1).detach(), index
