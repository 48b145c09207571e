"""Compare streetlamp's integrated gradients with inseq's on a tiny GPT-2 (forced continuation, the
probability of each generated token, inseq's baseline: the unk token). Run with inseq importable, e.g.

    pip install --no-deps --target .inseq-venv inseq==0.7.1 "typeguard<=2.13.3" jaxtyping wadler-lindig treescope
    PYTHONPATH=.inseq-venv:src python scripts/compare_inseq.py
"""

from __future__ import annotations

import numpy as np


def compare(steps: int = 256) -> tuple[np.ndarray, np.ndarray]:
    import inseq

    from streetlamp.methods.ig import IntegratedGradients
    from streetlamp.models.adapter import ModelAdapter, Target
    from streetlamp.models.tiny import tiny_model

    model, tok = tiny_model("gpt2", seed=2)
    model = model.double().eval()
    prompt = "the movie was not good"
    peer, _ = tiny_model("gpt2", seed=2)  # a separate copy with Hugging Face's own attention (the adapter
    peer.set_attn_implementation("eager")  # registers streetlamp's attention function on its model)
    m = inseq.load_model(peer.double().eval(), "integrated_gradients", tokenizer=tok)
    a = ModelAdapter(model, tok, "tiny-gpt2")
    ids = a.encode(prompt).input_ids[0]
    gen = a.generate(ids, 3)
    text = prompt + " " + " ".join(tok.convert_ids_to_tokens(gen))
    out = m.attribute(prompt, text, n_steps=steps, internal_batch_size=steps, show_progress=False)
    theirs = out.sequence_attributions[0].target_attributions.sum(-1).double().numpy()  # [pos, target]
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


if __name__ == "__main__":
    am, at = compare_attention()
    ok = ~np.isnan(am) & ~np.isnan(at)
    print("attention: max |difference| =", float(np.abs(am[ok] - at[ok]).max()), "over", int(ok.sum()), "weights")
    mine, theirs = compare()
    ok = ~np.isnan(mine) & ~np.isnan(theirs)
    print("streetlamp IG [pos, target]:\n", np.round(mine, 5))
    print("inseq IG [pos, target]:\n", np.round(theirs, 5))
    print(
        "max |difference| =", float(np.abs(mine[ok] - theirs[ok]).max()), "of max |IG|", float(np.abs(theirs[ok]).max())
    )
