"""Batching by a token budget (batch x length), not a fixed count.

``batch_size`` everywhere in streetlamp means the largest number of tokens (rows x padded
length) one forward pass may hold. Long inputs get small batches, short inputs large ones; on
CPU large batches of long inputs are slower than small ones, so the default budget is modest.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

# Measured here on 2 cores: 16 IG steps at 512 tokens (benchmarks/bench_ig.py --only budget):
# 1 row/pass 3.22 s, 4 rows 3.47 s, 8 rows 4.42 s, 16 rows 4.62 s; occlusion at 128 tokens,
# interleaved (benchmarks/bench_occlusion.py --budgets): budget 512 1.68 s, 1024 1.59 s, 2048
# 1.85 s (Captum at 1024 tokens per pass 1.56 s); at 32 tokens they tie. Past ~1k tokens a pass
# gets slower per token on this CPU.
DEFAULT_CPU_BUDGET = 1024
DEFAULT_GPU_BUDGET = 65536


def default_budget(device: torch.device | str = "cpu") -> int:
    return DEFAULT_GPU_BUDGET if torch.device(device).type == "cuda" else DEFAULT_CPU_BUDGET


def rows_per_batch(length: int, budget: int | None, device: torch.device | str = "cpu") -> int:
    """How many rows of ``length`` tokens fit one forward pass."""
    b = budget if budget is not None else default_budget(device)
    return max(1, b // max(1, length))


def chunks(n: int, length: int, budget: int | None, device: torch.device | str = "cpu") -> Iterator[slice]:
    """Slices over ``n`` rows of equal ``length`` within the token budget."""
    step = rows_per_batch(length, budget, device)
    for start in range(0, n, step):
        yield slice(start, min(n, start + step))


def group_by_budget(lengths: Sequence[int], budget: int | None, device: torch.device | str = "cpu") -> list[list[int]]:
    """Indices grouped so that (rows x longest length) stays within the budget; similar lengths together."""
    b = budget if budget is not None else default_budget(device)
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) + 1) * max(lengths[j] for j in cur + [i]) > b:
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    return groups
