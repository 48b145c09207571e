"""occlusion vs Captum's FeatureAblation (best perturbations_per_eval) on the default classifier, and
KV-cache occlusion vs a plain full recompute on smollm2-135m. Ratios are measured in one process.

    nice .venv/bin/python benchmarks/bench_occlusion.py [--lengths 32 128] [--lm-length 64] [--repeat 3]
    .venv/bin/python benchmarks/bench_occlusion.py --budgets --lengths 128 32 --lm-length 0 --repeat 5
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import fmt, load, text_of_length, threads, timeit  # noqa: E402

import streetlamp  # noqa: E402
from streetlamp.methods.occlusion import Occlusion  # noqa: E402
from streetlamp.models.adapter import ModelAdapter, Target  # noqa: E402


def classifier() -> ModelAdapter:
    try:
        return streetlamp.load("minilm-sentiment")
    except Exception as e:  # the trained head may not be there yet: same architecture, same cost
        from streetlamp.models.minilm import build_minilm_classifier

        print(f"  (minilm-sentiment not loadable ({e}); timing the same architecture with a fresh head)")
        return ModelAdapter(*build_minilm_classifier(None), "minilm-base")


def bench_classifier(a: ModelAdapter, n: int, repeat: int, ppes: list[int]) -> None:
    from captum.attr import FeatureAblation

    inputs = a.encode(text_of_length(a, n))
    ids = inputs.input_ids
    with torch.no_grad():
        pred = int(a.hf_model(input_ids=ids).logits.argmax(-1))

    def F(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return torch.softmax(a.hf_model(input_ids=x).logits, -1)[:, pred]

    target = Target(index=pred)
    ours_m = Occlusion(occlude_special=True)  # same work as Captum: every position ablated
    t_ours, ts, e = timeit(lambda: ours_m.attribute(a, inputs, target=target)[0], repeat=repeat)
    print(f"classifier {n} tokens: streetlamp occlusion {t_ours:.2f} s {fmt(ts)}")
    best = None
    for ppe in ppes:
        fa = FeatureAblation(F)
        t, ts, ref = timeit(
            lambda: fa.attribute(ids, baselines=a.tokenizer.mask_token_id, perturbations_per_eval=ppe)[0].numpy(),
            repeat=repeat,
        )
        err = float(np.abs(ref - e.scores).max())
        print(f"  captum FeatureAblation perturbations_per_eval={ppe}: {t:.2f} s {fmt(ts)} (max |diff| {err:.1e})")
        best = t if best is None else min(best, t)
    print(f"  RATIO streetlamp / best captum = {t_ours / best:.2f}x the time ({best / t_ours:.2f}x faster)  [{load()}]")


def bench_budgets(a: ModelAdapter, n: int, repeat: int) -> None:
    """Token budgets for our occlusion beside Captum at the same tokens per pass, interleaved run by
    run so that drift of this shared machine hits every setting alike (medians)."""
    import statistics
    import time

    from captum.attr import FeatureAblation

    inputs = a.encode(text_of_length(a, n))
    ids = inputs.input_ids
    with torch.no_grad():
        pred = int(a.hf_model(input_ids=ids).logits.argmax(-1))

    def F(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(a.hf_model(input_ids=x).logits, -1)[:, pred]

    t = Target(index=pred)
    runs = {
        f"streetlamp budget {b}": (
            lambda b=b: Occlusion(occlude_special=True).attribute(a, inputs, target=t, batch_size=b)
        )
        for b in (512, 1024, 2048)
    }
    runs.update(
        {
            f"captum {b} tokens/pass": (
                lambda b=b: FeatureAblation(F).attribute(
                    ids, baselines=a.tokenizer.mask_token_id, perturbations_per_eval=max(1, b // n)
                )
            )
            for b in (512, 1024)
        }
    )
    times: dict[str, list[float]] = {k: [] for k in runs}
    with torch.no_grad():
        for f in runs.values():
            f()
        for _ in range(repeat):
            for k, f in runs.items():
                t0 = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t0)
    print(
        f"classifier {n} tokens, interleaved medians of {repeat}: "
        + ", ".join(f"{k} {statistics.median(v):.3f} s" for k, v in times.items())
    )


def lm_model(name: str) -> ModelAdapter:
    """smollm2-135m, or a random Llama of its width with ``name``'s layer count (``smollm2-shape-2``)
    for lengths where 30 layers of full recompute do not fit the time of a run here."""
    if name == "smollm2-135m":
        return streetlamp.load(name)
    from transformers import LlamaConfig, LlamaForCausalLM

    from streetlamp.models.tiny import tiny_tokenizer

    tok = tiny_tokenizer(encoder=False)
    layers = int(name.rsplit("-", 1)[1])
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=576, num_hidden_layers=layers, num_attention_heads=9, num_key_value_heads=3,
        intermediate_size=1536, vocab_size=len(tok), max_position_embeddings=4096, pad_token_id=0,
        bos_token_id=2, eos_token_id=3,
    )  # fmt: skip
    return ModelAdapter(LlamaForCausalLM(cfg).eval(), tok, name)


def bench_lm(n: int, repeat: int, model: str = "smollm2-135m") -> None:
    """KV-cache occlusion against the full recompute, alternating run by run (medians) so that this shared
    machine's drift hits both alike; the load is printed beside the ratio."""
    import statistics
    import time

    a = lm_model(model)
    if model == "smollm2-135m":
        inputs = a.encode(text_of_length(a, n))
    else:
        from streetlamp.models.adapter import Inputs

        ids = torch.randint(5, len(a.tokenizer), (n,), generator=torch.Generator().manual_seed(1)).tolist()
        inputs = Inputs.from_ids(a, [ids])
    kv, plain = Occlusion(replacement="delete"), Occlusion(replacement="delete", kv_cache=False)
    runs = {
        "kv": lambda: kv.attribute(a, inputs, target=Target())[0],
        "plain": lambda: plain.attribute(a, inputs, target=Target())[0],
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    out = {}
    kv.attribute(a, short_text(a, inputs), target=Target())  # warm the code paths on a short text
    for _ in range(repeat):
        for k, f in runs.items():
            t0 = time.perf_counter()
            out[k] = f()
            times[k].append(time.perf_counter() - t0)
    e_kv, e_pl = out["kv"], out["plain"]
    t_kv, t_pl = statistics.median(times["kv"]), statistics.median(times["plain"])
    ratios = [x / y for x, y in zip(times["kv"], times["plain"])]
    pos = e_kv.info["positions_computed"] / e_pl.info["positions_computed"]
    print(f"{a.name} {n} tokens, replacement {e_kv.info['replacement_used']}, alternating medians of {repeat}:")
    print(f"  KV-cache occlusion {t_kv:.2f} s {fmt(times['kv'])}, positions computed {e_kv.info['positions_computed']}")
    print(
        f"  plain recompute    {t_pl:.2f} s {fmt(times['plain'])}, positions computed {e_pl.info['positions_computed']}"
    )
    print(
        f"  RATIO KV / plain = {t_kv / t_pl:.2f} the time (per pair {fmt(ratios)}) for {pos:.2f} the positions; "
        f"max |diff| {np.abs(e_kv.scores - e_pl.scores).max():.1e}  [{load()}]"
    )


def short_text(a: ModelAdapter, inputs):  # noqa: ANN001, ANN201
    """The first 8 tokens of ``inputs``' text (a warm-up that touches every code path)."""
    from streetlamp.models.adapter import Inputs

    return Inputs.from_ids(a, [inputs.input_ids[0, : min(8, inputs.lengths[0])].tolist()])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--lengths", type=int, nargs="*", default=[32, 128])
    p.add_argument("--ppe", type=int, nargs="*", default=[8, 32, 128])
    p.add_argument("--lm-length", type=int, nargs="*", default=[64], help="0 skips the causal-LM part")
    p.add_argument("--lm-model", default="smollm2-135m", help="smollm2-135m, or smollm2-shape-L (random, L layers)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores, at most 2)")
    p.add_argument("--budgets", action="store_true", help="instead: token budgets vs Captum, interleaved")
    args = p.parse_args()
    print(f"torch threads: {threads(args.threads)}  [{load()}]")
    a = classifier() if args.lengths else None
    for n in args.lengths:
        assert a is not None
        if args.budgets:
            bench_budgets(a, n, args.repeat)
        else:
            bench_classifier(a, n, args.repeat, args.ppe)
    for n in args.lm_length:
        if n:
            bench_lm(n, args.repeat, args.lm_model)


if __name__ == "__main__":
    main()
