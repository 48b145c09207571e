"""Interventions on features (interventions/features.py) against independent computations, float64.

``hand`` below is a second route: it never attaches the feature set. It runs the *plain* model, encodes each
dictionary's input by hand (``relu((x - b_dec) W_enc + b_enc)``; a transcoder's input is the post-attention
norm of ``resid_pre + attn.out``, applied by hand through the layer's own norm module), edits the latents by
hand, decodes them by hand (``a W_dec + b_dec``) plus the error (recomputed from the run, or the clean run's),
and puts the result into the plain model as a constant edit of ``resid_pre`` / ``mlp.out``, dictionary by
dictionary in forward order. The only code shared with the engine is the model's own forward.

The model: tiny Llama, 3 layers, float64 (RMSNorm and rotary tables patched to float64, as in
test_circuit_scores), an SAE at layer 1 (resid_pre), a transcoder at layer 1 (mlp) and an SAE at layer 2
(resid_pre), random ReLU dictionaries of width 96.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
import transformers.models.llama.modeling_llama as hf_llama

from streetlamp.errors import StreetlampError
from streetlamp.interventions import engine
from streetlamp.interventions import features as FI
from streetlamp.interventions.circuits.tasks import TaskPair, encode_pairs
from streetlamp.interventions.engine import Intervention
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.features import FeatureSet, feature_site
from streetlamp.models.tiny import tiny_model
from tests.conftest import F64_TOL, assert_same_route
from tests.models.test_features import random_dictionary

PAIRS = [
    TaskPair(
        "when mary and john went to the store , john gave a drink to",
        "when mary and john went to the store , mary gave a drink to",
        " mary",
        " john",
    ),
    TaskPair("the movie was good and the acting", "the film was bad and the acting", " good", " bad"),
]
REFERENCE = ["the movie was good", "then john went to the store and mary gave a book to the man at the park", "a drink"]
DICTS = [(1, "resid_pre"), (1, "mlp"), (2, "resid_pre")]
WIDTH = 96


@pytest.fixture
def f64(monkeypatch: pytest.MonkeyPatch) -> None:
    def rms(self, x):  # LlamaRMSNorm's formula without the float32 cast
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rot(self, x, position_ids):
        freqs = position_ids[..., None].double() * self.inv_freq.double()
        emb = torch.cat((freqs, freqs), -1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)

    monkeypatch.setattr(hf_llama.LlamaRMSNorm, "forward", rms)
    monkeypatch.setattr(hf_llama.LlamaRotaryEmbedding, "forward", rot)


def models(dicts=DICTS) -> tuple[ModelAdapter, ModelAdapter, FeatureSet]:
    model, tok = tiny_model("llama", seed=3, layers=3)
    model = model.double()
    d = model.config.hidden_size
    fs = FeatureSet({(l, w): random_dictionary(l, w, d, WIDTH, seed=7 * l + len(w)) for l, w in dicts}, "random")
    spliced = ModelAdapter(model, tok, "tiny-llama").attach_features(fs)
    return spliced, ModelAdapter(model, tok, "tiny-llama"), fs


# -- the hand route ---------------------------------------------------------------------------------------------
def enc(d, x: torch.Tensor) -> torch.Tensor:
    return torch.relu((x - d.b_dec if d.b_dec_in else x) @ d.W_enc + d.b_enc)


def dec(d, a: torch.Tensor) -> torch.Tensor:
    return a @ d.W_dec + d.b_dec


def value_site(l: int, where: str) -> str:
    return f"layers.{l}.resid_pre" if where == "resid_pre" else f"layers.{l}.mlp.out"


def io(plain: ModelAdapter, inputs, edits: dict, l: int, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(the dictionary's input, the value it reconstructs) in the plain model under ``edits``."""
    r = [f"layers.{l}.resid_pre", f"layers.{l}.attn.out", f"layers.{l}.mlp.out"]
    c = plain.forward(inputs, record=r, edit=dict(edits)).cache
    if where == "resid_pre":
        return c[r[0]], c[r[0]]
    h = plain.layer_modules[l].post_attention_layernorm(c[r[0]] + c[r[1]])
    return h, c[r[2]]


