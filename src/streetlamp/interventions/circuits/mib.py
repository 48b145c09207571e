"""MIB's task files and circuit files (issue 37 item 2), read and written here without the hub.

**Task files.** MIB's circuit track reads its tasks from the hub (``mib-bench/<task>``) with
``MIB_circuit_track/dataset.py`` (``HFEAPDataset``); a user who downloaded a split gives the file here
(JSON lines, a JSON list of rows, or Parquet). Per row, as ``dataset.py`` reads it:

* ``ioi``: ``prompt``; the corrupted prompt ``row[cf]["prompt"]`` (``cf`` = ``s2_io_flip_counterfactual``);
  answer ``" " + metadata.indirect_object``, wrong ``" " + metadata.subject``. Kept (MIB's filter): rows
  whose indirect object, subject and ``metadata.random_c`` have the same token length.
* ``mcqa`` / ``arc-easy`` / ``arc-challenge``: ``prompt``; answer ``choices.label[answerKey]`` (no leading
  space); the corrupted prompt and the wrong answer from ``row[cf]`` (``cf`` = ``symbol_counterfactual``)
  the same way. Kept: rows whose answer and wrong answer have the same token length.
* ``arithmetic-addition`` / ``arithmetic-subtraction``: ``prompt``, answer ``str(label)``, the corrupted
  prompt and wrong answer from ``random_counterfactual``. Kept: rows with ``operator`` ``+`` (``-``) and both
  labels one token.

MIB takes the first token of a longer answer; streetlamp refuses an answer that is not one token
(:func:`.tasks.encode_pairs`), so a file MIB's filter keeps but whose answers are several tokens is refused
in one line, not silently cut. A missing field is refused in one line naming it.

**Circuit files** in the format ``MIB_circuit_track/circuit_loading.py`` loads (``Graph.to_json`` of the
EAP-IG code): ``cfg`` (``n_layers``, ``n_heads``, ``parallel_attn_mlp``, ``d_model``), ``nodes``
``{name: {in_graph}}`` and ``edges`` ``{"a0.h1->a2.h0<q>": {score, in_graph}}`` with nodes ``input``,
``a{l}.h{h}``, ``m{l}``, ``logits``. MIB's graph ungroups grouped-query attention: a key/value group's
edge is written under each of its query heads (same score, same membership) and read back as the mean of
its heads' scores. MIB's scores have the opposite sign to streetlamp's (its attribution metric is the loss
``-m``): :func:`write_circuit` writes ``-score`` and :func:`read_circuit` negates back, so a circuit
written here ranks the same in MIB's ``apply_topn(absolute=False)`` as in :func:`.faithfulness.top_k`
with ``signed=True``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...errors import StreetlampError
from .graph import Graph
from .tasks import TaskPair

MIB_TASKS = {  # task -> the counterfactual column dataset.py reads by default
    "ioi": "s2_io_flip_counterfactual",
    "mcqa": "symbol_counterfactual",
    "arc-easy": "symbol_counterfactual",
    "arc-challenge": "symbol_counterfactual",
    "arithmetic-addition": "random_counterfactual",
    "arithmetic-subtraction": "random_counterfactual",
}


# -- task files ------------------------------------------------------------------------------------------
def read_rows(path: str | Path) -> list[dict]:
    """The rows of a downloaded MIB split: ``.jsonl`` (one JSON object a line), ``.json`` (a list of rows, or
    ``{"rows": [...]}``) or ``.parquet``."""
    p = Path(path)
    if not p.is_file():
        raise StreetlampError(f"MIB task file {p} does not exist")
    suf = p.suffix.lower()
    try:
        if suf == ".jsonl":
            return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
        if suf == ".json":
            d = json.loads(p.read_text(encoding="utf-8"))
            rows = d.get("rows", d) if isinstance(d, dict) else d
            if not isinstance(rows, list):
                raise StreetlampError(f"{p}: a JSON MIB task file is a list of rows")
            return [r.get("row", r) if isinstance(r, dict) else r for r in rows]
        if suf == ".parquet":
            import pandas as pd

            return [_plain(r) for r in pd.read_parquet(p).to_dict("records")]
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise StreetlampError(f"cannot read MIB task file {p}: {str(e).splitlines()[0]}") from None
    raise StreetlampError(f"MIB task file {p}: give .jsonl, .json or .parquet (the rows MIB's dataset.py reads)")


def _plain(v: Any) -> Any:
    """Parquet's nested values as JSON's: arrays as lists, structs as dicts."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, np.ndarray):
        return [_plain(x) for x in v.tolist()]
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v


