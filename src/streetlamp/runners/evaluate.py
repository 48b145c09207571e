"""``streetlamp evaluate``: every example x every method, faithfulness metrics, in a resumable
run store; locally (batched by token budget) or on Ray (one model per actor)."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from ..data import Dataset, load_dataset, sample_indices
from ..errors import StreetlampError
from ..evaluation.common import evaluate_params
from ..evaluation.confounds import interval_table, write_interval_table
from ..evaluation.pipeline import ChunkExample, EvalSettings, evaluate_chunk
from ..methods.registry import get_method
from ..methods.removal import Removal
from ..models.adapter import ModelAdapter
from ..settings import layers_of
from ..store import RunStore

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
        from ..report.viewer import iframe_html

        return iframe_html(self.out)


def label_indices(adapter: ModelAdapter, ds: Dataset) -> dict[str, int]:
    """Map the data's labels to the model's class ids (by name, case-insensitive, or by number).

    For a causal LM a label is the expected next token: ``" " + label`` if that is one token of the
    vocabulary (the usual form after a prompt), else ``label`` itself; anything else is refused."""
    if adapter.kind == "causal_lm":
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
    model: str,
    data: str,
    out: Path,
    settings: EvalSettings,
    *,
    limit: int | None = None,
    sample: int | None = None,
    chunk_size: int = 16,
    engine: str = "local",
    ray_address: str | None = None,
    workers: int | None = None,
    device: str = "cpu",
    adapter: ModelAdapter | None = None,
    text_column: str | None = None,
    label_column: str | None = None,
) -> EvalResult:
    from ..models.loading import load

    if engine == "ray":  # before the model loads and the store exists
        from .ray_engine import connect

        connect(ray_address, workers)
    ds = load_dataset(data, text_column=text_column, label_column=label_column, column_flags=True)
    if sample is not None:
        if limit is not None:
            raise StreetlampError("give --limit (the first N) or --sample (N drawn with --seed), not both")
        ds.examples = [ds.examples[i] for i in sample_indices(len(ds.examples), sample, settings.seed)]
    if limit is not None:
        if limit < 1:
            raise StreetlampError("--limit must be at least 1")
        all_labels = ds.labels()
        ds.examples = ds.examples[:limit]
        if len(ds.labels()) < len(all_labels):
            print(
                f"streetlamp: warning: --limit {limit} takes the first {limit} examples, which carry only "
                f"{', '.join(ds.labels())} of the labels {', '.join(all_labels)} (the file is sorted by label?)",
                file=sys.stderr,
            )
    if not ds.examples:
        raise StreetlampError(f"dataset {data!r} has no examples")
    if adapter is None:
        adapter = load(model)
        if device != "cpu":
            cast(Any, adapter.hf_model).to(device)  # transformers types .to() as a decorated method wrongly
    if adapter.modality == "image":
        raise StreetlampError(
            f"evaluate scores text datasets (erasure by token, rationales); {adapter.name} is an image model: "
            "explain, heads and serve take an image"
        )
    for name in settings.methods:
        get_method(name, **settings.method_params.get(name, {})).check(adapter)
    if settings.replacement not in ("delete", "mask"):
        raise StreetlampError("--replacement must be 'delete' or 'mask'")
    if settings.answer_tokens and adapter.kind != "causal_lm":
        raise StreetlampError(f"--answer-tokens needs a causal LM; {adapter.name} is a {adapter.kind}")
    if settings.soft:
        from ..evaluation.soft import check_soft

        check_soft(settings.soft_samples, settings.soft_pi)
    if (
        settings.randomisation
        or settings.efficient_mprt
        or settings.smooth_mprt
        or settings.randomisation_target != "prediction"
    ):
        from ..evaluation.randomisation import check_settings

        check_settings(settings, adapter)
    ff_train = _ffidelity_check(adapter, settings, engine)
    layers_of(adapter, settings.flip_layers, "--flip-layers")  # a bad layer: refused before the store exists
    layers_of(adapter, settings.cf_layers, "--cf-layers")
    # every check before the store is touched; a generated answer needs its positions too
    examples, skipped = prepare(adapter, ds, settings.truncate, reserve=settings.answer_tokens)
    params = {
        "settings": settings.to_dict(),
        "chunk_size": chunk_size,
        # what evaluate builds each method with (evaluation/common.evaluate_params: IG's rule on a classifier)
        "method_params": {
            n: get_method(n, **evaluate_params(settings.method_params, n, adapter.kind)).params()
            for n in settings.methods
        },
    }
    run_settings = {
        "model": {"name": adapter.name, "source": adapter.source},
        "data": {"name": ds.name, "source": ds.source, "sha256": ds.hash(), "n_examples": len(ds.examples)},
        "limit": limit,
        **({"sample": sample} if sample is not None else {}),
        **params,
    }
    store = RunStore.open(
        Path(out),
        run_settings,
        {
            "model_info": adapter.describe(),
            "skipped_too_long": skipped,
            "replacement_token": settings.replacement
            if settings.replacement == "delete"
            else adapter.replacement_token("mask")[2],
            "removal_rule": Removal.of(adapter, adapter.replacement_token(settings.replacement)[1]).describe(adapter),
        },
    )
    tuned = _ffidelity_copy(adapter, store.folder, settings, ff_train, examples) if ff_train is not None else None
    chunks = [examples[i : i + chunk_size] for i in range(0, len(examples), chunk_size)]
    done = store.done_chunks()
    todo = [c for c in range(len(chunks)) if c not in done]
    bar = _progress(len(examples), sum(len(chunks[c]) for c in done if c < len(chunks)))
    try:
        if engine == "local":
            for c in todo:
                rows, arrays = evaluate_chunk(adapter, chunks[c], settings, tuned)
                store.write_chunk(c, rows, arrays)
                bar.update(len(chunks[c]))
        elif engine == "ray":
            from .ray_engine import run_on_ray

            run_on_ray(
                model, device, settings, {c: chunks[c] for c in todo}, store, bar, address=ray_address, workers=workers
            )
        else:
            raise StreetlampError(f"unknown engine {engine!r}: local or ray")
    finally:
        bar.close()
    metrics = store.metrics()
    summary = summarise(metrics)
    lines = write_summary(store.folder, summary)
    lines += append_summary(store.folder, write_interval_table(store.folder, metrics))
    if tuned is not None:
        lines += append_summary(store.folder, _ffidelity_lines(store.folder))
    if settings.randomisation or settings.efficient_mprt:
        from ..evaluation.randomisation import write_verdicts

        lines += append_summary(
            store.folder, write_verdicts(store.folder, metrics, interval_table(metrics), settings.randomisation_target)
        )
    try:
        from ..report.evaluation import figures

        figures(store.folder, metrics)
    except ImportError:  # the report module is optional for the store itself
        pass
    # report.html: written by the command pipeline after the run (store/ never imports report/)
    return EvalResult(store.folder, len(examples), len(skipped), len(todo), summary, lines)


def _ffidelity_check(adapter: ModelAdapter, settings: EvalSettings, engine: str) -> Dataset | None:
    """F-Fidelity's settings, model and training data checked before the store exists (None: off)."""
    if not settings.ffidelity:
        return None
    from ..evaluation.ffidelity import FFidelity, check_adapter

    cfg = FFidelity(**settings.ffidelity)
    cfg.check()
    check_adapter(adapter)
    if engine != "local":
        raise StreetlampError("--ffidelity-train runs on the local engine only (the fine-tuned copy lives in the run)")
    ds = load_dataset(cfg.train)
    label_indices(adapter, ds)  # its labels must be the model's classes
    return ds


def _ffidelity_copy(
    adapter: ModelAdapter, folder: Path, settings: EvalSettings, train_ds: Dataset, examples: list[ChunkExample]
) -> ModelAdapter:
    """The fine-tuned copy saved in the run folder, trained now when it is not there yet."""
    from ..evaluation.ffidelity import FFidelity, fine_tune, load_copy, save_copy

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
