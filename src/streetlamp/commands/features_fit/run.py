"""``streetlamp features-fit``: one sparse dictionary per layer, fitted on the model's own activations.

With ``--evaluate DIR`` nothing is fitted: the dictionaries of DIR are measured on the held-out sequences of the
corpus the settings build, and OUT gets metrics.csv and manifest.json only.

The run folder (written in place, resumable) is also the dictionary folder that ``--features DIR`` reads:

    OUT/features.json, layer_LLL_SITE.safetensors   the fitted set (models/dictionaries.py), when finished
    OUT/metrics.csv       per layer: fvu (and per token: its median, without massive tokens), l0, dead and dense
                          fractions, clean/spliced/zero-ablated CE, CE recovered
    OUT/training.csv      per shard and layer: mean mse, sparsity (and aux) loss and L0 of the Adam steps
    OUT/checkpoint.safetensors   the whole training state while the fit is unfinished (removed at the end)
    OUT/manifest.json     settings (compared on --resume), model, corpus (tokens per source), training record
"""

from __future__ import annotations

import json
import math
import resource
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from ...errors import StreetlampError
from ...features.activations import SKIP_FIRST, build_corpus
from ...features.metrics import METRIC_COLUMNS, layer_metrics
from ...features.train import CHECKPOINT, FitConfig, fit, load_checkpoint
from ...models.adapter import ModelAdapter
from ...models.dictionaries import INDEX, load_features, save_features
from ...models.features import FeatureSet
from ...progress import Bar
from ...specs import parse_indices
from ...store.run_store import RunStore, atomic_write
from . import DEFAULT_SPARSITY

if TYPE_CHECKING:
    from . import FeaturesFitSettings

PER_RUN = ("resume", "stop_after")  # settings that may differ between the parts of one fit
CORPUS = ("data", "tokens", "seq_len", "heldout", "seed", "generated")  # the settings that decide the held-out text
TABLE: tuple[str, ...] = ("layer", "fvu", "fvu_token_median", "fvu_without_massive", "massive_tokens", "l0")
TABLE += ("dead_fraction", "dense_fraction", "ce_recovered")


class FeaturesFitResult:
    def __init__(self, out: Path, values: dict[str, Any]) -> None:
        self.out, self.values = out, values

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def lines(self) -> list[str]:
        v = self.values
        if "evaluated" in v:
            return [
                f"{v['kind']} dictionaries of {v['evaluated']} on {v['model']}, layers "
                f"{','.join(map(str, v['layers']))}: measured, not fitted",
                *self._table(),
            ]
        t = v["training"]
        head = (
            f"{v['kind']} ({v['site']}, {v['activation']}, width {v['width']}) on {v['model']}, layers "
            f"{','.join(map(str, v['layers']))}: {t['shards_done']}/{t['shards']} shards, {t['tokens_seen']} tokens per "
            f"layer ({t['seconds_this_run']:.1f} s this run)"
        )
        if not v["finished"]:
            return [
                head,
                f"stopped with {t['shards'] - t['shards_done']} shards to go; checkpoint {self.out}/{CHECKPOINT}",
                f"continue: the same command with --resume --out {self.out}",
            ]
        return [head, *self._table(), "", f"dictionary folder: {self.out}/ (use: --features {self.out})"]

    def _table(self) -> list[str]:
        rows = self.values["metrics"]
        cols = [c for c in TABLE if c in rows[0]]
        body = ["  " + " | ".join(cols)]
        for r in rows:
            body.append("  " + " | ".join(f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in cols))
        return [f"metrics on {rows[0]['heldout_tokens']} held-out tokens (metrics.csv):", *body]


def _settings_record(s: FeaturesFitSettings) -> dict:
    return {k: v for k, v in s.to_dict().items() if k not in PER_RUN}