def hand(
    plain: ModelAdapter,
    fs: FeatureSet,
    inputs,
    edits: dict[tuple[int, str], Callable[[torch.Tensor], torch.Tensor]],
    frozen: bool,
) -> torch.Tensor:
    """Logits with the latents of the dictionaries in ``edits`` replaced by ``fn(a)``, errors recomputed or frozen."""
    order = sorted(fs.dictionaries, key=lambda k: (k[0], k[1] != "resid_pre"))
    clean_err = {}
    for k in order:
        x, v = io(plain, inputs, {}, *k)
        clean_err[k] = v - dec(fs.dictionaries[k], enc(fs.dictionaries[k], x))
    first = min((order.index(k) for k in edits), default=len(order))
    plain_edits: dict = {}
    for i, k in enumerate(order):
        d = fs.dictionaries[k]
        if k not in edits and not (frozen and i > first):
            continue
        x, v = io(plain, inputs, plain_edits, *k)
        a = enc(d, x)
        a2 = edits[k](a) if k in edits else a
        err = clean_err[k] if (frozen and i > first) else v - dec(d, a)
        new = dec(d, a2) + err
        plain_edits[value_site(*k)] = lambda _, t=new: t
    return plain.forward(inputs, edit=plain_edits).logits


def column(f: int, fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """Latents with column ``f`` replaced by ``fn(a)[..., f]``."""

    def g(a: torch.Tensor) -> torch.Tensor:
        out = a.clone()
        out[..., f] = fn(a)[..., f]
        return out

    return g


def active_feature(spliced: ModelAdapter, inputs, l: int, where: str) -> int:
    """The feature with the largest summed activation (so that every edit moves something)."""
    a = spliced.forward(inputs, record=[feature_site(l, where)]).cache[feature_site(l, where)]
    return int(a.sum((0, 1)).argmax())


EDIT_CASES = ["zero", "mean-pooled", "mean-position", "patch", "steer", "clamp-active", "clamp-everywhere"]


@pytest.mark.parametrize("error", FI.ERRORS)
@pytest.mark.parametrize("where", ["resid_pre", "mlp"])
@pytest.mark.parametrize("case", EDIT_CASES)
def test_each_intervention_equals_the_hand_forward(f64, case: str, where: str, error: str) -> None:
    spliced, plain, fs = models()
    pairs = encode_pairs(spliced, PAIRS)
    inputs, l = pairs.clean, 1
    d = fs.get(l, where)
    f = active_feature(spliced, inputs, l, where)
    feat = FI.Feature(l, where, f)
    ref = spliced.encode(REFERENCE)
    if case == "zero":
        strategy, fn = engine.zero, torch.zeros_like
    elif case.startswith("mean"):
        per_position = case == "mean-position"
        got_mean = FI.feature_means(spliced, ref, [feat.site], per_position=per_position)[feat.site]
        # the means by hand: encode the reference's dictionary input, average over real tokens
        x_ref, _ = io(plain, ref, {}, l, where)
        a_ref = enc(d, x_ref)
        real = ref.attention_mask.double()[..., None]
        if per_position:
            want_mean = (a_ref * real).sum(0) / real.sum(0)
            strategy = FI.position_mean(got_mean)
            P = inputs.input_ids.shape[1]
            fn = lambda a: want_mean[None, :P].expand_as(a)  # noqa: E731
        else:
            want_mean = (a_ref * real).sum((0, 1)) / real.sum()
            strategy = engine.mean(got_mean)
            fn = lambda a: want_mean.expand_as(a)  # noqa: E731
        torch.testing.assert_close(got_mean, want_mean, rtol=0, atol=F64_TOL)
    elif case == "patch":
        corrupt = spliced.forward(pairs.corrupt, record=[feat.site]).cache[feat.site]
        strategy = engine.patch(corrupt)
        x_c, _ = io(plain, pairs.corrupt, {}, l, where)
        fn = lambda a: enc(d, x_c)  # noqa: E731
    elif case == "steer":
        strategy, fn = FI.steer(2.5), (lambda a: a + 2.5)
    else:
        how = case.split("-")[1]
        strategy = FI.clamp(3.0, how)
        fn = (lambda a: torch.where(a != 0, 3.0, a)) if how == "active" else (lambda a: torch.full_like(a, 3.0))
    got = FI.run(spliced, inputs, [FI.intervention(feat, strategy)], error=error).logits
    want = hand(plain, fs, inputs, {(l, where): column(f, fn)}, frozen=error == "frozen")
    clean = plain.forward(inputs).logits
    assert (want - clean).abs().max() > 1e-4  # the edit moves the output
    torch.testing.assert_close(got, want, rtol=0, atol=F64_TOL)


def test_several_features_at_one_position(f64) -> None:
    """Many features ablated at once, at one position: the hand route edits exactly those cells."""
    spliced, plain, fs = models()
    inputs = spliced.encode([PAIRS[0].clean])
    feats = [3, 17, 40, 41]
    ivs = [FI.intervention(FI.Feature(2, "resid_pre", i), engine.zero, pos=5) for i in feats]
    got = FI.run(spliced, inputs, ivs, error="recomputed").logits

    def fn(a: torch.Tensor) -> torch.Tensor:
        out = a.clone()
        out[:, 5, feats] = 0
        return out

    torch.testing.assert_close(got, hand(plain, fs, inputs, {(2, "resid_pre"): fn}, False), rtol=0, atol=F64_TOL)


def test_frozen_and_recomputed_differ_only_through_downstream_dictionaries(f64) -> None:
    spliced, _, fs = models()
    inputs = spliced.encode([PAIRS[0].clean])
    err2 = feature_site(2, "resid_pre", True)
    last = [FI.intervention(FI.Feature(2, "resid_pre", active_feature(spliced, inputs, 2, "resid_pre")), engine.zero)]
    # no dictionary after the edited one: the two modes are the same run
    a = FI.run(spliced, inputs, last, error="recomputed").logits
    b = FI.run(spliced, inputs, last, error="frozen").logits
    assert torch.equal(a, b)
    # an edit at layer 1: the SAE at layer 2 is downstream, its error follows the edit or stays clean
    first = [FI.intervention(FI.Feature(1, "resid_pre", active_feature(spliced, inputs, 1, "resid_pre")), engine.zero)]
    clean_err = FI.clean_errors(spliced, inputs)[err2]
    rec = FI.run(spliced, inputs, first, error="recomputed", record=[err2])
    fro = FI.run(spliced, inputs, first, error="frozen", record=[err2])
    assert (rec.cache[err2] - clean_err).abs().max() > 1e-4
    torch.testing.assert_close(fro.cache[err2], clean_err, rtol=0, atol=0)
    assert (rec.logits - fro.logits).abs().max() > 1e-6
    # with the layer-1 SAE alone attached, nothing is downstream: the modes agree again
    alone, _, _ = models([(1, "resid_pre")])
    x = FI.run(alone, inputs, first, error="recomputed").logits
    y = FI.run(alone, inputs, first, error="frozen").logits
    assert torch.equal(x, y)
    torch.testing.assert_close(x, rec.logits, rtol=0, atol=F64_TOL)  # recomputed downstream = the real model


@pytest.mark.parametrize("where", ["resid_pre", "mlp"])
@pytest.mark.parametrize("pos", [None, 4])
def test_steering_adds_alpha_times_the_decoder_row(f64, where: str, pos: int | None) -> None:
    spliced, plain, fs = models()
    inputs = spliced.encode([PAIRS[0].clean])
    f, alpha = 11, -1.75
    row = fs.get(1, where).W_dec[f]

    def add(x: torch.Tensor) -> torch.Tensor:
        out = x.clone()
        if pos is None:
            out += alpha * row
        else:
            out[:, pos] += alpha * row
        return out

    got = FI.run(
        spliced, inputs, [FI.intervention(FI.Feature(1, where, f), FI.steer(alpha), pos=pos)], error="recomputed"
    )
    want = plain.forward(inputs, edit={value_site(1, where): add}).logits
    torch.testing.assert_close(got.logits, want, rtol=0, atol=F64_TOL)


def test_patching_every_feature_and_the_error_is_the_corrupted_run(f64) -> None:
    """Exact patching of one feature at a time is not additive (the sum of single effects is not the joint
    effect); what is exact: all latents *and* the error of the layer-1 SAE from the corrupted run make the
    corrupted run's residual stream there, hence its logits."""
    spliced, plain, _ = models()
    pairs = encode_pairs(spliced, PAIRS)
    s, e = feature_site(1, "resid_pre"), feature_site(1, "resid_pre", True)
    c = spliced.forward(pairs.corrupt, record=[s, e]).cache
    ivs = [Intervention(s, engine.patch(c[s])), Intervention(e, engine.patch(c[e]))]
    got = FI.run(spliced, pairs.clean, ivs, error="recomputed").logits
    torch.testing.assert_close(got, plain.forward(pairs.corrupt).logits, rtol=0, atol=F64_TOL)
    # all latents without the error: not the corrupted run (the clean error stays)
    part = FI.run(spliced, pairs.clean, ivs[:1], error="recomputed").logits
    assert (part - plain.forward(pairs.corrupt).logits).abs().max() > 1e-4


def features_of(spliced: ModelAdapter, pairs) -> list[FI.Feature]:
    return [FI.Feature(l, w, active_feature(spliced, pairs.clean, l, w)) for l, w in DICTS] + [
        FI.Feature(1, "mlp", 5),
        FI.Feature(2, "resid_pre", 60),
    ]


@pytest.mark.parametrize("how", ["patch", "zero", "steer"])
@pytest.mark.parametrize("error", FI.ERRORS)
def test_exact_equals_the_hand_forward_per_prompt(f64, how: str, error: str) -> None:
    spliced, plain, fs = models()
    pairs = encode_pairs(spliced, PAIRS)
    feats = features_of(spliced, pairs)
    spec = FI.EditSpec(how, alpha={f: 1.5 for f in feats})
    got = FI.exact(spliced, pairs, feats, spec, error=error, batch_size=40)
    for i in range(len(pairs)):
        one = pairs.select([i])
        m0 = plain.forward(one.clean).logits[0]
        base = float(m0[one.answer[0]] - m0[one.wrong[0]])
        for j, f in enumerate(feats):
            d = fs.get(f.layer, f.where)
            if how == "patch":
                xc, _ = io(plain, one.corrupt, {}, f.layer, f.where)
                fn = lambda a, xc=xc, d=d: enc(d, xc)  # noqa: E731
            elif how == "zero":
                fn = torch.zeros_like
            else:
                fn = lambda a: a + 1.5  # noqa: E731
            lg = hand(plain, fs, one.clean, {(f.layer, f.where): column(f.index, fn)}, error == "frozen")[0]
            want = float(lg[one.answer[0]] - lg[one.wrong[0]]) - base
            assert abs(got[i, j] - want) < F64_TOL, (i, f, got[i, j], want)
    # batched in another token budget: the same numbers
    assert_same_route(FI.exact(spliced, pairs, feats, spec, error=error, batch_size=13), got)


def test_attribution_of_patching_is_the_decoder_times_the_models_gradient(f64) -> None:
    """Recomputed errors: ∂m/∂a_f[p] = W_dec[f] · ∂m/∂x[p], the plain model's gradient at its resid_pre (no
    splice); the attribution is its sum over positions times (a_corrupt − a_clean)."""
    spliced, plain, fs = models()
    pairs = encode_pairs(spliced, PAIRS)
    feats = [FI.Feature(2, "resid_pre", i) for i in range(WIDTH)]
    got = FI.attribution(spliced, pairs, feats, FI.EditSpec("patch"), error="recomputed")
    site, d = "layers.2.resid_pre", fs.get(2, "resid_pre")
    fwd = plain.forward(pairs.clean, record=[site], keep_grad=True, grad=True)
    r = torch.arange(len(pairs))
    m = (fwd.logits[r, pairs.answer] - fwd.logits[r, pairs.wrong]).sum()
    (gx,) = torch.autograd.grad(m, [fwd.cache[site]])
    xc = plain.forward(pairs.corrupt, record=[site]).cache[site]
    delta = (enc(d, xc) - enc(d, fwd.cache[site].detach())) * pairs.clean.attention_mask.double()[..., None]
    want = ((gx @ d.W_dec.T) * delta).sum(1)
    assert want.abs().max() > 1e-3
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=F64_TOL)