def _get(row: Any, path: str, where: str) -> Any:
    cur = row
    for part in path.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.lstrip("-").isdigit() and -len(cur) <= int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise StreetlampError(f"{where}: no field {path!r} (MIB's dataset.py reads it)")
    if cur is None:
        raise StreetlampError(f"{where}: field {path!r} is empty")
    return cur


def _label(row: Any, base: str, where: str) -> str:
    pre = f"{base}." if base else ""
    key = _get(row, f"{pre}answerKey", where)
    labels = _get(row, f"{pre}choices.label", where)
    try:
        return str(labels[int(key)])
    except (ValueError, TypeError, IndexError):
        raise StreetlampError(f"{where}: answerKey {key!r} is not an index into choices.label") from None


def mib_pairs(
    rows: list[dict], task: str, name: str = "MIB file", n_tokens: Callable[[str], int] | None = None
) -> tuple[list[TaskPair], int]:
    """(pairs, rows dropped by MIB's filter) of ``rows`` of MIB task ``task``; ``n_tokens`` (a string's
    token count, no special tokens) applies MIB's token-length filter, else only the fields are checked
    (and arithmetic's operator filter applied)."""
    if task not in MIB_TASKS:
        raise StreetlampError(f"unknown MIB task {task!r}; choose from {', '.join(MIB_TASKS)}")
    if not rows:
        raise StreetlampError(f"{name}: no rows")
    cf = MIB_TASKS[task]
    out: list[TaskPair] = []
    dropped = 0
    for i, row in enumerate(rows):
        where = f"{name} row {i + 1}"
        if not isinstance(row, dict):
            raise StreetlampError(f"{where}: not a JSON object")
        clean = str(_get(row, "prompt", where))
        if task == "ioi":
            io, s = str(_get(row, "metadata.indirect_object", where)), str(_get(row, "metadata.subject", where))
            rc = str(_get(row, "metadata.random_c", where))
            corrupt = str(_get(row, f"{cf}.prompt", where))
            keep = n_tokens is None or n_tokens(f" {io}") == n_tokens(f" {s}") == n_tokens(f" {rc}")
            pair = TaskPair(clean, corrupt, f" {io}", f" {s}")
        elif task.startswith("arithmetic"):
            op = "-" if task.endswith("subtraction") else "+"
            label, wrong = str(_get(row, "label", where)), str(_get(row, f"{cf}.label", where))
            corrupt = str(_get(row, f"{cf}.prompt", where))
            keep = str(_get(row, "operator", where)) == op
            keep = keep and (n_tokens is None or n_tokens(label) == 1 == n_tokens(wrong))
            pair = TaskPair(clean, corrupt, label, wrong)
        else:
            ans, wrong = _label(row, "", where), _label(row, cf, where)
            corrupt = str(_get(row, f"{cf}.prompt", where))
            keep = n_tokens is None or n_tokens(ans) == n_tokens(wrong)
            pair = TaskPair(clean, corrupt, ans, wrong)
        if keep:
            out.append(pair)
        else:
            dropped += 1
    if not out:
        raise StreetlampError(f"{name}: MIB's filter for {task} keeps none of its {len(rows)} rows")
    return out, dropped


def read_task(path: str | Path, task: str, n_tokens: Callable[[str], int] | None = None) -> tuple[list[TaskPair], int]:
    return mib_pairs(read_rows(path), task, str(path), n_tokens)


# -- circuit files ---------------------------------------------------------------------------------------
def node_name(node: str) -> str:
    """streetlamp's node name as MIB's: ``embed`` -> ``input``, ``L3.H2`` -> ``a3.h2``, ``L3.MLP`` -> ``m3``;
    expert nodes (no MIB name exists: streetlamp's extension) ``L3.E1`` -> ``m3.e1``, ``L3.SE`` -> ``m3.se``,
    the router's input ``L3.router`` -> ``m3.router``."""
    if node in ("embed", "logits"):
        return "input" if node == "embed" else "logits"
    layer, rest = node.split(".")
    if rest == "MLP":
        return f"m{layer[1:]}"
    if rest in ("SE", "router") or rest.startswith("E"):
        return f"m{layer[1:]}.{rest.lower()}"
    return f"a{layer[1:]}.h{rest[1:]}"


