"""``streetlamp circuit``: task pairs -> edge scores by each method -> the faithfulness sweep over
circuit sizes (bootstrap intervals, random baseline, CPR/CMD) -> the circuit at the chosen size.

Everything is computed by the circuit engine (:mod:`streetlamp.interventions.circuits`); this module
chooses, tabulates and writes. Files of the run folder (each described in ``manifest["files"]``):

* ``edges.parquet``: every edge of every method: ``source``, ``target``, ``input`` (q/k/v/mlp/logits),
  ``score`` (mean over prompts of ``m(edge ablated) - m(clean)``), ``method``, ``ci_low``/``ci_high``
  (percentile bootstrap over prompts of that mean), ``inclusion`` (share of resamples whose top-k circuit
  at the chosen size holds the edge), ``in_circuit`` (in the chosen circuit), ``kv_group``, ``edge``.
  Nodes: ``embed``, ``L{l}.H{h}``, ``L{l}.MLP``, ``logits``; with ``--expert-nodes`` a MoE layer's
  ``L{l}.E{e}`` and ``L{l}.SE`` in place of its MLP, read through ``(L{l}.router, router)`` and each expert's
  own ``mlp`` input (:mod:`streetlamp.interventions.circuits.graph`). With grouped-query attention a k or v input
  is read once per key/value group: that one edge is a row under each query head of the group, every
  column equal, the group in ``kv_group`` (``L{l}.KV{g}``; empty elsewhere) and the model's edge index in
  ``edge`` (count and sum edges over unique ``edge``).
* ``faithfulness.csv``: one row per method and size (``method``, ``size_fraction``, ``n_edges``,
  ``faithfulness``, ``ci_low``, ``ci_high``, the random baseline's columns, ablation, metric).
* ``areas.csv``: per method, MIB's ``cpr`` and ``cmd`` (its ``evaluate_area_under_curve`` over its ten
  sizes: :mod:`streetlamp.interventions.circuits.faithfulness`) with intervals, the random baseline's under
  the same formula, m(M) and m(∅); with ``--areas sweep`` the same raw-axis areas over the swept sizes,
  named ``area_under`` / ``area_from_1`` instead.
* ``pairs.csv``: the prompts used.
* ``circuit.<method>.json``: the chosen circuit in the MIB edge-dict format (the ``Graph.to_json`` of
  the EAP-IG / MIB circuit-track code: ``cfg``, ``nodes`` ``{name: {in_graph}}``, ``edges``
  ``{"a0.h1->m2": {score, in_graph}}``, attention inputs as ``->a3.h0<q>``; nodes ``input``,
  ``a{l}.h{h}``, ``m{l}``, ``logits``; :mod:`streetlamp.interventions.circuits.mib`). A key/value group's
  edge is written once per head of the group (the same score and membership: patching the group's input
  patches every head that shares it). Scores in MIB's sign (``-score``: MIB ranks the highest first).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ... import progress
from ...data.files import read_csv
from ...errors import StreetlampError
from ...interventions.circuits import faithfulness as F
from ...interventions.circuits import scores as S
from ...interventions.circuits import tasks as T
from ...interventions.circuits.blocks import Blocks, graph_of
from ...interventions.circuits.graph import Graph
from ...interventions.circuits.mib import circuit_json
from ...models.adapter import ModelAdapter
from ...report import circuit as fig
from ...stats import resample_indices
from ...store.run_folder import RunFolder
from . import paths as P
from . import resume as R
from . import view as V
from .methods import edge_scores, rescorer, rows_of
from .ray import RayPlace, StabilityJob, ray_edge_scores, ray_stability

if TYPE_CHECKING:
    from ...settings import RunOptions
    from . import CircuitSettings

LEVEL = 0.95
GATHER = 1 << 25  # float64 values per gather of the per-edge bootstrap (256 MiB)
CHOOSE_AT = 0.8  # the default chosen size: the smallest swept size whose faithfulness reaches this


# -- the task's pairs ---------------------------------------------------------------------------------
def task_pairs(
    task: str,
    limit: int,
    seed: int,
    ablation: str,
    two_digit: bool = True,
    mib_task: str | None = None,
    n_tokens: Any = None,
) -> list[T.TaskPair]:
    """The pairs of ``task`` (a built-in generator or a CSV file), at most ``limit``. A CSV without a
    ``corrupt`` column serves mean and zero ablation (its corrupted prompt is the clean one, unused);
    ``patch`` needs corrupted prompts. ``mib_task``: ``task`` is a MIB task file of that task
    (:mod:`streetlamp.interventions.circuits.mib`; ``n_tokens`` applies MIB's token filter)."""
    if mib_task is not None:
        from ...interventions.circuits.mib import read_task

        return read_task(task, mib_task, n_tokens)[0][:limit]
    if task in T.TASKS:
        if task == "greater-than":
            return T.greater_than(limit, seed, two_digit=two_digit)
        if task.startswith("arithmetic-"):
            keep = None
            if n_tokens is not None:

                def keep(p: T.TaskPair) -> bool:  # MIB's filter (one-token results), and equal prompt lengths
                    return n_tokens(p.answer) == 1 == n_tokens(p.wrong) and n_tokens(p.clean) == n_tokens(p.corrupt)

            op = "-" if task.endswith("subtraction") else "+"
            return T.arithmetic(limit, seed, op, 2 if two_digit else 1, keep)
        if task == "mcqa":
            return T.mcqa(limit, seed)
        return T.ioi(limit, seed) if task == "ioi" else T.induction(limit, seed)
    p = Path(task)
    if p.suffix.lower() != ".csv":
        raise StreetlampError(f"unknown task {task!r}; choose {', '.join(T.TASKS)} or a .csv file of pairs")
    header, rows = read_csv(p, "task file")  # regular UTF-8 files only, a byte-order mark dropped
    cols = set(header)
    if "corrupt" in cols:
        return T.read_pairs(p)[:limit]
    if ablation == "patch":
        raise StreetlampError(
            f"{p} has no corrupt column: --ablation patch needs corrupted prompts (give them, or --ablation mean|zero)"
        )
    need = {"clean", "answer", "wrong"}
    if not rows or not need <= cols:
        raise StreetlampError(f"{p}: need a header with columns clean,answer,wrong (and corrupt for patching)")
    out = []
    for i, r in enumerate(rows[:limit]):
        if any(not (r.get(c) or "").strip() for c in need):
            raise StreetlampError(f"{p}: row {i + 1} has an empty clean, answer or wrong")
        out.append(T.TaskPair(r["clean"], r["clean"], r["answer"], r["wrong"], 0))
    return out


def _two_digit(adapter: ModelAdapter) -> bool:
    """Greater-than answers two-digit years where the tokenizer reads ``42`` as one token, else digits."""
    return len(adapter.tokenizer("42", add_special_tokens=False)["input_ids"]) == 1


def pairs_for(adapter: ModelAdapter, s: CircuitSettings) -> list[T.TaskPair]:
    def n_tokens(text: str) -> int:
        return len(adapter.tokenizer(text, add_special_tokens=False)["input_ids"])

    return task_pairs(s.task, s.limit, s.seed, s.ablation, _two_digit(adapter), s.mib_task, n_tokens)


def encoded_pairs(adapter: ModelAdapter, s: CircuitSettings) -> T.PairSet:
    """The pairs checked against the tokenizer (equal token lengths, one-token answers that differ)."""
    return T.encode_pairs(adapter, pairs_for(adapter, s))


def memory_needed(g: Graph, s: CircuitSettings, n_prompts: int) -> dict[str, int]:
    """Bytes the run's resampling and circuits hold at once, from the graph's size and the settings (the
    model and the per-prompt scores come on top): :func:`edge_intervals` keeps ``[bootstrap, prompts]``
    int64 draws, one gather of at most ``GATHER`` float64 and ``[bootstrap, edges]`` float64 means twice
    over (the concatenated chunks, then the quantiles' sorted copy); the sweep keeps a bool ``[readers, writers]`` mask per circuit (full, empty,
    each size and its random circuits); a ``--resample`` axis keeps ``[resamples, prompts]`` int64 draws,
    one array object per draw and ``[resamples, sizes]`` float64 faithfulness and Jaccard."""
    P, E, S = n_prompts, g.n_edges, len(set(s.sizes) | ({s.size} if s.size is not None else set()))
    return {
        "bootstrap": 8 * s.bootstrap * (2 * E + P) + 8 * min(s.bootstrap * P * E, GATHER),
        "circuits": g.n_readers * g.n_writers * (2 + S * (1 + s.random)),
        "resamples": s.resamples * (8 * P + 128 + 16 * S) if s.resample else 0,
    }


def check_memory(adapter: ModelAdapter, s: CircuitSettings, n_prompts: int) -> None:
    """Refuse, before any work, settings whose resampling cannot fit the memory available now
    (``MemAvailable``; the bootstrap arrays live on the CPU whatever the model's device)."""
    from ...models import memory

    g = graph_of(adapter, s.expert_nodes)
    need = memory_needed(g, s, n_prompts)
    free = memory.available_bytes(torch.device("cpu"))
    if free is not None and sum(need.values()) > free:
        gib = memory.GIB
        parts = ", ".join(f"{k} {v / gib:.3g} GiB" for k, v in need.items() if v)
        raise StreetlampError(
            f"--bootstrap {s.bootstrap}, --random {s.random}"
            + (f" and --resamples {s.resamples}" if s.resample else "")
            + f" over {g.n_edges} edges and {n_prompts} prompts need about {sum(need.values()) / gib:.3g} GiB "
            f"({parts}), more than the {free / gib:.2f} GiB available: lower "
            + ("--bootstrap, --random or --resamples" if s.resample else "--bootstrap or --random")
        )


# -- the computation ----------------------------------------------------------------------------------
def edge_intervals(graph: Graph, per_prompt: torch.Tensor, n_boot: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-edge percentile bootstrap interval ``[R, U]`` (low, high) of the mean score over prompts: the
    resamples of :func:`streetlamp.stats.resample_indices` and the quantiles of
    :func:`streetlamp.stats.percentile_interval`, vectorised over the edges."""
    s = per_prompt.sum(1) if per_prompt.dim() == 4 else per_prompt
    r, w = graph.edge_index()
    v = s.double().cpu().numpy()[:, r, w]  # [n, E]
    lo = np.full((graph.n_readers, graph.n_writers), np.nan)
    hi = lo.copy()
    if v.shape[0] >= 2:
        idx = resample_indices(v.shape[0], n_boot, seed)
        step = max(1, GATHER // max(1, v.size))  # draws per gather: [step, n, E] stays near 256 MB
        means = np.concatenate([v[idx[i : i + step]].mean(1) for i in range(0, len(idx), step)])  # [boot, E]
        q = np.quantile(means, [(1 - LEVEL) / 2, (1 + LEVEL) / 2], axis=0)
        lo[r, w], hi[r, w] = q[0], q[1]
    return lo, hi


AREAS_FILE = {
    "mib": "MIB's CPR and CMD per method, in MIB's units (MIB_circuit_track/evaluation.py, "
    "evaluate_area_under_curve, as print_results.py reads it): trapezoids on the raw fraction axis over its ten "
    "sizes 0.001..1 of int(fraction x n_edges) edges, pruned; cpr = area under f with edges ranked by signed "
    "score (most helpful first; f may exceed 1; f = 1 everywhere gives 0.999), cmd = area under |1 - f| with "
    "edges ranked by |score| (0 is optimal); 95% bootstrap intervals over prompts; random_* the same formula for "
    "random circuits (mean over the draws); n_edges_graph / n_edges_mib: this graph's edge count and MIB's "
    "(a grouped k/v edge once per query head)",
    "sweep": "per method, the raw-axis areas of MIB's formula over the swept sizes (not MIB's ten, so not its "
    "CPR/CMD): area_under (f, signed ranking) and area_from_1 (|1 - f|, |score| ranking), 95% bootstrap "
    "intervals, the random baseline's",
}


def area_row(name: str, sm: dict) -> dict:
    """One method's row of ``areas.csv`` (column names from the sweep's area names)."""
    a0, a1 = F.area_names(sm["areas"])
    row: dict[str, Any] = {"method": name, "ablation": sm["ablation"], "metric": sm["metric"]}
    for k in (a0, a1, f"random_{a0}", f"random_{a1}"):
        row |= {k: sm[k], f"{k}_ci_low": sm[f"{k}_ci"][0], f"{k}_ci_high": sm[f"{k}_ci"][1]}
    keep = ("m_full", "m_empty", "n_prompts", "n_boot", "n_edges_graph", "n_edges_mib")
    return row | {k: sm[k] for k in keep}


def area_line(name: str, sm: dict) -> str:
    a0, a1 = F.area_names(sm["areas"])
    label = (
        ("CPR", "CMD", "MIB's units, ten sizes")
        if sm["areas"] == "mib"
        else ("area under f", "area from 1", "raw axis over the swept sizes: not MIB's CPR/CMD")
    )
    return (
        f"{name}: {label[0]} {sm[a0]:.3f} [{sm[a0 + '_ci'][0]:.3f}, {sm[a0 + '_ci'][1]:.3f}], {label[1]} "
        f"{sm[a1]:.3f} [{sm[a1 + '_ci'][0]:.3f}, {sm[a1 + '_ci'][1]:.3f}] (random {sm['random_' + a0]:.3f} / "
        f"{sm['random_' + a1]:.3f}; {label[2]}; 95% bootstrap)"
    )


def choose_size(table: Any, size: float | None) -> float:
    """``size`` when given, else the smallest swept size whose faithfulness reaches CHOOSE_AT (else the largest)."""
    if size is not None:
        return size
    ok = table[table["faithfulness"] >= CHOOSE_AT]
    return float(ok["size_fraction"].min() if len(ok) else table["size_fraction"].max())


@dataclass
class MethodResult:
    scores: S.EdgeScores
    sweep: F.Sweep
    mask: torch.Tensor  # the chosen circuit
    inclusion: torch.Tensor  # [R, U]
    row: dict  # the faithfulness row at the chosen size
    lo: np.ndarray | None = None  # [R, U] the per-edge 95% bootstrap interval
    hi: np.ndarray | None = None


@dataclass
class CircuitResult:
    out: Path
    model: str
    task: str
    n_prompts: int
    ablation: str
    metric: str
    size: float
    methods: dict[str, MethodResult]
    edges: Any  # pandas DataFrame (edges.parquet)
    faithfulness: Any  # faithfulness.csv
    areas: Any  # areas.csv
    top: int = 10
    nodes: list[str] = field(default_factory=list)
    paths: Any = None  # paths.csv (pandas DataFrame), or None when not asked for
    path_lines: list[str] = field(default_factory=list)
    stability: list[str] = field(default_factory=list)  # one line per method and --resample axis
    audit: Any = None  # audit.csv (pandas DataFrame), or None without --audit

    def lines(self) -> list[str]:
        first = next(iter(self.methods))
        s0 = self.methods[first].sweep.summary
        out = [
            f"circuit on {self.model}: task {self.task}, {self.n_prompts} prompts, ablation {self.ablation}, "
            f"metric {self.metric}: m(model) {s0['m_full']:.4g}, m(empty circuit) {s0['m_empty']:.4g}"
        ]
        for name, r in self.methods.items():
            out.append(area_line(name, r.sweep.summary))
        for name, r in self.methods.items():
            row = r.row
            out.append(
                f"circuit at {self.size:g} of the edges by {name}: {row['n_edges']} edges, faithfulness "
                f"{row['faithfulness']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}] "
                f"(random circuits {row['random_faithfulness']:.3f})"
            )
        r = self.methods[first]
        e = self.edges[(self.edges["method"] == first) & self.edges["in_circuit"]]
        heads = e.groupby("edge")["target"].agg(",".join)  # a key/value group's edge: every head that reads it
        e = e.drop_duplicates("edge")
        e = e.reindex(e["score"].abs().sort_values(ascending=False).index).head(self.top)
        out.append(f"top edges of the {first} circuit (score = m(edge ablated) - m(model); inclusion):")
        out += [
            f"  {x.source} -> {heads[x.edge]} ({x.input}{', group ' + x.kv_group if x.kv_group else ''}): "
            f"{x.score:+.4g} [{x.ci_low:+.4g}, {x.ci_high:+.4g}]; {x.inclusion:.2f}"
            for x in e.itertuples()
        ]
        out.append("heads and MLPs it joins: " + (", ".join(self.nodes) if self.nodes else "none"))
        inc = r.inclusion[r.mask].numpy()
        if inc.size:
            stable = int((inc >= 0.9).sum())
            verdict = "stable" if stable >= inc.size / 2 else "NOT stable across resampled prompts"
            out.append(
                f"stability: {stable} of {inc.size} circuit edges are in >= 90% of the bootstrap circuits ({verdict})"
            )
        return out + self.stability + self.path_lines + self.audit_lines() + [f"output: {self.out}/"]

    def audit_lines(self) -> list[str]:
        if self.audit is None:
            return []
        out = ["audit against exact patching (max abs error relative to the largest exact effect; Kendall's tau; "
               "sign agreement):"]  # fmt: skip
        out += [
            f"  {x.method} on its top {x.n_edges} edges: {x.relative_error:.3g}; tau {x.kendall_tau:.3f}; "
            f"signs {x.sign_agreement:.2f}" if x.subset == "top" else
            f"  {x.method} on {x.n_edges} random edges: {x.relative_error:.3g}; tau {x.kendall_tau:.3f}; "
            f"signs {x.sign_agreement:.2f}"
            for x in self.audit.itertuples()
        ]  # fmt: skip
        return out


def joined_nodes(graph: Graph, mask: torch.Tensor) -> list[str]:
    """The heads, MLPs (or experts, and the routers read) of a circuit (a key/value group's reader counted as
    its heads), in graph order (a layer's router before its experts)."""
    names: set[str] = set()
    for i, j in zip(*np.nonzero(mask.numpy())):
        names.add(graph.writers[j])
        rd = graph.readers[i]
        names |= {rd.node} if rd.input == "router" else {graph.writers[o] for o in rd.owners}
    order = [x for w in graph.writers for x in ([w.replace(".E0", ".router")] if w.endswith(".E0") else []) + [w]]
    return [w for w in order if w in names and w != "embed"]


BOOTSEL_STAGE = 3000  # + i: method i's sweep of bootstrapped selection
AUDIT_STAGE = 4000  # --audit: every first-order method against exact patching


def _renamed(sw: F.Sweep, name: str) -> F.Sweep:
    t: Any = sw.table
    t["method"] = name
    sw.summary["method"] = name
    return sw


PATHS_STAGE = 1000  # the checkpoint chunk of paths.csv (methods use 2i and 2i + 1)
STABILITY_STAGE = 2000  # + 3i + axis: method i's rows, line and summary of one --resample axis (both engines)


def stability_stage(i: int, axis: str) -> int:
    """The checkpoint stage of method ``i``'s resamples along ``axis`` (one of ``resampling.AXES``)."""
    from ...interventions.circuits.resampling import AXES

    return STABILITY_STAGE + len(AXES) * i + AXES.index(axis)


def _save_stability(v: tuple[list[dict], list[str], list[dict]]) -> tuple[dict, dict]:
    return {"stage": "stability", "rows": v[0], "lines": v[1], "summaries": v[2]}, {}


def _load_stability(rec: dict, arrays: dict) -> tuple[list[dict], list[str], list[dict]]:
    return rec["rows"], rec["lines"], rec["summaries"]


def resume_settings(adapter: ModelAdapter, s: CircuitSettings, raw: list[T.TaskPair]) -> dict:
    """What a resumed run must share with the interrupted one: the model, every setting that changes a
    number (not ``--top``, which only prints) and the pairs themselves (a CSV may have changed)."""
    import dataclasses

    how = ("top", "engine", "ray_address", "workers")  # what is printed, or where it runs: no number changes
    d = {k: v for k, v in dataclasses.asdict(s).items() if k not in how}
    return {"model": adapter.describe(), "settings": d, "pairs": [vars(p) for p in raw]}


def run(
    adapter: ModelAdapter, s: CircuitSettings, out: RunFolder | Path, opts: RunOptions | None = None
) -> CircuitResult:
    """The command's run: ``--engine ray`` places the work on actors that each load ``opts.model``."""
    place = None
    if s.engine == "ray":
        if opts is None or not isinstance(opts.model, (str, Path)):
            raise StreetlampError("--engine ray loads the model on each actor: give --model as a name or a folder")
        place = RayPlace(str(opts.model), opts.device or "cpu", s.ray_address, s.workers, opts.dtype)
        from ..ray_engine import connect

        connect(s.ray_address, s.workers)  # before the checkpoint folder exists
    return run_circuit(adapter, out, s, place)


def run_circuit(
    adapter: ModelAdapter, out: RunFolder | Path, s: CircuitSettings, place: RayPlace | None = None
) -> CircuitResult:
    """The run; ``place``: run the per-prompt edge scores and the resamples on Ray actors there
    (:mod:`.circuit_ray`), else here."""
    import pandas as pd

    rf = RunFolder.of(out, "circuit")
    raw = pairs_for(adapter, s)
    pairs = T.encode_pairs(adapter, raw)
    blocks = Blocks(adapter, s.expert_nodes)
    g = blocks.graph
    sizes = sorted(set(s.sizes) | ({s.size} if s.size is not None else set()))
    methods: dict[str, MethodResult] = {}
    tables, areas, edges = [], [], []
    chosen: float | None = s.size
    ck = R.Checkpoint(rf.out, resume_settings(adapter, s, raw))
    with progress.bar(2 * len(s.methods), "circuit (edge scores, faithfulness sweep per method)") as stages:
        for i, name in enumerate(s.methods):

            def score(name: str = name) -> S.EdgeScores:
                rows = rows_of(s.batch_size, pairs, 16)
                if name == "file":  # --circuit-file: one score per edge, the same for every prompt
                    from ...interventions.circuits.mib import read_circuit

                    assert s.circuit_file is not None
                    fs = read_circuit(s.circuit_file, g, adapter.d_model)[0]
                    return S.EdgeScores("file", fs[None].repeat(len(pairs), 1, 1), s.ablation, s.metric)
                if place is not None:
                    return ray_edge_scores(place, ck.store, pairs, name, s.ablation, s.metric, s.steps, rows)
                return edge_scores(blocks, pairs, name, s.ablation, s.metric, s.steps, rows)

            sc = R.cached(
                ck, 2 * i,
                score,
                lambda v: ({"stage": f"scores {v.method}"}, {"per_prompt": v.per_prompt.cpu().numpy()}),
                lambda rec, arr: S.EdgeScores(name, torch.tensor(arr["per_prompt"]), s.ablation, s.metric),
            )  # fmt: skip
            stages.update()
            sw = R.cached(
                ck, 2 * i + 1,
                lambda: F.sweep(
                    blocks, pairs, sc, sizes, s.random, s.bootstrap, LEVEL, s.seed, rows_of(s.batch_size, pairs, 32),
                    areas_mode=s.areas_mode(),
                ),
                lambda v: (
                    {"stage": f"sweep {name}", "table": v.table.to_dict("list"), "summary": v.summary},
                    {"masks": np.stack([m.numpy() for m in v.masks]).astype(np.uint8)},
                ),
                lambda rec, arr: F.Sweep(
                    pd.DataFrame(rec["table"]), rec["summary"], [torch.tensor(m).bool() for m in arr["masks"]]
                ),
            )  # fmt: skip
            stages.update()
            table: Any = sw.table  # a pandas DataFrame
            if chosen is None:
                chosen = choose_size(table, None)
            j = int(np.flatnonzero(np.isclose(table["size_fraction"], chosen))[0])
            k = int(table["n_edges_requested"].iloc[j])
            inc = F.inclusion_frequency(g, sc, k, s.bootstrap, s.seed)
            lo, hi = edge_intervals(g, sc.per_prompt, s.bootstrap, s.seed)
            mask = sw.masks[j]
            methods[name] = MethodResult(sc, sw, mask, inc, table.iloc[j].to_dict(), lo, hi)
            tables.append(table)
            sm = sw.summary
            areas.append(area_row(name, sm))
            edges.append(
                g.edges_table(sc.mean, name, ci_low=lo, ci_high=hi, inclusion=inc.numpy(), in_circuit=mask.numpy())
            )
            if s.bootstrap_selection:  # the same scores, circuits chosen by bootstrapped inclusion (faithfulness.py)
                bname = f"{name}:bootstrapped"
                bs = R.cached(
                    ck, BOOTSEL_STAGE + i,
                    lambda sc=sc, bname=bname: _renamed(
                        F.sweep(
                            blocks, pairs, sc, sizes, 0, s.bootstrap, LEVEL, s.seed, rows_of(s.batch_size, pairs, 32),
                            areas_mode=s.areas_mode(), select=F.BootstrapSelection(g, sc, s.bootstrap, s.seed),
                        ),
                        bname,
                    ),
                    lambda v: ({"stage": f"sweep {v.summary['method']}", "table": v.table.to_dict("list"),
                                "summary": v.summary}, {}),
                    lambda rec, arr: F.Sweep(pd.DataFrame(rec["table"]), rec["summary"], []),
                )  # fmt: skip
                tables.append(bs.table)
                areas.append(area_row(bname, bs.summary))
    assert chosen is not None
    stab_rows: list[dict] = []
    stab_lines: list[str] = []
    stab_summary: dict[str, dict[str, dict]] = {}
    if s.resample:  # error bars that re-discover the circuit on every resample (interventions/circuits/resampling.py)
        from ...interventions.circuits.resampling import stability

        axis_stages = {  # a --circuit-file's scores are fixed: nothing to re-discover on a resample
            stability_stage(i, axis): (name, axis)
            for i, name in enumerate(methods)
            for axis in s.resample
            if name != "file"
        }
        if place is not None:  # the axes the checkpoint lacks, on the actors, each checkpointed as it arrives
            job = StabilityJob(
                s.task, raw, pairs, s.ablation, s.metric, s.steps, sizes, s.resamples, s.seed, chosen, s.batch_size,
                rows_of(s.batch_size, pairs, 32), s.resample_faithfulness,
            )  # fmt: skip
            todo = {st: na for st, na in axis_stages.items() if ck.get(st) is None}
            scores_of = {n: r.scores for n, r in methods.items()}
            ray_stability(place, ck.store, job, scores_of, todo, lambda st, v: ck.put(st, *_save_stability(v)))
        for st, (name, axis) in axis_stages.items():  # on Ray every stage is in the checkpoint by now

            def stab(name: str = name, axis: str = axis) -> tuple[list[dict], list[str], list[dict]]:
                rescore = rescorer(blocks, pairs, name, s.ablation, s.metric, s.steps, s.batch_size)
                return stability(
                    blocks, s.task, raw, pairs, methods[name].scores, sizes, [axis], s.resamples, s.seed, chosen,
                    rescore, rows_of(s.batch_size, pairs, 32), s.resample_faithfulness,
                )  # fmt: skip

            rows_, lines_, summ = R.cached(ck, st, stab, _save_stability, _load_stability)  # one stage per axis
            stab_rows += rows_
            stab_lines += lines_
            for sm in summ:
                stab_summary.setdefault(name, {})[axis] = sm
    et, ft, at = pd.concat(edges, ignore_index=True), pd.concat(tables, ignore_index=True), pd.DataFrame(areas)
    first = s.methods[0]
    res = CircuitResult(
        rf.out, adapter.name, s.task, len(pairs), s.ablation, s.metric, chosen, methods, et, ft, at, s.top,
        joined_nodes(g, methods[first].mask),
    )  # fmt: skip
    if s.paths:
        sm = methods[first].sweep.summary
        pr = R.cached(
            ck, PATHS_STAGE,
            lambda: P.compare_paths(
                adapter, blocks, pairs, (first, methods[first].scores.mean, methods[first].mask), s.path_methods,
                s.paths, s.ablation, s.metric, s.steps, s.path_threshold, sm["m_full"] - sm["m_empty"], s.bootstrap,
                s.seed, rows_of(s.batch_size, pairs, 32), edge_intervals,
            ),
            lambda v: ({"stage": "paths", "table": v.table.to_dict("list"), "lines": v.lines}, {}),
            lambda rec, arr: P.PathsResult(pd.DataFrame(rec["table"]), rec["lines"]),
        )  # fmt: skip
        res.paths, res.path_lines = pr.table, pr.lines
    res.stability = stab_lines
    audit_rows: list[dict] = []
    if s.audit and s.audited():
        audit_rows, audit_summary = R.cached(
            ck, AUDIT_STAGE,
            lambda: S.audit_many(
                blocks, pairs, [methods[n].scores for n in s.audited()], s.audit, s.audit, s.seed,
                rows_of(s.batch_size, pairs, 32),
            ),
            lambda v: ({"stage": "audit", "rows": v[0], "summary": v[1]}, {}),
            lambda rec, arr: (rec["rows"], rec["summary"]),
        )  # fmt: skip
        res.audit = pd.DataFrame(audit_summary)
    with rf.staging() as w:
        if s.resample:
            pd.DataFrame(stab_rows).to_csv(w.path / "stability.csv", index=False)
        et.to_parquet(w.path / "edges.parquet", index=False)
        ft.to_csv(w.path / "faithfulness.csv", index=False)
        at.to_csv(w.path / "areas.csv", index=False)
        pd.DataFrame([vars(p) for p in raw]).to_csv(w.path / "pairs.csv", index=False)
        if res.paths is not None:
            res.paths.to_csv(w.path / "paths.csv", index=False)
        if res.audit is not None:
            res.audit.to_csv(w.path / "audit.csv", index=False)
            pd.DataFrame(audit_rows).to_parquet(w.path / "audit_edges.parquet", index=False)
        files = {
            "edges.parquet": "every edge of every method: score (mean over prompts of m(edge ablated) - m(model)), "
            "its 95% bootstrap interval, inclusion frequency and membership at the chosen size",
            "faithfulness.csv": "faithfulness f(C) = (m(C) - m(empty)) / (m(model) - m(empty)) per method and size, "
            "95% bootstrap interval over prompts, random-circuit baseline",
            "areas.csv": AREAS_FILE[s.areas_mode()],
            "pairs.csv": "the clean / corrupted prompts, answers and templates used",
        }
        if res.paths is not None:
            files["paths.csv"] = (
                "the top paths each attribution matrix and the circuit name, each patched exactly: matrix_score "
                "(the matrix's path flow, or the circuit method's edge score), patch_effect (m(edge patched) - "
                "m(model), mean over prompts) with its 95% bootstrap interval, matters, agree"
            )
        if res.audit is not None:
            files["audit.csv"] = (
                "each first-order method against exact patching, per subset (random: --audit random edges, the same "
                "for every method; top: the method's --audit edges of largest |score|): n_edges, mean/max absolute "
                "error of the mean-over-prompts score, max error relative to the largest exact effect, Kendall's tau, "
                "misranked_share (edge pairs ordered one way by the score and the other by patching), sign_agreement"
            )
            files["audit_edges.parquet"] = (
                "every audited edge per method: source, target (a grouped key/value edge: its group L{l}.KV{g}), input, "
                "in_random, in_top, estimate (the method's "
                "mean score), exact (m(edge patched) - m(model), mean over prompts)"
            )
        if s.resample:
            files["stability.csv"] = (
                "per method, resampling axis (prompts, templates, corrupt) and size: f of the circuit re-discovered "
                "on each resample (mean, 95% percentile interval; NaN at a size --resample-faithfulness left "
                "unmeasured), Jaccard with the all-data circuit (mean, interval), jaccard_pairwise (mean Jaccard over "
                "every pair of resampled circuits: arXiv 2510.00845's statistic), CPR/CMD intervals, the stability "
                "verdict (mean Jaccard >= 0.5 and f interval <= 0.25 wide; empty without faithfulness)"
            )
        for name, r in methods.items():
            (w.path / f"circuit.{name}.json").write_text(
                json.dumps(circuit_json(g, r.scores.mean, r.mask, adapter.d_model))
            )
            files[f"circuit.{name}.json"] = f"the {name} circuit at size {chosen:g} in MIB's edge-dict format"
        view = V.add_view(w, adapter, g, pairs, methods, sizes, res.paths)
        fig.faithfulness_curves(ft, f"{adapter.name}: {s.task}, {s.ablation} ablation", w.path / "faithfulness.png")
        w.add_figure(
            file="faithfulness.png", shows="faithfulness over circuit sizes, 95% bootstrap bands, random baseline"
        )
        w.write_manifest(
            {
                "model": adapter.describe(),
                "tables": report_tables(res),
                "task": {"name": s.task, "n_prompts": len(pairs), "templates": sorted(set(pairs.templates))},
                "methods": list(s.methods),
                "parameters": {
                    "sizes": sizes,
                    "areas": s.areas_mode(),
                    "size": chosen,
                    "ablation": s.ablation,
                    "metric": s.metric,
                    "bootstrap": s.bootstrap,
                    "level": LEVEL,
                    "steps": s.steps,
                    "limit": s.limit,
                    "random": s.random,
                    "batch_size": s.batch_size,
                    "engine": s.engine,
                    **({"ray_sessions": ck.store.manifest().get("engine", [])} if place is not None else {}),
                    "paths": s.paths,
                    "audit": s.audit,
                    "path_methods": list(s.path_methods),
                    "path_threshold": s.path_threshold,
                    "resample": list(s.resample),
                    "resamples": s.resamples if s.resample else 0,
                    "resample_faithfulness": s.resample_faithfulness,
                    "expert_nodes": s.expert_nodes,
                    "graph": {"writers": g.n_writers, "readers": g.n_readers, "edges": g.n_edges},
                },
                "summary": {n: {**r.sweep.summary, "chosen": _plain(r.row)} for n, r in methods.items()},
                # per method and --resample axis: the verdict, CPR/CMD intervals, reused_measurements
                **({"stability": stab_summary} if s.resample else {}),
                "files": files,
                "circuit_view": view,
                "seed": s.seed,
            }
        )
    ck.remove()  # the run folder is in place: nothing left to resume
    return res


def report_tables(res: CircuitResult) -> list[dict]:
    """The report's tables (``manifest["tables"]``): faithfulness per method and size, and each method's
    top circuit edges at the chosen size."""
    cols = ["method", "size_fraction", "n_edges", "faithfulness", "ci_low", "ci_high", "random_faithfulness"]
    f = res.faithfulness[cols]
    out = [
        {
            "title": f"faithfulness over circuit sizes ({res.ablation} ablation, 95% bootstrap over prompts)",
            "columns": cols,
            "rows": [[_plain_value(v) for v in r] for r in f.itertuples(index=False)],
        }
    ]
    ecols = ["source", "target", "input", "kv_group", "score", "ci_low", "ci_high", "inclusion"]
    for name in res.methods:
        e = res.edges[(res.edges["method"] == name) & res.edges["in_circuit"]]
        e = e.reindex(e["score"].abs().sort_values(ascending=False).index).head(max(res.top, 20))
        out.append(
            {
                "title": f"top edges of the {name} circuit at size {res.size:g}",
                "note": "score = m(edge ablated) - m(model), mean over prompts; inclusion: share of bootstrap "
                "circuits holding the edge; kv_group: a key/value group's k or v edge, listed under each head that "
                "reads it",
                "columns": ecols,
                "rows": [[_plain_value(v) for v in r] for r in e[ecols].itertuples(index=False)],
            }
        )
    return out


def _plain_value(v: Any) -> Any:
    v = v.item() if hasattr(v, "item") else v
    return None if isinstance(v, float) and not np.isfinite(v) else v


def _plain(d: dict) -> dict:
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in d.items()}
