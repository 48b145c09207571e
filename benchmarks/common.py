"""Shared timing helpers for the benchmarks: repeat, take the median, print ratios against a peer
measured in the same process (this machine is shared, so absolute seconds drift)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def threads(n: int | None = None) -> int:
    """Pin torch threads (default: all cores, at most 2 here) so peers run under the same settings."""
    n = n or max(1, min(2, os.cpu_count() or 1))
    torch.set_num_threads(n)
    return n


def timeit(fn: Callable[[], Any], repeat: int = 3, warmup: int = 1) -> tuple[float, list[float], Any]:
    """Median seconds over ``repeat`` runs after ``warmup`` runs; returns (median, all, last result)."""
    out = None
    for _ in range(warmup):
        out = fn()
    times = []
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(repeat):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, out


def load() -> str:
    """The machine's load average (1, 5, 15 min), printed beside every ratio: the machine is shared."""
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def fmt(times: list[float]) -> str:
    return "[" + ", ".join(f"{t:.2f}" for t in times) + "]"


def text_of_length(
    adapter: Any,
    n_tokens: int,
    sentence: str = "the acting was wonderful but the plot was thin "
    "and the ending made no sense at all , yet i still enjoyed most of it . ",
) -> str:
    """A text that encodes to exactly ``n_tokens`` tokens (specials included) for ``adapter``."""
    words = (sentence * (n_tokens // 4 + 2)).split()
    lo, hi = 1, len(words)
    while lo < hi:  # the longest prefix that fits
        mid = (lo + hi + 1) // 2
        if len(adapter.tokenizer(" ".join(words[:mid]))["input_ids"]) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    text = " ".join(words[:lo])
    got = len(adapter.tokenizer(text)["input_ids"])
    if got != n_tokens:
        print(f"  (note: text has {got} tokens, asked {n_tokens})")
    return text
