"""``atlas --compare-task TASK``: does a head's usefulness on a narrow task predict its usefulness across
the corpus? (issue 25 item 7's third question)

The task's pairs (``commands.circuit.run.task_pairs``: ``ioi``, ``greater-than``, ``induction`` or a CSV of
pairs, the first ``--compare-prompts``) are encoded before anything is written (bad pairs: one line, exit
2). After the atlas, each head's task effect (:mod:`streetlamp.interventions.atlas_task`) is set beside
its corpus effect from ``heads.csv`` and written as ``task_compare.csv``, one row per head:

``layer``, ``head``, ``task``, ``task_ablate`` (mean over prompts of the change in the logit difference
when the head is ablated as the atlas ablates it), ``task_ablate_abs`` (its absolute value: how much
the task uses the head), ``task_patch`` / ``task_patch_abs`` (the same with the head patched from the
corrupted prompt; absent without corrupted prompts or with ``--ablation resample``, where only the
patch is measured), ``corpus_effect`` (``heads.csv``'s ``effect``: mean KL over the corpus),
``corpus_abs_dlogp_est``, and the ranks (1 = most used) ``task_rank`` (by the first measured way's
absolute effect) and ``corpus_rank``.

``manifest["task_compare"]`` holds per way Spearman's ρ of the absolute task effect against
``corpus_effect`` across heads, with a 95% percentile bootstrap interval over heads (2,000 resamples,
the atlas' seed; heads are the units, so the interval is about this model's heads, not a population of
models), and how many of the task's top 10 heads are among the corpus' top 10 and top quarter. It is not
part of the stored settings: the same command with ``--compare-task`` on a finished run computes only
this comparison.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ...interventions.atlas_chunks import Context
from ...interventions.atlas_task import task_effects
from ...interventions.atlas_use import spearman_ci
from ...interventions.circuits.tasks import PairSet, encode_pairs
from ...models.adapter import ModelAdapter
from ...store.run_store import RunStore, atomic_write


def task_pairs_of(adapter: ModelAdapter, task: str, n: int, seed: int) -> PairSet:
    """The task's first ``n`` pairs, checked against the tokenizer (before the run folder is made)."""
    from ..circuit.run import task_pairs

    two_digit = len(adapter.tokenizer("42", add_special_tokens=False)["input_ids"]) == 1
    return encode_pairs(adapter, task_pairs(task, n, seed, "mean", two_digit=two_digit))


def compare_task(
    adapter: ModelAdapter, store: RunStore, summary: pd.DataFrame, task: str, pairs: PairSet, ctx: Context, seed: int
) -> tuple[pd.DataFrame, dict[str, Any]]:
    ways: tuple[str, ...] = ("patch",) if ctx.ablation == "resample" else ("ablate", "patch")
    if bool((pairs.clean.input_ids == pairs.corrupt.input_ids).all()):
        ways = tuple(w for w in ways if w != "patch")  # no corrupted prompts: nothing to patch from
    eff = task_effects(adapter, pairs, ctx.ablation, ctx.mean, ways, ctx.batch_size)
    s = summary.sort_values(["layer", "head"]).reset_index(drop=True)
    t = pd.DataFrame({"layer": s.layer, "head": s["head"], "task": task})
    L, H = adapter.n_layers, adapter.n_heads
    for w in ways:
        t[f"task_{w}"] = eff[w].mean(0).reshape(L * H)
        t[f"task_{w}_abs"] = np.abs(t[f"task_{w}"])
    t["corpus_effect"] = s.effect
    t["corpus_abs_dlogp_est"] = s.abs_dlogp_est
    t["task_rank"] = t[f"task_{ways[0]}_abs"].rank(ascending=False, method="min")
    t["corpus_rank"] = t.corpus_effect.rank(ascending=False, method="min")
    atomic_write(store.folder / "task_compare.csv", lambda p: t.to_csv(p, index=False))
    info: dict[str, Any] = {
        "task": task,
        "n_prompts": len(pairs),
        "metric": "logit(answer) - logit(wrong) at the explained position; a head's task effect: its mean change",
        "ld_clean_mean": float(np.mean(eff["ld_clean"])),
        "ways": list(ways),
        "interval": "95% percentile bootstrap over heads, 2000 resamples",
    }
    top_c10 = set(t.nsmallest(10, "corpus_rank").index)
    quarter = set(t[t.corpus_rank <= len(t) / 4].index)
    for w in ways:
        rho, lo, hi = spearman_ci(t[f"task_{w}_abs"].to_numpy(), t.corpus_effect.to_numpy(), 2000, seed)
        top = set(t[f"task_{w}_abs"].nlargest(10).index)
        info[w] = {
            "spearman_rho": rho,
            "rho_low": lo,
            "rho_high": hi,
            "top10_in_corpus_top10": len(top & top_c10),
            "top10_in_corpus_top_quarter": len(top & quarter),
            "task_top10": [f"{int(t.layer[i])}.{int(t['head'][i])}" for i in t[f"task_{w}_abs"].nlargest(10).index],
        }
    store.update_manifest({"task_compare": info})
    return t, info


def lines(info: dict[str, Any]) -> list[str]:
    out = []
    for w in info["ways"]:
        r = info[w]
        out.append(
            f"task {info['task']} ({info['n_prompts']} prompts, {w}): Spearman rho of |task effect| against the corpus "
            f"effect across heads {r['spearman_rho']:.2f} [{r['rho_low']:.2f}, {r['rho_high']:.2f}]; "
            f"{r['top10_in_corpus_top10']} of its top 10 heads in the corpus' top 10 "
            f"({r['top10_in_corpus_top_quarter']} in the top quarter); written task_compare.csv"
        )
    return out
