"""Issue 37's outside anchors on the models that ship here (docs/circuits.md, "Against published numbers").

    PYTHONPATH=src /work/bin/cpu .venv/bin/python benchmarks/bench_circuit_mib.py --prompts 16

* heads ablated in the order of their IOI effect until 80% of the clean logit difference is gone
  (arXiv 2605.08853 Table 1: Qwen2.5-0.5B 1 head, flipping the sign; Pythia-160M 5), under patching and
  mean ablation (``--ablations``; zero too) (:func:`streetlamp.interventions.circuits.heads.head_damage`);
* Sink₁^ε (Gu et al., arXiv 2410.10781; ε = 0.3, 64-token inputs): the share of heads whose mean attention
  to the first token exceeds ε (their LLaMA-style 60M 18%, 1B 45%, Llama-2-7B 92%, Llama-3-8B 99%), on
  64-token windows of the recall prompts (src/streetlamp/data/recall.csv, prompt and answer joined);
  SmolLM2 and the MiniLM encoder (its first token is [CLS]).

* stability at arXiv 2510.00845's bar: the mean pairwise Jaccard of EAP's circuits over 100 bootstrap
  resamples of the prompts (and templates) of the 64-prompt IOI set (GPT-2 small 0.67, Llama-3.2-1B 0.39;
  their bar 0.8).

The MIB-unit CPR/CMD come from the circuit command itself (its printed lines), e.g.
``streetlamp circuit --model smollm2-135m --task ioi --limit 16 --methods eap,eap-ig,eap-gim --paths 0``.
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import torch

from streetlamp.interventions.circuits import tasks as T
from streetlamp.interventions.circuits.blocks import Blocks
from streetlamp.interventions.circuits.heads import first_token_attention, head_damage, sink_share
from streetlamp.models.loading import load

ROOT = Path(__file__).resolve().parents[1]


def windows(adapter, n: int, width: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` windows of ``width`` tokens of the recall prompts' running text (the tokenizer's specials at
    the ends, as its encode adds them)."""
    with open(ROOT / "src/streetlamp/data/recall.csv", newline="") as f:
        text = " ".join(f"{r['text']} {r['label']}." for r in csv.DictReader(f))
    tok = adapter.tokenizer
    body = tok(text, add_special_tokens=False)["input_ids"]
    specials = len(tok("a")["input_ids"]) - len(tok("a", add_special_tokens=False)["input_ids"])
    w = width - specials
    rows = []
    for i in range(n):
        piece = body[(i * w) % max(1, len(body) - w) :][:w]
        if specials == 2:  # an encoder: [CLS] .. [SEP]
            piece = [tok.cls_token_id, *piece, tok.sep_token_id]
        elif specials == 1:  # a BOS
            piece = [tok.bos_token_id, *piece]
        rows.append(piece)
    ids = torch.tensor(rows)
    assert ids.shape[1] == width, ids.shape
    return ids, torch.ones_like(ids)


def sink(name: str, n: int, eps: float) -> None:
    a = load(name)
    ids, am = windows(a, n)
    L = a.n_layers
    from streetlamp.models.adapter import Inputs

    with torch.no_grad():
        fwd = a.forward(Inputs.from_ids(a, ids.tolist()), record=[f"layers.{l}.attn.pattern" for l in range(L)])
    pat = torch.stack([fwd.cache[f"layers.{l}.attn.pattern"] for l in range(L)], 1)  # [b, L, H, q, k]
    first = first_token_attention(pat, am)
    share = sink_share(first, eps)
    no_q0 = first_token_attention(pat[..., 1:, :], am[:, 1:])  # the atlas' sink: queries after the first
    print(
        f"{name}: Sink1^{eps:g} on {n} windows of 64 tokens = {share:.3f} ({int(round(share * first.numel()))} of "
        f"{first.numel()} heads; the atlas' sink column, query 0 left out: {sink_share(no_q0, eps):.3f}); mean "
        f"attention to the first token {float(first.mean()):.3f}, heads above 0.9: {int((first > 0.9).sum())}"
    )


