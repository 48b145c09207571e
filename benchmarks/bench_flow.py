"""Attention flow: streetlamp's exact layered max-flow vs the networkx reference, same process.

The reference is what Abnar & Zuidema's code does: build the networkx graph once, then one
``maximum_flow_value`` per (output, input) pair, with ``flow_func=edmonds_karp`` (their choice);
networkx's default (preflow_push) is timed too. At 32 tokens the reference is timed on a random
sample of pairs and extrapolated to all n² pairs (printed as such).

    nice .venv/bin/python benchmarks/bench_flow.py [--sample 24]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import networkx as nx
import numpy as np
from networkx.algorithms.flow import edmonds_karp, preflow_push

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import text_of_length, threads, timeit  # noqa: E402

from streetlamp.methods.attention import record_attention  # noqa: E402
from streetlamp.methods.maxflow import layered_max_flow, networkx_graph  # noqa: E402
from streetlamp.methods.rollout import Flow, residual_attention  # noqa: E402
from streetlamp.models.adapter import ModelAdapter, Target  # noqa: E402


def classifier() -> tuple[ModelAdapter, str]:
    import streetlamp

    try:
        return streetlamp.load("minilm-sentiment"), "minilm-sentiment"
    except Exception as e:  # the trained head may not be there yet: the encoder's attention is the same
        from streetlamp.models.minilm import build_minilm_classifier

        print(f"  (minilm-sentiment not loadable: {str(e).splitlines()[0][:80]}; using the MiniLM base encoder)")
        return ModelAdapter(*build_minilm_classifier(None), "minilm-base"), "minilm-base"


def caps_for(adapter: ModelAdapter, n: int) -> np.ndarray:
    inputs = adapter.encode(text_of_length(adapter, n))
    _, att, _ = record_attention(adapter, inputs)
    return residual_attention(att[0].double().numpy())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sample", type=int, default=24, help="networkx pairs timed at 32 tokens")
    args = ap.parse_args()
    threads()
    adapter, name = classifier()
    layered_max_flow(np.full((2, 3, 3), 1 / 3))  # load the compiled kernel (numba cache) before timing
    print(f"model: {name} ({adapter.n_layers} layers x {adapter.n_heads} heads)")

    caps = caps_for(adapter, 32)
    L, n, _ = caps.shape
    g = networkx_graph(caps)
    rng = np.random.default_rng(0)
    pairs = [(int(i), int(j)) for i, j in zip(rng.integers(0, n, args.sample), rng.integers(0, n, args.sample))]
    ours_t, times, full = timeit(lambda: layered_max_flow(caps), repeat=3)
    res = {}
    for fname, func in (
        ("edmonds_karp (reference code)", edmonds_karp),
        ("preflow_push (networkx default)", preflow_push),
    ):
        t0 = time.perf_counter()
        vals = [nx.maximum_flow_value(g, (0, j), (L, i), flow_func=func) for i, j in pairs]
        per_pair = (time.perf_counter() - t0) / len(pairs)
        err = max(abs(v - full[i, j]) for v, (i, j) in zip(vals, pairs))
        res[fname] = per_pair
        print(
            f"32 tokens, {L} layers: networkx {fname}: {per_pair * 1e3:.1f} ms/pair x {n * n} pairs = "
            f"{per_pair * n * n:.1f} s (extrapolated from {len(pairs)} pairs); max |diff| vs ours {err:.1e}"
        )
    print(f"32 tokens, {L} layers: streetlamp all {n * n} pairs: {ours_t:.3f} s (median of {times})")
    for fname, per_pair in res.items():
        print(f"  speed-up vs {fname}: {per_pair * n * n / ours_t:,.0f}x")
    m = Flow(rows="all")
    enc = adapter.encode(text_of_length(adapter, 32))
    t_method, _, _ = timeit(lambda: m.attribute(adapter, enc, target=Target()), repeat=3)
    print(f"  Flow(rows='all').attribute end to end (forward + flow): {t_method:.3f} s")

    print("cost growth (real attention, explained row = [CLS], and all pairs):")
    for n in (16, 32, 64, 128):
        c = caps_for(adapter, n)
        c12 = np.concatenate([c, c])  # 12 layers: MiniLM's 6 layers stacked twice
        t_row, _, _ = timeit(lambda: layered_max_flow(c, [0]), repeat=3)
        t_row12, _, _ = timeit(lambda: layered_max_flow(c12, [0]), repeat=3)
        line = f"  n={n:4d}: row {c.shape[0]} layers {t_row * 1e3:8.1f} ms, row 12 layers {t_row12 * 1e3:8.1f} ms"
        if n <= 64:
            t_all, _, _ = timeit(lambda: layered_max_flow(c), repeat=1, warmup=0)
            line += f", all pairs {c.shape[0]} layers {t_all:6.2f} s"
        print(line)
    # the acceptance case: [CLS] row, 128 tokens, 12 layers (MiniLM x2) and a random 12-layer BERT
    c12 = np.concatenate([caps_for(adapter, 128)] * 2)
    t, ts, _ = timeit(lambda: layered_max_flow(c12, [0]), repeat=3)
    print(f"128 tokens, 12 layers (MiniLM's 6 layers stacked twice), [CLS] row: {t:.3f} s (median of {ts})")
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    rand = ModelAdapter(
        BertForSequenceClassification(
            BertConfig(num_hidden_layers=12, hidden_size=384, num_attention_heads=12, intermediate_size=1536)
        ).eval(),
        adapter.tokenizer,
        "bert-random-12",
    )
    c = caps_for(rand, 128)
    t, ts, _ = timeit(lambda: layered_max_flow(c, [0]), repeat=3)
    print(f"128 tokens, 12 layers (random-init 12-layer BERT), [CLS] row: {t:.3f} s (median of {ts})")


if __name__ == "__main__":
    main()
