"""``streetlamp evaluate``: every example x every method, faithfulness metrics, in a resumable
run store; locally (batched by token budget) or on Ray (one model per actor)."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ...data import Dataset, load_dataset, sample_indices
from ...errors import StreetlampError
from ...evaluation.common import evaluate_params
from ...evaluation.confounds import interval_table, write_interval_table
from ...evaluation.pipeline import ChunkExample, EvalSettings, evaluate_chunk
from ...extras import require
from ...methods.registry import get_method
from ...methods.removal import Removal
from ...models.adapter import ModelAdapter
from ...store import RunStore

if TYPE_CHECKING:
    from ...settings import RunOptions
    from . import EvaluateSettings

KEY_METRICS = [
    "aopc_comprehensiveness",
    "aopc_sufficiency",
    "deletion_area",
    "insertion_area",
    "flip_fraction",
    "flipped",
]


@dataclass
class EvalResult:
    out: Path
    n_examples: int
    n_skipped: int
    n_computed_chunks: int
    summary: pd.DataFrame
    table: list[str] = field(default_factory=list)  # summary.md

    def lines(self) -> list[str]:
        return [
            *self.table,
            f"{self.n_examples} examples ({self.n_skipped} skipped: longer than the model's "
            f"positions), {self.n_computed_chunks} chunks computed now; run store: {self.out}/ (manifest.json, "
            "metrics/*.parquet, arrays/, summary.csv, summary.md, figures/)",
        ]

    def _repr_html_(self) -> str:  # a notebook shows the run's report inline
        from ...report.viewer import iframe_html

        return iframe_html(self.out)


def label_indices(adapter: ModelAdapter, ds: Dataset) -> dict[str, int]:
    """Map the data's labels to the model's class ids (by name, case-insensitive, or by number).

    For a causal LM a label is the expected next token: ``" " + label`` if that is one token of the
    vocabulary (the usual form after a prompt), else ``label`` itself; anything else is refused."""
    if adapter.kind.causal:
        return next_token_labels(adapter, ds.labels())
    out, bad = {}, []
    for lab in ds.labels():
        try:
            out[lab] = adapter.parse_label(lab)
        except StreetlampError:
            bad.append(lab)
    if bad:
        names = [adapter.output_label(i) for i in range(adapter.n_outputs)]
        raise StreetlampError(
            f"labels {', '.join(map(repr, bad[:5]))} are not classes of the model (classes: {', '.join(names)})"
        )
    return out


def next_token_labels(adapter: ModelAdapter, labels: list[str]) -> dict[str, int]:
    out, bad = {}, []
    for lab in labels:
        for form in (" " + lab, lab):
            ids = adapter.tokenizer(form, add_special_tokens=False)["input_ids"]
            if len(ids) == 1:
                out[lab] = int(ids[0])
                break
        else:
            bad.append(lab)
    if bad:
        raise StreetlampError(
            f"labels {', '.join(map(repr, bad[:5]))} are not one token of {adapter.name}'s "
            "vocabulary (tried with and without a leading space); for a causal LM the label "
            "is the expected next token"
        )
    return out


def prepare(
    adapter: ModelAdapter, ds: Dataset, truncate: bool, reserve: int = 0
) -> tuple[list[ChunkExample], list[str]]:
    """Tokenise; examples longer than the model's positions (less ``reserve`` for a generated answer)
    are skipped (or truncated when asked)."""
    labels = label_indices(adapter, ds)
    room = adapter.max_positions - reserve
    if room < 2:
        raise StreetlampError(
            f"--answer-tokens {reserve} leaves no room for a prompt in {adapter.max_positions} positions"
        )
    out, skipped = [], []
    for i, e in enumerate(ds.examples):
        ids = adapter.tokenizer(e.text)["input_ids"]
        cut = len(ids) > room
        if cut and not truncate:
            skipped.append(e.id)
            continue
        if cut:
            ids = adapter.tokenizer(e.text, truncation=True, max_length=room)["input_ids"]
        out.append(ChunkExample(i, e.id, list(ids), e.text, labels[e.label], e.rationale, cut))
    return out, skipped


def _progress(total: int, done: int):
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=done,
        unit="ex",
        desc="evaluate",
        file=sys.stderr,
        dynamic_ncols=True,
        disable=None,
        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]",
    )


def evaluate(
    adapter: ModelAdapter | None, s: EvaluateSettings, out: Path, opts: RunOptions | None = None
) -> EvalResult:
    """``streetlamp evaluate``: the command's run. The model is ``adapter`` when given, else the Python
    API's adapter in ``opts.model``, else loaded here from its name (each Ray actor loads its own by that
    name); validated against ``s`` before the run store exists."""
    from ...models.loading import load

    if s.engine == "ray":  # before the model loads and the store exists
        require("ray")
        from ..ray_engine import connect

        connect(s.ray_address, s.workers)
    ds = load_dataset(s.data, text_column=s.text_column, label_column=s.label_column, column_flags=True)
    if s.sample is not None:
        ds.examples = [ds.examples[i] for i in sample_indices(len(ds.examples), s.sample, s.seed)]
    if s.limit is not None:
        all_labels = ds.labels()
        ds.examples = ds.examples[: s.limit]
        if len(ds.labels()) < len(all_labels):
            print(
                f"streetlamp: warning: --limit {s.limit} takes the first {s.limit} examples, which carry only "
                f"{', '.join(ds.labels())} of the labels {', '.join(all_labels)} (the file is sorted by label?)",
                file=sys.stderr,
            )
    if not ds.examples:
        raise StreetlampError(f"dataset {s.data!r} has no examples")
    model = opts.model if opts is not None else None
    device = opts.device if opts is not None else "cpu"
    dtype = opts.dtype if opts is not None else "float32"
    if adapter is None and model is not None and not isinstance(model, (str, Path)):
        adapter = model  # the Python API may pass an adapter
    if adapter is None:
        if model is None:
            raise StreetlampError("evaluate needs a model: give --model")
        adapter = load(model)
        if device != "cpu" or dtype != "float32":
            adapter.to(device, dtype)
    name = str(model) if isinstance(model, (str, Path)) else adapter.name  # what a Ray actor loads
    s.validate(adapter)
    ff_train = _ffidelity_data(adapter, s)
    # every check before the store is touched; a generated answer needs its positions too
    examples, skipped = prepare(adapter, ds, s.truncate, reserve=s.answer_tokens)
    params = {
        "settings": s.to_dict(),
        "chunk_size": s.chunk_size,
        # what evaluate builds each method with (evaluation/common.evaluate_params: IG's rule on a classifier)
        "method_params": {
            n: get_method(n, **evaluate_params(s.method_params, n, adapter.kind)).params() for n in s.methods
        },
    }
    run_settings = {
        # the dtype: chunks of one run in one dtype (a resume in another is refused)
        "model": {"name": adapter.name, "source": adapter.source, "dtype": adapter.describe()["dtype"]},
        "data": {"name": ds.name, "source": ds.source, "sha256": ds.hash(), "n_examples": len(ds.examples)},
        "limit": s.limit,
        **({"sample": s.sample} if s.sample is not None else {}),
        **params,
    }
    store = RunStore.open(
        Path(out),
        run_settings,
        {
            "model_info": adapter.describe(),
            "skipped_too_long": skipped,
            "replacement_token": s.replacement if s.replacement == "delete" else adapter.replacement_token("mask")[2],
            "removal_rule": Removal.of(adapter, adapter.replacement_token(s.replacement)[1]).describe(adapter),
        },
        added={"model.dtype": "float32"},  # a store made before --dtype was float32
    )
    tuned = _ffidelity_copy(adapter, store.folder, s, ff_train, examples) if ff_train is not None else None
    chunks = [examples[i : i + s.chunk_size] for i in range(0, len(examples), s.chunk_size)]
    done = store.done_chunks()
    todo = [c for c in range(len(chunks)) if c not in done]
    bar = _progress(len(examples), sum(len(chunks[c]) for c in done if c < len(chunks)))
    try:
        if s.engine == "ray":
            from ..ray_engine import run_on_ray

            run_on_ray(
                name,
                device,
                s,
                {c: chunks[c] for c in todo},
                store,
                bar,
                address=s.ray_address,
                workers=s.workers,
                dtype=dtype,
            )
        else:
            for c in todo:
                rows, arrays = evaluate_chunk(adapter, chunks[c], s, tuned)
                store.write_chunk(c, rows, arrays)
                bar.update(len(chunks[c]))
    finally:
        bar.close()
    metrics = store.metrics()
    summary = summarise(metrics)
    lines = write_summary(store.folder, summary)
    lines += append_summary(store.folder, write_interval_table(store.folder, metrics))
    if tuned is not None:
        lines += append_summary(store.folder, _ffidelity_lines(store.folder))
    if s.randomisation or s.efficient_mprt:
        from ...evaluation.randomisation import write_verdicts

        lines += append_summary(
            store.folder, write_verdicts(store.folder, metrics, interval_table(metrics), s.randomisation_target)
        )
    try:
        from ...report.evaluation import figures

        figures(store.folder, metrics)
    except ImportError:  # the report module is optional for the store itself
        pass
    # report.html: written by the command pipeline after the run (store/ never imports report/)
    return EvalResult(store.folder, len(examples), len(skipped), len(todo), summary, lines)


def _ffidelity_data(adapter: ModelAdapter, s: EvalSettings) -> Dataset | None:
    """F-Fidelity's training data, read and its labels checked against the model's classes before the store
    exists (None: off)."""
    if not s.ffidelity_train:
        return None
    ds = load_dataset(s.ffidelity_train)
    label_indices(adapter, ds)  # its labels must be the model's classes
    return ds


def _ffidelity_copy(
    adapter: ModelAdapter, folder: Path, settings: EvalSettings, train_ds: Dataset, examples: list[ChunkExample]
) -> ModelAdapter:
    """The fine-tuned copy saved in the run folder, trained now when it is not there yet."""
    from ...evaluation.ffidelity import FFidelity, fine_tune, load_copy, save_copy

    got = load_copy(folder, adapter)
    if got is not None:
        return got[0]
    evaluated = {e.text for e in examples}
    train_ds.examples = [e for e in train_ds.examples if e.text not in evaluated]
    cap = FFidelity(**settings.ffidelity).max_train
    if len(train_ds.examples) > cap:
        train_ds.examples = [train_ds.examples[i] for i in sample_indices(len(train_ds.examples), cap, settings.seed)]
    train = [(e.ids, e.gold) for e in prepare(adapter, train_ds, truncate=True)[0]] if train_ds.examples else []
    held = [(e.ids, e.gold) for e in examples]
    tuned, record = fine_tune(adapter, train, held, FFidelity(**settings.ffidelity), settings.seed, settings.batch_size)
    record["train_data"] = {"name": train_ds.name, "source": train_ds.source, "sha256": train_ds.hash()}
    save_copy(folder, tuned, record)
    return tuned


def _ffidelity_lines(folder: Path) -> list[str]:
    import json

    r = json.loads((folder / "ffidelity" / "training.json").read_text())
    a = r["accuracy"]
    return [
        "## F-Fidelity: the fine-tuned copy (ffidelity/model.safetensors, training.json)",
        "",
        f"{r['n_train']} training examples, {r['settings']['epochs']} epochs, beta {r['settings']['beta']}, "
        f"{r['seconds']:.1f} s; loss per epoch {', '.join(f'{x:.4f}' for x in r['loss_per_epoch'])}; accuracy on "
        f"the {r['n_held_out']} evaluated examples: copy {a['fine_tuned']:.3f} (original {a['original']:.3f}), "
        f"with a beta-fraction masked: copy {a['fine_tuned_masked']:.3f} (original {a['original_masked']:.3f})",
    ]


def summarise(df: pd.DataFrame) -> pd.DataFrame:
    """Mean, median and count (non-NaN) per method x metric."""
    if df.empty:
        return pd.DataFrame(columns=["method", "metric", "mean", "median", "n"])
    g = df.groupby(["method", "metric"])["value"]
    return g.agg(mean="mean", median="median", n="count").reset_index()


def append_summary(folder: Path, lines: list[str]) -> list[str]:
    """Add a section to ``summary.md`` (the interval tables of evaluation/confounds.py)."""
    if not lines:
        return []
    with open(folder / "summary.md", "a") as f:
        f.write("\n" + "\n".join(lines) + "\n")
    return ["", *lines]


def _md(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    fmt = lambda v: (
        f"{v:.4f}"
        if isinstance(v, (float, np.floating)) and not math.isnan(v)
        # noqa: E731
        else ("" if isinstance(v, float) else str(v))
    )
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def write_summary(folder: Path, summary: pd.DataFrame) -> list[str]:
    summary.to_csv(folder / "summary.csv", index=False)
    wide = summary[summary.metric.isin(KEY_METRICS)].pivot(index="method", columns="metric", values="mean")
    wide = wide[[m for m in KEY_METRICS if m in wide.columns]].reset_index()
    other = summary[~summary.metric.isin(KEY_METRICS) & ~summary.metric.str.match(r"(comprehensiveness|sufficiency)@")]
    text = (
        "## Faithfulness per method / ranking (means)\n\n"
        + _md(wide)
        + "\n\n## Other metrics (mean, median, n)\n\n"
        + _md(other)
        + "\n"
    )
    (folder / "summary.md").write_text(text)
    return text.splitlines()
