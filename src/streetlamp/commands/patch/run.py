"""``streetlamp patch`` and ``streetlamp mediate``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import specs
from ...interventions import mediation as M
from ...interventions import patching as P
from ...models.adapter import ModelAdapter
from ...report import heads as fig
from ...store.run_folder import RunFolder
from ..explain.run import parse_target

if TYPE_CHECKING:
    from . import MediateSettings, PatchSettings


@dataclass
class PatchResult:
    out: Path
    pair: P.Pair
    arrays: dict[str, np.ndarray]
    summary: dict[str, Any]
    receivers: str
    answer_label: str
    wrong_label: str

    def lines(self) -> list[str]:
        pair = self.pair
        lines = [
            f"logit difference {self.answer_label!r} - {self.wrong_label!r}: clean {pair.ld_clean:.3f}, "
            f"corrupted {pair.ld_corrupt:.3f}",
        ]
        if self.summary["top_heads"] or not self.summary.get("top_features"):
            lines.append(
                "heads restoring most (layer.head: fraction): "
                + ", ".join(f"{h['layer']}.{h['head']}: {h['restored']:.3f}" for h in self.summary["top_heads"])
            )
        if self.summary.get("top_features"):
            lines.append(
                "features restoring most (layer.site#feature: fraction): "
                + ", ".join(
                    f"{f['layer']}.{f['site']}#{f['feature']}: {f['restored']:.3f}"
                    for f in self.summary["top_features"]
                )
            )
        for k, v in self.summary.get("attribution_vs_patching", {}).items():
            lines.append(f"attribution vs real patching, {k}: pearson {v['pearson']:.3f}")
        if "paths" in self.arrays:
            lost = 1.0 - self.arrays["paths"]  # 1 = the path does not matter; 1 - value: share of LD lost
            order = np.argsort(-np.abs(np.nan_to_num(lost, nan=0.0)), axis=None)[:6]
            lines.append(
                f"paths sender -> {self.receivers} (share of the logit difference lost when only that path "
                "is corrupted): "
                + ", ".join(f"{i // lost.shape[1]}.{i % lost.shape[1]}: {lost.flat[i]:+.3f}" for i in order)
            )
        return lines + [f"output: {self.out}/"]


@dataclass
class MediateResult:
    out: Path
    arrays: dict[str, np.ndarray]  # te, te_per_prompt, head_nie/nde [layer, head], layer_nie/nde, y_null, y_set

    def lines(self) -> list[str]:
        nie = self.arrays["head_nie"]
        top = nie.reshape(-1).argsort()[::-1][:5]
        return [
            f"total effect TE = {float(self.arrays['te']):.3f} (mean over {len(self.arrays['y_null'])} prompts)",
            "heads with the largest NIE: "
            + ", ".join(f"{i // nie.shape[1]}.{i % nie.shape[1]}: {nie.reshape(-1)[i]:.3f}" for i in top),
            f"output: {self.out}/",
        ]


META = {"axes_lp": ["layer", "pos"], "axes_lh": ["layer", "head"]}


def parse_heads(adapter: ModelAdapter, spec: str) -> list[tuple[int, int]] | None:
    """``logits`` or ``L.H[,L.H...]`` (:func:`streetlamp.specs.parse_heads`) for this model."""
    return specs.parse_heads(spec, adapter.n_layers, adapter.n_heads)


def run_patch(
    adapter: ModelAdapter, s: PatchSettings, out: RunFolder | Path, options: Any = None, *, progress: bool = True
) -> PatchResult:
    rf = RunFolder.of(out, "patch")
    clean, corrupt, paths, receivers, receiver_pos = s.clean, s.corrupt, s.paths, s.receiver, s.receiver_pos
    approx, kinds, batch_size = s.approx, tuple(s.sites), s.batch_size
    answer, wrong = parse_target(adapter, s.answer), parse_target(adapter, s.wrong)
    pair = P.make_pair(adapter, clean, corrupt, answer, wrong)
    rec = parse_heads(adapter, receivers) if paths else None
    own = tuple(k for k in kinds if k not in P.FEATURE_KINDS)
    real = P.activation_patching(adapter, pair, progress=progress, kinds=own, batch_size=batch_size) if own else {}
    fkinds = tuple(k for k in kinds if k in P.FEATURE_KINDS)
    feats = P.feature_patching(adapter, pair, fkinds, batch_size, progress) if fkinds else None
    arrays = {f"patch.{k}": v for k, v in real.items()}
    described = {
        f"patch.{k}": {
            "axes": META["axes_lh"] if k == "heads" else META["axes_lp"],
            "meaning": f"activation patching: clean {k} ({'one head, every position' if k == 'heads' else 'one layer, one position'}) "
            "copied into the corrupted run; normalised logit difference (0 corrupt, 1 clean)",
        }
        for k in real
    }
    summary: dict = {}
    if approx:
        ap = P.attribution_patching(adapter, pair)
        ap = {k: v for k, v in ap.items() if k in real}
        arrays.update({f"approx.{k}": v for k, v in ap.items()})
        described.update(
            {
                f"approx.{k}": {
                    "axes": described[f"patch.{k}"]["axes"],
                    "meaning": "attribution patching (a_clean - a_corrupt)·dLD/da / (LD_clean - LD_corrupt)",
                }
                for k in ap
            }
        )
        summary["attribution_vs_patching"] = P.compare(real, ap)
    if paths:
        pp = P.path_patching(adapter, pair, rec, receiver_pos, progress=progress, batch_size=batch_size)
        arrays["paths"] = pp
        described["paths"] = {
            "axes": META["axes_lh"],
            "meaning": "path patching (Wang et al. 2023), noising: "
            f"sender head's corrupted output along the path to {receivers} only, other heads frozen "
            "clean; normalised logit difference (1 = path irrelevant, lower = path carries it); "
            "NaN = sender not before the receiver",
        }
    if feats is not None and feats.error is not None:
        arrays["patch.features_error"] = feats.error
        described["patch.features_error"] = {
            "axes": ["dictionary", "pos"],
            "meaning": "activation patching of one dictionary's error term (features_error) at one position, clean "
            "into corrupted; normalised logit difference (0 corrupt, 1 clean); dictionaries in the order of "
            "features_patched.dictionaries",
        }
    if feats is not None and "features" in fkinds:
        summary["top_features"] = feats.features[:5]
    labels = pair.clean.labels[0]
    heads = real.get("heads")
    top: np.ndarray | list[int] = np.argsort(-heads.reshape(-1))[:5] if heads is not None else []
    summary["top_heads"] = [
        {"layer": int(i // adapter.n_heads), "head": int(i % adapter.n_heads), "restored": float(heads.reshape(-1)[i])}  # type: ignore[union-attr]
        for i in top
    ]
    extra: dict[str, Any] = {}
    with rf.staging() as w:
        w.add_arrays({k: np.asarray(v, np.float32) for k, v in arrays.items()}, described)
        if feats is not None:
            extra["features_patched"] = {
                "kinds": list(fkinds),
                "dictionaries": [{"layer": l, "site": wh} for l, wh in feats.dictionaries],
                "error_term": "kept at its corrupted value when a feature is patched (frozen)",
            }
        if feats is not None and "features" in fkinds:
            import pandas as pd

            pd.DataFrame(feats.features, columns=list(P.FEATURE_COLUMNS)).to_csv(w.path / "features.csv", index=False)
            extra["features_patched"]["table"] = {
                "file": "features.csv",
                "columns": P.FEATURE_COLUMNS,
                "rows": len(feats.features),
                "note": "features whose clean and corrupted activations are equal everywhere restore exactly 0 "
                "and are not listed",
            }
        pos_panels = {k: real[k] for k in P.KINDS if k in real}
        if pos_panels:
            fig.layer_pos(
                pos_panels,
                labels,
                f"{adapter.name}: activation patching "
                f"(clean -> corrupted), {adapter.output_label(pair.answer)!r} vs "
                f"{adapter.output_label(pair.wrong)!r}",
                w.path / "patch_positions.png",
            )
            w.add_figure(
                file="patch_positions.png",
                shows="activation patching by layer x position",
                arrays=[f"patch.{k}" for k in pos_panels],
            )
        if heads is not None:
            fig.layer_head(
                heads,
                f"{adapter.name}: patching single heads (attn.z, all positions)",
                "normalised logit difference",
                w.path / "patch_heads.png",
            )
            w.add_figure(file="patch_heads.png", shows="activation patching of single heads", array="patch.heads")
        if approx:
            r = np.concatenate([real[k].reshape(-1) for k in real])
            a = np.concatenate([arrays[f"approx.{k}"].reshape(-1) for k in real])
            fig.scatter(r, a, f"{adapter.name}: attribution vs activation patching", w.path / "approx_scatter.png")
            w.add_figure(file="approx_scatter.png", shows="attribution patching against activation patching")
        if paths:
            fig.layer_head(
                arrays["paths"] - 1,
                f"{adapter.name}: path patching, sender -> {receivers}",
                "normalised LD - 1",
                w.path / "paths.png",
            )
            w.add_figure(file="paths.png", shows=f"path patching, sender -> {receivers}", array="paths")
        w.write_manifest(
            {
                "model": adapter.describe(),
                "summary": summary,
                "parameters": {
                    "clean": clean,
                    "corrupt": corrupt,
                    "tokens": labels,
                    "corrupt_tokens": pair.corrupt.labels[0],
                    "answer": {"index": pair.answer, "label": adapter.output_label(pair.answer)},
                    "wrong": {"index": pair.wrong, "label": adapter.output_label(pair.wrong)},
                    "kinds": list(kinds),
                    "paths": paths,
                    "receivers": receivers,
                    "receiver_pos": receiver_pos,
                    "approx": approx,
                    "batch_size": batch_size,
                },
                "logit_diff": {"clean": pair.ld_clean, "corrupt": pair.ld_corrupt},
                "seed": 0,
                **extra,
            }
        )
    return PatchResult(
        rf.out, pair, arrays, summary, receivers, adapter.output_label(pair.answer), adapter.output_label(pair.wrong)
    )


def run_mediate(
    adapter: ModelAdapter,
    s: MediateSettings,
    out: RunFolder | Path,
    options: Any = None,
    *,
    progress: bool = True,
    prompts: list[M.Prompt] | None = None,
) -> MediateResult:
    """Causal mediation over ``s.prompts`` built-in prompts, or (the library) the given ``prompts``."""
    rf = RunFolder.of(out, "mediate")
    n_prompts, head_site, batch_size = s.prompts, s.component, s.batch_size
    prompts = prompts or M.default_prompts(adapter, n_prompts)
    res = M.mediation(adapter, prompts, head_site=head_site, progress=progress, batch_size=batch_size)
    described = {
        "te": {"axes": [], "meaning": "total effect y(set)/y(null) - 1, mean over prompts"},
        "te_per_prompt": {"axes": ["prompt"], "meaning": "total effect per prompt"},
        "head_nie": {"axes": ["layer", "head"], "meaning": f"natural indirect effect of each head ({head_site})"},
        "head_nde": {"axes": ["layer", "head"], "meaning": f"natural direct effect of each head ({head_site})"},
        "layer_nie": {"axes": ["component(attn.out,mlp.out)", "layer"], "meaning": "NIE per layer component"},
        "layer_nde": {"axes": ["component(attn.out,mlp.out)", "layer"], "meaning": "NDE per layer component"},
        "y_null": {"axes": ["prompt"], "meaning": "p(anti)/p(stereo) on the prompt"},
        "y_set": {"axes": ["prompt"], "meaning": "p(anti)/p(stereo) after the set-gender intervention"},
    }
    with rf.staging() as w:
        w.add_arrays(res, described)
        fig.layer_head(
            res["head_nie"],
            f"{adapter.name}: natural indirect effect per head (TE {float(res['te']):.2f})",
            "NIE",
            w.path / "nie_heads.png",
        )
        w.add_figure(file="nie_heads.png", shows="natural indirect effect of each head", array="head_nie")
        fig.layer_head(
            res["layer_nie"].T,
            f"{adapter.name}: NIE per layer (columns attn.out, mlp.out)",
            "NIE",
            w.path / "nie_layers.png",
        )
        w.add_figure(file="nie_layers.png", shows="natural indirect effect per layer component", array="layer_nie")
        w.write_manifest(
            {
                "model": adapter.describe(),
                "parameters": {
                    "head_site": head_site,
                    "n_prompts": len(prompts),
                    "batch_size": batch_size,
                    "prompts": [p.__dict__ for p in prompts],
                },
                "seed": 0,
            }
        )
    return MediateResult(rf.out, res)
