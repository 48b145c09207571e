"""``streetlamp explain``: one text, its attention (every layer and head), methods, figures."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from ...methods.attention import record_attention
from ...methods.registry import get_method
from ...models.adapter import Inputs, ModelAdapter, Target
from ...readings import ATTENTION_FAMILY, attention_sink, position_skew, sink_line, skew_line
from ...report import heatmaps
from ...results import Explanation
from ...store.run_folder import RunFolder, RunWriter

if TYPE_CHECKING:
    from . import ExplainSettings


@dataclass
class ExplainResult:
    out: Path
    text: str
    tokens: list[str]
    labels: list[str]
    target_index: int
    prediction: int
    probs: np.ndarray
    attention: np.ndarray  # [layer, head, query, key]
    allowed: np.ndarray  # [query, key] bool
    position: int
    explanations: dict[str, Explanation] = field(default_factory=dict)
    summary: list[str] = field(default_factory=list)
    model: str = ""  # "name (kind, L layers x H heads)"
    image: np.ndarray | None = None  # image models: the input as the model sees it, RGB [H, W, 3] in [0, 1]

    def lines(self) -> list[str]:
        return [
            f"model: {self.model}",
            *self.summary,
            f"output: {self.out}/ (manifest.json, arrays.safetensors, PNG heatmaps"
            + (", methods_comparison.png, kendall_tau.csv" if self.explanations else "")
            + (", image_overlay.png)" if self.image is not None else ")"),
        ]

    def _repr_html_(self) -> str:  # a notebook shows the run's report inline
        from ...report.viewer import iframe_html

        return iframe_html(self.out)


def parse_target(adapter: ModelAdapter, spec: str | None) -> int | None:
    """A class name or id (classifier), or a token string (causal LM); None = the prediction."""
    if spec is None or spec in ("", "predicted", "next"):
        return None
    return adapter.parse_label(spec)


def run_explain(adapter: ModelAdapter, s: ExplainSettings, out: RunFolder | Path, options: Any = None) -> Any:
    """``streetlamp explain``: the whole attention tensor and the methods (:func:`explain`), or with
    ``--rows/--layers/--heads`` the long-input recording (:func:`~.long.explain_long`)."""
    if s.long:
        from .long import explain_long

        return explain_long(adapter, s, out)
    from ...models.memory import check_memory

    force = bool(options.force) if options is not None else False
    check_memory(adapter, max(adapter.encode(s.text, truncate=s.truncate).lengths), force)
    return explain(adapter, s, out)


def explain(adapter: ModelAdapter, s: ExplainSettings, out: RunFolder | Path) -> ExplainResult:
    """One text (``s.text``) explained: attention of every layer and head, ``s.methods`` (default
    :func:`default_methods`), figures and the manifest, written into ``out``."""
    rf = RunFolder.of(out, "explain")  # refuse before any work
    target = s.explained_target(adapter)
    layer, head, truncate, seed, batch_size = s.layer, s.head, s.truncate, s.seed, s.batch_size
    inputs = adapter.encode(s.text, truncate=truncate)
    res = compute(
        adapter,
        inputs,
        rf.out,
        target=target,
        methods=s.methods or default_methods(),
        seed=seed,
        batch_size=batch_size,
        method_params=s.method_params,
    )
    with rf.staging() as w:
        write_outputs(adapter, res, w, target, layer, head, seed, truncate, inputs.truncated[0], batch_size)
    res.summary = summarise(adapter, res)
    res.model = f"{adapter.name} ({adapter.kind}, {adapter.n_layers} layers x {adapter.n_heads} heads)"
    return res


def compute(
    adapter: ModelAdapter,
    inputs: Inputs,
    out: Path,
    *,
    target: Target = Target(),
    methods: list[str] | None = None,
    seed: int = 0,
    batch_size: int | None = None,
    method_params: dict[str, dict[str, Any]] | None = None,
    stage: Callable[[str], None] | None = None,
) -> ExplainResult:
    """The explain computation for the first text of ``inputs`` (nothing written); ``stage(name)`` is
    called before each step (``streetlamp serve`` shows it as progress)."""
    torch.manual_seed(seed)
    if stage:
        stage("recording attention")
    logits, att_t, allowed_t = record_attention(adapter, inputs)
    index = int(adapter.resolve(inputs, target, logits)[0])
    probs = torch.softmax(logits[0].float(), -1).cpu().numpy()
    n = inputs.lengths[0]
    att = att_t[0, :, :, :n, :n].float().cpu().numpy()
    allowed = allowed_t[0, :n, :n].cpu().numpy().astype(bool)
    pos = adapter.explained_position(n)
    res = ExplainResult(
        Path(out),
        inputs.texts[0],
        inputs.tokens[0],
        inputs.labels[0],
        index,
        int(probs.argmax()),
        probs,
        att,
        allowed,
        pos,
    )
    if adapter.modality == "image":
        res.image = cast(Any, adapter.tokenizer).rgb(inputs.input_ids[0])
    run_target = Target(index, target.contrast, target.quantity)
    for name in methods or []:
        if stage:
            stage(name)
        params = dict((method_params or {}).get(name, {}))
        m = get_method(name, **params)
        m.check(adapter)
        res.explanations[name] = m.attribute(adapter, inputs, target=run_target, batch_size=batch_size, seed=seed)[0]
        add_readings(res, name)
    return res


def add_readings(res: ExplainResult, name: str) -> None:
    """Notes on how to read a method's scores, into its ``info`` (so the manifest's ``methods`` and the
    report carry them): the attention sink of an attention-derived score over the keys the explained
    position may read, AttnLRP's position skew (:mod:`streetlamp.readings`)."""
    e = res.explanations[name]
    if e.info.get("family") == ATTENTION_FAMILY:
        keys = np.flatnonzero(res.allowed[res.position]).tolist() if res.allowed.ndim == 2 else None
        sink = attention_sink(e.scores, res.labels, keys) if len(e.scores) == len(res.labels) else None
        if sink is not None:
            e.info["attention_sink"] = sink
    if name == "attnlrp":
        skew = position_skew(e.scores)
        if skew is not None:
            e.info["position_skew"] = skew


