"""Integrated gradients: streetlamp vs Captum, shared multi-target IG, token-budget batching.

    .venv/bin/python benchmarks/bench_ig.py [--quick] [--only classifier,sequence,budget]

1. ``integrated_gradients`` (adaptive, relative completeness error <= 1e-3, Gauss–Legendre) vs
   Captum's LayerIntegratedGradients at its defaults (50 Gauss–Legendre steps, baseline input
   ids 0 = [PAD] everywhere, which is our ``baseline="pad", keep_special=False``) with its best
   ``internal_batch_size``, on the default classifier at 32 and 128 tokens. Target ratio <= 0.5.
2. ``attribute_sequence`` (one shared path, per-target backward) vs one separate IG per generated
   token at equal steps, on smollm2-135m. Target >= 3x.
3. Token budget vs a fixed large batch at 512 tokens (same IG, same steps).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from common import fmt, text_of_length, threads, timeit  # noqa: E402

import streetlamp  # noqa: E402
from streetlamp.batching import DEFAULT_CPU_BUDGET  # noqa: E402
from streetlamp.errors import StreetlampError  # noqa: E402
from streetlamp.methods.gradient import ids_inputs  # noqa: E402
from streetlamp.methods.ig import IntegratedGradients  # noqa: E402
from streetlamp.models.adapter import ModelAdapter, Target  # noqa: E402


def classifier() -> ModelAdapter:
    try:
        return streetlamp.load("minilm-sentiment")
    except (StreetlampError, OSError, FileNotFoundError) as e:
        from streetlamp.models.minilm import build_minilm_classifier

        print(f"  (minilm-sentiment weights unavailable ({e}); using the MiniLM base with a seeded head)")
        torch.manual_seed(0)
        return ModelAdapter(*build_minilm_classifier(None), "minilm-base")


def bench_classifier(repeat: int, device: str = "cpu", rules: tuple[str, ...] = ("clenshaw_curtis",)) -> None:
    from captum.attr import LayerIntegratedGradients

    a = classifier().to(device)
    print(f"== 1. integrated_gradients vs Captum LayerIntegratedGradients on {a.name} ({device}) ==")
    for n in (32, 128):
        inputs = a.encode(text_of_length(a, n))
        idx = int(a.forward(inputs).logits.argmax())
        t = Target(index=idx)
        ours = IntegratedGradients(baseline="pad", keep_special=False)

        def run_ours():
            return ours.attribute(a, inputs, target=t)[0]  # ``ours`` is rebound per rule below

        def fwd(ids):
            inp = ids_inputs(a, ids[0])
            inp.input_ids, inp.attention_mask = ids, torch.ones_like(ids)
            return a.score(a.forward(inp, grad=True).logits, torch.full((ids.shape[0],), idx, device=ids.device), t)

        lig = LayerIntegratedGradients(fwd, a.embed_module)
        best = None
        for ibs in (None, 10, 25):
            tc, times, (_, d) = timeit(
                lambda: lig.attribute(
                    inputs.input_ids.to(device), internal_batch_size=ibs, return_convergence_delta=True
                ),
                repeat,
            )
            print(f"  {n} tokens  captum LIG 50 GL steps internal_batch_size={ibs}: {tc:.2f}s {fmt(times)}")
            if best is None or tc < best[0]:
                best = (tc, ibs, float(d[0]))
        for rule in rules:
            ours = IntegratedGradients(baseline="pad", keep_special=False, rule=rule)
            to, times, e = timeit(run_ours, repeat)
            dF = abs(e.info["F_input"] - e.info["F_baseline"])
            print(
                f"  {n} tokens  streetlamp IG adaptive ({rule}): {to:.2f}s {fmt(times)} steps={e.info['steps']} "
                f"gradient evaluations={e.info['gradient_evaluations']} "
                f"rel. completeness error={e.info['relative_completeness_error']:.2e} "
                f"token change vs half steps={e.info['token_change_vs_half_steps']:.1e}"
            )
            print(
                f"  {n} tokens  RATIO streetlamp ({rule}) / captum(best ibs={best[1]}) = {to / best[0]:.2f}  "
                f"(target <= 0.5); captum's own rel. completeness error at 50 steps = {abs(best[2]) / dF:.2e}"
            )


def bench_sequence(repeat: int, k: int, steps: int) -> None:
    a = streetlamp.load("smollm2-135m")
    prompt = "When Mary and John went to the store, John gave a drink to"
    ig = IntegratedGradients(baseline="pad", steps=steps, adaptive=False)
    print(f"== 2. shared multi-target IG on {a.name}: {k} generated tokens, {steps} steps each ({ig.rule}) ==")
    shared = ig.attribute_sequence(a, prompt, k, target=Target(quantity="logprob"))
    cont = [e.info["target"]["index"] for e in shared]
    p = a.encode(prompt).input_ids[0]
    full = torch.cat([p, torch.tensor(cont)])
    print(f"  prompt {len(p)} tokens, continuation {a.tokenizer.decode(cont)!r}")

    def separate():
        return [
            ig.attribute(a, ids_inputs(a, full[: len(p) + j]), target=Target(cont[j], None, "logprob"))[0]
            for j in range(k)
        ]

    pad = int(a.tokenizer.pad_token_id)

    def captum_separate():
        """The peer: Captum's LayerIntegratedGradients once per target over its prefix (inseq's
        scheme), the plain model forward, the same [PAD] baseline and the same number of steps."""
        from captum.attr import LayerIntegratedGradients

        out = []
        for j in range(k):
            ids = full[: len(p) + j][None]

            def fwd(x: torch.Tensor, j: int = j) -> torch.Tensor:
                logits = a.hf_model(input_ids=x, attention_mask=torch.ones_like(x)).logits[:, -1]
                return torch.log_softmax(logits.float(), -1)[:, cont[j]]

            lig = LayerIntegratedGradients(fwd, a.embed_module)
            out.append(
                lig.attribute(
                    ids, baselines=torch.full_like(ids, pad), n_steps=steps + 1, internal_batch_size=steps + 1
                )
            )
        return out

    tc, t0, _ = timeit(captum_separate, repeat, warmup=0)
    ts, t1, _ = timeit(separate, repeat, warmup=0)
    tl, t2, _ = timeit(lambda: ig.attribute_sequence(a, prompt, cont, target=Target(quantity="logprob")), repeat)
    tb, t3, _ = timeit(
        lambda: ig.attribute_sequence(a, prompt, cont, target=Target(quantity="logprob"), batched_grads=True), repeat
    )
    print(
        f"  peer: Captum LayerIntegratedGradients per target ({steps + 1} GL steps, one attribution per "
        f"target: inseq's scheme): {tc:.2f}s {fmt(t0)}"
    )
    print(f"  streetlamp IG per target ({steps} intervals = {steps + 1} points): {ts:.2f}s {fmt(t1)}")
    print(f"  shared path, one backward per target: {tl:.2f}s {fmt(t2)}  RATIO separate/shared = {ts / tl:.2f}x")
    print(
        f"  shared path, vmapped backward: {tb:.2f}s {fmt(t3)}  RATIO separate/shared = {ts / tb:.2f}x  (target >= 3x)"
    )
    best = min(tl, tb)
    print(
        f"  RATIO captum-per-target / streetlamp shared = {tc / best:.2f}x (target >= 3x); "
        f"streetlamp-per-target / shared = {ts / best:.2f}x"
    )


def bench_budget(repeat: int, steps: int) -> None:
    a = classifier()
    inputs = a.encode(text_of_length(a, 512))
    t = Target(index=0)
    ig = IntegratedGradients(steps=steps, adaptive=False)
    print(f"== 3. token budget vs fixed batch at 512 tokens ({steps} GL steps, {a.name}) ==")
    res = {}
    for rows in (1, 4, 8, steps):
        tt, times, _ = timeit(lambda: ig.attribute(a, inputs, target=t, batch_size=rows * 512), repeat, warmup=0)
        res[rows] = tt
        print(f"  {rows:>3} rows x 512 tokens per pass (budget {rows * 512}): {tt:.2f}s {fmt(times)}")
    print(
        f"  RATIO fixed {steps}-row batch / 1 row per pass = {res[steps] / res[1]:.2f} "
        f"(default CPU budget: {DEFAULT_CPU_BUDGET} tokens = {DEFAULT_CPU_BUDGET // 512} rows here)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="1 repeat, fewer tokens (a smoke run)")
    ap.add_argument("--only", default="classifier,sequence,budget")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="classifier part only: cpu, cuda ... (timings synchronise)")
    ap.add_argument("--rules", default="clenshaw_curtis,panels", help="classifier part: IG rules to time")
    args = ap.parse_args()
    print(f"torch threads: {threads(args.threads)}")
    repeat = 1 if args.quick else 3
    parts = args.only.split(",")
    if "classifier" in parts:
        bench_classifier(repeat, args.device, tuple(args.rules.split(",")))
    if "sequence" in parts:
        bench_sequence(repeat, k=4 if args.quick else 8, steps=8 if args.quick else 16)
    if "budget" in parts:
        bench_budget(1 if args.quick else 2, steps=16 if args.quick else 32)


if __name__ == "__main__":
    main()
