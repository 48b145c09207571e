"""The live computations behind ``streetlamp serve``, as plain library calls (no web code here).

Each call returns a :class:`Live`: the JSON the page renders (``payload``) and ``save(folder)``, which
writes the result as a run folder that ``streetlamp report`` opens like any other.

* :func:`explain_text`: the explain view of a text (attention recording plus the chosen methods,
  occlusion by default), as the same manifest and packed arrays a run folder's report embeds.
* :func:`edit_tokens`: remove or replace tokens, each edit on top of the previous ones (positions count the
  tokens the earlier edits left); the prediction, the explained output's probability after each edit and
  every layer's attention for the edited input, and per layer the cosine distance ``1 - cos(h, h')`` between
  the original text's and the edited text's hidden states (``layers.0.resid_pre``, then
  ``layers.{l}.resid_post``) at the explained position and at the last edited token, beside the attention the
  explained position paid that token in the original. :func:`edit_token` is one edit.
* :func:`ablate_heads`: zero or mean ablation of one or several heads at ``layers.{l}.attn.z`` with the
  intervention engine, exactly as ``streetlamp heads`` does per head (same strategies, same reference
  texts for the mean), beside each head's attention mass.
* :func:`minimal_pair`: two texts: the explain view of each, their outputs and the difference, and where
  they have the same number of tokens, the difference of their attention per layer and head.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from ...errors import StreetlampError
from ...interventions import engine
from ...interventions.heads import attention_mass, reference_strategies
from ...methods.attention import record_attention
from ...methods.registry import REGISTRY
from ...methods.scorer import occlusion_replacement
from ...models.adapter import Inputs, ModelAdapter, Target
from ...store.run_folder import RunFolder, RunWriter
from ..explain import run as ex

Stage = Callable[[str], None]
DEFAULT_METHODS = ("occlusion",)
MAX_HEADS_PER_CALL = 64


@dataclass
class Live:
    """One live result: what the page shows, and how to keep it as a run folder."""

    kind: str
    payload: dict[str, Any]
    save: Callable[[Path], None]


def _noop(_: str) -> None:
    return None


# -- inputs ---------------------------------------------------------------------------------------
def check_text(text: Any, what: str = "the text") -> str:
    if not isinstance(text, str):
        raise StreetlampError(f"{what} must be a string")
    if not text.strip():
        raise StreetlampError(f"{what} is empty: type at least one non-space character")
    return text


def encode(adapter: ModelAdapter, text: Any, truncate: bool = False, what: str = "the text") -> Inputs:
    """The text as model inputs, with the model's position limit said in words the page can show."""
    text = check_text(text, what)
    n = len(adapter.tokenizer(text, truncation=False)["input_ids"])
    if n > adapter.max_positions and not truncate:
        raise StreetlampError(
            f"{what} has {n} tokens but {adapter.name} takes at most {adapter.max_positions}: "
            "shorten it or tick 'truncate'"
        )
    if not adapter.tokenizer(text, add_special_tokens=False)["input_ids"]:
        raise StreetlampError(f"{what} gives no token at all for {adapter.name}'s tokenizer (only control characters?)")
    return adapter.encode(text, truncate=truncate)


def check_methods(methods: Any) -> list[str]:
    if methods is None:
        return list(DEFAULT_METHODS)
    if not isinstance(methods, list) or not all(isinstance(m, str) for m in methods):
        raise StreetlampError("methods must be a list of method names")
    unknown = [m for m in methods if m not in REGISTRY]
    if unknown:
        raise StreetlampError(f"unknown method(s) {', '.join(map(repr, unknown[:5]))}; see `streetlamp methods`")
    return list(dict.fromkeys(methods))


