"""``streetlamp explain TEXT --rows ... [--layers ...] [--heads ...]``: long inputs in bounded memory.

One forward pass with chunked attention (:mod:`streetlamp.models.chunked`) writes the kept rows
(``attention/*.safetensors`` shards) and every layer's queries and keys (``qk/``) straight into the
run folder's staging copy; rollout and flow of the explained row are then recomputed from q/k. The
manifest's ``long_context`` section says exactly which layers, heads and rows were kept.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

from ..errors import StreetlampError
from ..methods.long_occlusion import check_window, occlusion_spans
from ..methods.long_rows import check_flow_size, flow_row, rollout_row
from ..methods.registry import REGISTRY
from ..methods.scorer import REPLACEMENTS
from ..models.adapter import Inputs, ModelAdapter, Target
from ..models.chunked import QKStore, Recorder, Selection, record_long
from ..readings import ATTENTION_FAMILY, attention_sink, sink_line
from ..store.files import folder_file
from ..store.run_folder import RunFolder

LONG_METHODS = ("rollout", "flow", "attention_x_gradient", "occlusion")


def parse_indices(spec: str | None, n: int, flag: str, what: str) -> list[int]:
    """``"0,5,-1"`` or ``"all"``/None -> sorted distinct indices in 0..n-1 (negatives count from the end)."""
    if spec is None or spec == "all":
        return list(range(n))
    out: set[int] = set()
    for part in spec.split(","):
        try:
            i = int(part)
        except ValueError:
            raise StreetlampError(f"{flag} takes comma-separated {what} numbers or 'all' (got {part!r})") from None
        if not -n <= i < n:
            raise StreetlampError(f"{flag} {i} out of range: the model has {what}s 0..{n - 1} (or -1..-{n})")
        out.add(i % n)
    return sorted(out)


def parse_rows(spec: str | None, n: int, explained: int) -> list[int]:
    """``--rows``: comma-separated ``last``, ``explained``, ``N`` (negative from the end) or ``A:B``
    (positions A..B-1) -> sorted distinct query positions; default the explained position."""
    if spec is None:
        return [explained]
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        try:
            if part == "last":
                out.add(n - 1)
            elif part == "explained":
                out.add(explained)
            elif ":" in part:
                a, b = (int(x) if x else d for x, d in zip(part.split(":", 1), (0, n)))
                if not (0 <= a < b <= n):
                    raise StreetlampError(f"--rows {part} out of range: the text has positions 0..{n - 1}")
                out.update(range(a, b))
            else:
                i = int(part)
                if not -n <= i < n:
                    raise StreetlampError(f"--rows {i} out of range: the text has positions 0..{n - 1}")
                out.add(i % n)
        except ValueError:
            raise StreetlampError(f"--rows takes last, explained, N or A:B, comma-separated (got {part!r})") from None
    return sorted(out)


def check_methods(methods: list[str] | None) -> list[str]:
    methods = list(LONG_METHODS[:1] if methods is None else methods)
    other = [m for m in methods if m not in LONG_METHODS]
    if other:
        raise StreetlampError(
            f"with --rows/--layers/--heads explain records rows in bounded memory and runs only "
            f"{', '.join(LONG_METHODS)} (not {', '.join(other)})"
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
    index = adapter.resolve(inputs, target, logits.detach())
    with torch.enable_grad():
        f = adapter.score(logits, index.to(logits.device), target).sum()
        axg = rec.attention_x_gradient(f)
    return axg.sum(0).double().cpu().numpy(), logits.detach(), rec


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
    text: str,
    out: RunFolder | Path,
    *,
    layers: str | None = None,
    heads: str | None = None,
    rows: str | None = None,
    methods: list[str] | None = None,
    target: Target = Target(),
    truncate: bool = False,
    fusion: str = "mean",
    chunk: int | None = None,
    overwrite: bool = False,
    occlusion_window: int | None = None,
    occlusion_replacement: str = "mask",
) -> LongResult:
    """Record the asked rows, store q/k, compute rollout/flow/attention x gradient of the explained row and
    span occlusion (``occlusion_window`` tokens a span; default n/32); all checked first."""
    rf = RunFolder.of(out, "explain", overwrite)
    methods = check_methods(methods)
    inputs = adapter.encode(text, truncate=truncate)
    n = inputs.lengths[0]
    pos = adapter.explained_position(n)
    sel = Selection(
        parse_indices(layers, adapter.n_layers, "--layers", "layer"),
        parse_indices(heads, adapter.n_heads, "--heads", "head"),
        parse_rows(rows, n, pos),
    )
    if "flow" in methods:
        check_flow_size(adapter.n_layers, n)
    if "occlusion" in methods:
        window = check_window(occlusion_window, n)
        if occlusion_replacement not in REPLACEMENTS:
            raise StreetlampError(
                f"unknown occlusion replacement {occlusion_replacement!r}; choose one of {', '.join(REPLACEMENTS)}"
            )
    elif occlusion_window is not None:
        raise StreetlampError("--occlusion-window applies to --methods occlusion")
    need = qk_bytes(adapter, n) + len(sel.layers) * len(sel.heads) * len(sel.rows) * n * 4
    rf.out.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(rf.out.parent).free
    if need > free:
        raise StreetlampError(
            f"the recording needs {need / (1 << 30):.2f} GiB on disk, {free / (1 << 30):.2f} GiB free"
        )
    with rf.staging() as w:
        if "attention_x_gradient" in methods:  # the same single pass, with the last layer's graph
            axg, logits, rec = attention_x_gradient_row(adapter, inputs, w.path, sel, target, chunk)
        else:
            logits, rec = record(adapter, inputs, w.path, sel, chunk)
        index = int(adapter.resolve(inputs, target, logits)[0])
        probs = torch.softmax(logits[0].float(), -1).cpu().numpy()
        section = rec.describe()
        store = QKStore(w.path, section)
        res = LongResult(rf.out, n, pos, inputs.labels[0], adapter.output_label(int(probs.argmax())), section["kept"])
        res.disk = need
        meaning = {}
        occ = None
        for m in methods:
            if m == "occlusion":
                occ = occlusion_spans(adapter, inputs, target, window, occlusion_replacement)
                res.rows[m] = occ.tokens
                meaning[m] = (
                    f"F(x) - F(x without the token's span of {window} tokens) (F = {target.describe(adapter, occ.index)}); "
                    f"absent tokens: {occ.replacement}"
                    + (f"; {occ.rule}" if occ.rule else "")
                    + "; 0 where a token is never removed (special tokens"
                    + (", the explained position)" if occ.rule else ")")
                )
            elif m == "attention_x_gradient":
                res.rows[m] = axg
                meaning[m] = (
                    f"sum over heads of the last layer's row {pos} of A ⊙ dF/dA, dF/dA[h, {pos}, j] = dF/dz[{pos}, h] · v[h, j] "
                    f"(F = {target.describe(adapter, index)})"
                )
            else:
                res.rows[m] = (rollout_row if m == "rollout" else flow_row)(store, pos, fusion, chunk)
                meaning[m] = (
                    f"{m} row of position {pos}: Â_l = 0.5·{fusion}_h A[l] + 0.5·I (rows renormalised), "
                    "recomputed from the stored queries and keys chunk by chunk"
                )
        w.add_array("probs", probs, axes=["output"], meaning="softmax of the explained logits")
        for m, row in res.rows.items():
            sink = long_sink(m, row, inputs.labels[0], pos, adapter.kind == "causal_lm")
            note: dict[str, Any] = {"attention_sink": sink} if sink else {}
            w.add_array(f"{m}.tokens", row.astype(np.float32), axes=["token"], meaning=meaning[m], **note)
            res.sinks[m] = sink
        if occ is not None:
            w.add_array(
                "occlusion.spans", occ.spans, axes=["span", "start_end"], meaning="span k covers positions start..end-1"
            )
            w.add_array(
                "occlusion.drop",
                occ.drop,
                axes=["span"],
                meaning="F(x) - F(x without span k) (float64)",
                base_score=occ.base,
                positions_computed=occ.positions_computed,
            )
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
                    **(
                        {"occlusion_window": occ.window, "occlusion_replacement": occ.replacement}
                        if occ is not None
                        else {}
                    ),
                },
                "long_context": section,
            }
        )
    return res


def print_row(folder: Path, layer: int, row: str, heads: str | None, column: bool = False) -> int:
    """``streetlamp attention-row``: one row (or column) as tab-separated text, one line per position."""
    import json

    store = QKStore(folder)
    manifest = json.loads(Path(str(folder_file(folder, "manifest.json"))).read_text())
    labels = manifest["token_labels"]
    n_layers, n_heads = store.n_layers, int(store.section["n_heads"])
    if not -n_layers <= layer < n_layers:
        raise StreetlampError(f"--layer {layer} out of range: the recording has layers 0..{n_layers - 1}")
    layer %= n_layers
    explained = int(manifest["explained_position"]["index"])
    pos = parse_rows(row, store.n_tokens, explained)
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
