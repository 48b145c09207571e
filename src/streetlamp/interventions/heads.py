"""Head ablation, head importance (Michel et al. 2019), attention mass and pruning curves.

* **Ablation effect** ``ΔF[l, h] = F(x; head (l, h) ablated) - F(x)``, ``F`` the probability of the
  target (the clean prediction unless given), averaged over the texts. The head is ablated at
  ``layers.{l}.attn.z`` (its context vector before ``W_O``), which equals ablating its output
  ``z_h W_O,h`` since ``W_O`` is linear; strategies zero / mean / resample (engine.py).
* **Head importance** (Michel, Levy & Neubig, "Are Sixteen Heads Really Better than One?",
  NeurIPS 2019, eq. 2): a mask ``ξ_h`` multiplies each head's output, ``I_h = E_x |∂L(x)/∂ξ_h|``
  at ``ξ = 1``; ``L`` is the cross-entropy of the gold label when labels are given, else
  ``-log p(target)``. Michel also normalise ``I`` per layer (ℓ2) before pruning; we report the raw
  scores and use them unnormalised (said in the manifest).
* **Attention mass** of head (l, h): the attention the explained position ([CLS] for BERT-style
  classifiers, the last token for causal LMs) puts on content tokens (all but the tokenizer's
  special tokens), averaged over texts. ``attention_max``: its largest single weight.
* **Pruning curve**: remove (zero-ablate) heads one by one in a given order and track accuracy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter, Target, at_least_float32
from . import engine
from .engine import Intervention


def _chunks(n: int, size: int) -> list[list[int]]:
    return [list(range(i, min(n, i + size))) for i in range(0, n, size)]


def reference_strategies(
    adapter: ModelAdapter, ablation: str, reference: Inputs | None, seed: int = 0
) -> dict[int, engine.Strategy]:
    """One strategy per layer for ablating ``attn.z`` (zero, mean or resample)."""
    sites = [f"layers.{l}.attn.z" for l in range(adapter.n_layers)]
    if ablation == "zero":
        return {l: engine.zero for l in range(adapter.n_layers)}
    if reference is None:
        raise StreetlampError(f"{ablation} ablation needs a reference set of texts")
    pool = engine.site_pool(adapter, reference, sites)
    if ablation == "mean":
        return {l: engine.mean(pool[s].mean(0)) for l, s in enumerate(sites)}
    if ablation == "resample":
        return {l: engine.resample(pool[s], seed=seed + l) for l, s in enumerate(sites)}
    raise StreetlampError(f"unknown ablation {ablation!r}; choose zero, mean or resample")


def ablation_effects(
    adapter: ModelAdapter,
    inputs: Inputs,
    *,
    ablation: str = "zero",
    reference: Inputs | None = None,
    target: Target = Target(),
    seed: int = 0,
    texts_per_batch: int = 16,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """``(effects [text, layer, head], clean F [text])``: ``F(head ablated) - F(clean)``."""
    L, H = adapter.n_layers, adapter.n_heads
    strategies = reference_strategies(adapter, ablation, reference, seed)
    clean = adapter.forward(inputs).logits
    index = adapter.resolve(inputs, target, clean)
    f_clean = adapter.score(clean, index, target).cpu()
    out = torch.zeros(len(inputs), L, H, dtype=f_clean.dtype)
    it = [(l, rows) for rows in _chunks(len(inputs), texts_per_batch) for l in range(L)]
    if progress:
        from tqdm import tqdm

        it = tqdm(it, desc="ablating heads", leave=False)
    for l, rows in it:
        sub = engine.repeat_inputs(inputs.select(rows), H)
        ivs = [
            Intervention(f"layers.{l}.attn.z", strategies[l], head=h, rows=[b * H + h for b in range(len(rows))])
            for h in range(H)
        ]
        with torch.no_grad():
            logits = engine.run(adapter, sub, ivs).logits
        idx = index[rows].repeat_interleave(H)
        f = adapter.score(logits, idx, target).cpu().view(len(rows), H)
        out[rows, l] = f - f_clean[rows].view(-1, 1)
    return out.numpy(), f_clean.numpy()


def head_mask_edits(adapter: ModelAdapter, xi: torch.Tensor) -> dict:
    """Edits multiplying head h of layer l by ``xi[..., l, h]`` (``xi`` ``[L, H]`` or ``[batch, L, H]``)."""

    def make(l: int):
        def fn(z: torch.Tensor) -> torch.Tensor:
            m = xi[l] if xi.dim() == 2 else xi[:, l]
            m = m.view(1, 1, -1, 1) if xi.dim() == 2 else m.view(z.shape[0], 1, -1, 1)
            return z * m.to(z.dtype)

        return fn

    return {f"layers.{l}.attn.z": make(l) for l in range(adapter.n_layers)}


def head_importance(
    adapter: ModelAdapter,
    inputs: Inputs,
    *,
    labels: Sequence[int] | None = None,
    target: Target = Target(),
    texts_per_batch: int = 16,
) -> np.ndarray:
    """Michel et al. head importance per text, ``[text, layer, head]``: ``|∂L/∂ξ_h|`` at ξ = 1."""
    L, H = adapter.n_layers, adapter.n_heads
    out = torch.zeros(len(inputs), L, H)
    for rows in _chunks(len(inputs), texts_per_batch):
        sub = inputs.select(rows)
        xi = torch.ones(len(rows), L, H, device=adapter.device, requires_grad=True)
        fwd = adapter.forward(sub, edit=head_mask_edits(adapter, xi), grad=True)
        logp = torch.log_softmax(at_least_float32(fwd.logits), -1)
        if labels is not None:
            idx = torch.tensor([labels[r] for r in rows], device=logp.device)
        else:
            idx = adapter.resolve(sub, target, fwd.logits.detach()).to(logp.device)
        loss = -logp.gather(1, idx.view(-1, 1)).sum()
        (g,) = torch.autograd.grad(loss, [xi])
        out[rows] = g.abs().detach().cpu()
    return out.numpy()


def attention_mass(adapter: ModelAdapter, inputs: Inputs, texts_per_batch: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """``(mass, max)`` per text, ``[text, layer, head]``: attention of the explained position on
    content tokens (all but the model's structural special tokens), and its largest single weight."""
    L, H = adapter.n_layers, adapter.n_heads
    mass = np.zeros((len(inputs), L, H), np.float32)
    peak = np.zeros_like(mass)
    for rows in _chunks(len(inputs), texts_per_batch):
        sub = inputs.select(rows)
        fwd = adapter.forward(sub, record=["layers.*.attn.pattern"])
        att = torch.stack([fwd.cache[f"layers.{l}.attn.pattern"] for l in range(L)], 1).float().cpu()
        for i, b in enumerate(rows):
            n = sub.lengths[i]
            pos = adapter.explained_position(n)
            row = att[i, :, :, pos, :n]  # [L, H, key]
            content = torch.from_numpy(~adapter.special_mask(sub.input_ids[i, :n]))
            mass[b] = row[..., content].sum(-1).numpy()
            peak[b] = row.max(-1).values.numpy()
    return mass, peak


def attribution_scores(
    adapter: ModelAdapter, inputs: Inputs, target: Target = Target(), batch_size: int | None = None
) -> tuple[np.ndarray | None, str]:
    """Hao et al. attention-attribution head scores ``[text, layer, head]`` via the registered
    method ``attention_attribution`` (its ``head_scores`` array); ``(None, why)`` if unavailable."""
    from ..methods.registry import REGISTRY, get_method

    if "attention_attribution" not in REGISTRY:
        return None, "method attention_attribution is not registered in this build; column skipped"
    m = get_method("attention_attribution")
    m.check(adapter)
    exps = m.attribute(adapter, inputs, target=target, batch_size=batch_size)
    if not exps or "head_scores" not in exps[0].arrays:
        return None, "attention_attribution returned no head_scores array; column skipped"
    return np.stack([e.arrays["head_scores"] for e in exps]).astype(np.float32), "Hao et al. 2021 head_scores"


def accuracy_with_removed(
    adapter: ModelAdapter,
    inputs: Inputs,
    labels: Sequence[int],
    removed: Sequence[tuple[int, int]],
    texts_per_batch: int = 32,
) -> float:
    """Accuracy with the heads in ``removed`` zero-ablated (mask ξ = 0)."""
    xi = torch.ones(adapter.n_layers, adapter.n_heads, device=adapter.device)
    for l, h in removed:
        xi[l, h] = 0
    right = 0
    for rows in _chunks(len(inputs), texts_per_batch):
        with torch.no_grad():
            logits = adapter.forward(inputs.select(rows), edit=head_mask_edits(adapter, xi)).logits
        pred = logits.argmax(-1).cpu()
        right += int(sum(int(p) == labels[r] for p, r in zip(pred, rows)))
    return right / len(inputs)


def prune_curve(
    adapter: ModelAdapter,
    inputs: Inputs,
    labels: Sequence[int],
    order: Sequence[tuple[int, int]],
    step: int = 1,
    progress: bool = False,
    texts_per_batch: int = 32,
) -> tuple[np.ndarray, np.ndarray]:
    """``(n_removed, accuracy)``: accuracy after removing the first k heads of ``order``."""
    ks = list(range(0, len(order) + 1, step))
    if ks[-1] != len(order):
        ks.append(len(order))
    it = ks
    if progress:
        from tqdm import tqdm

        it = tqdm(ks, desc="pruning", leave=False)
    acc = [accuracy_with_removed(adapter, inputs, labels, order[:k], texts_per_batch) for k in it]
    return np.array(ks, np.int32), np.array(acc, np.float32)


def order_from_scores(scores: np.ndarray) -> list[tuple[int, int]]:
    """Heads ordered least important first (ascending score; ties by layer, head)."""
    L, H = scores.shape
    flat = np.argsort(scores.reshape(-1), kind="stable")
    return [(int(i // H), int(i % H)) for i in flat]


def random_order(n_layers: int, n_heads: int, seed: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    flat = rng.permutation(n_layers * n_heads)
    return [(int(i // n_heads), int(i % n_heads)) for i in flat]
