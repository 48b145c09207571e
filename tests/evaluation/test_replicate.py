"""``streetlamp replicate``: every statistic of one chunk against a hand computation on tiny float64 models.

The independent routes: Hugging Face's own ``output_attentions`` (attention rows, and dF/dA by autograd
through them), forwards re-run with edits written here (zeroed items, uniform rows, permutations), a
naive O(n^2) Kendall tau-b, and the exact binomial law of a bootstrap mean of 0/1 values.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from scipy.stats import binom

import streetlamp
from streetlamp.commands.replicate import ReplicateCommandSettings
from streetlamp.errors import StreetlampError
from streetlamp.evaluation.replicate import Decision, ReplicateSettings, TaskExample, adv_layers, replicate_chunk
from streetlamp.methods.removal import sink_token
from streetlamp.methods.scorer import occlusion_replacement
from streetlamp.models.adapter import Inputs, ModelAdapter
from streetlamp.models.tiny import tiny_model
from streetlamp.stats import bootstrap_ci
from tests.test_stats import tau_b_brute

TEXTS = ["the movie was not good but the acting was great", "i loved it and it was fun"]
SEED = 5


@pytest.fixture(scope="module")
def llama() -> ModelAdapter:
    m, t = tiny_model("llama", seed=4)
    with torch.no_grad():
        m.lm_head.weight.mul_(30)  # outputs that move visibly when attention is edited
    return ModelAdapter(m.double(), t, "tiny-llama")


def _examples(adapter: ModelAdapter, per_head: bool) -> list[TaskExample]:
    out = []
    for i, text in enumerate(TEXTS):
        ids = adapter.tokenizer(text)["input_ids"]
        items = ~adapter.special_mask(ids)
        items[0] = i == 1  # text 0: as if the first word were the prompt's template; text 1: the first word is data
        items[-1] = False  # the explained position (the decoder removal rule never removes it)
        out.append(TaskExample(i, f"t:{i}", ids, text, i % 2, items, per_head and i == 0))
    return out


@pytest.fixture(scope="module")
def run(llama: ModelAdapter):
    tok = llama.tokenizer
    decision = Decision((tok.convert_tokens_to_ids("bad"), tok.convert_tokens_to_ids("good")))
    examples = _examples(llama, per_head=True)
    s = ReplicateSettings(seed=SEED, permutations=3, adv_steps=3, adv_layers=1, head_examples=1)
    rows, arrays = replicate_chunk(llama, decision, examples, s)
    table = {(e, m, k): v for e, m, k, v in rows}
    return decision, examples, s, table, arrays


def _dist(adapter: ModelAdapter, decision: Decision, ids: list[int], site_fn=None, layer: int = 0) -> np.ndarray:
    """The decision-space distribution of one text, optionally with an edit of one layer's pattern."""
    inp = Inputs.from_ids(adapter, [ids])
    edit = {f"layers.{layer}.attn.pattern": site_fn} if site_fn is not None else None
    with torch.no_grad():
        p = torch.softmax(adapter.forward(inp, edit=edit).logits.double(), -1)
    return decision.project(p)[0].numpy()


def _hf_attention(adapter: ModelAdapter, ids: list[int]):
    out = adapter.hf_model(input_ids=torch.tensor([ids]), output_attentions=True)
    return out.logits[0, -1], out.attentions


def _tvd(p: np.ndarray, q: np.ndarray) -> float:
    return 0.5 * float(np.abs(p - q).sum())


