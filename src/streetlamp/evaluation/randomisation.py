"""Model-parameter randomisation sanity checks (Adebayo et al., NeurIPS 2018, "Sanity Checks for Saliency
Maps"; Quantus' MPRT): does an explanation change when the model it explains is destroyed?

The model's parameters are split into **stages**, from the top: ``head`` (everything outside the base
model, i.e. the classifier / score / LM head, plus a BERT pooler), ``layer.{L-1}``, ..., ``layer.0``
(each block's parameters), then ``embed`` (what remains of the base model: token and position
embeddings, their norm, a final norm). A stage's tensors are redrawn as ``mean + std * N(0, 1)`` with
the tensor's own mean and standard deviation (``config.initializer_range``, else 0.02, for a
constant or one-element tensor), from a generator seeded by the run seed and the parameter's name,
so every chunk, mode and resumed run sees the same randomised model.

* **cascading**: stage ``k`` randomises stages ``0..k`` (top down, cumulatively);
* **independent**: stage ``k`` randomises that stage alone.

Always on a **copy** (``copy.deepcopy`` of the model, wrapped in its own adapter): the model being
evaluated is never modified (``tests/evaluation/test_randomisation.py`` hashes its weights before and
after). For each method, example and stage: ``mprt_{mode}_spearman@{stage}``, Spearman's rho between
the explanation on the trained model and on the randomised one over the non-special tokens
(:func:`streetlamp.stats.spearman_rho`), and ``mprt_{mode}_spearman_abs@{stage}`` of the absolute
scores (a sign flip alone is not a change of what the explanation points at).

**Verdict** (per method and cascading stage, ``randomisation_verdict.csv``): the mean rho over the
examples with its 95% bootstrap interval; ``pass`` when the interval lies below :data:`THRESHOLD` (the
explanation changed), ``fail`` when it lies at or above it (it barely changes although the model down
to that stage is destroyed), ``inconclusive`` otherwise. ``summary.md`` shows it at the top block
(head and last layer randomised) and with everything randomised (``@embed``).

**What a randomised copy explains** (``--randomisation-target``): ``prediction`` (the default) explains the
copy's own prediction, as the original check does; ``trained`` explains the class (or next token) the
trained model predicts on that example, on every copy, as Quantus' MPRT explains one fixed label. On a
two-class model the two differ wherever randomisation flips the prediction (a gradient method's scores
then change sign under ``prediction``; the ``_abs`` rho reads through that, the fixed target avoids it).

Smooth MPRT (``smprt_*``, denoised explanations) and Efficient MPRT (``emprt_*``, entropy rise against the
fully randomised model) run in the same pass: :mod:`.mprt_variants`.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import torch

from ..errors import StreetlampError
from ..methods.registry import get_method
from ..models.adapter import Inputs, ModelAdapter, Target
from ..stats import bootstrap_ci, spearman_rho
from .mprt_variants import Smoother, Variants, check_variants, entropy_rise, smooth_stages, variants_of

MODES = ("cascading", "independent")
CHOICES = ("cascading", "independent", "both")
TARGETS = ("prediction", "trained")  # what a randomised copy explains (see the module's docstring)
THRESHOLD = 0.5


def modes_of(spec: str) -> tuple[str, ...]:
    if spec == "both":
        return MODES
    if spec in MODES:
        return (spec,)
    raise StreetlampError(f"--randomisation must be one of {', '.join(CHOICES)} (got {spec!r})")


def check_methods(methods: list[str], params: dict) -> None:
    """Refuse randomisation for a method whose explanation does not read the model's weights."""
    for n in methods:
        if not get_method(n, **params.get(n, {})).uses_weights:
            raise StreetlampError(
                f"--randomisation / --efficient-mprt: method {n!r} does not read the model's weights, so "
                "randomising them cannot change its explanation; leave it out of --methods or drop the check"
            )


def check_settings(s: Any, adapter: ModelAdapter | None = None) -> None:
    """Every randomisation setting of ``s`` (the command's or the run's settings), and with the model its
    Smooth MPRT stages; one clear line before anything is written."""
    if s.randomisation:
        modes_of(s.randomisation)
    target = getattr(s, "randomisation_target", "prediction")
    if target not in TARGETS:
        raise StreetlampError(f"--randomisation-target must be one of {', '.join(TARGETS)} (got {target!r})")
    if target != "prediction" and not (s.randomisation or s.efficient_mprt):
        raise StreetlampError("--randomisation-target needs --randomisation or --efficient-mprt")
    check_variants(variants_of(s), s.randomisation)
    check_methods(s.methods, s.method_params)
    if adapter is not None and s.smooth_mprt:
        smooth_stages(s.smooth_mprt_stages, list(stage_parameters(adapter)))


