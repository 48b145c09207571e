"""Integrated gradients to a tolerance: streetlamp's default against Captum doubling ``n_steps``.

    .venv/bin/python benchmarks/bench_ig_tolerance.py [--texts 10] [--smollm 3] [--tolerance 1e-3]

A user of Captum's ``LayerIntegratedGradients`` who needs a relative completeness error
``|sum IG - (F(x) - F(x'))| / |F(x) - F(x')| <= tolerance`` runs it at ``n_steps`` 25, 50, 100, ...
(Gauss–Legendre, its default) until ``return_convergence_delta`` says so; the final, sufficient call is
also timed alone (the best case: a user who knew ``n_steps`` in advance). Against that, streetlamp's
``integrated_gradients`` at its defaults (``rule="auto"``: a coarse pass, then Romberg or adaptive
panels; same baseline: [PAD] everywhere, ``keep_special=False``). Per text and summed: seconds and
gradient evaluations, and the largest difference of a token's attribution between the two converged answers
(a fraction of |F(x) - F(x')|); the ratios are measured in this process, the load average printed beside them.

1. ``minilm-sentiment``, ``--texts`` movie sentences (seeded sample), F = probability of the prediction.
2. ``smollm2-135m``, the README's decoder prompt and ``--smollm - 1`` prompts of docs/examples/facts.csv,
   F = probability of the predicted next token; Captum doubles up to ``--captum-max`` steps.
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
import numpy as np  # noqa: E402
import torch  # noqa: E402
from common import load, threads  # noqa: E402

import streetlamp  # noqa: E402
from streetlamp.data.loaders import load_dataset  # noqa: E402
from streetlamp.methods.gradient import ids_inputs  # noqa: E402
from streetlamp.methods.ig import IntegratedGradients  # noqa: E402
from streetlamp.models.adapter import ModelAdapter, Target  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def captum_doubling(a: ModelAdapter, ids: torch.Tensor, idx: int, tol: float, start: int, cap: int) -> dict:
    from captum.attr import LayerIntegratedGradients

    def fwd(x: torch.Tensor) -> torch.Tensor:
        inp = ids_inputs(a, x[0])
        inp.input_ids, inp.attention_mask = x, torch.ones_like(x)
        return a.score(a.forward(inp, grad=True).logits, torch.full((x.shape[0],), idx), Target(index=idx))

    lig = LayerIntegratedGradients(fwd, a.embed_module)
    base = torch.full_like(ids, int(a.tokenizer.pad_token_id))
    with torch.no_grad():
        df = float(fwd(ids)[0] - fwd(base)[0])
    n, evals, t0, rel = start, 0, time.perf_counter(), float("inf")
    while True:
        t1 = time.perf_counter()
        attr, d = lig.attribute(ids, baselines=base, n_steps=n, return_convergence_delta=True)
        last = time.perf_counter() - t1
        evals += n
        rel = abs(float(d[0])) / abs(df)
        if rel <= tol or 2 * n > cap:
            break
        n *= 2
    total = time.perf_counter() - t0
    t1 = time.perf_counter()  # the final call alone, again (warm)
    lig.attribute(ids, baselines=base, n_steps=n, return_convergence_delta=True)
    scores = attr[0].sum(-1).detach().double().numpy()
    return {
        "time": total,
        "evals": evals,
        "final_n": n,
        "final_time": min(last, time.perf_counter() - t1),
        "rel": rel,
        "scores": scores,
        "df": df,
    }


def ours(a: ModelAdapter, text: str, tol: float) -> dict:
    ig = IntegratedGradients(baseline="pad", keep_special=False, tolerance=tol)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        e = ig.attribute(a, a.encode(text), target=Target())[0]
    i = e.info
    return {
        "time": time.perf_counter() - t0,
        "evals": i["gradient_evaluations"],
        "rel": i["relative_completeness_error"],
        "rule": i.get("rule_used", ig.rule),
        "warned": len(w),
        "index": i["target"]["index"],
        "scores": e.scores.astype(np.float64),
    }


def compare(a: ModelAdapter, texts: list[str], tol: float, cap: int) -> None:
    tot = {"ours": 0.0, "cap": 0.0, "final": 0.0, "oe": 0, "ce": 0, "fe": 0, "diff": 0.0}
    ours(a, texts[0], tol)  # warm-up
    for text in texts:
        o = ours(a, text, tol)
        c = captum_doubling(a, a.encode(text).input_ids, o["index"], tol, 25, cap)
        tot["ours"] += o["time"]
        tot["cap"] += c["time"]
        tot["final"] += c["final_time"]
        tot["oe"] += o["evals"]
        tot["ce"] += c["evals"]
        tot["fe"] += c["final_n"]
        diff = float(np.abs(o["scores"] - c["scores"]).max() / abs(c["df"]))  # both at convergence
        tot["diff"] = max(tot["diff"], diff)
        print(
            f"  {text[:32]:32} streetlamp {o['evals']:>4} evals {o['time']:6.2f}s rel {o['rel']:.1e} ({o['rule']}"
            f"{', WARNED' if o['warned'] else ''}) | captum doubling {c['evals']:>4} evals {c['time']:6.2f}s "
            f"(final n_steps={c['final_n']}: {c['final_time']:.2f}s) rel {c['rel']:.1e} | max token diff {diff:.1e} of |dF|",
            flush=True,
        )
    print(
        f"  total: streetlamp {tot['oe']} evals {tot['ours']:.2f}s; captum doubling {tot['ce']} evals {tot['cap']:.2f}s; "
        f"captum final calls alone {tot['fe']} evals {tot['final']:.2f}s; largest token difference streetlamp vs "
        f"captum's final call {tot['diff']:.1e} of |dF|"
    )
    print(
        f"  RATIO streetlamp / captum doubling = {tot['ours'] / tot['cap']:.2f} (target <= 0.5); "
        f"streetlamp / captum final call alone = {tot['ours'] / tot['final']:.2f} (target <= 1.0); "
        f"evaluations {tot['oe'] / tot['ce']:.2f} and {tot['oe'] / tot['fe']:.2f}  [{load()}]"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", type=int, default=10)
    ap.add_argument("--smollm", type=int, default=3, help="SmolLM2 prompts (0 skips)")
    ap.add_argument("--tolerance", type=float, default=1e-3)
    ap.add_argument("--captum-max", type=int, default=800)
    args = ap.parse_args()
    print(f"torch threads: {threads(1)}  [{load()}]")
    if args.texts:
        a = streetlamp.load("minilm-sentiment")
        texts = random.Random(1).sample([e.text for e in load_dataset("movies").examples], args.texts)
        print(f"== 1. {a.name}: {len(texts)} movie sentences, relative completeness error <= {args.tolerance} ==")
        compare(a, texts, args.tolerance, args.captum_max)
    if args.smollm:
        a = streetlamp.load("smollm2-135m")
        texts = ["When Mary and John went to the store, John gave a drink to"]
        texts += [r["text"] for r in csv.DictReader(open(ROOT / "docs" / "examples" / "facts.csv"))][: args.smollm - 1]
        print(f"== 2. {a.name}: time to tolerance {args.tolerance} ==")
        compare(a, texts, args.tolerance, args.captum_max)


if __name__ == "__main__":
    main()
