"""Compare streetlamp's integrated gradients and attention with inseq's on a tiny GPT-2 and on SmolLM2
(forced continuation, the probability of each generated token, inseq's baseline: the unk token). inseq
lives in its own folder (``make setup`` installs it there; its pins would break the main environment):

    pip install --no-deps --target .inseq-venv inseq==0.7.1 "typeguard<=2.13.3" jaxtyping wadler-lindig treescope
    PYTHONPATH=.inseq-venv:src python scripts/compare_inseq.py            # tiny GPT-2, printed
    PYTHONPATH=.inseq-venv:src python scripts/compare_inseq.py --smollm2  # SmolLM2-135M (float64)
    ... --json                                                            # one JSON line (tests/runners/test_generation_inseq.py)
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def compare(steps: int = 256) -> tuple[np.ndarray, np.ndarray]:
    from streetlamp.models.adapter import ModelAdapter
    from streetlamp.models.tiny import tiny_model

    model, tok = tiny_model("gpt2", seed=2)
    model = model.double().eval()
    prompt = "the movie was not good"
    peer, _ = tiny_model("gpt2", seed=2)  # a separate copy with Hugging Face's own attention (the adapter
    peer.set_attn_implementation("eager")  # registers streetlamp's attention function on its model)
    a = ModelAdapter(model, tok, "tiny-gpt2")
    ids = a.encode(prompt).input_ids[0]
    gen = a.generate(ids, 3)
    text = prompt + " " + " ".join(tok.convert_ids_to_tokens(gen))
    return ig_pair(a, peer.double().eval(), prompt, text, gen, steps)


def ig_pair(a, peer, prompt: str, text: str, gen: list[int], steps: int) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    """IG ``[position, generated token]`` of each generated token's probability: streetlamp's (adapter ``a``)
    and inseq's (on ``peer``, a copy of the model with Hugging Face's attention), Gauss-Legendre ``steps``
    nodes, the unk baseline on both sides."""
    import inseq

    from streetlamp.methods.ig import IntegratedGradients
    from streetlamp.models.adapter import Target

    m = inseq.load_model(peer, "integrated_gradients", tokenizer=a.tokenizer)
    out = m.attribute(prompt, text, n_steps=steps, internal_batch_size=steps, show_progress=False)
    theirs = out.sequence_attributions[0].target_attributions.double().sum(-1).numpy()  # [pos, target]
    ig = IntegratedGradients(baseline="unk", rule="gauss_legendre", steps=steps, adaptive=False)
    ours = ig.attribute_sequence(a, prompt, gen, target=Target(quantity="prob"))
    mine = np.full_like(theirs, np.nan)
    for j, e in enumerate(ours):
        mine[: len(e.scores), j] = e.scores
    return mine, theirs


def compare_attention() -> tuple[np.ndarray, np.ndarray]:
    """Attention weights ``[position, generated token, layer, head]`` from the query that predicts each
    generated token: inseq's ``attention`` method against streetlamp's per-prefix ``attention`` method
    (``view="head"``, every layer and head), tiny GPT-2, forced continuation."""
    import inseq

    from streetlamp.methods.attention import Attention
    from streetlamp.models.adapter import Inputs, ModelAdapter, Target
    from streetlamp.models.tiny import tiny_model

    model, tok = tiny_model("gpt2", seed=2)
    model = model.double().eval()
    prompt = "the movie was not good"
    a = ModelAdapter(model, tok, "tiny-gpt2")
    ids = a.encode(prompt).input_ids[0]
    gen = a.generate(ids, 3)
    text = prompt + " " + " ".join(tok.convert_ids_to_tokens(gen))
    peer, _ = tiny_model("gpt2", seed=2)  # a separate copy with Hugging Face's own attention
    peer.set_attn_implementation("eager")
    m = inseq.load_model(peer.double().eval(), "attention", tokenizer=tok)
    theirs = m.attribute(prompt, text, show_progress=False).sequence_attributions[0].target_attributions
    theirs = theirs.double().numpy()  # [pos, target, layer, head]
    full = [*ids.tolist(), *gen]
    mine = np.full_like(theirs, np.nan)
    for j in range(len(gen)):
        pre = Inputs.from_ids(a, [full[: len(ids) + j]])
        for l in range(a.n_layers):
            for h in range(a.n_heads):
                e = Attention(view="head", layer=l, head=h).attribute(a, pre, target=Target(full[len(ids) + j]))[0]
                mine[: len(e.scores), j, l, h] = e.scores
    return mine, theirs


def compare_smollm2(steps: int = 32, n_new: int = 2, prompt: str = "The capital of France is") -> dict:
    """SmolLM2-135M in float64: inseq's IG (Gauss-Legendre, ``steps`` nodes, unk baseline = ``<|endoftext|>``)
    and ``attention`` against streetlamp's, on a greedy ``n_new``-token continuation. streetlamp's
    attention rows come from one recorded forward of the whole sequence (row ``q`` of a causal model is the
    prefix's last row); inseq runs its own copy of the model with Hugging Face's eager attention."""
    import copy

    import inseq

    import streetlamp
    from streetlamp.models.adapter import Inputs, ModelAdapter

    base = streetlamp.load("smollm2-135m")
    model, tok = base.hf_model.double().eval(), base.tokenizer
    peer = copy.deepcopy(model)
    peer.set_attn_implementation("eager")
    a = ModelAdapter(model, tok, "smollm2-135m")
    ids = a.encode(prompt).input_ids[0]
    gen = a.generate(ids, n_new)
    text = tok.decode([*ids.tolist(), *gen])
    m = inseq.load_model(peer, "attention", tokenizer=tok)
    att = m.attribute(prompt, text, show_progress=False).sequence_attributions[0].target_attributions
    theirs_att = att.double().numpy()  # [pos, target, layer, head]
    full = Inputs.from_ids(a, [[*ids.tolist(), *gen]])
    names = [f"layers.{layer}.attn.pattern" for layer in range(a.n_layers)]
    with torch_no_grad():
        cache = a.forward(full, record=names).cache
    mine_att = np.full_like(theirs_att, np.nan)
    for j in range(n_new):
        q = len(ids) + j - 1
        for layer, name in enumerate(names):
            mine_att[: q + 1, j, layer, :] = cache[name][0, :, q, : q + 1].double().cpu().numpy().T
    mine_ig, theirs_ig = ig_pair(a, peer, prompt, text, gen, steps)
    return {
        "prompt": prompt,
        "continuation": tok.convert_ids_to_tokens(gen),
        "attention": _diff(mine_att, theirs_att),
        "ig": _diff(mine_ig, theirs_ig),
        "ig_steps": steps,
    }


def torch_no_grad():  # type: ignore[no-untyped-def]
    import torch

    return torch.no_grad()


def _diff(mine: np.ndarray, theirs: np.ndarray) -> dict:
    """Largest difference over the entries both have, and whether both have the same entries."""
    ok = ~np.isnan(mine) & ~np.isnan(theirs)
    return {
        "max_abs_diff": float(np.abs(mine[ok] - theirs[ok]).max()),
        "max_abs": float(np.abs(theirs[ok]).max()),
        "n": int(ok.sum()),
        "same_entries": bool(np.array_equal(~np.isnan(mine), ~np.isnan(theirs))),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smollm2", action="store_true", help="compare on SmolLM2-135M instead of the tiny GPT-2")
    p.add_argument("--steps", type=int, default=None, help="IG nodes (tiny: 256, SmolLM2: 32)")
    p.add_argument("--json", action="store_true", help="print one JSON line of differences")
    args = p.parse_args(argv)
    if args.smollm2:
        res = compare_smollm2(steps=args.steps or 32)
    else:
        am, at = compare_attention()
        mine, theirs = compare(steps=args.steps or 256)
        res = {"attention": _diff(am, at), "ig": _diff(mine, theirs), "ig_steps": args.steps or 256}
        if not args.json:
            print("streetlamp IG [pos, target]:\n", np.round(mine, 5))
            print("inseq IG [pos, target]:\n", np.round(theirs, 5))
    if args.json:
        print(json.dumps(res))
        return
    for k in ("attention", "ig"):
        d = res[k]
        print(
            f"{k}: max |difference| = {d['max_abs_diff']:.3g} of max |value| {d['max_abs']:.3g} over {d['n']} entries"
        )


if __name__ == "__main__":
    sys.exit(main())
