"""``streetlamp benchmark``: which explanation methods recover the planted tokens?

For every task and variant (normal / deceptive ground-truth model) and every method, explain
``n_examples`` freshly generated texts (the prediction is the explained class) and score the
token scores against the planted tokens (AUPRC, precision@k) and by erasure (comprehensiveness,
sufficiency). A ``random`` baseline row is added. Methods explain the predicted class's *logit*
by default: these models are confident (p = 1.0 in float32 on most texts), and a saturated
probability hides what the model reads from perturbation and gradient methods alike. Writes ``leaderboard.csv``, ``circuits.csv`` (circuit methods' edge precision/recall against circuits
known by construction or training: :mod:`streetlamp.groundtruth.circuit_board`), ``models.csv``
(accuracy and attention mass on the planted tokens), ``leaderboard.png`` and ``manifest.json``.
"""

from __future__ import annotations

import csv
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...errors import StreetlampError
from ...groundtruth import leaderboard as lb
from ...groundtruth.tasks import get_task, planted_mask
from ...groundtruth.train import evaluate, weights_path
from ...methods.registry import get_method
from ...models.adapter import ModelAdapter, Target
from ...store.run_folder import RunFolder

if TYPE_CHECKING:
    from ...settings import RunOptions
    from . import BenchmarkSettings

VARIANTS = ("normal", "deceptive")
COLUMNS = [
    "task",
    "variant",
    "method",
    "average_precision",
    "auprc",
    "precision_at_k",
    "comprehensiveness",
    "sufficiency",
    "base_rate",
    "edge_share",
    "edge_share_uniform",
    "n_examples",
    "seconds",
    "error",
]
# cheap-but-sound settings for the tiny models (defaults are used for everything else)
# (texts are 6-12 words; recorded in manifest.json)
METHOD_PARAMS: dict[str, dict[str, Any]] = {
    "attention_attribution": {"steps": 8},
    "integrated_gradients": {"steps": 32, "adaptive": False},
    "shap": {"n_samples": 128},
    "lime": {"n_samples": 128},
}


@dataclass
class BenchmarkResult:
    out: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    models: list[dict[str, Any]] = field(default_factory=list)
    circuits: list[dict[str, Any]] = field(default_factory=list)  # circuit methods vs known circuits

    def _repr_html_(self) -> str:  # a notebook shows the run's report inline
        from ...report.viewer import iframe_html

        return iframe_html(self.out)

    def lines(self) -> list[str]:
        lines = []
        for m in self.models:
            lines.append(
                f"{m['task']:<9} {m['variant']:<9} accuracy {m['accuracy']:.3f}  attention mass on planted: "
                f"[CLS] last layer {m['mass_cls_last']:.3f}, all rows {m['mass_all']:.3f}"
            )
        for task in dict.fromkeys(r["task"] for r in self.rows):
            lines.append(f"\n== {task} ==")
            lines.append(f"{'variant':<10}{'method':<24}{'AP':>7}{'AUPRC':>7}{'P@k':>7}{'comp':>8}{'suff':>8}")
            rows = [r for r in self.rows if r["task"] == task]
            for r in sorted(rows, key=lambda r: (r["variant"] != "normal", -r.get("auprc", -1))):
                if r["error"]:
                    lines.append(f"{r['variant']:<10}{r['method']:<24} error: {r['error']}")
                else:
                    lines.append(
                        f"{r['variant']:<10}{r['method']:<24}{r['average_precision']:>7.3f}"
                        f"{r['auprc']:>7.3f}{r['precision_at_k']:>7.3f}"
                        f"{r['comprehensiveness']:>8.3f}{r['sufficiency']:>8.3f}"
                    )
        return lines + [f"output: {self.out}/ (leaderboard.csv, models.csv, leaderboard.png, manifest.json)"]


def load_groundtruth(task: str, variant: str) -> ModelAdapter:
    from ...models.loading import load

    path = weights_path(task, variant)
    if not (path / "config.json").exists():
        raise StreetlampError(f"no shipped model at {path}; run scripts/train_groundtruth.py")
    return load(path)


