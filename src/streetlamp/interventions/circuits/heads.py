"""How many heads carry a task (issue 37 item 6): heads ablated one more at a time, in the order of their
task effect, until the metric has lost a share of its clean value (arXiv 2605.08853, Table 1: in
grouped-query Qwen2.5-0.5B ablating the top IOI head flips the logit difference's sign; Pythia-160M needs
5 heads).

* **A head's effect**: ``m(head ablated) - m(model)``, mean over prompts, the head ablated as a node (every
  out-edge of its writer fed ``z̃``: :func:`.scores.exact_nodes`); the order puts the most negative first
  (the head whose removal costs the metric most).
* **Damage of the top k**: ``1 - m̄(top k ablated) / m̄(model)`` (means over prompts): the share of the
  model's clean metric removed (1: the metric at zero; above 1: its sign flipped).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .blocks import Blocks
from .faithfulness import circuit_metrics
from .scores import exact_nodes
from .tasks import PairSet


@dataclass
class HeadDamage:
    heads: list[str]  # every head, most harmful to remove first
    effect: np.ndarray  # [heads] m(head ablated) - m(model), mean over prompts, in that order
    damage: np.ndarray  # [k] damage with the top 1 .. k heads ablated (as far as it was taken)
    m_model: float
    count: int | None  # the fewest top heads reaching the target damage (None: not within max_heads)
    sign_flip: int | None  # the fewest top heads that turn the mean metric's sign (None: not within max_heads)


def head_damage(
    blocks: Blocks,
    pairs: PairSet,
    target: float = 0.8,
    ablation: str = "patch",
    metric: str = "logit_diff",
    max_heads: int | None = None,
    batch_size: int = 32,
) -> HeadDamage:
    """Heads ablated cumulatively in the order of their effect until ``target`` damage (and on to
    ``max_heads``, default every head, only as far as needed for both the target and the sign flip)."""
    g = blocks.graph
    heads = [i for i, w in enumerate(g.writers) if ".H" in w]
    node = exact_nodes(blocks, pairs, metric, ablation, batch_size).double().numpy()  # [n, U]
    eff = node[:, heads].mean(0)
    order = [heads[j] for j in np.argsort(eff, kind="stable")]
    base = circuit_metrics(blocks, pairs, [g.valid()], ablation, metric, batch_size)[0].mean()
    K = len(order) if max_heads is None else min(max_heads, len(order))
    damage: list[float] = []
    count = flip = None
    mask = g.valid().clone()
    for k in range(K):
        mask[:, order[k]] = False  # every out-edge of the head
        m = circuit_metrics(blocks, pairs, [mask.clone()], ablation, metric, batch_size)[0].mean()
        damage.append(1.0 - m / base)
        if count is None and damage[-1] >= target:
            count = k + 1
        if flip is None and np.sign(m) != np.sign(base):
            flip = k + 1
        if count is not None and flip is not None:
            break
    return HeadDamage(
        [g.writers[i] for i in order], np.sort(eff, kind="stable"), np.array(damage), float(base), count, flip
    )


def sink_share(first: np.ndarray | torch.Tensor, eps: float = 0.3) -> float:
    """Sink₁^ε (Gu et al. 2024, arXiv 2410.10781): the share of heads whose mean attention to the first
    token, ``first`` ``[layers, heads]`` (mean over queries and sequences), exceeds ``eps``."""
    a = np.asarray(first, np.float64)
    return float((a > eps).mean())


def first_token_attention(patterns: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
    """``[layers, heads]``: attention to the first token, mean over every real query of every sequence
    (Gu et al.'s α¹: queries ``t = 1 .. T``, the first token's own row included), from patterns
    ``[batch, layers, heads, query, key]`` and ``key_mask`` ``[batch, query]``."""
    a = patterns[..., 0].double()  # [b, L, H, q]
    m = key_mask.to(a.dtype)[:, None, None, :]
    return (a * m).sum((0, 3)) / m.sum((0, 3))
