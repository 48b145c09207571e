"""Soft erasure (Soft-NC/NS + pi-Soft-NC/NS, evaluation/soft.py) vs the hard erasure metrics
(ERASER comprehensiveness/sufficiency, AOPC, deletion/insertion, evaluation/erasure.py) for the same
examples and explanations, in one process. Target (issue 27): soft within 2x hard at the default
sample count.

    /work/bin/cpu .venv/bin/python benchmarks/bench_soft.py [--n 32] [--samples 10] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import fmt, threads, timeit  # noqa: E402

import streetlamp  # noqa: E402
from streetlamp.data import load_dataset  # noqa: E402
from streetlamp.evaluation.common import output_prob_of, output_probs  # noqa: E402
from streetlamp.evaluation.erasure import ErasurePlan  # noqa: E402
from streetlamp.evaluation.soft import DEFAULT_PI, DEFAULT_SAMPLES, soft_erasure  # noqa: E402
from streetlamp.methods.removal import Removal  # noqa: E402
from streetlamp.models.adapter import Inputs, Target  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=32, help="movies sentences")
    ap.add_argument("--samples", type=int, default=DEFAULT_SAMPLES)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"threads {threads()}")
    a = streetlamp.load("minilm-sentiment")
    ds = load_dataset("movies")
    texts = [e.text for e in ds.examples[:: max(1, len(ds.examples) // args.n)][: args.n]]
    ids = [a.tokenizer(t)["input_ids"] for t in texts]
    inputs = Inputs.from_ids(a, ids, texts)
    probs = output_probs(a, ids, None)
    pred = probs.argmax(-1)
    f_full = probs[np.arange(len(ids)), pred]
    from streetlamp.methods.registry import get_method

    exps = get_method("attention").attribute(a, inputs, target=Target())
    scores = {"attention": [np.asarray(x.scores, np.float64) for x in exps]}
    specials = [a.special_mask(r) for r in ids]
    removal = Removal.of(a, None)

    def hard() -> None:
        plans = [ErasurePlan.build(ids[b], scores["attention"][b], specials[b], None, removal) for b in range(len(ids))]
        rows = [r for p in plans for r in p.rows]
        owner = np.repeat(np.arange(len(ids)), [len(p.rows) for p in plans])
        f = output_prob_of(a, rows, None, pred[owner])
        start = 0
        for b, p in enumerate(plans):
            p.metrics(float(f_full[b]), f[start : start + len(p.rows)])
            start += len(p.rows)

    def soft() -> None:
        soft_erasure(
            a, ids, scores, specials, removal, f_full, pred, DEFAULT_PI, args.samples, list(range(len(ids))), None
        )

    th, th_all, _ = timeit(hard, repeat=args.repeat)
    ts, ts_all, _ = timeit(soft, repeat=args.repeat)
    n_tok = np.mean([len(r) for r in ids])
    print(f"{len(ids)} movies sentences (mean {n_tok:.1f} tokens), attention scores, samples {args.samples}")
    print(f"hard erasure (32 rows per example, deleted tokens): {th:.2f} s {fmt(th_all)}")
    print(f"soft erasure ({4 * args.samples + 1} rows per example, full length): {ts:.2f} s {fmt(ts_all)}")
    print(f"soft / hard = {ts / th:.2f} (target <= 2)")


if __name__ == "__main__":
    main()
