"""GradDrop's rescue of a cancelling edge (AtP*, Kramár et al. 2024), on a GPT-2 planted by hand.

The edge ``embed -> L0.MLP`` carries the behaviour through two routes whose gradients cancel at the clean
run: ``L0.MLP`` writes ``u`` (the token's signal), the logits read ``a·u`` directly, and ``L1.MLP`` writes
``-(a/s)·GELU(s(u - t))``, whose slope at the clean ``u = 1`` is ``-a`` (GELU in its linear regime) but which
is off at the corrupted ``u = 0``. So ``∂m/∂u = a - a = 0`` and EAP scores the edge 0, while patching it
moves the metric by ``-a·t`` (the saturating route does not cancel a finite change). GradDrop's pass with
layer 1's gradient dropped keeps the direct route alone and scores it ``a``.

Layout (d = 16): dimension 0 holds a constant ``B`` at every position (the position embedding), and every
signal is written as a pair ``(+v, -v)`` on two dimensions, so it has zero mean and no covariance with the
constant: each LayerNorm is the affine map ``(x - μ)/σ₀`` to second order in the signals (``~ v²/B²``), and
each projection reads a pair's difference times ``σ₀/2``. Pairs: ``P1`` the token (1 for the clean words,
0 for the corrupted ones), ``P2`` L0.MLP's ``u``, ``P3`` L1.MLP's output, ``P4`` head L0.H0's output
(a distractor route with effect 1: uniform attention over ``[BOS] w``, value ``P1``, output ``2·mean``).
The answer's logit reads ``a·P2 + P3 + P4``; the wrong answer's reads nothing.

Known effects of exact patching (``m(edge ablated) - m(clean)``): ``L0.MLP -> logits`` −a = −4,
``embed -> L0.MLP`` −a·t = −2, ``L0.MLP -> L1.MLP`` +a(1 − t) = +2, ``L1.MLP -> logits`` +2,
``embed -> L0.H0 (v)`` and ``L0.H0 -> logits`` −1, every other edge 0.
"""

from __future__ import annotations

import math

import torch

from streetlamp.groundtruth import circuits as C
from streetlamp.interventions.circuits import corrections as X
from streetlamp.interventions.circuits import faithfulness as F
from streetlamp.interventions.circuits import scores as S
from streetlamp.interventions.circuits.blocks import Blocks
from streetlamp.interventions.circuits.tasks import TaskPair, encode_pairs

D, B_CONST, A, S_SLOPE, T_KINK, K_LIN = 16, 1e5, 4.0, 20.0, 0.5, 10.0
# LayerNorm's deviation from its affine map is second order in (signal / σ₀), σ₀ = B·√(d − 1)/d ≈ 2.4e4; the
# signals are at most a = 4: every comparison with the construction allows 100 times that (≈ 3e-6)
TOL = 100 * (A / (B_CONST * math.sqrt(D - 1) / D)) ** 2
P1, P2, P3, P4 = (1, 2), (3, 4), (5, 6), (7, 8)
CLEAN, CORRUPT = ("w1", "w5"), ("w2", "w6")
ANSWER, WRONG = "w3", "w4"
EDGES = {  # (source, target, input): exact effect
    ("L0.MLP", "logits", "logits"): -A,
    ("embed", "L0.MLP", "mlp"): -A * T_KINK,
    ("L0.MLP", "L1.MLP", "mlp"): A * (1 - T_KINK),
    ("L1.MLP", "logits", "logits"): A * (1 - T_KINK),
    ("embed", "L0.H0", "v"): -1.0,
    ("L0.H0", "logits", "logits"): -1.0,
}


def _model():
    from transformers import GPT2LMHeadModel

    tok = C.tokenizer()
    vocab = tok.get_vocab()
    cfg = C.gpt2_config(D, 2, 2, len(vocab), n_inner=4)
    cfg.tie_word_embeddings = False
    model = GPT2LMHeadModel(cfg).double().eval()
    sig = B_CONST * math.sqrt(D - 1) / D  # the LayerNorm's σ of the constant B·e0 (eps 1e-5 below, added)
    sig = math.sqrt(sig**2 + cfg.layer_norm_epsilon)

    def read(w: torch.Tensor, pair: tuple[int, int], col: int, scale: float) -> None:  # w[:, col] reads scale·v
        w[pair[0], col] += scale * sig / 2
        w[pair[1], col] -= scale * sig / 2

    def write(w: torch.Tensor, row: int, pair: tuple[int, int], scale: float) -> None:  # w[row] writes scale on pair
        w[row, pair[0]] += scale
        w[row, pair[1]] -= scale

    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        base = model.transformer
        for mod in [*(b.ln_1 for b in base.h), *(b.ln_2 for b in base.h), base.ln_f]:
            mod.weight.fill_(1.0)
        base.wpe.weight[:, 0] = B_CONST
        for w in CLEAN:
            base.wte.weight[vocab[w], P1[0]], base.wte.weight[vocab[w], P1[1]] = 1.0, -1.0
        h0 = base.h[0]
        read(h0.attn.c_attn.weight, P1, 2 * D, 1.0)  # head 0's value, first slot (q, k zero: uniform attention)
        write(h0.attn.c_proj.weight, 0, P4, 2.0)
        read(h0.mlp.c_fc.weight, P1, 0, 1.0)  # L0.MLP: u = GELU(v + K) - K = v (linear regime)
        h0.mlp.c_fc.bias[0] = K_LIN
        write(h0.mlp.c_proj.weight, 0, P2, 1.0)
        h0.mlp.c_proj.bias[P2[0]], h0.mlp.c_proj.bias[P2[1]] = -K_LIN, K_LIN
        h1 = base.h[1]
        read(h1.mlp.c_fc.weight, P2, 0, S_SLOPE)  # L1.MLP: -(a/s) GELU(s (u - t))
        h1.mlp.c_fc.bias[0] = -S_SLOPE * T_KINK
        write(h1.mlp.c_proj.weight, 0, P3, -A / S_SLOPE)
        head = torch.zeros(D, len(vocab), dtype=torch.float64)
        read(head, P2, vocab[ANSWER], A)
        read(head, P3, vocab[ANSWER], 1.0)
        read(head, P4, vocab[ANSWER], 1.0)
        model.lm_head.weight.copy_(head.T)
    model.set_attn_implementation("eager")
    return model, tok