def _js_bits(p: np.ndarray, q: np.ndarray) -> float:
    m = (p + q) / 2
    kl = lambda a, b: float(sum(x * math.log2(x / y) for x, y in zip(a, b) if x > 0))  # noqa: E731
    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def test_decision_attention_and_taus(llama: ModelAdapter, run) -> None:
    decision, examples, _, table, arrays = run
    rep, tid, _ = occlusion_replacement(llama, "mask")
    for e in examples:
        logits, atts = _hf_attention(llama, e.ids)
        full = torch.softmax(logits.double(), -1)
        p = (full[list(decision.candidates)] / full[list(decision.candidates)].sum()).detach().numpy()
        pred = int(p.argmax())
        assert table[(e.id, "model", "correct")] == float(pred == e.gold)
        assert table[(e.id, "model", "prob")] == pytest.approx(p[pred], abs=1e-12)
        n = len(e.ids)
        rows = np.stack([a[0, :, n - 1, :].detach().numpy() for a in atts])  # [L, H, n]
        np.testing.assert_allclose(arrays[e.id]["attention"], rows, atol=1e-6)  # stored as float32
        # leave-one-out by hand: the token replaced (or deleted) and the decision-space TVD; the decoder removal
        # rule: a removed first token becomes the document-start token
        loo = np.zeros(n)
        for j in np.flatnonzero(e.items):
            r = list(e.ids)
            if tid is not None:
                r = r[:j] + [tid] + r[j + 1 :]
            else:
                r = [sink_token(llama)] + r[1:] if j == 0 else r[:j] + r[j + 1 :]
            loo[j] = _tvd(_dist(llama, decision, r), p)
        np.testing.assert_allclose(arrays[e.id]["loo_tvd"], loo, atol=1e-6)
        sal = arrays[e.id]["saliency"].astype(np.float64)
        items = e.items
        for l in range(llama.n_layers):
            assert table[(e.id, f"layer{l:02d}", "tau_attention_loo")] == pytest.approx(
                tau_b_brute(rows[l].mean(0)[items], loo[items]), abs=1e-5
            )
            for h in range(llama.n_heads):
                got = table[(e.id, f"head{l:02d}.{h:02d}", "tau_attention_gradient")]
                assert got == pytest.approx(tau_b_brute(rows[l, h][items], sal[items]), abs=1e-5)
        assert table[(e.id, "model", "tau_gradient_loo")] == pytest.approx(
            tau_b_brute(sal[items], loo[items]), abs=1e-5
        )


def test_saliency_ranks_the_decision(llama: ModelAdapter, run) -> None:
    """The stored saliency is ||dF/de_i|| up to one factor per text (F = the decision's probability)."""
    decision, examples, _, _, arrays = run
    emb = llama.hf_model.get_input_embeddings()
    for e in examples:
        x = emb(torch.tensor([e.ids])).detach().requires_grad_(True)
        full = torch.softmax(llama.hf_model(inputs_embeds=x).logits[0, -1].double(), -1)
        q = full[list(decision.candidates)] / full[list(decision.candidates)].sum()
        (g,) = torch.autograd.grad(q.max(), [x])
        want = g[0].norm(dim=-1).numpy()
        got = arrays[e.id]["saliency"].astype(np.float64)
        np.testing.assert_allclose(got / got.max(), want / want.max(), rtol=1e-4, atol=1e-6)


def _zero(cols: list[int], head: int | None = None, row: int | None = None):
    """Zero keys ``cols`` (in ``head`` or every head; in query ``row`` or every row) and renormalise."""

    def fn(p: torch.Tensor) -> torch.Tensor:
        z = p.clone()
        hs = slice(None) if head is None else head
        rs = slice(None) if row is None else row
        for j in cols:
            z[:, hs, rs, j] = 0
        s = z.sum(-1, keepdim=True)
        return torch.where(s > 0, z / torch.where(s > 0, s, torch.ones_like(s)), p)

    return fn


def _check_head_zeroing(llama, decision, table, e, l, a, idx, p0, pred, row=None) -> None:  # type: ignore[no-untyped-def]
    """Per-head zeroing at layer ``l``: each head's own top item (``a``: the explained rows ``[heads, n]``) zeroed in
    that head only (in query ``row`` or every row), against a full forward with the edit written here."""
    for h in range(llama.n_heads):
        key = (e.id, f"head{l:02d}.{h:02d}", "js_top_attention")
        if not e.per_head:
            assert key not in table
            continue
        j = int(idx[np.argmax(a[h][idx])])
        y = _dist(llama, decision, e.ids, _zero([j], h, row=row), l)
        assert table[key] == pytest.approx(_js_bits(y, p0), abs=1e-10)
        assert table[(e.id, f"head{l:02d}.{h:02d}", "flip_top_attention")] == float(int(y.argmax()) != pred)


