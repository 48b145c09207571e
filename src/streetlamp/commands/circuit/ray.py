"""``circuit --engine ray``: the circuit's per-prompt and per-resample work on Ray actors, through
``evaluate``'s Ray engine (:func:`streetlamp.commands.ray_engine.run_on_ray`: one model per actor, whole
chunks, results written by the driver as they arrive, each Ray session recorded in the checkpoint's
manifest).

* **Edge scores over prompts.** Every method scores each prompt on its own (its corrupted run, its
  gradients, its patched forwards), so the prompts are cut into the local engine's own batches
  (``rows_of(--batch-size)`` rows, the same boundaries and padding) and each batch is one chunk: an actor
  runs :func:`streetlamp.commands.circuit.methods.edge_scores` on it, with the whole prompt set as the reference of
  mean ablation (as the local engine has it), and the driver concatenates the per-prompt scores in order.
* **Resamples.** Each (method, ``--resample`` axis) is one chunk: the actor re-discovers the circuit on
  every resample of that axis (:func:`streetlamp.interventions.circuits.resampling.stability`, rescoring
  on its own model where the axis needs it) and returns its rows of ``stability.csv``, its line and its
  summary. The driver checkpoints each chunk as it arrives, under the local engine's own stage number, and
  sends only the chunks the checkpoint lacks: an interrupted run, on either engine, resumes on either.

The faithfulness sweep stays on the driver (one batched masked forward per size). The work and the
numbers are the local engine's: ``tests/commands/test_circuit_ray.py`` runs both on a local Ray instance
and compares every table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ... import progress
from ...interventions.circuits import scores as S
from ...interventions.circuits.tasks import PairSet, TaskPair


@dataclass
class RayPlace:
    """Where the actors run: the model every actor loads (an embedded name or a folder all nodes read),
    its device, the cluster (None: a local instance) and the number of actors."""

    model: str
    device: str = "cpu"
    address: str | None = None
    workers: int | None = None
    dtype: str = "float32"


@dataclass
class ScoreJob:
    method: str
    ablation: str
    metric: str
    steps: int
    rows: int
    reference: PairSet | None  # mean ablation: the whole prompt set


def score_chunk(adapter: Any, chunk: list[PairSet], job: ScoreJob) -> np.ndarray:
    """One batch of prompts scored on an actor's model: its per-prompt scores."""
    from ...interventions.circuits.blocks import Blocks
    from .methods import edge_scores

    (p,) = chunk
    sc = edge_scores(Blocks(adapter), p, job.method, job.ablation, job.metric, job.steps, job.rows, job.reference)
    return sc.per_prompt.cpu().numpy()


def ray_edge_scores(
    place: RayPlace, store: Any, pairs: PairSet, method: str, ablation: str, metric: str, steps: int, rows: int
) -> S.EdgeScores:
    from ..ray_engine import run_on_ray

    batches = S._chunks(len(pairs), rows)
    chunks = {c: [pairs.select(b)] for c, b in enumerate(batches)}
    got: dict[int, np.ndarray] = {}
    job = ScoreJob(method, ablation, metric, steps, rows, pairs if ablation == "mean" else None)
    with progress.bar(len(chunks), f"circuit {method} edge scores on Ray (batches of prompts)") as bar:
        run_on_ray(
            place.model, place.device, job, chunks, store, bar, place.address, place.workers, work=score_chunk,
            write=lambda c, r: got.__setitem__(c, r), dtype=place.dtype,
        )  # fmt: skip
    per = torch.from_numpy(np.concatenate([got[c] for c in range(len(chunks))]))
    return S.EdgeScores(method, per, ablation, metric)


@dataclass
class StabilityJob:
    task: str
    raw: list[TaskPair]
    pairs: PairSet
    ablation: str
    metric: str
    steps: int
    sizes: list[float]
    resamples: int
    seed: int
    at: float
    score_rows: int | None  # the --batch-size token budget (rows_of turns it into rows per pass)
    rows: int
    measure: str = "all"  # --resample-faithfulness


def stability_chunk(
    adapter: Any, chunk: list[tuple[str, str, np.ndarray]], job: StabilityJob
) -> tuple[list, list, list]:
    """One (method, axis) of ``--resample`` on an actor's model: its ``stability.csv`` rows, line and
    summary."""
    from ...interventions.circuits.blocks import Blocks
    from ...interventions.circuits.resampling import stability
    from .methods import rescorer

    (name, axis, per) = chunk[0]
    blocks = Blocks(adapter)
    sc = S.EdgeScores(name, torch.from_numpy(per), job.ablation, job.metric)
    rescore = rescorer(blocks, job.pairs, name, job.ablation, job.metric, job.steps, job.score_rows)
    return stability(
        blocks, job.task, job.raw, job.pairs, sc, job.sizes, [axis], job.resamples, job.seed, job.at, rescore,
        job.rows, job.measure,
    )  # fmt: skip


def ray_stability(
    place: RayPlace,
    store: Any,
    job: StabilityJob,
    methods: dict[str, S.EdgeScores],
    todo: dict[int, tuple[str, str]],
    write: Callable[[int, tuple[list, list, list]], None],
) -> None:
    """Run the (method, axis) chunks ``todo`` (checkpoint stage -> (method, axis)) on the actors; each
    result is handed to ``write`` (the driver checkpoints it) as it arrives, so an interrupted run keeps
    every finished axis."""
    from ..ray_engine import run_on_ray

    chunks = {c: [(n, a, methods[n].per_prompt.cpu().numpy())] for c, (n, a) in todo.items()}
    with progress.bar(len(chunks), "circuit resamples on Ray (method x axis)") as bar:
        run_on_ray(
            place.model, place.device, job, chunks, store, bar, place.address, place.workers, work=stability_chunk,
            write=write, dtype=place.dtype,
        )  # fmt: skip
