"""Mixture-of-experts sites, expert interventions and the expert audit, against independent computations: a
hand-written float64 MoE block (every token, every chosen expert, the model's own weights), weight surgery on the
Hugging Face model, and a hand-written router hook."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.interventions import engine
from streetlamp.interventions import experts as X
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.families import FAMILIES
from streetlamp.models.tiny import tiny_model

MOE = [n for n, f in FAMILIES.items() if f.experts is not None]
TEXTS = ["the movie was good and the plot was fun", "a film with great acting"]


def _adapter(family: str, dtype: torch.dtype = torch.float64) -> ModelAdapter:
    model, tok = tiny_model(family, seed=3)
    return ModelAdapter(model.to(dtype), tok, name=f"tiny-{family}")


@pytest.fixture(scope="module", params=MOE)
def moe(request: pytest.FixtureRequest) -> ModelAdapter:
    return _adapter(request.param)


def _block_input(a: ModelAdapter, f, l: int) -> torch.Tensor:
    mid = f.cache[f"layers.{l}.resid_pre"] + f.cache[f"layers.{l}.attn.out"]
    return a.layer_modules[l].post_attention_layernorm(mid)


def _hand_block(a: ModelAdapter, x: torch.Tensor, l: int, dense: torch.Tensor | None = None) -> torch.Tensor:
    """The MoE block's output, token by token, from its weights (float64; the routing probabilities in float32 as
    every router computes them): softmax routing by the config's rule
    unless ``dense`` [b, p, E] routing weights are given; each chosen expert's SwiGLU; plus Qwen's gated shared
    expert."""
    mlp = a.layer_modules[l].mlp
    cfg = a.hf_model.config
    k = int(cfg.num_experts_per_tok)
    ex = mlp.experts
    out = torch.zeros_like(x)
    oss = a.family.name == "gpt_oss"
    router = mlp.router if oss else mlp.gate
    logits = x @ router.weight.t() + (router.bias if oss else 0)
    for b in range(x.shape[0]):
        for p in range(x.shape[1]):
            if dense is None and oss:  # gpt-oss: the top-k logits, then a softmax over them (model dtype)
                top, idx = torch.topk(logits[b, p], k)
                pairs = list(zip(idx.tolist(), torch.softmax(top, -1).tolist(), strict=True))
            elif dense is None:
                probs = torch.softmax(logits[b, p].float(), -1)  # the routers' softmax is float32 in any dtype
                top, idx = torch.topk(probs, k)
                if getattr(mlp.gate, "norm_topk_prob", True):
                    top = top / top.sum()
                top = top.double()
                pairs = list(zip(idx.tolist(), top.tolist(), strict=True))
            else:
                pairs = [(e, float(dense[b, p, e])) for e in range(dense.shape[-1]) if dense[b, p, e] != 0]
            for e, wt in pairs:
                if oss:  # interleaved gate/up rows, clamped, gate * sigmoid(alpha gate) * (up + 1), biases
                    gu = x[b, p] @ ex.gate_up_proj[e] + ex.gate_up_proj_bias[e]
                    gate, up = gu[::2].clamp(max=ex.limit), gu[1::2].clamp(-ex.limit, ex.limit)
                    h = (up + 1) * gate * torch.sigmoid(gate * ex.alpha)
                    out[b, p] += wt * (h @ ex.down_proj[e] + ex.down_proj_bias[e])
                    continue
                gate, up = (x[b, p] @ ex.gate_up_proj[e].t()).chunk(2)
                h = ex.act_fn(gate) * up
                out[b, p] += wt * (h @ ex.down_proj[e].t())
            if getattr(mlp, "shared_expert", None) is not None:
                se = mlp.shared_expert
                s = se.down_proj(se.act_fn(se.gate_proj(x[b, p])) * se.up_proj(x[b, p]))
                out[b, p] += torch.sigmoid(mlp.shared_expert_gate(x[b, p])) * s
    return out


def test_the_block_and_its_sites_equal_a_hand_written_moe(moe: ModelAdapter) -> None:
    inputs = moe.encode(TEXTS)
    f = moe.forward(inputs, record=["*"])
    real = inputs.attention_mask.bool()
    for l in range(moe.n_layers):
        x = _block_input(moe, f, l)
        want = _hand_block(moe, x, l)
        torch.testing.assert_close(f.cache[f"layers.{l}.mlp.out"][real], want[real], rtol=0, atol=1e-12)
        per = f.cache[f"layers.{l}.experts.out"]
        routed = sum(per[:, :, e] for e in range(per.shape[2]))
        if moe.family.experts.shared_expert is None:
            assert torch.equal(routed, f.cache[f"layers.{l}.mlp.out"])  # expert order, bit for bit
        w = f.cache[f"layers.{l}.router.weights"]
        assert ((w != 0).sum(-1) == moe.hf_model.config.num_experts_per_tok).all()
        # at every real token, an expert's output is zero exactly where it has no weight
        assert torch.equal((per.abs().sum(-1) == 0)[real], (w == 0)[real])
    torch.testing.assert_close(f.logits, moe.forward(inputs).logits, rtol=0, atol=0)  # recording changes nothing


@pytest.mark.parametrize("renormalise", [False, True])
def test_removing_an_expert_equals_the_hand_written_block_without_it(moe: ModelAdapter, renormalise: bool) -> None:
    inputs = moe.encode(TEXTS)
    l, e = 1, 2
    site = f"layers.{l}.router.weights"
    clean = moe.forward(inputs, record=[site])
    if renormalise and bool(((clean.cache[site] != 0).sum(-1) == 1).any()):
        pytest.skip("a token has a single expert")
    f = engine.run(moe, inputs, [engine.Intervention(site, X.remove(e, renormalise))], record=["*"])
    w0 = clean.cache[site]
    dense = w0.clone()
    dense[..., e] = 0
    if renormalise:
        dense = dense * (w0.sum(-1, keepdim=True) / dense.sum(-1, keepdim=True))
        # the routers' weights are float32 in any model dtype: k products and a k-term sum, each rounded once
        eps = torch.finfo(w0.dtype).eps
        torch.testing.assert_close(f.cache[site].sum(-1), w0.sum(-1), rtol=0, atol=(2 * w0.shape[-1] + 1) * eps)
    want = _hand_block(moe, _block_input(moe, f, l), l, dense)
    real = inputs.attention_mask.bool()
    torch.testing.assert_close(f.cache[f"layers.{l}.mlp.out"][real], want[real], rtol=0, atol=1e-12)


def test_zeroing_an_experts_output_equals_weight_surgery(moe: ModelAdapter) -> None:
    """Removing expert e without renormalisation = its down projection zeroed in the weights (independent)."""
    inputs = moe.encode(TEXTS)
    l, e = 0, 1
    f = engine.run(moe, inputs, [engine.Intervention(f"layers.{l}.experts.out", engine.zero, head=e)])
    g = engine.run(moe, inputs, [engine.Intervention(f"layers.{l}.router.weights", X.remove(e))])
    ex = moe.layer_modules[l].mlp.experts
    saved = ex.down_proj.data[e].clone()
    bias = getattr(ex, "down_proj_bias", None)
    saved_b = bias.data[e].clone() if bias is not None else None
    try:
        ex.down_proj.data[e] = 0
        if bias is not None:
            bias.data[e] = 0
        want = moe.forward(inputs).logits
    finally:
        ex.down_proj.data[e] = saved
        if bias is not None:
            bias.data[e] = saved_b
    torch.testing.assert_close(f.logits, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(g.logits, want, rtol=0, atol=1e-12)


def test_forced_routes() -> None:
    w = torch.tensor([[[0.6, 0.0, 0.4, 0.0], [0.0, 0.7, 0.0, 0.3]]], dtype=torch.float64)
    only = X.force(3, "only")(w)
    assert torch.equal(only, torch.tensor([[[0.0, 0, 0, 1.0], [0, 0, 0, 1.0]]], dtype=torch.float64))
    swap = X.force(0, "swap")(w)  # token 0 already has expert 0; token 1's lowest (expert 3) gives way
    assert torch.equal(swap, torch.tensor([[[0.6, 0, 0.4, 0], [0.3, 0.7, 0, 0]]], dtype=torch.float64))
    rem = X.remove(0, renormalise=True)(w)
    assert torch.allclose(rem, torch.tensor([[[0, 0, 1.0, 0], [0, 0.7, 0, 0.3]]], dtype=torch.float64))
    with pytest.raises(StreetlampError, match="only expert"):
        X.remove(1, renormalise=True)(torch.tensor([[[0.0, 1.0, 0, 0]]]))


def test_the_audit_against_weight_surgery_and_a_hand_written_router_hook() -> None:
    a = _adapter("mixtral")
    inputs = a.encode(TEXTS)
    res = X.audit(a, inputs)
    E, L = 4, a.n_layers
    assert res.kl_per_text.shape == (len(TEXTS), L, E) and res.forwards > L * E
    real = inputs.attention_mask.bool()
    lp = torch.log_softmax(a.hf_model(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask).logits, -1)
    for l, e in [(0, 1), (1, 3)]:
        ex = a.layer_modules[l].mlp.experts
        saved = ex.down_proj.data[e].clone()
        try:
            ex.down_proj.data[e] = 0
            lq = torch.log_softmax(
                a.hf_model(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask).logits, -1
            )
        finally:
            ex.down_proj.data[e] = saved
        kl = (lp.exp() * (lp - lq)).sum(-1) * real
        want = kl.sum(1) / real.sum(1)
        torch.testing.assert_close(torch.from_numpy(res.kl_per_text[:, l, e]), want, rtol=1e-9, atol=1e-12)
    # one token's row against a hook on the Hugging Face router that drops the expert for that token alone
    b, p, l, e, wt, kl_tok = res.token_rows[len(res.token_rows) // 2]
    b, p, l, e = int(b), int(p), int(l), int(e)
    one = inputs.select([b])
    t = p  # flattened token index of a single row

    def drop(module, args, output):
        logits, weights, idx = output
        weights = weights.clone()
        weights[t][idx[t] == e] = 0
        return logits, weights, idx

    h = a.layer_modules[l].mlp.gate.register_forward_hook(drop)
    try:
        lq = torch.log_softmax(a.hf_model(input_ids=one.input_ids, attention_mask=one.attention_mask).logits, -1)
    finally:
        h.remove()
    want = float((lp[b, p].exp() * (lp[b, p] - lq[0, p])).sum().detach())
    assert abs(kl_tok - want) <= 1e-9 * max(1.0, abs(want)) and wt > 0


def test_bad_expert_edits_are_one_line() -> None:
    a = _adapter("olmoe", torch.float32)
    with pytest.raises(StreetlampError, match="expert 9 out of range"):
        X.check_expert(a, 0, 9)
    with pytest.raises(StreetlampError, match="layer 5 out of range"):
        X.check_expert(a, 5, 0)
    dense = _adapter("llama", torch.float32) if "llama" in FAMILIES else None
    if dense is not None:
        with pytest.raises(StreetlampError, match="not a mixture of experts"):
            X.n_experts_of(dense)
    with pytest.raises(StreetlampError, match="no head axis"):
        engine.selection_mask(torch.zeros(1, 2, 3), "layers.0.mlp.out", 1, None, None)


def _surgery_kl(a: ModelAdapter, inputs, zeroed: list[tuple[int, int]], extra: tuple[int, int], k: int) -> torch.Tensor:
    """Per-text mean KL of removing ``extra`` on top of ``zeroed`` (not renormalised), by weight surgery on a
    Hugging Face model rebuilt with ``k`` experts per token from the same weights (independent of the routing
    sites and the engine)."""
    cfg = a.hf_model.config.__class__.from_dict({**a.hf_model.config.to_dict(), "num_experts_per_tok": k})

    def logp(drop: list[tuple[int, int]]) -> torch.Tensor:
        m = a.hf_model.__class__(cfg).to(torch.float64).eval()
        m.load_state_dict(a.hf_model.state_dict())
        m.set_experts_implementation("eager")  # the reference loop: float64 as well
        for l, e in drop:
            m.model.layers[l].mlp.experts.down_proj.data[e] = 0
        with torch.no_grad():
            out = m(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask).logits
        return torch.log_softmax(out, -1)

    lp, lq = logp(zeroed), logp(zeroed + [extra])
    real = inputs.attention_mask.bool()
    return ((lp.exp() * (lp - lq)).sum(-1) * real).sum(1) / real.sum(1)


def test_the_audit_with_top_k_and_experts_removed_throughout_equals_weight_surgery() -> None:
    """``top_k``: the routers' own k (a model built with that k); ``removed``: experts gone in every forward (their
    down projections zeroed); the audited pairs only, the rest NaN."""
    a = _adapter("mixtral")
    inputs = a.encode(TEXTS)
    res = X.audit(a, inputs, top_k=3, removed=[(0, 1)], layers=[0, 1], experts=[0, 2], tokens=False)
    assert a.layer_modules[0].mlp.gate.top_k == 2  # restored
    for l, e in [(0, 0), (0, 2), (1, 0), (1, 2)]:
        want = _surgery_kl(a, inputs, [(0, 1)], (l, e), 3)
        torch.testing.assert_close(torch.from_numpy(res.kl_per_text[:, l, e]), want, rtol=1e-9, atol=1e-13)
    assert np.isnan(res.kl_per_text[:, :, [1, 3]]).all()
    assert res.forwards == 1 + 4
    # the routing recorded is the edited one: layer 0 never routes to expert 1, every token has 3 experts elsewhere
    assert res.frequency[0, 1] == 0 and res.frequency[1].sum() == pytest.approx(3.0, abs=1e-12)


def test_per_token_removals_are_batched_and_equal_one_text_at_a_time() -> None:
    """The per-token rows do not depend on how the token copies are batched (1 token a forward, 7, all at once),
    and the forwards are one per (layer, expert, token batch)."""
    a = _adapter("qwen2_moe")
    inputs = a.encode(TEXTS)
    runs = {b: X.audit(a, inputs, layers=[1], batch_tokens=b) for b in (None, 7 * inputs.input_ids.shape[1])}
    ref = X.audit(a, inputs, layers=[1], batch_tokens=1)
    for r in runs.values():
        np.testing.assert_allclose(r.token_rows, ref.token_rows, rtol=1e-10, atol=1e-14)
    n_tokens = ref.token_rows.shape[0]
    assert ref.forwards == 1 + 4 + n_tokens  # batch of one token: one forward per token
    per_expert = [int((ref.token_rows[:, 3] == e).sum()) for e in range(4)]
    assert runs[None].forwards == 1 + 4 + sum(1 for n in per_expert if n)  # every copy in one forward per expert
    assert runs[7 * inputs.input_ids.shape[1]].forwards == 1 + 4 + sum(-(-n // 7) for n in per_expert)


def test_bad_routing_edits_are_one_line() -> None:
    a = _adapter("mixtral")
    inputs = a.encode(TEXTS)
    with pytest.raises(StreetlampError, match="top-k 5 is not possible: the model's layers have 4 experts"):
        X.audit(a, inputs, top_k=5)
    with pytest.raises(StreetlampError, match="top-k 0 is not possible"):
        with X.routed_top_k(a, 0):
            pass
    with pytest.raises(StreetlampError, match="expert 4 out of range"):
        X.audit(a, inputs, removed=[(0, 4)])
    with pytest.raises(StreetlampError, match="layer 2 out of range"):
        X.audit(a, inputs, layers=[2])
    with pytest.raises(StreetlampError, match="bad expert '1:2'"):
        X.parse_experts("1:2", a)
    # top-1 routing: removing three of the four experts leaves the tokens routed to them with none
    w = a.forward(inputs, record=["layers.0.router.weights"]).cache["layers.0.router.weights"]
    with X.routed_top_k(a, 1):
        w1 = a.forward(inputs, record=["layers.0.router.weights"]).cache["layers.0.router.weights"]
    used = sorted({int(i) for i in w1.argmax(-1)[inputs.attention_mask.bool()]})
    assert len(used) >= 2 and ((w != 0).sum(-1) == 2).all()
    with pytest.raises(StreetlampError, match="takes every expert of some token: it would be routed nowhere"):
        X.audit(a, inputs, top_k=1, removed=[(0, used[0])], tokens=False)
    with pytest.raises(StreetlampError, match="some token's only expert: removing it leaves nothing to renormalise"):
        X.audit(a, inputs, top_k=1, renormalise=True, tokens=False)
    assert a.layer_modules[0].mlp.gate.top_k == 2  # restored after the refusal


@pytest.mark.parametrize("family", [n for n in MOE if n != "gpt_oss"])
def test_recorded_expert_outputs_are_hugging_faces_own_loop_in_float32(family: str) -> None:
    """Recording (models/moe.py runs each expert once on its tokens, grouped by one sort) leaves the logits bit
    for bit unchanged, and ``experts.out[..., e, :]`` is bit for bit what Hugging Face's eager loop computes for
    expert e: the unpatched module called on the block's own inputs with every other expert's index set to
    ``num_experts`` (which its loop skips)."""
    a = _adapter(family, torch.float32)
    inputs = a.encode(TEXTS)
    seen: dict[int, tuple] = {}
    handles = [
        a.layer_modules[l].mlp.experts.register_forward_hook(lambda m, args, out, l=l: seen.__setitem__(l, args))
        for l in range(a.n_layers)
    ]
    try:
        plain = a.forward(inputs)
    finally:
        for h in handles:
            h.remove()
    f = a.forward(inputs, record=["*"])
    assert torch.equal(f.logits, plain.logits)
    for l in range(a.n_layers):
        hidden, idx, w = seen[l]
        ex = a.layer_modules[l].mlp.experts
        per = f.cache[f"layers.{l}.experts.out"].reshape(hidden.shape[0], ex.num_experts, -1)
        for e in range(ex.num_experts):
            want = ex(hidden, torch.where(idx == e, idx, ex.num_experts), w)
            assert torch.equal(per[:, e], want), (l, e)
