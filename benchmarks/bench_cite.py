"""``cite``'s cost at retrieval length: each method's time on one context of ``--tokens`` tokens in ``--sources``
passages (SmolLM2-135M, one process, so the ratios hold on a shared machine), beside one plain forward of
the context (the unit). The issue's figures: AttnTrace one forward; ContextCite with 32 ablations <= 5x
AttnTrace through prefix reuse; leave-one-out at most one forward per source.

The context: distractor sentences of the shipped corpora (``data/citebench.distractors``) filled into
``--sources`` passages of about equal token counts, a planted fact ("The code word of Mira is falcon.")
inside the middle passage, the question asked with the answer cue; the answer is the planted word.

Measured (each once, after a warm-up forward):

* ``forward``: one fused forward of the whole text (answer included), no recording;
* ``attention rows`` = AttnTrace with one pass (``--attntrace-samples 0``): the chunked recording of the
  answer tokens' rows of every layer and head, then the top-K aggregation;
* ``attntrace x S``: AttnTrace with the authors' subsampling (S subsets of 40% of the sources);
* ``contextcite N``: N random masks through ``AnswerScore`` (the shared Scorer, prefix KV cache) + the Lasso;
* ``leave_one_out``: one row per source, prefix KV cache;
  with, for the ablations, the positions the model computed against the positions of the rows (what
  the prefix cache saved) and the positions a row shares with the full text before its first removed source.

    /work/bin/cpu python benchmarks/bench_cite.py --tokens 4096 --sources 32 --out benchmarks/results/cite_speed_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

import numpy as np
import torch
from common import load, threads

from streetlamp.commands.cite.run import greedy_answer
from streetlamp.data.citebench import distractors
from streetlamp.methods import citation as C
from streetlamp.models.adapter import Inputs
from streetlamp.models.chunked import fused_long
from streetlamp.models.loading import load as load_model

FACT, QUESTION, CUE, ANSWER = (
    "The code word of Mira is falcon.",
    "What is the code word of Mira?",
    "The code word of Mira is",
    "falcon",
)


def passages(adapter, n_tokens: int, n_sources: int) -> list[str]:  # noqa: ANN001
    """``n_sources`` passages of distractor sentences, about equal in tokens, the whole text about
    ``n_tokens`` tokens (head, question and answer included); the fact inside the middle passage."""
    lay = C.layout(adapter, [], QUESTION, prefix=CUE)
    per = (n_tokens - lay.n_tokens - len(C.answer_ids(adapter, ANSWER))) // n_sources
    pool = iter(distractors(0))
    out = []
    for i in range(n_sources):
        sents: list[str] = [FACT] if i == n_sources // 2 else []
        while True:
            s = next(pool)
            if len(C._ids(adapter, " ".join([*sents, s]) + "\n")) > per:
                break
            sents.append(s)
        out.append(" ".join(sents))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--sources", type=int, default=32)
    ap.add_argument("--ablations", type=int, default=32)
    ap.add_argument("--attntrace-samples", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=None, help="token budget of a pass (default: streetlamp's)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--rows-only",
        action="store_true",
        help="the forward and the attention rows only (run under /usr/bin/time -v for the recording's peak memory)",
    )
    a = ap.parse_args()
    threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    res: dict = {"threads": torch.get_num_threads(), "load_start": load()}
    adapter = load_model("smollm2-135m")
    srcs = passages(adapter, a.tokens, a.sources)
    lay = C.layout(adapter, srcs, QUESTION, prefix=CUE)
    lay.answer = C.answer_ids(adapter, ANSWER)
    ids = lay.ids()
    res.update(n_tokens=lay.n_tokens, n_sources=lay.n_sources, source_tokens=[len(s) for s in lay.sources])
    print(f"{lay.n_tokens} tokens, {lay.n_sources} sources, {res['threads']} thread(s), {res['load_start']}")
    m = len(lay.answer)

    def forward() -> None:
        with torch.no_grad(), fused_long(adapter):
            adapter.prefix_forward(Inputs.from_ids(adapter, [ids], strings=False), tail=m + 1)

    forward()  # warm-up
    t0 = time.perf_counter()
    forward()
    res["forward_s"] = time.perf_counter() - t0
    print(f"forward: {res['forward_s']:.2f} s")
    greedy = greedy_answer(adapter, C.Layout(lay.head, lay.sources, lay.tail, []), 3)
    res["greedy_answer"] = adapter.tokenizer.decode(greedy)

    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-cite-{os.getpid()}"
    rows = list(range(lay.answer_start, lay.n_tokens))
    with C.counting(adapter) as c:
        att, _ = C.attention_rows(adapter, ids, rows, scratch / "rows")
        at1 = C.aggregate(C.mean_rows(att), lay.spans, 5)
    res["attntrace_1pass_s"] = c.seconds
    res["attntrace_1pass_top"] = int(C.ranking(at1)[0])
    print(f"attention rows / AttnTrace one pass: {c.seconds:.2f} s (top source {res['attntrace_1pass_top']})")

    if a.rows_only:
        res["rows_array_mib"] = att.nbytes / 2**20
        res["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(
            f"rows [{' x '.join(map(str, att.shape))}] float64 {res['rows_array_mib']:.1f} MiB; peak RSS {res['peak_rss_gib']:.2f} GiB; {load()}"
        )
        if a.out:
            a.out.write_text(json.dumps(res, indent=1) + "\n")
        return
    if a.attntrace_samples:
        with C.counting(adapter) as c:
            ats = C.attntrace(adapter, lay, scratch, a.attntrace_samples, 0.4, 5, 0, None)
        res["attntrace_sampled_s"], res["attntrace_sampled_passes"] = c.seconds, c.forward_passes
        res["attntrace_sampled_top"] = int(C.ranking(ats)[0])
        print(f"AttnTrace x{a.attntrace_samples} subsets: {c.seconds:.2f} s, {c.forward_passes} passes")

    score = C.AnswerScore(adapter, lay, a.batch_size)
    masks = C.random_masks(np.random.default_rng(0), a.ablations, lay.n_sources)

    def ablation_run(name: str, fn) -> np.ndarray:  # noqa: ANN001
        score.forget()
        sc = score.scorer
        p0, n0, r0 = sc.n_positions, sc.n_passes, sc.n_rows
        with C.counting(adapter) as c:
            out = fn()
        res[f"{name}_s"] = c.seconds
        res[f"{name}_passes"] = sc.n_passes - n0
        res[f"{name}_rows"] = sc.n_rows - r0
        res[f"{name}_positions_computed"] = sc.n_positions - p0
        return out

    def cc() -> np.ndarray:
        vals = score(masks)
        return C.lasso(masks.astype(np.float64), vals, 0.01)[0]

    w = ablation_run("contextcite", cc)
    kept_tokens = [lay.n_tokens - sum(len(s) for k, s in zip(mk, lay.sources) if not k) for mk in masks]
    shared = []
    for mk in masks:
        first = int(np.argmin(mk)) if not mk.all() else lay.n_sources
        shared.append(len(lay.head) + sum(len(s) for s in lay.sources[:first]))
    res["contextcite_row_tokens"] = int(sum(kept_tokens))
    res["contextcite_shared_prefix_tokens"] = int(sum(shared))
    res["contextcite_top"] = int(C.ranking(w)[0])
    print(
        f"ContextCite {a.ablations}: {res['contextcite_s']:.2f} s, {res['contextcite_passes']} passes, "
        f"{res['contextcite_positions_computed']} positions computed of {res['contextcite_row_tokens']} in its rows "
        f"({res['contextcite_shared_prefix_tokens']} before each row's first removed source)"
    )
    loo = ablation_run("leave_one_out", lambda: C.leave_one_out(score))
    res["leave_one_out_row_tokens"] = int(sum(lay.n_tokens - len(lay.sources[i]) for i in range(lay.n_sources)))
    res["leave_one_out_shared_prefix_tokens"] = int(
        sum(len(lay.head) + sum(len(s) for s in lay.sources[:i]) for i in range(lay.n_sources))
    )
    res["leave_one_out_top"] = int(C.ranking(loo)[0])
    print(
        f"leave-one-out: {res['leave_one_out_s']:.2f} s, {res['leave_one_out_passes']} passes, "
        f"{res['leave_one_out_positions_computed']} positions computed of {res['leave_one_out_row_tokens']}"
    )
    f = res["forward_s"]
    res["ratios"] = {
        "attntrace_1pass_over_forward": res["attntrace_1pass_s"] / f,
        "contextcite_over_attntrace_1pass": res["contextcite_s"] / res["attntrace_1pass_s"],
        "contextcite_over_forward": res["contextcite_s"] / f,
        "leave_one_out_over_forward_per_source": res["leave_one_out_s"] / f / lay.n_sources,
    }
    if a.attntrace_samples:
        res["ratios"]["contextcite_over_attntrace_sampled"] = res["contextcite_s"] / res["attntrace_sampled_s"]
        res["ratios"]["attntrace_sampled_over_forward"] = res["attntrace_sampled_s"] / f
    res["planted_source"] = lay.n_sources // 2
    res["load_end"] = load()
    res["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    for k, v in res["ratios"].items():
        print(f"  {k}: {v:.2f}")
    print(res["load_end"], f"peak RSS {res['peak_rss_gib']:.2f} GiB")
    if a.out:
        a.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
