"""Head damage and Sink₁^ε (issue 37 item 6) against direct computations: each head's node effect and the
cumulative ablation recomputed here with masked forwards; the sink share from hand-made patterns."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streetlamp.interventions.circuits import faithfulness as F
from streetlamp.interventions.circuits import scores as S
from streetlamp.interventions.circuits.heads import first_token_attention, head_damage, sink_share
from streetlamp.interventions.circuits.tasks import encode_pairs
from tests.conftest import F64_TOL
from tests.interventions.test_circuit_faithfulness import PAIRS3
from tests.interventions.test_circuit_scores import make


@pytest.mark.parametrize("ablation", ["patch", "mean"])
def test_head_damage_is_cumulative_node_ablation(ablation: str) -> None:
    a, b = make("gpt2")
    pairs = encode_pairs(a, PAIRS3)
    g = b.graph
    r = head_damage(b, pairs, target=0.5, ablation=ablation)
    heads = [i for i, w in enumerate(g.writers) if ".H" in w]
    assert sorted(r.heads) == sorted(g.writers[i] for i in heads) and list(r.effect) == sorted(r.effect)
    base = S.clean_metric(b, pairs).double().numpy().mean()
    assert r.m_model == pytest.approx(base, abs=F64_TOL)
    # each head's effect: its writer's every out-edge ablated, one masked forward
    for name, e in zip(r.heads[:3], r.effect[:3]):
        m = g.valid().clone()
        m[:, g.writers.index(name)] = False
        want = F.circuit_metrics(b, pairs, [m], ablation)[0].mean() - base
        assert e == pytest.approx(want, abs=10 * F64_TOL)
    # the damage curve: the top k heads ablated together
    m = g.valid().clone()
    for k, d in enumerate(r.damage):
        m[:, g.writers.index(r.heads[k])] = False
        want = 1 - F.circuit_metrics(b, pairs, [m.clone()], ablation)[0].mean() / base
        assert d == pytest.approx(want, abs=10 * F64_TOL)
    if r.count is not None:
        assert r.damage[r.count - 1] >= 0.5 and (r.count == 1 or r.damage[: r.count - 1].max() < 0.5)
    assert len(r.damage) >= 1


def test_sink_share() -> None:
    # 2 sequences, 1 layer, 3 heads, 3 tokens; the second sequence's last token is padding
    p = torch.zeros(2, 1, 3, 3, 3, dtype=torch.float64)
    p[:, :, :, :, 0] = (
        torch.tensor([1.0, 0.2, 0.1], dtype=torch.float64)[None, None, None, :].expand(2, 1, 3, 3).clone()
    )
    p[:, 0, 1, :, 0] = 1.0  # head 1: everything on the first token
    p[:, 0, 2, 1:, 0] = 0.0  # head 2: only the first query (forced) attends there
    am = torch.tensor([[1, 1, 1], [1, 1, 0]])
    a = first_token_attention(p, am)
    # head 0: queries (1, .2, .1) and (1, .2) -> 2.5 / 5 real queries
    np.testing.assert_allclose(a.numpy()[0], [2.5 / 5, 1.0, 2 / 5], rtol=0, atol=1e-15)
    assert sink_share(a, 0.3) == pytest.approx(1.0) and sink_share(a, 0.45) == pytest.approx(2 / 3)
    assert sink_share(np.array([[0.3, 0.31]]), 0.3) == 0.5  # strictly above eps


def _hand_metric(model, ids: torch.Tensor, answer: int, wrong: int, edits: dict[tuple[int, int], torch.Tensor]):
    """answer − wrong logit at the last token of one unpadded prompt, each head (l, h) of ``edits`` given
    the context vector ``[s, dh]`` (before W_O) by a pre-hook on its layer's ``c_proj``: no streetlamp code."""
    dh = model.config.n_embd // model.config.n_head
    hooks = []
    for l in {l for l, _ in edits}:

        def pre(mod, args, l=l):
            x = args[0].clone()
            for (ll, h), v in edits.items():
                if ll == l:
                    x[0, :, h * dh : (h + 1) * dh] = v
            return (x,)

        hooks.append(model.transformer.h[l].attn.c_proj.register_forward_pre_hook(pre))
    try:
        with torch.no_grad():
            logits = model(ids[None]).logits[0, -1]
    finally:
        for k in hooks:
            k.remove()
    return float(logits[answer] - logits[wrong])


