"""From a token-to-token attribution matrix to a component path (``commands/circuit/paths.py``), checked
on a tiny float64 GPT-2 (3 layers, 4 heads) against a hand computation: every token path
``t = j_0 -> j_1 -> ... -> j_L = p`` enumerated with explicit loops, its weight the product of the
per-layer steps (the sender's and receiver's head parts at their layers, the whole layer matrix
elsewhere), from attention read off Hugging Face's own ``output_attentions`` (rollout), the ``alti``
and ``norm`` methods' arrays (ALTI) and the ``attention_attribution`` arrays. Conservation: at every
layer the heads' flows plus the residual's equal the ``rollout`` method's matrix row.

The methods store their arrays in float32 (the explanation's dtype), so the routes carry float32
rounding (2^-24 relative per entry) through products of at most 3 layers and sums of 8 tokens:
ROUND = 1e-6 is far above that and far below the flows compared (asserted > 1e-3)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from streetlamp.commands.circuit import paths as P
from streetlamp.interventions.circuits.graph import Graph
from streetlamp.methods.registry import get_method
from streetlamp.models.adapter import ModelAdapter, Target
from streetlamp.models.tiny import tiny_model

TEXT = "when mary and john went to the store"
ROUND = 1e-6


@pytest.fixture(scope="module")
def gpt2() -> tuple[ModelAdapter, object]:
    model, tok = tiny_model("gpt2", seed=2, layers=3, attn_implementation="eager")
    a = ModelAdapter(model.double(), tok, "tiny-gpt2")
    return a, a.encode(TEXT)


def enumerate_flow(steps: list, p: int, source: np.ndarray) -> float:
    """Σ over token paths ending at p of 1_D[j_0] Π_l steps[l][j_l, j_{l-1}] (plain loops)."""
    L, n = len(steps), steps[0].shape[0]
    total = 0.0
    for seq in itertools.product(range(n), repeat=L):  # j_0 .. j_{L-1}
        js = list(seq) + [p]
        w = source[js[0]]
        for l in range(L):
            w *= steps[l][js[l + 1], js[l]]
        total += w
    return total


def hand_rollout(a: ModelAdapter, one) -> tuple[np.ndarray, np.ndarray]:
    """Â_l and the head parts 0.5·A_h/(H·Z), from Hugging Face's attention."""
    with torch.no_grad():
        att = a.hf_model(one.input_ids, output_attentions=True).attentions
    A = np.stack([x[0].numpy() for x in att])  # [L, H, n, n]
    H, n = A.shape[1], A.shape[-1]
    raw = 0.5 * A.mean(1) + 0.5 * np.eye(n)
    z = raw.sum(-1, keepdims=True)
    return raw / z, 0.5 * A / (H * z[:, None])


def check_against_enumeration(
    r: P.Routes, C: np.ndarray, parts: np.ndarray, p: int, src: np.ndarray, tol: float = ROUND
) -> float:
    logits, heads = P.path_scores(r, p, src)
    L, H = logits.shape
    biggest = 0.0
    for l in range(L):
        for h in range(H):
            want = enumerate_flow([parts[x, h] if x == l else C[x] for x in range(L)], p, src)
            assert logits[l, h] == pytest.approx(want, abs=tol)
            biggest = max(biggest, abs(want))
    for l1, l2 in [(0, 1), (0, 2), (1, 2)]:
        for h1, h2 in [(0, 3), (2, 1), (3, 3)]:
            steps = [parts[x, h1] if x == l1 else parts[x, h2] if x == l2 else C[x] for x in range(L)]
            want = enumerate_flow(steps, p, src)
            assert heads[l1, h1, l2, h2] == pytest.approx(want, abs=tol)
            biggest = max(biggest, abs(want))
    assert np.all(heads[1:, :, 0] == 0) and np.all(heads[2, :, 1] == 0)  # no path runs backwards
    return biggest


def test_rollout_paths_are_the_enumerated_flows(gpt2) -> None:
    a, one = gpt2
    n = one.lengths[0]
    p, src = n - 1, np.zeros(n)
    src[[1, 3]] = 1  # the source tokens: "mary", "john"
    C, parts = hand_rollout(a, one)
    r = P.routes(a, "rollout", one, Target(), steps=1)
    np.testing.assert_allclose(r.C, C, atol=ROUND, rtol=0)
    np.testing.assert_allclose(r.P, parts, atol=ROUND, rtol=0)
    assert check_against_enumeration(r, C, parts, p, src) > 1e-3
    # conservation: at each layer, the heads' flows plus the residual's are the rollout row (registry method)
    R = get_method("rollout").attribute(a, one, target=Target())[0].arrays["matrix"].astype(np.float64)
    logits, _ = P.path_scores(r, p, src)
    for l in range(a.n_layers):
        resid = enumerate_flow([C[x] - parts[x].sum(0) if x == l else C[x] for x in range(a.n_layers)], p, src)
        assert logits[l].sum() + resid == pytest.approx(R[p] @ src, abs=ROUND)
        assert logits[l].sum() > 0.1