def stage_parameters(adapter: ModelAdapter) -> dict[str, list[str]]:
    """Stage name -> parameter names of the adapter's model, in top-down order (empty stages left out)."""
    hf = adapter.hf_model
    names = {id(p): n for n, p in hf.named_parameters()}  # tied parameters appear once, under their first name
    base_ids = {id(p) for p in hf.base_model.parameters()}
    pooler = f"{hf.base_model_prefix}.pooler."
    head = [n for p, n in names.items() if p not in base_ids or n.startswith(pooler)]
    stages: dict[str, list[str]] = {"head": head}
    layer_ids = [{id(p) for p in m.parameters()} for m in adapter.layer_modules]
    for l in reversed(range(len(layer_ids))):
        stages[f"layer.{l}"] = [n for p, n in names.items() if p in layer_ids[l]]
    used = {n for v in stages.values() for n in v}
    stages["embed"] = [n for n in names.values() if n not in used]
    return {k: v for k, v in stages.items() if v}


def _generator(seed: int, name: str) -> torch.Generator:
    h = int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little")
    return torch.Generator().manual_seed(h % (2**63))


@torch.no_grad()
def randomise(hf_model: torch.nn.Module, names: list[str], seed: int, init_std: float) -> None:
    """Redraw the named parameters of ``hf_model`` in place (call it on a copy)."""
    params = dict(hf_model.named_parameters())
    for n in names:
        p = params[n]
        x = p.detach().double()
        mean = float(x.mean())
        std = float(x.std()) if x.numel() > 1 else 0.0
        if not std > 0:
            std = init_std
        z = torch.randn(p.shape, generator=_generator(seed, n), dtype=torch.float64)
        p.copy_((mean + std * z).to(p.dtype))


def randomised_copies(adapter: ModelAdapter, mode: str, seed: int) -> Iterator[tuple[str, ModelAdapter]]:
    """(stage, adapter of a randomised copy) for every stage of ``mode``, top down; one copy at a time."""
    stages = stage_parameters(adapter)
    order = list(stages)
    for k, stage in enumerate(order):
        names = [n for s in order[: k + 1] for n in stages[s]] if mode == "cascading" else stages[stage]
        yield stage, _copy(adapter, names, seed, f"{mode} randomisation to {stage}")


def fully_randomised(adapter: ModelAdapter, seed: int) -> ModelAdapter:
    """Every parameter redrawn: the same model as the last cascading stage (each tensor has its own generator)."""
    return _copy(adapter, [n for v in stage_parameters(adapter).values() for n in v], seed, "fully randomised")


def _copy(adapter: ModelAdapter, names: list[str], seed: int, what: str) -> ModelAdapter:
    init_std = float(getattr(adapter.hf_model.config, "initializer_range", None) or 0.02)
    hf = copy.deepcopy(adapter.hf_model)
    randomise(hf, names, seed, init_std)
    return ModelAdapter(hf, adapter.tokenizer, f"{adapter.name} ({what})")


def _explain(
    adapter: ModelAdapter,
    inputs: Inputs,
    name: str,
    params: dict,
    seed: int,
    budget: int | None,
    targets: list[int] | None = None,
) -> list[np.ndarray]:
    """``name``'s scores per example on ``adapter``: of its own prediction, or with ``targets`` of the
    output ``targets[b]`` (the examples that share a target are explained in one call)."""
    method = get_method(name, **params)
    if targets is None:
        exps = method.attribute(adapter, inputs, target=Target(), batch_size=budget, seed=seed)
        return [np.asarray(x.scores, np.float64) for x in exps]
    out: list[np.ndarray] = [np.empty(0)] * len(inputs)
    for t in sorted(set(targets)):
        idx = [b for b, x in enumerate(targets) if x == t]
        exps = method.attribute(adapter, inputs.select(idx), target=Target(index=t), batch_size=budget, seed=seed)
        for b, x in zip(idx, exps, strict=True):
            out[b] = np.asarray(x.scores, np.float64)
    return out


