"""The head atlas' library (issue 25): statistics by hand, head types equal lens', a pass started at layer l
equals the full pass, exact ablation equals ``heads``, the estimate equals its closed form, light against use."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr

from streetlamp.interventions import atlas_effects as E
from streetlamp.interventions import engine
from streetlamp.interventions.atlas_chunks import Chunk, Context, stats_chunk
from streetlamp.interventions.atlas_midstack import layer_output_arity, start_at
from streetlamp.interventions.atlas_stats import pattern_stats
from streetlamp.interventions.atlas_use import sink_share, spearman_ci, summarise
from streetlamp.interventions.head_types import detect_head_types, random_repeated
from streetlamp.interventions.heads import ablation_effects
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.tiny import tiny_model
from tests.conftest import F64_TOL

TEXTS = ["the movie was good and the acting was great", "bad film", "john gave a drink to mary"]


def adapter64(family: str, seed: int = 2) -> ModelAdapter:
    model, tok = tiny_model(family, seed=seed, layers=3)
    return ModelAdapter(model.double(), tok, f"tiny-{family}")


def test_statistics_by_hand_on_four_tokens() -> None:
    a = np.array([[1, 0, 0, 0], [0.5, 0.5, 0, 0], [0.2, 0.3, 0.5, 0], [0.1, 0.6, 0.1, 0.2]])
    s = pattern_stats(a[None, None], np.array([5, 7, 5, 7]), explained=3, causal=True)
    ln = math.log
    h3 = -(0.1 * ln(0.1) * 2 + 0.6 * ln(0.6) + 0.2 * ln(0.2))
    want = {
        "entropy": (0 + ln(2) + -(0.2 * ln(0.2) + 0.3 * ln(0.3) + 0.5 * ln(0.5)) + h3) / 4,
        "sink": (0.5 + 0.2 + 0.1) / 3,
        "first_token": (1 + 0.5 + 0.2 + 0.1) / 4,  # Gu et al.'s α¹: every query, the first included
        "self": (1 + 0.5 + 0.5 + 0.2) / 4,
        "distance": (0 + 0.5 + (0.2 * 2 + 0.3) + (0.1 * 3 + 0.6 * 2 + 0.1)) / 4,
        "previous_token": (0.5 + 0.3 + 0.1) / 3,
        "duplicate_token": (0.2 + 0.6) / 2,  # query 2 (token 5) -> key 0, query 3 (token 7) -> key 1
        "induction": (0.3 + 0.1) / 2,  # the token after the earlier copy: keys 1 and 2
        "concentration": 1 - h3 / ln(4),
        "prominence": 0.4,  # max(concentration 0.21, previous 0.3, duplicate 0.4, induction 0.2)
    }
    for k, v in want.items():
        assert s[k].shape == (1, 1)
        assert abs(float(s[k][0, 0]) - v) < F64_TOL, k
        assert abs(v) > 0.1  # every value is far above the tolerance


def test_encoder_distance_and_concentration_by_hand() -> None:
    """An encoder's explained row ([CLS], position 0) sees every key; distances count both directions."""
    a = np.array([[0.5, 0.5, 0], [0, 0, 1], [1 / 3, 1 / 3, 1 / 3]])
    s = pattern_stats(a[None, None], np.array([1, 2, 3]), explained=0, causal=False)
    assert abs(s["distance"][0, 0] - (0.5 + 1 + (2 / 3 + 1 / 3)) / 3) < F64_TOL
    assert abs(s["concentration"][0, 0] - (1 - math.log(2) / math.log(3))) < F64_TOL
    assert np.isnan(s["duplicate_token"][0, 0]) and np.isnan(s["induction"][0, 0])


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_head_types_equal_lens_on_the_same_sequences(family: str) -> None:
    """The atlas' previous-token, duplicate-token, induction and sink scores, averaged over lens' random
    repeated sequences, equal lens' head types (detect_head_types) on them; batched with padding (a
    shorter sequence in the batch) the scores of a sequence do not change."""
    a = adapter64(family)
    seqs = random_repeated(a, 5, 3, seed=4)
    lens = detect_head_types(a, length=5, n_seqs=3, seed=4)
    short = [int(t) for t in seqs[0][:4]]
    st = stats_chunk(a, Chunk([0, 1, 2, 3], [list(map(int, s)) for s in seqs] + [short]), Context(batch_size=12))
    for ours, theirs in (("previous_token", "previous_token"), ("duplicate_token", "duplicate_token")):
        np.testing.assert_allclose(st[ours][:3].mean(0), lens[theirs], rtol=0, atol=F64_TOL)
    np.testing.assert_allclose(st["induction"][:3].mean(0), lens["induction"], rtol=0, atol=F64_TOL)
    np.testing.assert_allclose(st["sink"][:3].mean(0), lens["attention_sink"], rtol=0, atol=F64_TOL)
    assert lens["previous_token"].max() > 0.1 and lens["attention_sink"].max() > 0.1
    alone = stats_chunk(a, Chunk([3], [short]), Context())
    for k in ("entropy", "sink", "distance", "concentration"):
        np.testing.assert_allclose(st[k][3], alone[k][0], rtol=0, atol=F64_TOL)


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_first_token_is_gu_alpha_from_hugging_face_attentions(family: str) -> None:
    """The atlas' ``first_token`` (Gu et al.'s α¹ per sequence: attention to the first token, mean over
    every query, the first included) equals numpy on Hugging Face's own ``output_attentions`` of each
    sequence alone (float64, eager), batched with padding; Sink₁^ε over heads follows by counting."""
    a = adapter64(family)
    rng = np.random.default_rng(5)
    vocab = a.hf_model.config.vocab_size
    seqs = [[int(t) for t in rng.integers(5, vocab, n)] for n in (7, 4, 6)]
    st = stats_chunk(a, Chunk([0, 1, 2], seqs), Context(batch_size=64))
    want = []
    for ids in seqs:
        with torch.no_grad():
            att = a.hf_model(torch.tensor([ids]), output_attentions=True).attentions  # L x [1, H, q, k]
        p = np.stack([x[0].numpy() for x in att])  # [L, H, q, k]
        want.append(p[:, :, :, 0].mean(-1))
    np.testing.assert_allclose(st["first_token"], np.stack(want), rtol=0, atol=F64_TOL)
    assert np.ptp(np.stack(want)) > 0.05  # heads and sequences differ
    alpha = np.stack(want).mean(0)  # [L, H]: mean over sequences
    t = pd.DataFrame(
        [
            {"layer": l, "head": h, "sequence": q, **{k: st[k][q, l, h] for k in st if st[k].ndim == 3}}
            for q in range(3)
            for l in range(alpha.shape[0])
            for h in range(alpha.shape[1])
        ]
    ).assign(prominence=0.5, kl_explained=0.0, dlogp=0.0, dlogp_est=0.0, dla=0.0, kl_mean=0.0, dloss=0.0,
             audit="all", exact=True)  # fmt: skip
    s = summarise(t, floor=1e-3, striking=0.5, n_boot=10).sort_values(["layer", "head"])
    np.testing.assert_allclose(s.first_token, alpha.reshape(-1), rtol=0, atol=F64_TOL)
    assert s.sink_head.tolist() == (alpha.reshape(-1) > 0.3).tolist()
    assert sink_share(s) == pytest.approx(float((alpha > 0.3).mean()), abs=0)


