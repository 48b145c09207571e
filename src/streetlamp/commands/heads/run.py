"""``streetlamp heads`` and ``streetlamp prune``: ablate, score and prune attention heads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.stats import spearmanr

from ...batching import rows_per_batch
from ...data import sample_indices
from ...errors import StreetlampError
from ...interventions import heads as H
from ...models.adapter import Inputs, ModelAdapter, Target
from ...report import heads as fig
from ...store.run_folder import RunFolder
from ..explain.run import parse_target

if TYPE_CHECKING:
    from . import HeadsSettings, PruneSettings

# Default reference set for mean/resample ablation of a single TEXT (documented in the help).
REFERENCE_TEXTS = (
    "The movie was not good, but the acting was great.",
    "I loved this film.",
    "The plot was boring and far too long.",
    "When Mary and John went to the store, John gave a drink to Mary.",
    "The capital of France is Paris.",
    "She said that the weather would be nice tomorrow.",
    "A terrible waste of time.",
    "The nurse said that he would be late.",
    "What a wonderful story, really fun to watch.",
    "The doctor went home because she was tired.",
    "It rained all day in Berlin.",
    "The acting was bad and the story made no sense.",
)


@dataclass
class HeadsResult:
    out: Path
    arrays: dict[str, np.ndarray]
    ranked: list[dict[str, Any]]  # heads by |ablation effect|, largest first
    claim: dict[str, Any]
    notes: dict[str, str]

    def lines(self) -> list[str]:
        lines = [
            "heads whose ablation changes the target most (layer.head: ΔF):",
            "  " + ", ".join(f"{r['layer']}.{r['head']}: {r['effect']:+.4f}" for r in self.ranked[:8]),
        ]
        for k, v in self.claim.get("spearman_vs_effect", {}).items():
            lines.append(f"spearman({k}, |ΔF|) = {v['rho']:+.3f} (p={v['p']:.2g})")
        lines += [f"note: {note}" for note in self.notes.values()]
        return lines + [f"output: {self.out}/ (manifest.json, arrays.safetensors, PNG figures)"]


@dataclass
class PruneResult:
    out: Path
    curves: dict[str, tuple[np.ndarray, np.ndarray]]  # order -> (heads removed, held-out accuracy)
    majority: float
    notes: dict[str, str]

    def lines(self) -> list[str]:
        lines = []
        for name, (x, y) in self.curves.items():
            half = int(len(x) // 2)
            lines.append(
                f"{name:<14} accuracy: all heads {y[0]:.3f}, {x[half]} removed {y[half]:.3f}, all removed {y[-1]:.3f}"
            )
        lines += [f"note: {note}" for note in self.notes.values()]
        return lines + [f"output: {self.out}/"]


def load_texts(spec: str) -> tuple[list[str], list[str] | None]:
    """Texts (and labels, if any): a .txt file (one unlabelled text per line), or anything
    :func:`streetlamp.data.load_dataset` reads (``movies``, ``tweets``, ``drugs``, CSV/TSV/JSONL with
    text and label columns, ERASER folders)."""
    p = Path(spec)
    if p.suffix == ".txt":
        from ...data.files import read_lines

        texts = read_lines(p, "data file")
        if not texts:
            raise StreetlampError(f"{spec} has no text")
        return texts, None
    from ...data import load_dataset

    ds = load_dataset(spec, labels=False)  # a corpus may be text alone
    if not ds.examples:
        raise StreetlampError(f"dataset {spec} has no examples")
    labels = [e.label for e in ds.examples]
    return [e.text for e in ds.examples], (labels if all(l != "" for l in labels) else None)


def label_ids(adapter: ModelAdapter, labels: list[str]) -> list[int]:
    """Class ids of ``labels`` (names in any case, or numbers): :meth:`ModelAdapter.parse_label`."""
    if not adapter.kind.labels:
        raise StreetlampError("labels and accuracy need a classifier")
    return [adapter.parse_label(s.strip()) for s in labels]


def texts_per_batch(inputs: Inputs, batch_size: int | None, repeat: int = 1) -> dict[str, Any]:
    """The token budget as the intervention functions' ``texts_per_batch`` (each text repeated
    ``repeat`` times in a pass); empty when no budget is given (their defaults)."""
    if batch_size is None:
        return {}
    return {"texts_per_batch": max(1, rows_per_batch(int(inputs.input_ids.shape[1]) * repeat, batch_size))}


def run_heads(
    adapter: ModelAdapter, s: HeadsSettings, out: RunFolder | Path, options: Any = None, *, progress: bool = True
) -> HeadsResult:
    """Ablate every head; with ``s.data`` also Michel importance, Hao attribution, attention mass."""
    rf = RunFolder.of(out, "heads")
    text, data, ablation, seed, limit, sample = s.text, s.data, s.ablation, s.seed, s.limit, s.sample
    attribution, batch_size = s.attribution, s.batch_size
    target = Target(parse_target(adapter, s.target), None, "prob")
    labels = None
    if data is not None:
        texts, raw = load_texts(data)
        if sample is not None:
            keep = sample_indices(len(texts), sample, seed)
            texts, raw = [texts[i] for i in keep], ([raw[i] for i in keep] if raw else raw)
        texts = texts[:limit] if limit else texts
        labels = label_ids(adapter, raw[: len(texts)]) if raw and adapter.kind.labels else None
    else:
        texts = [text]  # type: ignore[list-item]
    inputs = adapter.encode(texts, truncate=True)
    ref_note = None
    reference = None
    if ablation != "zero":
        if data is not None:
            reference, ref_note = inputs, "the dataset itself (every real token)"
        else:
            reference = adapter.encode(list(REFERENCE_TEXTS), truncate=True)
            ref_note = f"streetlamp's built-in {len(REFERENCE_TEXTS)} reference sentences (commands/heads/run.py)"
    eff, f_clean = H.ablation_effects(
        adapter,
        inputs,
        ablation=ablation,
        reference=reference,
        target=target,
        seed=seed,
        progress=progress,
        **texts_per_batch(inputs, batch_size, repeat=adapter.n_heads),
    )
    arrays = {
        "ablation": eff.mean(0).astype(np.float32),
        "ablation_per_text": eff.astype(np.float32),
        "f_clean": f_clean.astype(np.float32),
    }
    described = {
        "ablation": {
            "axes": ["layer", "head"],
            "meaning": f"mean over texts of F(head {ablation}-ablated at "
            "attn.z) - F(clean); F = probability of the target (clean prediction unless given)",
        },
        "ablation_per_text": {"axes": ["text", "layer", "head"], "meaning": "the same per text"},
        "f_clean": {"axes": ["text"], "meaning": "F on the clean input"},
    }
    notes: dict[str, str] = {}
    if data is not None:
        imp = H.head_importance(adapter, inputs, labels=labels, target=target, **texts_per_batch(inputs, batch_size))
        mass, peak = H.attention_mass(adapter, inputs, **texts_per_batch(inputs, batch_size))
        arrays.update(
            importance=imp.mean(0).astype(np.float32), attention_mass=mass.mean(0), attention_max=peak.mean(0)
        )
        described["importance"] = {
            "axes": ["layer", "head"],
            "meaning": "Michel et al. 2019 |dL/dxi_h| mean over texts; "
            + ("L = cross-entropy of the gold label" if labels else "L = -log p(target)"),
        }
        described["attention_mass"] = {
            "axes": ["layer", "head"],
            "meaning": "attention of the explained position on content (non-special) tokens, mean over texts",
        }
        described["attention_max"] = {
            "axes": ["layer", "head"],
            "meaning": "largest attention weight of the explained position, mean over texts",
        }
        hao, why = (
            H.attribution_scores(adapter, inputs, target, batch_size=batch_size)
            if attribution
            else (None, "skipped (--no-attribution)")
        )
        notes["attribution"] = why
        if hao is not None:
            arrays["attribution"] = hao.mean(0)
            described["attribution"] = {
                "axes": ["layer", "head"],
                "meaning": "Hao et al. 2021 attention attribution "
                "head scores (method attention_attribution), mean over texts",
            }
    stats = claim_stats(arrays) if data is not None else {}
    a = arrays["ablation"]
    with rf.staging() as w:
        w.add_arrays(arrays, described)
        fig.layer_head(
            a,
            f"{adapter.name}: {ablation} ablation of each head ({len(texts)} text(s))",
            "ΔF (ablated - clean)",
            w.path / "ablation.png",
        )
        w.add_figure(file="ablation.png", shows="mean ablation effect of each head", array="ablation")
        fig.ranked(a, f"{adapter.name}: heads ranked by |ΔF|", "ΔF", w.path / "ranked.png")
        w.add_figure(file="ranked.png", shows="heads ranked by |ablation effect|", array="ablation")
        if data is not None:
            panels: dict[str, np.ndarray] = {
                k: arrays[k] for k in ("ablation", "importance", "attribution", "attention_mass") if k in arrays
            }
            fig.side_by_side(panels, f"{adapter.name}: head scores side by side", w.path / "scores.png")
            w.add_figure(file="scores.png", shows="head scores side by side", arrays=list(panels))
        w.write_manifest(
            {
                "model": adapter.describe(),
                "notes": notes,
                "claim": stats,
                "parameters": {
                    "ablation": ablation,
                    "reference": ref_note,
                    "data": data,
                    "n_texts": len(texts),
                    "text": text,
                    "target": {"index": target.index, "quantity": target.quantity},
                    "limit": limit,
                    "sample": sample,
                    "labels": bool(labels),
                    "batch_size": batch_size,
                },
                "ranked": rank(a),
                "seed": seed,
            }
        )
    return HeadsResult(rf.out, arrays, rank(a), stats, notes)


def rank(a: np.ndarray, k: int = 10) -> list[dict]:
    H_ = a.shape[1]
    return [
        {"layer": int(i // H_), "head": int(i % H_), "effect": float(a.reshape(-1)[i])}
        for i in np.argsort(-np.abs(a.reshape(-1)))[:k]
    ]


def claim_stats(arrays: dict[str, np.ndarray], q: float = 0.25) -> dict:
    """The articles' claim: high-attention heads that do not matter, low-attention heads that do.

    Effect = |ablation|. Spearman rank correlations of every score with the effect; heads in
    the top quartile of attention mass with effect in the bottom quartile, and vice versa.
    """
    eff = np.abs(arrays["ablation"]).reshape(-1)
    out: dict[str, Any] = {"effect": "|mean ablation ΔF|", "spearman_vs_effect": {}}
    for k in ("attention_mass", "attention_max", "importance", "attribution"):
        if k in arrays:
            r = spearmanr(arrays[k].reshape(-1), eff)
            out["spearman_vs_effect"][k] = {"rho": float(r.statistic), "p": float(r.pvalue)}
    mass = arrays["attention_mass"].reshape(-1)
    H_ = arrays["ablation"].shape[1]
    hi_m, lo_m = mass >= np.quantile(mass, 1 - q), mass <= np.quantile(mass, q)
    hi_e, lo_e = eff >= np.quantile(eff, 1 - q), eff <= np.quantile(eff, q)
    name = lambda i: f"L{i // H_}.H{i % H_} (mass {mass[i]:.2f}, |ΔF| {eff[i]:.4f})"  # noqa: E731
    out["high_mass_low_effect"] = [name(i) for i in np.nonzero(hi_m & lo_e)[0]]
    out["low_mass_high_effect"] = [name(i) for i in np.nonzero(lo_m & hi_e)[0]]
    out["quartile"] = q
    return out


def run_prune(
    adapter: ModelAdapter, s: PruneSettings, out: RunFolder | Path, options: Any = None, *, progress: bool = True
) -> PruneResult:
    """Score heads on one half of the data, prune on the held-out other half.

    The examples are shuffled with ``seed`` before ``limit`` and the split: data files are often
    sorted by label (gensim's movie sentences are), and an unshuffled split would hold out one
    class only."""
    data, orders, seeds, step, limit = s.data, s.orders, s.seeds, s.step, s.limit
    seed, batch_size = s.seed, s.batch_size
    rf = RunFolder.of(out, "prune")
    texts, raw = load_texts(data)
    if not raw:
        raise StreetlampError("pruning needs labels: give a .csv/.jsonl with a 'label' column or a labelled dataset")
    perm = np.random.default_rng(seed).permutation(len(texts))
    texts, raw = [texts[i] for i in perm], [raw[i] for i in perm]
    texts, raw = (texts[:limit], raw[:limit]) if limit else (texts, raw)
    labels = label_ids(adapter, raw)
    if len(texts) < 4:
        raise StreetlampError("pruning needs at least 4 labelled texts (half to score heads, half held out)")
    half = len(texts) // 2
    score_in, eval_in = adapter.encode(texts[:half], truncate=True), adapter.encode(texts[half:], truncate=True)
    ev_labels = labels[half:]
    scores: dict[str, np.ndarray] = {}
    notes = {}
    for o in orders:
        if o == "importance":
            scores[o] = H.head_importance(
                adapter, score_in, labels=labels[:half], **texts_per_batch(score_in, batch_size)
            ).mean(0)
        elif o == "attention":
            scores[o] = H.attention_mass(adapter, score_in, **texts_per_batch(score_in, batch_size))[0].mean(0)
        elif o == "attribution":
            hao, why = H.attribution_scores(adapter, score_in, batch_size=batch_size)
            notes["attribution"] = why
            if hao is not None:
                scores[o] = np.abs(hao).mean(0)
    curves: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    per_batch = texts_per_batch(eval_in, batch_size)
    for name, sc in scores.items():
        curves[name] = H.prune_curve(adapter, eval_in, ev_labels, H.order_from_scores(sc), step, progress, **per_batch)
    if "random" in orders:
        for k in range(seeds):
            curves[f"random_seed{k}"] = H.prune_curve(
                adapter,
                eval_in,
                ev_labels,
                H.random_order(adapter.n_layers, adapter.n_heads, seed + k),
                step,
                progress,
                **per_batch,
            )
    majority = max(ev_labels.count(c) for c in set(ev_labels)) / len(ev_labels)
    arrays = {f"curve.{k}": np.stack([x.astype(np.float32), y]) for k, (x, y) in curves.items()}
    arrays.update({f"score.{k}": v.astype(np.float32) for k, v in scores.items()})
    described = {
        k: {
            "axes": ["row(0=heads removed,1=accuracy)", "step"],
            "meaning": "held-out accuracy after zero-ablating the first k heads of the order (least important first)",
        }
        for k in arrays
        if k.startswith("curve.")
    }
    described.update(
        {
            k: {
                "axes": ["layer", "head"],
                "meaning": "score used for the order (computed on the scoring "
                "half of the data; heads removed lowest score first)",
            }
            for k in arrays
            if k.startswith("score.")
        }
    )
    with rf.staging() as w:
        w.add_arrays(arrays, described)
        fig.prune_curves(
            curves, f"{adapter.name}: pruning heads ({len(ev_labels)} held-out texts)", w.path / "prune.png", majority
        )
        w.add_figure(
            file="prune.png",
            shows="held-out accuracy against heads removed, one curve per order",
            arrays=[k for k in arrays if k.startswith("curve.")],
        )
        w.write_manifest(
            {
                "model": adapter.describe(),
                "notes": notes,
                "parameters": {
                    "data": data,
                    "orders": orders,
                    "random_seeds": seeds,
                    "step": step,
                    "limit": limit,
                    "n_score": half,
                    "n_heldout": len(ev_labels),
                    "split": "seeded shuffle, then halves",
                    "heldout_label_counts": {
                        adapter.output_label(int(k)): int(v)
                        for k, v in zip(*np.unique(np.asarray(ev_labels), return_counts=True))
                    },
                    "removal": "zero ablation at attn.z",
                    "importance_normalisation": "none (raw Michel scores)",
                    "batch_size": batch_size,
                },
                "majority_baseline": majority,
                "seed": seed,
            }
        )
    return PruneResult(rf.out, curves, majority, notes)
