"""``streetlamp probe``: what a layer holds (probe accuracy, control task, selectivity, MDL) beside
whether the model uses it (amnesic probing), per layer and probe. Definitions: ``streetlamp.probing``.

Flow: check the output folder and every setting -> load the model -> build the task (labels) ->
encode, align labelled words to sub-tokens, split *by text* into train/dev/test -> one forward
pass over every text records all probed sites (the representation cache of the run) -> probes,
control tasks, MDL, amnesic erasure, capacity sweep -> one run folder.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from ...batching import group_by_budget
from ...errors import StreetlampError
from ...extras import require
from ...models.adapter import Inputs, ModelAdapter
from ...probing import amnesic as am
from ...probing.control import control_labels, task_and_control
from ...probing.mdl import online_codelength
from ...probing.probes import ProbeSpec, fit_probe, parse_probes
from ...probing.tasks import ProbeTask, align, load_task_file, planted_task, pos_task, sentence_task
from ...specs import SWEEP_KINDS, parse_layers, parse_sweep  # noqa: F401 - the user-string parsers
from ...store.run_folder import RunFolder
from . import ProbeSettings

if TYPE_CHECKING:
    from ...settings import RunOptions

MIN_TRAIN, MIN_TEST = 10, 5


@dataclass
class ProbeResult:
    out: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    amnesic: list[dict[str, Any]] = field(default_factory=list)
    sweep: list[dict[str, Any]] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [*self.summary, f"output: {self.out}/ (manifest.json, arrays.safetensors, probe.png, summary.md)"]


def site_name(layer: str, site: str) -> str:
    return "embed" if layer == "embed" else f"layers.{layer}.{site}"


# -- building the task --------------------------------------------------------------------------------
def build_task(s: ProbeSettings, adapter: ModelAdapter) -> tuple[ProbeTask, str]:
    """The task and how items are mapped to positions ("token", or a pooling for sentence tasks)."""
    from ...data.loaders import load_dataset

    name = s.task
    if name.endswith(".jsonl") or name.endswith(".csv") or Path(name).is_file():
        task = load_task_file(name)
    elif name.startswith("deciding:") or name in ("negated", "category"):
        task = planted_task(name, s.n_examples, s.seed)
    elif name in ("pos", "upos", "sentiment"):
        ds = load_dataset(s.data)
        examples = ds.examples[: s.limit] if s.limit else ds.examples
        texts = [e.text for e in examples]
        if name == "sentiment":
            task = sentence_task(
                "sentiment",
                texts,
                [e.label for e in examples],
                {"labels": f"gold sentence labels of {ds.name}", "data": ds.source},
            )
        else:
            task = pos_task(texts, "ptb" if name == "pos" else "upos", ds.source)
        task.targets = gold_targets(adapter, [e.label for e in examples])
    else:
        raise StreetlampError(
            f"unknown task {name!r}: pos, upos, sentiment, deciding:TASK, negated, category, or a .jsonl/.csv file"
        )
    if s.limit and task.name not in ("pos", "upos", "sentiment"):
        keep = set(range(min(s.limit, len(task.texts))))
        task.items = [it for it in task.items if it.text in keep]
        task.texts = task.texts[: len(keep)]
        task.targets = task.targets[: len(keep)] if task.targets else None
    if len(task.classes) < 2:
        raise StreetlampError(f"task {task.name!r} has a single class ({task.classes[0]!r}): nothing to probe")
    pool = "token" if task.level == "token" else (s.pool or ("first" if adapter.kind.labels else "last"))
    return task, pool


def gold_targets(adapter: ModelAdapter, labels: list[str]) -> list[int] | None:
    """Gold output index per text when the classifier's classes are the data set's labels."""
    if not adapter.kind.labels:
        return None
    cfg: Any = adapter.hf_model.config  # a classifier config always has id2label
    names = {str(v): int(k) for k, v in cfg.id2label.items()}
    return [names[x] for x in labels] if all(x in names for x in labels) else None


def split_texts(n_texts: int, fractions: tuple[float, float, float], seed: int) -> np.ndarray:
    """0 = train, 1 = dev, 2 = test, per text (a random split by text, seeded)."""
    order = np.random.default_rng(seed).permutation(n_texts)
    n_train = int(round(fractions[0] * n_texts))
    n_dev = int(round(fractions[1] * n_texts))
    part = np.full(n_texts, 2, dtype=np.int64)
    part[order[:n_train]] = 0
    part[order[n_train : n_train + n_dev]] = 1
    return part


# -- the representation cache ---------------------------------------------------------------------------
def collect(
    adapter: ModelAdapter,
    inputs: Inputs,
    sites: list[str],
    item_text: np.ndarray,
    item_pos: np.ndarray | None,
    pool: str,
    budget: int | None,
) -> tuple[dict[str, np.ndarray], torch.Tensor]:
    """Features ``[n_items, d]`` per site (one forward pass per batch, all sites at once) and the logits."""
    feats = {s: np.zeros((len(item_text), adapter.d_model), np.float32) for s in sites}
    logits: list[torch.Tensor | None] = [None] * len(inputs)
    by_text: dict[int, list[int]] = {}
    for k, t in enumerate(item_text):
        by_text.setdefault(int(t), []).append(k)
    for group in group_by_budget(inputs.lengths, budget, adapter.device):
        inp = inputs.select(group)
        fwd = adapter.forward(inp, record=sites)
        for r, t in enumerate(group):
            logits[t] = fwd.logits[r].detach().double().cpu()
            n = inp.lengths[r]
            for s in sites:
                a = fwd.cache[s][r, :n].detach().float().cpu().numpy()
                for k in by_text.get(t, []):
                    if pool == "token":
                        assert item_pos is not None
                        feats[s][k] = a[item_pos[k]]
                    else:
                        feats[s][k] = {"first": a[0], "last": a[-1], "mean": a.mean(0)}[pool]
    return feats, torch.stack(logits)  # type: ignore[arg-type]


# -- the run ----------------------------------------------------------------------------------------------
def probe(
    adapter: ModelAdapter | None, s: ProbeSettings, out: Path | RunFolder, opts: RunOptions, progress: bool = True
) -> ProbeResult:
    """``streetlamp probe``: the model is loaded here (an embedded name, a folder or a ground-truth model)."""
    from ...probing.report import write_run

    if s.amnesic:  # before the model loads: amnesic probing (on by default) needs concept-erasure
        require("probe", "concept_erasure")
    rf = RunFolder.of(out, command="probe", overwrite=opts.overwrite)
    log = (lambda m: print(f"probe: {m}", file=sys.stderr)) if progress else (lambda m: None)
    t_start = time.time()
    adapter = load_model(str(opts.model), opts.device, opts.dtype)
    layers = parse_layers(s.layers, adapter.n_layers)
    sites = [site_name(l, s.site) for l in layers]
    specs = parse_probes(s.probes, s.hidden, s.weight_decay, s.dropout, s.seed, s.early_stopping, s.max_epochs)
    sweep = parse_sweep(s.sweep)
    sweep_layer = s.sweep_layer or str(adapter.n_layers // 2)
    if sweep and sweep_layer not in layers:
        raise StreetlampError(f"--sweep-layer {sweep_layer} is not among the probed layers ({', '.join(layers)})")
    log(f"building task {s.task}")
    task, pool = build_task(s, adapter)
    inputs = adapter.encode(task.texts, truncate=s.truncate)
    ids = [inputs.input_ids[b, :n].tolist() for b, n in enumerate(inputs.lengths)]
    silver = task.name in ("pos", "upos")
    n_dropped = n_first = 0
    if pool == "token":
        kept, positions, n_dropped = align(
            adapter.tokenizer,
            task,
            ids,
            s.subtoken,  # type: ignore[arg-type]
            "drop" if silver else "refuse",
        )
        if s.skip_first:  # the words at position 0 (a causal LM's attention sink): not probed, fitted or erased
            keep = [j for j, q in enumerate(positions) if q != 0]
            n_first = len(positions) - len(keep)
            kept, positions = [kept[j] for j in keep], [positions[j] for j in keep]
        task.items = [task.items[k] for k in kept]
        item_pos: np.ndarray | None = np.array(positions, dtype=np.int64)
    else:
        item_pos = None
    classes = task.classes
    if len(classes) < 2:
        raise StreetlampError(f"task {task.name!r} has a single class after alignment: nothing to probe")
    y = task.y()
    words = [it.word for it in task.items]
    item_text = np.array([it.text for it in task.items], dtype=np.int64)
    part_of_text = split_texts(len(task.texts), s.split, s.seed)
    part = part_of_text[item_text]
    tr, dv, te = (np.flatnonzero(part == p) for p in range(3))
    if len(tr) < MIN_TRAIN or len(te) < MIN_TEST or len(dv) < 1:
        raise StreetlampError(
            f"too few examples for the split: {len(task.texts)} texts give {len(tr)} train / {len(dv)} dev / "
            f"{len(te)} test items; need at least {MIN_TRAIN} / 1 / {MIN_TEST} (more texts, or --split)"
        )
    if len(set(y[tr].tolist())) < 2:
        raise StreetlampError("the training split has a single class: more texts, or another --seed")
    K = len(classes)
    yc = control_labels(words, y, K, seed=s.seed + 1)
    majority = float((y[te] == np.bincount(y[tr], minlength=K).argmax()).mean())
    control_majority = float((yc[te] == np.bincount(yc[tr], minlength=K).argmax()).mean())
    train_types = {words[k] for k in tr}
    seen_te = np.array([words[k] in train_types for k in te], dtype=bool)
    seen = float(seen_te.mean())  # the share of test items a type-memorising probe can have seen
    # a perfect type memoriser: right on every seen type, the training majority control label elsewhere
    memoriser = float((seen_te | (yc[te] == np.bincount(yc[tr], minlength=K).argmax())).mean())

    log(f"{len(task.texts)} texts, {len(y)} items, {K} classes; recording {len(sites)} sites")
    feats, logits = collect(adapter, inputs, sites, item_text, item_pos, pool, s.batch_size)

    res = ProbeResult(rf.out)
    mdl: dict[str, tuple[Any, Any]] = {}
    lin = ProbeSpec("linear", weight_decay=s.weight_decay, seed=s.seed, tol=1e-5)
    for site in sites:
        X = feats[site]
        for spec in specs:
            log(f"{site} {spec.name}")
            res.rows.append({"site": site, **task_and_control(spec, X, y, yc, K, (tr, dv, te))})
        if s.mdl:
            log(f"{site} MDL")
            fit_idx = np.concatenate([tr, dv])
            mdl[site] = (
                online_codelength(lin, X[fit_idx], y[fit_idx], K, seed=s.seed),
                online_codelength(lin, X[fit_idx], yc[fit_idx], K, seed=s.seed),
            )

    if s.amnesic:
        test_texts = np.flatnonzero(part_of_text == 2)
        groups = [
            [int(test_texts[i]) for i in g]
            for g in group_by_budget([inputs.lengths[t] for t in test_texts], s.batch_size, adapter.device)
        ]
        batches = [inputs.select(g) for g in groups]
        order = np.array([t for g in groups for t in g], dtype=np.int64)
        original = logits[torch.as_tensor(order)]
        tgt = None if task.targets is None else np.array(task.targets)[order]
        where = cast(
            am.Where,
            ("items" if s.erase_at == "items" else "all") if pool == "token" else ("all" if pool == "mean" else pool),
        )  # pool is one of token/mean/first/last
        cells: list[list[tuple[int, int]]] | None = None
        if where == "items":
            assert item_pos is not None
            row_of = {t: (b, r) for b, g in enumerate(groups) for r, t in enumerate(g)}
            cells = [[] for _ in groups]
            for k in range(len(y)):
                if int(item_text[k]) in row_of:
                    b, r = row_of[int(item_text[k])]
                    cells[b].append((r, int(item_pos[k])))
        base = am.output_change(original, original, tgt)
        for site in sites:
            log(f"{site} amnesic")
            X = feats[site]
            eraser = am.fit_leace(X[tr], y[tr], K)
            le = am.output_change(original, am.edited_logits(adapter, batches, site, eraser, where, cells), tgt)
            rnd = [
                am.output_change(
                    original,
                    am.edited_logits(
                        adapter,
                        batches,
                        site,
                        am.random_eraser(X.shape[1], eraser.rank, eraser.bias, s.seed + 100 + j),
                        where,
                        cells,
                    ),
                    tgt,
                )
                for j in range(s.random_seeds)
            ]
            recover = fit_probe(lin, eraser.apply_np(X[tr]), y[tr], K).accuracy(eraser.apply_np(X[te]), y[te])
            rk = np.array([r.kl for r in rnd])
            res.amnesic.append(
                {
                    "site": site,
                    "rank": eraser.rank,
                    "kl": le.kl,
                    "random_kl": float(rk.mean()),
                    "random_kl_sd": float(rk.std(ddof=1)) if len(rk) > 1 else 0.0,
                    "used_kl": le.kl - float(rk.mean()),
                    "agree": le.agree,
                    "random_agree": float(np.mean([r.agree for r in rnd])),
                    "accuracy": le.accuracy,
                    "random_accuracy": float(np.mean([r.accuracy for r in rnd])),
                    "original_accuracy": base.accuracy,
                    "recover_accuracy": recover,
                    "random_kl_each": rk.tolist(),
                }
            )
    if sweep:
        kind, values = sweep
        site = site_name(sweep_layer, s.site)
        X = feats[site]
        for v in values:
            spec = sweep_spec(kind, v, s)
            log(f"sweep {kind}={v:g} at {site}")
            res.sweep.append(
                {"site": site, "kind": kind, "value": v, **task_and_control(spec, X, y, yc, K, (tr, dv, te))}
            )

    info = {
        "model": adapter.describe(),
        "task": {
            "name": task.name,
            "level": task.level,
            "classes": classes,
            "n_texts": len(task.texts),
            "n_items": len(y),
            "items_per_split": [len(tr), len(dv), len(te)],
            "dropped_unalignable_words": n_dropped,
            "dropped_words_at_position_0": n_first,
            **task.source,
        },
        "representation": {
            "sites": sites,
            "position": pool if pool != "token" else f"{s.subtoken} sub-token of each labelled word",
        },
        "settings": asdict(s),
        "probes": [p.params() for p in specs],
        "baselines": {
            "majority_test_accuracy": majority,
            "control_majority_test_accuracy": control_majority,
            "test_items_with_a_training_word_type": seen,
            "control_memoriser_test_accuracy": memoriser,
        },
        "seconds": round(time.time() - t_start, 1),
    }
    write_run(rf, res, info, mdl, sites, specs)
    return res


def sweep_spec(kind: str, v: float, s: ProbeSettings) -> ProbeSpec:
    base = ProbeSpec(
        "mlp",
        hidden=s.hidden,
        weight_decay=s.weight_decay,
        dropout=s.dropout,
        seed=s.seed,
        early_stopping=s.early_stopping,
        max_epochs=s.max_epochs,
    )
    if kind == "hidden":
        return replace(base, hidden=int(v))
    if kind == "rank":
        return replace(base, kind="linear", hidden=0, dropout=0.0, rank=int(v))
    if kind == "weight_decay":
        return replace(base, weight_decay=v)
    return replace(base, dropout=v)


def load_model(model: str, device: str, dtype: str = "float32") -> ModelAdapter:
    """An embedded name, a checkpoint folder, or a ground-truth model ``gt-TASK-normal|deceptive``."""
    from ...groundtruth.train import weights_path
    from ...models.loading import load

    if model.startswith("gt-") and model.count("-") == 2:
        _, task, variant = model.split("-")
        path = weights_path(task, variant)
        if not (path / "config.json").exists():
            raise StreetlampError(
                f"no ground-truth model {model!r} (have gt-TASK-normal|deceptive for "
                "keyword, order, negation, together)"
            )
        adapter = load(path)
        adapter.name = model
    else:
        adapter = load(model)
    from ...models.seq2seq import require_one_stack

    require_one_stack(adapter, "probe")
    if device != "cpu" or dtype != "float32":
        adapter.to(device, dtype)
    return adapter