def test_serrano_zeroing_per_layer_and_head(llama: ModelAdapter, run) -> None:
    decision, examples, s, table, _ = run
    for e in examples:
        logits, atts = _hf_attention(llama, e.ids)
        full = torch.softmax(logits.double(), -1)
        qd = full[list(decision.candidates)] / full[list(decision.candidates)].sum()
        pred = int(qd.argmax())
        grads = torch.autograd.grad(qd[pred], list(atts))  # dF/dA through HF's own attention weights
        p0 = qd.detach().numpy()
        idx = np.flatnonzero(e.items)
        n = len(e.ids)
        for l in range(llama.n_layers):
            a = atts[l][0, :, n - 1, :].detach().numpy()
            top_a = int(idx[np.argmax(a.mean(0)[idx])])
            top_g = int(idx[np.argmax(grads[l][0].sum((0, 1)).numpy()[idx])])
            others = [j for j in idx if j != top_a]
            rnd = int(np.random.default_rng([SEED * 1_000_003 + e.index, l]).choice(others))
            for name, j in (("top_attention", top_a), ("top_gradient", top_g), ("random", rnd)):
                y = _dist(llama, decision, e.ids, _zero([j]), l)
                assert table[(e.id, f"layer{l:02d}", f"tvd_{name}")] == pytest.approx(_tvd(y, p0), abs=1e-10)
                assert table[(e.id, f"layer{l:02d}", f"js_{name}")] == pytest.approx(_js_bits(y, p0), abs=1e-10)
                assert table[(e.id, f"layer{l:02d}", f"flip_{name}")] == float(int(y.argmax()) != pred)
            _check_head_zeroing(llama, decision, table, e, l, a, idx, p0, pred)


@pytest.mark.parametrize("reuse_prefix", [True, False])
def test_zeroing_in_the_explained_row_only(llama: ModelAdapter, reuse_prefix: bool) -> None:
    """``zero_rows="explained"``: the item is zeroed in the last query row only; with ``reuse_prefix`` that row
    runs alone after the KV cache. Both paths against a full forward with the edit written here."""
    tok = llama.tokenizer
    decision = Decision((tok.convert_tokens_to_ids("bad"), tok.convert_tokens_to_ids("good")))
    examples = _examples(llama, per_head=True)
    s = ReplicateSettings(seed=SEED, permutations=1, adv_steps=0, adv_layers=0, zero_rows="explained")
    rows, _ = replicate_chunk(llama, decision, examples, s, reuse_prefix=reuse_prefix)
    table = {(e, m, k): v for e, m, k, v in rows}
    moved = 0.0
    for e in examples:
        n = len(e.ids)
        _, atts = _hf_attention(llama, e.ids)
        p0 = _dist(llama, decision, e.ids)
        pred = int(p0.argmax())
        idx = np.flatnonzero(e.items)
        for l in range(llama.n_layers):
            a = atts[l][0, :, n - 1, :].detach().numpy()
            top_a = int(idx[np.argmax(a.mean(0)[idx])])
            y = _dist(llama, decision, e.ids, _zero([top_a], row=n - 1), l)
            assert table[(e.id, f"layer{l:02d}", "js_top_attention")] == pytest.approx(_js_bits(y, p0), abs=1e-10)
            assert table[(e.id, f"layer{l:02d}", "tvd_top_attention")] == pytest.approx(_tvd(y, p0), abs=1e-10)
            assert table[(e.id, f"layer{l:02d}", "flip_top_attention")] == float(int(y.argmax()) != pred)
            # not the every-row zeroing, which also edits the earlier query rows that read the item
            moved = max(moved, abs(_js_bits(_dist(llama, decision, e.ids, _zero([top_a]), l), p0) - _js_bits(y, p0)))
            _check_head_zeroing(llama, decision, table, e, l, a, idx, p0, pred, row=n - 1)
    assert moved > 1e-6  # the two zeroings differ on these texts, so the test tells them apart


