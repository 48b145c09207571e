"""Integrated gradients to a tolerance: streetlamp's default against Captum doubling ``n_steps``.

    .venv/bin/python benchmarks/bench_ig_tolerance.py [--texts 10] [--smollm 3] [--tolerance 1e-3] [--repeat 1]

A user of Captum's ``LayerIntegratedGradients`` who needs a relative completeness error
``|sum IG - (F(x) - F(x'))| / |F(x) - F(x')| <= tolerance`` runs it at ``n_steps`` 25, 50, 100, ...
(Gauss–Legendre, its default) until ``return_convergence_delta`` says so; the final, sufficient call is
also timed alone (the best case: a user who knew ``n_steps`` in advance). Against that, streetlamp's
``integrated_gradients`` at its defaults (``rule="auto"``: a coarse pass, then Romberg or adaptive
panels; same baseline: [PAD] everywhere, ``keep_special=False``). Per text and summed: seconds and
gradient evaluations, and the largest difference of a token's attribution between the two converged answers
(a fraction of |F(x) - F(x')|); the ratios are measured in this process, the load average printed beside them.
Both sides run the same model object through the same ``ModelAdapter.forward`` (float32, one thread); the time
per gradient evaluation of each side is printed (streetlamp's also with its forward/backward passes: a pass
has a fixed cost, every weight read forward and backward, of a few rows). ``--repeat R``: each side's time
per text is the best of R runs (the same for both; the machine is shared).

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


def captum_doubling(
    a: ModelAdapter, ids: torch.Tensor, idx: int, tol: float, start: int, cap: int, repeat: int = 1
) -> dict:
    from captum.attr import LayerIntegratedGradients

    def fwd(x: torch.Tensor) -> torch.Tensor:
        inp = ids_inputs(a, x[0])
        inp.input_ids, inp.attention_mask = x, torch.ones_like(x)
        return a.score(a.forward(inp, grad=True).logits, torch.full((x.shape[0],), idx), Target(index=idx))

    lig = LayerIntegratedGradients(fwd, a.embed_module)
    base = torch.full_like(ids, int(a.tokenizer.pad_token_id))
    with torch.no_grad():
        df = float(fwd(ids)[0] - fwd(base)[0])
    total, finals = float("inf"), []
    for _ in range(repeat):  # the user's loop: n_steps 25, 50, 100, ... until the delta meets the tolerance
        n, evals, t0 = start, 0, time.perf_counter()
        while True:
            t1 = time.perf_counter()
            attr, d = lig.attribute(ids, baselines=base, n_steps=n, return_convergence_delta=True)
            last = time.perf_counter() - t1
            evals += n
            rel = abs(float(d[0])) / abs(df)
            if rel <= tol or 2 * n > cap:
                break
            n *= 2
        total = min(total, time.perf_counter() - t0)
        finals.append(last)
    t1 = time.perf_counter()  # the final call alone, again (warm)
    lig.attribute(ids, baselines=base, n_steps=n, return_convergence_delta=True)
    finals.append(time.perf_counter() - t1)
    scores = attr[0].sum(-1).detach().double().numpy()
    return {
        "time": total,
        "evals": evals,
        "final_n": n,
        "final_time": min(finals),
        "rel": rel,
        "scores": scores,
        "df": df,
    }


def ours(a: ModelAdapter, text: str, tol: float, repeat: int = 1) -> dict:
    ig = IntegratedGradients(baseline="pad", keep_special=False, tolerance=tol)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            e = ig.attribute(a, a.encode(text), target=Target())[0]
        best = min(best, time.perf_counter() - t0)
    i = e.info
    return {
        "time": best,
        "evals": i["gradient_evaluations"],
        "passes": i.get("passes", 0),
        "rel": i["relative_completeness_error"],
        "rule": i.get("rule_used", ig.rule),
        "warned": len(w),
        "index": i["target"]["index"],
        "scores": e.scores.astype(np.float64),
    }


def compare(a: ModelAdapter, texts: list[str], tol: float, cap: int, repeat: int = 1) -> None:
    tot = {"ours": 0.0, "cap": 0.0, "final": 0.0, "oe": 0, "ce": 0, "fe": 0, "diff": 0.0, "passes": 0}
    ours(a, texts[0], tol)  # warm-up
    for text in texts:
        o = ours(a, text, tol, repeat)
        c = captum_doubling(a, a.encode(text).input_ids, o["index"], tol, 25, cap, repeat)
        tot["passes"] += o["passes"]
        tot["ours"] += o["time"]
        tot["cap"] += c["time"]
        tot["final"] += c["final_time"]
        tot["oe"] += o["evals"]
        tot["ce"] += c["evals"]
        tot["fe"] += c["final_n"]
        diff = float(np.abs(o["scores"] - c["scores"]).max() / abs(c["df"]))  # both at convergence
        tot["diff"] = max(tot["diff"], diff)
        print(
            f"  {text[:32]:32} streetlamp {o['evals']:>4} evals ({o['passes']} passes) {o['time']:6.2f}s rel {o['rel']:.1e} ({o['rule']}"
            f"{', WARNED' if o['warned'] else ''}) | captum doubling {c['evals']:>4} evals {c['time']:6.2f}s "
            f"(final n_steps={c['final_n']}: {c['final_time']:.2f}s) rel {c['rel']:.1e} | max token diff {diff:.1e} of |dF|",
            flush=True,
        )
    print(
        f"  total: streetlamp {tot['oe']} evals {tot['ours']:.2f}s; captum doubling {tot['ce']} evals {tot['cap']:.2f}s; "
        f"captum final calls alone {tot['fe']} evals {tot['final']:.2f}s; largest token difference streetlamp vs "
        f"captum's final call {tot['diff']:.1e} of |dF|"
    )
    ms = lambda t, n: 1e3 * t / max(n, 1)  # noqa: E731
    print(
        f"  time per gradient evaluation: streetlamp {ms(tot['ours'], tot['oe']):.1f} ms ({tot['passes']} forward/backward "
        f"passes, {tot['oe'] / max(tot['passes'], 1):.1f} rows each); captum doubling {ms(tot['cap'], tot['ce']):.1f} ms, "
        f"its final calls {ms(tot['final'], tot['fe']):.1f} ms"
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
    ap.add_argument("--repeat", type=int, default=1, help="each side's time per text: the best of this many runs")
    args = ap.parse_args()
    print(f"torch threads: {threads(1)}  [{load()}]")
    if args.texts:
        a = streetlamp.load("minilm-sentiment")
        texts = random.Random(1).sample([e.text for e in load_dataset("movies").examples], args.texts)
        print(f"== 1. {a.name}: {len(texts)} movie sentences, relative completeness error <= {args.tolerance} ==")
        compare(a, texts, args.tolerance, args.captum_max, args.repeat)
    if args.smollm:
        a = streetlamp.load("smollm2-135m")
        texts = ["When Mary and John went to the store, John gave a drink to"]
        texts += [r["text"] for r in csv.DictReader(open(ROOT / "docs" / "examples" / "facts.csv"))][: args.smollm - 1]
        print(f"== 2. {a.name}: time to tolerance {args.tolerance} ==")
        compare(a, texts, args.tolerance, args.captum_max, args.repeat)


if __name__ == "__main__":
    main()