@pytest.mark.parametrize("family", ["bert", "llama", "gpt2", "deberta-v2", "modernbert", "gemma2"])
def test_pass_started_at_layer_l_equals_the_full_pass(family: str) -> None:
    """With a head ablated in layer l, the pass that starts at l from the stored hidden state gives the
    full pass's output distribution (float64), and no layer below l runs."""
    a = adapter64(family)
    inp = a.encode(TEXTS)
    clean = E.clean_run(a, inp)
    arity = layer_output_arity(a, inp)
    calls = []
    hook = a.attn_modules[0].register_forward_hook(lambda m, i, o: calls.append(1))
    try:
        for l in (1, 2):
            ivs = [engine.Intervention(f"layers.{l}.attn.z", engine.zero, head=1)]
            full, full_pos, _ = E._logp(a, inp, engine.compile_edits(ivs))
            n0 = len(calls)
            with torch.no_grad(), start_at(a, l, clean.resid[l], arity):
                mid, mid_pos, _ = E._logp(a, inp, engine.compile_edits(ivs))
            assert len(calls) == n0  # layer 0's attention never ran
            np.testing.assert_allclose(mid.numpy(), full.numpy(), rtol=0, atol=F64_TOL * 100)
            if full_pos is not None:
                real = inp.attention_mask.bool()
                np.testing.assert_allclose(mid_pos[real].numpy(), full_pos[real].numpy(), rtol=0, atol=F64_TOL * 100)
            assert (full - clean.logp).abs().max() > 1e-6  # the ablation moved the output
    finally:
        hook.remove()
    assert all(m.__dict__.get("forward") is None for m in a.layer_modules)  # the stubs are gone


