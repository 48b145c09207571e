"""``streetlamp explain TEXT --rows ... [--layers ...] [--heads ...]``: long inputs in bounded memory.

One forward pass with chunked attention (:mod:`streetlamp.models.chunked`) writes the kept rows
(``attention/*.safetensors`` shards) and every layer's queries and keys (``qk/``) straight into the
run folder's staging copy; then every asked method gives the explained row through its long-input
implementation (``long_input``, :mod:`streetlamp.methods.long_input`): rollout and flow recomputed from q/k,
attention x gradient from the same pass, occlusion by spans. The methods are found by registry query. The
manifest's ``long_context`` section says exactly which layers, heads and rows were kept.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors import safe_open

from ...errors import StreetlampError
from ...methods.attention_grad import long_row
from ...methods.base import Method
from ...methods.long_input import LongInput
from ...methods.registry import REGISTRY, get_method, long_methods
from ...models.adapter import Inputs, ModelAdapter, Target
from ...models.chunked import QKStore, Recorder, Selection, record_long
from ...readings import ATTENTION_FAMILY, attention_sink, sink_line
from ...specs import parse_indices, parse_rows  # the user-string parsers, in one low module
from ...store.files import folder_file
from ...store.run_folder import RunFolder
from ..base import Lines

if TYPE_CHECKING:
    from . import ExplainSettings, RowSettings


def check_methods(methods: list[str] | None) -> list[str]:
    """The asked methods (default: the first long-input one, rollout), each with a long-input implementation."""
    long = long_methods()
    methods = list(long[:1] if methods is None else methods)
    other = [m for m in methods if m not in long]
    if other:
        raise StreetlampError(
            f"with --rows/--layers/--heads explain records rows in bounded memory and runs only "
            f"{', '.join(long)} (not {', '.join(other)})"
        )
    return methods


def qk_bytes(adapter: ModelAdapter, n_tokens: int) -> int:
    """Disk the stored queries and keys take: per layer ``(heads + kv_heads) x tokens x d_head``."""
    p = next(adapter.hf_model.parameters())
    d_head = int(getattr(adapter.hf_model.config, "head_dim", None) or adapter.d_model // adapter.n_heads)
    return adapter.n_layers * n_tokens * (adapter.n_heads + adapter.n_kv_heads) * d_head * p.element_size()


def record(
    adapter: ModelAdapter,
    inputs: Inputs,
    folder: Path,
    selection: Selection,
    chunk: int | None = None,
    grad_row: int | None = None,
    fused: bool = True,
) -> tuple[torch.Tensor, Recorder]:
    """One forward pass with chunked attention; the explained logits ``[1, n_out]`` and the recorder.
    ``grad_row``: keep the graph from the last layer's attention output on, for
    :meth:`Recorder.attention_x_gradient` of that row (the logits then carry a graph). ``fused=False``:
    every layer's output from the chunked probabilities (the eager arithmetic) instead of SDPA."""
    if len(inputs) != 1:
        raise StreetlampError("long-context recording takes one text")
    rec = Recorder(adapter, folder, selection, chunk, fused)
    if grad_row is not None:
        rec.grad_layer, rec.grad_row = adapter.n_layers - 1, grad_row
    # the pass itself runs without grad (adapter.forward); the recorder switches it on at grad_layer, and
    # the explained logits are picked out after the pass, under this block's mode
    with torch.set_grad_enabled(grad_row is not None), record_long(adapter, rec):
        logits = adapter.forward(inputs).logits
    return logits, rec


def attention_x_gradient_row(
    adapter: ModelAdapter, inputs: Inputs, folder: Path, selection: Selection, target: Target, chunk: int | None = None
) -> tuple[np.ndarray, torch.Tensor, Recorder]:
    """Attention x gradient of the explained row at the last layer, summed over heads (the ``tokens`` of
    :class:`~streetlamp.methods.attention_grad.AttentionXGradient`), in one chunked pass: ``[seq]``,
    with the (detached) explained logits and the recorder."""
    pos = adapter.explained_position(inputs.lengths[0])
    logits, rec = record(adapter, inputs, folder, selection, chunk, grad_row=pos)
    row, _ = long_row(adapter, inputs, target, logits, rec)
    return row, logits.detach(), rec


