"""The atlas' numbers against independent computations (issue 35, item 11 a-c):

* ``kl_explained``, ``kl_mean``, ``dloss``, ``dlogp``: each ablated pair recomputed from the raw Hugging Face
  model (one sequence alone, no padding, the head's slice of ``c_proj``'s input replaced by a plain PyTorch
  pre-hook, none of the atlas' or the engine's code), its log-softmax and the textbook
  ``KL(p || p') = sum_v p_v (log p_v - log p'_v)`` in float64 numpy;
* the streetlight flag from a corpus whose mean effect lies below the floor while its bootstrap upper bound
  provably lies above it (a binomial count, below): the flag must read the bound, not the mean.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from scipy.special import log_softmax

from streetlamp.interventions import atlas_effects as E
from streetlamp.interventions.atlas_stats import STATS
from streetlamp.interventions.atlas_use import summarise
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.tiny import tiny_model

TEXTS = ["the movie was good and the acting was great", "bad film", "john gave a drink to mary"]
# float64 end to end: the batched mid-stack passes and the single full pass differ by summation order only
# (~1e-15 relative on the logits); a KL is a sum over V terms p (log p - log p'), so its error stays far below
TOL = 1e-10


def _ablated_logp(model, ids: list[int], layer: int, head: int, value: torch.Tensor | None) -> np.ndarray:
    """log-softmax ``[n, V]`` (float64) of GPT-2 on ``ids`` alone; with ``value`` ``[n, d_head]`` the head's
    context vector (the input of ``c_proj``, heads side by side) replaced at every position."""
    attn = model.transformer.h[layer].attn
    dh = model.config.n_embd // model.config.n_head

    def pre(_mod, args):
        x = args[0].clone()
        x[0, :, head * dh : (head + 1) * dh] = value.to(x.dtype)
        return (x,)

    hook = attn.c_proj.register_forward_pre_hook(pre) if value is not None else None
    try:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double().numpy()
    finally:
        if hook is not None:
            hook.remove()
    return log_softmax(logits, -1)


def test_exact_effects_equal_a_float64_recomputation_from_the_raw_model() -> None:
    model, tok = tiny_model("gpt2", seed=2, layers=3)
    a = ModelAdapter(model.double(), tok, "tiny-gpt2")
    inp = a.encode(TEXTS)
    assert len(set(inp.lengths)) == 3  # three lengths: the batched passes pad
    clean = E.clean_run(a, inp)
    # a replacement far from the clean context (a random model's mean ablation moves p so little that
    # KL(p || p') and KL(p' || p) agree to third order): seeded noise of 30x the activations' scale
    g = torch.Generator().manual_seed(0)
    repl = {l: 30 * z.abs().mean() * torch.randn(z.shape, generator=g, dtype=z.dtype) for l, z in clean.z.items()}
    pairs = [(b, l, h) for b in range(3) for l, h in ((0, 1), (1, 3), (2, 0), (2, 2))]
    got = E.exact(a, inp, clean, repl, pairs, batch_size=5)
    gaps = {"direction": 0.0, "last_position": 0.0}
    for i, (b, l, h) in enumerate(pairs):
        ids = inp.rows()[b]
        n = len(ids)
        lp = _ablated_logp(model, ids, l, h, None)  # clean
        lq = _ablated_logp(model, ids, l, h, repl[l][b, :n, h])  # ablated
        p, q = np.exp(lp), np.exp(lq)
        kl = (p * (lp - lq)).sum(-1)  # KL(p || p') at every position
        y = int(np.argmax(lp[n - 1]))
        nxt = np.array(ids[1:])
        d_ce = -lq[np.arange(n - 1), nxt] + lp[np.arange(n - 1), nxt]
        want = {
            "kl_explained": kl[n - 1],
            "dlogp": lq[n - 1, y] - lp[n - 1, y],
            "dprob": q[n - 1, y] - p[n - 1, y],
            "kl_mean": kl[: n - 1].mean(),  # the next-token predictions 0..n-2: position n-1 predicts nothing
            "dloss": d_ce.mean(),
        }
        for k, v in want.items():
            assert abs(got[k][i] - v) < TOL, (k, b, l, h, got[k][i], v)
        # what the two realistic bugs would read instead, each far from the right value
        gaps["direction"] = max(gaps["direction"], abs((q[n - 1] * (lq[n - 1] - lp[n - 1])).sum() - kl[n - 1]))
        gaps["last_position"] = max(gaps["last_position"], abs(kl[:n].mean() - kl[: n - 1].mean()))
    assert min(gaps.values()) > 1e4 * TOL, gaps


def _rows(head: int, kls: np.ndarray, prominence: float) -> list[dict]:
    return [
        {
            "layer": 0,
            "head": head,
            "sequence": s,
            **{k: 0.2 for k in STATS},
            "prominence": prominence,
            "kl_explained": kl,
            "dlogp": -kl,
            "dlogp_est": -kl,
            "dla": 0.0,
            "kl_mean": kl,
            "dloss": kl,
            "audit": "all",
            "exact": True,
        }
        for s, kl in enumerate(kls)
    ]


def test_streetlight_reads_the_upper_bound_not_the_mean() -> None:
    """Head 0: striking (prominence 0.9) and 9 of 10 sequences at KL 0, one at 9e-3: mean 0.9e-3, below the
    floor 1e-3. A bootstrap resample holds that sequence at least twice with probability
    1 - 0.9^10 - 10 * 0.1 * 0.9^9 = 0.264 > 0.025, so the 97.5th percentile of the resample means is at
    least 2 * 0.9e-3 = 1.8e-3 > floor: the effect cannot be told from the floor, not a streetlight.
    Head 1: striking, every KL 0.5e-3 (interval = mean = 0.5e-3 < floor): a streetlight.
    Head 2: every KL 0.5e-3 but prominence 0.2 (< striking): not one."""
    floor, striking = 1e-3, 0.5
    one = np.zeros(10)
    one[3] = 9e-3
    t = pd.DataFrame(_rows(0, one, 0.9) + _rows(1, np.full(10, 0.5e-3), 0.9) + _rows(2, np.full(10, 0.5e-3), 0.2))
    s = summarise(t, floor=floor, striking=striking, n_boot=2000, seed=0)
    assert abs(s.effect[0] - 0.9e-3) < 1e-15 and abs(s.effect[1] - 0.5e-3) < 1e-15
    p2 = 1 - 0.9**10 - 10 * 0.1 * 0.9**9
    assert p2 > 0.25
    assert s.effect_high[0] >= 1.8e-3 - 1e-15 > floor  # the bound the analysis above proves
    assert s.streetlight.tolist() == [False, True, False]
