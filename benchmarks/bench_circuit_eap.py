"""EAP cost against one forward + backward of the same batch (issue 24's target: at most 3x), and
EAP-IG's cost per step, and exact patching of the heads-only graph, on SmolLM2-135M with the IOI prompt
set; same process, medians, ratios, the load average beside each.

The baseline is the model's own pass (``adapter.forward`` with gradients, then the logit difference's
backward); EAP is the clean and corrupted circuit forwards plus one backward, with every reader's input
kept separately (q per head, k and v per key/value group), and the edge products ``Δ_u · ∂m/∂x_r``.

Exact patching: the **heads-only graph** is every edge from a head to a later head's q, k or v input or to
the logits (no embeddings, no MLPs): 58,995 edges on SmolLM2. Exact patching runs one forward per (prompt,
edge), batched as ``circuit --batch-size TOKENS`` batches them (``rows_of``: TOKENS // positions rows per
pass); a seeded sample of ``--exact-edges`` of them on every prompt is timed, and the whole graph projected
from the time per forward row.

    /work/bin/cpu env PYTHONPATH=src .venv/bin/python benchmarks/bench_circuit_eap.py [--prompts 16] [--steps 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import load, threads, timeit  # noqa: E402

from streetlamp.commands.circuit.run import rows_of  # noqa: E402
from streetlamp.interventions.circuits import scores as S  # noqa: E402
from streetlamp.interventions.circuits.blocks import Blocks  # noqa: E402
from streetlamp.interventions.circuits.tasks import encode_pairs, ioi  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--exact-edges", type=int, default=32, help="heads-only edges patched exactly (0: skip)")
    ap.add_argument("--batch-size", type=int, default=576, help="tokens per exact-patching pass (--batch-size)")
    args = ap.parse_args()
    threads(1)
    import streetlamp

    adapter = streetlamp.load("smollm2-135m")
    if torch.cuda.is_available():
        adapter.to("cuda")
    blocks = Blocks(adapter)
    pairs = encode_pairs(adapter, ioi(args.prompts, seed=0))
    g = blocks.graph
    print(
        f"model: smollm2-135m ({adapter.n_layers} layers, {adapter.n_heads} heads, {adapter.n_kv_heads} kv groups); "
        f"{len(pairs)} IOI prompts, {pairs.clean.input_ids.shape[1]} positions; graph: {g.n_writers} writers, "
        f"{g.n_readers} readers, {g.n_edges} edges; device {adapter.device}; {torch.get_num_threads()} thread(s)"
    )

    def fwd_bwd() -> None:
        f = adapter.forward(pairs.clean, grad=True)
        rows = torch.arange(len(pairs))
        (f.logits[rows, pairs.answer] - f.logits[rows, pairs.wrong]).sum().backward()
        adapter.hf_model.zero_grad(set_to_none=True)

    base, _, _ = timeit(fwd_bwd, repeat=args.repeat)
    print(f"  forward + backward (the model's own): {base * 1e3:.0f} ms; {load()}")
    t, _, _ = timeit(lambda: S.eap(blocks, pairs, batch_size=len(pairs)), repeat=args.repeat)
    eap = t
    print(f"  EAP: {t * 1e3:.0f} ms = {t / base:.2f} x forward + backward (target <= 3); {load()}")
    t, _, _ = timeit(lambda: S.eap_ig(blocks, pairs, steps=args.steps, batch_size=len(pairs)), repeat=args.repeat)
    print(
        f"  EAP-IG inputs, {args.steps} steps: {t * 1e3:.0f} ms = {t / base:.2f} x forward + backward = "
        f"{t / eap:.2f} x EAP ({t / eap / args.steps:.2f} EAP per step; target about 1); {load()}"
    )
    if args.exact_edges:
        exact_heads(blocks, pairs, args.exact_edges, args.batch_size, base)


def heads_only(g) -> tuple[np.ndarray, np.ndarray]:
    """(reader, writer) of every edge from a head to a later head's q/k/v input or to the logits."""
    r, w = g.edge_index()
    head_w = np.array([x not in ("embed",) and not x.endswith(".MLP") for x in g.writers])
    head_r = np.array([x.input in ("q", "k", "v", "logits") for x in g.readers])
    keep = head_w[w] & head_r[r]
    return r[keep], w[keep]


def exact_heads(blocks: Blocks, pairs, n_edges: int, tokens: int, base: float) -> None:
    g = blocks.graph
    r, w = heads_only(g)
    pick = np.sort(np.random.default_rng(0).choice(len(r), size=min(n_edges, len(r)), replace=False))
    rows = rows_of(tokens, pairs, 32)
    n = len(pairs)
    t, _, _ = timeit(lambda: S.exact(blocks, pairs, edges=(r[pick], w[pick]), batch_size=rows), repeat=1)
    per_row = t / (n * len(pick))
    with torch.no_grad():
        fwd, _, _ = timeit(lambda: blocks.adapter.forward(pairs.clean), repeat=1)
    print(
        f"  exact patching, heads-only graph ({len(r)} edges): {len(pick)} sampled edges x {n} prompts in "
        f"{t:.1f} s, {rows} rows per pass (--batch-size {tokens} tokens / {pairs.clean.input_ids.shape[1]} "
        f"positions): {per_row * 1e3:.1f} ms per (prompt, edge) = {per_row / (fwd / n):.2f} x the model's "
        f"forward per prompt; every edge x {n} prompts projected {per_row * len(r) * n / 3600:.1f} h "
        f"({per_row * len(r) * n / base:.0f} x forward + backward); {load()}"
    )


if __name__ == "__main__":
    main()