@pytest.mark.parametrize("error", FI.ERRORS)
def test_attribution_equals_float64_finite_differences(f64, error: str) -> None:
    """For a small edit (steering by ε: a_f + ε at every position) the first-order estimate is the
    derivative: the central difference (m(+ε) − m(−ε)) / 2 of the hand forward, truncation O(ε³). ε = 1e-8:
    with frozen errors the downstream dictionaries' ReLUs make m piecewise smooth, and a pre-activation within
    ~ε of its kink (about 2,500 of them here) would spoil a larger step (ε = 1e-5 hit one: a 3% gap)."""
    spliced, plain, fs = models()
    pairs = encode_pairs(spliced, PAIRS)
    feats = features_of(spliced, pairs)
    eps = 1e-8
    got = FI.attribution(spliced, pairs, feats, FI.EditSpec("steer", alpha={f: eps for f in feats}), error=error)
    for i in range(len(pairs)):
        one = pairs.select([i])
        for j, f in enumerate(feats):
            ms = []
            for sgn in (1, -1):
                lg = hand(
                    plain,
                    fs,
                    one.clean,
                    {(f.layer, f.where): column(f.index, lambda a, s=sgn: a + s * eps)},
                    error == "frozen",
                )[0]
                ms.append(float(lg[one.answer[0]] - lg[one.wrong[0]]))
            fd = (ms[0] - ms[1]) / 2
            # float64 rounding of m (~1e-14 absolute after a forward) halved, plus ε³ terms: below 1e-4 ε = 1e-12,
            # while a wrong gradient (a missing or extra path) is off by a fraction of |∂m/∂a| ε ~ 1e-8
            assert abs(got[i, j] - fd) < 1e-4 * eps, (error, i, f, got[i, j], fd)
            assert abs(fd) > 1e-3 * eps or j >= 3