def _context_vectors(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's merged head context vectors ``[s, H·dh]`` (c_proj's input) on one prompt."""
    got: list[torch.Tensor] = []
    hooks = [
        blk.attn.c_proj.register_forward_pre_hook(lambda mod, args: got.append(args[0][0].detach().clone()))
        for blk in model.transformer.h
    ]
    try:
        with torch.no_grad():
            model(ids[None])
    finally:
        for k in hooks:
            k.remove()
    return got


@pytest.mark.parametrize("ablation", ["zero", "mean", "patch"])
def test_head_damage_matches_a_hand_written_ablation_loop(ablation: str) -> None:
    """Every head's single-head effect, the order, the cumulative damage curve, the count to a target and
    the sign flip, recomputed by hooks on Hugging Face's GPT-2 (the head's slice of c_proj's input set to zero, to its
    mean over every clean token, or to the corrupted prompt's), prompt by prompt without padding."""
    a, b = make("gpt2")
    model = a.hf_model
    pairs = encode_pairs(a, PAIRS3)
    L, H = model.config.n_layer, model.config.n_head
    dh = model.config.n_embd // H
    prompts = []
    for i in range(len(pairs)):
        keep = pairs.clean.attention_mask[i].bool()
        prompts.append(
            (
                pairs.clean.input_ids[i][keep],
                pairs.corrupt.input_ids[i][keep],
                int(pairs.answer[i]),
                int(pairs.wrong[i]),
            )
        )
    clean_z = [_context_vectors(model, c) for c, _, _, _ in prompts]
    corrupt_z = [_context_vectors(model, k) for _, k, _, _ in prompts]
    mean_z = [torch.cat([z[l] for z in clean_z]).mean(0) for l in range(L)]  # over every real clean token

    def value(i: int, l: int, h: int) -> torch.Tensor:
        sl = slice(h * dh, (h + 1) * dh)
        s = len(prompts[i][0])
        if ablation == "zero":
            return torch.zeros(s, dh, dtype=torch.float64)
        if ablation == "mean":
            return mean_z[l][sl].expand(s, dh)
        return corrupt_z[i][l][:, sl]

    def mean_metric(heads: list[tuple[int, int]]) -> float:
        return float(
            np.mean(
                [
                    _hand_metric(model, c, an, wr, {x: value(i, *x) for x in heads})
                    for i, (c, _, an, wr) in enumerate(prompts)
                ]
            )
        )

    base = mean_metric([])
    all_heads = [(l, h) for l in range(L) for h in range(H)]
    eff = np.array([mean_metric([x]) - base for x in all_heads])
    order = [all_heads[j] for j in np.argsort(eff, kind="stable")]
    damage = np.array([1 - mean_metric(order[: k + 1]) / base for k in range(len(order))])
    target = 0.99 * float(damage.max())  # a target the curve reaches (random tiny weights: damage is small)
    assert target > 0
    count = next((k + 1 for k, d in enumerate(damage) if d >= target), None)
    flip = next((k + 1 for k in range(len(order)) if np.sign(1 - damage[k]) != np.sign(1.0)), None)

    r = head_damage(b, pairs, target=target, ablation=ablation)
    assert r.heads == [f"L{l}.H{h}" for l, h in order]
    np.testing.assert_allclose(r.effect, np.sort(eff, kind="stable"), rtol=0, atol=10 * F64_TOL)
    np.testing.assert_allclose(r.damage, damage[: len(r.damage)], rtol=0, atol=10 * F64_TOL)
    assert r.m_model == pytest.approx(base, abs=F64_TOL)
    assert (r.count, r.sign_flip) == (count, flip)
    assert np.ptp(eff) > 1e-3 and count is not None  # the heads differ and the target is reached
    assert flip is None or len(r.damage) >= flip