def test_permuted_uniform_and_adversarial_attention(llama: ModelAdapter, run) -> None:
    decision, examples, s, table, _ = run
    for e in examples:
        n = len(e.ids)
        p0 = _dist(llama, decision, e.ids)
        pred = int(p0.argmax())
        for l in range(llama.n_layers):
            rng = np.random.default_rng([SEED * 1_000_003 + e.index, l])
            tv = []
            for _ in range(s.permutations):
                perm = torch.as_tensor(rng.permutation(n))

                def fn(p: torch.Tensor, perm=perm) -> torch.Tensor:
                    z = p.clone()
                    z[:, :, n - 1, :n] = p[:, :, n - 1, :n][..., perm]
                    return z

                tv.append(_tvd(_dist(llama, decision, e.ids, fn, l), p0))
            assert table[(e.id, f"layer{l:02d}", "perm_tvd_median")] == pytest.approx(float(np.median(tv)), abs=1e-10)

            def uni(p: torch.Tensor) -> torch.Tensor:  # causal: row q spreads over keys 0..q
                return torch.tril(torch.ones_like(p)) / torch.arange(1, p.shape[-1] + 1, dtype=p.dtype)[:, None]

            y = _dist(llama, decision, e.ids, uni, l)
            assert table[(e.id, f"layer{l:02d}", "uniform_tvd")] == pytest.approx(_tvd(y, p0), abs=1e-10)
            assert table[(e.id, f"layer{l:02d}", "uniform_flip")] == float(int(y.argmax()) != pred)
        adv = adv_layers(llama.n_layers, s.adv_layers)
        for l in range(llama.n_layers):
            key = (e.id, f"layer{l:02d}", "adv_tvd")
            if l not in adv:
                assert key not in table
                continue
            assert 0 <= table[key] <= s.eps  # the kept iterate satisfies the constraint
            assert 0 <= table[(e.id, f"layer{l:02d}", "adv_js")] <= 1


def test_prefix_path_equals_full_rows(llama: ModelAdapter, run) -> None:
    """Every intervention run from its first changed position after the KV cache gives the full rows' numbers:
    the adversarial search included (Adam acts per element, so per-text searches equal the joint one)."""
    decision, examples, s, table, arrays = run
    rows, arrays_full = replicate_chunk(llama, decision, examples, s, reuse_prefix=False)
    full = {(e, m, k): v for e, m, k, v in rows}
    assert full.keys() == table.keys()
    for key, v in full.items():
        assert table[key] == pytest.approx(v, abs=1e-9, nan_ok=True), key
    for e in examples:
        np.testing.assert_allclose(arrays[e.id]["loo_tvd"], arrays_full[e.id]["loo_tvd"], atol=1e-9)
    assert any(k[1] == "model" and k[2] == "tau_gradient_loo" for k in table)
    assert arrays[examples[1].id]["loo_tvd"][0] > 0  # the first token is an item of text 1 and was removed


def test_adv_layers_are_evenly_spaced() -> None:
    assert adv_layers(30, 3) == [0, 14, 29] or adv_layers(30, 3) == [0, 15, 29]
    assert adv_layers(6, 10) == list(range(6))
    assert adv_layers(30, 1) == [0] and adv_layers(30, 0) == []


def test_classifier_whole_output_decision() -> None:
    m, t = tiny_model("bert", seed=3)
    with torch.no_grad():
        m.classifier.weight.mul_(60)
    a = ModelAdapter(m.double(), t, "tiny-bert")
    ex = []
    for i, text in enumerate(TEXTS[:2]):
        ids = t(text)["input_ids"]
        ex.append(TaskExample(i, f"b:{i}", ids, text, 0, ~a.special_mask(ids)))
    rows, arrays = replicate_chunk(a, Decision(None), ex, ReplicateSettings(permutations=1, adv_steps=1, adv_layers=1))
    table = {(e, m_, k): v for e, m_, k, v in rows}
    for e in ex:
        with torch.no_grad():
            out = a.hf_model(input_ids=torch.tensor([e.ids]), output_attentions=True)
        p = torch.softmax(out.logits[0].double(), -1).numpy()
        assert table[(e.id, "model", "prob")] == pytest.approx(p.max(), abs=1e-12)
        rows0 = np.stack([x[0, :, 0, :].numpy() for x in out.attentions])  # [CLS] is the explained position
        np.testing.assert_allclose(arrays[e.id]["attention"], rows0, atol=1e-6)
        assert table[(e.id, "all_layers", "uniform_correct")] in (0.0, 1.0)


