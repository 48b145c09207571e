"""``evaluate`` per example: the shared-work path against the plain path, in one process, alternating, on the
same examples; the rows must agree.

* shared (today's evaluate): the unchanged texts run once (evaluation/pipeline.reference_pass), the layers below
  an attention edit run once per text (evaluation/frozen.py), duplicate erasure and decision-flip rows run once,
  scoring passes run the fused kernel where no attention is edited and split their padded batches by length
  (evaluation/common.py), and integrated gradients on a classifier use Clenshaw–Curtis
  (common.evaluate_params);
* plain (the path before issue 28 item 3): every layer of every edited row, every planned row, a pass of the
  unchanged texts per use, eager attention, batches by the budget alone, IG's default rule ``auto``;
* before (the path before issue 28): the plain path with IG's rule ``clenshaw_curtis``, so its IG is the shared
  path's: every row compares, and the ratio is the shared work alone.

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
import streetlamp.evaluation.common as common_mod  # noqa: E402
import streetlamp.evaluation.counterfactual as cf_mod  # noqa: E402
import streetlamp.evaluation.flip as flip_mod  # noqa: E402
import streetlamp.evaluation.pipeline as pipe_mod  # noqa: E402
from streetlamp.batching import group_by_budget  # noqa: E402
from streetlamp.data.loaders import load_dataset  # noqa: E402
from streetlamp.evaluation.common import output_map, output_probs  # noqa: E402
from streetlamp.evaluation.pipeline import ChunkExample, EvalSettings, evaluate_chunk  # noqa: E402


@contextlib.contextmanager
def plain_path():  # noqa: ANN201
    """Every layer of every edited row and every planned erasure row, as before frozen.py and the dedupe; the
    unchanged texts run once per use (output distribution, attention items, counterfactual pattern, each frozen
    record), every scoring pass runs eager attention and rows are grouped by the budget alone, as before the
    reference pass, the fused kernel and the length groups."""

    def separate_passes(adapter, inputs, sites, records, below):  # noqa: ANN001, ANN202
        probs = output_probs(adapter, inputs.rows(), None)
        fwd = adapter.forward(inputs, record=sites, keep_grad=True, grad=True)
        with torch.no_grad():  # the counterfactuals' own pass of the pattern (the same numbers as fwd's)
            adapter.forward(inputs, record=sites)
        return fwd, probs

    def prob_of(adapter, rows, budget, index, edit=None):  # noqa: ANN001, ANN202
        idx = torch.as_tensor(np.asarray(index, np.int64))
        fn = lambda g, p: p.gather(1, idx[g].view(-1, 1).to(p.device))  # noqa: E731
        return output_map(adapter, rows, budget, fn, 1, edit)[:, 0]

    def run_params(params, name, kind):  # noqa: ANN001, ANN202
        return dict(params.get(name, {}))  # IG: the method's default rule (auto), as before evaluate chose one

    def every_row(keys):  # noqa: ANN001, ANN202
        return list(range(len(keys))), np.arange(len(keys))

    names = [
        (flip_mod, "frozen_below"),
        (cf_mod, "frozen_below"),
        (pipe_mod, "output_prob_of"),
        (flip_mod, "unique_rows"),
        (pipe_mod, "reference_pass"),
        (common_mod, "fused_attention"),
        (common_mod, "length_groups"),
    ]
    names.append((pipe_mod, "evaluate_params"))
    saved = [getattr(m, n) for m, n in names]
    null = lambda *_: contextlib.nullcontext()  # noqa: E731
    for (m, n), v in zip(names, [null, null, prob_of, every_row, separate_passes, null, group_by_budget, run_params]):
        setattr(m, n, v)
    try:
        yield
    finally:
        for (m, n), v in zip(names, saved):
            setattr(m, n, v)


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
    # before issue 28: the plain path with IG's former default rule (Clenshaw–Curtis doubling from 16 steps)
    before = EvalSettings(methods=s.methods, method_params={"integrated_gradients": {"rule": "clenshaw_curtis"}})
    runs = {"before": (before, plain_path), "plain": (s, plain_path), "shared": (s, contextlib.nullcontext)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    out = {}
    for r in range(args.repeat + 1):  # the first round warms up; alternating so drift hits all alike
        for name, (settings, ctx) in runs.items():
            with ctx():
                t0 = time.perf_counter()
                out[name] = [evaluate_chunk(a, [e], settings)[0] for e in examples]
                if r:
                    times[name].append((time.perf_counter() - t0) / len(examples))

    def largest(x: str, y: str, skip: str | None = None) -> float:
        return max(
            abs(u[3] - v[3])
            for p, q in zip(out[x], out[y])
            for u, v in zip(p, q)
            if (skip is None or skip not in u[1]) and not (np.isnan(u[3]) and np.isnan(v[3]))
        )

    tb, tp, ts = (statistics.median(times[k]) for k in runs)
    print(f"{a.name}, {args.examples} examples, methods {args.methods}, every metric; seconds per example, medians:")
    print(
        f"  before (plain path, IG rule clenshaw_curtis) {tb:.2f} s, plain path (IG rule auto) {tp:.2f} s, shared work "
        f"{ts:.2f} s; largest difference of a metric shared vs before {largest('shared', 'before'):.1e} (every row), "
        f"vs plain {largest('shared', 'plain', 'integrated_gradients'):.1e} outside IG's rows (IG's rule differs: "
        "within its tolerance)"
    )
    print(f"  RATIO shared / plain = {ts / tp:.2f} (the path before item 3; target <= 0.5)  [{load()}]")
    print(f"  RATIO shared / before = {ts / tb:.2f} (the same IG on both sides: the shared work alone)  [{load()}]")
    if args.profile:
        pr = cProfile.Profile()
        pr.enable()
        evaluate_chunk(a, examples[:1], s)
        pr.disable()
        pstats.Stats(pr).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