def test_alti_paths_split_its_contributions_by_head_norms(gpt2) -> None:
    a, one = gpt2
    n = one.lengths[0]
    p, src = n - 1, np.zeros(n)
    src[3] = 1
    c = get_method("alti").attribute(a, one, target=Target())[0].arrays["contributions"].astype(np.float64)
    nh = get_method("norm", per_head=True).attribute(a, one, target=Target())[0].arrays["norm_heads"]
    r = P.routes(a, "alti", one, Target(), steps=1)
    off = ~np.eye(n, dtype=bool)
    # off the diagonal the heads' parts add up to ALTI's contribution, in the ratio of their norms
    np.testing.assert_allclose(r.P.sum(1)[:, off], c[:, off], atol=ROUND, rtol=0)
    i, j = 5, 3
    for l in range(a.n_layers):
        want = c[l, i, j] * nh[l, :, i, j] / nh[l, :, i, j].sum()
        np.testing.assert_allclose(r.P[l, :, i, j], want, atol=1e-6 * c[l, i, j], rtol=0)
    assert np.all(r.P[:, :, ~off] == 0)  # the diagonal is the residual's
    # the same float64 arrays on both sides, summed in another order: 1e-12 relative to the flows, which
    # are small here (the random model's ALTI gives the residual ~98% of every row) but far above it
    biggest = float(np.abs(P.path_scores(r, p, src)[0]).max())
    assert check_against_enumeration(r, c, r.P, p, src, tol=1e-12 * biggest) > 1e-6


def test_attention_attribution_chains_routes_at_the_shared_position(gpt2) -> None:
    a, one = gpt2
    n = one.lengths[0]
    p, src = n - 1, np.zeros(n)
    src[[1, 3]] = 1
    t = Target(index=5, contrast=7, quantity="logit")
    r = P.routes(a, "attention_attribution", one, t, steps=3)
    assert r.C is None
    attr = get_method("attention_attribution", steps=3).attribute(a, one, target=t)[0].arrays["attention_attribution"]
    pos = np.clip(attr.astype(np.float64), 0, None)
    logits, heads = P.path_scores(r, p, src)
    for l in range(a.n_layers):
        for h in range(a.n_heads):
            assert logits[l, h] == pytest.approx(sum(pos[l, h, p, j] for j in (1, 3)), abs=ROUND)
    eye, biggest = np.eye(n), 0.0
    for l1, l2 in [(0, 1), (0, 2), (1, 2)]:
        for h1, h2 in itertools.product(range(a.n_heads), repeat=2):
            want = sum(pos[l2, h2, p, i] * pos[l1, h1, i, j] for i in range(n) for j in (1, 3))
            assert heads[l1, h1, l2, h2] == pytest.approx(want, rel=1e-9, abs=1e-300)
            steps = [pos[l1, h1] if x == l1 else pos[l2, h2] if x == l2 else eye for x in range(a.n_layers)]
            assert heads[l1, h1, l2, h2] == pytest.approx(enumerate_flow(steps, p, src), rel=1e-9, abs=1e-300)
            biggest = max(biggest, want)
    assert biggest > 1e-7  # small (a random model's attributions), compared at 1e-9 relative


def test_grouped_value_readers_sum_their_heads() -> None:
    g = Graph(3, 4, 2)  # two key/value groups of two heads
    rng = np.random.default_rng(0)
    logits, heads = rng.random((3, 4)), rng.random((3, 4, 3, 4))
    out = P.matrix_edges(g, logits, heads)
    for i, rd in enumerate(g.readers):
        for j, w in enumerate(g.writers):
            v = out[i, j]
            if rd.input == "logits" and w.startswith("L") and ".H" in w:
                l, h = (int(x[1:]) for x in w.split("."))
                assert v == logits[l, h]
            elif rd.input == "v" and ".H" in w and int(w.split(".")[0][1:]) < rd.layer:
                l, h = (int(x[1:]) for x in w.split("."))
                grp = int(rd.node.split(".KV")[1])
                assert v == pytest.approx(heads[l, h, rd.layer, 2 * grp] + heads[l, h, rd.layer, 2 * grp + 1])
            else:
                assert np.isnan(v), (rd, w)  # q, k, MLP, embed: no matrix path
