"""evaluate without repeated work (evaluation/frozen.py, the deduplicated erasure rows, the one reference pass
of the unchanged texts, the fused kernel in the scoring passes): the same rows as the plain path, every layer
recomputed, every row run, the unchanged texts run once per use and every pass eager, on tiny float64 models
(an encoder and a decoder)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

import streetlamp.evaluation.common as common_mod
import streetlamp.evaluation.counterfactual as cf_mod
import streetlamp.evaluation.flip as flip_mod
import streetlamp.evaluation.pipeline as pipe_mod
from streetlamp.batching import group_by_budget
from streetlamp.evaluation.common import PASS_TOKENS, length_groups, output_map, output_prob_of, output_probs
from streetlamp.evaluation.frozen import FrozenRecords, frozen_below
from streetlamp.evaluation.pipeline import ChunkExample, EvalSettings, evaluate_chunk
from streetlamp.models.adapter import Inputs, ModelAdapter
from streetlamp.models.tiny import tiny_model
from tests.conftest import F64_TOL

TEXTS = ["the movie was not good , but the acting was great .", "i loved it a lot", "the plot was boring and bad"]


def adapter_of(family: str) -> ModelAdapter:
    m, t = tiny_model(family, seed=3, layers=3)
    return ModelAdapter(m.double(), t, f"tiny-{family}")


def plain_prob_of(adapter, rows, budget, index, edit=None):  # noqa: ANN001, ANN201
    """The former output_prob_of: every row run, duplicates included."""
    idx = torch.as_tensor(np.asarray(index, np.int64))
    return output_map(adapter, rows, budget, lambda g, p: p.gather(1, idx[g].view(-1, 1).to(p.device)), 1, edit)[:, 0]


def separate_passes(adapter, inputs, sites, records, below):  # noqa: ANN001, ANN201
    """The former evaluate: the output distribution, the attention items and the counterfactuals' pattern each
    from a pass of their own (and no frozen record taken on the way)."""
    probs = output_probs(adapter, inputs.rows(), None)
    return adapter.forward(inputs, record=sites, keep_grad=True, grad=True), probs


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_frozen_layers_replay_their_outputs_and_are_not_run(family: str) -> None:
    a = adapter_of(family)
    ids = a.encode(TEXTS[0]).input_ids[0].tolist()
    rows = [ids] * 3
    site = f"layers.{a.n_layers - 1}.attn.pattern"
    edit = {site: lambda p: p * torch.linspace(0.5, 1.5, p.shape[-1], dtype=p.dtype)}
    batch = Inputs.from_ids(a, rows, strings=False)
    want = a.forward(batch, edit=edit).logits
    calls = []
    h = a.attn_modules[0].register_forward_pre_hook(lambda *_: calls.append(1))
    with frozen_below(a, Inputs.from_ids(a, [ids], strings=False), a.n_layers - 1):
        n0 = len(calls)  # the one recording pass
        got = a.forward(batch, edit=edit).logits
        assert len(calls) == n0  # layer 0 did not run again
    h.remove()
    assert not hasattr(a.layer_modules[0], "forward") or "forward" not in vars(a.layer_modules[0])  # restored
    assert float((want - a.forward(batch).logits).abs().max()) > 1e-3 * float(want.abs().max())  # the edit matters
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=F64_TOL * float(want.abs().max()))


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_evaluate_chunk_equals_the_plain_path(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    a = adapter_of(family)
    enc = a.encode(TEXTS)
    examples = [
        ChunkExample(index=i, id=f"ex{i}", ids=enc.input_ids[i, : enc.lengths[i]].tolist(), text=s, gold=0)
        for i, s in enumerate(TEXTS)
    ]
    s = EvalSettings(methods=["attention", "gradient_x_input", "occlusion"], adv_steps=3, permutations=3)
    rows, arrays = evaluate_chunk(a, examples, s)
    with monkeypatch.context() as mp:
        mp.setattr(flip_mod, "frozen_below", lambda *_: contextlib.nullcontext())
        mp.setattr(cf_mod, "frozen_below", lambda *_: contextlib.nullcontext())
        mp.setattr(pipe_mod, "output_prob_of", plain_prob_of)
        mp.setattr(flip_mod, "unique_rows", lambda keys: (list(range(len(keys))), np.arange(len(keys))))
        mp.setattr(pipe_mod, "reference_pass", separate_passes)
        mp.setattr(common_mod, "fused_attention", lambda *_: contextlib.nullcontext())
        mp.setattr(common_mod, "length_groups", group_by_budget)
        ref_rows, ref_arrays = evaluate_chunk(a, examples, s)
    assert [r[:3] for r in rows] == [r[:3] for r in ref_rows]
    got, want = np.array([r[3] for r in rows]), np.array([r[3] for r in ref_rows])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=0, atol=F64_TOL * max(1.0, float(np.abs(want[ok]).max())))
    assert np.abs(want[ok]).max() > 1e-2
    metrics = {r[2] for r in rows}
    assert {"comprehensiveness@20", "flip_fraction", "adv_js@" + str(a.n_layers - 1)} <= metrics
    for e in examples:
        assert arrays[e.id].keys() == ref_arrays[e.id].keys()
        for k, v in arrays[e.id].items():
            np.testing.assert_allclose(v, ref_arrays[e.id][k], rtol=1e-6, atol=1e-6)


def test_duplicate_rows_run_once() -> None:
    a = adapter_of("bert")
    ids = [a.encode(t).input_ids[0].tolist() for t in TEXTS]
    rows = [ids[0], ids[1], ids[0], ids[0], ids[2]]
    index = [0, 1, 0, 1, 0]
    seen = []
    h = a.attn_modules[0].register_forward_pre_hook(
        lambda m, args, kw: seen.append((args[0] if args else kw["hidden_states"]).shape[0]), with_kwargs=True
    )
    got = output_prob_of(a, rows, None, index)
    h.remove()
    assert sum(seen) == 4  # (ids0, 0) twice: one row less
    np.testing.assert_allclose(got, plain_prob_of(a, rows, None, index), rtol=0, atol=F64_TOL)
    assert got[0] == got[2] and got[0] != got[3]


def test_decision_flip_rows_shared_by_rankings_run_once() -> None:
    """Two rankings with the same order zero the same items at every step: their rows run once, and each
    ranking's flip equals that of the ranking alone; js_top is the attention ranking's first row."""
    a = adapter_of("bert")
    inp = a.encode([TEXTS[0]])
    probs = output_probs(a, inp.rows(), None)
    layers = [a.n_layers - 1]
    n = inp.lengths[0]
    s = np.random.default_rng(0).standard_normal(n)
    att = np.random.default_rng(1).standard_normal(n)

    def run(rankings: dict) -> tuple[list, int]:
        seen = []
        h = a.attn_modules[-1].register_forward_pre_hook(
            lambda m, args, kw: seen.append((args[0] if args else kw["hidden_states"]).shape[0]), with_kwargs=True
        )
        out = flip_mod.decision_flip(a, inp, probs, [dict(rankings)], layers, [0], None)
        h.remove()
        return out, sum(seen) - 1  # minus the recording pass of frozen_below

    one, rows_one = run({"attention": att, "m": s})
    two, rows_two = run({"attention": att, "m": s, "m2": s.copy()})
    assert rows_two == rows_one  # m2's rows are m's: nothing more runs
    # attention, m and random: (n - 1) rows each, js_top shares attention's first, js_random may share one
    assert rows_one <= 3 * (n - 1) + 1
    np.testing.assert_equal(two[0]["m2"], two[0]["m"])  # (NaN where a ranking never flips)
    np.testing.assert_equal(two[0]["m"], one[0]["m"])
    np.testing.assert_equal(two[0]["attention"], one[0]["attention"])


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_unchanged_texts_run_once(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunk's padded batch runs unedited once (output distribution, attention items, counterfactual
    pattern, the adversarial search's frozen record) and each text once alone (the frozen record its decision
    flip and its permutations share); the former path ran the batch three times and each text twice more."""
    a = adapter_of(family)
    texts = TEXTS[1:]
    enc = a.encode(texts)
    ids = [enc.input_ids[i, : enc.lengths[i]].tolist() for i in range(len(texts))]
    examples = [ChunkExample(index=i, id=f"ex{i}", ids=r, text=t, gold=0) for i, (r, t) in enumerate(zip(ids, texts))]
    s = EvalSettings(methods=[], soft=False, adv_steps=2, permutations=2)
    seen: list[list[list[int]]] = []
    forward = a.forward

    def counting(inputs, record=(), edit=None, **kw):  # noqa: ANN001, ANN003, ANN202
        if not edit:
            seen.append(inputs.rows())
        return forward(inputs, record, edit, **kw)

    monkeypatch.setattr(a, "forward", counting)
    rows, _ = evaluate_chunk(a, examples, s)
    assert {"flip_fraction", f"adv_js@{a.n_layers - 1}", f"perm_tvd_median@{a.n_layers - 1}"} <= {r[2] for r in rows}
    assert seen.count(ids) == 1
    for r in ids:
        assert seen.count([r]) == 1
    assert len(seen) == 1 + len(ids)  # nothing else ran unedited


