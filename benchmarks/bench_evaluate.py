"""``evaluate`` per example: the shared-work path (layers below an attention edit run once,
evaluation/frozen.py; duplicate erasure rows run once) against the plain path (every layer of every
edited row, every planned row), in one process, alternating, on the same examples; the rows must agree.

    .venv/bin/python benchmarks/bench_evaluate.py [--model minilm-sentiment] [--examples 3] [--repeat 3] [--profile]

Three methods (attention, integrated_gradients, occlusion) and every metric evaluate computes (erasure,
agreement, decision flip, counterfactual and uniform attention). ``--profile`` prints cProfile's top
functions of one shared-work run (where the time of an example goes).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
import torch  # noqa: E402
from common import load, threads  # noqa: E402

import streetlamp  # noqa: E402
import streetlamp.evaluation.counterfactual as cf_mod  # noqa: E402
import streetlamp.evaluation.flip as flip_mod  # noqa: E402
import streetlamp.evaluation.pipeline as pipe_mod  # noqa: E402
from streetlamp.data.loaders import load_dataset  # noqa: E402
from streetlamp.evaluation.common import output_map  # noqa: E402
from streetlamp.evaluation.pipeline import ChunkExample, EvalSettings, evaluate_chunk  # noqa: E402


@contextlib.contextmanager
def plain_path():  # noqa: ANN201
    """Every layer of every edited row and every planned erasure row, as before frozen.py and the dedupe."""

    def prob_of(adapter, rows, budget, index, edit=None):  # noqa: ANN001, ANN202
        idx = torch.as_tensor(np.asarray(index, np.int64))
        fn = lambda g, p: p.gather(1, idx[g].view(-1, 1).to(p.device))  # noqa: E731
        return output_map(adapter, rows, budget, fn, 1, edit)[:, 0]

    saved = (flip_mod.frozen_below, cf_mod.frozen_below, pipe_mod.output_prob_of)
    null = lambda *_: contextlib.nullcontext()  # noqa: E731
    flip_mod.frozen_below, cf_mod.frozen_below, pipe_mod.output_prob_of = null, null, prob_of
    try:
        yield
    finally:
        flip_mod.frozen_below, cf_mod.frozen_below, pipe_mod.output_prob_of = saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="minilm-sentiment")
    ap.add_argument("--examples", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--methods", default="attention,integrated_gradients,occlusion")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    print(f"torch threads: {threads(1)}  [{load()}]")
    a = streetlamp.load(args.model)
    texts = random.Random(1).sample([e.text for e in load_dataset("movies").examples], args.examples)
    examples = [
        ChunkExample(index=i, id=f"ex{i}", ids=a.tokenizer(t)["input_ids"], text=t, gold=0) for i, t in enumerate(texts)
    ]
    s = EvalSettings(methods=args.methods.split(","))
    times: dict[str, list[float]] = {"plain": [], "shared": []}
    out = {}
    for r in range(args.repeat + 1):  # the first round warms up; alternating so drift hits both alike
        for name in ("plain", "shared"):
            ctx = plain_path() if name == "plain" else contextlib.nullcontext()
            with ctx:
                t0 = time.perf_counter()
                out[name] = [evaluate_chunk(a, [e], s)[0] for e in examples]
                if r:
                    times[name].append((time.perf_counter() - t0) / len(examples))
    diff = max(
        abs(x[3] - y[3])
        for p, q in zip(out["plain"], out["shared"])
        for x, y in zip(p, q)
        if not (np.isnan(x[3]) and np.isnan(y[3]))
    )
    tp, ts = statistics.median(times["plain"]), statistics.median(times["shared"])
    print(f"{a.name}, {args.examples} examples, methods {args.methods}, every metric; seconds per example, medians:")
    print(f"  plain path {tp:.2f} s, shared work {ts:.2f} s; largest difference of a metric {diff:.1e}")
    print(f"  RATIO shared / plain = {ts / tp:.2f} (target <= 0.5)  [{load()}]")
    if args.profile:
        pr = cProfile.Profile()
        pr.enable()
        evaluate_chunk(a, examples[:1], s)
        pr.disable()
        pstats.Stats(pr).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