def replacement_menu(adapter: ModelAdapter) -> list[dict]:
    """Replacement tokens offered in the page: occlusion's own first, then the other special tokens."""
    used, tid, tok = occlusion_replacement(adapter, "mask")
    out, seen = [], set()
    if tid is not None:
        out.append({"token": tok, "id": tid, "why": f"occlusion's replacement ({used})"})
        seen.add(tid)
    t = adapter.tokenizer
    for kind in ("mask", "unk", "pad", "eos", "bos"):
        i = getattr(t, f"{kind}_token_id", None)
        if i is not None and int(i) not in seen:
            out.append({"token": str(getattr(t, f"{kind}_token")), "id": int(i), "why": f"{kind} token"})
            seen.add(int(i))
    return out


def replacement_id(adapter: ModelAdapter, spec: Any) -> int:
    """A vocabulary token (exact token string, e.g. ``[MASK]`` or ``##ing``) or a text that is one token."""
    if not isinstance(spec, str) or not spec:
        raise StreetlampError("the replacement must be a non-empty token")
    t = adapter.tokenizer
    i = t.convert_tokens_to_ids(spec)
    if isinstance(i, int) and (i != t.unk_token_id or spec == t.unk_token):
        return int(i)
    ids = t(spec, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise StreetlampError(
            f"the replacement {spec!r} is {len(ids)} tokens for {adapter.name}'s tokenizer; give one token"
        )
    return int(ids[0])


# -- the explain view -----------------------------------------------------------------------------
def _write_explain(
    adapter: ModelAdapter,
    res: ex.ExplainResult,
    w: RunWriter,
    target: Target,
    truncated: bool,
    live: dict,
    figures: bool,
) -> None:
    ex.write_outputs(
        adapter, res, w, target, None, None, 0, truncated, truncated, None, figures=figures, extra={"live": live}
    )


def view_payload(adapter: ModelAdapter, res: ex.ExplainResult, target: Target, truncated: bool, live: dict) -> dict:
    """What ``report.html`` embeds for this result (manifest, array index, packed chunks), for the page's
    ``streetlamp.render``: written through the run writer into a temporary folder and read back by the
    report's own loader, so the live view and a saved run cannot differ."""
    from ...report.viewer.folder import load_folder
    from ...report.viewer.palettes import palettes

    with tempfile.TemporaryDirectory(prefix="streetlamp-serve-") as d:
        _write_explain(adapter, res, RunWriter(Path(d), "explain"), target, truncated, live, figures=False)
        model, packed = load_folder(Path(d))
    model["palettes"] = palettes()
    model["built_by"] = "streetlamp serve"
    return {"model": model, "blobs": packed.blobs}


def save_run(folder: Path, command: str, write: Callable[[RunWriter], None]) -> None:
    """Write a run folder with the one run writer (atomic: never half-written), and its report.html."""
    from ..base import write_report_or_warn

    with RunFolder(folder, command).staging() as w:
        write(w)
    write_report_or_warn(Path(folder))  # storage never renders: the report is written after the run


def _prediction(adapter: ModelAdapter, probs: np.ndarray, index: int) -> dict:
    p = int(np.argmax(probs))
    return {
        "index": p,
        "label": adapter.output_label(p),
        "prob": float(probs[p]),
        "explained": {"index": int(index), "label": adapter.output_label(int(index)), "prob": float(probs[index])},
    }


def _explain_live(
    adapter: ModelAdapter, res: ex.ExplainResult, target: Target, truncated: bool, live: dict, extra: dict | None = None
) -> Live:
    payload = {
        "kind": live["kind"],
        "view": view_payload(adapter, res, target, truncated, live),
        "prediction": _prediction(adapter, res.probs, res.target_index),
        "summary": ex.summarise(adapter, res),
        **(extra or {}),
    }

    def save(folder: Path) -> None:
        # no PNGs: the report draws the explain view from the arrays, and matplotlib's grid alone takes
        # seconds to tens of seconds (`streetlamp explain` still writes them)
        save_run(folder, "explain", lambda w: _write_explain(adapter, res, w, target, truncated, live, figures=False))

    return Live(live["kind"], payload, save)


def explain_text(
    adapter: ModelAdapter, text: Any, *, truncate: bool = False, methods: Any = None, stage: Stage = _noop
) -> Live:
    methods = check_methods(methods)
    inputs = encode(adapter, text, truncate)
    res = ex.compute(adapter, inputs, Path("live"), methods=methods, stage=stage)
    stage("packing the view")
    return _explain_live(adapter, res, Target(), inputs.truncated[0], {"kind": "explain", "methods": methods})


# -- remove or replace a token --------------------------------------------------------------------
def cosine_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """``1 - cos(a, b)`` in float64."""
    a, b = a.double().flatten(), b.double().flatten()
    den = float(a.norm() * b.norm())
    return float("nan") if den == 0 else 1.0 - float(a @ b) / den


HIDDEN = ["layers.0.resid_pre", "layers.*.resid_post"]  # the input of layer 0, then every layer's output


def _hidden(adapter: ModelAdapter, fwd) -> list[torch.Tensor]:
    return [fwd.cache["layers.0.resid_pre"][0]] + [
        fwd.cache[f"layers.{l}.resid_post"][0] for l in range(adapter.n_layers)
    ]


MAX_EDITS = 64


@dataclass
class Edited:
    """A chain of edits applied to the original ids: the ids after each edit and where each token came from."""

    ids: list[list[int]]  # ids[0] is the original, ids[k] after the k-th edit
    origin: list[int]  # for each token of the last ids, its position in the original
    edits: list[dict[str, Any]]  # each edit as applied: op, position (in the ids before it), token, replacement


def check_edits(edits: Any) -> list[dict[str, Any]]:
    if not isinstance(edits, list) or not edits:
        raise StreetlampError("edits must be a non-empty list of {position, op, replacement?}")
    if len(edits) > MAX_EDITS:
        raise StreetlampError(f"at most {MAX_EDITS} edits in a chain; reset to the original text")
    if not all(isinstance(e, dict) for e in edits):
        raise StreetlampError("each edit must be an object {position, op, replacement?}")
    return edits


def apply_edits(adapter: ModelAdapter, inputs: Inputs, edits: list[dict[str, Any]]) -> Edited:
    """Each edit on top of the previous one; positions count the tokens left by the edits before it."""
    n = inputs.lengths[0]
    ids0 = inputs.input_ids[0, :n].tolist()
    ids, origin, done, chain = list(ids0), list(range(n)), [], [list(ids0)]
    for k, e in enumerate(edits):
        position, op = e.get("position"), e.get("op")
        where = f"edit {k + 1}: " if len(edits) > 1 else ""
        if not isinstance(position, int) or isinstance(position, bool) or not 0 <= position < len(ids):
            raise StreetlampError(f"{where}position must be a token index 0..{len(ids) - 1}")
        if ids0[origin[position]] in adapter.special_ids:
            raise StreetlampError(
                f"{where}position {position} holds the special token "
                f"{inputs.tokens[0][origin[position]]!r}; edit a token of the text"
            )
        label = adapter.token_label(adapter.tokenizer.convert_ids_to_tokens([ids[position]])[0])
        if op == "remove":
            if sum(ids0[o] not in adapter.special_ids for o in origin) == 1:
                raise StreetlampError(f"{where}removing token {position} would leave no token of the text")
            ids, origin, rep = ids[:position] + ids[position + 1 :], origin[:position] + origin[position + 1 :], None
            what = f"token {position} {label!r} removed"
        elif op == "replace":
            rid = replacement_id(adapter, e.get("replacement"))
            ids = ids[:position] + [rid] + ids[position + 1 :]
            rep = adapter.tokenizer.convert_ids_to_tokens([rid])[0]
            what = f"token {position} {label!r} replaced by {rep!r}"
        else:
            raise StreetlampError(f"{where}op must be 'remove' or 'replace'")
        done.append({"op": op, "position": position, "token": label, "replacement": rep, "description": what})
        chain.append(list(ids))
    return Edited(chain, origin, done)


def edit_tokens(
    adapter: ModelAdapter,
    text: Any,
    edits: Any,
    *,
    truncate: bool = False,
    methods: Any = None,
    stage: Stage = _noop,
) -> Live:
    """Remove or replace tokens, each edit on top of the previous ones; every comparison is against the
    original text (its prediction, its hidden states, the attention it paid the last edited token)."""
    methods = check_methods(methods)
    inputs = encode(adapter, text, truncate)
    n = inputs.lengths[0]
    ed = apply_edits(adapter, inputs, check_edits(edits))
    new, last = ed.ids[-1], ed.edits[-1]
    stage("recording the original")
    with torch.no_grad():
        f0 = adapter.forward(inputs, record=HIDDEN + ["layers.*.attn.pattern"])
    index = int(f0.logits[0].argmax())
    p0 = torch.softmax(f0.logits[0].double(), -1).cpu().numpy()
    att0 = torch.stack([f0.cache[f"layers.{l}.attn.pattern"][0] for l in range(adapter.n_layers)]).double()
    pos0 = adapter.explained_position(n)
    stage(f"running the {len(ed.edits)} edited text(s)")
    steps = Inputs.from_ids(adapter, ed.ids[1:], strings=False)
    with torch.no_grad():
        logits = adapter.forward(steps).logits  # [edits, out] at each row's explained position
    p_steps = torch.softmax(logits.double(), -1).cpu().numpy()
    edited = Inputs.from_ids(adapter, [new], texts=[cast(str, adapter.tokenizer.decode(new, skip_special_tokens=True))])
    with torch.no_grad():
        f1 = adapter.forward(edited, record=HIDDEN)
    pos1 = adapter.explained_position(len(new))
    position = last["position"]  # in the ids before the last edit
    o = _origin(ed, len(ed.edits) - 1)[position]  # the last edited token's position in the original
    h0, h1 = _hidden(adapter, f0), _hidden(adapter, f1)
    rows = []
    for k in range(adapter.n_layers + 1):
        a = att0[k - 1, :, pos0, o] if k > 0 else None
        rows.append(
            {
                "layer": "input" if k == 0 else k - 1,
                "attention_mean": None if a is None else float(a.mean()),
                "attention_max": None if a is None else float(a.max()),
                "attention_max_head": None if a is None else int(a.argmax()),
                "explained_distance": cosine_distance(h0[k][pos0], h1[k][pos1]),
                "token_distance": cosine_distance(h0[k][o], h1[k][position]) if last["op"] == "replace" else None,
            }
        )
    res = ex.compute(adapter, edited, Path("live"), target=Target(index), methods=methods, stage=stage)
    p1 = res.probs.astype(np.float64)
    for e, p in zip(ed.edits, p_steps, strict=True):
        e["after"] = _prediction(adapter, p, index)
    edit = {
        **last,
        "edits": ed.edits,
        "description": "; then ".join(e["description"] for e in ed.edits),
        "original_text": inputs.texts[0],
        "original_position": o,
        "edited_ids": new,
        "origin": ed.origin,
        "explained_position": [pos0, pos1],
        "before": _prediction(adapter, p0, index),
        "after": _prediction(adapter, p1, index),
        "change": float(p1[index] - p0[index]),
        "layers": rows,
        "distance": "1 - cos(h, h') between the original text's hidden state and the edited text's (layer 0's "
        "input, then each layer's output), float64",
        "attention": f"attention of the explained position ({pos0}) on token {o} {inputs.labels[0][o]!r} "
        "in the original text, mean and max over heads",
    }
    stage("packing the view")
    return _explain_live(
        adapter, res, Target(index), False, {"kind": "edit", "methods": methods, "edit": edit}, {"edit": edit}
    )


def _origin(ed: Edited, k: int) -> list[int]:
    """Where each token of ``ed.ids[k]`` came from in the original (replaying the first ``k`` edits)."""
    origin = list(range(len(ed.ids[0])))
    for e in ed.edits[:k]:
        if e["op"] == "remove":
            origin.pop(e["position"])
    return origin


def edit_token(
    adapter: ModelAdapter,
    text: Any,
    position: Any,
    op: Any,
    replacement: Any = None,
    *,
    truncate: bool = False,
    methods: Any = None,
    stage: Stage = _noop,
) -> Live:
    """One edit of the original text (see :func:`edit_tokens`)."""
    edit = {"position": position, "op": op, "replacement": replacement}
    return edit_tokens(adapter, text, [edit], truncate=truncate, methods=methods, stage=stage)


# -- head ablation --------------------------------------------------------------------------------
_REFERENCE: dict[tuple[int, str], dict] = {}


def _strategies(adapter: ModelAdapter, ablation: str) -> dict:
    """Per-layer strategies as ``streetlamp heads TEXT`` builds them (mean: its built-in reference texts)."""
    if ablation not in ("zero", "mean"):
        raise StreetlampError("ablation must be 'zero' or 'mean'")
    key = (id(adapter), ablation)
    if key not in _REFERENCE:
        from ..heads.run import REFERENCE_TEXTS

        ref = adapter.encode(list(REFERENCE_TEXTS), truncate=True) if ablation == "mean" else None
        with torch.no_grad():
            _REFERENCE[key] = reference_strategies(adapter, ablation, ref)
    return _REFERENCE[key]


def check_heads(adapter: ModelAdapter, heads: Any) -> list[tuple[int, int]]:
    if not isinstance(heads, list) or not heads:
        raise StreetlampError("heads must be a non-empty list of [layer, head] pairs")
    if len(heads) > MAX_HEADS_PER_CALL:
        raise StreetlampError(f"at most {MAX_HEADS_PER_CALL} heads per ablation")
    out = []
    for x in heads:
        if not (isinstance(x, list) and len(x) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in x)):
            raise StreetlampError("each head must be a [layer, head] pair of integers")
        engine.check_layer_head(adapter, x[0], x[1])
        out.append((x[0], x[1]))
    if len(set(out)) != len(out):
        raise StreetlampError("a head is listed twice")
    return out


