"""``streetlamp lens --check``: each lens checked against intervention (its tables, arrays, CSV files and
summary), and the manifest's ``lens_view`` section that the report's lens view (``static/lens.js``) draws.

Variants (``--check-variant``): ``patch`` (each row's residual patched into the neutral context:
``lens_check.csv``, arrays ``check.*``), ``baseline`` (each row's residual replaced by a baseline in the same
prompt: ``lens_check_baseline.csv``, arrays ``check_baseline.*``), ``both``. The definitions are in
:mod:`streetlamp.interventions.lenses.check`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from ...interventions.lenses.base import Lens, row_label
from ...interventions.lenses.check import (
    BASELINE_COLUMNS,
    COLUMNS,
    check_against_intervention,
    check_baseline,
    neutral_rows,
)
from ...stats import spearman_rho

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter

VARIANTS = ("patch", "baseline", "both")
AXIS = ["layer(0=embedding, l+1=after layer l)"]
FILES = {"patch": "lens_check.csv", "baseline": "lens_check_baseline.csv"}


def variants_of(variant: str | None, check: bool) -> list[str]:
    """The variants run: none without ``--check`` / ``--check-variant``; ``--check`` alone is ``patch``."""
    if variant is None:
        return ["patch"] if check else []
    return ["patch", "baseline"] if variant == "both" else [variant]


def baseline_vectors(adapter: ModelAdapter, lens: Lens, which: str, neutral: list[int]) -> torch.Tensor:
    """``[L + 1, d]``: the neutral context's residual per row at its last position, or the lens's stored
    mean residual per row over its fit corpus (refused where the lens has none)."""
    if which == "neutral":
        return neutral_rows(adapter, neutral)
    assert which == "mean" and lens.mean is not None, "LensSettings.check/validate refuse it"
    return lens.mean


@dataclass
class Checks:
    """What the checks add to the run: tables, arrays (+ descriptions), CSV frames, summary entries."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    tables: list[dict] = field(default_factory=list)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    described: dict[str, dict] = field(default_factory=dict)
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)


def _arrays(c: Checks, prefix: str, res: dict, what: list[tuple[str, str]], name: str) -> None:
    for k, meaning in what:
        c.arrays[f"{prefix}.{k}"] = np.asarray(res[k], np.float64)
        c.described[f"{prefix}.{k}"] = {"axes": AXIS, "meaning": f"{name} check: {meaning}"}


def _table_rows(rows: list[dict], fields: list[str]) -> list[list]:
    """A check table's rows: the layer (``embed`` for row 0), ``fields`` (top tokens as ``repr``: text,
    never markup), then the disagreement flag."""
    return [
        [
            "embed" if r["row"] == 0 else r["row"] - 1,
            *(repr(r[k]) if k.endswith("_top") else r[k] for k in fields),
            "DISAGREES" if r["disagrees"] else "",
        ]
        for r in rows
    ]


def run_checks(
    adapter: ModelAdapter,
    ids: torch.Tensor,
    lens: Lens,
    index: int,
    *,
    name: str,
    variants: list[str],
    baseline: str,
    neutral: list[int],
) -> Checks:
    c = Checks()
    L = adapter.n_layers
    target = adapter.output_label(index)
    if "patch" in variants:
        res = check_against_intervention(adapter, ids, lens, index, neutral)
        c.results["patch"] = res
        flagged = [r["layer"] for r in res["rows"] if r["disagrees"]]
        c.tables.append(
            {
                "title": f"{name} checked against intervention: each layer's residual at the last position patched "
                f"into the neutral context {[adapter.output_label(t) for t in res['neutral']]!r}",
                "columns": [
                    "layer",
                    "lens top",
                    "patched top",
                    "top-1 match",
                    "KL(patched || lens)",
                    f"rank of {target!r} (lens)",
                    f"rank of {target!r} (patched)",
                    "disagrees",
                ],
                "rows": _table_rows(
                    res["rows"],
                    ["lens_top", "patched_top", "top1_match", "kl_patched_lens", "rank_lens", "rank_patched"],
                ),
                "note": f"{len(flagged)} of {L + 1} layers disagree (the lens's top token is not the patched run's): "
                + (", ".join(flagged) or "none"),
            }
        )
        c.summary["check"] = {
            "file": FILES["patch"],
            "neutral": res["neutral"],
            "agreement": float(np.mean(res["top1_match"])),
            "disagreeing_layers": flagged,
        }
        _arrays(
            c,
            "check",
            res,
            [
                ("kl", "KL(patched outcome || lens readout) at the last position, nats"),
                ("top1_match", "1 where the lens's top token is the patched run's top token"),
                ("rank_lens", f"rank of {target!r} under the lens readout (0 = top)"),
                ("rank_patched", f"rank of {target!r} in the patched run's output (0 = top)"),
            ],
            name,
        )
        c.frames[FILES["patch"]] = pd.DataFrame(res["rows"], columns=COLUMNS)
    if "baseline" in variants:
        vectors = baseline_vectors(adapter, lens, baseline, neutral)
        res = check_baseline(adapter, ids, lens, index, vectors, baseline)
        c.results["baseline"] = res
        flagged = [r["layer"] for r in res["rows"] if r["disagrees"]]
        where = (
            f"the neutral context {[adapter.output_label(t) for t in neutral]!r}'s residual at that layer"
            if baseline == "neutral"
            else "the mean residual at that layer over the lens's fit corpus"
        )
        c.tables.append(
            {
                "title": f"{name} checked against intervention: each layer's residual at the last position replaced "
                f"by a baseline ({where}) in the same prompt",
                "columns": [
                    "layer",
                    "lens: most promoted",
                    "model: most promoted",
                    "top-1 match",
                    "KL(prompt || replaced)",
                    "KL(lens || lens of baseline)",
                    f"rank of {target!r} (lens)",
                    f"rank of {target!r} (model)",
                    "disagrees",
                ],
                "rows": _table_rows(
                    res["rows"],
                    ["lens_top", "model_top", "top1_match", "kl_model", "kl_lens", "rank_lens", "rank_model"],
                ),
                "note": f"{len(flagged)} of {L + 1} layers disagree (the token the residual promotes most over the "
                "baseline differs between the lens and the model): " + (", ".join(flagged) or "none"),
            }
        )
        c.summary["check_baseline"] = {
            "file": FILES["baseline"],
            "baseline": baseline,
            "agreement": float(np.mean(res["top1_match"])),
            "disagreeing_layers": flagged,
            "spearman_kl": spearman_rho(np.asarray(res["kl_model"]), np.asarray(res["kl_lens"])),
        }
        _arrays(
            c,
            "check_baseline",
            res,
            [
                ("kl_model", "KL(prompt's output || output with the residual replaced by the baseline), nats"),
                ("kl_lens", "KL(lens readout of the residual || lens readout of the baseline), nats"),
                ("top1_match", "1 where the token the residual promotes most is the same by lens and by model"),
                ("rank_lens", f"rank of {target!r} by how much the lens says the residual promotes it (0 = most)"),
                ("rank_model", f"rank of {target!r} by how much the residual promotes it in the model (0 = most)"),
            ],
            name,
        )
        c.arrays["check_baseline.vectors"] = res["baseline_vectors"]
        c.described["check_baseline.vectors"] = {
            "axes": AXIS + ["d_model"],
            "meaning": f"the baseline ({baseline}) each layer's residual was replaced by",
        }
        c.frames[FILES["baseline"]] = pd.DataFrame(res["rows"], columns=BASELINE_COLUMNS)
    return c


