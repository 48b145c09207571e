"""The IG baseline study on a causal LM (docs/decoder.md): how much the baseline changes IG's token
rankings (Spearman / Kendall between baselines) and its erasure metrics (ERASER comprehensiveness and
sufficiency AOPC, with the decoder removal rule), on hand-written next-token prompts.

    PYTHONPATH=src OMP_NUM_THREADS=1 python scripts/ig_baselines.py --model smollm2-135m --prompts 60 \
        --steps 16 --eg-draws 4 --out runs/ig-baselines.json

Prompts: the 32 hand-written ones below, then streetlamp's factual-recall prompts (``--data recall``).
Each finished prompt is appended to ``OUT.jsonl`` at once; a rerun skips the prompts already there.
The summary has 95% bootstrap intervals over prompts (``streetlamp.stats.bootstrap_ci``), also for the
paired difference of each baseline's AOPC from the document-start token's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import kendalltau, spearmanr

from streetlamp.evaluation.common import output_prob_of
from streetlamp.evaluation.erasure import ErasurePlan
from streetlamp.methods.gradient import embed_ids
from streetlamp.methods.ig import IntegratedGradients
from streetlamp.methods.removal import Removal
from streetlamp.models.adapter import ModelAdapter, Target
from streetlamp.stats import bootstrap_ci

PROMPTS = [
    "The capital of France is",
    "The Eiffel Tower is located in the city of",
    "Water freezes at zero degrees",
    "The largest planet in our solar system is",
    "Shakespeare wrote the play Romeo and",
    "The chemical symbol for gold is",
    "When Mary and John went to the store, John gave a drink to",
    "The opposite of hot is",
    "A week has seven",
    "The first president of the United States was George",
    "The sun rises in the",
    "Cats and dogs are popular household",
    "The Great Wall is in",
    "She opened the door and walked into the",
    "The author of Harry Potter is J. K.",
    "Two plus two equals",
    "The currency of Japan is the",
    "Paris is to France as Berlin is to",
    "The color of the sky on a clear day is",
    "He drank a cup of hot",
    "The animal didn't cross the street because it was too tired. In that sentence, it refers to the",
    "Bees make",
    "The longest river in Africa is the",
    "In the morning I like to eat",
    "The doctor told the patient to take the",
    "Mount Everest is the highest",
    "The Statue of Liberty is in New",
    "My favourite season is summer because it is",
    "The programming language Python was created by Guido van",
    "Rain falls from the",
    "The Mona Lisa was painted by Leonardo da",
    "Ice is the solid form of",
]


class FixedBaseline(IntegratedGradients):
    """IG with a given baseline embedding function (the study's baselines, not streetlamp options)."""

    def __init__(self, make, label: str, **kw) -> None:
        super().__init__(**kw)
        self._make, self._label = make, label

    def baseline_embedding(self, adapter, ids, e):
        eb = self._make(ids, e).to(e.dtype)
        special = torch.as_tensor(adapter.special_mask(ids), device=e.device)
        return torch.where(special.view(-1, 1), e, eb), self._label


def all_prompts() -> list[str]:
    from streetlamp.data.loaders import BUNDLED

    recall = [e.text for e in BUNDLED["recall"]().examples]
    return [*PROMPTS, *[t for t in recall if t not in PROMPTS]]


def blurred(e: torch.Tensor, width: int = 2) -> torch.Tensor:
    """The embedding sequence averaged over a window of ``2 * width + 1`` positions (the "blurred" baseline of
    Sturmfels et al. 2020, along the sequence): content smeared across neighbours, no position's own."""
    k = torch.ones(1, 1, 2 * width + 1, dtype=e.dtype) / (2 * width + 1)
    x = e.transpose(0, 1)[:, None]  # [d, 1, pos]
    pad = torch.nn.functional.pad(x, (width, width), mode="replicate")
    return torch.nn.functional.conv1d(pad, k)[:, 0].transpose(0, 1)


def baselines(adapter: ModelAdapter, rng: np.random.Generator) -> dict[str, object]:
    tok = adapter.tokenizer
    table = adapter.embed_module.weight.detach()
    token = lambda tid: lambda ids, e: embed_ids(adapter, torch.full_like(ids, int(tid)))  # noqa: E731
    out: dict[str, object] = {
        f"pad {tok.pad_token}": token(tok.pad_token_id),
        f"unk {tok.unk_token} (inseq)": token(tok.unk_token_id),
        f"bos {tok.bos_token}": token(tok.bos_token_id),
        "zero vector": lambda ids, e: torch.zeros_like(e),
        "mean embedding (vocabulary)": lambda ids, e: table.mean(0).expand_as(e).to(e.dtype),
        "blurred embedding (window 5)": lambda ids, e: blurred(e),
    }
    if tok.eos_token_id != tok.pad_token_id:
        out[f"eos {tok.eos_token}"] = token(tok.eos_token_id)
    return out


def ig_scores(adapter, method, ids, target) -> tuple[np.ndarray, float]:
    from streetlamp.models.adapter import Inputs

    e = method.attribute(adapter, Inputs.from_ids(adapter, [ids]), target=target)[0]
    return np.asarray(e.scores, np.float64), float(e.info["relative_completeness_error"])


def expected_gradients(adapter, ids, target, k: int, steps: int, rng) -> np.ndarray:
    """Expected gradients (Erion et al. 2021): IG averaged over baselines drawn from a distribution, here
    an independent uniformly random vocabulary token per position (k draws, ``steps`` nodes each)."""
    total = np.zeros(len(ids))
    for _ in range(k):
        draw = torch.as_tensor(rng.integers(0, adapter.n_outputs, len(ids)))
        m = FixedBaseline(
            lambda ids_, e, d=draw: embed_ids(adapter, d), "random", rule="gauss_legendre", steps=steps, adaptive=False
        )
        total += ig_scores(adapter, m, ids, target)[0]
    return total / k


AOPC = ("aopc_comprehensiveness", "aopc_sufficiency")


def ci(values: list[float]) -> dict:
    mean, low, high, n = bootstrap_ci(np.asarray(values, np.float64))
    return {"mean": mean, "low": low, "high": high, "n": n}


def baseline_summary(per: list[dict], name: str) -> dict:
    out = {k: ci([r["metrics"][name][k] for r in per]) for k in AOPC}
    errs = [r["metrics"][name]["relative_completeness_error"] for r in per]
    out["relative_completeness_error"] = ci([np.nan if e is None else e for e in errs])
    out["top_is_first_word"] = int(sum(r["metrics"][name]["top_is_first"] for r in per))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help=f"how many of the {len(all_prompts())} prompts")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--eg-draws", type=int, default=8)
    ap.add_argument("--out", default="runs/ig-baselines.json")
    args = ap.parse_args()
    import streetlamp

    adapter = streetlamp.load(args.model)
    rng = np.random.default_rng(0)
    bl = baselines(adapter, rng)
    methods = {n: FixedBaseline(f, n, rule="gauss_legendre", steps=args.steps, adaptive=False) for n, f in bl.items()}
    names = [*methods, "expected gradients (random tokens)"]
    removal = Removal.of(adapter, None)
    doc = next(n for n in names if n.startswith("unk"))  # <|endoftext|> on SmolLM2: explain-generation's default
    t0 = time.time()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.with_suffix(".jsonl")
    done = (
        {json.loads(line)["prompt"]: json.loads(line) for line in log.read_text().splitlines()} if log.exists() else {}
    )
    per: list[dict] = []
    for text in all_prompts()[: args.prompts]:
        if text in done:
            per.append(done[text])
            continue
        ids = adapter.encode(text).input_ids[0]
        with torch.no_grad():
            p = torch.softmax(adapter.forward(adapter.encode(text)).logits[0].double(), -1)
        pred = int(p.argmax())
        target = Target(pred, None, "prob")
        scores, cerr = {}, {}
        for n, m in methods.items():
            scores[n], cerr[n] = ig_scores(adapter, m, ids, target)
        scores[names[-1]] = expected_gradients(adapter, ids, target, args.eg_draws, max(4, args.steps // 8), rng)
        special = adapter.special_mask(ids) | removal.protected(len(ids))
        rec: dict = {"prompt": text, "prediction": adapter.output_label(pred), "p": float(p[pred]), "metrics": {}}
        for n in names:
            plan = ErasurePlan.build(ids.tolist(), scores[n], adapter.special_mask(ids), None, removal)
            f = output_prob_of(adapter, plan.rows, None, [pred] * len(plan.rows))
            met, _ = plan.metrics(float(p[pred]), f)
            rec["metrics"][n] = {
                "aopc_comprehensiveness": met["aopc_comprehensiveness"],
                "aopc_sufficiency": met["aopc_sufficiency"],
                "relative_completeness_error": cerr.get(n),
                "top_is_first": bool(np.flatnonzero(~special)[np.argmax(scores[n][~special])] == 0),
                "top": adapter.token_label(
                    adapter.tokenizer.convert_ids_to_tokens(
                        int(ids[np.flatnonzero(~special)[np.argmax(scores[n][~special])]])
                    )
                ),
            }
        keep = ~special
        rec["spearman"] = {
            f"{a}|{b}": float(spearmanr(scores[a][keep], scores[b][keep])[0])
            for a, b in itertools.combinations(names, 2)
        }
        rec["kendall"] = {
            f"{a}|{b}": float(kendalltau(scores[a][keep], scores[b][keep])[0])
            for a, b in itertools.combinations(names, 2)
        }
        per.append(rec)
        with log.open("a") as fh:
            fh.write(json.dumps(rec) + "\n")
        print(f"{time.time() - t0:6.0f}s {text!r} -> {rec['prediction']!r}", flush=True)
    summary = {
        "model": args.model,
        "n_prompts": len(per),
        "ig": f"gauss_legendre, {args.steps} nodes; expected gradients {args.eg_draws} draws x {max(4, args.steps // 8)} nodes",
        "removal": removal.describe(adapter),
        "per_baseline": {n: baseline_summary(per, n) for n in names},
        "difference_from_document_start": {
            n: {k: ci([r["metrics"][n][k] - r["metrics"][doc][k] for r in per]) for k in AOPC}
            for n in names
            if n != doc
        },
        "spearman_mean": {k: float(np.nanmean([r["spearman"][k] for r in per])) for k in per[0]["spearman"]},
        "kendall_mean": {k: float(np.nanmean([r["kendall"][k] for r in per])) for k in per[0]["kendall"]},
        "seconds": round(time.time() - t0, 1),
    }
    out.write_text(json.dumps({"summary": summary, "prompts": per}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