def _rho_rows(
    b: int, name: str, pre: str, t: np.ndarray, r: np.ndarray, special: np.ndarray
) -> list[tuple[int, str, str, float]]:
    return [
        (b, name, pre.format(""), spearman_rho(t, r, special)),
        (b, name, pre.format("_abs"), spearman_rho(abs(t), abs(r), special)),
    ]


def randomisation_rows(
    adapter: ModelAdapter,
    inputs: Inputs,
    scores: dict[str, list[np.ndarray]],
    specials: list[np.ndarray],
    methods: dict[str, dict],
    spec: str,
    seed: int,
    budget: int | None,
    variants: Variants | None = None,
    seeds: list[int] | None = None,
    targets: list[int] | None = None,
) -> list[tuple[int, str, str, float]]:
    """``(example index, method, metric, value)`` of every mode, stage, method and example; with
    ``variants`` also Smooth MPRT (at its stages) and Efficient MPRT (:mod:`.mprt_variants`; ``seeds``:
    the examples' seeds, for the noise). ``spec`` may be empty when only Efficient MPRT is asked for.
    ``targets``: the output each randomised copy explains per example (the trained model's predictions
    under ``--randomisation-target trained``); None: each copy's own prediction. ``scores`` explain the
    trained model's prediction either way."""
    v = variants or Variants()
    rows: list[tuple[int, str, str, float]] = []
    smoother = Smoother(adapter, inputs, v, seeds or [seed] * len(inputs), budget, seed) if v.smooth else None
    smooth_at = smooth_stages(v.stages, list(stage_parameters(adapter))) if smoother is not None else set()
    smooth_trained: dict[str, list[np.ndarray]] = {}
    full: dict[str, list[np.ndarray]] = {}
    last = list(stage_parameters(adapter))[-1]
    for mode in modes_of(spec) if spec else ():
        for stage, rnd in randomised_copies(adapter, mode, seed):
            for name, params in methods.items():
                rs = _explain(rnd, inputs, name, params, seed, budget, targets)
                if mode == "cascading" and stage == last:
                    full[name] = rs
                for b, r in enumerate(rs):
                    rows += _rho_rows(b, name, f"mprt_{mode}_spearman{{}}@{stage}", scores[name][b], r, specials[b])
                if smoother is None or stage not in smooth_at:
                    continue
                if name not in smooth_trained:
                    smooth_trained[name] = smoother.mean(adapter, name, params, scores[name])
                for b, r in enumerate(smoother.mean(rnd, name, params, rs, targets)):
                    rows += _rho_rows(
                        b, name, f"smprt_{mode}_spearman{{}}@{stage}", smooth_trained[name][b], r, specials[b]
                    )
    if v.efficient:
        whole = fully_randomised(adapter, seed) if len(full) < len(methods) else None
        for name, params in methods.items():
            rs = (
                full[name]
                if name in full
                else _explain(cast(ModelAdapter, whole), inputs, name, params, seed, budget, targets)
            )
            for b, r in enumerate(rs):
                rows += [(b, name, k, x) for k, x in entropy_rise(scores[name][b], r, specials[b], v.bins).items()]
    return rows