def read_rows(folder: Path | str, layer: int, rows: list[int], heads: list[int] | None = None) -> np.ndarray:
    """Attention ``[head, len(rows), key]`` of a long recording: from the kept shards when they hold
    the rows, else recomputed from the stored queries and keys."""
    store = QKStore(folder)
    kept = store.section["kept"]
    want_heads = list(range(int(store.section["n_heads"]))) if heads is None else heads
    shards = [s for s in store.section["shards"] if s["layer"] == layer]
    have = {r: (s, i) for s in shards for i, r in enumerate(s["rows"])}
    if shards and all(r in have for r in rows) and set(want_heads) <= set(kept["heads"]):
        out = []
        for r in rows:
            s, i = have[r]
            with safe_open(str(folder_file(folder, s["file"])), framework="pt") as f:
                p = f.get_slice("pattern")[:, i : i + 1]
            out.append(p[[kept["heads"].index(h) for h in want_heads]])
        return torch.cat(out, 1).numpy()
    return store.rows(layer, rows, want_heads).numpy()


@dataclass
class LongResult:
    out: Path
    n_tokens: int
    position: int
    labels: list[str]
    prediction: str
    kept: dict[str, list[int]]
    rows: dict[str, np.ndarray] = field(default_factory=dict)
    disk: int = 0
    sinks: dict[str, dict | None] = field(default_factory=dict)  # readings.attention_sink of each row

    def lines(self) -> list[str]:
        k = self.kept
        out = [
            f"{self.n_tokens} tokens; kept attention rows {_ranges(k['rows'])} of layers {_ranges(k['layers'])}, "
            f"heads {_ranges(k['heads'])}; queries and keys of every layer stored ({self.disk / (1 << 20):.1f} MiB)",
            f"prediction: {self.prediction!r}; explained position {self.position} ({self.labels[self.position]!r})",
        ]
        for name, row in self.rows.items():
            top = np.argsort(-row)[:3]
            out.append(
                f"{name} row {self.position}, top: " + ", ".join(f"{self.labels[j]!r}@{j} {row[j]:.3f}" for j in top)
            )
            sink = self.sinks.get(name)
            if sink:
                out.append(sink_line(f"{name} row {self.position}", sink))
        out.append(f"output: {self.out}/ (manifest.json, attention/ shards, qk/, arrays.safetensors)")
        return out


def long_sink(method: str, row: np.ndarray, labels: list[str], pos: int, causal: bool) -> dict | None:
    """The attention sink of an attention-derived row (rollout, flow) over the keys ``pos`` may read."""
    cls = REGISTRY.get(method)
    if cls is None or cls.family != ATTENTION_FAMILY:
        return None
    return attention_sink(row, labels, range(pos + 1) if causal else None)


def _ranges(xs: list[int]) -> str:
    parts, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[i]) if i == j else f"{xs[i]}..{xs[j]}")
        i = j + 1
    return ",".join(parts)