def test_classifier_explained_row_zeroing_edits_cls_only() -> None:
    """On an encoder the explained row is [CLS] (position 0): ``zero_rows="explained"`` zeroes the item there only."""
    m, t = tiny_model("bert", seed=3)
    with torch.no_grad():
        m.classifier.weight.mul_(60)
    a = ModelAdapter(m.double(), t, "tiny-bert")
    ids = t(TEXTS[0])["input_ids"]
    ex = [TaskExample(0, "b:0", ids, TEXTS[0], 0, ~a.special_mask(ids))]
    s = ReplicateSettings(permutations=1, adv_steps=0, adv_layers=0, zero_rows="explained", layers="1")
    rows, arrays = replicate_chunk(a, Decision(None), ex, s)
    table = {(e, m_, k): v for e, m_, k, v in rows}
    row = arrays["b:0"]["attention"][1].mean(0)
    top = int(np.flatnonzero(ex[0].items)[np.argmax(row[ex[0].items])])
    inp = Inputs.from_ids(a, [ids])
    with torch.no_grad():
        p0 = torch.softmax(a.forward(inp).logits.double(), -1)[0].numpy()
        y = torch.softmax(a.forward(inp, edit={"layers.1.attn.pattern": _zero([top], row=0)}).logits.double(), -1)
    assert table[("b:0", "layer01", "js_top_attention")] == pytest.approx(_js_bits(y[0].numpy(), p0), abs=1e-10)
    assert ("b:0", "layer00", "js_top_attention") not in table  # --layers 1 only


def test_bootstrap_ci_matches_the_binomial_law() -> None:
    """Bootstrap means of n 0/1 values with k ones are Binomial(n, k/n)/n: the percentile interval is
    the binomial quantiles up to the Monte Carlo error of n_boot resamples (one grid step 1/n)."""
    n, k = 40, 12
    v = np.r_[np.ones(k), np.zeros(n - k), [np.nan]]  # the NaN is dropped
    mean, lo, hi, used = bootstrap_ci(v, n_boot=20000, seed=1)
    assert used == n and mean == k / n
    assert abs(lo - binom.ppf(0.025, n, k / n) / n) <= 1 / n + 1e-12
    assert abs(hi - binom.ppf(0.975, n, k / n) / n) <= 1 / n + 1e-12
    assert bootstrap_ci(np.array([3.0]))[1:3] != bootstrap_ci(np.array([3.0]))[1:3]  # NaN interval for one value
    assert bootstrap_ci(np.array([np.nan]))[3] == 0
    same = bootstrap_ci(np.full(7, 0.25))
    assert same[:3] == (0.25, 0.25, 0.25)


def test_summary_uses_the_bootstrap_per_dataset() -> None:
    import pandas as pd

    from streetlamp.commands.replicate.run import parse_data, summarise

    df = pd.DataFrame(
        [(f"{d}:{i}", "layer00", "flip_random", float(i % 3 == 0)) for d in ("movies", "recall") for i in range(9)],
        columns=["example_id", "method", "metric", "value"],
    )
    s = summarise(df, n_boot=500)
    for d in ("movies", "recall"):
        r = s[s.dataset == d].iloc[0]
        want = bootstrap_ci(df[df.example_id.str.startswith(d)]["value"].to_numpy(), n_boot=500)
        assert (r["mean"], r["low"], r["high"], r["n"]) == want
    assert parse_data("movies, recall,movies") == ["movies", "recall"]
    with pytest.raises(StreetlampError):
        parse_data("movies,imdb")