def verdicts(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per test, method and cascading stage: the mean (interval, n) and the verdict at that stage.
    ``mprt`` / ``smprt``: rho, pass below :data:`THRESHOLD`; ``emprt``: the entropy rise at ``embed``
    (fully randomised), pass above 0 (:mod:`.mprt_variants`)."""
    cols = ["test", "method", "stage", "mean", "ci_low", "ci_high", "n", "threshold", "verdict"]
    out = []
    for test in ("mprt", "smprt", "emprt"):
        pre = f"{test}_cascading_spearman@" if test != "emprt" else "emprt_rise"
        df = metrics[metrics.metric.str.startswith(pre)]
        for (method, metric), g in df.groupby(["method", "metric"], sort=True):
            mean, lo, hi, n = bootstrap_ci(g["value"].to_numpy())
            if test == "emprt":
                v = "pass" if lo > 0 else "fail" if hi <= 0 else "inconclusive"
                out.append((test, method, "embed", mean, lo, hi, n, 0.0, v))
            else:
                v = "pass" if hi < THRESHOLD else "fail" if lo >= THRESHOLD else "inconclusive"
                out.append((test, method, metric[len(pre) :], mean, lo, hi, n, THRESHOLD, v))
    return pd.DataFrame(out, columns=cols)


def top_block(stages: list[str]) -> str | None:
    """The first cascading stage that reaches into the blocks (head and the last layer randomised)."""
    layers = [s for s in stages if s.startswith("layer.")]
    return max(layers, key=lambda s: int(s.split(".")[1])) if layers else None


RHO = re.compile(r"^(?P<test>s?mprt)_(?P<mode>\w+?)_(?P<statistic>spearman(?:_abs)?)@(?P<stage>.+)$")
EMPRT = re.compile(r"^(?P<test>emprt)_(?P<statistic>\w+)$")


def write_verdicts(
    folder: Path, metrics: pd.DataFrame, intervals: pd.DataFrame, target: str = "prediction"
) -> list[str]:
    """``randomisation.csv`` (every test x mode x stage x method: mean, interval, n; Efficient MPRT's rows
    have mode ``cascading`` and stage ``embed``, the fully randomised model) and
    ``randomisation_verdict.csv``; the markdown lines for ``summary.md``, which say what the randomised
    copies explained (``target``, :data:`TARGETS`). ``intervals``: the run's
    :func:`~streetlamp.evaluation.confounds.interval_table`."""
    t = intervals[intervals.metric.map(lambda m: bool(RHO.match(m) or EMPRT.match(m)))].copy()
    parts = t.metric.str.extract(RHO)
    e = t.metric.str.extract(EMPRT)
    is_e = e.test.notna()
    parts.loc[is_e, "test"] = "emprt"
    parts.loc[is_e, "statistic"] = e.statistic[is_e]
    parts.loc[is_e, "mode"] = "cascading"
    parts.loc[is_e, "stage"] = "embed"
    cols = ["method", "test", "mode", "statistic", "stage", "mean", "ci_low", "ci_high", "n"]
    pd.concat([t[["method"]], parts, t[["mean", "ci_low", "ci_high", "n"]]], axis=1)[cols].to_csv(
        folder / "randomisation.csv", index=False
    )
    v = verdicts(metrics)
    v.to_csv(folder / "randomisation_verdict.csv", index=False)
    lines: list[str] = []
    for test, title in (("mprt", "Model randomisation"), ("smprt", "Smooth MPRT")):
        vt = v[v.test == test]
        if not vt.empty:
            lines += _rho_table(vt, title)
    ve = v[v.test == "emprt"]
    if not ve.empty:
        h = intervals.set_index(["method", "metric"])["mean"]
        lines += [
            "",
            "## Efficient MPRT: relative rise of the explanation's entropy, trained -> fully randomised; "
            "pass = interval above 0, fail = at or below 0",
            "",
            "| method | rise [95% interval] | verdict | H trained | H random | n |",
            "|---|---|---|---|---|---|",
        ]
        for r in ve.itertuples():
            h0, h1 = (
                h.get((r.method, "emprt_entropy_trained"), np.nan),
                h.get((r.method, "emprt_entropy_random"), np.nan),
            )
            lines.append(
                f"| {r.method} | {r.mean:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}] | {r.verdict} | {h0:.3f} | {h1:.3f} | {r.n} |"
            )
    said = {
        "prediction": "each randomised copy explains its own prediction",
        "trained": "each randomised copy explains the trained model's prediction (a fixed target)",
    }[target]
    return [f"Randomisation checks: {said} (--randomisation-target {target})."] + lines


def _rho_table(v: pd.DataFrame, title: str) -> list[str]:
    top = top_block(sorted(set(v.stage)))
    shown = [st for st in (top, "embed") if st is not None and st in set(v.stage)]
    if not shown:
        return []
    lines = [
        "",
        f"## {title} (cascading): Spearman rho trained vs randomised; pass = interval below "
        f"{THRESHOLD}, fail = at or above it ({' and '.join(f'@{st}' for st in shown)}: head down to that stage "
        "randomised)",
        "",
        "| method | " + " | ".join(f"rho@{st} [95% interval] | verdict" for st in shown) + " | n |",
        "|---|" + "---|---|" * len(shown) + "---|",
    ]
    for method, g in v.groupby("method", sort=True):
        by = g.set_index("stage")
        cells = [
            f"{by.loc[st, 'mean']:.3f} [{by.loc[st, 'ci_low']:.3f}, {by.loc[st, 'ci_high']:.3f}] | {by.loc[st, 'verdict']}"
            if st in by.index
            else " | "
            for st in shown
        ]
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {int(by['n'].max())} |")
    return lines