def heads(prompts: int, target: float, ablations: tuple[str, ...] = ("patch", "mean")) -> None:
    a = load("smollm2-135m")
    b = Blocks(a)
    pairs = T.encode_pairs(a, T.ioi(prompts, seed=0))
    for ablation in ablations:
        t0 = time.time()
        r = head_damage(b, pairs, target, ablation)
        print(
            f"smollm2-135m IOI ({prompts} prompts, {ablation} ablation): m(model) {r.m_model:.3f}; heads to "
            f"{target:.0%} damage: {r.count}; to flip the sign: {r.sign_flip}; damage by the top 1..5: "
            f"{', '.join(f'{d:.2f}' for d in r.damage[:5])}; top heads {', '.join(r.heads[:5])} "
            f"(effects {', '.join(f'{e:+.2f}' for e in r.effect[:5])}); {time.time() - t0:.0f} s"
        )


def pairwise_jaccard(masks: list[torch.Tensor]) -> float:
    """Mean Jaccard index over every pair of edge sets (arXiv 2510.00845's stability statistic)."""
    m = torch.stack([x.reshape(-1) for x in masks]).double()  # [n, edges]
    inter = m @ m.T
    sizes = m.sum(1)
    union = sizes[:, None] + sizes[None, :] - inter
    j = torch.where(union > 0, inter / union.clamp(min=1), torch.ones_like(inter))
    iu = torch.triu_indices(len(masks), len(masks), 1)
    return float(j[iu[0], iu[1]].mean())


def stability(prompts: int, n: int) -> None:
    """EAP's circuits re-discovered on ``n`` bootstrap resamples of the prompts (and of the templates):
    each resample's scores are its prompts' per-prompt scores averaged (no forward), its circuit the
    pruned top k; the mean pairwise Jaccard over the resampled circuits at 1%, 5% and 20%. The corrupted-
    inputs axis needs a new EAP pass per resample: one is timed and multiplied by ``n``."""
    from streetlamp.interventions.circuits import faithfulness as F
    from streetlamp.interventions.circuits import scores as S
    from streetlamp.interventions.circuits.resampling import template_resamples
    from streetlamp.stats import resample_indices

    a = load("smollm2-135m")
    b = Blocks(a)
    pairs = T.encode_pairs(a, T.ioi(prompts, seed=0))
    t0 = time.time()
    e = S.eap(b, pairs, batch_size=16)
    t_score = time.time() - t0
    per = e.per_prompt
    E = b.graph.n_edges
    for axis, draws in (
        ("prompts", resample_indices(len(pairs), n, 0)),
        ("templates", template_resamples(pairs.templates, n, 0)),
    ):
        t0 = time.time()
        out = []
        for frac in (0.01, 0.05, 0.2):
            k = F.n_at(frac, E)
            masks = [F.circuit(b.graph, per[torch.as_tensor(i)].mean(0), k) for i in draws]
            out.append(f"{frac:g}: {pairwise_jaccard(masks):.3f}")
        print(
            f"smollm2-135m IOI EAP, {prompts} prompts, {n} resampled {axis}: mean pairwise Jaccard "
            f"{'; '.join(out)} ({time.time() - t0:.0f} s, no forward; the all-prompt EAP pass {t_score:.0f} s)"
        )
    print(
        f"corrupted-inputs axis: one EAP pass per resample ({t_score:.0f} s here) x {n} = about "
        f"{t_score * n / 60:.0f} min for the circuits alone, plus their faithfulness forwards"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--windows", type=int, default=32)
    p.add_argument("--eps", type=float, default=0.3)
    p.add_argument("--target", type=float, default=0.8)
    p.add_argument("--resamples", type=int, default=100)
    p.add_argument("--stability-prompts", type=int, default=64)
    p.add_argument("--skip", default="", help="comma-separated: heads, sink, stability")
    p.add_argument("--ablations", default="patch,mean", help="head damage: comma-separated patch, mean, zero")
    args = p.parse_args()
    print(f"load {open('/proc/loadavg').read().split()[:3]}")
    if "sink" not in args.skip:
        for name in ("smollm2-135m", "minilm-sentiment"):
            sink(name, args.windows, args.eps)
    if "heads" not in args.skip:
        heads(args.prompts, args.target, tuple(args.ablations.split(",")))
    if "stability" not in args.skip:
        stability(args.stability_prompts, args.resamples)


if __name__ == "__main__":
    main()