def test_frozen_records_are_shared_between_blocks() -> None:
    a = adapter_of("bert")
    ids = a.encode(TEXTS[0]).input_ids[0].tolist()
    one = Inputs.from_ids(a, [ids], strings=False)
    layer = a.n_layers - 1
    rec = FrozenRecords()
    edit = {f"layers.{layer}.attn.pattern": lambda p: p.flip(-1)}
    batch = Inputs.from_ids(a, [ids] * 2, strings=False)
    with frozen_below(a, one, layer, rec):
        first = a.forward(batch, edit=edit).logits
    with frozen_below(a, Inputs.from_ids(a, [ids], strings=False), layer, rec):  # an equal batch: no new pass
        second = a.forward(batch, edit=edit).logits
    with frozen_below(a, one, layer - 1, rec):  # fewer layers: a prefix of the same record
        third = a.forward(batch, edit=edit).logits
    assert rec.runs == 1
    want = a.forward(batch, edit=edit).logits
    for got in (first, second, third):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=F64_TOL * float(want.abs().max()))
    with rec.capture(a, batch, layer), torch.no_grad():  # a pass the caller runs anyway
        a.forward(batch)
    with frozen_below(a, batch, layer, rec):
        np.testing.assert_allclose(a.forward(batch, edit=edit).logits.numpy(), want.numpy(), rtol=0, atol=1e-9)
    assert rec.runs == 1


