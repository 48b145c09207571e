"""``streetlamp replicate``: Jain & Wallace, Serrano & Smith and Wiegreffe & Pinter per layer and per head,
over bundled data, in one resumable run folder (the :class:`~streetlamp.store.RunStore` of ``evaluate``).

Tasks: ``movies`` and ``tweets`` are sentiment (a classifier's classes; a causal LM reads the zero-shot
prompt :data:`PROMPTS` and decides between the label tokens), ``recall`` is next-token factual recall
(causal LMs only: the decision is the top next token over the vocabulary). The summary is the mean of
every metric per dataset x layer / head with a bootstrap 95% interval over examples.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ... import progress, specs
from ...data import load_dataset, sample_indices
from ...errors import StreetlampError
from ...evaluation.replicate import (
    Decision,
    ReplicateSettings,
    TaskExample,
    adv_layers,
    replicate_chunk,
)
from ...models.adapter import ModelAdapter
from ...stats import bootstrap_ci
from ...store import RunStore
from ..evaluate.run import label_indices, next_token_labels

if TYPE_CHECKING:
    from ...settings import RunOptions
    from . import ReplicateCommandSettings

DATASETS = ("movies", "tweets", "recall")
PROMPTS = {
    "movies": "Review: {text}\nSentiment (positive or negative):",
    "tweets": "Tweet: {text}\nSentiment (positive or negative):",
    "recall": "{text}",
}
# the per-layer table of summary.md: (column, metric)
LAYER_COLUMNS = [
    ("tau(att,grad)", "tau_attention_gradient"),
    ("tau(att,loo)", "tau_attention_loo"),
    ("flip top-att", "flip_top_attention"),
    ("flip top-grad", "flip_top_gradient"),
    ("flip random", "flip_random"),
    ("JS top-att", "js_top_attention"),
    ("JS random", "js_random"),
    ("JS top-att - random", "js_top_minus_random"),
    ("perm TVD", "perm_tvd_median"),
    ("adv JS", "adv_js"),
    ("uniform TVD", "uniform_tvd"),
    ("uniform flip", "uniform_flip"),
]


@dataclass
class ReplicateResult:
    out: Path
    n_examples: int
    n_computed_chunks: int
    summary: pd.DataFrame
    table: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [
            *self.table[:60],
            f"{self.n_examples} examples, {self.n_computed_chunks} chunks computed now; run folder: {self.out}/ "
            "(summary.md, summary.csv with 95% bootstrap intervals, metrics/*.parquet, arrays/)",
        ]


def parse_data(spec: str) -> list[str]:
    return specs.parse_data(spec, DATASETS)


def text_items(
    adapter: ModelAdapter, prompt: str, start: int, end: int, exclude_last: bool, exclude_first: bool = False
) -> tuple[list[int], np.ndarray]:
    """Token ids of ``prompt`` and the mask of its items: tokens overlapping characters ``start:end``
    (the data's text), never a special token, not the last token when ``exclude_last`` and not the
    sequence's first token when ``exclude_first``."""
    enc = adapter.tokenizer(prompt, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    spans = enc["offset_mapping"]
    items = np.array([a < end and b > start and b > a for a, b in spans], bool) & ~adapter.special_mask(ids)
    if exclude_last:
        items[len(ids) - 1] = False
    if exclude_first:
        items[0] = False
    return ids, items


def _one_token(adapter: ModelAdapter, label: str) -> bool:
    try:
        next_token_labels(adapter, [label])
    except StreetlampError:
        return False
    return True


def prepare(
    adapter: ModelAdapter, name: str, limit: int | None, settings: ReplicateSettings, offset: int
) -> tuple[Decision, list[TaskExample], dict]:
    """One dataset's decision space and examples (``limit`` drawn with the settings' seed, in file order)."""
    seed, head_examples = settings.seed, settings.head_examples
    ds = load_dataset(name)
    causal = adapter.kind.causal
    if name == "recall" and not causal:
        raise StreetlampError(f"recall is a next-token task: {adapter.name} is not a causal LM (use movies,tweets)")
    dropped: list[str] = []
    if name == "recall":  # another tokenizer may split an answer: those prompts are left out and listed
        one = {lab for lab in ds.labels() if _one_token(adapter, lab)}
        dropped = [e.id for e in ds.examples if e.label not in one]
        ds.examples = [e for e in ds.examples if e.label in one]
        if not ds.examples:
            raise StreetlampError(f"no recall answer is one token of {adapter.name}'s vocabulary")
    labels = ds.labels()  # before the draw: a draw of one example still decides between every label
    if limit is not None:
        ds.examples = [ds.examples[i] for i in sample_indices(len(ds.examples), limit, seed)]
    if name == "recall":
        decision, gold = Decision(None), next_token_labels(adapter, labels)
    elif causal:
        tok = next_token_labels(adapter, labels)
        decision, gold = Decision(tuple(tok[x] for x in labels)), {x: i for i, x in enumerate(labels)}
    else:
        decision, gold = Decision(None), label_indices(adapter, ds)
    template = PROMPTS[name] if causal else "{text}"
    out = []
    for i, e in enumerate(ds.examples):
        prompt = template.format(text=e.text)
        start = template.index("{text}")
        ids, items = text_items(adapter, prompt, start, start + len(e.text), causal, settings.exclude_first)
        if len(ids) > adapter.max_positions:
            continue
        per_head = head_examples < 0 or i < head_examples
        out.append(TaskExample(offset + i, f"{name}:{e.id}", ids, prompt, gold[e.label], items, per_head))
    info = {
        "source": ds.source,
        "sha256": ds.hash(),
        "n_examples": len(out),
        "prompt": template,
        "labels": labels if name != "recall" else "one answer token per prompt",
        **({"skipped_multi_token_answer": dropped} if dropped else {}),
        "decision": "label tokens, renormalised"
        if decision.candidates is not None
        else ("the whole vocabulary" if causal else "the classes"),
    }
    return decision, out, info


def replicate(
    adapter: ModelAdapter, s: ReplicateCommandSettings, out: Path, opts: RunOptions | None = None
) -> ReplicateResult:
    """``streetlamp replicate`` on the loaded, placed and validated ``adapter``."""
    tasks, infos, offset = [], {}, 0
    for name in s.data:  # every check before the store is touched
        decision, examples, info = prepare(adapter, name, s.limit, s, offset)
        offset += 1_000_000
        tasks.append((name, decision, examples))
        infos[name] = info
    run_settings = {
        "model": {"name": adapter.name, "source": adapter.source},
        "data": infos,
        "limit": s.limit,
        "chunk_size": s.chunk_size,
        "settings": s.to_dict(),
        "adv_layers": adv_layers(adapter.n_layers, s.adv_layers),
    }
    # settings added after runs were made resume those runs at the value that reproduces them
    added = {f"settings.{k}": getattr(ReplicateSettings(), k) for k in ("zero_rows", "exclude_first")}
    store = RunStore.open(Path(out), run_settings, {"model_info": adapter.describe()}, command="replicate", added=added)
    per_task = [[(d, ex[i : i + s.chunk_size]) for i in range(0, len(ex), s.chunk_size)] for _, d, ex in tasks]
    # datasets interleaved, so a run stopped early has every dataset
    chunks = [c for k in range(max(map(len, per_task))) for t in per_task if k < len(t) for c in [t[k]]]
    done = store.done_chunks()
    todo = [c for c in range(len(chunks)) if c not in done]
    total = sum(len(c[1]) for c in chunks)
    with progress.bar(total, "replicate", file=sys.stderr, dynamic_ncols=True) as bar:
        bar.update(sum(len(chunks[c][1]) for c in done if c < len(chunks)))
        for c in todo:
            rows, arrays = replicate_chunk(adapter, chunks[c][0], chunks[c][1], s)
            store.write_chunk(c, rows, arrays)
            bar.update(len(chunks[c][1]))
    summary = summarise(store.metrics())
    lines = write_summary(store.folder, summary, adapter.name, s)
    return ReplicateResult(store.folder, total, len(todo), summary, lines)


POOLED = (
    "tau_attention_gradient",
    "tau_attention_loo",
    "flip_top_attention",
    "flip_random",
    "js_top_attention",
    "js_random",
)


def derived(df: pd.DataFrame) -> pd.DataFrame:
    """Per-example statistics built from the stored ones, so that they get intervals like the rest:

    * ``heads{L}``: the mean over layer L's heads of each head metric in :data:`POOLED` (one value per
      example; heads without a value, e.g. no per-head zeroing for that example, are skipped);
    * ``*_top_minus_random`` for ``layer{L}``, ``head{L}.{H}`` and ``heads{L}``: the paired difference, per example, of zeroing
      the top-attention item and a random one (``flip_`` and ``js_``): above 0 = attention picked an item that
      matters more than chance."""
    parts = []
    h = df[df.method.str.startswith("head") & df.metric.isin(POOLED)]
    if not h.empty:
        g = h.assign(method="heads" + h.method.str[4:6]).groupby(["example_id", "method", "metric"], as_index=False)
        parts.append(g["value"].mean())
    base = pd.concat([df, *parts], ignore_index=True)
    both = base[base.method.str.startswith(("layer", "head"))]
    for kind in ("flip", "js"):
        w = both[both.metric.isin([f"{kind}_top_attention", f"{kind}_random"])]
        w = w.pivot_table(index=["example_id", "method"], columns="metric", values="value", aggfunc="first")
        if w.shape[1] < 2:
            continue
        d = (w[f"{kind}_top_attention"] - w[f"{kind}_random"]).dropna().rename("value").reset_index()
        parts.append(d.assign(metric=f"{kind}_top_minus_random"))
    return pd.concat([df, *parts], ignore_index=True)


def summarise(df: pd.DataFrame, n_boot: int = 2000) -> pd.DataFrame:
    """Mean and 95% bootstrap interval over examples per dataset x method (layer / head / heads of a layer)
    x metric, the :func:`derived` statistics included."""
    cols = ["dataset", "method", "metric", "mean", "low", "high", "n"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    df = derived(df)
    df = df.assign(dataset=df.example_id.str.split(":").str[0])
    out = []
    for (d, m, k), g in df.groupby(["dataset", "method", "metric"], sort=True):
        out.append((d, m, k, *bootstrap_ci(g["value"].to_numpy(), n_boot=n_boot)))
    return pd.DataFrame(out, columns=cols)


def _cell(r: pd.Series | None) -> str:
    if r is None or math.isnan(r["mean"]):
        return ""
    if math.isnan(r["low"]):
        return f"{r['mean']:.3f}"
    return f"{r['mean']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"


def by_method_metric(sd: pd.DataFrame) -> dict[tuple[str, str], pd.Series]:
    """One dataset's summary rows keyed by (method, metric)."""
    return {(m, k): r for (m, k), r in zip(zip(sd.method, sd.metric), (r for _, r in sd.iterrows()))}


def head_digest(sd: pd.DataFrame) -> list[str]:
    """Per layer: how many heads' tau interval lies above / below 0 and the best head; the heads' mean tau and
    per-head zeroing pooled over the layer's heads (``heads{L}`` of :func:`derived`), with intervals."""
    heads = sd[sd.method.str.match(r"head\d")]
    if heads.empty:
        return []
    heads = heads.assign(layer=heads.method.str[4:6].astype(int))
    pooled = by_method_metric(sd)
    cols = [
        ("heads' tau(att,grad)", "tau_attention_gradient"),
        ("heads' tau(att,loo)", "tau_attention_loo"),
        ("head zeroing: flip top-att", "flip_top_attention"),
        ("flip random", "flip_random"),
        ("flip top-att - random", "flip_top_minus_random"),
        ("JS top-att - random", "js_top_minus_random"),
    ]
    out = [
        "Per head (each head's own attention row; intervals over examples): heads whose tau interval is above 0 "
        "/ below 0 and the head with the highest mean tau; then per example the mean over the layer's heads "
        "(tau, and zeroing one item in one head: examples with --head-examples), with its interval",
        "",
        "| layer | tau(att,grad) >0 / <0 | best head (att,grad) | tau(att,loo) >0 / <0 | best head (att,loo) | "
        + " | ".join(c for c, _ in cols)
        + " |",
        "|---" * (5 + len(cols)) + "|",
    ]
    for layer, g in heads.groupby("layer"):
        cells = [str(layer)]
        for metric in ("tau_attention_gradient", "tau_attention_loo"):
            t = g[g.metric == metric]
            cells.append(f"{int((t.low > 0).sum())} / {int((t.high < 0).sum())} of {len(t)}")
            best = t.loc[t["mean"].idxmax()] if t["mean"].notna().any() else None
            cells.append("" if best is None else f"{best.method[4:]}: {_cell(best)}")
        cells += [_cell(pooled.get((f"heads{layer:02d}", k))) for _, k in cols]
        out.append("| " + " | ".join(cells) + " |")
    return out


def settings_line(s: ReplicateSettings) -> str:
    """What the interventions were, in words (the numbers mean different things under different settings)."""
    heads = {0: "none", -1: "every example"}.get(s.head_examples, f"the first {s.head_examples} examples per dataset")
    return (
        f"Settings: zeroing in {'the explained row' if s.zero_rows == 'explained' else 'every query row'}; "
        f"interventions at layers {s.layers}; per-head zeroing on {heads}; {s.permutations} permutations; "
        f"adversarial search {s.adv_steps} steps at {s.adv_layers} layers (output within TVD {s.eps}); "
        f"first token {'excluded from the items' if s.exclude_first else 'an item when it is data'}; seed {s.seed}."
    )


def write_summary(
    folder: Path, summary: pd.DataFrame, model: str, settings: ReplicateSettings | None = None
) -> list[str]:
    summary.to_csv(folder / "summary.csv", index=False)
    lines = [f"# Attention vs interventions, {model}: mean [95% bootstrap interval] over examples", ""]
    if settings is not None:
        lines += [settings_line(settings), ""]
    for d, sd in summary.groupby("dataset", sort=False):
        key = by_method_metric(sd)
        n = int(sd[(sd.method == "model") & (sd.metric == "correct")]["n"].max())
        lines += [
            f"## {d} ({n} examples)",
            "",
            f"accuracy {_cell(key.get(('model', 'correct')))}; uniform attention in every layer: flip "
            f"{_cell(key.get(('all_layers', 'uniform_flip')))}, accuracy {_cell(key.get(('all_layers', 'uniform_correct')))}; "
            f"tau(gradient, leave-one-out) {_cell(key.get(('model', 'tau_gradient_loo')))}",
            "",
            "| layer | " + " | ".join(c for c, _ in LAYER_COLUMNS) + " |",
            "|---" * (len(LAYER_COLUMNS) + 1) + "|",
        ]
        layers = sorted(m for m in sd.method.unique() if m.startswith("layer"))
        for m in layers:
            lines.append(f"| {int(m[5:])} | " + " | ".join(_cell(key.get((m, k))) for _, k in LAYER_COLUMNS) + " |")
        lines += ["", *head_digest(sd), ""]
    (folder / "summary.md").write_text("\n".join(lines) + "\n")
    return lines