def _planted():
    from streetlamp.models.adapter import ModelAdapter

    model, tok = _model()
    a = ModelAdapter(model, tok, "planted-cancel")
    pairs = [TaskPair(c, k, " " + ANSWER, " " + WRONG) for c, k in zip(CLEAN, CORRUPT)]
    return a, Blocks(a), encode_pairs(a, pairs)


def _named(g, scores: torch.Tensor) -> dict[tuple[str, str, str], float]:
    r, w = g.edge_index()
    v = scores.detach().double().numpy()[r, w]
    return dict(zip(g.edge_names(), v.tolist()))


def test_graddrop_rescues_the_cancelling_edge_that_eap_misses() -> None:
    a, b, pairs = _planted()
    g = b.graph
    ex = _named(g, S.exact(b, pairs).mean)
    for e, want in EDGES.items():  # exact patching = the construction's effects (LayerNorm's v²/B² aside)
        assert abs(ex[e] - want) < TOL, (e, ex[e], want)
    others = [abs(v) for e, v in ex.items() if e not in EDGES]
    assert max(others) < TOL and len(others) > 30
    cancel = ("embed", "L0.MLP", "mlp")
    eap = _named(g, S.eap(b, pairs).mean)
    # EAP: the two routes' gradients cancel, so the edge scores ~0 against an exact effect of -2, below the
    # distractor head's edges (exact -1): the one first-order failure of the graph
    assert abs(eap[cancel]) < TOL and abs(ex[cancel]) > 1e5 * TOL
    assert min(abs(eap[("embed", "L0.H0", "v")]), abs(eap[("L0.H0", "logits", "logits")])) > 0.99
    for e in EDGES:
        if e != cancel:  # every other known edge EAP gets right (a cancelling gradient is the only miss)
            want = EDGES[e] if e != ("L0.MLP", "L1.MLP", "mlp") else A  # this one is linearised: a, not a(1 - t)
            assert abs(eap[e] - want) < TOL, (e, eap[e])
    # GradDrop: dropping layer 1's gradient leaves the direct route, a·δ = -a; dropping layer 0's, nothing
    gd0, gd1 = (_named(g, s.mean) for s in X.graddrop(b, pairs, per_layer=True))
    assert abs(gd0[cancel]) < TOL and abs(gd1[cancel] + A) < TOL
    gd = _named(g, X.graddrop(b, pairs).mean)
    assert abs(gd[cancel] - A) < TOL
    # the circuits at k = 4 (exact's four largest): GradDrop's is exact's; EAP's misses the input edge, so
    # pruning drops the whole L0.MLP route (nothing joins it to the embeddings)
    k = 4
    truth = F.circuit(g, S.exact(b, pairs).mean, k)
    r, w = g.edge_index()
    names = {e for e, i, j in zip(g.edge_names(), r, w) if truth[i, j]}
    assert names == {e for e in EDGES if abs(EDGES[e]) >= 2}
    found_gd = F.circuit(g, X.graddrop(b, pairs).mean, k)
    found_eap = F.circuit(g, S.eap(b, pairs).mean, k)
    assert F.precision_recall(found_gd, truth) == (1.0, 1.0)
    top_eap = F.top_k(g, S.eap(b, pairs).mean, k)  # the head's input edge in place of the cancelling one
    assert bool(top_eap[g.reader_index("L0.H0", "v"), 0]) and not bool(top_eap[g.reader_index("L0.MLP", "mlp"), 0])
    assert int(found_eap.sum()) == 0 and F.precision_recall(found_eap, truth)[1] == 0.0
    # the audit over every edge says so: EAP misranks pairs (the cancelling edge against the head's edges),
    # and its largest error is 2 (the cancelling edge's, and the linearised L0.MLP -> L1.MLP's)
    au = S.audit(b, pairs, S.eap(b, pairs), n_edges=g.n_edges)
    assert au["misranked_share"] > 0 and abs(au["max_abs_error"] - A * T_KINK) < TOL