def _cost(groups: list[list[int]], lengths: list[int]) -> int:
    return sum(PASS_TOKENS + len(g) * max(lengths[i] for i in g) for g in groups)


@pytest.mark.parametrize("budget", [None, 64])
def test_length_groups_split_padded_batches_where_a_pass_costs_less_than_its_padding(budget: int | None) -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 40, 120).tolist()  # erasure rows: every length up to the text's
    plain = group_by_budget(lengths, budget, "cpu")
    got = length_groups(lengths, budget, "cpu")
    assert sorted(i for g in got for i in g) == list(range(len(lengths)))
    cap = budget if budget is not None else 1024
    for g in got:
        assert len(g) == 1 or len(g) * max(lengths[i] for i in g) <= cap
    # runs of sorted lengths (the budget may cut between rows of one length)
    spans = sorted((min(lengths[i] for i in g), max(lengths[i] for i in g)) for g in got)
    assert all(hi <= lo2 for (_, hi), (lo2, _) in zip(spans, spans[1:]))
    assert _cost(got, lengths) <= _cost(plain, lengths)
    one_text = rng.integers(2, 18, 54).tolist()  # a 17-token text's erasure rows: one padded batch, half padding
    if budget is None:
        assert len(group_by_budget(one_text, budget, "cpu")) == 1
        split = length_groups(one_text, budget, "cpu")
        assert len(split) > 1 and _cost(split, one_text) < 0.9 * _cost([list(range(54))], one_text)
    for g0 in plain:  # the programme's split of each group is the cheapest of all its contiguous splits
        sub = [g for g in got if set(g) <= set(g0)]
        best = _cost(sub, lengths)
        distinct = sorted({lengths[i] for i in g0})
        for cut in range(1, len(distinct)):  # every split in two (the programme may do better)
            lo = [i for i in g0 if lengths[i] <= distinct[cut - 1]]
            hi = [i for i in g0 if lengths[i] > distinct[cut - 1]]
            assert best <= _cost([lo, hi], lengths)
        assert best <= _cost([g0], lengths)
    assert length_groups([17] * 100, budget, "cpu") == group_by_budget([17] * 100, budget, "cpu")  # nothing to save
    assert length_groups(lengths, budget, "cuda") == group_by_budget(lengths, budget, "cuda")  # a GPU pass: unsplit
