"""``streetlamp features-audit``: audit.csv (one row per feature x edit x error mode: attribution vs exact),
features.csv (one row per feature, wide), summary.csv (one row per edit x error mode: rank and sign agreement,
top-k) and the per-prompt arrays."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ...errors import StreetlampError
from ...interventions import features as FI
from ...interventions.circuits.tasks import PairSet, encode_pairs
from ...models.adapter import ModelAdapter
from ...stats import bootstrap_ci, spearman_rho
from ...store.run_folder import RunFolder, manifest_table
from .sentiment import sentiment

if TYPE_CHECKING:
    from . import FeaturesAuditSettings  # the package imports this module lazily (validate)


def attach(adapter: ModelAdapter, path: str) -> None:
    """Load the feature set at ``path`` and splice it into ``adapter`` (one clear line where it does not fit)."""
    if adapter.features is not None and adapter.features.source == str(path):
        return
    from ...models.dictionaries import load_features

    adapter.attach_features(load_features(path))


def pairs_of(adapter: ModelAdapter, s: FeaturesAuditSettings) -> PairSet:
    """The task's first ``limit`` pairs, checked against the tokenizer (circuit's generators and CSV reader)."""

    def n_tokens(text: str) -> int:
        return len(adapter.tokenizer(text, add_special_tokens=False)["input_ids"])

    if s.task == "sentiment":
        return encode_pairs(adapter, sentiment(s.limit, s.seed, n_tokens))
    from ..circuit.run import task_pairs

    two_digit = n_tokens("42") == 1
    pairs = encode_pairs(adapter, task_pairs(s.task, s.limit, s.seed, "patch", two_digit=two_digit))
    if "patch" in s.edit_list() and bool((pairs.clean.input_ids == pairs.corrupt.input_ids).all()):
        raise StreetlampError(f"--task {s.task}: the corrupted prompts equal the clean ones; nothing to patch from")
    return pairs


@dataclass
class FeaturesAuditResult:
    out: Path
    summary: pd.DataFrame
    features: pd.DataFrame
    n_prompts: int
    metric_clean: float
    select: str = "active"

    def lines(self) -> list[str]:
        f = self.features
        out = [
            f"{self.n_prompts} prompt pairs, mean clean metric {self.metric_clean:+.3f}; {len(f)} features audited "
            f"(chosen by {self.select})"
        ]
        for r in self.summary.itertuples():
            out.append(
                f"{r.edit:6s} error {r.error:10s}: attribution vs exact Spearman {r.spearman_rho:+.2f}, Kendall "
                f"{r.kendall_tau:+.2f}, signs agree {r.sign_agreement:.0%}, top-{r.top_k} overlap "
                f"{r.top_k_overlap:.0%}, max |error| {r.max_abs_error:.3g}"
            )
        for r in self.summary.itertuples():
            out.append(f"{r.edit:6s} error {r.error:10s}: activation vs |exact| Spearman {r.activation_vs_effect:+.2f}")
        if "streetlight" in f:
            lit = f[f.streetlight]
            out.append(
                "striking but unused (top half of these by activation, zero ablation within --floor): "
                + (", ".join(lit.feature.head(12)) or "none")
                + (f" (+{len(lit) - 12})" if len(lit) > 12 else "")
            )
        return out + [f"output: {self.out}/"]


def run(adapter: ModelAdapter, s: FeaturesAuditSettings, out: RunFolder, options: Any) -> FeaturesAuditResult:
    attach(adapter, s.features)
    fs = adapter.features
    assert fs is not None
    pairs = pairs_of(adapter, s)
    edits, errors = s.edit_list(), s.errors()
    res = FI.task_audit(
        adapter, pairs, top=s.top, edits=edits, errors=errors, steer_scale=s.steer, metric=s.metric,
        batch_size=s.batch_size, top_k=s.top_k, select=s.select,
    )  # fmt: skip
    feats = res.features
    base = pd.DataFrame(
        {
            "feature": [f.name for f in feats],
            "layer": [f.layer for f in feats],
            "site": [f.where for f in feats],
            "index": [f.index for f in feats],
            "mean_activation": res.activity["mean"],
            "max_activation": res.activity["max"],
            "active_frequency": res.activity["frequency"],
            "rank_activation": pd.Series(res.activity["mean"]).rank(ascending=False, method="first").astype(int),
        }
    )
    rows, summ = [], []
    wide = base.copy()
    for (how, err), ex in res.exact.items():
        est = res.estimate[how, err]
        t = base.copy()
        t.insert(4, "edit", how)
        t.insert(5, "error", err)
        t["alpha"] = res.alpha if how == "steer" else np.nan
        t["attribution"] = est.mean(0)
        ci = [bootstrap_ci(ex[:, j], n_boot=s.bootstrap, seed=s.seed) for j in range(len(feats))]
        t["exact"] = [c[0] for c in ci]
        t["exact_ci_low"] = [c[1] for c in ci]
        t["exact_ci_high"] = [c[2] for c in ci]
        t["abs_error"] = np.abs(t.attribution - t.exact)
        t["rank_attribution"] = t.attribution.abs().rank(ascending=False, method="min").astype(int)
        t["rank_exact"] = t.exact.abs().rank(ascending=False, method="min").astype(int)
        rows.append(t)
        tag = f"{how}_{err}"
        wide[f"attribution_{tag}"] = t.attribution
        wide[f"exact_{tag}"] = t.exact
        a = res.summary[how, err]
        summ.append(
            {
                "edit": how,
                "error": err,
                "n_features": len(feats),
                "n_prompts": len(pairs),
                "kendall_tau": a["kendall_tau"],
                "spearman_rho": a["spearman_rho"],
                "sign_agreement": a["sign_agreement"],
                "misranked_share": a["misranked_share"],
                "mean_abs_error": a["mean_abs_error"],
                "max_abs_error": a["max_abs_error"],
                "relative_error": a["relative_error"],
                "top_k": a["top_k"],
                "top_k_overlap": a["top_k_overlap"],
                "top_by_attribution": ";".join(a["top_by_estimate"]),
                "top_by_exact": ";".join(a["top_by_exact"]),
                "activation_vs_effect": spearman_rho(res.activity["mean"], np.abs(t.exact.to_numpy())),
            }
        )
    audit_t, summary = pd.concat(rows, ignore_index=True), pd.DataFrame(summ)
    if "zero" in edits:
        z = audit_t[(audit_t.edit == "zero") & (audit_t.error == errors[0])].reset_index(drop=True)
        within = (z.exact_ci_low <= 0) & (z.exact_ci_high >= 0) | (z.exact_ci_low.isna() & (z.exact.abs() < s.floor))
        wide["streetlight"] = (base.rank_activation <= max(1, len(base) // 2)) & within & (z.exact.abs() < s.floor)
    tables = {
        "audit.csv": "one row per (feature, edit, error): the feature (feature = L{layer}.{site}.{index}), its "
        "activation on the clean prompts (mean and max over real tokens, active_frequency), the edit and the error "
        "mode, alpha (steering), attribution (mean over prompts of the attribution-patching estimate), exact (mean "
        "over prompts of m(edited) - m(clean), with its bootstrap interval over prompts), abs_error, ranks by |.|",
        "features.csv": "one row per feature: activation, attribution_<edit>_<error> and exact_<edit>_<error>, "
        "streetlight (top half by mean activation, zero-ablation effect within --floor and its interval covering 0)",
        "summary.csv": "one row per (edit, error): attribution vs exact over the audited features (Kendall, Spearman, "
        "sign agreement, misranked pairs, errors, top-k by each and their overlap) and activation vs |exact|",
    }
    with out.staging() as w:
        audit_t.to_csv(w.path / "audit.csv", index=False)
        wide.to_csv(w.path / "features.csv", index=False)
        summary.to_csv(w.path / "summary.csv", index=False)
        for (how, err), ex in res.exact.items():
            for kind, arr in (("exact", ex), ("attribution", res.estimate[how, err])):
                w.add_array(
                    f"{kind}.{how}.{err}",
                    arr,
                    axes=["prompt", "feature"],
                    meaning=f"{kind} m(edited) - m(clean) per prompt, edit {how}, error {err}; features in audit.csv "
                    "order (most active first)",
                )
        w.add_array("metric_clean", res.metric_clean, axes=["prompt"], meaning=f"{s.metric} on the clean prompts")
        w.write_manifest(
            {
                "model": adapter.name,
                "parameters": s.to_dict(),
                "seed": s.seed,
                "feature_set": fs.describe(),
                "task": {"name": s.task, "n_prompts": len(pairs)},
                "metric": f"{s.metric}: answer minus wrong answer at the last prompt token; effects are "
                "m(edited) - m(clean) in its units",
                "selection": (
                    f"the {len(feats)} features with the largest mean activation over the clean prompts' real tokens"
                    if s.select == "active"
                    else f"the {len(feats)} features (active on the prompts) with the largest |mean over prompts of the "
                    f"attribution of zero-ablating them| (error {errors[0]})"
                )
                + ", over every dictionary of the set",
                "edits": {e: FI.EditSpec(e, means={}, alpha={}).describe() for e in edits}
                | (
                    {
                        "steer": f"alpha = {s.steer:g} x the feature's max activation on the clean prompts, added at every "
                        "position"
                    }
                    if "steer" in edits
                    else {}
                ),
                "error": {e: FI.ERROR_MEANING[e] for e in errors},
                "attribution": "sum over positions of dm/da_f x (replacement - a_f) at the clean run (gradient through "
                "the dictionary's decoder; frozen errors carry none)",
                "summary": summary.drop(columns=["top_by_attribution", "top_by_exact"]).to_dict("records"),
                "files": tables,
                "tables": [
                    manifest_table(df, name, note=tables[name])
                    for name, df in (("audit.csv", audit_t), ("features.csv", wide), ("summary.csv", summary))
                ],
            }
        )
    return FeaturesAuditResult(out.out, summary, wide, len(pairs), float(res.metric_clean.mean()), s.select)
