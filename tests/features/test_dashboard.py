"""The feature dashboard's numbers (features/dashboard.py) against independent computations, float64.

The model: tiny Llama (2 layers, float64, RMSNorm and rotary tables in float64), an SAE at layer 1 (resid_pre,
``b_dec`` subtracted first), a transcoder at layer 0 (mlp, JumpReLU) and one at layer 1 (mlp, TopK). The
independent route never attaches the set: it runs the plain model one text at a time (no padding), takes the
site's input from the model itself (``resid_pre`` recorded; the MLP module's input from a hook of the test's
own) and encodes it by hand. Everything a dashboard ranks is then recomputed by brute force: the per-sequence
maxima sorted, the deciles by ``numpy.quantile`` and a loop, density by counting; the promoted tokens by
``W_U @ (γ ⊙ W_dec[f])`` from the Hugging Face weights.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streetlamp.features import dashboard as D
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.features import FeatureSet
from streetlamp.models.tiny import WORDS, tiny_model
from tests.interventions.test_feature_interventions import f64  # noqa: F401 (the float64 fixture)
from tests.models.test_features import random_dictionary

WIDTH = 40
TOL = 1e-10  # float64 through a 2-layer model: batched-with-padding vs alone differ by rounding (~1e-15)


def adapters() -> tuple[ModelAdapter, ModelAdapter, FeatureSet]:
    model, tok = tiny_model("llama", seed=3, layers=2)
    model = model.double()
    d = model.config.hidden_size
    fs = FeatureSet(
        {
            (1, "resid_pre"): random_dictionary(1, "resid_pre", d, WIDTH, "relu", seed=1),
            (0, "mlp"): random_dictionary(0, "mlp", d, WIDTH, "jumprelu", seed=2),
            (1, "mlp"): random_dictionary(1, "mlp", d, WIDTH, "topk", seed=3),
        },
        "random",
    )
    return ModelAdapter(model, tok, "tiny").attach_features(fs), ModelAdapter(model, tok, "tiny"), fs


def corpus_rows(adapter: ModelAdapter, n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, int(rng.integers(1, 14)))) for _ in range(n)]
    return [D.read_ids(adapter, t) for t in texts]


def by_hand(plain: ModelAdapter, fs: FeatureSet, row: list[int]) -> dict[tuple[int, str], np.ndarray]:
    """Every dictionary's latents ``[pos, width]`` for one unpadded row, from the plain model's own input to the
    site, encoded by hand (ReLU / JumpReLU ``z [z > θ]`` / TopK then ReLU)."""
    from streetlamp.models.adapter import Inputs

    got: dict[int, torch.Tensor] = {}
    hooks = []
    for l in range(plain.n_layers):

        def hook(m, args, kwargs, l=l):
            got[l] = (args[0] if args else kwargs["hidden_states"]).detach()

        hooks.append(plain.hf_model.model.layers[l].mlp.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        cache = plain.forward(Inputs.from_ids(plain, [row]), record=[f"layers.{l}.resid_pre" for l in range(2)]).cache
    finally:
        for h in hooks:
            h.remove()
    out = {}
    for (l, w), d in fs.dictionaries.items():
        x = (cache[f"layers.{l}.resid_pre"] if w == "resid_pre" else got[l])[0].double()
        z = (x - d.b_dec if d.b_dec_in else x) @ d.W_enc + d.b_enc
        if d.activation == "relu":
            a = torch.relu(z)
        elif d.activation == "jumprelu":
            a = z * (z > d.threshold)
        else:
            a = torch.zeros_like(z)
            for p in range(z.shape[0]):
                keep = torch.argsort(z[p], descending=True)[: d.k]
                a[p, keep] = torch.relu(z[p, keep])
        out[l, w] = a.numpy()
    return out


FEATS = [D.FeatureRef(1, "resid_pre", 3), D.FeatureRef(0, "mlp", 7), D.FeatureRef(1, "mlp", 11)]


@pytest.mark.usefixtures("f64")
def test_activations_are_the_direct_encoding_of_the_site() -> None:
    spliced, plain, fs = adapters()
    rows = corpus_rows(spliced, 6)
    acts, mask = D.feature_activations(spliced, rows, FEATS)
    allf = D.set_activations(spliced, rows)
    for b, row in enumerate(rows):
        hand = by_hand(plain, fs, row)
        n = len(row)
        assert mask[b].tolist() == [False] + [True] * (n - 1) + [False] * (mask.shape[1] - n)
        for j, f in enumerate(FEATS):
            np.testing.assert_allclose(acts[b, :n, j], hand[f.layer, f.where][:, f.index], atol=TOL, rtol=0)
        for key, a in allf.items():
            np.testing.assert_allclose(a[b, :n], hand[key], atol=TOL, rtol=0)
            assert np.isnan(a[b, n:]).all()
    assert all((hand[k] > 0).any() for k in hand)  # every dictionary fires somewhere: the check is not vacuous


def pick(plain: ModelAdapter, fs: FeatureSet, rows: list[list[int]]) -> list[D.FeatureRef]:
    """Per dictionary the feature firing on the share of sequences closest to 60% (by hand): deciles and top
    contexts over features that fire on some sequences and not on others."""
    hands = [by_hand(plain, fs, r) for r in rows]
    out = []
    for l, w in sorted(fs.dictionaries):
        share = np.mean([(h[l, w][1:] > 0).any(0) for h in hands], 0)
        out.append(D.FeatureRef(l, w, int(np.argmin(np.abs(share - 0.6)))))
    return out


def brute(plain: ModelAdapter, fs: FeatureSet, rows: list[list[int]], feats: list[D.FeatureRef]) -> dict:
    """Per feature: per-sequence max and argmax (positions >= 1), the tokens counted and the active ones."""
    maxima = np.zeros((len(rows), len(feats)))
    argmax = np.zeros((len(rows), len(feats)), int)
    active = np.zeros(len(feats), int)
    sums = np.zeros(len(feats))
    tokens = 0
    for q, row in enumerate(rows):
        hand = by_hand(plain, fs, row)
        tokens += len(row) - 1
        for j, f in enumerate(feats):
            a = hand[f.layer, f.where][1:, f.index]
            maxima[q, j], argmax[q, j] = a.max(), 1 + int(np.argmax(a))
            active[j] += int((a > 0).sum())
            sums[j] += a[a > 0].sum()
    return {"max": maxima, "arg": argmax, "active": active, "sum": sums, "tokens": tokens}


@pytest.mark.usefixtures("f64")
@pytest.mark.parametrize("batch", [1, 7])
def test_streamed_statistics_equal_brute_force(batch: int) -> None:
    spliced, plain, fs = adapters()
    rows = corpus_rows(spliced, 37, seed=1)
    K = 5
    feats = pick(plain, fs, rows)
    t = D.Tracker(len(feats), top_k=K, reservoir=1000, seed=0)
    D.stream(spliced, rows, feats, t, batch)
    b = brute(plain, fs, rows, feats)
    assert t.tokens == b["tokens"] and t.sequences == len(rows)
    np.testing.assert_array_equal(t.active, b["active"])  # density = active / tokens
    np.testing.assert_allclose(t.sum_active, b["sum"], rtol=1e-12)
    np.testing.assert_allclose(t.max, b["max"].max(0), atol=TOL)
    for j in range(len(feats)):
        m = b["max"][:, j]
        fire = np.flatnonzero(m > 0)
        assert 10 <= len(fire) < len(rows), (j, len(fire))  # fires on enough sequences for ten deciles, not all
        assert t.seq_active[j] == len(fire)
        # top contexts: the sequences sorted by their max (ties by index), the firing ones
        want = sorted(fire, key=lambda q: (-m[q], q))[:K]
        assert t.top[j][:, 1].astype(int).tolist() == want
        np.testing.assert_allclose(t.top[j][:, 0], m[want], atol=TOL)
        assert t.top[j][:, 2].astype(int).tolist() == b["arg"][want, j].tolist()
        # deciles: numpy's quantiles of every firing sequence's max (the reservoir holds them all), and the
        # decile of each by counting the boundaries at or below it
        assert t.exact(j) and sorted(t.res[j][:, 1].astype(int)) == fire.tolist()
        bounds = np.quantile(m[fire], np.arange(1, 10) / 10)
        np.testing.assert_allclose(t.bounds(j), bounds, atol=TOL)
        loop = [1 + sum(v >= q for q in bounds) for v in m[fire]]
        assert D.decile_of(m[fire], bounds).tolist() == loop
        assert sorted(set(loop)) == list(range(1, 11))
        # the decile samples: members of their decile (by the tracker's own boundaries and values; by the brute
        # ones unless within rounding of a boundary: a boundary is often a data point itself), as many as asked
        # where there are enough
        samples = t.decile_samples(j, 2)
        near = {q for q in fire if np.abs(m[q] - bounds).min() < 1e-9}
        for d, r in samples.items():
            assert D.decile_of(r[:, 0], t.bounds(j)).tolist() == [d] * len(r)
            in_d = [q for q, dd in zip(fire, loop, strict=True) if dd == d]
            assert set(r[:, 1].astype(int)) - set(in_d) <= near
            np.testing.assert_allclose(r[:, 0], m[r[:, 1].astype(int)], atol=TOL)
        mine = D.decile_of(t.res[j][:, 0], t.bounds(j)).tolist()
        assert {d: len(r) for d, r in samples.items()} == {d: min(2, mine.count(d)) for d in set(mine)}


@pytest.mark.usefixtures("f64")
def test_the_reservoir_is_bounded_and_seeded() -> None:
    """With fewer slots than firing sequences: the reservoir holds exactly R of them with their true maxima, the
    same R for the same seed whatever the batch size, and the top contexts are still exact."""
    spliced, plain, fs = adapters()
    rows = corpus_rows(spliced, 40, seed=2)
    feats = pick(plain, fs, rows)
    b = brute(plain, fs, rows, feats)
    runs = []
    for batch, seed in ((4, 5), (9, 5), (4, 6)):
        t = D.Tracker(len(feats), top_k=3, reservoir=10, seed=seed)
        D.stream(spliced, rows, feats, t, batch)
        runs.append(t)
    checked = 0
    for j in range(len(feats)):
        m = b["max"][:, j]
        fire = set(np.flatnonzero(m > 0).tolist())
        if len(fire) <= 10:
            continue
        for t in runs:
            assert len(t.res[j]) == 10 and not t.exact(j)
            members = t.res[j][:, 1].astype(int)
            assert len(set(members.tolist())) == 10 and set(members.tolist()) <= fire
            np.testing.assert_allclose(t.res[j][:, 0], m[members], atol=TOL)
            assert t.top[j][:, 1].astype(int).tolist() == sorted(fire, key=lambda q: (-m[q], q))[:3]
        same = [sorted(t.res[j][:, 1].astype(int).tolist()) for t in runs]
        # the stream's order is by length whatever the batch size, so the same seed keeps the same sample
        assert same[0] == same[1]
        checked += 1
    assert checked == len(feats)


@pytest.mark.usefixtures("f64")
def test_promoted_tokens_are_w_u_times_the_gained_decoder_direction() -> None:
    spliced, plain, fs = adapters()
    hf = plain.hf_model
    with torch.no_grad():  # a non-trivial final gain, so that leaving it out would show
        hf.model.norm.weight.copy_(torch.linspace(0.2, 2.0, hf.config.hidden_size, dtype=torch.float64))
    L = D.decoder_logits(spliced, FEATS)
    assert L is not None
    W_U = hf.get_output_embeddings().weight.detach().double()
    gamma = hf.model.norm.weight.detach().double()
    for j, f in enumerate(FEATS):
        want = (W_U @ (gamma * fs.get(f.layer, f.where).W_dec[f.index])).numpy()
        np.testing.assert_allclose(L[j], want, rtol=1e-12, atol=1e-14)
        without = (W_U @ fs.get(f.layer, f.where).W_dec[f.index]).numpy()
        assert np.abs(L[j] - without).max() > 1e-3


def test_feature_ids_are_checked() -> None:
    from streetlamp.errors import StreetlampError

    _, _, fs = adapters()
    assert D.parse_feature_ids("L1.mlp.3, 0.mlp.39,L1.mlp.3", fs) == [
        D.FeatureRef(1, "mlp", 3),
        D.FeatureRef(0, "mlp", 39),
    ]
    for bad, msg in [
        ("L1.mlp.40", "out of range"),
        ("L0.resid_pre.1", "no dictionary there"),
        ("L1.attn.2", "no dictionary there"),
        ("mlp.3", "L<layer>.<site>.<index>"),
        (" , ", "no feature"),
    ]:
        with pytest.raises(StreetlampError, match=msg):
            D.parse_feature_ids(bad, fs)