def test_pooled_heads_and_paired_differences(tmp_path) -> None:
    """``heads{L}`` = per example the mean over the layer's heads; ``*_top_minus_random`` = the paired
    per-example difference; both bootstrapped like any metric and written to summary.md."""
    import pandas as pd

    from streetlamp.commands.replicate.run import summarise, write_summary

    rng = np.random.default_rng(0)
    rows = []
    for i in range(12):
        eid = f"recall:{i}"
        rows += [(eid, "model", "correct", 1.0), (eid, "layer03", "js_random", rng.random())]
        rows += [(eid, "layer03", "js_top_attention", rng.random())]
        for h in range(3):
            for k in ("flip_top_attention", "flip_random", "js_top_attention", "js_random"):
                rows.append((eid, f"head03.{h:02d}", k, float(rng.integers(2)) if k[0] == "f" else rng.random()))
            rows.append((eid, f"head03.{h:02d}", "tau_attention_loo", rng.uniform(-1, 1)))
    df = pd.DataFrame(rows, columns=["example_id", "method", "metric", "value"])
    s = summarise(df, n_boot=300).set_index(["method", "metric"])
    v = df.set_index(["example_id", "method", "metric"])["value"]
    per_ex = np.array(
        [np.mean([v[(f"recall:{i}", f"head03.{h:02d}", "flip_top_attention")] for h in range(3)]) for i in range(12)]
    )
    per_ex_r = np.array(
        [np.mean([v[(f"recall:{i}", f"head03.{h:02d}", "flip_random")] for h in range(3)]) for i in range(12)]
    )
    assert s.loc[("heads03", "flip_top_attention"), "mean"] == pytest.approx(per_ex.mean(), abs=1e-12)
    assert s.loc[("heads03", "flip_top_minus_random"), "mean"] == pytest.approx((per_ex - per_ex_r).mean(), abs=1e-12)
    order = sorted(range(12), key=lambda i: f"recall:{i}")  # the examples in the order pandas groups them
    want = bootstrap_ci((per_ex - per_ex_r)[order], n_boot=300)
    got = s.loc[("heads03", "flip_top_minus_random")]
    assert (got["mean"], got["low"], got["high"], got["n"]) == pytest.approx(want)
    d = np.array(
        [
            v[(f"recall:{i}", "layer03", "js_top_attention")] - v[(f"recall:{i}", "layer03", "js_random")]
            for i in range(12)
        ]
    )
    assert s.loc[("layer03", "js_top_minus_random"), "mean"] == pytest.approx(d.mean(), abs=1e-12)
    d0 = [
        v[(f"recall:{i}", "head03.00", "js_top_attention")] - v[(f"recall:{i}", "head03.00", "js_random")]
        for i in range(12)
    ]
    assert s.loc[("head03.00", "js_top_minus_random"), "mean"] == pytest.approx(np.mean(d0), abs=1e-12)
    text = "\n".join(write_summary(tmp_path, summarise(df, n_boot=300), "m", ReplicateSettings(zero_rows="explained")))
    assert "zeroing in the explained row" in text and "first token an item" in text
    assert "| 3 | " in text and "heads' tau(att,loo)" in text  # the head digest parses heads03 apart from head03.xx


def test_intervention_layers_and_bad_specs() -> None:
    from streetlamp.evaluation.replicate import intervention_layers

    assert intervention_layers(30, "every:3") == [0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 29]
    assert intervention_layers(4, "all") == [0, 1, 2, 3] and intervention_layers(4, "3,1") == [1, 3]
    for bad in ("every:0", "4", "x", "-1"):
        with pytest.raises(StreetlampError):
            intervention_layers(4, bad)


def test_runner_resumes_and_refuses_bad_input(llama: ModelAdapter, tmp_path, monkeypatch) -> None:
    """The command on a tiny causal LM: one folder, resumable; bad input refused before anything is written."""
    import streetlamp.commands.replicate.run as rr
    from streetlamp.data.loaders import Dataset, Example

    ex = [Example("r-0", "the capital of france is", "paris"), Example("r-1", "i loved it", "and")]
    ds = Dataset("recall", "test", [*ex, Example("r-2", "mary went to", "the store")])  # a two-token answer
    monkeypatch.setattr(rr, "load_dataset", lambda name: Dataset(ds.name, ds.source, list(ds.examples)))
    s = ReplicateCommandSettings(data=["recall"], chunk_size=1, permutations=1, adv_steps=1, adv_layers=0, layers="1")
    out = tmp_path / "run"
    res = rr.replicate(llama, s, out)
    assert res.n_computed_chunks == 2 and (out / "summary.md").exists() and (out / "manifest.json").exists()
    recall = json.loads((out / "manifest.json").read_text())["settings"]["data"]["recall"]
    assert recall["skipped_multi_token_answer"] == ["r-2"] and recall["n_examples"] == 2
    methods = set(res.summary.method)
    assert "layer01" in methods and "layer00" in methods  # layer 0: taus only
    assert not res.summary[(res.summary.method == "layer00") & (res.summary.metric == "uniform_tvd")].shape[0]
    again = rr.replicate(llama, s, out)
    assert again.n_computed_chunks == 0 and again.summary.equals(res.summary)
    m, t = tiny_model("bert", seed=3)
    with pytest.raises(StreetlampError, match="not a causal LM"):
        rr.replicate(ModelAdapter(m, t, "tiny-bert"), s, tmp_path / "bert")
    with pytest.raises(StreetlampError, match="--layers '9': the model has layers 0..1"):  # the API: the pipeline
        streetlamp.replicate(model=llama, data="recall", layers="9", out=str(tmp_path / "bad"))
    with pytest.raises(StreetlampError, match="--zero-rows must be one of all, explained"):
        streetlamp.replicate(model=llama, data="recall", zero_rows="first", out=str(tmp_path / "rows"))
    assert not (tmp_path / "bert").exists() and not (tmp_path / "bad").exists() and not (tmp_path / "rows").exists()
    # the explained-row zeroing and the sink control reach the run and its manifest
    s2 = ReplicateCommandSettings(
        data=["recall"],
        chunk_size=2,
        permutations=1,
        adv_steps=0,
        adv_layers=0,
        layers="1",
        zero_rows="explained",
        exclude_first=True,
    )
    rr.replicate(llama, s2, tmp_path / "x")
    stored = json.loads((tmp_path / "x" / "manifest.json").read_text())["settings"]["settings"]
    assert stored["zero_rows"] == "explained" and stored["exclude_first"] is True
    from safetensors.numpy import load_file

    first = sorted((tmp_path / "x" / "arrays").glob("*.safetensors"))[0]  # "the capital of france is"
    items = load_file(first)["items"]
    assert items[0] == 0 and items[1:-1].all() and items[-1] == 0