def test_frozen_attribution_differs_from_recomputed(f64) -> None:
    """An edit at layer 1 reaches the output through the layer-2 SAE: its error frozen, the gradient there
    goes through decode(encode(.)) only, so the estimates differ; at the last dictionary they coincide."""
    spliced, _, _ = models()
    pairs = encode_pairs(spliced, PAIRS)
    spec = FI.EditSpec("zero")
    f1 = [FI.Feature(1, "resid_pre", active_feature(spliced, pairs.clean, 1, "resid_pre"))]
    a, b = (FI.attribution(spliced, pairs, f1, spec, error=e) for e in FI.ERRORS)
    assert np.abs(a - b).max() > 1e-6
    f2 = [FI.Feature(2, "resid_pre", active_feature(spliced, pairs.clean, 2, "resid_pre"))]
    a, b = (FI.attribution(spliced, pairs, f2, spec, error=e) for e in FI.ERRORS)
    np.testing.assert_allclose(a, b, rtol=0, atol=F64_TOL)


def test_audit_statistics_by_hand() -> None:
    est = np.array([0.5, -0.2, 0.1, 0.0, 0.9])
    ex = np.array([0.4, 0.1, 0.2, -0.3, 1.0])
    names = ["a", "b", "c", "d", "e"]
    r = FI.audit(est, ex, names, top_k=2)
    assert r["top_by_estimate"] == ["e", "a"] and r["top_by_exact"] == ["e", "a"]
    assert r["top_k_overlap"] == 1.0
    assert r["sign_agreement"] == pytest.approx(3 / 5)  # b and d disagree (0 counts as its own sign)
    assert r["max_abs_error"] == pytest.approx(0.3) and r["mean_abs_error"] == pytest.approx(0.18)
    assert r["relative_error"] == pytest.approx(0.3)
    # pairs ordered differently: count by hand
    n_bad = n = 0
    for i in range(5):
        for j in range(i + 1, 5):
            di, dj = ex[i] - ex[j], est[i] - est[j]
            if di != 0 and dj != 0:
                n += 1
                n_bad += np.sign(di) != np.sign(dj)
    assert r["misranked_share"] == pytest.approx(n_bad / n)
    from scipy.stats import kendalltau, spearmanr

    assert r["kendall_tau"] == pytest.approx(kendalltau(est, ex).statistic)
    assert r["spearman_rho"] == pytest.approx(spearmanr(est, ex).statistic)