@pytest.mark.parametrize("family", ["llama", "modernbert"])
def test_exact_ablation_equals_heads(family: str) -> None:
    """dprob of every (sequence, layer, head), mean-ablated over the corpus read, equals the heads command's
    ΔF (heads.ablation_effects with the same texts as the reference); zero ablation likewise."""
    a = adapter64(family)
    inp = a.encode(TEXTS)
    L, H = a.n_layers, a.n_heads
    clean = E.clean_run(a, inp)
    st = stats_chunk(a, Chunk(list(range(3)), inp.rows()), Context())
    mean = torch.from_numpy(st["zsum"] / st["n_tokens"][0])
    pairs = [(b, l, h) for b in range(3) for l in range(L) for h in range(H)]
    for kind in ("mean", "zero"):
        repl = {l: E.replacement(kind, z, mean[l]) for l, z in clean.z.items()}
        ours = E.exact(a, inp, clean, repl, pairs, batch_size=40)["dprob"].reshape(3, L, H)
        theirs, _ = ablation_effects(a, inp, ablation=kind, reference=inp)
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=F64_TOL)
        assert np.abs(theirs).max() > 1e-4


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_estimate_equals_its_closed_form(family: str) -> None:
    """dlogp_est = d/de log p(y) at z + e (z_abl - z), e = 0: central finite differences in float64
    (families whose forward is float64 throughout: Hugging Face runs Llama's RMSNorm in float32, whose
    rounding over e = 1e-5 would swamp the difference)."""
    a = adapter64(family)
    inp = a.encode(TEXTS)
    clean = E.clean_run(a, inp)
    mean = {l: z[inp.attention_mask.bool()].mean(0) for l, z in clean.z.items()}
    repl = {l: E.replacement("mean", z, mean[l]) for l, z in clean.z.items()}
    est = E.estimate(a, inp, repl, clean.pred)
    eps = 1e-5
    for b, l, h in [(0, 0, 1), (1, 2, 3), (2, 1, 0)]:
        sub = inp.select([b])
        z0, r = clean.z[l][b : b + 1, : sub.lengths[0]], repl[l][b : b + 1, : sub.lengths[0]]

        def f(e: float) -> float:
            def edit(a_: torch.Tensor) -> torch.Tensor:
                out = a_.clone()
                out[:, :, h] = z0[:, :, h] + e * (r[:, :, h] - z0[:, :, h])
                return out

            lp, _, _ = E._logp(a, sub, {f"layers.{l}.attn.z": edit})
            return float(lp[0, clean.pred[b]])

        fd = (f(eps) - f(-eps)) / (2 * eps)
        tol = 1e-9 + 1e-6 * abs(fd)  # float64 rounding over eps, and the O(eps^2) term of the difference
        assert abs(est[b, l, h] - fd) < tol
        assert abs(fd) > 100 * tol


