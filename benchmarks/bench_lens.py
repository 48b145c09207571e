"""Lens quality on SmolLM2-135M (issue 26 item 4): per layer, held-out KL(final ‖ lens) for the logit, tuned
and Jacobian lenses, and each lens's agreement with intervention (the ``lens --check`` test) over prompts.

The two lens folders come from ``streetlamp lens-fit`` run with the same ``--data``, ``--seq-len``,
``--heldout`` and ``--seed`` (so the same held-out sequences; each folder's ``heldout_kl.csv`` holds the logit
lens's KL too, which must agree between them). The agreement is measured at the last position of the first
``--prompts`` prompts of the shipped ``recall`` set: per layer, the share of prompts whose lens top token is
the top token of the residual patched into the neutral context, and the mean KL(patched ‖ lens). Writes
``benchmarks/results/lens_quality_<name>.csv`` and prints the table (and the fitting record of each lens).

    .venv/bin/python benchmarks/bench_lens.py --tuned runs/lens-tuned --jacobian runs/lens-jacobian [--prompts 16]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import threads  # noqa: E402

from streetlamp.data.loaders import load_dataset  # noqa: E402
from streetlamp.interventions.lenses.base import Lens, row_label  # noqa: E402
from streetlamp.interventions.lenses.check import check_against_intervention  # noqa: E402
from streetlamp.interventions.lenses.store import load_lens  # noqa: E402
from streetlamp.models.loading import load  # noqa: E402
from streetlamp.progress import iterate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tuned", required=True)
    ap.add_argument("--jacobian", required=True)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--name", default="smollm2")
    args = ap.parse_args()
    threads()
    a = load(args.model)
    lenses = {
        "logit": Lens.logit(a),
        "tuned": load_lens(args.tuned, a, "tuned"),
        "jacobian": load_lens(args.jacobian, a, "jacobian"),
    }
    kl = {k: pd.read_csv(Path(getattr(args, k)) / "heldout_kl.csv") for k in ("tuned", "jacobian")}
    np.testing.assert_allclose(kl["tuned"]["kl_logit"], kl["jacobian"]["kl_logit"], rtol=1e-4)  # same held-out text
    for k in ("tuned", "jacobian"):
        t = json.loads((Path(getattr(args, k)) / "lens.json").read_text())["training"]
        print(f"{k}: {t['train_tokens']} training tokens, {t['seconds']:.0f} s, {t['estimator'][:60]}...")
    prompts = [e.text for e in load_dataset("recall").examples[: args.prompts]]
    L = a.n_layers
    match = {k: np.zeros(L + 1) for k in lenses}
    kls = {k: np.zeros(L + 1) for k in lenses}
    t0 = time.perf_counter()
    for text in iterate(prompts, "prompts checked"):
        ids = a.encode(text).input_ids[0]
        with torch.no_grad():
            index = int(a.forward(a.encode(text)).logits[0].argmax())
        for k, lens in lenses.items():
            res = check_against_intervention(a, ids, lens, index)
            match[k] += res["top1_match"]
            kls[k] += res["kl"]
    n = len(prompts)
    rows = []
    for r in range(L + 1):
        rows.append(
            {
                "row": r,
                "layer": row_label(r),
                "heldout_kl_logit": float(kl["tuned"]["kl_logit"][r]),
                "heldout_kl_tuned": float(kl["tuned"]["kl_tuned"][r]),
                "heldout_kl_jacobian": float(kl["jacobian"]["kl_jacobian"][r]),
                **{f"agreement_{k}": match[k][r] / n for k in lenses},
                **{f"check_kl_{k}": kls[k][r] / n for k in lenses},
            }
        )
    df = pd.DataFrame(rows)
    out = Path(__file__).resolve().parent / "results" / f"lens_quality_{args.name}.csv"
    df.to_csv(out, index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(df.round(3).to_string(index=False))
    heldout_tokens = int(kl["tuned"]["heldout_tokens"][0])
    print(f"held-out tokens {heldout_tokens}; {n} recall prompts checked in {time.perf_counter() - t0:.0f} s")
    for k in lenses:
        print(f"{k}: agreement with intervention over all layers {np.mean(match[k][:-1]) / n:.3f} (last row excluded)")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
