"""EAP cost against one forward + backward of the same batch (issue 24's target: at most 3x), and
EAP-IG's cost per step, on SmolLM2-135M with the IOI prompt set; same process, medians, ratios.

The baseline is the model's own pass (``adapter.forward`` with gradients, then the logit difference's
backward); EAP is the clean and corrupted circuit forwards plus one backward, with every reader's input
kept separately (q per head, k and v per key/value group), and the edge products ``Δ_u · ∂m/∂x_r``.

    nice .venv/bin/python benchmarks/bench_circuit_eap.py [--prompts 16] [--steps 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import threads, timeit  # noqa: E402

from streetlamp.interventions.circuits import scores as S  # noqa: E402
from streetlamp.interventions.circuits.blocks import Blocks  # noqa: E402
from streetlamp.interventions.circuits.tasks import encode_pairs, ioi  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    threads()
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
        f"{g.n_readers} readers, {g.n_edges} edges; device {adapter.device}"
    )

    def fwd_bwd() -> None:
        f = adapter.forward(pairs.clean, grad=True)
        rows = torch.arange(len(pairs))
        (f.logits[rows, pairs.answer] - f.logits[rows, pairs.wrong]).sum().backward()
        adapter.hf_model.zero_grad(set_to_none=True)

    base, _, _ = timeit(fwd_bwd, repeat=args.repeat)
    print(f"  forward + backward (the model's own): {base * 1e3:.0f} ms")
    t, _, _ = timeit(lambda: S.eap(blocks, pairs, batch_size=len(pairs)), repeat=args.repeat)
    print(f"  EAP: {t * 1e3:.0f} ms = {t / base:.2f} x forward + backward (target <= 3)")
    t, _, _ = timeit(lambda: S.eap_ig(blocks, pairs, steps=args.steps, batch_size=len(pairs)), repeat=args.repeat)
    print(
        f"  EAP-IG inputs, {args.steps} steps: {t * 1e3:.0f} ms = {t / base:.2f} x ({t / base / args.steps:.2f} per step)"
    )


if __name__ == "__main__":
    main()
