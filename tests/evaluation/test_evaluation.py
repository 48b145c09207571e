"""Faithfulness metrics checked against independent computations on tiny models."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from streetlamp.evaluation.common import output_probs
from streetlamp.evaluation.counterfactual import Counterfactual
from streetlamp.evaluation.erasure import PERCENTS, ErasurePlan
from streetlamp.evaluation.flip import attention_item_scores, decision_flip
from streetlamp.evaluation.plausibility import plausibility
from streetlamp.models.adapter import Inputs, ModelAdapter
from streetlamp.models.tiny import tiny_model

TEXTS = [
    "the movie was not good , but the acting was great .",
    "i loved it",
    "the plot was boring and bad",
    "mary gave john a drink at the store",
    "a very fun film",
]


@pytest.fixture(scope="module")
def sharp() -> ModelAdapter:
    """A tiny BERT classifier whose head is scaled so that outputs move visibly; in float64, so that
    comparisons with independent routes are exact to ~1e-13 on any CPU."""
    m, t = tiny_model("bert", seed=3)
    with torch.no_grad():
        m.classifier.weight.mul_(60)
    return ModelAdapter(m.double(), t, "tiny-bert-sharp")


def _prob(adapter: ModelAdapter, text: str, cls: int) -> float:
    with torch.no_grad():
        return float(torch.softmax(adapter.forward(adapter.encode([text])).logits.double(), -1)[0, cls])


def test_erasure_matches_reencoded_text(sharp: ModelAdapter) -> None:
    rng = np.random.default_rng(0)
    text = TEXTS[0]
    words = text.split()
    ids = sharp.encode([text]).input_ids[0].tolist()
    special = sharp.special_mask(ids)
    assert special.tolist() == [True] + [False] * len(words) + [True]
    scores = rng.standard_normal(len(ids))
    plan = ErasurePlan.build(ids, scores, special, sharp.replacement_token("delete")[1])
    full = output_probs(sharp, [ids], None)[0]
    c = int(full.argmax())
    f_rows = output_probs(sharp, plan.rows, None)[:, c]
    met, arr = plan.metrics(full[c], f_rows)
    order = np.argsort(-scores[1:-1], kind="stable")  # word order by score
    for k in PERCENTS:
        n = max(1, math.ceil(k / 100 * len(words)))
        top = set(order[:n].tolist())
        without = " ".join(w for i, w in enumerate(words) if i not in top)
        only = " ".join(w for i, w in enumerate(words) if i in top)
        assert met[f"comprehensiveness@{k}"] == pytest.approx(full[c] - _prob(sharp, without, c), abs=1e-6)
        assert met[f"sufficiency@{k}"] == pytest.approx(full[c] - _prob(sharp, only, c), abs=1e-6)
    comp = [met[f"comprehensiveness@{k}"] for k in PERCENTS]
    assert met["aopc_comprehensiveness"] == pytest.approx(np.mean(comp))
    assert arr["deletion_curve"][0] == pytest.approx(full[c], abs=1e-6)  # nothing removed yet
    assert arr["insertion_curve"][-1] == pytest.approx(full[c], abs=1e-6)  # everything back
    # a direct trapezoid over the 11 points
    y = arr["deletion_curve"].astype(np.float64)
    assert met["deletion_area"] == pytest.approx(sum((y[i] + y[i + 1]) / 2 * 0.1 for i in range(10)), abs=1e-6)
    assert len(set(np.round(comp, 9))) > 1  # the metric moves with k


def test_mask_replacement_keeps_length(sharp: ModelAdapter) -> None:
    ids = sharp.encode([TEXTS[2]]).input_ids[0].tolist()
    rep = sharp.replacement_token("mask")[1]
    assert rep == sharp.tokenizer.mask_token_id
    plan = ErasurePlan.build(ids, np.arange(len(ids), dtype=float), sharp.special_mask(ids), rep)
    assert all(len(r) == len(ids) for r in plan.rows)
    assert plan.rows[0].count(rep) == 1 and plan.rows[0][-2] == rep  # 1%: the top-scored word only


def test_plausibility_token_and_iou_f1() -> None:
    gold = np.array([0, 1, 1, 0, 0, 1, 0], bool)  # human spans [1,3) and [5,6)
    s = np.array([0, 5, 4, 3, 0, 0, 0], float)  # top-3 = tokens 1,2,3 -> one span [1,4)
    m = plausibility(s, gold)
    assert m["token_f1"] == pytest.approx(2 / 3)
    # IOU([1,4),[1,3)) = 2/3 >= 0.5: precision 1/1, recall 1/2
    assert m["iou_f1"] == pytest.approx(2 * 1 * 0.5 / 1.5)
    assert plausibility(s, np.zeros(7, bool)) == {}
    from sklearn.metrics import auc, average_precision_score, precision_recall_curve

    prec, rec, _ = precision_recall_curve(gold, s)
    assert m["average_precision"] == pytest.approx(average_precision_score(gold, s))
    assert m["auprc"] == pytest.approx(auc(rec, prec))
    assert m["auprc"] != pytest.approx(m["average_precision"])  # two numbers, each named for what it is


def test_plausibility_does_not_depend_on_the_order_of_tied_tokens() -> None:
    """The bug: scores [1, 1] with the rationale on the first token gave AUPRC 1.0, on the second 0.5."""
    s = np.array([1.0, 1.0, 0.0])
    a = plausibility(s, np.array([True, False, False]))
    b = plausibility(s, np.array([False, True, False]))
    assert a == b
    assert a["average_precision"] == 0.5 and a["token_f1"] == 0.5


def test_item_gradients_match_finite_differences(sharp: ModelAdapter) -> None:
    """dF/dA from autograd against central differences of the float64 model.

    The step h balances the central difference's truncation error (~h^2 |F'''| / 6) and its
    rounding error (~eps64 |F| / h): h = 1e-4 leaves both far below the gradient's size. The
    tolerance is derived, not tuned: the Richardson difference |D(h) - D(h/2)| (3/4 of D(h)'s
    truncation error, so 4x it bounds D(h/2)'s with room) plus 100 eps64 |F| / h for rounding."""
    ids = sharp.encode([TEXTS[0]]).input_ids[0].tolist()
    inp = Inputs.from_ids(sharp, [ids])
    pred = int(output_probs(sharp, [ids], None)[0].argmax())
    layers = [0, 1]
    sc = attention_item_scores(sharp, inp, [pred], layers)[0]
    j, h = 3, 1e-4

    def f(edit_fn) -> float:
        with torch.no_grad():
            lg = sharp.forward(inp, edit={f"layers.{l}.attn.pattern": edit_fn for l in layers}).logits
        assert lg.dtype == torch.float64
        return float(torch.softmax(lg, -1)[0, pred])

    def scale(d: float):
        def fn(p: torch.Tensor) -> torch.Tensor:
            p = p.clone()
            p[..., j] *= 1 + d
            return p

        return fn

    def shift(d: float):
        def fn(p: torch.Tensor) -> torch.Tensor:
            p = p.clone()
            p[..., j] += d
            return p

        return fn

    base = f(lambda p: p)
    eps = np.finfo(np.float64).eps
    for edit, want in ((scale, sc["attention_x_gradient"][j]), (shift, sc["gradient"][j])):
        dh = (f(edit(h)) - f(edit(-h))) / (2 * h)
        dh2 = (f(edit(h / 2)) - f(edit(-h / 2))) / h
        tol = 4 * abs(dh - dh2) + 100 * eps * abs(base) / h
        assert abs(want) > 100 * tol  # a real gradient, resolved to better than 1%
        assert dh2 == pytest.approx(want, abs=tol)
    with torch.no_grad():
        a = sharp.forward(inp, record=["layers.*.attn.pattern"]).cache
    direct = torch.stack([a[f"layers.{l}.attn.pattern"][0, :, 0] for l in layers]).mean((0, 1))
    np.testing.assert_allclose(sc["attention"], direct.numpy(), rtol=1e-12)


@pytest.fixture(scope="module")
def minilm_base() -> ModelAdapter:
    """MiniLM encoder with a seeded random head: outputs near a tie, so zeroing items flips some. In
    float64: an argmax near a tie must not depend on how a CPU rounds the batched and the lone pass."""
    from streetlamp.models.minilm import build_minilm_classifier

    torch.manual_seed(0)
    m, t = build_minilm_classifier(None)
    return ModelAdapter(m.double(), t, "minilm-base")


def test_decision_flip_against_loop(minilm_base: ModelAdapter) -> None:
    sharp = minilm_base
    texts = [TEXTS[1], TEXTS[3], TEXTS[4]]
    inputs = sharp.encode(texts)
    rows = inputs.rows()
    probs = output_probs(sharp, rows, None)
    layers = [5]
    ranks = attention_item_scores(sharp, inputs, probs.argmax(-1).tolist(), layers)
    out_ranks = [dict(r) for r in ranks]
    out = decision_flip(sharp, inputs, probs, out_ranks, layers, list(range(len(rows))), 64)
    flipped_any = False
    for (b, ids), name in ((x, n) for x in enumerate(rows) for n in ("gradient", "attention", "random")):
        inp = sharp.encode([texts[b]])
        order = np.argsort(-out_ranks[b][name], kind="stable")
        first = None
        for k in range(1, len(ids)):
            gone = order[:k].tolist()

            def zero(p: torch.Tensor) -> torch.Tensor:  # independent: index assignment, explicit loop
                p = p.clone()
                p[..., gone] = 0
                return p / p.sum(-1, keepdim=True)

            with torch.no_grad():
                lg = sharp.forward(inp, edit={f"layers.{l}.attn.pattern": zero for l in layers}).logits
            if int(lg.argmax()) != int(probs[b].argmax()):
                first = k
                break
        got = out[b][name]
        if first is None:
            assert got["flipped"] == 0 and math.isnan(got["flip_fraction"])
        else:
            flipped_any = True
            assert got["flipped"] == 1 and got["flip_fraction"] == pytest.approx(first / len(ids))
        assert 0 <= out[b]["attention"]["js_top"] <= 1 and 0 <= out[b]["attention"]["js_random"] <= 1
    assert flipped_any


def test_uniform_attention_equals_zeroed_query_key(sharp: ModelAdapter) -> None:
    inputs = sharp.encode(TEXTS)
    rows = inputs.rows()
    uni = Counterfactual().uniform(sharp, inputs, None)
    twin = copy.deepcopy(sharp.hf_model)
    with torch.no_grad():  # zero scores -> softmax is uniform over the allowed keys: an independent route
        for layer in twin.bert.encoder.layer:
            for lin in (layer.attention.self.query, layer.attention.self.key):
                lin.weight.zero_()
                lin.bias.zero_()
    tw = ModelAdapter(twin, sharp.tokenizer, "twin")
    direct = output_probs(tw, rows, None)
    np.testing.assert_allclose(uni, direct, rtol=0, atol=1e-12)  # float64 throughout
    assert np.abs(uni - output_probs(sharp, rows, None)).max() > 5e-6  # not the original (tiny model: small but real)


def test_adversarial_attention_respects_eps(sharp: ModelAdapter) -> None:
    inputs = sharp.encode(TEXTS)
    rows = inputs.rows()
    probs = output_probs(sharp, rows, None)
    cf = Counterfactual(steps=15)
    js, d = cf.adversarial(sharp, inputs, probs, 1, list(range(len(rows))))
    assert all(x <= cf.eps + 1e-9 for x in d)
    assert all(0 <= x <= 1 for x in js) and max(js) > 0.05
    strict = Counterfactual(steps=15, eps=0.0).adversarial(sharp, inputs, probs, 1, list(range(len(rows))))
    assert all(x <= y + 1e-9 for x, y in zip(strict[0], js)) or max(strict[0]) <= max(js)
    perm = cf.permutations(sharp, inputs, probs, 1, list(range(len(rows))), None)
    assert all(x >= 0 for x in perm) and max(perm) > 0


def test_evaluate_causal_lm_next_token(tmp_path) -> None:
    """A causal LM is evaluated on its next-token prediction: labels are expected next tokens;
    erasure metrics equal F recomputed by hand on the reduced prompts (delete), and a prompt
    erased completely reads the BOS token."""
    import json
    import math

    import torch

    from streetlamp.cli import main
    from streetlamp.evaluation.common import rank_desc
    from streetlamp.models.loading import load
    from streetlamp.models.tiny import save_tiny
    from streetlamp.store import read_metrics
    from streetlamp.store.files import load_arrays

    ckpt = save_tiny("gpt2", tmp_path / "tiny-gpt2", seed=2)
    data = tmp_path / "prompts.csv"
    data.write_text("text,label\nthe movie was very,good\nthe acting was not,bad\nthe plot is really,terrible\n")
    out = tmp_path / "run"
    assert (
        main(
            [
                "evaluate",
                "--model",
                str(ckpt),
                "--data",
                str(data),
                "--out",
                str(out),
                "--methods",
                "attention,occlusion",
                "--adv-steps",
                "2",
                "--permutations",
                "2",
            ]
        )
        == 0
    )
    df = read_metrics(out)
    assert {
        "model",
        "attention",
        "occlusion",
        "attention_items",
        "random",
        "counterfactual_attention",
        "uniform_attention",
        "attention|occlusion",
    } <= set(df.method)
    adapter = load(str(ckpt))
    tok = adapter.tokenizer
    good = tok(" good", add_special_tokens=False)["input_ids"]
    gold = good[0] if len(good) == 1 else tok("good", add_special_tokens=False)["input_ids"][0]

    def p_next(ids: list[int]) -> torch.Tensor:
        ids = ids or [tok.bos_token_id]
        with torch.no_grad():
            return torch.softmax(adapter.hf_model(input_ids=torch.tensor([ids])).logits[0, -1].double(), -1)

    eid = "prompts-000000"
    a = load_arrays(out / "arrays" / f"{eid}.safetensors")
    ids = a["input_ids"].tolist()
    probs = p_next(ids)
    pred = int(probs.argmax())
    row = df[(df.example_id == eid) & (df.method == "model")].set_index("metric").value
    assert row["prob"] == pytest.approx(float(probs[pred]), abs=1e-6)
    assert row["correct"] == float(pred == gold)
    # the decoder removal rule (methods/removal.py): the explained last position is never ranked nor
    # removed; a removed first token becomes the document-start token (BOS: no <|endoftext|> here)
    special = adapter.special_mask(ids)
    special[-1] = True

    def removed(drop: set[int]) -> list[int]:
        return [tok.bos_token_id if i == 0 else t for i, t in enumerate(ids) if i not in drop or i == 0]

    order = rank_desc(a["occlusion.tokens"].astype(np.float64), ~special)
    m = len(order)
    top = set(order[: max(1, math.ceil(0.5 * m))].tolist())
    by_hand = float(
        probs[pred] - p_next(removed(top) if 0 in top else [t for i, t in enumerate(ids) if i not in top])[pred]
    )
    occ = df[(df.example_id == eid) & (df.method == "occlusion")].set_index("metric").value
    assert occ["comprehensiveness@50"] == pytest.approx(by_hand, abs=1e-5)
    # insertion at f = 0 keeps no rankable token: the document-start token and the explained position are read
    kept = [tok.bos_token_id, ids[-1]]
    assert a["occlusion.insertion_curve"][0] == pytest.approx(float(p_next(kept)[pred]), abs=1e-5)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model_info"]["kind"] == "causal_lm"


def test_evaluate_causal_lm_refuses_multi_token_labels(tmp_path, capsys) -> None:
    from streetlamp.cli import main
    from streetlamp.models.tiny import save_tiny

    ckpt = save_tiny("gpt2", tmp_path / "tiny-gpt2", seed=2)
    data = tmp_path / "p.csv"
    data.write_text("text,label\nthe movie was,good bad\n")
    assert main(["evaluate", "--model", str(ckpt), "--data", str(data), "--out", str(tmp_path / "r")]) == 2
    assert "not one token" in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_large_distributions_are_stored_as_top_k() -> None:
    from streetlamp.evaluation.pipeline import TOP_K, distribution

    small = np.array([0.2, 0.8])
    assert set(distribution("probs", small)) == {"probs"}
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(5000))
    d = distribution("probs", p)
    assert d["probs.top_ids"].tolist() == np.argsort(-p)[:TOP_K].tolist()
    np.testing.assert_allclose(d["probs.top"], p[d["probs.top_ids"]], rtol=1e-6)