def score_method(
    adapter: ModelAdapter, name: str, examples: list, seed: int, device_budget: int | None, quantity: str = "logit"
) -> dict[str, Any]:
    inputs = adapter.encode([e.text for e in examples])
    t0 = time.time()
    if name == "random":
        rng = np.random.default_rng(seed)
        token_scores = [rng.random(n) for n in inputs.lengths]
        index = adapter.resolve(inputs, Target()).numpy()
    else:
        method = get_method(name, **METHOD_PARAMS.get(name, {}))
        method.check(adapter)
        exps = method.attribute(
            adapter,
            inputs,
            target=Target(quantity=quantity),  # type: ignore[arg-type]
            batch_size=device_budget,
            seed=seed,
        )
        token_scores = [e.scores for e in exps]
        index = np.array([e.info["target"]["index"] for e in exps])
    secs = time.time() - t0
    words = [lb.word_scores(s) for s in token_scores]
    masks = [planted_mask(e, n)[1:-1] for e, n in zip(examples, inputs.lengths)]
    comp, suff = lb.erasure_metrics(adapter, inputs, [np.asarray(s) for s in token_scores], index, device_budget)
    return {
        "average_precision": float(np.mean([lb.average_precision(w, m) for w, m in zip(words, masks)])),
        "auprc": float(np.mean([lb.auprc(w, m) for w, m in zip(words, masks)])),
        "precision_at_k": float(np.mean([lb.precision_at_k(w, m) for w, m in zip(words, masks)])),
        "comprehensiveness": float(comp.mean()),
        "sufficiency": float(suff.mean()),
        "base_rate": float(np.mean([m.mean() for m in masks])),
        "edge_share": float(np.mean([lb.edge_share(s) for s in token_scores])),
        "edge_share_uniform": float(np.mean([2 / n for n in inputs.lengths])),
        "seconds": round(secs, 2),
    }


def run(adapter: ModelAdapter | None, s: BenchmarkSettings, out: RunFolder | Path, opts: RunOptions) -> BenchmarkResult:
    """``streetlamp benchmark``: every task's normal and deceptive model, every method (``s.methods``, default
    every registered), scored against the planted tokens; the circuit leaderboard beside them."""
    from ...methods.registry import list_methods

    tasks, n_examples, seed, batch_size, quantity = s.tasks, s.n_examples, s.seed, s.batch_size, s.quantity
    methods, device = s.methods or list_methods(), opts.device
    rf = RunFolder.of(out, "benchmark")
    res = BenchmarkResult(rf.out)
    names = list(dict.fromkeys(["random"] + list(methods)))
    for task_name in tasks:
        task = get_task(task_name)
        examples = task.generate(n_examples, seed=30_000 + seed)
        for variant in VARIANTS:
            adapter = load_groundtruth(task_name, variant)
            if device != "cpu" or opts.dtype != "float32":
                adapter.to(device, opts.dtype)
            res.models.append(
                {
                    "task": task_name,
                    "variant": variant,
                    **evaluate(adapter, task.generate(max(n_examples, 500), seed=40_000 + seed)),
                }
            )
            for name in names:
                print(f"benchmark: {task_name} {variant} {name}", file=sys.stderr)
                torch.manual_seed(seed)
                row: dict[str, Any] = {
                    "task": task_name,
                    "variant": variant,
                    "method": name,
                    "n_examples": n_examples,
                    "error": "",
                }
                try:
                    row.update(score_method(adapter, name, examples, seed, batch_size, quantity))
                except StreetlampError as e:
                    row["error"] = str(e)
                except Exception as e:  # a method that crashes is reported, not fatal to the leaderboard
                    row["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
                res.rows.append(row)
    from ...groundtruth import circuit_board

    print("benchmark: circuits with known edges (planted and trained)", file=sys.stderr)
    res.circuits = circuit_board.circuit_leaderboard(seed=seed)
    with rf.staging() as w:
        write_csv(w.path / "leaderboard.csv", res.rows, COLUMNS)
        write_csv(w.path / "circuits.csv", res.circuits, circuit_board.COLUMNS)
        write_csv(w.path / "models.csv", res.models, ["task", "variant", "accuracy", "mass_cls_last", "mass_all"])
        from ...groundtruth.figure import plot_leaderboard

        plot_leaderboard(res.rows, w.path / "leaderboard.png")
        w.write_manifest(
            {
                "tasks": tasks,
                "methods": names,
                "method_params": {n: METHOD_PARAMS.get(n, {}) for n in names},
                "n_examples": n_examples,
                "seed": seed,
                "quantity": quantity,
                "files": {
                    "leaderboard.csv": "one row per task x variant x method; average precision, AUPRC and "
                    "precision@k of |token "
                    "scores| (words only) against the planted tokens; comprehensiveness / sufficiency AOPC",
                    "models.csv": "held-out accuracy and attention mass on the planted tokens ([CLS] row of "
                    "the last layer, head mean; and mean over all layers, heads and queries)",
                    "leaderboard.png": "AUPRC per method, normal vs deceptive, one panel per task",
                    "circuits.csv": "one row per known circuit x circuit method x size: edge precision and recall "
                    "of the method's top-k circuit against the known edges (docs/circuits.md, Ground truth)",
                },
            }
        )
    return res


def write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()})