def ablation_outputs(
    adapter: ModelAdapter, inputs: Inputs, heads: Sequence[tuple[int, int]], ablation: str
) -> tuple[np.ndarray, np.ndarray]:
    """``(clean probs [out], ablated probs [len(heads) + 1, out])``: each head alone, then all together."""
    strategies = _strategies(adapter, ablation)
    k = len(heads)
    sub = engine.repeat_inputs(inputs, k + 1)
    ivs = [engine.Intervention(f"layers.{l}.attn.z", strategies[l], head=h, rows=[i]) for i, (l, h) in enumerate(heads)]
    ivs += [engine.Intervention(f"layers.{l}.attn.z", strategies[l], head=h, rows=[k]) for l, h in heads]
    with torch.no_grad():
        clean = adapter.forward(inputs).logits
        logits = engine.run(adapter, sub, ivs).logits
    return (torch.softmax(clean[0].double(), -1).cpu().numpy(), torch.softmax(logits.double(), -1).cpu().numpy())


def ablate_heads(
    adapter: ModelAdapter,
    text: Any,
    heads: Any,
    ablation: Any = "zero",
    *,
    truncate: bool = False,
    stage: Stage = _noop,
) -> Live:
    inputs = encode(adapter, text, truncate)
    hs = check_heads(adapter, heads)
    stage(f"{ablation} ablation of {len(hs)} head(s)")
    p0, p = ablation_outputs(adapter, inputs, hs, str(ablation))
    index = int(np.argmax(p0))
    with torch.no_grad():
        mass, peak = attention_mass(adapter, inputs)
    rows: list[dict[str, Any]] = [
        {
            "layer": l,
            "head": h,
            "attention_mass": float(mass[0, l, h]),
            "attention_max": float(peak[0, l, h]),
            "prob": float(p[i, index]),
            "effect": float(p[i, index] - p0[index]),
            "prediction": adapter.output_label(int(np.argmax(p[i]))),
        }
        for i, (l, h) in enumerate(hs)
    ]
    joint = {
        "prob": float(p[-1, index]),
        "effect": float(p[-1, index] - p0[index]),
        "prediction": _prediction(adapter, p[-1], index),
    }
    out = {
        "kind": "ablate",
        "ablation": ablation,
        "text": inputs.texts[0],
        "heads": rows,
        "joint": joint,
        "clean": _prediction(adapter, p0, index),
        "effect": f"p({adapter.output_label(index)!r}) with the head(s) {ablation}-ablated at attn.z minus clean "
        "(as `streetlamp heads`)",
        "attention_mass": "attention of the explained position on content tokens (as `streetlamp heads`)",
    }

    def save(w: RunWriter) -> None:
        L, H = adapter.n_layers, adapter.n_heads
        grid = np.full((L, H), np.nan, np.float32)
        for r in rows:
            grid[r["layer"], r["head"]] = r["effect"]
        arrays = {
            "effect": grid,
            "attention_mass": mass[0].astype(np.float32),
            "attention_max": peak[0].astype(np.float32),
            "probs_clean": p0.astype(np.float32),
            "probs_ablated": p.astype(np.float32),
        }
        described = {
            "effect": {"axes": ["layer", "head"], "meaning": out["effect"] + "; NaN: head not ablated alone"},
            "attention_mass": {"axes": ["layer", "head"], "meaning": out["attention_mass"]},
            "attention_max": {
                "axes": ["layer", "head"],
                "meaning": "largest attention weight of the explained position",
            },
            "probs_clean": {"axes": ["output"], "meaning": "output distribution, clean"},
            "probs_ablated": {
                "axes": ["row (each head alone, then all together)", "output"],
                "meaning": "output distribution with the head(s) ablated",
            },
        }
        table = {
            "title": f"{ablation} ablation: output change beside attention mass",
            "columns": ["layer", "head", "attention mass", "attention max", "p ablated", "change"],
            "rows": [
                [r["layer"], r["head"], r["attention_mass"], r["attention_max"], r["prob"], r["effect"]] for r in rows
            ]
            + [["all", len(rows), None, None, joint["prob"], joint["effect"]]],
        }
        _write_plain(adapter, w, arrays, described, {"live": out, "tables": [table]})

    return Live("ablate", out, lambda folder: save_run(folder, "serve-ablate", save))


