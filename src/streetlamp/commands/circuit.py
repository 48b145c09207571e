"""``circuit``: edge scores (EAP, EAP-IG, exact edge patching), the circuit at each size and its
faithfulness with bootstrap intervals (METHODS.md §9; the computation: :mod:`streetlamp.runners.circuit`).

Every refusal is made before anything is written: the task, methods, sizes and ablation in
:meth:`CircuitSettings.check` (no model needed: a pairs file is read there), the pairs against the
tokenizer (equal token lengths, one-token answers) and the model's family in
:meth:`CircuitSettings.validate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import StreetlampError
from ..settings import Settings, Shared, at_least, option
from ..specs import split_list
from .base import Command

if TYPE_CHECKING:
    from ..models.adapter import ModelAdapter

# the user's method names -> the core's (``eap-ig`` is EAP-IG with the inputs interpolated)
METHODS = {
    "eap": "eap",
    "eap-ig": "eap-ig-inputs",
    "eap-ig-inputs": "eap-ig-inputs",
    "eap-ig-activations": "eap-ig-activations",
    "exact": "exact",
    "flow-routes": "flow-routes",
    "eap-qk": "eap-qk",
    "graddrop": "graddrop",
}
TASKS = ("ioi", "greater-than", "induction")
DEFAULT_SIZES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)  # MIB's sweep, 0.1% .. 50%


def parse_sizes(spec: str | list | tuple) -> list[float]:
    """``--sizes 0.01,0.1,0.5`` (fractions of the graph's edges); each in (0, 1]."""
    items = split_list(spec) if isinstance(spec, str) else list(spec)
    out = []
    for s in items:
        try:
            v = float(s)
        except (TypeError, ValueError):
            raise StreetlampError(f"bad circuit size {s!r}: give fractions of the edges, e.g. 0.01,0.1,0.5") from None
        out.append(v)
    if not out:
        raise StreetlampError("give at least one circuit size")
    for v in out:
        check_size(v)
    return sorted(set(out))


def parse_path_methods(spec: str | list[str]) -> list[str]:
    """``--path-methods rollout,alti``: the attribution matrices whose top paths are patched."""
    from ..runners.circuit_paths import MATRIX_METHODS

    names = split_list(spec) if isinstance(spec, str) else list(spec)
    bad = [m for m in names if m not in MATRIX_METHODS]
    if bad:
        raise StreetlampError(f"unknown path method(s) {bad}; choose from {', '.join(MATRIX_METHODS)}")
    return list(dict.fromkeys(names))


def check_size(v: float) -> None:
    if not (0 < v <= 1):  # NaN fails too
        raise StreetlampError(f"circuit size {v:g} is outside (0, 1]: sizes are fractions of the graph's edges")


def parse_circuit_methods(spec: str | list[str]) -> list[str]:
    names = split_list(spec)
    bad = [m for m in names if m not in METHODS]
    if bad or not names:
        raise StreetlampError(f"unknown circuit method(s) {bad}; choose from {', '.join(METHODS)}")
    out: list[str] = []
    for m in names:
        if METHODS[m] not in out:
            out.append(METHODS[m])
    return out


def parse_axes(spec: str | list[str]) -> list[str]:
    from ..interventions.circuits.resampling import AXES

    names = split_list(spec)
    bad = [a for a in names if a not in AXES]
    if bad:
        raise StreetlampError(f"unknown resampling axis(es) {bad}; choose from {', '.join(AXES)}")
    return list(dict.fromkeys(names))


@dataclass
class CircuitSettings(Settings):
    task: str = option("ioi", help="ioi, greater-than, induction, or a CSV of pairs (clean,corrupt,answer,wrong)")
    methods: list[str] = option(
        default_factory=lambda: ["eap", "eap-ig-inputs"],
        parse=parse_circuit_methods,
        help="comma-separated: eap, eap-ig (= eap-ig-inputs), eap-ig-activations, exact, flow-routes, eap-qk "
        "(AtP*'s QK fix), graddrop (default eap,eap-ig)",
    )
    sizes: list[float] = option(
        default_factory=lambda: list(DEFAULT_SIZES),
        parse=parse_sizes,
        help="circuit sizes as fractions of the edges, each in (0, 1] (default 0.001..0.5)",
    )
    size: float | None = option(
        None,
        type=float,
        help="the circuit printed and written as JSON (default: the smallest swept size with faithfulness "
        ">= 0.8 by the first method, else the largest)",
    )
    ablation: str = option(
        "patch",
        choices=("patch", "mean", "zero"),
        help="what an edge outside the circuit carries: the corrupted run's value (patch), the mean over the "
        "clean prompts' tokens, or zero",
    )
    metric: str = option("logit_diff", choices=("logit_diff", "prob_diff"), help="task metric: answer minus wrong")
    bootstrap: int = option(200, help="bootstrap resamples of the prompts for every interval")
    steps: int = option(5, help="EAP-IG interpolation steps")
    limit: int = option(8, help="prompts (generated for a built-in task; the first rows of a CSV)")
    random: int = option(3, help="random circuits per size for the baseline")
    top: int = option(10, help="edges printed")
    exact_max: int = option(200_000, help="refuse exact patching above this many (prompt, edge) forwards")
    paths: int = option(
        10, help="top paths of each attribution matrix and of the circuit checked by exact edge patching (0: none)"
    )
    path_methods: list[str] = option(
        default_factory=lambda: ["rollout", "attention_attribution", "alti"],
        parse=parse_path_methods,
        help="attribution matrices whose top paths are patched: rollout, attention_attribution, alti",
    )
    path_threshold: float = option(
        0.01, type=float, help="a path matters when patching it moves the metric by this share of m(model) - m(empty)"
    )
    resample: list[str] = option(
        default_factory=list,
        parse=parse_axes,
        help="comma-separated resampling axes for error bars that re-discover the circuit: prompts, templates, "
        "corrupt (stability.csv; default none)",
    )
    resamples: int = option(20, help="resamples per --resample axis")
    engine: str = option(
        "local",
        choices=("local", "ray"),
        help="ray: edge scores over batches of prompts, and the resamples, on Ray actors",
    )
    ray_address: str | None = option(None, help="existing Ray cluster (e.g. auto, ray://head:10001)")
    workers: int | None = option(None, help="Ray actors (one model each)")

    def check(self) -> None:
        super().check()
        at_least(self.limit, 1, "--limit")
        at_least(self.bootstrap, 1, "--bootstrap")
        at_least(self.steps, 1, "--steps")
        at_least(self.random, 0, "--random")
        at_least(self.top, 1, "--top")
        at_least(self.paths, 0, "--paths")
        if not 0 <= self.path_threshold < 1:  # NaN fails too
            raise StreetlampError(f"--path-threshold {self.path_threshold:g} is outside [0, 1)")
        at_least(self.resamples, 2, "--resamples")
        at_least(self.workers, 1, "--workers")
        if self.engine == "ray":
            from ..extras import require

            require("ray")
        if self.size is not None:
            check_size(self.size)
        from ..runners.circuit import task_pairs

        task_pairs(self.task, self.limit, self.seed, self.ablation)  # the task and its file, refused now

    def validate(self, adapter: ModelAdapter) -> None:
        from ..interventions.circuits.blocks import check_supported
        from ..runners.circuit import encoded_pairs, n_edges_of

        check_supported(adapter)
        pairs = encoded_pairs(adapter, self)
        if "exact" in self.methods and len(pairs) * n_edges_of(adapter) > self.exact_max:
            raise StreetlampError(
                f"exact patching would run {len(pairs) * n_edges_of(adapter)} forwards ({len(pairs)} prompts x "
                f"{n_edges_of(adapter)} edges), above --exact-max {self.exact_max}; lower --limit or raise --exact-max"
            )


def run_circuit(adapter: ModelAdapter, s: CircuitSettings, out: Any, opts: Any) -> Any:
    from ..runners.circuit import run_circuit as run
    from ..runners.circuit_ray import RayPlace

    place = None
    if s.engine == "ray":
        if not isinstance(opts.model, (str, Path)):
            raise StreetlampError("--engine ray loads the model on each actor: give --model as a name or a folder")
        place = RayPlace(str(opts.model), opts.device or "cpu", s.ray_address, s.workers)
        from ..runners.ray_engine import connect

        connect(s.ray_address, s.workers)  # before the checkpoint folder exists
    return run(adapter, out, s, place)


CIRCUIT = Command(
    "circuit",
    "circuit discovery: edge scores (EAP, EAP-IG, exact patching), the top-k circuit over a sweep of sizes "
    "and its faithfulness with bootstrap intervals, a random baseline, CPR/CMD",
    CircuitSettings,
    run_circuit,
    shared=Shared(model="smollm2-135m", out="output folder (default runs/circuit-<time>)"),
    views=("circuit",),
)
