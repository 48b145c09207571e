"""Retrain the shipped ground-truth models (normal + deceptive per task) reproducibly from a seed.

    .venv/bin/python scripts/train_groundtruth.py                 # all tasks, seed 0, into the package
    .venv/bin/python scripts/train_groundtruth.py --tasks keyword --out /tmp/gt
    .venv/bin/python scripts/train_groundtruth.py --diagnostics   # + Wiegreffe & Pinter (extra seeds)

Deceptive models fine-tune the normal one with the Pruthi et al. penalty (see
streetlamp.groundtruth.train). Writes gt-<task>-<variant>/ checkpoint folders and, with
--diagnostics, diagnostics.json next to them.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from streetlamp import load
from streetlamp.groundtruth import diagnostics as dg
from streetlamp.groundtruth.tasks import get_task, parse_tasks
from streetlamp.groundtruth.train import WEIGHTS_DIR, TrainConfig, save, train

NORMAL = TrainConfig()
DECEPTIVE = replace(NORMAL, lam=1.0, steps=400, lr=1e-3)
# negation at a constant lambda = 1 collapsed to chance (accuracy 0.495): ramp lambda up over half the steps
DECEPTIVE_BY_TASK = {"negation": {"ramp": 0.5}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default="all")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(WEIGHTS_DIR))
    p.add_argument("--diagnostics", action="store_true", help="train 2 extra seeds and run W&P diagnostics")
    p.add_argument(
        "--diagnostics-only",
        action="store_true",
        help="load the models in --out instead of retraining them; train only the extra seeds",
    )
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    report = {}
    for name in parse_tasks(args.tasks):
        task = get_task(name)
        if args.diagnostics_only:
            args.diagnostics = True
            normal, deceptive = (load(out / f"gt-{name}-{v}") for v in ("normal", "deceptive"))
            rec, drec = (
                json.loads((out / f"gt-{name}-{v}" / "training.json").read_text()) for v in ("normal", "deceptive")
            )
        else:
            normal, rec = train(task, NORMAL, args.seed)
            save(normal, rec, out / f"gt-{name}-normal")
            deceptive, drec = train(task, replace(DECEPTIVE, **DECEPTIVE_BY_TASK.get(name, {})), args.seed, init=normal)
            save(deceptive, drec, out / f"gt-{name}-deceptive")
        print(f"{name}: normal {rec['held_out']}  deceptive {drec['held_out']}", flush=True)
        if args.diagnostics:
            others = [train(task, NORMAL, args.seed + s, progress=False)[0] for s in (1, 2)]
            test = task.generate(1000, seed=50_000 + args.seed)
            trn = task.generate(4000, seed=60_000 + args.seed)
            report[name] = {
                "normal": {"held_out": rec["held_out"]},
                "deceptive": {"held_out": drec["held_out"]},
                "seeds": dg.seed_variance([normal] + others, test),
                "normal_vs_deceptive": dg.seed_variance([normal, deceptive], test),
                "frozen_mlp_accuracy": dg.frozen_attention_mlp(
                    normal, trn, test, {"normal": normal, "deceptive": deceptive}
                ),
            }
            print(json.dumps(report[name], indent=1), flush=True)
    if args.diagnostics:
        (out / "gt-diagnostics.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
