"""Heads and circuits on tiny models with a known mechanism, checked against independent computations.

Every tiny model here runs in float64 (conftest.F64_TOL): the streetlamp route and the hand-made one
agree to ~1e-13 on any CPU; the tolerances below stay far under every effect the tests look for."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.interventions import engine, heads, mediation, patching
from streetlamp.interventions.engine import Intervention
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.tiny import tiny_model

CLEAN = "when mary and john went to the store john gave a drink to"
CORRUPT = "when mary and john went to the store mary gave a drink to"


def gpt2_mechanism(live: list[tuple[int, int]], seed: int = 3, no_ln_f: bool = False) -> ModelAdapter:
    """Tiny GPT-2 (2 layers x 4 heads) where only the ``live`` heads write to the residual stream
    (every other head's W_O rows zeroed, every MLP zeroed): the output at the last position
    depends on earlier tokens only through the live heads. Live heads' W_O scaled up."""
    model, tok = tiny_model("gpt2", seed=seed)
    dh = model.config.n_embd // model.config.n_head
    with torch.no_grad():
        for l, block in enumerate(model.transformer.h):
            for h in range(model.config.n_head):
                rows = slice(h * dh, (h + 1) * dh)
                block.attn.c_proj.weight[rows] *= 20.0 if (l, h) in live else 0.0
            block.mlp.c_proj.weight.zero_()
            block.mlp.c_proj.bias.zero_()
            block.attn.c_attn.weight[:, : 2 * model.config.n_embd] *= 10.0  # sharper attention
    if no_ln_f:
        model.transformer.ln_f = torch.nn.Identity()
    return ModelAdapter(model.double(), tok, "tiny-gpt2-mechanism")


def ids(adapter: ModelAdapter, a: str, b: str) -> tuple[int, int]:
    return adapter.token_id(a), adapter.token_id(b)


# -- the engine -------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_zero_ablation_equals_zeroing_output_weights(family: str) -> None:
    model, tok = tiny_model(family, seed=2)
    adapter = ModelAdapter(model.double(), tok, "t")
    inputs = adapter.encode(["the movie was not good", "i loved it"])
    eff, f0 = heads.ablation_effects(adapter, inputs, ablation="zero")
    dh = adapter.d_model // adapter.n_heads
    for l, h in [(0, 1), (1, 3)]:
        twin = copy.deepcopy(model)
        twin.set_attn_implementation("eager")
        o = adapter.family.o_proj.split(".")
        layer = twin.base_model
        for part in adapter.family.layers.split("."):
            layer = getattr(layer, part)
        layer = layer[l]
        for part in o:
            layer = getattr(layer, part)
        with torch.no_grad():
            if type(layer).__name__ == "Conv1D":
                layer.weight[h * dh : (h + 1) * dh] = 0
            else:
                layer.weight[:, h * dh : (h + 1) * dh] = 0
            out = twin(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask).logits
        logits = adapter.select_logits(out, inputs)
        clean = adapter.forward(inputs).logits
        idx = clean.argmax(-1)
        expect = (
            torch.softmax(logits, -1).gather(1, idx[:, None])[:, 0]
            - torch.softmax(clean, -1).gather(1, idx[:, None])[:, 0]
        )
        np.testing.assert_allclose(eff[:, l, h], expect.numpy(), atol=1e-5)
        assert np.abs(expect.numpy()).max() > 1e-6


def test_patch_own_activation_changes_nothing() -> None:
    model, tok = tiny_model("llama", seed=1)
    adapter = ModelAdapter(model.double(), tok, "t")
    x = adapter.encode(CLEAN)
    sites = ["layers.0.resid_pre", "layers.1.attn.z", "layers.1.mlp.out", "layers.0.attn.pattern"]
    rec = adapter.forward(x, record=sites)
    ivs = [Intervention(s, engine.patch(rec.cache[s])) for s in sites]
    torch.testing.assert_close(engine.run(adapter, x, ivs).logits, rec.logits, atol=1e-6, rtol=0)


def test_mean_and_resample_strategies() -> None:
    model, tok = tiny_model("gpt2", seed=1)
    adapter = ModelAdapter(model.double(), tok, "t")
    ref = adapter.encode(["the movie was good", "i hated it"])
    pool = engine.site_pool(adapter, ref, ["layers.0.attn.z"])["layers.0.attn.z"]
    assert pool.shape[0] == sum(ref.lengths)
    x = adapter.encode("i loved the film")
    seen = {}

    def spy(a):  # noqa: E306
        seen["z"] = a
        return a

    engine.run(
        adapter,
        x,
        [Intervention("layers.0.attn.z", engine.mean(pool.mean(0)), head=2)],
        extra_edits={"layers.0.attn.z": spy},
    )
    torch.testing.assert_close(seen["z"][0, :, 2], pool.mean(0)[2].expand(x.lengths[0], -1))
    torch.testing.assert_close(
        seen["z"][0, :, 1], adapter.forward(x, record=["layers.0.attn.z"]).cache["layers.0.attn.z"][0, :, 1]
    )
    engine.run(
        adapter,
        x,
        [Intervention("layers.0.attn.z", engine.resample(pool, seed=4))],
        extra_edits={"layers.0.attn.z": spy},
    )
    rows = seen["z"][0].reshape(x.lengths[0], -1)
    flat = pool.reshape(pool.shape[0], -1)
    assert all(bool((flat == r).all(1).any()) for r in rows)  # every position got a real reference activation


# -- known mechanism ----------------------------------------------------------------------------------
def test_ablation_and_importance_find_the_live_head() -> None:
    adapter = gpt2_mechanism([(1, 2)])
    x = adapter.encode([CLEAN, CORRUPT])
    eff, _ = heads.ablation_effects(adapter, x)
    mask = np.zeros((2, 4), bool)
    mask[1, 2] = True
    assert np.abs(eff[:, ~mask]).max() < 1e-6
    assert np.abs(eff[:, 1, 2]).min() > 1e-3
    imp = heads.head_importance(adapter, x)
    assert imp[:, ~mask].max() < 1e-6 and imp[:, 1, 2].min() > 1e-4
    ref = adapter.encode(["the movie was good", "i hated it"])
    eff_m, _ = heads.ablation_effects(adapter, x, ablation="mean", reference=ref)
    assert np.abs(eff_m[:, ~mask]).max() < 1e-6 and np.abs(eff_m[:, 1, 2]).min() > 1e-4


def test_michel_importance_matches_finite_differences() -> None:
    model, tok = tiny_model("bert", seed=5)
    adapter = ModelAdapter(model.double(), tok, "t")
    x = adapter.encode("the movie was not good")
    imp = heads.head_importance(adapter, x, labels=[2])[0]

    def loss(l: int, h: int, s: float) -> float:
        xi = torch.ones(2, 4, dtype=torch.float64)
        xi[l, h] = s
        logits = adapter.forward(x, edit=heads.head_mask_edits(adapter, xi)).logits
        return -torch.log_softmax(logits, -1)[0, 2].item()

    # central differences in float64; tolerance from the Richardson estimate |D(h) - D(h/2)| and rounding
    step = 1e-4
    for l, h in [(0, 0), (1, 2)]:
        d1 = (loss(l, h, 1 + step) - loss(l, h, 1 - step)) / (2 * step)
        d2 = (loss(l, h, 1 + step / 2) - loss(l, h, 1 - step / 2)) / step
        tol = 4 * abs(d1 - d2) + 100 * np.finfo(np.float64).eps * max(1.0, abs(loss(l, h, 1.0))) / step
        assert abs(abs(d2) - imp[l, h]) <= tol + np.finfo(np.float32).eps * imp[l, h]  # imp is returned as float32
        assert imp[l, h] > 100 * tol


def test_activation_patching_finds_the_head_and_full_patch_restores() -> None:
    adapter = gpt2_mechanism([(1, 2)])
    pair = patching.make_pair(adapter, CLEAN, CORRUPT, *ids(adapter, "mary", "john"))
    res = patching.activation_patching(adapter, pair)
    np.testing.assert_allclose(res["heads"][1, 2], 1.0, atol=1e-4)  # the only path
    others = np.delete(res["heads"].reshape(-1), 1 * 4 + 2)
    assert np.abs(others).max() < 1e-5
    for l in range(2):  # every position of the residual stream at once = the clean run
        x = pair.corrupt
        s = f"layers.{l}.resid_pre"
        src = adapter.forward(pair.clean, record=[s]).cache[s]
        ld = patching.logit_diff(
            engine.run(adapter, x, [Intervention(s, engine.patch(src))]).logits, pair.answer, pair.wrong
        )
        np.testing.assert_allclose(float(pair.normalise(ld)), 1.0, atol=1e-5)
    # the last position of resid_pre at layer 0 differs only at the changed token
    changed = [p for p, (a, b) in enumerate(zip(pair.clean.tokens[0], pair.corrupt.tokens[0])) if a != b]
    unchanged = [p for p in range(pair.clean.lengths[0]) if p not in changed]
    assert np.abs(res["resid_pre"][0, unchanged]).max() < 1e-6


def test_attribution_patching_exact_when_linear() -> None:
    # no final LayerNorm, MLPs zeroed: the logits are linear in the last layer's attn.z / attn.out
    adapter = gpt2_mechanism([(1, 0), (1, 2), (0, 1), (0, 3)], no_ln_f=True)
    pair = patching.make_pair(adapter, CLEAN, CORRUPT, *ids(adapter, "mary", "john"))
    real = patching.activation_patching(adapter, pair)
    approx = patching.attribution_patching(adapter, pair)
    np.testing.assert_allclose(approx["heads"][1], real["heads"][1], atol=1e-4)
    np.testing.assert_allclose(approx["attn.out"][1], real["attn.out"][1], atol=1e-4)
    assert np.abs(real["heads"][1]).max() > 0.05
    # layer 0 goes through attention softmax: not linear, so the two may differ (and do)
    cmp = patching.compare(real, approx)
    assert set(cmp) == {"resid_pre", "attn.out", "mlp.out", "heads"}


def test_path_patching_finds_the_sender() -> None:
    adapter = gpt2_mechanism([(0, 1), (1, 2)])
    pair = patching.make_pair(adapter, CLEAN, CORRUPT, *ids(adapter, "mary", "john"))
    pp = patching.path_patching(adapter, pair, receivers=[(1, 2)])
    assert np.isnan(pp[1]).all()
    dead = [0, 2, 3]
    np.testing.assert_allclose(pp[0, dead], 1.0, atol=1e-5)
    assert abs(pp[0, 1] - 1.0) > 1e-3
    direct = patching.path_patching(adapter, pair)  # receiver: logits
    np.testing.assert_allclose(direct[1, [0, 1, 3]], 1.0, atol=1e-5)
    # head (1, 2) is in the last layer: its path to the logits is its whole effect = noising it directly
    s = "layers.1.attn.z"
    src = adapter.forward(pair.corrupt, record=[s]).cache[s]
    ld = patching.logit_diff(
        engine.run(adapter, pair.clean, [Intervention(s, engine.patch(src), head=2)]).logits, pair.answer, pair.wrong
    )
    np.testing.assert_allclose(direct[1, 2], float(pair.normalise(ld)), atol=1e-5)


def test_mediation_on_single_path_model() -> None:
    adapter = gpt2_mechanism([(1, 2)])
    pr = [mediation.Prompt("the nurse said that", "the doctor said that", " she", " he")]
    res = mediation.mediation(adapter, pr, head_site="attn.z")
    null, sett = adapter.encode(pr[0].null), adapter.encode(pr[0].set)
    she, he = ids(adapter, " she", " he")
    y = lambda x: (lambda p: float(p[0, he] / p[0, she]))(torch.softmax(adapter.forward(x).logits, -1))  # noqa: E731
    te = y(sett) / y(null) - 1
    np.testing.assert_allclose(float(res["te"]), te, rtol=1e-4)
    assert abs(te) > 1e-3
    np.testing.assert_allclose(res["head_nie"][1, 2], te, rtol=1e-4)  # the only path: NIE = TE
    np.testing.assert_allclose(res["head_nde"][1, 2], 0.0, atol=1e-5)
    nie = res["head_nie"].copy()
    nie[1, 2] = 0
    assert np.abs(nie).max() < 1e-5
    np.testing.assert_allclose(res["layer_nie"][0, 1], te, rtol=1e-4)  # layer 1 attn.out


# -- bad input ----------------------------------------------------------------------------------
def test_bad_input() -> None:
    adapter = gpt2_mechanism([(1, 2)])
    with pytest.raises(StreetlampError, match="same token length"):
        patching.make_pair(adapter, CLEAN, "when mary went to the store")
    with pytest.raises(StreetlampError, match="give one token"):
        adapter.token_id("mary john")
    with pytest.raises(StreetlampError, match="out of range"):
        engine.check_layer_head(adapter, 2, 0)
    with pytest.raises(StreetlampError, match="out of range"):
        engine.check_layer_head(adapter, 0, 4)
    pair = patching.make_pair(adapter, CLEAN, CORRUPT, *ids(adapter, "mary", "john"))
    with pytest.raises(StreetlampError, match="out of range"):
        patching.path_patching(adapter, pair, receivers=[(5, 0)])
    with pytest.raises(StreetlampError, match="nothing to restore"):
        patching.make_pair(adapter, CLEAN, CLEAN, *ids(adapter, "mary", "john"))
    with pytest.raises(StreetlampError, match="reference"):
        heads.ablation_effects(adapter, pair.clean, ablation="mean")
    with pytest.raises(StreetlampError, match="head axis"):
        engine.run(adapter, pair.clean, [Intervention("layers.0.mlp.out", engine.zero, head=1)])


def test_no_leaked_hooks() -> None:
    adapter = gpt2_mechanism([(1, 2)])
    pair = patching.make_pair(adapter, CLEAN, CORRUPT, *ids(adapter, "mary", "john"))
    patching.attribution_patching(adapter, pair)
    patching.path_patching(adapter, pair)
    for m in adapter.hf_model.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks


def composed_gpt2() -> ModelAdapter:
    """Tiny GPT-2 where the sender (0, 1) reaches the output three ways: directly, through head
    (1, 2) and through head (1, 0) (plus live MLPs). Freezing the non-receiver heads is then what
    separates one path from the total effect."""
    model, tok = tiny_model("gpt2", seed=5)
    dh = model.config.n_embd // model.config.n_head
    live = {(0, 1), (1, 0), (1, 2)}
    with torch.no_grad():
        for l, block in enumerate(model.transformer.h):
            for h in range(model.config.n_head):
                block.attn.c_proj.weight[h * dh : (h + 1) * dh] *= 8.0 if (l, h) in live else 0.0
            block.attn.c_attn.weight[:, : 2 * model.config.n_embd] *= 6.0
    return ModelAdapter(model.double(), tok, "tiny-gpt2-composed")


def manual_z_run(
    adapter: ModelAdapter,
    ids: torch.Tensor,
    replace: dict[tuple[int, int], torch.Tensor],
    record: list[tuple[int, int]],
) -> tuple[torch.Tensor, dict]:
    """Hugging Face GPT-2 with pre-hooks on each block's c_proj (its input is the heads' z side by
    side): head slices in ``replace`` are overwritten, those in ``record`` read. No streetlamp code."""
    model = adapter.hf_model
    dh = model.config.n_embd // model.config.n_head
    seen: dict = {}
    hooks = []
    for l, block in enumerate(model.transformer.h):

        def pre(mod, args, l=l):
            z = args[0].clone()
            for (ll, h), v in replace.items():
                if ll == l:
                    z[..., h * dh : (h + 1) * dh] = v
            for ll, h in record:
                if ll == l:
                    seen[(ll, h)] = z[..., h * dh : (h + 1) * dh].clone()
            return (z,)

        hooks.append(block.attn.c_proj.register_forward_pre_hook(pre))
    try:
        with torch.no_grad():
            logits = model(input_ids=ids).logits[:, -1]
    finally:
        for hk in hooks:
            hk.remove()
    return logits, seen


def test_path_patching_equals_a_hand_made_path_patch() -> None:
    """Wang et al. 2022's three steps, re-done with plain hooks on the Hugging Face model: sender
    (0, 1) from the corrupted run, every other head frozen at its clean output (receivers
    recomputed), MLPs recomputed; then the receivers' new outputs patched into a clean run."""
    adapter = composed_gpt2()
    pair = patching.make_pair(adapter, CLEAN, CORRUPT, *ids(adapter, "mary", "john"))
    L, H = adapter.n_layers, adapter.n_heads
    everything = [(l, h) for l in range(L) for h in range(H)]
    c_ids, k_ids = pair.clean.input_ids, pair.corrupt.input_ids
    _, clean_z = manual_z_run(adapter, c_ids, {}, everything)
    _, corrupt_z = manual_z_run(adapter, k_ids, {}, everything)

    def norm(logits: torch.Tensor) -> float:
        return float(pair.normalise(patching.logit_diff(logits, pair.answer, pair.wrong))[0])

    def by_hand(sender: tuple[int, int], receivers: list[tuple[int, int]]) -> float:
        frozen = {lh: clean_z[lh] for lh in everything if lh not in receivers and lh != sender}
        logits, seen = manual_z_run(adapter, c_ids, {**frozen, sender: corrupt_z[sender]}, receivers)
        if not receivers:
            return norm(logits)
        return norm(manual_z_run(adapter, c_ids, {r: seen[r] for r in receivers}, [])[0])

    via_12 = patching.path_patching(adapter, pair, receivers=[(1, 2)])
    direct = patching.path_patching(adapter, pair)
    for h in range(H):
        assert via_12[0, h] == pytest.approx(by_hand((0, h), [(1, 2)]), abs=1e-5)
        assert direct[0, h] == pytest.approx(by_hand((0, h), []), abs=1e-5)
    # the three numbers differ for the live sender, so freezing is exercised, not a no-op
    effect = lambda v: abs(1.0 - v)  # noqa: E731  (1 = clean, 0 = fully corrupted)
    assert effect(via_12[0, 1]) > 0.02 and effect(direct[0, 1]) > 0.02
    assert abs(via_12[0, 1] - direct[0, 1]) > 0.02
    # and the sender's total (noising) effect is none of its single paths
    noised = by_hand((0, 1), [(1, 0), (1, 1), (1, 2), (1, 3)])  # every downstream head recomputed
    assert abs(noised - via_12[0, 1]) > 0.02 and abs(noised - direct[0, 1]) > 0.02
