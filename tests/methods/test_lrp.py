"""AttnLRP: the full conservation ledger on every tiny family (float64), each family-specific rule shown
to be needed (the ledger breaks without it), the authors' package lxt as the peer on GPT-2, Llama, Qwen2,
Qwen3 and Gemma 3 (the decoders lxt 2.1 ships patches for) and Mistral (lxt's Llama rules on Mistral's classes),
and the method's bookkeeping."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.methods.lrp import RULE_FAMILIES, AttnLRP, attnlrp_relevance
from streetlamp.models.adapter import ModelAdapter, Target
from streetlamp.models.relevance import softmax_absorbed
from streetlamp.models.tiny import tiny_model
from tests.conftest import FAMILIES, eager_twin
from tests.helpers.peers import require_module

TEXT = "when mary and john went to the store , john gave a drink to"
# parameters that enter the network additively: biases (LayerNorm betas included) and the
# position / token-type embedding tables. Their relevance is p · ∂̃F/∂p.
ADDITIVE = ("bias", "position_embeddings.weight", "token_type_embeddings.weight", "wpe.weight")
F32 = 2.0**-24  # unit roundoff of float32


def adapter64(family: str) -> ModelAdapter:
    """The tiny model in float64, its norm gains moved off Hugging Face's initial values (ones; Gemma's
    zeros, i.e. a gain of 1 + 0) as training moves them, so a wrong gain (w for 1 + w) cannot hide."""
    model, tok = tiny_model(family, seed=1)
    model = model.double()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n.lower() and n.endswith("weight"):
                p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return ModelAdapter(model, tok, f"tiny-{family}")


def ledger(a: ModelAdapter, index: int) -> dict[str, float]:
    ids = a.encode(TEXT).input_ids[0]
    r, f, cache = attnlrp_relevance(a, ids, index, Target(quantity="logit"), record=("layers.*.attn.pattern",))
    pats = [cache[f"layers.{l}.attn.pattern"] for l in range(a.n_layers)]
    params = [p for n, p in a.hf_model.named_parameters() if n.endswith(ADDITIVE)]
    gs = torch.autograd.grad(f, pats + params, allow_unused=True)
    soft = [softmax_absorbed(p, g) for p, g in zip(pats, gs[: len(pats)])]
    bias = sum(float((p * g).detach().sum()) for p, g in zip(params, gs[len(pats) :]) if g is not None)
    flow = sum(float((p.detach().double() * g.double()).abs().sum()) for p, g in zip(pats, gs[: len(pats)]))
    f = f.detach()
    return {
        "F": float(f),
        "tokens": float(r.sum()),
        "softmax": float(sum(s.detach().sum() for s in soft)),
        "bias": bias,
        "scale": abs(float(f)) + float(r.abs().sum()) + abs(bias) + flow,
    }


@pytest.mark.parametrize("family", FAMILIES)
def test_conservation_ledger(family: str) -> None:
    """F = Σ tokens + Σ additive parameters + what the softmaxes absorb, term by term.

    Every other step of the modified backward conserves exactly (linear maps, norms with their
    standard deviation held constant, eps included; the identity rule up to its 1e-10 epsilon;
    the halved products). What is left is rounding: the attention softmax runs in float32 (as in
    Hugging Face's eager path) and Llama's RMSNorm casts to float32 even in a float64 model, each
    a relative 2^-24 on the relevance flowing through it; 64 such roundings bound the error by
    64 · 2^-24 · (the total relevance flowing), about 4e-6 of it, while a missed rule (a GELU on
    its plain gradient, an unhalved product) leaves O(1) of it (see the next test)."""
    a = adapter64(family)
    if family not in RULE_FAMILIES:  # no rules for its norms / gates yet: refused in one line, never wrong
        with pytest.raises(StreetlampError, match="attnlrp's rules cover"):
            AttnLRP().check(a)
        return
    index = 1 if a.kind == "classifier" else 9
    L = ledger(a, index)
    resid = L["F"] - (L["tokens"] + L["softmax"] + L["bias"])
    assert abs(resid) <= 64 * F32 * L["scale"], (L, resid)
    assert abs(L["tokens"]) > 0.05 * abs(L["F"])  # the tokens carry a real share: the ledger is not all bias


def test_ledger_fails_without_the_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same ledger on plain gradient × input (no rules) misses by far more than the tolerance."""
    import contextlib

    for family in ("gpt2", "llama", "bert"):
        a = adapter64(family)
        monkeypatch.setattr(a, "relevance_rules", contextlib.nullcontext)
        monkeypatch.setattr("streetlamp.methods.lrp.attention_edits", lambda n: {})
        L = ledger(a, 1 if a.kind == "classifier" else 9)
        resid = L["F"] - (L["tokens"] + L["softmax"] + L["bias"])
        assert abs(resid) > 1000 * 64 * F32 * L["scale"], (family, L, resid)
        monkeypatch.undo()


def _narrow(m: torch.nn.Module) -> bool:
    w = getattr(m, "weight", None)
    return isinstance(w, torch.Tensor) and w.dim() == 1 and w.shape[0] < 16 and type(m).__name__.endswith("RMSNorm")


def _without(monkeypatch: pytest.MonkeyPatch, rule: str) -> None:
    """Switch one family-specific rule off (back to the plain gradient there)."""
    import streetlamp.models.attention as attention
    import streetlamp.models.relevance as relevance

    if rule == "gemma norm gain 1 + w":
        monkeypatch.setattr("streetlamp.models.sites.norm_gain_offset", lambda family: 0.0)
    elif rule == "attention soft-cap":
        monkeypatch.setattr(attention, "soft_cap", lambda s, cap: torch.tanh(s / cap) * cap)
    elif rule == "final soft-cap":
        monkeypatch.setattr(relevance, "_final_cap", lambda model, cap: [])
    elif rule == "q/k norms":
        kind = relevance._norm_kind  # q_norm / k_norm act on one head: d_head wide, narrower than d_model
        monkeypatch.setattr(relevance, "_norm_kind", lambda m: None if _narrow(m) else kind(m))
    elif rule == "gated product":
        monkeypatch.setattr(relevance, "GATED_FAMILIES", ())


@pytest.mark.parametrize(
    "family,rule",
    [
        ("gemma2", "gemma norm gain 1 + w"),
        ("gemma2", "attention soft-cap"),
        ("gemma3_text", "final soft-cap"),
        ("qwen3", "q/k norms"),
        ("gemma3_text", "q/k norms"),
        ("phi3", "gated product"),
        ("gemma2", "gated product"),
        ("modernbert", "gated product"),
    ],
)
def test_each_new_rule_is_needed(monkeypatch: pytest.MonkeyPatch, family: str, rule: str) -> None:
    """Without one rule the ledger misses by more than 100 times its tolerance (measured: 2.3e3 times
    for Gemma 3's final cap to 6.6e4 for Gemma 2's 1 + w gain), so the conservation test checks that rule."""
    a = adapter64(family)
    _without(monkeypatch, rule)
    L = ledger(a, 1 if a.kind == "classifier" else 9)
    resid = L["F"] - (L["tokens"] + L["softmax"] + L["bias"])
    assert abs(resid) > 100 * 64 * F32 * L["scale"], (family, rule, L, resid)


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text"])
def test_final_softcap_explains_the_capped_logit(family: str) -> None:
    """With final-logit soft-capping the explained F is the model's capped logit cap·tanh(l/cap), and
    every relevance is F/l times the relevance of the same model with the cap removed (which explains
    l): the identity rule on the cap, checked against a second run without it (float64 except Gemma's
    float32 RMSNorm: 1e-6 of the largest relevance). The output states the cap and l."""
    a = adapter64(family)
    assert a.hf_model.config.final_logit_softcapping  # the tiny config caps (3.0)
    ids = a.encode(TEXT).input_ids[0]
    a.hf_model.config.final_logit_softcapping = None
    r0, l, _ = attnlrp_relevance(a, ids, 9, Target(quantity="logit"))
    l = float(l.detach())
    cap = abs(l)  # a cap at |l| bends it by tanh(1): F = 0.76 l
    a.hf_model.config.final_logit_softcapping = cap
    r, f, _ = attnlrp_relevance(a, ids, 9, Target(quantity="logit"))
    f = float(f.detach())
    assert f == pytest.approx(cap * np.tanh(l / cap), rel=1e-12)
    np.testing.assert_allclose(r.numpy(), f / l * r0.numpy(), rtol=0, atol=1e-6 * float(r.abs().max()))
    e = AttnLRP().attribute(a, a.encode(TEXT), target=Target(index=9, quantity="logit"))[0]
    assert e.info["final_logit_softcap"] == cap
    assert e.info["F_before_cap"] == pytest.approx(l, rel=1e-9)
    assert e.info["F"] == pytest.approx(f, rel=1e-12)


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2", "qwen3", "mistral", "gemma3_text"])
def test_matches_lxt(family: str) -> None:
    """Relevance equals the authors' lxt 2.1 (rules applied by lxt's own code) on a plain copy of the
    model, float64. Both run the same float32 softmax (and lxt's RMSNorm casts to float32), so they
    agree to float32 rounding: 1e-5 of the largest relevance, while plain gradient × input is off by
    more than 100 times that even on this small random model (checked, so the comparison can fail).
    lxt's Gemma 3 patch leaves the final-logit soft-cap on its plain gradient (its rules stop at the LM
    head), so for Gemma 3 both explain the logit without that cap (our rule for it: the test above)."""
    require_module("lxt")  # .ci/run requires the peer (STREETLAMP_REQUIRE_PEERS=1)
    from tests.helpers.lxt_peer import lxt_relevance

    a = adapter64(family)
    a.hf_model.config.final_logit_softcapping = None  # Gemma's; None elsewhere already
    ids = a.encode(TEXT).input_ids[0]
    ours, f, _ = attnlrp_relevance(a, ids, 9, Target(quantity="logit"))
    theirs, f_lxt = lxt_relevance(eager_twin(a), family.removesuffix("_text"), ids, 9)
    scale = float(theirs.abs().max())
    assert f_lxt == pytest.approx(float(f), rel=1e-6)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=1e-5 * scale, rtol=0)
    from streetlamp.methods.gradient import GradientXInput

    gxi = GradientXInput().attribute(a, a.encode(TEXT), target=Target(index=9, quantity="logit"))[0].scores
    assert np.abs(gxi - theirs.numpy()).max() > 100 * 1e-5 * scale


