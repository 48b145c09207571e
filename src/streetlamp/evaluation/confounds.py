"""The table that sets the hard erasure metrics beside the ones that control their confounds (soft and
pi-controlled erasure, F-Fidelity, model randomisation), each as a mean over examples with its 95%
percentile-bootstrap interval (:func:`streetlamp.stats.bootstrap_ci`, 2000 resamples, seed 0).

Written by ``evaluate`` as ``faithfulness.csv`` (columns ``method, metric, mean, ci_low, ci_high, n``) and
as a section of ``summary.md``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..stats import bootstrap_ci

if TYPE_CHECKING:
    from ..methods.removal import Removal
    from ..models.adapter import Inputs, ModelAdapter
    from .common import ChunkTables

HARD = ("aopc_comprehensiveness", "aopc_sufficiency")
SOFT = ("soft_nc", "soft_ns", "pi_soft_nc", "pi_soft_ns")
FFID = ("ffid_aopc_plus", "ffid_aopc_minus")
MAIN = HARD + SOFT + FFID
# F-Fidelity (ffid_plus@r / ffid_minus@r) and randomisation (mprt_*) metrics are matched by pattern
PATTERN = re.compile(
    r"^(ffid_(plus|minus)(@[0-9.]+)?|ffid_aopc_(plus|minus)|s?mprt_(cascading|independent)_\w+@.+|emprt_\w+)$"
)
COLUMNS = ["method", "metric", "mean", "ci_low", "ci_high", "n"]


def wanted(metric: str) -> bool:
    return metric in HARD or metric in SOFT or bool(PATTERN.match(metric))


def interval_table(metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per (method, metric) of the metrics above: mean and interval over the examples."""
    if metrics.empty:
        return pd.DataFrame(columns=COLUMNS)
    df = metrics[metrics.metric.map(wanted)]
    rows = []
    for (method, metric), g in df.groupby(["method", "metric"], sort=True):
        mean, lo, hi, n = bootstrap_ci(g["value"].to_numpy())
        rows.append((method, metric, mean, lo, hi, n))
    return pd.DataFrame(rows, columns=COLUMNS)


def _cell(r: pd.Series) -> str:
    if r.n == 0:
        return ""
    if r.n < 2:
        return f"{r['mean']:.4f}"
    return f"{r['mean']:.4f} [{r.ci_low:.4f}, {r.ci_high:.4f}]"


def write_interval_table(folder: Path, metrics: pd.DataFrame) -> list[str]:
    """``faithfulness.csv`` and the markdown lines for ``summary.md`` (hard and soft erasure side by side)."""
    t = interval_table(metrics)
    t.to_csv(folder / "faithfulness.csv", index=False)
    main = t[t.metric.isin(MAIN)]
    if main.empty:
        return []
    cols = [m for m in MAIN if m in set(main.metric)]
    lines = [
        "## Hard and soft erasure, F-Fidelity (mean [95% bootstrap interval] over examples)",
        "",
        "| method | " + " | ".join(cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for method, g in main.groupby("method", sort=True):
        by = {r.metric: _cell(r) for _, r in g.iterrows()}
        lines.append(f"| {method} | " + " | ".join(by.get(c, "") for c in cols) + " |")
    return lines


def add_confound_metrics(
    tables: ChunkTables,
    examples: list[Any],
    s: Any,
    tuned: ModelAdapter | None,
    adapter: ModelAdapter,
    inputs: Inputs,
    scores: dict[str, list[np.ndarray]],
    specials: list[np.ndarray],
    removal: Removal,
    probs: np.ndarray,
    seeds: list[int],
) -> None:
    """The chunk's soft erasure, randomisation and F-Fidelity rows (``s``: the run's EvalSettings)."""
    add, arrays = tables.add, tables.arrays
    ids = [e.ids for e in examples]
    pred = probs.argmax(-1)
    budget = s.batch_size
    if s.soft:  # soft and pi-controlled erasure (evaluation/soft.py)
        from .soft import soft_erasure

        f_full = probs[np.arange(len(examples)), pred]
        soft = soft_erasure(
            adapter, ids, scores, specials, removal, f_full, pred, s.soft_pi, s.soft_samples, seeds, budget
        )
        for (name, b), (met, arr) in soft.items():
            for k, v in met.items():
                add(examples[b].id, name, k, v)
            for key, arr_v in arr.items():
                arrays[examples[b].id][f"{name}.{key}"] = arr_v
    if s.randomisation or s.efficient_mprt:  # randomisation checks on randomised copies (evaluation/randomisation.py)
        from .common import evaluate_params
        from .mprt_variants import variants_of
        from .randomisation import randomisation_rows

        params = {n: evaluate_params(s.method_params, n, adapter.kind) for n in s.methods}
        for b, name, k, v in randomisation_rows(
            adapter,
            inputs,
            scores,
            specials,
            params,
            s.randomisation,
            s.seed,
            budget,
            variants_of(s),
            seeds,
            [int(p) for p in pred] if s.randomisation_target == "trained" else None,
        ):
            add(examples[b].id, name, k, v)
    if tuned is not None:  # F-Fidelity on the fine-tuned copy (evaluation/ffidelity.py)
        from .common import output_probs
        from .ffidelity import FFidelity, ffidelity_metrics

        ff, f_tuned = ffidelity_metrics(tuned, ids, scores, specials, pred, FFidelity(**s.ffidelity), seeds, budget)
        p_tuned = output_probs(tuned, ids, budget)
        for b, e in enumerate(examples):
            add(e.id, "ffidelity_model", "prob", f_tuned[b])
            add(e.id, "ffidelity_model", "correct", p_tuned[b].argmax() == e.gold)
        for (name, b), met in ff.items():
            for k, v in met.items():
                add(examples[b].id, name, k, v)
