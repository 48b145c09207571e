"""Value zeroing: batched zeroings that stop after layer l vs the plain loop (one zeroing per
full forward pass), measured in the same process; norm and ALTI times beside them.

    .venv/bin/python benchmarks/bench_decomposition.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import timeit  # noqa: E402

import streetlamp  # noqa: E402
from streetlamp.methods.context_mixing import Alti, Norm, ValueZeroing  # noqa: E402
from streetlamp.models.adapter import Target  # noqa: E402
from tests.models.test_decomposition import plain_value_zeroing  # noqa: E402  (the test's independent loop)

TEXT = "the acting was wonderful but the plot was thin and the ending made no sense at all ."


def main() -> None:
    torch.set_num_threads(2)
    a = streetlamp.load("minilm-sentiment")
    enc = a.encode(TEXT)
    print(f"minilm-sentiment, {enc.lengths[0]} tokens, median of 3")
    for m in (Norm(), Alti()):
        print(f"{m.name:<14} {timeit(lambda: m.attribute(a, enc, target=Target()))[0]:.3f} s")
    ours = timeit(lambda: ValueZeroing().attribute(a, enc, target=Target()))[0]
    plain = timeit(lambda: plain_value_zeroing(a, TEXT), repeat=1)[0]
    print(f"value_zeroing  {ours:.3f} s   plain loop {plain:.3f} s   ratio {plain / ours:.1f}x faster")


if __name__ == "__main__":
    main()