def test_attribute_reports_the_logit_and_what_is_unassigned(tiny: ModelAdapter) -> None:
    if tiny.family.name not in RULE_FAMILIES:
        with pytest.raises(StreetlampError, match="attnlrp's rules cover"):
            AttnLRP().attribute(tiny, tiny.encode(TEXT), target=Target())
        return
    e = AttnLRP().attribute(tiny, tiny.encode(TEXT), target=Target(quantity="prob"))[0]
    assert e.info["target"]["quantity"] == "logit" and e.info["asked_quantity"] == "prob"
    logit = tiny.forward(tiny.encode(TEXT)).logits[0, e.info["target"]["index"]]
    assert e.info["F"] == pytest.approx(float(logit), rel=1e-5, abs=1e-6)
    assert e.info["unassigned"] == pytest.approx(e.info["F"] - float(e.scores.astype(np.float64).sum()), abs=1e-5)


def test_rules_leave_forward_values_unchanged(tiny: ModelAdapter) -> None:
    inputs = tiny.encode(TEXT)
    plain = tiny.forward(inputs).logits
    with tiny.relevance_rules():
        ruled = tiny.forward(inputs).logits
    assert torch.equal(plain, ruled)


SMOL_PROMPTS = [
    "When Mary and John went to the store, John gave a drink to",
    "The capital of France is",
    "The animal didn't cross the street because it was too tired. In that sentence, it refers to the",
    "I loved the movie, the acting was",
    "Berlin is the capital of",
    "The doctor said that she would call the nurse because",
]


