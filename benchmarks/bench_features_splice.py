"""A spliced forward's cost (issue 38, speed): SmolLM2-135M with a transcoder at every layer, every feature site
recorded (each layer's MLP output read as ``decode(encode(x)) + error``), against the plain forward of the same
batch, in one process, interleaved pairs.

The transcoders are bench_graph's random set (encoder biases calibrated to ``--l0`` active latents per token):
the cost of encode/decode does not depend on what the latents mean.

    OMP_NUM_THREADS=1 nice .venv/bin/python benchmarks/bench_features_splice.py [--width 4096] [--pairs 11]

Prints the median per-pair ratio (spliced / plain), its quartiles and range, the medians in ms and the load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_graph import calibrated_set  # noqa: E402
from common import load, text_of_length, threads  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--l0", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=11)
    a = ap.parse_args()
    threads(1)
    import streetlamp
    from streetlamp.models.dictionaries import load_features
    from streetlamp.models.features import feature_site

    adapter = streetlamp.load(a.model)
    text = text_of_length(adapter, a.tokens)
    with tempfile.TemporaryDirectory() as tmp:
        calibrated_set(adapter, text, a.width, a.l0, Path(tmp) / "tc")
        fs = load_features(Path(tmp) / "tc", adapter)
    inputs = adapter.encode([text] * a.batch)
    sites = [feature_site(d.layer, d.where) for d in fs]

    def plain() -> None:
        adapter.attach_features(None)
        adapter.forward(inputs)

    def spliced() -> None:
        adapter.attach_features(fs)
        adapter.forward(inputs, record=sites)

    ratios, tp, ts = [], [], []
    with torch.no_grad():
        plain(), spliced()  # warm-up
        for i in range(a.pairs):
            order = (plain, spliced) if i % 2 == 0 else (spliced, plain)
            got = {}
            for fn in order:
                t0 = time.perf_counter()
                fn()
                got[fn.__name__] = time.perf_counter() - t0
            tp.append(got["plain"])
            ts.append(got["spliced"])
            ratios.append(got["spliced"] / got["plain"])
    q = statistics.quantiles(ratios, n=4)
    print(
        f"spliced / plain forward, {a.model}, {len(sites)} transcoders of width {a.width} (L0 {a.l0}), batch "
        f"{a.batch} x {a.tokens} tokens, one thread, {a.pairs} interleaved pairs: median {statistics.median(ratios):.2f}x "
        f"(quartiles {q[0]:.2f}-{q[2]:.2f}, range {min(ratios):.2f}-{max(ratios):.2f}); plain "
        f"{1e3 * statistics.median(tp):.0f} ms, spliced {1e3 * statistics.median(ts):.0f} ms; {load()}"
    )


if __name__ == "__main__":
    main()