def test_most_active_ranks_by_mean_activation(f64) -> None:
    spliced, plain, fs = models()
    inputs = spliced.encode(REFERENCE)
    top = FI.most_active(spliced, inputs, 5)
    real = inputs.attention_mask.bool()
    means = []
    for (l, w), d in fs.dictionaries.items():
        x, _ = io(plain, inputs, {}, l, w)
        m = enc(d, x)[real].mean(0).detach()
        means += [(float(v), FI.Feature(l, w, i)) for i, v in enumerate(m)]
    means.sort(key=lambda t: -t[0])
    assert top == [f for _, f in means[:5]]


def test_most_attributed_is_the_zero_ablation_attribution_ranking(f64) -> None:
    """All features at once from one backward = attribution() feature by feature, ranked by |mean|."""
    spliced, _, _ = models()
    pairs = encode_pairs(spliced, PAIRS)
    every = [FI.Feature(l, w, i) for l, w in DICTS for i in range(WIDTH)]
    att = FI.attribution(spliced, pairs, every, FI.EditSpec("zero"), error="frozen").mean(0)
    act = FI.activity(spliced, pairs.clean)
    ranked = sorted((-abs(att[j]), f) for j, f in enumerate(every) if act[f.site]["max"][f.index] > 0)
    assert FI.most_attributed(spliced, pairs, 10, error="frozen") == [f for _, f in ranked[:10]]


def test_bad_input_is_one_clear_line(f64) -> None:
    spliced, plain, _ = models()
    pairs = encode_pairs(spliced, PAIRS)
    with pytest.raises(StreetlampError, match="no feature set attached"):
        FI.run(plain, pairs.clean, [], error="recomputed")
    with pytest.raises(StreetlampError, match="error term 'kept'"):
        FI.run(spliced, pairs.clean, [], error="kept")
    with pytest.raises(StreetlampError, match="no dictionary at layer 0"):
        FI.exact(spliced, pairs, [FI.Feature(0, "mlp", 1)], FI.EditSpec("zero"), error="frozen")
    with pytest.raises(StreetlampError, match="index out of range"):
        FI.attribution(spliced, pairs, [FI.Feature(1, "mlp", WIDTH)], FI.EditSpec("zero"), error="frozen")
    with pytest.raises(StreetlampError, match="clamp where"):
        FI.clamp(1.0, "somewhere")
    with pytest.raises(StreetlampError, match="unknown feature edit"):
        FI.EditSpec("scale")
