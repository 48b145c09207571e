"""Removal on decoders (methods/removal.py): the sink stays at position 0, the explained position stays,
checked by hand-built rows and by direct Hugging Face forwards on the issue's SmolLM2 sentence."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streetlamp.evaluation.erasure import ErasurePlan
from streetlamp.methods.occlusion import Occlusion
from streetlamp.methods.removal import Removal, sink_token
from streetlamp.models.adapter import ModelAdapter, Target
from streetlamp.models.tiny import tiny_model

SENTENCE = "The animal didn't cross the street because it was too tired. In that sentence, it refers to the"


def adapter(family: str) -> ModelAdapter:
    model, tok = tiny_model(family, seed=1)
    return ModelAdapter(model.double(), tok, f"tiny-{family}")


def test_rows_by_hand() -> None:
    gpt2, bert = adapter("gpt2"), adapter("bert")
    ids = torch.tensor([10, 11, 12, 13])
    rule = Removal.of(gpt2, None)
    sink = gpt2.tokenizer.bos_token_id  # the tiny vocabulary has no <|endoftext|>: BOS
    assert rule.sink_id == sink == sink_token(gpt2) and rule.keep_last
    assert rule.row(ids, np.array([1, 0, 1, 1], bool)).tolist() == [sink, 11, 13]  # last kept, first replaced
    assert rule.row(ids, np.array([0, 1, 1, 0], bool)).tolist() == [10, 13]  # plain deletion elsewhere
    assert rule.ids([10, 11, 12, 13], {0, 3}) == [sink, 11, 12, 13]
    assert rule.protected(4).tolist() == [False, False, False, True]
    # replacement keeps every position (no decoder rule); a classifier deletes plainly
    assert Removal.of(gpt2, 7).row(ids, np.array([1, 0, 0, 1], bool)).tolist() == [7, 11, 12, 7]
    plain = Removal.of(bert, None)
    assert plain.row(ids, np.array([1, 0, 0, 1], bool)).tolist() == [11, 12] and plain.describe(bert) is None


def test_erasure_plan_never_ranks_the_explained_position() -> None:
    a = adapter("gpt2")
    ids = [10, 11, 12, 13, 14]
    scores = np.array([1.0, 0.5, 0.2, 0.1, 9.0])  # the last position would be ranked first
    special = np.zeros(5, bool)
    p = ErasurePlan.build(ids, scores, special, None, Removal.of(a, None))
    assert p.n_rankable == 4
    sink = sink_token(a)
    assert p.rows[0] == [sink, 11, 12, 13, 14]  # comprehensiveness@1: the top token (position 0) replaced
    assert p.rows[1] == [10, 14]  # sufficiency@1: only it kept, plus the last position
    assert p.rows[8] == [sink, 12, 13, 14]  # comprehensiveness@50: the top 2 of 4 removed, position 0 replaced
    assert all(r[-1] == 14 for r in p.rows)


@pytest.mark.slow
def test_smollm2_first_word_no_longer_scores_like_the_answer(smollm: ModelAdapter) -> None:
    a = smollm
    ids = a.encode(SENTENCE).input_ids[0]
    y = a.token_id(" animal")
    assert a.tokenizer.convert_ids_to_tokens(ids[:2].tolist()) == ["The", "Ġanimal"]

    def p(row: torch.Tensor) -> float:  # straight from the Hugging Face model, no streetlamp code
        with torch.no_grad():
            return float(torch.softmax(a.hf_model(input_ids=row[None]).logits[0, -1].double(), -1)[y])

    base = p(ids)
    eot = a.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    drop_the_deleted = base - p(ids[1:])  # plain deletion: the sink moves to " animal"
    drop_animal = base - p(torch.cat([ids[:1], ids[2:]]))
    drop_the_replaced = base - p(torch.cat([torch.tensor([eot]), ids[1:]]))
    assert drop_the_deleted > 0.9 * drop_animal  # the observation: "The" looked as decisive
    e = Occlusion().attribute(a, a.encode(SENTENCE), target=Target(y, None, "prob"))[0]
    assert e.info["replacement_used"] == "delete" and "<|endoftext|>" in e.info["removal_rule"]
    tol = 1e-4  # float32 model, probabilities ~0.5: batched vs unbatched forwards differ ~1e-6
    assert e.scores[0] == pytest.approx(drop_the_replaced, abs=tol)
    assert e.scores[1] == pytest.approx(drop_animal, abs=tol)
    assert e.scores[1] > 3 * e.scores[0]  # now " animal" matters far more than "The"
    assert e.scores[-1] == 0 and e.arrays["groups"][-1] == -1  # the explained position is not removed


def test_shap_delete_on_a_decoder_is_exact_shapley_under_the_rule() -> None:
    """Kernel SHAP with ``delete`` on a causal LM, enumerating every coalition, equals Shapley values
    computed by brute force over hand-built rows (position 0 replaced by the sink, last position kept)
    and direct Hugging Face forwards."""
    from itertools import combinations
    from math import factorial

    from streetlamp.methods.shap_lime import Shap

    a = adapter("gpt2")
    inputs = a.encode("the movie was not good")
    ids = inputs.input_ids[0, : inputs.lengths[0]]
    n = len(ids)
    y = int(ids[2])
    sink = sink_token(a)

    def f(present: set[int]) -> float:  # present = kept positions among 0..n-2; the last is always kept
        row = [int(ids[i]) for i in range(n - 1) if i in present] + [int(ids[-1])]
        if 0 not in present:
            row = [sink] + row
        with torch.no_grad():
            return float(a.hf_model(input_ids=torch.tensor([row])).logits[0, -1, y])

    players = range(n - 1)
    m = len(players)
    phi = np.zeros(m)
    for i in players:
        others = [j for j in players if j != i]
        for k in range(m):
            for s in combinations(others, k):
                w = factorial(k) * factorial(m - k - 1) / factorial(m)
                phi[i] += w * (f(set(s) | {i}) - f(set(s)))
    e = Shap(replacement="delete", n_samples=4096).attribute(a, inputs, target=Target(y, None, "logit"))[0]
    assert e.info["removal_rule"] and e.arrays["groups"][-1] == -1 and e.scores[-1] == 0
    # float64 model; the weighted least squares is exact on the full enumeration: tolerance ~ eps * 2^m * |F|
    tol = 1e-9 * max(1.0, float(np.abs(phi).max()))
    np.testing.assert_allclose(e.scores[:-1], phi, atol=tol)


def test_empty_context_token_is_the_document_start() -> None:
    gpt2 = adapter("gpt2")  # the tiny vocabulary has no <|endoftext|>: BOS
    assert gpt2.empty_context_token() == gpt2.tokenizer.bos_token_id == sink_token(gpt2)


@pytest.mark.slow
def test_smollm2_empty_context_is_endoftext_not_the_chat_marker(smollm: ModelAdapter) -> None:
    eot = smollm.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert smollm.tokenizer.bos_token == "<|im_start|>" and smollm.empty_context_token() == eot
