"""A quick ReLU transcoder per chosen layer of SmolLM2-135M, fitted in minutes on CPU (issue 38's findings need a
dictionary before ``features-fit`` ships one). Plain torch, no trainer of streetlamp's.

Data: the first texts of the shipped ``movies`` and ``tweets`` corpora, each cut to ``--max-tokens`` tokens;
the MLP's input (the post-attention norm's output) and output at every real token (the first token dropped:
SmolLM2 has no BOS here, but the first position is the attention sink with outsized activations). Loss:
``|mlp_out - recon|^2 / |mlp_out - mean|^2`` (the fraction of variance unexplained) ``+ l1 * mean_tok sum_f
a_f |W_dec[f]| / sqrt(variance)``; Adam, decoder rows renormalised to unit norm after each step is *not* done (the penalty
weights by the norm instead, as Anthropic's 2024 update). Held-out: the last 10% of tokens. Prints FVU and L0
per layer and writes streetlamp's format (``save_features``) to ``OUT``.

    /work/bin/cpu .venv/bin/python scripts/fit_quick_transcoders.py OUT --layers 10,20 --width 1024
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from streetlamp.commands.heads.run import load_texts
from streetlamp.models.dictionaries import save_features
from streetlamp.models.features import Dictionary, FeatureSet
from streetlamp.models.loading import load
from streetlamp.models.sites import submodule


def collect(adapter, texts: list[str], layers: list[int], max_tokens: int, batch: int = 16):
    xs: dict[int, list[torch.Tensor]] = {l: [] for l in layers}
    ys: dict[int, list[torch.Tensor]] = {l: [] for l in layers}
    stash: dict[int, torch.Tensor] = {}
    hooks = []
    for l in layers:
        mlp = submodule(adapter.layer_modules[l], adapter.family.mlp)
        hooks.append(mlp.register_forward_pre_hook(lambda m, a, l=l: stash.__setitem__(l, a[0])))
        hooks.append(mlp.register_forward_hook(lambda m, a, o, l=l: stash.__setitem__(-l - 1, o)))
    try:
        for i in range(0, len(texts), batch):
            enc = adapter.encode(texts[i : i + batch])
            ids, am = enc.input_ids[:, :max_tokens], enc.attention_mask[:, :max_tokens]
            mask = am.bool().clone()
            mask[:, 0] = False
            with torch.no_grad():
                adapter.hf_model(input_ids=ids, attention_mask=am, use_cache=False)
            for l in layers:
                xs[l].append(stash[l][mask].float())
                ys[l].append(stash[-l - 1][mask].float())
    finally:
        for h in hooks:
            h.remove()
    return {l: torch.cat(xs[l]) for l in layers}, {l: torch.cat(ys[l]) for l in layers}


def fit(x: torch.Tensor, y: torch.Tensor, width: int, l1: float, steps: int, batch: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    n, d = x.shape
    cut = int(0.9 * n)
    perm = torch.randperm(n, generator=g)
    tr, te = perm[:cut], perm[cut:]
    W_enc = (torch.randn(d, width, generator=g) / d**0.5).requires_grad_()
    b_enc = torch.zeros(width, requires_grad=True)
    W_dec = (W_enc.detach().T.clone() * 0.1).requires_grad_()
    b_dec = y[tr].mean(0).clone().requires_grad_()
    opt = torch.optim.Adam([W_enc, b_enc, W_dec, b_dec], lr=1e-3)
    var = (y[tr] - y[tr].mean(0)).pow(2).sum(-1).mean()
    for step in range(steps):
        idx = tr[torch.randint(0, cut, (batch,), generator=g)]
        a = torch.relu(x[idx] @ W_enc + b_enc)
        rec = a @ W_dec + b_dec
        fvu = (y[idx] - rec).pow(2).sum(-1).mean() / var
        loss = fvu + l1 * (a * W_dec.norm(dim=1)).sum(-1).mean() / var.sqrt()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 500 == 0:
            print(f"  step {step}: fvu {float(fvu):.3f} L0 {float((a > 0).float().sum(-1).mean()):.1f}", flush=True)
    with torch.no_grad():
        a = torch.relu(x[te] @ W_enc + b_enc)
        rec = a @ W_dec + b_dec
        vte = (y[te] - y[te].mean(0)).pow(2).sum(-1).mean()
        stats = {
            "fvu_heldout": float((y[te] - rec).pow(2).sum(-1).mean() / vte),
            "l0_heldout": float((a > 0).float().sum(-1).mean()),
            "dead_share": float(((a > 0).sum(0) == 0).float().mean()),
            "tokens_train": cut,
            "tokens_heldout": n - cut,
        }
    return (W_enc.detach(), b_enc.detach(), W_dec.detach(), b_dec.detach()), stats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", default="10,20")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--texts", type=int, default=250, help="texts of each corpus")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--l1", type=float, default=0.03)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    layers = [int(v) for v in args.layers.split(",")]
    t0 = time.time()
    adapter = load("smollm2-135m")
    texts = load_texts("movies")[0][: args.texts] + load_texts("tweets")[0][: args.texts]
    xs, ys = collect(adapter, texts, layers, args.max_tokens)
    print(f"collected {len(xs[layers[0]])} tokens from {len(texts)} texts in {time.time() - t0:.0f}s", flush=True)
    dicts, info = {}, {}
    for l in layers:
        t1 = time.time()
        (We, be, Wd, bd), st = fit(xs[l], ys[l], args.width, args.l1, args.steps, args.batch, args.seed + l)
        st["seconds"] = round(time.time() - t1, 1)
        print(f"layer {l}: {json.dumps(st)}", flush=True)
        dicts[(l, "mlp")] = Dictionary(l, "mlp", We, be, Wd, bd)
        info[str(l)] = st
    fs = FeatureSet(dicts, source=args.out, model="smollm2-135m", info={"fit": vars(args), "heldout": info})
    save_features(fs, args.out)
    print(f"wrote {args.out} in {time.time() - t0:.0f}s total", flush=True)


if __name__ == "__main__":
    main()