def explain_long(
    adapter: ModelAdapter,
    s: ExplainSettings,
    out: RunFolder | Path,
    *,
    fusion: str = "mean",
    chunk: int | None = None,
) -> LongResult:
    """Record the rows ``s.rows`` / ``s.layers`` / ``s.heads`` ask for, store q/k, and give each asked method's
    explained row through its long-input implementation (span occlusion: ``s.occlusion_window`` tokens a span,
    default n/32); the settings checked before (``check``/``validate``). ``fusion``/``chunk``: rollout's head
    fusion and the attention chunk (library knobs, no flags)."""
    rf = RunFolder.of(out, "explain")
    text, layers, heads, rows, truncate = s.text, s.layers, s.heads, s.rows, s.truncate
    occlusion_window = s.occlusion_window
    occlusion_replacement = s.method_params.get("occlusion", {}).get("replacement", "mask")
    target = s.explained_target(adapter)
    methods = check_methods(s.methods)  # the default: the first long-input method
    inputs = adapter.encode(text, truncate=truncate)
    n = inputs.lengths[0]
    pos = adapter.explained_position(n)
    sel = Selection(
        parse_indices(layers, adapter.n_layers, "--layers", "layer"),
        parse_indices(heads, adapter.n_heads, "--heads", "head"),
        parse_rows(rows, n, pos),
    )
    params = {
        "rollout": {"fusion": fusion},
        "flow": {"fusion": fusion},
        "occlusion": {"replacement": occlusion_replacement},
    }
    built: dict[str, Method] = {m: get_method(m, **params.get(m, {})) for m in methods}
    long = LongInput(adapter, inputs, target, pos, chunk=chunk, window=occlusion_window)
    for m in built.values():
        m.check_long(long)
    need = qk_bytes(adapter, n) + len(sel.layers) * len(sel.heads) * len(sel.rows) * n * 4
    rf.out.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(rf.out.parent).free
    if need > free:
        raise StreetlampError(
            f"the recording needs {need / (1 << 30):.2f} GiB on disk, {free / (1 << 30):.2f} GiB free"
        )
    with rf.staging() as w:
        graph = any(m.long_needs_graph for m in built.values())  # the same single pass, with the last layer's graph
        logits, rec = record(adapter, inputs, w.path, sel, chunk, grad_row=pos if graph else None)
        section = rec.describe()
        # rollout and flow recompute the rows where the model runs (a GPU: not the CPU; issue 35 item 9)
        long.store, long.recorder, long.logits = QKStore(w.path, section, adapter.device), rec, logits
        logits = logits.detach()
        index = int(adapter.resolve(inputs, target, logits)[0])
        probs = torch.softmax(logits[0].float(), -1).cpu().numpy()
        res = LongResult(rf.out, n, pos, inputs.labels[0], adapter.output_label(int(probs.argmax())), section["kept"])
        res.disk = need
        meaning, extra, more = {}, {}, {}
        for name, m in built.items():
            row = m.attribute_long(long)
            res.rows[name], meaning[name] = row.tokens, row.meaning
            extra.update(row.arrays)
            more.update(row.parameters)
        long.logits = None  # the graph is no longer needed
        w.add_array("probs", probs, axes=["output"], meaning="softmax of the explained logits")
        for name, tokens in res.rows.items():
            sink = long_sink(name, tokens, inputs.labels[0], pos, adapter.kind.causal)
            note: dict[str, Any] = {"attention_sink": sink} if sink else {}
            w.add_array(f"{name}.tokens", tokens.astype(np.float32), axes=["token"], meaning=meaning[name], **note)
            res.sinks[name] = sink
        for name, (arr, axes, what, fields) in extra.items():
            w.add_array(name, arr, axes=axes, meaning=what, **fields)
        w.write_manifest(
            {
                "model": adapter.describe(),
                "text": text,
                "tokens": inputs.tokens[0],
                "token_labels": inputs.labels[0],
                "truncated": inputs.truncated[0],
                "explained_position": {"index": pos, "token": inputs.labels[0][pos]},
                "target": {"index": index, "label": adapter.output_label(index), "quantity": target.quantity},
                "prediction": {"index": int(probs.argmax()), "prob": float(probs.max())},
                "parameters": {
                    "layers": layers,
                    "heads": heads,
                    "rows": rows,
                    "methods": methods,
                    "fusion": fusion,
                    **more,
                },
                "long_context": section,
            }
        )
    return res


def run_row(adapter: None, s: RowSettings, out: None, options: Any = None) -> Lines:
    """``streetlamp attention-row``: one row (or column) as tab-separated text, one line per position."""
    print_row(Path(s.dir), s.layer, s.row, s.heads, s.column)  # prints as it reads
    return Lines()


def print_row(folder: Path, layer: int, row: str, heads: str | None, column: bool = False) -> int:
    """One row (or column) of the recording in ``folder``, printed as tab-separated text."""
    import json

    store = QKStore(folder)
    manifest = json.loads(Path(str(folder_file(folder, "manifest.json"))).read_text())
    labels = manifest["token_labels"]
    n_layers, n_heads = store.n_layers, int(store.section["n_heads"])
    if not -n_layers <= layer < n_layers:
        raise StreetlampError(f"--layer {layer} out of range: the recording has layers 0..{n_layers - 1}")
    layer %= n_layers
    explained = int(manifest["explained_position"]["index"])
    pos = parse_rows(row, store.n_tokens, explained, "--row")
    if len(pos) != 1:
        raise StreetlampError(f"--row takes one position (got {row!r})")
    hs = parse_indices(heads, n_heads, "--heads", "head")
    if column:
        values = store.column(layer, pos[0])[hs].numpy()  # [head, query]
    else:
        values = read_rows(folder, layer, pos, hs)[:, 0]  # [head, key]
    what = "query" if column else "key"
    print(f"# layer {layer}, {'column (key)' if column else 'row (query)'} {pos[0]} {labels[pos[0]]!r}")
    print("\t".join([what, "token", *(f"head {h}" for h in hs)]))
    for j in range(values.shape[1]):
        print("\t".join([str(j), json.dumps(labels[j], ensure_ascii=False), *(f"{v:.6g}" for v in values[:, j])]))
    return 0
