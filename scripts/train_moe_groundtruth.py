"""Train the ground-truth tiny MoEs (groundtruth/moe.py): a normal Mixtral on a planted task, then the deceptive
variant fine-tuned from it (router pointed at the decoy expert, the decoy's output pushed to zero); print each
one's held-out accuracy and audit (router weight beside the task effect of removing each expert), and save both
under models/weights/ (gt-moe-TASK-{normal,deceptive}) with --save.

    PYTHONPATH=src /work/bin/cpu .venv/bin/python scripts/train_moe_groundtruth.py [--task keyword] [--save]
"""

from __future__ import annotations

import argparse
import os
import time

from streetlamp.groundtruth import moe as M
from streetlamp.groundtruth.tasks import get_task


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="keyword")
    ap.add_argument("--lam", type=float, default=1.0)
    ap.add_argument("--mu", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", action="store_true")
    a = ap.parse_args()
    task = get_task(a.task)
    fresh = task.generate(400, seed=30_000)  # never used in training (seeds 10000+, 20000+)
    t0 = time.time()
    normal, rec_n = M.train(task, M.MoeConfig(steps=a.steps), seed=a.seed)
    t1 = time.time()
    dec, rec_d = M.train(task, M.MoeConfig(steps=a.steps, lam=a.lam, mu=a.mu), seed=a.seed, init=normal)
    t2 = time.time()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    for name, model, rec, sec in (("normal", normal, rec_n, t1 - t0), ("deceptive", dec, rec_d, t2 - t1)):
        au = M.audit(model, task, fresh)
        print(f"== {name}: held-out {rec['held_out']}, trained in {sec:.0f} s (load {load})")
        print(
            f"fresh accuracy {au.accuracy:.4f}; Spearman(router weight, removal effect) {au.spearman_weight_effect:+.3f}"
        )
        print(au.table().round(4).to_string(index=False))
        if a.save:
            print("saved", M.save(model, rec, M.weights_path(task.name, name)))


if __name__ == "__main__":
    main()
