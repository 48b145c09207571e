"""``streetlamp experts``: the expert audit's tables (experts.csv, tokens.parquet, agreement.csv) and manifest."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ...interventions import experts as X
from ...models.adapter import Inputs, ModelAdapter
from ...stats import bootstrap_ci, kendall_tau, spearman_rho
from ...store.run_folder import RunFolder, manifest_table
from . import ExpertsSettings


@dataclass
class ExpertsResult:
    out: Path
    table: pd.DataFrame
    agreement: pd.DataFrame
    n_texts: int
    n_tokens: int
    forwards: int

    def lines(self) -> list[str]:
        t = self.table
        top_route = t.sort_values("routing_frequency", ascending=False).head(3)
        top_effect = t.sort_values("kl_removed_mean", ascending=False).head(3)
        fmt = lambda r: f"L{int(r.layer)}.E{int(r.expert)}"  # noqa: E731
        lines = [
            f"{self.n_texts} texts, {self.n_tokens} tokens, {len(t)} experts, {self.forwards} forwards",
            "most routed: " + ", ".join(f"{fmt(r)} {r.routing_frequency:.0%}" for r in top_route.itertuples()),
            "most needed (KL when removed): "
            + ", ".join(f"{fmt(r)} {r.kl_removed_mean:.4f}" for r in top_effect.itertuples()),
        ]
        for r in self.agreement.itertuples():
            lines.append(
                f"agreement {r.scope} ({r.n} pairs): Spearman {r.spearman_rho:+.2f}, Kendall {r.kendall_tau:+.2f}"
            )
        lit = t[t.streetlight]
        lines.append(
            "streetlight experts (routed to at least their share, removal within noise): "
            + (", ".join(fmt(r) for r in lit.itertuples()) or "none")
        )
        hidden = t[t.hidden_influence]
        lines.append("rarely routed but needed: " + (", ".join(fmt(r) for r in hidden.itertuples()) or "none"))
        return lines + [f"output: {self.out}/"]


def texts_of(spec: str, limit: int) -> list[str]:
    from ..heads.run import load_texts

    return load_texts(spec)[0][:limit]


def run(adapter: ModelAdapter, s: ExpertsSettings, out: RunFolder, options: Any) -> ExpertsResult:
    texts = texts_of(s.data, s.limit)
    full = adapter.encode(texts)
    inputs = Inputs.from_ids(adapter, [r[: s.max_tokens] for r in full.rows()], texts)
    from ...specs import parse_indices

    L, E = adapter.n_layers, X.n_experts_of(adapter)
    layers = parse_indices(s.layers, L, "--layers", "layer")
    experts = parse_indices(s.experts, E, "--experts", "expert")
    removed = X.parse_experts(s.remove, adapter)
    res = X.audit(
        adapter,
        inputs,
        renormalise=s.renormalise,
        tokens=s.tokens,
        layers=layers,
        experts=experts,
        top_k=s.top_k,
        removed=removed,
        batch_tokens=s.batch_tokens,
        progress=True,
    )
    rows = []
    k = s.top_k or int(adapter.hf_model.config.num_experts_per_tok)
    share = k / E
    for l in layers:
        for e in experts:
            if (l, e) in removed:
                continue
            mean, lo, hi, n = bootstrap_ci(res.kl_per_text[:, l, e], n_boot=max(s.bootstrap, 1), seed=s.seed)
            rows.append(
                dict(
                    layer=l,
                    expert=e,
                    routing_frequency=float(res.frequency[l, e]),
                    mean_router_weight=float(res.mean_weight[l, e]),
                    kl_removed_mean=mean,
                    kl_removed_ci_low=lo,
                    kl_removed_ci_high=hi,
                    n_texts=n,
                )
            )
    t = pd.DataFrame(rows)
    t["streetlight"] = (t.routing_frequency >= share) & (t.kl_removed_ci_high < s.floor)
    t["hidden_influence"] = (t.routing_frequency < share) & (t.kl_removed_ci_low > s.floor)
    agree = [_agreement("experts: mean router weight vs KL removed", t.mean_router_weight, t.kl_removed_mean)]
    agree.append(_agreement("experts: routing frequency vs KL removed", t.routing_frequency, t.kl_removed_mean))
    tok = pd.DataFrame(
        res.token_rows, columns=["text", "pos", "layer", "expert", "router_weight", "kl_removed_at_token"]
    ).astype({"text": int, "pos": int, "layer": int, "expert": int})
    if len(tok):
        tok.insert(
            2,
            "token",
            [
                adapter.tokenizer.convert_ids_to_tokens(int(inputs.input_ids[b, p]))
                for b, p in zip(tok.text, tok.pos, strict=True)
            ],
        )
        agree.append(
            _agreement("tokens: router weight vs KL removed at the token", tok.router_weight, tok.kl_removed_at_token)
        )
    ag = pd.DataFrame(agree)
    with out.staging() as w:
        t.to_csv(w.path / "experts.csv", index=False)
        ag.to_csv(w.path / "agreement.csv", index=False)
        if len(tok):
            tok.to_parquet(w.path / "tokens.parquet", index=False)
        w.add_array(
            "kl_removed_per_text",
            res.kl_per_text,
            axes=["text", "layer", "expert"],
            meaning="mean over the text's real positions of KL(clean || expert removed), nats; NaN: not audited",
        )
        w.add_array(
            "routing_frequency",
            res.frequency,
            axes=["layer", "expert"],
            meaning="share of real tokens the router sends to the expert",
        )
        w.write_manifest(
            {
                "model": adapter.name,
                "parameters": {**s.to_dict(), "data": s.data},
                "removal": "expert taken out of the token's top-k at layers.{l}.router.weights, "
                + (
                    "the other experts rescaled to the token's original total weight"
                    if s.renormalise
                    else "the other experts keep their weights (not renormalised)"
                ),
                "effect": "KL(p(.|clean) || p(.|removed)) of the next-token distribution; per text: the mean over "
                "its real positions; per token: at the token's own prediction, the expert removed there alone",
                "top_k": k,
                "removed_throughout": [f"{l}.{e}" for l, e in removed],
                "streetlight": f"routing frequency >= top_k / n_experts ({share:.3f}) and the KL interval's upper "
                f"bound below --floor {s.floor}",
                "n_texts": len(texts),
                "n_tokens": res.n_tokens,
                "forwards": res.forwards,
                "files": {
                    "experts.csv": "one row per (layer, expert): routing_frequency (share of real tokens routed to "
                    "it), mean_router_weight (0 where not routed), kl_removed_mean and its bootstrap interval over "
                    "texts, streetlight, hidden_influence",
                    "tokens.parquet": "one row per (text, pos, layer, expert routed there): router_weight, "
                    "kl_removed_at_token",
                    "agreement.csv": "rank agreement of routing and effect: Spearman and Kendall over the pairs",
                },
                "tables": [
                    manifest_table(
                        t, "experts.csv", note="per (layer, expert): routing beside the effect of removing it"
                    ),
                    manifest_table(ag, "agreement.csv", note="rank agreement of routing and effect"),
                ],
            }
        )
    return ExpertsResult(out.out, t, ag, len(texts), res.n_tokens, res.forwards)


def _agreement(scope: str, a: Any, b: Any) -> dict[str, Any]:
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return dict(scope=scope, n=int(x.size), spearman_rho=spearman_rho(x, y), kendall_tau=kendall_tau(x, y))