def run_features_fit(
    adapter: ModelAdapter, s: FeaturesFitSettings, out: Path, options: Any = None
) -> FeaturesFitResult:
    folder = Path(out)
    ck = folder / CHECKPOINT
    if (folder / INDEX).exists():
        raise StreetlampError(f"{folder} holds a finished fit ({INDEX}); use another --out")
    if ck.exists() and not s.resume:
        _, meta = load_checkpoint(ck)
        raise StreetlampError(
            f"{folder} holds an unfinished fit (checkpoint at shard {meta['next_shard']} of {meta['config']['shards']}): "
            "pass --resume to continue it, or another --out"
        )
    if s.resume and not ck.exists():
        raise StreetlampError(f"nothing to resume: {folder} has no {CHECKPOINT}")
    layers = parse_indices(s.layers, adapter.n_layers, "--layers", "layer")
    if s.evaluate is not None:
        return _evaluate(adapter, s, folder, layers)
    store = RunStore.open(
        folder, _settings_record(s), {"model": adapter.describe(), "seed": s.seed}, command="features-fit"
    )
    t0 = time.perf_counter()
    corpus = build_corpus(
        adapter, s.data, tokens=s.tokens, seq_len=s.seq_len, heldout=s.heldout, seed=s.seed, generated=s.generated
    )
    per_shard = s.batch_seqs * (s.seq_len - SKIP_FIRST)
    sparsity = DEFAULT_SPARSITY[s.activation] if s.sparsity is None else s.sparsity
    cfg = FitConfig(
        where=s.where,
        width=s.width,
        activation=s.activation,
        k=s.k,
        sparsity=sparsity,
        lr=s.lr,
        batch_tokens=s.batch_tokens,
        batch_seqs=s.batch_seqs,
        shards=max(1, math.ceil(s.tokens / per_shard)),
        warmup=s.warmup,
        aux=s.aux,
        dead_window=s.dead_window,
        seed=s.seed,
    )
    t_corpus = time.perf_counter() - t0
    bar = Bar(total=cfg.shards, desc=f"features-fit {s.kind} x{len(layers)} layers (shards)")
    last = [0]

    def progress(done: int, total: int, log: list[dict]) -> None:
        bar.update(done - last[0])
        last[0] = done

    start = int(load_checkpoint(ck)[1]["next_shard"]) if s.resume else 0
    t1 = time.perf_counter()
    try:
        with bar:
            last[0] = start
            bar.update(start)
            fs, info = fit(
                adapter,
                corpus,
                layers,
                cfg,
                checkpoint=ck,
                checkpoint_every=s.checkpoint_every,
                resume=s.resume,
                stop_after=s.stop_after,
                progress=progress,
            )
    except KeyboardInterrupt:
        where = f"its last checkpoint ({ck})" if ck.exists() else "the start (no checkpoint was written yet)"
        raise StreetlampError(
            f"interrupted: the fit in {folder} continues from {where} with the same command and --resume"
        ) from None
    t_fit = time.perf_counter() - t1
    training = {
        **cfg.record(),
        "shards_done": info["shards_done"],
        "tokens_seen": info["tokens_seen"],
        "steps_per_layer": info["steps_per_layer"],
        "tokens_per_shard": per_shard,
        "epochs": info["tokens_seen"] / max(1, corpus.describe()["train_tokens_per_epoch"]),
        "scales": {str(k): v for k, v in info["scales"].items()},
        "seconds_this_run": t_fit,
        "corpus_seconds": t_corpus,
        "tokens_this_run": (info["shards_done"] - start) * per_shard,
        "tokens_per_second_this_run": (info["shards_done"] - start) * per_shard / max(t_fit, 1e-9),
        "throughput": "tokens per layer per second of the fit (activations of every layer from one forward pass, "
        "then an Adam step per layer)",
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "device": str(adapter.device),
        "torch_threads": torch.get_num_threads(),
        "losses": "mse = mean over tokens of sum_d (y_hat - y)^2; relu: + lambda mean sum_i a_i ||W_dec[i]||; jumprelu: "
        "+ lambda mean sum_i H(z_i - theta_i) (straight-through, rectangle kernel of width bandwidth); topk: + aux-k "
        "(optional); all in units where the input has mean norm sqrt(d) (SAELens's losses)",
        "decoder": "saved with unit-norm decoder rows, the norms and input scales folded into the encoder (exact)",
    }
    pd.DataFrame(_training_rows(info["log"], layers)).to_csv(folder / "training.csv", index=False)
    values: dict[str, Any] = {
        "kind": s.kind,
        "site": s.where,
        "activation": s.activation,
        "width": s.width,
        "model": adapter.name,
        "layers": layers,
        "training": training,
        "finished": fs is not None,
    }
    common = {
        "corpus": corpus.describe(),
        "training": training,
        "parameters": {**_settings_record(s), "sparsity": sparsity, "where": s.where, "layers": layers},
    }
    if fs is None:
        store.update_manifest({**common, "summary": {"finished": False, "shards_done": info["shards_done"]}})
        values["metrics"] = []
        return FeaturesFitResult(folder, values)
    fs.info = {"training": training, "corpus": corpus.describe(), "model": adapter.describe()}
    save_features(fs, folder, dtype=torch.bfloat16 if s.save_dtype == "bfloat16" else None)
    saved = load_features(folder)  # the metrics are those of what was written (bfloat16 where asked)
    t2 = time.perf_counter()
    rows = layer_metrics(adapter, saved, corpus.held, batch_seqs=max(1, min(8, s.batch_seqs)), ce=s.ce)
    t_metrics = time.perf_counter() - t2
    atomic_write(folder / "metrics.csv", lambda p: pd.DataFrame(rows).to_csv(p, index=False))
    ck.unlink(missing_ok=True)
    files = {
        INDEX: "the feature set (streetlamp's format): read by --features DIR",
        "training.csv": "per shard and layer: mean loss parts and L0 over its Adam steps (scaled units)",
    }
    store.update_manifest({**common, **_metrics_manifest(rows, layers, t_metrics, files)})
    values["metrics"] = rows
    print(f"features-fit: metrics in {t_metrics:.1f} s", file=sys.stderr)
    return FeaturesFitResult(folder, values)


