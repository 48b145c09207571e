"""The atlas' cost model, measured (issue 25's target: SmolLM2-135M, 270 heads x 2,000 sequences of up to 64
tokens with exact ablation of at least 5% of (head, sequence) pairs, within one hour on this 2-core machine).

Passes (``runners/atlas.py``): (1) statistics: one clean forward per batch, patterns and attn.z recorded;
(2) estimate: one forward + backward per batch (all heads' attribution estimates at once) and, on a
decoder with a readout, one DLA forward per sequence; (3) exact: one row per ablated (head, sequence),
batched by the token budget, each pass for layer ``l`` started at ``l`` (``atlas_midstack``): ``(L - l) / L``
of a full pass, ``(L + 1) / 2L`` on average over the layers. So, with ``t_f`` a full forward of one
sequence and ``s`` the exact share: ``T ≈ N t_f (1 + (1 + 2·bwd) + [DLA 1] + s·L·H·(L + 1)/(2L) + clean
reruns)``; at s = 5% on SmolLM2 (L = 30, H = 9) the exact pass is 0.05 · 270 · 31/60 ≈ 7 full forwards per
sequence, and a top-5-per-head audit adds 270 · 5 / N per sequence.

This script times each pass on ``--n`` sequences and the mid-stack saving (the exact pass with and without
starting at layer l, same pairs), then extrapolates to ``--full`` sequences.

    /work/bin/cpu .venv/bin/python benchmarks/bench_atlas.py [--n 8] [--full 2000] [--share 0.05]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import threads  # noqa: E402

from streetlamp.interventions import atlas_effects as E  # noqa: E402
from streetlamp.interventions import atlas_midstack as M  # noqa: E402
from streetlamp.interventions.atlas_chunks import Chunk, Context, estimate_chunk, replacements, stats_chunk  # noqa: E402
from streetlamp.models.adapter import Inputs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--full", type=int, default=2000)
    ap.add_argument("--share", type=float, default=0.05)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--model", default="smollm2-135m")
    args = ap.parse_args()
    threads(1)  # one thread: the machine is shared (OMP_NUM_THREADS=1 under /work/bin/cpu)
    import streetlamp
    from streetlamp.runners.atlas import read_corpus, tokenize

    a = streetlamp.load(args.model)
    _, texts = read_corpus("movies,tweets,drugs", None, args.n, 0)
    ids, _ = tokenize(a, texts, True, args.tokens)
    ch = Chunk(list(range(len(ids))), ids)
    L, H = a.n_layers, a.n_heads
    t0 = time.perf_counter()
    st = stats_chunk(a, ch, Context())
    t_stats = time.perf_counter() - t0
    ctx = Context(ablation="mean", mean=(st["zsum"] / st["n_tokens"][0]).astype(np.float32))
    t0 = time.perf_counter()
    estimate_chunk(a, ch, ctx)
    t_est = time.perf_counter() - t0
    inp = Inputs.from_ids(a, ids)
    clean = E.clean_run(a, inp)
    repl = replacements(a, ch, inp, clean, ctx)
    rng = np.random.default_rng(0)
    n_pairs = max(L, int(round(args.share * len(ids) * L * H)))
    flat = rng.choice(len(ids) * L * H, n_pairs, replace=False)
    pairs = [(int(f // (L * H)), int((f // H) % L), int(f % H)) for f in flat]
    t0 = time.perf_counter()
    E.exact(a, inp, clean, repl, pairs)
    t_exact = time.perf_counter() - t0
    real = M.start_at
    E.start_at = lambda adapter, layer, hidden, arity: real(adapter, 0, hidden, arity)  # the same pairs, from layer 0
    t0 = time.perf_counter()
    E.exact(a, inp, clean, repl, pairs)
    t_exact_full = time.perf_counter() - t0
    E.start_at = real
    per_pair = t_exact / n_pairs
    per_seq = (t_stats + t_est) / len(ids)
    full_pairs = args.share * args.full * L * H + 5 * L * H
    total = per_seq * args.full + per_pair * full_pairs
    print(
        f"model {args.model} ({L} layers x {H} heads), {len(ids)} sequences of <= {args.tokens} tokens, device {a.device}"
    )
    print(f"pass 1 statistics: {t_stats:.2f} s ({t_stats / len(ids):.3f} s/seq)")
    print(f"pass 2 estimate + DLA: {t_est:.2f} s ({t_est / len(ids):.3f} s/seq)")
    print(
        f"pass 3 exact, {n_pairs} pairs: {t_exact:.2f} s from layer l, {t_exact_full:.2f} s from layer 0 "
        f"(saving x{t_exact_full / t_exact:.2f}; the cost model says x{2 * L / (L + 1):.2f} for the layers alone)"
    )
    print(
        f"extrapolated: {args.full} sequences, share {args.share} + top 5 per head ({full_pairs:.0f} exact pairs): "
        f"{total / 60:.1f} min ({per_seq * args.full / 60:.1f} min passes 1-2, {per_pair * full_pairs / 60:.1f} min exact)"
    )


if __name__ == "__main__":
    main()
