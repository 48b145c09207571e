"""How many gradient evaluations IG needs on the default classifier, by quadrature rule.

    .venv/bin/python benchmarks/bench_ig_nodes.py [--texts 10]

Why the speed target "IG at relative completeness error <= 1e-3 in at most 0.5x the time of
Captum's 50-step LayerIntegratedGradients" is a question of evaluations: one gradient evaluation
costs the same on both sides (~80% of a pass is matrix products, by the torch profiler), so 0.5x
allows at most 25 evaluations. This prints, for Clenshaw–Curtis (n intervals = n+1 points) and
Gauss–Legendre (n points) at fixed n, the relative completeness error and the largest token error
against a 256-point Gauss–Legendre reference, over the benchmark's 32- and 128-token texts and
``--texts`` movie sentences (seeded sample). Same baseline as the benchmark: [PAD] everywhere.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
from bench_ig import classifier  # noqa: E402
from common import text_of_length, threads  # noqa: E402

from streetlamp.data.loaders import load_dataset  # noqa: E402
from streetlamp.methods.ig import IntegratedGradients  # noqa: E402
from streetlamp.models.adapter import Target  # noqa: E402

GRID = [("clenshaw_curtis", n) for n in (16, 24, 32, 48)] + [("gauss_legendre", n) for n in (16, 24, 32, 48, 50)]


def evaluation_cost(a) -> None:
    """What one gradient evaluation costs: ms per row in float32 and under CPU bfloat16 autocast,
    and the share of a pass the torch profiler puts in matrix products."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    from streetlamp.methods.gradient import embed_ids, scores_at

    for n, rows in ((32, 25), (128, 16)):
        ids = a.encode(text_of_length(a, n)).input_ids[0]
        emb = embed_ids(a, ids)[None].repeat(rows, 1, 1)
        t = Target(index=1)

        def run(bf16: bool) -> float:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                scores_at(a, ids, emb, 1, t, grad=True)
                ts = []
                for _ in range(5):
                    t0 = time.perf_counter()
                    scores_at(a, ids, emb, 1, t, grad=True)
                    ts.append(time.perf_counter() - t0)
            return sorted(ts)[2] / rows

        f32, b16 = run(False), run(True)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            scores_at(a, ids, emb, 1, t, grad=True)
        ev = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in ev)
        gemm = sum(e.self_cpu_time_total for e in ev if e.key in ("aten::mm", "aten::addmm", "aten::bmm"))
        print(
            f"  {n} tokens: {f32 * 1e3:.1f} ms per gradient evaluation (float32), {b16 * 1e3:.1f} ms under "
            f"bfloat16 autocast ({f32 / b16:.2f}x); matrix products {gemm / total:.0%} of a pass",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", type=int, default=10, help="movie sentences besides the two benchmark texts")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--quantity",
        choices=["prob", "logit", "logprob"],
        default="prob",
        help="the explained quantity F of the predicted class",
    )
    ap.add_argument("--no-cost", action="store_true", help="skip the cost-per-evaluation part")
    args = ap.parse_args()
    threads()
    a = classifier()
    if not args.no_cost:
        print("cost of one gradient evaluation:")
        evaluation_cost(a)
    texts = [text_of_length(a, 32), text_of_length(a, 128)]
    try:
        movies = [e.text for e in load_dataset("movies").examples]
        texts += random.Random(args.seed).sample(movies, args.texts)
    except Exception as e:  # noqa: BLE001 - the data package is optional here
        print(f"(movie sentences unavailable: {e})")
    rel = {g: [] for g in GRID}
    tok = {g: [] for g in GRID}
    for text in texts:
        inputs = a.encode(text)
        t = Target(index=int(a.forward(inputs).logits.argmax()), quantity=args.quantity)
        ref = IntegratedGradients(rule="gauss_legendre", steps=256, adaptive=False, keep_special=False)
        r = ref.attribute(a, inputs, target=t)[0]
        df = abs(r.info["F_input"] - r.info["F_baseline"])
        for rule, n in GRID:
            ig = IntegratedGradients(rule=rule, steps=n, adaptive=False, keep_special=False)
            e = ig.attribute(a, inputs, target=t)[0]
            rel[(rule, n)].append(e.info["relative_completeness_error"])
            tok[(rule, n)].append(float(np.abs(e.scores - r.scores).max()) / df)
        print(
            f"  {len(inputs.tokens[0]):>3} tokens: reference rel. completeness error "
            f"{r.info['relative_completeness_error']:.1e}",
            flush=True,
        )
    print(f"\n{len(texts)} texts, F = {args.quantity} of the predicted class; errors relative to |F(x) - F(baseline)|")
    print(
        f"{'rule':<16} {'n':>3} {'evals':>5}  {'completeness: median':>21} {'max':>8} {'<=1e-3':>7}  "
        f"{'token error: median':>20} {'max':>8}"
    )
    for rule, n in GRID:
        ev = n + 1 if rule == "clenshaw_curtis" else n
        c, k = np.array(rel[(rule, n)]), np.array(tok[(rule, n)])
        print(
            f"{rule:<16} {n:>3} {ev:>5}  {np.median(c):>21.1e} {c.max():>8.1e} {np.mean(c <= 1e-3):>7.0%}  "
            f"{np.median(k):>20.1e} {k.max():>8.1e}"
        )


if __name__ == "__main__":
    main()
