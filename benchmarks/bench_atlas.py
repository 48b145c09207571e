"""The atlas' cost model, measured (issue 25's target: SmolLM2-135M, 270 heads x 2,000 sequences of up to 64
tokens with exact ablation of at least 5% of (head, sequence) pairs, within one hour on this 2-core machine).

Passes (``commands/atlas/run.py``), each chunk by chunk, chunks holding sequences of like length (a batch pads
to its longest row):

1. statistics: one clean forward per chunk, patterns and attn.z recorded: ``t_s`` per sequence;
2. estimate: ONE forward + backward per chunk gives every head's attribution estimate, the clean
   prediction and (decoders with a readout) the DLA, batched from the same forward: ``t_e`` per sequence;
3. exact: a clean forward of the chunk's rows that have pairs, then per layer ``l`` one pass per batch of
   pairs (one row per (head, sequence); the rows of like length together; several heads of the layer in
   one pass), started at ``l`` (``atlas_midstack``, ``(L - l) / L`` of the layers) plus the LM head and
   the next-token distributions at every position (decoders' ``kl_mean``/``dloss``): ``t_x`` per pair.

    T(N, s) = N (t_s + t_e) + (s N L H + top L H) t_x          (one core)

With ``P`` worker processes (``--engine ray --workers P``; chunks are independent within a pass) each
term divides by about ``P``. This script runs the real runner (``run_atlas``) on ``--n`` sequences with
``--exact-top 0``, times each pass from inside (the ``work`` of each chunk), measures the mid-stack
saving on one chunk (the same pairs from layer ``l`` and from layer 0), and extrapolates to ``--full``.

    /work/bin/cpu .venv/bin/python benchmarks/bench_atlas.py [--n 64] [--full 2000] [--share 0.05]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import threads  # noqa: E402

import streetlamp.commands.atlas.run as R  # noqa: E402
from streetlamp.commands.atlas import AtlasSettings  # noqa: E402
from streetlamp.interventions import atlas_effects as E  # noqa: E402
from streetlamp.interventions import atlas_midstack as M  # noqa: E402
from streetlamp.interventions.atlas_chunks import Chunk, Context, replacements, stats_chunk  # noqa: E402
from streetlamp.models.adapter import Inputs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--full", type=int, default=2000)
    ap.add_argument("--share", type=float, default=0.05)
    ap.add_argument("--top", type=int, default=5, help="top-estimated pairs per head at full size")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data", default="movies,tweets,drugs")
    args = ap.parse_args()
    threads(1)  # one thread: the machine is shared (OMP_NUM_THREADS=1 under /work/bin/cpu)
    import streetlamp

    a = streetlamp.load(args.model)
    L, H = a.n_layers, a.n_heads
    spent: dict[str, float] = defaultdict(float)
    real_work = R.work

    def timed(adapter, job, ctx):
        t0 = time.perf_counter()
        out = real_work(adapter, job, ctx)
        spent[job[0]] += time.perf_counter() - t0
        return out

    R.work = timed
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        s = AtlasSettings(
            data=args.data, sample=args.n, truncate=True, max_tokens=args.tokens, exact_share=args.share, exact_top=0
        )
        R.run_atlas(a, s, Path(tmp) / "run")
        wall = time.perf_counter() - t0
    R.work = real_work
    n_pairs = int(round(args.share * args.n * L * H))
    t_s, t_e, t_x = spent["stats"] / args.n, spent["estimate"] / args.n, spent["exact"] / max(1, n_pairs)

    # the mid-stack saving: one chunk's pairs from layer l, then the same pairs from layer 0
    _, texts = R.read_corpus(args.data, None, 16, 1)
    ids, _ = R.tokenize(a, texts, True, args.tokens)
    ch = Chunk(list(range(len(ids))), ids)
    st = stats_chunk(a, ch, Context())
    ctx = Context(ablation="mean", mean=(st["zsum"] / st["n_tokens"][0]).astype(np.float32))
    inp = Inputs.from_ids(a, ids)
    clean = E.clean_run(a, inp)
    repl = replacements(a, ch, clean.z, ctx)
    flat = np.random.default_rng(0).choice(len(ids) * L * H, max(L, int(round(args.share * len(ids) * L * H))), False)
    pairs = [(int(f // (L * H)), int((f // H) % L), int(f % H)) for f in flat]
    t0 = time.perf_counter()
    E.exact(a, inp, clean, repl, pairs)
    t_l = time.perf_counter() - t0
    real = M.start_at
    E.start_at = lambda adapter, layer, hidden, arity: real(adapter, 0, hidden, arity)  # type: ignore[assignment]
    t0 = time.perf_counter()
    E.exact(a, inp, clean, repl, pairs)
    t_0 = time.perf_counter() - t0
    E.start_at = real

    full_pairs = args.share * args.full * L * H + args.top * L * H
    minutes = (args.full * (t_s + t_e) + full_pairs * t_x) / 60
    lens = sorted(len(i) for i in R.tokenize(a, R.read_corpus(args.data, None, args.n, 0)[1], True, args.tokens)[0])
    print(f"model {args.model} ({L} layers x {H} heads), device {a.device}, 1 thread")
    print(
        f"run_atlas on {args.n} sequences of <= {args.tokens} tokens (mean {np.mean(lens):.1f}), "
        f"share {args.share}, top 0: {wall:.1f} s wall"
    )
    print(f"pass 1 statistics: {spent['stats']:.2f} s (t_s = {t_s:.3f} s/seq)")
    print(f"pass 2 estimate + DLA: {spent['estimate']:.2f} s (t_e = {t_e:.3f} s/seq)")
    print(f"pass 3 exact, {n_pairs} pairs: {spent['exact']:.2f} s (t_x = {t_x:.4f} s/pair)")
    print(
        f"mid-stack, {len(pairs)} pairs of one chunk: {t_l:.2f} s from layer l, {t_0:.2f} s from layer 0 "
        f"(saving x{t_0 / t_l:.2f}; the layers alone would give x{2 * L / (L + 1):.2f})"
    )
    print(
        f"extrapolated, one core: {args.full} sequences, share {args.share} + top {args.top} per head "
        f"({full_pairs:.0f} exact pairs): {minutes:.1f} min ({args.full * (t_s + t_e) / 60:.1f} min passes 1-2, "
        f"{full_pairs * t_x / 60:.1f} min exact); two worker processes: about {minutes / 2:.1f} min"
    )


if __name__ == "__main__":
    main()