def run_coords(
    adapter: ModelAdapter,
    ids: torch.Tensor,
    lens: Lens,
    kind: str,
    tokens: list[int],
    alpha: float,
    name: str,
    c: Checks,
) -> None:
    """``--ablate`` / ``--swap``: the coordinate intervention at every layer (its table, arrays and
    ``lens_coords.csv``), added to ``c``."""
    from ...interventions.lenses.coords import coordinate_effects, effect_arrays, effect_rows

    res = coordinate_effects(adapter, ids, lens, kind, tokens, alpha)
    rows = effect_rows(adapter, res)
    labels = [adapter.output_label(t) for t in tokens]
    what = (
        f"the lens direction of {labels[0]!r} projected out"
        if kind == "ablate"
        else f"the lens coordinates of {labels[0]!r} and {labels[1]!r} exchanged (alpha {alpha:g})"
    )
    cols = [k for k in rows[0] if k.startswith("dlogp_")]
    c.tables.append(
        {
            "title": f"{name}: {kind} at each layer's residual at the last position ({what}), in the same prompt",
            "columns": [
                "layer",
                *[k.replace("dlogp_", "Δlog p ").replace("_", " (") + ")" for k in cols],
                "KL(prompt || edited)",
                "top after",
            ],
            "rows": [[r["layer"], *[r[k] for k in cols], r["kl_model"], repr(r["top_after"])] for r in rows],
            "note": "model: the output of the edited run against the prompt's; lens: the lens's readout of the "
            "edited residual against its readout of the original (what the lens predicts the edit does)",
        }
    )
    names = ["source", "target"] if kind == "swap" else ["token0"]
    for k, v in effect_arrays(res).items():
        c.arrays[f"coords.{k}"] = np.asarray(v, np.float64)
        c.described[f"coords.{k}"] = {
            "axes": AXIS + ([] if k == "kl" else [f"token({','.join(names)})"]),
            "meaning": f"{name} {kind} ({what}): "
            + {
                "dlogp_model": "change of each token's log-probability in the model's output",
                "dlogp_lens": "change of each token's log-probability in the lens's readout of the residual",
                "kl": "KL(prompt's output || edited output), nats",
            }[k],
        }
    c.frames["lens_coords.csv"] = pd.DataFrame(rows)
    c.summary["coords"] = {"file": "lens_coords.csv", "kind": kind, "tokens": labels, "alpha": alpha}


def view_section(
    adapter: ModelAdapter, lens_out: dict, labels: list[str], index: int, kind: str, checks: Checks, top: int = 5
) -> dict[str, Any]:
    """The manifest's ``lens_view``: what the lens view draws that is text (token labels), beside the arrays
    (``lens.*``, ``check.*``, ``check_baseline.*``) it reads the numbers from."""
    L = adapter.n_layers
    ids = lens_out["top_ids"][:, -1, :top]
    view: dict[str, Any] = {
        "kind": kind,
        "layers": [row_label(r) for r in range(L + 1)],
        "position": len(labels) - 1,
        "position_label": labels[-1],
        "target": {"index": int(index), "label": adapter.output_label(index)},
        "top_k": int(ids.shape[1]),
        "lens_top": [[adapter.output_label(int(i)) for i in row] for row in ids],
        "variants": list(checks.results),
    }
    if "patch" in checks.results:
        res = checks.results["patch"]
        view["patch"] = {
            "file": FILES["patch"],
            "neutral": [adapter.output_label(t) for t in res["neutral"]],
            "lens_top": [r["lens_top"] for r in res["rows"]],
            "outcome_top": [r["patched_top"] for r in res["rows"]],
        }
    if "baseline" in checks.results:
        res = checks.results["baseline"]
        view["baseline"] = {
            "file": FILES["baseline"],
            "baseline": res["baseline"],
            "lens_top": [r["lens_top"] for r in res["rows"]],
            "outcome_top": [r["model_top"] for r in res["rows"]],
        }
    return view
