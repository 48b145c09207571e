"""Mixture-of-experts sites and the expert audit (issue 40), same process:

1. recording every router and expert site (``router.logits``, ``router.weights``, ``experts.out``, and
   ``shared_expert.out`` where the family has one) against a plain forward: the ratio must stay <= 1.3;
2. the expert audit's per-token removals: forwards made (one per (layer, expert, token batch), never one per
   token or per text) and seconds, beside the one-forward-per-token count it replaces.

    nice .venv/bin/python benchmarks/bench_experts.py [--family mixtral] [--d-model 256] [--layers 4] [--experts 4]

The two forwards alternate (plain, recording, plain, ...) and the ratio is taken per pair: its median and range
are printed beside the load average (the machine is shared; a pair shares its load).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import load, text_of_length, threads, timeit  # noqa: E402

from streetlamp.interventions import experts as X  # noqa: E402
from streetlamp.models.adapter import ModelAdapter  # noqa: E402
from streetlamp.models.sites import EXPERT_SITES  # noqa: E402
from streetlamp.models.tiny import tiny_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="mixtral")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=48)  # the tiny configs take 64 positions
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--experts", type=int, default=4)  # the tiny recipes' 4; more sets the recipe's count
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--no-audit", action="store_true")
    # 1: on this shared 2-core machine two threads per op spin against the other jobs (a plain forward 2 s, not
    # 22 ms), which measures the thread pool, not the recording; --threads 2 for a quiet machine
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--audit-texts", type=int, default=8)
    ap.add_argument("--audit-tokens", type=int, default=16)
    a = ap.parse_args()
    n = threads(a.threads)
    from streetlamp.models.families import moe as recipes

    recipes.TINY_EXPERTS, recipes.TINY_TOP_K = a.experts, a.top_k  # read by the tiny recipes when they build
    model, tok = tiny_model(a.family, seed=0, layers=a.layers, heads=8, d_model=a.d_model)
    adapter = ModelAdapter(model.eval(), tok, f"tiny-{a.family}")
    text = text_of_length(adapter, a.tokens)
    inputs = adapter.encode([text] * a.batch)
    moe = adapter.family.experts
    assert moe is not None
    kinds = [s for s in EXPERT_SITES if s != "shared_expert.out" or moe.shared_expert is not None]
    sites = [f"layers.{l}.{k}" for l in range(adapter.n_layers) for k in kinds]
    print(
        f"{a.family}: {a.layers} layers, d_model {a.d_model}, {X.n_experts_of(adapter)} experts, top-"
        f"{adapter.hf_model.config.num_experts_per_tok}; batch {a.batch} x {inputs.input_ids.shape[1]} tokens; "
        f"{n} threads; {load()}"
    )
    for _ in range(2):  # warm up both
        adapter.forward(inputs)
        f = adapter.forward(inputs, record=sites)
    assert all(s in f.cache for s in sites)
    tp, tr = [], []
    for _ in range(a.repeat):  # interleaved: each pair runs under the same load
        t0 = time.perf_counter()
        adapter.forward(inputs)
        t1 = time.perf_counter()
        adapter.forward(inputs, record=sites)
        tp.append(t1 - t0)
        tr.append(time.perf_counter() - t1)
    ratios = sorted(r / p for p, r in zip(tp, tr, strict=True))
    plain, rec, ratio = statistics.median(tp), statistics.median(tr), statistics.median(ratios)
    print(
        f"plain forward      {plain * 1e3:.1f} ms (median of {a.repeat}; range {min(tp) * 1e3:.1f}-{max(tp) * 1e3:.1f})"
    )
    print(f"recording {len(sites)} sites {rec * 1e3:.1f} ms (range {min(tr) * 1e3:.1f}-{max(tr) * 1e3:.1f})")
    print(
        f"ratio per pair: median {ratio:.2f}, range {ratios[0]:.2f}-{ratios[-1]:.2f}, quartiles "
        f"{ratios[len(ratios) // 4]:.2f}-{ratios[(3 * len(ratios)) // 4]:.2f} (target <= 1.30); {load()}"
    )
    if a.no_audit:
        return

    texts = [text_of_length(adapter, a.audit_tokens + 2 * i) for i in range(a.audit_texts)]
    ins = adapter.encode(texts)
    ins = ins.select(range(len(texts)))
    sec, ts, res = timeit(lambda: X.audit(adapter, ins, tokens=True), repeat=1, warmup=0)
    n_tok = res.token_rows.shape[0]
    L, E = adapter.n_layers, X.n_experts_of(adapter)
    print(
        f"audit: {a.audit_texts} texts, {res.n_tokens} tokens, {L * E} (layer, expert): {res.forwards} forwards "
        f"in {sec:.1f} s; per-token removals {n_tok} (one forward each would be {1 + L * E + n_tok}; one per text "
        f"{1 + L * E + L * E * a.audit_texts}); {load()}"
    )


if __name__ == "__main__":
    with torch.no_grad():
        main()
