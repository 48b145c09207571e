"""``circuit``: edge scores (EAP, EAP-IG, exact edge patching), the circuit at each size and its
faithfulness with bootstrap intervals (METHODS.md §9; the computation: :mod:`streetlamp.commands.circuit.run`).

Every refusal is made before anything is written: the task, methods, sizes and ablation in
:meth:`CircuitSettings.check` (no model needed: a pairs file is read there), the pairs against the
tokenizer (equal token lengths, one-token answers) and the model's family in
:meth:`CircuitSettings.validate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import StreetlampError
from ...settings import Settings, Shared, option
from ...specs import split_list
from ..base import Command, lazy

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter

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
    "eap-gim": "eap-gim",
    "eap-ig-gim": "eap-ig-inputs-gim",
}
# core method names that do not run on expert nodes, and why (their user names)
EXPERT_REFUSED = {
    "flow-routes": "flow-routes (its contribution split knows one MLP reader per layer)",
    "eap-gim": "eap-gim (GIM has no rule for the router or the fused experts)",
    "eap-ig-inputs-gim": "eap-ig-gim (GIM has no rule for the router or the fused experts)",
}
TASKS = ("ioi", "greater-than", "induction", "arithmetic-addition", "arithmetic-subtraction", "mcqa")
MAX_RANDOM = 1000  # random circuits per size: each one more pass over the prompts at every size
DEFAULT_SIZES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # MIB's ten sizes (faithfulness.py)


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
    from .paths import MATRIX_METHODS

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
    from ...interventions.circuits.resampling import AXES

    names = split_list(spec)
    bad = [a for a in names if a not in AXES]
    if bad:
        raise StreetlampError(f"unknown resampling axis(es) {bad}; choose from {', '.join(AXES)}")
    return list(dict.fromkeys(names))


@dataclass
class CircuitSettings(Settings):
    task: str = option(
        "ioi",
        help="ioi, greater-than, induction, arithmetic-addition, arithmetic-subtraction, mcqa (MIB's templates), a "
        "CSV of pairs (clean,corrupt,answer,wrong), or with --mib-task a downloaded MIB split",
    )
    mib_task: str | None = option(
        None,
        choices=("ioi", "mcqa", "arc-easy", "arc-challenge", "arithmetic-addition", "arithmetic-subtraction"),
        help="read --task as a downloaded MIB split of this task (.jsonl, .json or .parquet rows, as MIB's "
        "dataset.py reads them from the hub; MIB's filter applied)",
    )
    circuit_file: str | None = option(
        None,
        help="also evaluate a circuit file in MIB's JSON format (circuit_loading.py; e.g. one MIB or streetlamp "
        "wrote) for this model: its edge scores ranked as MIB ranks them, as the method 'file'",
    )
    methods: list[str] = option(
        default_factory=lambda: ["eap", "eap-ig-inputs"],
        parse=parse_circuit_methods,
        help="comma-separated: eap, eap-ig (= eap-ig-inputs), eap-ig-activations, exact, flow-routes, eap-qk "
        "(AtP*'s QK fix), graddrop, eap-gim, eap-ig-gim (EAP / EAP-IG with GIM's backward) (default eap,eap-ig)",
    )
    sizes: list[float] = option(
        default_factory=lambda: list(DEFAULT_SIZES),
        parse=parse_sizes,
        help="circuit sizes as fractions of the edges, each in (0, 1] (default MIB's ten: 0.001..0.5 and 1)",
    )
    areas: str | None = option(
        None,
        choices=("mib", "sweep"),
        help="mib: MIB's CPR and CMD over its ten sizes (--sizes must hold them); sweep: the same raw-axis "
        "areas over --sizes, named area_under / area_from_1 (default: mib when --sizes holds MIB's ten, else sweep)",
    )
    size: float | None = option(
        None,
        gt=0,
        le=1,
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
    expert_nodes: bool = option(
        False,
        help="mixture-of-experts models: split each MoE layer's MLP node into one node per expert (L{l}.E{e}: its "
        "routed, weighted output; L{l}.SE: the shared expert), read through the router's input (L{l}.router) and "
        "each expert's own, so every method, the sweep and --audit score edges into and out of experts",
    )
    bootstrap: int = option(200, ge=1, help="bootstrap resamples of the prompts for every interval")
    steps: int = option(5, ge=1, help="EAP-IG interpolation steps")
    limit: int = option(8, ge=1, help="prompts (generated for a built-in task; the first rows of a CSV)")
    random: int = option(
        3, ge=0, le=MAX_RANDOM, help=f"random circuits per size for the baseline (at most {MAX_RANDOM})"
    )
    top: int = option(10, ge=1, help="edges printed")
    exact_max: int = option(200_000, ge=0, help="refuse exact patching above this many (prompt, edge) forwards")
    audit: int = option(
        0,
        ge=0,
        help="audit each first-order method against exact patching: this many random edges (the same for every "
        "method) and each method's top this many by |score|, each patched exactly (audit.csv, audit_edges.parquet; "
        "0: none)",
    )
    paths: int = option(
        10,
        ge=0,
        help="top paths of each attribution matrix and of the circuit checked by exact edge patching (0: none)",
    )
    path_methods: list[str] = option(
        default_factory=lambda: ["rollout", "attention_attribution", "alti"],
        parse=parse_path_methods,
        help="attribution matrices whose top paths are patched: rollout, attention_attribution, alti",
    )
    path_threshold: float = option(
        0.01, ge=0, lt=1, help="a path matters when patching it moves the metric by this share of m(model) - m(empty)"
    )
    bootstrap_selection: bool = option(
        False,
        help="also select each method's circuits by bootstrapped inclusion (arXiv 2510.25786: the edges most often "
        "in the top k over --bootstrap resamples of the prompts), swept beside the plain top k as '<method>:bootstrapped'",
    )
    resample: list[str] = option(
        default_factory=list,
        parse=parse_axes,
        help="comma-separated resampling axes for error bars that re-discover the circuit: prompts, templates, "
        "corrupt (stability.csv; default none)",
    )
    resamples: int = option(20, ge=2, help="resamples per --resample axis")
    resample_faithfulness: str = option(
        "all",
        choices=("all", "chosen", "none"),
        help="the sizes whose faithfulness each resample measures: all, the chosen --size only, or none (the "
        "circuits, Jaccard and mean pairwise Jaccard only: no forward on the prompts and templates axes)",
    )
    engine: str = option(
        "local",
        choices=("local", "ray"),
        help="ray: edge scores over batches of prompts, and the resamples, on Ray actors",
    )
    ray_address: str | None = option(None, help="existing Ray cluster (e.g. auto, ray://head:10001)")
    workers: int | None = option(None, ge=1, help="Ray actors (one model each)")

    def check(self) -> None:
        super().check()
        if self.engine == "ray":
            from ...extras import require

            require("ray")
        from ...interventions.circuits.faithfulness import check_areas

        check_areas(self.areas_mode(), self.sizes)
        if self.expert_nodes:
            bad = [m for m in self.methods if m in EXPERT_REFUSED]
            if bad:
                raise StreetlampError(
                    f"--expert-nodes: {', '.join(EXPERT_REFUSED[m] for m in bad)} cannot run on expert nodes yet; "
                    "choose among eap, eap-ig, eap-ig-activations, exact, eap-qk, graddrop"
                )
            if self.engine == "ray":
                raise StreetlampError(
                    "--expert-nodes runs on --engine local only (the Ray actors build the plain graph)"
                )
        from .run import task_pairs

        task_pairs(self.task, self.limit, self.seed, self.ablation, mib_task=self.mib_task)  # refused now
        if self.circuit_file is not None:
            if not Path(self.circuit_file).is_file():
                raise StreetlampError(f"circuit file {self.circuit_file} does not exist")
            if "file" not in self.methods:
                self.methods = [*self.methods, "file"]

    def audited(self) -> list[str]:
        """The methods ``--audit`` checks: every edge score but exact patching itself and a read circuit file."""
        return [m for m in self.methods if m not in ("exact", "file")]

    def areas_mode(self) -> str:
        """``--areas``, or by default ``mib`` when the sizes hold MIB's ten, else ``sweep``."""
        if self.areas is not None:
            return self.areas
        from ...interventions.circuits.faithfulness import default_areas

        return default_areas(self.sizes)

    def validate(self, adapter: ModelAdapter) -> None:
        from ...interventions.circuits.blocks import check_supported
        from .run import check_memory, encoded_pairs

        check_supported(adapter)
        from ...interventions.circuits.blocks import graph_of

        graph = graph_of(adapter, self.expert_nodes)  # --expert-nodes on a dense model: refused here
        if self.circuit_file is not None:
            from ...interventions.circuits.mib import read_circuit

            read_circuit(self.circuit_file, graph, adapter.d_model)
        pairs = encoded_pairs(adapter, self)
        check_memory(adapter, self, len(pairs))
        if self.audit and len(pairs) * self.audit * (1 + len(self.audited())) > self.exact_max:
            raise StreetlampError(
                f"--audit {self.audit} would patch up to {len(pairs) * self.audit * (1 + len(self.audited()))} "
                f"(prompt, edge) forwards, above --exact-max {self.exact_max}; lower --audit or --limit, or raise "
                "--exact-max"
            )
        if "exact" in self.methods and len(pairs) * graph.n_edges > self.exact_max:
            raise StreetlampError(
                f"exact patching would run {len(pairs) * graph.n_edges} forwards ({len(pairs)} prompts x "
                f"{graph.n_edges} edges), above --exact-max {self.exact_max}; lower --limit or raise --exact-max"
            )


CIRCUIT = Command(
    "circuit",
    "circuit discovery: edge scores (EAP, EAP-IG, exact patching), the top-k circuit over a sweep of sizes "
    "and its faithfulness with bootstrap intervals, a random baseline, CPR/CMD",
    CircuitSettings,
    lazy(__name__ + ".run", "run"),
    shared=Shared(model="smollm2-135m", out="output folder (default runs/circuit-<time>)"),
    views=("circuit",),
)
