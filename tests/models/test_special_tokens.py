"""Only the model's structural special tokens are exempt from scoring, occlusion and erasure: an
[UNK] stands for real text (an emoji, a rare character) and is treated like any other token."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streetlamp.evaluation.erasure import ErasurePlan
from streetlamp.methods.ig import IntegratedGradients
from streetlamp.methods.occlusion import Occlusion
from streetlamp.models.adapter import ModelAdapter, Target
from streetlamp.models.tiny import tiny_model


def check_unk_is_a_token(adapter: ModelAdapter, text: str) -> None:
    inputs = adapter.encode(text)
    ids = inputs.input_ids[0]
    tok = adapter.tokenizer
    unk = ids == tok.unk_token_id
    assert unk.any(), f"{text!r} has no [UNK] for this tokenizer"
    special = adapter.special_mask(ids)
    structural = np.isin(ids.numpy(), [tok.cls_token_id, tok.sep_token_id])
    assert special.tolist() == structural.tolist()  # [CLS] and [SEP] only, never [UNK]
    j = int(torch.nonzero(unk)[0])
    # integrated gradients: the [UNK] is interpolated from the baseline like a word, so it gets a score
    ig = IntegratedGradients(steps=8, adaptive=False).attribute(adapter, inputs, target=Target())[0]
    assert ig.scores[j] != 0 and np.all(ig.scores[special] == 0)
    # occlusion: the [UNK] is a feature of its own, and masking it changes F
    occ = Occlusion().attribute(adapter, inputs, target=Target())[0]
    assert occ.arrays["groups"][j] >= 0 and occ.scores[j] != 0
    assert np.all(occ.arrays["groups"][special] == -1)
    # erasure: ranked and removable (the top-scored token is the [UNK])
    scores = np.where(unk.numpy(), 10.0, 0.0)
    plan = ErasurePlan.build(ids.tolist(), scores, special, None)
    assert plan.n_rankable == int((~special).sum())
    assert tok.unk_token_id not in plan.rows[0] and plan.rows[0].count(tok.cls_token_id) == 1


def test_unk_is_a_token_tiny() -> None:
    m, t = tiny_model("bert", seed=1)
    check_unk_is_a_token(ModelAdapter(m.double(), t, "tiny-bert"), "the zebra was great")


@pytest.mark.slow
def test_unk_is_a_token_minilm(minilm: ModelAdapter) -> None:
    check_unk_is_a_token(minilm, "the movie was great 🙂 and fun")
