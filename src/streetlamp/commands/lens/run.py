"""``streetlamp lens``: logit lens, direct logit attribution, head types and (with a head) QK attribution.

Writes ``arrays.safetensors``, figures and ``manifest.json`` (result tables also in
``manifest["tables"]``) into the output folder, atomically; every input is checked first.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...interventions.head_types import TYPES, detect_head_types
from ...interventions.lens import direct_logit_attribution, logit_lens
from ...interventions.lenses.base import Lens
from ...interventions.lenses.check import neutral_ids
from ...interventions.lenses.store import load_lens
from ...interventions.qk import head_table
from ...models.adapter import ModelAdapter
from ...report import heads as fig
from ...store.run_folder import RunFolder
from ..explain.run import parse_target
from . import LensResult
from .check import run_checks, run_coords, variants_of, view_section

if TYPE_CHECKING:
    from . import LensSettings


def _top(values: np.ndarray, names: list[str], k: int) -> list[list]:
    order = np.argsort(-np.abs(values), kind="stable")[:k]
    return [[names[i], float(values[i])] for i in order]


def run_lens(adapter: ModelAdapter, s: LensSettings, out: RunFolder | Path, options: Any = None) -> LensResult:
    rf = RunFolder.of(out, "lens")
    text, head, query, types_length, types_seqs = s.text, s.head, s.query, s.types_length, s.types_seqs
    allow_pt, check, check_variant, baseline = s.allow_pt, s.intervention_check, s.check_variant, s.baseline
    alpha, neutral, seed, top = s.alpha, s.neutral, s.seed, 10
    kind, folder = s.lens
    coords = s.coords(adapter)
    index = parse_target(adapter, s.target)
    the_lens = Lens.logit(adapter) if folder is None else load_lens(folder, adapter, kind, allow_pt)
    neutral_tokens = neutral_ids(adapter, neutral) if check or check_variant else None
    inputs = adapter.encode(text)
    ids = inputs.input_ids[0]
    n = ids.shape[0]
    labels = inputs.labels[0]
    lh = s.head_pair()
    q = n - 1 if query is None else query
    if index is None:
        with torch.no_grad():
            index = int(adapter.forward(inputs).logits[0].argmax())
    target = adapter.output_label(index)

    lens = logit_lens(adapter, ids, index, lens=the_lens)
    name = f"{kind} lens"
    dla = direct_logit_attribution(adapter, ids, index)
    types = detect_head_types(adapter, length=types_length, n_seqs=types_seqs, seed=seed)
    L, H = adapter.n_layers, adapter.n_heads
    arrays = {
        "lens.logit": lens["logit"],
        "lens.prob": lens["prob"],
        "lens.logprob": lens["logprob"],
        "lens.rank": lens["rank"].astype(np.float64),
        "lens.top_ids": lens["top_ids"].astype(np.float64),
        "lens.top_prob": lens["top_prob"],
        "dla.heads": dla.heads,
        "dla.head_source": dla.head_source,
        "dla.mlp": dla.mlp,
        "dla.attn_bias": dla.attn_bias,
        "dla.embed": np.asarray(dla.embed),
        **{f"head_types.{k}": types[k] for k in TYPES},
    }
    lp = ["layer(0=embedding, l+1=after layer l)", "pos"]
    described = {
        "lens.logit": {
            "axes": lp,
            "meaning": f"{name}: logit of {target!r} from each layer's residual"
            + (" through" if kind == "logit" else f" mapped by the {kind} lens's A h + b, then through")
            + " the final norm and unembedding",
        },
        "lens.prob": {
            "axes": lp,
            "meaning": f"{name}: probability of {target!r} (float32: below ~1e-38 it reads 0; see lens.logprob)",
        },
        "lens.logprob": {
            "axes": lp,
            "meaning": f"{name}: natural log of the probability of {target!r} (log-softmax in float64, "
            "finite where lens.prob underflows)",
        },
        "lens.rank": {"axes": lp, "meaning": f"{name}: rank of {target!r} (0 = top)"},
        "lens.top_ids": {"axes": lp + ["k"], "meaning": f"{name}: top token ids"},
        "lens.top_prob": {"axes": lp + ["k"], "meaning": f"{name}: probabilities of the top tokens"},
        "dla.heads": {
            "axes": ["layer", "head"],
            "meaning": f"direct logit attribution to {target!r} at the last "
            "position, final norm linearised with its own scale",
        },
        "dla.head_source": {"axes": ["layer", "head", "key"], "meaning": "dla.heads split over the key positions read"},
        "dla.mlp": {"axes": ["layer"], "meaning": "direct logit attribution of each MLP output at the last position"},
        "dla.attn_bias": {"axes": ["layer"], "meaning": "direct logit attribution of each attention output bias"},
        "dla.embed": {
            "axes": [],
            "meaning": "direct logit attribution of the embedding (the residual entering layer 0) at the last "
            "position; embed + heads + attn_bias + mlp + the final norm's and the unembedding's biases "
            "(manifest summary) = the logit",
        },
        **{
            f"head_types.{k}": {
                "axes": ["layer", "head"],
                "meaning": f"{k.replace('_', '-')} score: attention mass on "
                f"the target cells, mean over queries that have one; {types_seqs} random sequences "
                f"of {types_length} tokens repeated twice, seed {seed}",
            }
            for k in TYPES
        },
    }
    head_names = [f"L{l}H{h}" for l in range(L) for h in range(H)]
    tables = [
        {
            "title": f"{name}: top token at the last position ({labels[-1]!r}) per layer",
            "columns": ["layer", "top token", "p(top)", f"p({target!r})", f"log p({target!r})", f"rank of {target!r}"],
            "rows": [
                [
                    "embed" if r == 0 else r - 1,
                    repr(adapter.output_label(int(lens["top_ids"][r, -1, 0]))),
                    float(lens["top_prob"][r, -1, 0]),
                    float(lens["prob"][r, -1]),
                    float(lens["logprob"][r, -1]),
                    int(lens["rank"][r, -1]),
                ]
                for r in range(L + 1)
            ],
        },
        {
            "title": f"direct logit attribution to {target!r} (logit {dla.logit:.3f}"
            + (f" before the final soft-cap {dla.softcap:g}; the model's {dla.model_logit:.3f}" if dla.softcap else "")
            + "): largest parts",
            "columns": ["part", "logit contribution"],
            "rows": _top(
                np.r_[dla.heads.reshape(-1), dla.mlp, [dla.embed]],
                head_names + [f"L{l} MLP" for l in range(L)] + ["embed"],
                top,
            )
            + [
                ["attention biases (all layers)", float(dla.attn_bias.sum())],
                ["final norm bias", dla.norm_bias],
                ["sum of all parts", dla.total()],
            ],
        },
    ]
    for k in TYPES:
        tables.append(
            {
                "title": f"head types: top {k.replace('_', '-')} heads",
                "columns": ["head", "score"],
                "rows": _top(types[k].reshape(-1), head_names, 5),
            }
        )
    summary: dict = {
        "target": {"index": index, "label": target},
        "logit": dla.logit,
        "dla_total": dla.total(),
        "dla_norm_bias": dla.norm_bias,
        "dla_unembed_bias": dla.unembed_bias,
    }
    if dla.softcap:  # DLA splits the logit before the final soft-cap (Gemma)
        summary.update(final_logit_softcap=dla.softcap, model_logit=dla.model_logit)
    if folder is not None:
        summary["lens"] = {"kind": kind, "folder": str(folder), **the_lens.info}
        if "warning" in the_lens.info:
            print(f"warning: {the_lens.info['warning']}", file=sys.stderr)
    variants = variants_of(check_variant, check)
    checks = run_checks(
        adapter, ids, the_lens, index, name=name, variants=variants, baseline=baseline, neutral=neutral_tokens or []
    )
    if coords is not None:
        run_coords(adapter, ids, the_lens, coords[0], coords[1], alpha, name, checks)
    tables += checks.tables
    summary.update(checks.summary)
    arrays.update(checks.arrays)
    described.update(checks.described)
    checked = checks.results.get("patch")
    qk = None
    if lh is not None:
        ht = head_table(adapter, ids, lh[0], lh[1], q, index)
        qk = ht["qk"]
        tables.append(ht["table"])
        arrays["qk.table"] = qk.table
        arrays["qk.pattern_row"] = qk.pattern_row
        described["qk.table"] = {
            "axes": ["query part", "key part"],
            "meaning": (
                f"head L{lh[0]}H{lh[1]}: pre-softmax score from query {q} to key {qk.key} split over upstream parts "
                "(manifest parts); pre-attention norm (and q/k norms) linearised with each token's own scale; sums "
                "to the score" + (" before the attention soft-cap" if qk.softcap else "")
            ),
        }
        described["qk.pattern_row"] = {"axes": ["key"], "meaning": f"attention of head L{lh[0]}H{lh[1]} from query {q}"}
        summary["head"] = {
            "layer": lh[0],
            "head": lh[1],
            "query": q,
            "key": qk.key,
            "score": qk.score,
            **({"score_after_softcap": qk.capped_score, "attention_softcap": qk.softcap} if qk.softcap else {}),
            "ablation_effect": ht["ablation_effect"],
            "dla": ht["dla"],
        }
    with rf.staging() as w:
        for file, frame in checks.frames.items():
            frame.to_csv(w.path / file, index=False)
        w.add_arrays({k: np.asarray(v, np.float32) for k, v in arrays.items()}, described)
        fig.layer_pos(
            {f"p({target!r})": lens["prob"]},
            labels,
            f"{adapter.name}: logit lens, p({target!r}) (row 0 = embedding)",
            w.path / "lens.png",
        )
        w.add_figure(
            file="lens.png", shows=f"logit lens: probability of {target!r} per layer and position", array="lens.prob"
        )
        fig.layer_head(
            dla.heads,
            f"{adapter.name}: direct logit attribution to {target!r} per head",
            "logit",
            w.path / "dla_heads.png",
        )
        w.add_figure(file="dla_heads.png", shows="direct logit attribution per head", array="dla.heads")
        for k in TYPES:
            fig.layer_head(
                types[k],
                f"{adapter.name}: {k.replace('_', '-')} score",
                "score",
                w.path / f"head_types_{k}.png",
                diverging=False,
            )
            w.add_figure(
                file=f"head_types_{k}.png", shows=f"{k.replace('_', '-')} score per head", array=f"head_types.{k}"
            )
        w.write_manifest(
            {
                "model": adapter.describe(),
                "tables": tables,
                "summary": summary,
                "lens_view": view_section(adapter, lens, labels, index, kind, checks),
                "parameters": {
                    "text": text,
                    "tokens": labels,
                    "target": {"index": index, "label": target},
                    "head": head,
                    "query": q if lh is not None else None,
                    "qk_parts": qk.parts if qk is not None else None,
                    "types_length": types_length,
                    "types_seqs": types_seqs,
                    "lens": {"kind": kind, "folder": str(folder) if folder is not None else None, "allow_pt": allow_pt},
                    "check": check,
                    "check_variant": check_variant,
                    "baseline": baseline if "baseline" in variants else None,
                    "coords": {"kind": coords[0], "tokens": coords[1], "alpha": alpha} if coords else None,
                    "neutral": neutral,
                },
                "seed": seed,
            }
        )
    values = {
        "lens": lens,
        "dla": dla,
        "types": types,
        "tables": tables,
        "summary": summary,
        "check": checked,
        "check_baseline": checks.results.get("baseline"),
    }
    return LensResult(rf.out, values)