def _write_plain(adapter: ModelAdapter, w: RunWriter, arrays: dict, described: dict, extra: dict) -> None:
    w.add_arrays(arrays, described)
    w.write_manifest({"model": adapter.describe(), **json.loads(json.dumps(extra, default=float))})


# -- minimal pairs --------------------------------------------------------------------------------
TOP_OUTPUTS = 10


def output_rows(adapter: ModelAdapter, pa: np.ndarray, pb: np.ndarray) -> list[dict[str, Any]]:
    """Every output of a classifier, or a causal LM's ``TOP_OUTPUTS`` most probable under either text:
    ``p_a``, ``p_b`` and ``p_b - p_a``, largest ``|difference|`` first."""
    idx = (
        range(len(pa))
        if len(pa) <= TOP_OUTPUTS
        else sorted(set(np.argsort(-pa)[:TOP_OUTPUTS].tolist()) | set(np.argsort(-pb)[:TOP_OUTPUTS].tolist()))
    )
    rows = [
        {
            "index": int(i),
            "label": adapter.output_label(int(i)),
            "p_a": float(pa[i]),
            "p_b": float(pb[i]),
            "diff": float(pb[i] - pa[i]),
        }
        for i in idx
    ]
    return sorted(rows, key=lambda r: (-abs(r["diff"]), r["index"]))


