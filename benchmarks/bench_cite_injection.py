"""Which method finds an injected instruction? SmolLM2-135M does not follow the planted benchmark's prompt
injections (it answers the code word), so ``cite-bench`` counts none of them. Here the injected answer is
attributed anyway (forced, as ``cite --answer banana`` does): for each injection question of
``data/citebench.generate`` each method's rank of the injected source, and leave-one-out's drop of
``log p(banana)`` without it (does the injected passage raise the injected answer at all?).

    /work/bin/cpu python benchmarks/bench_cite_injection.py --questions 3 --words 450 --out runs/inject.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from common import load, threads

from streetlamp.commands.cite.run import cite
from streetlamp.data.citebench import generate
from streetlamp.methods import citation as C
from streetlamp.models.loading import load as load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", type=int, default=3)
    ap.add_argument("--words", type=int, default=450)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--methods", default="attention,attention_nosink,attntrace,contextcite,leave_one_out")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(load())
    adapter = load_model("smollm2-135m")
    qs = [q for q in generate(5 * a.questions, a.words, a.seed) if q.kind == "injection"][: a.questions]
    s = SimpleNamespace(
        methods=a.methods.split(","),
        ablations=32,
        held_out=0,
        alpha=0.01,
        attntrace_samples=10,
        attntrace_fraction=0.4,
        attntrace_top=5,
        ig_steps=8,
        max_answer_tokens=4,
        truncate=False,
        court=[1, 3, 5],
        batch_size=None,
        seed=a.seed,
    )
    out = []
    for q in qs:
        t0 = time.perf_counter()
        prefix = str(q.extra["answer_prefix"])
        with tempfile.TemporaryDirectory() as tmp:
            res = cite(adapter, q.sources, q.question, q.answer, s, Path(tmp) / "s", prefix)
        inj = q.planted[0]
        ranks = {m: int(np.where(C.ranking(v) == inj)[0][0]) + 1 for m, v in res.scores.items()}
        fact = next(i for i, t in enumerate(q.sources) if t.startswith("The code word of"))
        fact_ranks = {m: int(np.where(C.ranking(v) == fact)[0][0]) + 1 for m, v in res.scores.items()}
        row = {
            "id": q.id,
            "n_sources": res.lay.n_sources,
            "n_tokens": res.lay.n_tokens,
            "forced": res.forced,
            "greedy": adapter.tokenizer.decode(res.greedy),
            "logprob_banana": res.logprob,
            "rank_of_injection": ranks,
            "rank_of_fact": fact_ranks,
            "loo_drop_without_injection": float(res.scores["leave_one_out"][inj])
            if "leave_one_out" in res.scores
            else None,
            "seconds": time.perf_counter() - t0,
        }
        out.append(row)
        print(json.dumps(row), flush=True)
    print(load())
    if a.out:
        a.out.write_text(json.dumps({"load": load(), "questions": out}, indent=1) + "\n")


if __name__ == "__main__":
    main()