@pytest.mark.slow
def test_smollm2_equals_lxt_and_skews_to_the_last_token(smollm: ModelAdapter) -> None:
    """On SmolLM2 (float32) our relevance equals lxt's (measured: bit-identical; asserted to 1e-5 of the
    largest, float32 rounding of a 30-layer pass); and AttnLRP's known skew towards the explained
    position: the last token's share of Σ|R| is above the uniform 1/n on every prompt (measured
    1.8x to 4.3x; asserted > 1.5x each and > 2.5x on average). The first token is NOT consistently
    favoured on SmolLM2 (no BOS; shares 0.007 to 0.145), so nothing is asserted for it.
    Why these margins and no sampling bound: the prompts and weights are fixed, so the shares are one
    deterministic computation (no sampling error); the claim is the known skew (share > 1/n), and the
    margins only keep a float32 platform difference from deciding it: 1.5x sits below the smallest
    measured ratio (1.8x) and 2.5x below the measured mean."""
    require_module("lxt")  # .ci/run requires the peer (STREETLAMP_REQUIRE_PEERS=1)
    import copy

    from tests.helpers.lxt_peer import lxt_relevance

    ids = smollm.encode(SMOL_PROMPTS[0]).input_ids[0]
    mary = smollm.token_id(" Mary")
    ours, _, _ = attnlrp_relevance(smollm, ids, mary, Target(quantity="logit"))
    theirs, _ = lxt_relevance(copy.deepcopy(smollm.hf_model), "llama", ids, mary)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=1e-5 * float(theirs.abs().max()), rtol=0)
    ratios = []
    for e in AttnLRP().attribute(smollm, smollm.encode(SMOL_PROMPTS), target=Target(quantity="logit")):
        s = np.abs(e.scores.astype(np.float64))
        ratios.append(s[-1] / s.sum() * len(s))
    assert min(ratios) > 1.5 and np.mean(ratios) > 2.5, ratios