def minimal_pair(
    adapter: ModelAdapter,
    text_a: Any,
    text_b: Any,
    *,
    truncate: bool = False,
    methods: Any = None,
    stage: Stage = _noop,
) -> Live:
    """Two texts: the explain view of each (the report's), their outputs and the difference of their outputs,
    and where they have the same number of tokens, the difference of their attention per layer and head."""
    methods = check_methods(methods)
    ia, ib = encode(adapter, text_a, truncate, "text A"), encode(adapter, text_b, truncate, "text B")
    stage("recording both texts")
    with torch.no_grad():
        (la, ta, _), (lb, tb, _) = record_attention(adapter, ia), record_attention(adapter, ib)
    na, nb = ia.lengths[0], ib.lengths[0]
    pa, pb = torch.softmax(la[0].double(), -1).cpu().numpy(), torch.softmax(lb[0].double(), -1).cpu().numpy()
    index = int(np.argmax(pa))
    aa, ab = ta[0, :, :, :na, :na].double().cpu().numpy(), tb[0, :, :, :nb, :nb].double().cpu().numpy()
    views = {}

    def prefixed(side: str) -> Stage:
        return lambda x: stage(f"text {side.upper()}: {x}")

    for side, inp in (("a", ia), ("b", ib)):
        res = ex.compute(adapter, inp, Path("live"), target=Target(index), methods=methods, stage=prefixed(side))
        stage(f"text {side.upper()}: packing the view")
        views[side] = view_payload(adapter, res, Target(index), inp.truncated[0], {"kind": "pair", "side": side})
    out: dict[str, Any] = {
        "kind": "pair",
        "a": {
            "text": ia.texts[0],
            "tokens": ia.labels[0],
            "prediction": _prediction(adapter, pa, index),
            "view": views["a"],
        },
        "b": {
            "text": ib.texts[0],
            "tokens": ib.labels[0],
            "prediction": _prediction(adapter, pb, index),
            "view": views["b"],
        },
        "change": float(pb[index] - pa[index]),
        "outputs": output_rows(adapter, pa, pb),
        "outputs_meaning": "p(output) under each text and their difference, largest |difference| first; "
        + ("every output" if len(pa) <= TOP_OUTPUTS else f"the {TOP_OUTPUTS} most probable outputs under either text"),
        "same_length": na == nb,
        "explained": f"p({adapter.output_label(index)!r}), text A's prediction",
        "methods": methods,
    }
    arrays = {"probs_a": pa.astype(np.float32), "probs_b": pb.astype(np.float32)}
    described = {
        "probs_a": {"axes": ["output"], "meaning": "output distribution of text A"},
        "probs_b": {"axes": ["output"], "meaning": "output distribution of text B"},
    }
    if na == nb:
        pos = adapter.explained_position(na)
        diff = ab - aa
        tv = 0.5 * np.abs(diff[:, :, pos, :]).sum(-1)
        differing = [j for j in range(na) if int(ia.input_ids[0, j]) != int(ib.input_ids[0, j])]
        on = diff[:, :, pos, differing].sum(-1)  # [layer, head]
        out.update(
            differing=differing,
            explained_position=pos,
            row_tv=tv.tolist(),
            row_diff=diff[:, :, pos, :].tolist(),
            on_differing=on.tolist(),
            tv_meaning=f"total variation distance between the two texts' attention rows of the explained "
            f"position {pos}, per layer and head (0 = same, 1 = disjoint)",
            on_differing_meaning=f"attention of the explained position {pos} on the token(s) that differ "
            f"({', '.join(map(str, differing)) or 'none'}), text B minus text A, per layer and head",
        )
        arrays.update(
            row_tv=tv.astype(np.float32), on_differing=on.astype(np.float32), attention_diff=diff.astype(np.float32)
        )
        described.update(
            row_tv={"axes": ["layer", "head"], "meaning": out["tv_meaning"]},
            on_differing={"axes": ["layer", "head"], "meaning": out["on_differing_meaning"]},
            attention_diff={"axes": ["layer", "head", "query", "key"], "meaning": "attention of text B minus text A"},
        )
    else:
        out["note"] = (
            f"text A has {na} tokens and text B {nb}: attention is compared position by position only "
            "when both have the same number of tokens"
        )

    def save(w: RunWriter) -> None:
        kept = {k: v for k, v in out.items() if k != "row_diff"}
        kept["a"], kept["b"] = ({k: v for k, v in out[s].items() if k != "view"} for s in ("a", "b"))
        _write_plain(adapter, w, arrays, described, {"live": kept})

    return Live("pair", out, lambda folder: save_run(folder, "serve-pair", save))