def test_resample_takes_the_source_at_each_position() -> None:
    z = torch.zeros(1, 5, 2, 1)
    src = torch.arange(3, dtype=torch.float64).view(1, 3, 1, 1).expand(1, 3, 2, 1)
    pos = E.resample_positions(5, 3, np.random.default_rng(0))
    assert list(pos[:3]) == [0, 1, 2] and all(0 <= p < 3 for p in pos[3:])
    out = E.replacement("resample", z.double(), source=src, source_pos=[pos])
    assert out[0, :, 0, 0].tolist() == [float(p) for p in pos]


def _table(n: int = 60) -> pd.DataFrame:
    """Three heads: a striking unused one, an unremarkable used one, and one whose effect follows its pattern."""
    rng = np.random.default_rng(0)
    rows = []
    for s in range(n):
        p2 = rng.uniform(0, 0.4)
        for h, (prom, kl) in enumerate(
            [(0.9, 1e-6), (0.1, 0.5 + rng.uniform(0, 0.1)), (p2, p2 * 2 + rng.normal(0, 0.01))]
        ):
            rows.append(
                {
                    "layer": 0,
                    "head": h,
                    "sequence": s,
                    "prominence": prom,
                    "kl_explained": kl,
                    "dlogp": -kl,
                    "dlogp_est": -kl * 1.1,
                    "dla": 0.0,
                    "kl_mean": kl,
                    "dloss": kl,
                    "audit": "all",
                    "exact": True,
                    **{
                        k: 0.2
                        for k in (
                            "entropy",
                            "sink",
                            "first_token",
                            "self",
                            "distance",
                            "previous_token",
                            "duplicate_token",
                            "induction",
                            "concentration",
                        )
                    },
                }
            )
    return pd.DataFrame(rows)


def test_light_against_use_flags_and_correlation() -> None:
    t = _table()
    s = summarise(t, floor=1e-3, striking=0.5, n_boot=200)
    assert s.streetlight.tolist() == [True, False, False]
    assert s.unremarkable_used.tolist() == [False, True, False]
    # Sink₁^ε's column: mean attention to the first token (every query) above 0.3; its share over heads is
    # Sink₁^0.3. The query-0-free `sink` does not decide it.
    t2 = t.copy()
    t2.loc[t2["head"] == 1, "first_token"] = np.linspace(0.2, 0.5, int((t2["head"] == 1).sum()))  # mean 0.35
    t2.loc[t2["head"] == 2, "sink"] = 0.9
    first = t2.groupby(["layer", "head"]).first_token.mean().to_numpy()
    assert s.sink_head.tolist() == [False] * 3 and sink_share(s) == 0.0
    s2 = summarise(t2, floor=1e-3, striking=0.5, n_boot=20)
    assert s2.sink_head.tolist() == [bool(x > 0.3) for x in first] == [False, True, False]
    assert sink_share(s2) == pytest.approx(1 / 3) and np.isnan(sink_share(s2.drop(columns="first_token")))
    g = t[t["head"] == 2]
    rho = spearmanr(g.prominence, g.kl_explained).statistic
    assert abs(s.rho[2] - rho) < F64_TOL and s.rho_low[2] <= rho <= s.rho_high[2] and rho > 0.9
    assert s.effect_high[0] < 1e-3 < s.effect_low[1]
    assert not s.estimate_poor.any() and s.n_prominent_unused[0] == 60