def write_outputs(
    adapter: ModelAdapter,
    res: ExplainResult,
    w: RunWriter,
    target: Target,
    layer: int | None,
    head: int | None,
    seed: int,
    truncate: bool,
    truncated: bool,
    batch_size: int | None,
    figures: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Arrays, figures (unless ``figures=False``) and the manifest (plus ``extra`` keys) into ``w``."""
    w.add_array(
        "attention",
        res.attention.astype(np.float32),
        axes=["layer", "head", "query", "key"],
        meaning="post-softmax attention probabilities A[l,h,i,j]: query token i (row) attends to key "
        "token j (column), eval mode; per query head for grouped-query attention",
    )
    w.add_array(
        "allowed",
        res.allowed.astype(np.uint8),
        axes=["query", "key"],
        meaning="1 where the mask (padding, causal) lets query i see key j; forbidden cells are exactly 0 in "
        "`attention` and drawn hatched grey",
    )
    w.add_array(
        "probs",
        res.probs.astype(np.float32),
        axes=["output"],
        meaning="softmax of the explained logits (classes, or the next-token distribution for a causal LM)",
    )
    for name, e in res.explanations.items():
        for k, v in e.arrays.items():
            # the attention method's copy of the run's attention and mask is stored once (GBs on long texts)
            same = k if k in ("attention", "allowed") else None
            w.add_array(f"{name}.{k}", np.asarray(v), axes=e.axes[k], meaning=e.meaning.get(k, ""), same_as=same)
    if figures:
        write_figures(adapter, res, w, layer, head)
    return w.write_manifest(
        {
            "model": adapter.describe(),
            "text": res.text,
            "tokens": res.tokens,
            "token_labels": res.labels,
            "special_positions": np.flatnonzero(
                adapter.special_mask(cast(list[int], adapter.tokenizer.convert_tokens_to_ids(res.tokens)))
            ).tolist(),
            "truncated": truncated,
            "explained_position": {
                "index": res.position,
                "token": res.labels[res.position],
                "why": "[CLS] feeds the classifier"
                if res.position == 0 and adapter.kind.labels
                else "the last token predicts the next one",
            },
            "target": {
                "index": res.target_index,
                "label": adapter.output_label(res.target_index),
                "contrast": target.contrast,
                "quantity": target.quantity,
                "explained": target.describe(adapter, res.target_index),
                "chosen": "given" if target.index is not None else "predicted",
            },
            "prediction": {
                "index": res.prediction,
                "label": adapter.output_label(res.prediction),
                "prob": float(res.probs[res.prediction]),
            },
            "masks": {
                "allowed": "arrays.safetensors:allowed",
                "kind": "causal + padding" if adapter.kind.causal else "padding (bidirectional)",
            },
            "colour_scales": {"attention": heatmaps.ATTENTION_SCALE},
            "parameters": {
                "layer": layer,
                "head": head,
                "truncate": truncate,
                "seed": seed,
                "batch_size": batch_size,
                "methods": {k: e.info.get("params", {}) for k, e in res.explanations.items()},
            },
            "methods": {
                k: {kk: vv for kk, vv in e.info.items() if kk != "params"} for k, e in res.explanations.items()
            },
            "seed": seed,
            **({"image": image_record(adapter, res)} if res.image is not None else {}),
            **(extra or {}),
        }
    )


def image_record(adapter: ModelAdapter, res: ExplainResult) -> dict[str, Any]:
    """What the manifest says about an image input: the file, the grid, how patches are named."""
    assert res.image is not None
    return {
        "file": res.text,
        "size_seen": list(res.image.shape[:2]),
        **adapter.patch_grid(),
        "tokens": "[CLS] then the patches row by row: patch(r,c) is row r, column c of the patch grid",
        "overlay": "image_overlay.png: each method's patch scores drawn over the image, one square per patch",
        "replacement": "[MEAN]: a patch at the image processor's mean pixel (0 after normalisation); what an "
        "occluded patch becomes and the integrated-gradients baseline patch",
    }


def write_image_overlay(adapter: ModelAdapter, res: ExplainResult, w: RunWriter) -> None:
    """``image_overlay.png``: attention (the explained row, last layer, head mean, unless the run has the
    attention method) and every method's scores over the patches, drawn on the image."""
    from ...report.image_overlay import OVERLAY_FILE, patch_grid, plot_overlay

    assert res.image is not None
    g = adapter.patch_grid()
    rows, cols = g["patch_rows"], g["patch_cols"]
    L, H = res.attention.shape[:2]
    panels: dict[str, np.ndarray] = {}
    if "attention" not in res.explanations:
        row = res.attention[L - 1, :, res.position].mean(0)
        panels[f"attention from [CLS], layer {L - 1}, head mean"] = patch_grid(row, rows, cols)
    for name, e in res.explanations.items():
        panels[name] = patch_grid(e.scores, rows, cols)
    title = f"{adapter.name}: explaining {adapter.output_label(res.target_index)!r} (patches {rows} x {cols})"
    plot_overlay(res.image, panels, title, w.path / OVERLAY_FILE)
    w.add_figure(file=OVERLAY_FILE, shows="patch scores of each method over the image", view="explain")


def write_figures(adapter: ModelAdapter, res: ExplainResult, w: RunWriter, layer: int | None, head: int | None) -> None:
    L, H = res.attention.shape[:2]
    sel_l = layer if layer is not None else L - 1
    if head is not None:
        hm, title = res.attention[sel_l, head], f"layer {sel_l}, head {head}"
    else:
        hm, title = res.attention[sel_l].mean(0), f"layer {sel_l}, mean over {H} heads"
    name = f"attention_L{sel_l}_H{head}.png" if head is not None else f"attention_L{sel_l}_mean.png"
    grid = {"array": "attention", "rows": "query", "columns": "key"}
    heatmaps.plot_head(hm, res.allowed, res.labels, f"{adapter.name}: attention, {title}", w.path / name)
    w.add_figure(file=name, shows=f"attention {title}", **grid)
    heatmaps.plot_grid(
        res.attention, res.allowed, res.labels, f"{adapter.name}: every layer x head", w.path / "attention_grid.png"
    )
    w.add_figure(file="attention_grid.png", shows="layer x head grid", **grid)
    heatmaps.plot_layer_means(
        res.attention,
        res.allowed,
        res.labels,
        f"{adapter.name}: head mean per layer",
        w.path / "attention_head_mean.png",
    )
    w.add_figure(file="attention_head_mean.png", shows="mean over heads, each layer", **grid)
    if res.image is not None:
        write_image_overlay(adapter, res, w)
    if res.explanations:
        from ...report.compare import write_comparison

        for f in write_comparison(
            {k: e.scores for k, e in res.explanations.items()},
            res.labels,
            w.path,
            adapter.special_mask(cast(list[int], adapter.tokenizer.convert_tokens_to_ids(res.tokens))),
        ):
            w.add_figure(**f)


DEFAULT_METHODS = ["attention", "rollout", "integrated_gradients", "occlusion"]


def default_methods() -> list[str]:
    from ...methods.registry import REGISTRY

    return [m for m in DEFAULT_METHODS if m in REGISTRY]


def summarise(adapter: ModelAdapter, res: ExplainResult, k: int = 3) -> list[str]:
    """A few lines read at a glance: what attention points at, and what removing it does."""
    L, H = res.attention.shape[:2]
    lines = [
        f"prediction: {adapter.output_label(res.prediction)!r} (p={res.probs[res.prediction]:.3f})"
        + (f"; explaining {adapter.output_label(res.target_index)!r}" if res.target_index != res.prediction else "")
    ]
    att_e = res.explanations.get("attention")
    row = att_e.scores if att_e is not None else res.attention[L - 1, :, res.position].mean(0)
    view = att_e.info.get("view") if att_e is not None else f"layer {L - 1}, mean over {H} heads"
    special = adapter.special_mask(cast(list[int], adapter.tokenizer.convert_tokens_to_ids(res.tokens)))
    words = np.flatnonzero(~special).tolist()
    where = f"attention from {res.labels[res.position]!r} (position {res.position}), {view}"
    lines.append(f"attention here means: {where}")
    if len(words) < len(res.tokens):
        lines.append(
            f"  {row[[j for j in range(len(row)) if j not in words]].sum():.0%} of it goes to "
            "special tokens (excluded below)"
        )
    sink = attention_sink(row, res.labels, words)
    if sink is not None:
        lines.append(sink_line("this attention row", sink))
    for name, e in res.explanations.items():
        if name != "attention" and "attention_sink" in e.info:
            lines.append(sink_line(name, e.info["attention_sink"]))
        if "position_skew" in e.info:
            lines.append(skew_line(name, e.info["position_skew"]))
    occ = res.explanations.get("occlusion")
    if occ is None or not words:
        order = sorted(words, key=lambda j: -row[j])[:k]
        lines.append("top tokens by attention: " + ", ".join(f"{res.labels[j]!r}@{j} {row[j]:.3f}" for j in order))
        return lines
    delta = occ.scores
    how = (
        "token deleted"
        if occ.info.get("replacement_used") == "delete"
        else f"token replaced by {occ.info.get('replacement_token') or occ.info.get('replacement', '?')}"
    )
    by_att = sorted(words, key=lambda j: -row[j])[:k]
    groups = occ.arrays.get("groups")
    occluded = [j for j in words if groups is None or groups[j] >= 0]  # a decoder's explained position is not
    by_occ = sorted(occluded, key=lambda j: -abs(delta[j]))[:k]
    quantity = occ.info.get("target", {}).get("explained", "the target")
    lines.append(f"what removing a token does (occlusion, {how}; change of {quantity}):")
    if occ.info.get("removal_rule"):
        lines.append(f"  ({occ.info['removal_rule']})")
    lines.append(f"  {'token':<16}{'attention':>10}{'rank':>6}{'change if removed':>19}{'rank':>6}")
    att_rank = {j: r + 1 for r, j in enumerate(sorted(words, key=lambda j: -row[j]))}
    occ_rank = {j: r + 1 for r, j in enumerate(sorted(occluded, key=lambda j: -abs(delta[j])))}
    for title, group in (("top by attention", by_att), ("top by occlusion", by_occ)):
        lines.append(f"  {title}:")
        for j in group:
            tok = f"{res.labels[j]!r}@{j}"
            if j in occ_rank:
                lines.append(f"  {tok:<16}{row[j]:>10.3f}{att_rank[j]:>6}{-delta[j]:>+19.4f}{occ_rank[j]:>6}")
            else:
                lines.append(f"  {tok:<16}{row[j]:>10.3f}{att_rank[j]:>6}{'not removed':>19}{'-':>6}")
    shared = len(set(by_att) & set(by_occ))
    from ...stats import kendall_tau

    tau = kendall_tau(row, np.abs(delta), special)
    lines.append(
        f"attention's top {k} and occlusion's top {k} share {shared} token(s); Kendall tau(attention, "
        f"|occlusion|) over the {len(words)} {'patches' if adapter.modality == 'image' else 'word tokens'} = {tau:.2f}"
    )
    return lines