def test_a_run_made_before_a_setting_existed_resumes_at_its_old_value(
    llama: ModelAdapter, tmp_path, monkeypatch
) -> None:
    """A folder whose manifest predates ``zero_rows`` / ``exclude_first`` resumes with their defaults (the
    behaviour it was made with), and is refused with any other value."""
    import streetlamp.commands.replicate.run as rr
    from streetlamp.data.loaders import Dataset, Example

    ds = Dataset("recall", "test", [Example("r-0", "the capital of france is", "paris")])
    monkeypatch.setattr(rr, "load_dataset", lambda name: Dataset(ds.name, ds.source, list(ds.examples)))
    s = ReplicateCommandSettings(data=["recall"], permutations=1, adv_steps=0, adv_layers=0, layers="1")
    out = tmp_path / "old"
    rr.replicate(llama, s, out)
    manifest = json.loads((out / "manifest.json").read_text())
    for key in ("zero_rows", "exclude_first"):  # as a manifest written before these settings existed
        del manifest["settings"]["settings"][key]
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert rr.replicate(llama, s, out).n_computed_chunks == 0
    for other in (
        dataclasses.replace(s, zero_rows="explained"),
        dataclasses.replace(s, exclude_first=True),
    ):
        with pytest.raises(StreetlampError, match="other settings"):
            rr.replicate(llama, other, out)


def test_cli_refuses_bad_settings_before_writing(tmp_path, capsys) -> None:
    from streetlamp.cli import main

    out = tmp_path / "rep"
    for extra in (["--data", "movies,imdb"], ["--device-map", "auto"], ["--max-memory", "cpu=1GiB"]):
        assert main(["replicate", "--model", "smollm2-135m", "--out", str(out), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err and "\n" not in err and not out.exists()


def test_prepare_one_example_keeps_every_label(llama: ModelAdapter, monkeypatch) -> None:
    """A draw of one sentiment example still decides between both labels; the explained last token is no item."""
    import streetlamp.commands.replicate.run as rr
    from streetlamp.data.loaders import Dataset, Example

    ds = Dataset("movies", "test", [Example("m-0", "the movie was bad", "bad"), Example("m-1", "i loved it", "good")])
    monkeypatch.setattr(rr, "load_dataset", lambda name: Dataset(ds.name, ds.source, list(ds.examples)))
    decision, examples, _ = rr.prepare(llama, "movies", 1, ReplicateSettings(), 0)
    assert decision.candidates is not None and len(decision.candidates) == 2 and len(examples) == 1
    assert not examples[0].items[-1]


def test_exclude_first_keeps_the_sink_out_of_the_items(llama: ModelAdapter) -> None:
    """``--exclude-first``: a prompt that starts with the data (recall) loses its first token as an item, so it is
    never ranked, removed or zeroed; nothing else changes."""
    from streetlamp.commands.replicate.run import text_items

    text = "the capital of france is"
    ids, items = text_items(llama, text, 0, len(text), True)
    ids2, items2 = text_items(llama, text, 0, len(text), True, exclude_first=True)
    assert ids == ids2 and items[0] and not items2[0]
    np.testing.assert_array_equal(items[1:], items2[1:])
    assert not items[-1] and items[1:-1].all()