def test_spearman_needs_three_pairs() -> None:
    assert all(np.isnan(spearman_ci(np.array([1.0, 2.0]), np.array([2.0, 1.0]), 10, 0)))


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2"])
def test_batched_dla_and_estimate_equal_their_references(family: str) -> None:
    """estimate_and_dla's one forward + backward gives the per-sequence DLA of lens'
    direct_logit_attribution (sandwich norms included: Gemma 2), the estimate of ``estimate`` and the clean
    prediction, rows of different lengths batched (right padding), float64."""
    a = adapter64(family)
    inp = a.encode(TEXTS)
    clean = E.clean_run(a, inp)
    mean = {l: z[inp.attention_mask.bool()].mean(0) for l, z in clean.z.items()}

    def repl(z: dict) -> dict:
        return {l: E.replacement("mean", zl, mean[l]) for l, zl in z.items()}

    est, dla, pred = E.estimate_and_dla(a, inp, repl)
    assert pred.tolist() == clean.pred.tolist()
    ref = E.dla(a, inp, clean.pred)
    np.testing.assert_allclose(dla, ref, rtol=0, atol=F64_TOL)
    assert np.abs(ref).max() > 1e3 * F64_TOL
    np.testing.assert_allclose(est, E.estimate(a, inp, repl(clean.z), clean.pred), rtol=0, atol=F64_TOL)
    assert np.abs(est).max() > 1e3 * F64_TOL


def test_atlas_modules_import_no_private_name() -> None:
    """No atlas module imports another module's private (underscored) name (issue 25 item: the store's
    atomic writer is public)."""
    import ast
    from pathlib import Path

    import streetlamp

    root = Path(streetlamp.__file__).parent
    files = [*root.glob("commands/atlas/*.py"), *root.glob("interventions/atlas_*.py")]
    assert len(files) >= 8
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                assert not [n.name for n in node.names if n.name.startswith("_")], (f, node.module)


def test_task_effects_equal_a_full_pass_with_the_engine() -> None:
    """atlas_task's per-head change in the logit difference (passes started at layer l, heads of a layer
    batched) equals a full forward with the engine's own Intervention, one (prompt, head) at a time, for
    the mean ablation and for patching from the corrupted prompt; float64."""
    from streetlamp.interventions.atlas_task import task_effects
    from streetlamp.interventions.circuits.tasks import TaskPair, encode_pairs

    a = adapter64("llama")
    tp = [
        TaskPair(
            "when mary and john went to the store john gave a drink to",
            "when mary and john went to the store she gave a drink to",
            " mary",
            " john",
        ),
        TaskPair("the movie was good but the plot was", "the film was bad but the plot was", " fun", " boring"),
    ]
    pairs = encode_pairs(a, tp)
    mean = np.random.default_rng(0).normal(size=(a.n_layers, a.n_heads, a.hf_model.config.head_dim))
    eff = task_effects(a, pairs, "mean", mean)
    corrupt = E.clean_run(a, pairs.corrupt)

    def ld(inp, ivs) -> float:
        logits = engine.run(a, inp, ivs).logits.double()
        return float(logits[0, pairs.answer[b]] - logits[0, pairs.wrong[b]])

    for b, l, h in [(0, 0, 1), (1, 2, 3), (0, 1, 0), (1, 2, 0)]:
        sub = pairs.clean.select([b])
        n = sub.lengths[0]
        base = ld(sub, [])
        assert abs(eff["ld_clean"][b] - base) < F64_TOL
        m = torch.from_numpy(mean[l])
        ab = ld(sub, [engine.Intervention(f"layers.{l}.attn.z", lambda z, m=m: m.expand_as(z).to(z.dtype), head=h)])
        src = corrupt.z[l][b : b + 1, :n]
        pa = ld(sub, [engine.Intervention(f"layers.{l}.attn.z", lambda z, s=src: s, head=h)])
        assert abs(eff["ablate"][b, l, h] - (ab - base)) < F64_TOL * max(1.0, abs(base))
        assert abs(eff["patch"][b, l, h] - (pa - base)) < F64_TOL * max(1.0, abs(base))
    assert np.abs(eff["ablate"]).max() > 1e-3 and np.abs(eff["patch"]).max() > 1e-3