def edge_names(graph: Graph) -> list[list[str]]:
    """MIB's names of each edge of :meth:`Graph.edge_index` (a grouped k/v edge: one name per query head)."""
    out = []
    for i, j in zip(*graph.edge_index()):
        rd = graph.readers[i]
        src = node_name(graph.writers[j])
        if rd.input in ("q", "k", "v"):
            out.append([f"{src}->{node_name(graph.writers[o])}<{rd.input}>" for o in rd.owners])
        else:
            out.append([f"{src}->{node_name(rd.node)}"])
    return out


def circuit_json(graph: Graph, scores: torch.Tensor, mask: torch.Tensor, d_model: int) -> dict:
    """The circuit ``mask`` (``[R, U]`` bool) with ``scores`` (streetlamp's sign) as MIB's JSON dict."""
    s = scores.detach().double().cpu().numpy()
    m = mask.cpu().numpy()
    edges: dict[str, dict] = {}
    used = {"input", "logits"}
    for (i, j), names in zip(zip(*graph.edge_index()), edge_names(graph)):
        v, on = s[i, j], bool(m[i, j])
        for n in names:
            edges[n] = {"score": -float(v) if np.isfinite(v) else 0.0, "in_graph": on}
            if on:
                a, b = n.split("->")
                used |= {a, b.split("<")[0]}
    nodes = {node_name(w): {"in_graph": node_name(w) in used} for w in graph.writers}
    nodes["logits"] = {"in_graph": True}
    cfg = {"n_layers": graph.n_layers, "n_heads": graph.n_heads, "parallel_attn_mlp": False, "d_model": d_model}
    return {"cfg": cfg, "nodes": nodes, "edges": edges}


def read_circuit(path: str | Path, graph: Graph, d_model: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores ``[R, U]`` in streetlamp's sign, NaN off the graph; membership ``[R, U]`` bool) of a MIB JSON
    circuit file for this graph's model: refused in one line when it is for another model (layers, heads or
    width differ) or lacks MIB's keys or an edge."""
    p = Path(path)
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StreetlampError(f"circuit file {p} does not exist") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise StreetlampError(f"cannot read circuit file {p}: {str(e).splitlines()[0]}") from None
    if not isinstance(d, dict) or not {"cfg", "nodes", "edges"} <= set(d):
        raise StreetlampError(f"circuit file {p} is not in MIB's format: it needs the keys cfg, nodes and edges")
    cfg = d["cfg"] if isinstance(d["cfg"], dict) else {}
    want = {"n_layers": graph.n_layers, "n_heads": graph.n_heads}
    if d_model is not None:
        want["d_model"] = d_model
    bad = {k: cfg.get(k) for k, v in want.items() if cfg.get(k) != v}
    if bad:
        got = ", ".join(f"{k} {cfg.get(k)}" for k in want)
        mine = ", ".join(f"{k} {v}" for k, v in want.items())
        raise StreetlampError(f"circuit file {p} is for another model ({got}); this model has {mine}")
    if cfg.get("parallel_attn_mlp"):
        raise StreetlampError(f"circuit file {p} is for a model with parallel attention and MLP; this one is not")
    edges = d["edges"]
    scores = torch.full((graph.n_readers, graph.n_writers), float("nan"), dtype=torch.float64)
    member = torch.zeros(graph.n_readers, graph.n_writers, dtype=torch.bool)
    for (i, j), names in zip(zip(*graph.edge_index()), edge_names(graph)):
        vals = []
        for n in names:
            row = edges.get(n)
            if not isinstance(row, dict) or "score" not in row:
                raise StreetlampError(f"circuit file {p} has no edge {n!r} with a score (MIB's edge names)")
            vals.append(float(row["score"]))
            member[i, j] |= bool(row.get("in_graph", False))
        scores[i, j] = -float(np.mean(vals))
    return scores, member