def _metrics_manifest(rows: list[dict], layers: list[int], seconds: float, files: dict[str, str]) -> dict:
    cols = list(rows[0])
    return {
        "summary": {
            "finished": True,
            "layers": layers,
            "mean_fvu": sum(r["fvu"] for r in rows) / len(rows),
            "mean_l0": sum(r["l0"] for r in rows) / len(rows),
            "metrics_seconds": seconds,
        },
        "tables": [
            {
                "title": f"per layer, on {rows[0]['heldout_tokens']} held-out tokens",
                "columns": cols,
                "rows": [[r[c] for c in cols] for r in rows],
            }
        ],
        "columns": {c: METRIC_COLUMNS[c] for c in cols},
        "files": {"metrics.csv": "per layer: " + "; ".join(f"{c}: {METRIC_COLUMNS[c]}" for c in cols), **files},
    }


def _evaluate(adapter: ModelAdapter, s: FeaturesFitSettings, folder: Path, layers: list[int]) -> FeaturesFitResult:
    """``--evaluate DIR``: the metrics of a finished dictionary folder on these settings' held-out sequences."""
    source = Path(s.evaluate or "")
    if not (source / INDEX).is_file():
        raise StreetlampError(f"--evaluate {source}: no {INDEX} there (not a finished dictionary folder)")
    fs = load_features(source, adapter)
    other = sorted({d.where for d in fs} - {s.where})
    if other:
        raise StreetlampError(
            f"--evaluate {source} holds {','.join(other)} dictionaries; --kind {s.kind} sits at {s.where}"
        )
    dicts = {(d.layer, d.where): d for d in fs if d.layer in layers}
    if not dicts:
        raise StreetlampError(f"--evaluate {source} has no dictionary at --layers {s.layers}")
    fs = FeatureSet(dicts, source=fs.source, model=fs.model)
    # the fit's own settings, where the folder has its manifest: is this the fit's held-out text?
    fit: dict = {}
    if (source / "manifest.json").is_file():
        fit = json.loads((source / "manifest.json").read_text()).get("settings", {})
    differs = [
        f"--{k.replace('_', '-')} {getattr(s, k)} (fit: {fit[k]})"
        for k in CORPUS
        if k in fit and fit[k] != getattr(s, k)
    ]
    if differs:
        print(f"features-fit: the held-out text is not the fit's: {'; '.join(differs)}", file=sys.stderr)
    store = RunStore.open(
        folder, _settings_record(s), {"model": adapter.describe(), "seed": s.seed}, command="features-fit"
    )
    corpus = build_corpus(
        adapter, s.data, tokens=s.tokens, seq_len=s.seq_len, heldout=s.heldout, seed=s.seed, generated=s.generated
    )
    layers = [d.layer for d in fs]
    t0 = time.perf_counter()
    rows = layer_metrics(adapter, fs, corpus.held, batch_seqs=max(1, min(8, s.batch_seqs)), ce=s.ce)
    t_metrics = time.perf_counter() - t0
    atomic_write(folder / "metrics.csv", lambda p: pd.DataFrame(rows).to_csv(p, index=False))
    evaluated = {
        "folder": str(source),
        "fit_settings": {k: fit[k] for k in CORPUS if k in fit} or None,
        "heldout_is_the_fit's": None if not fit else not differs,
    }
    store.update_manifest(
        {
            "corpus": corpus.describe(),
            "parameters": {**_settings_record(s), "where": s.where, "layers": layers},
            "evaluated": evaluated,
            **_metrics_manifest(rows, layers, t_metrics, {}),
        }
    )
    print(f"features-fit: metrics in {t_metrics:.1f} s", file=sys.stderr)
    values = {"kind": s.kind, "site": s.where, "model": adapter.name, "layers": layers, "metrics": rows}
    return FeaturesFitResult(folder, {**values, "evaluated": str(source), "finished": True})


def _training_rows(log: list[dict], layers: list[int]) -> list[dict]:
    rows = []
    for e in log:
        for l in layers:
            parts = e.get(str(l), {})
            rows.append({"shard": e["shard"], "layer": l, "tokens": e["tokens"], **parts})
    return rows
