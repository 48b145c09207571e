"""Adaptive IG rules side by side: Clenshaw–Curtis (default) vs ``panels``, per text.

    .venv/bin/python benchmarks/bench_ig_rules.py --model smollm2-135m   # docs/examples/facts.csv
    .venv/bin/python benchmarks/bench_ig_rules.py --model minilm-sentiment  # 2 benchmark texts + 6 movie sentences

Prints, per text and rule, the gradient evaluations, seconds, the relative completeness error,
``token_change_vs_half_steps`` and whether the tolerance (1e-3) was met within 256 steps; then totals.
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import text_of_length, threads  # noqa: E402

import streetlamp  # noqa: E402
from streetlamp.data.loaders import load_dataset  # noqa: E402
from streetlamp.methods.ig import IntegratedGradients  # noqa: E402
from streetlamp.models.adapter import Target  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rules", default="clenshaw_curtis,panels")
    args = ap.parse_args()
    threads()
    a = streetlamp.load(args.model)
    if a.kind == "causal_lm":
        texts = [r["text"] for r in csv.DictReader(open(ROOT / "docs" / "examples" / "facts.csv"))]
    else:
        texts = [text_of_length(a, 32), text_of_length(a, 128)]
        texts += random.Random(1).sample([e.text for e in load_dataset("movies").examples], 6)
    rules = args.rules.split(",")
    total = {r: [0, 0.0, 0] for r in rules}
    for text in texts:
        row = [f"{text[:30]:30}"]
        for rule in rules:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t0 = time.perf_counter()
                e = IntegratedGradients(rule=rule).attribute(a, a.encode(text), target=Target())[0]
                dt = time.perf_counter() - t0
            i = e.info
            total[rule][0] += i["gradient_evaluations"]
            total[rule][1] += dt
            total[rule][2] += bool(i["converged"])
            row.append(
                f"{rule}: {i['gradient_evaluations']:>3} evals {dt:5.2f}s rel {i['relative_completeness_error']:.1e} "
                f"tok {i['token_change_vs_half_steps']:.1e} {'ok' if i['converged'] else 'NOT converged'}"
            )
        print("  ".join(row), flush=True)
    for rule, (ev, secs, ok) in total.items():
        print(f"{rule}: {ev} gradient evaluations, {secs:.1f} s, converged on {ok} of {len(texts)}")


if __name__ == "__main__":
    main()
