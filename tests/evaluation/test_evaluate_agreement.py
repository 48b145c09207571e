"""``evaluate``'s agreement rows (``a|b``, ``kendall_tau``) against a brute-force Kendall tau-b written
out here pair by pair, on the token scores the same chunk stores (``{method}.tokens``), the special
tokens left out (the policy of :mod:`streetlamp.stats`). Float64 model; a tau is a ratio of integer pair
counts, so the two routes agree to F64_TOL, and each test asserts that keeping the special tokens would
give another tau."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from streetlamp.evaluation.pipeline import ChunkExample, EvalSettings, evaluate_chunk
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.tiny import tiny_model
from tests.conftest import F64_TOL

TEXTS = ["the movie was not good , but the acting was great .", "i loved it a lot", "the plot was boring and bad"]
METHODS = ["attention", "gradient_x_input", "occlusion"]


def brute_tau_b(x: np.ndarray, y: np.ndarray) -> float:
    """(concordant - discordant) / sqrt((pairs not tied in x) (pairs not tied in y)), every pair visited."""
    c = d = tx = ty = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        a, b = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
        if a == 0 and b == 0:
            continue
        if a == 0:
            tx += 1
        elif b == 0:
            ty += 1
        elif a == b:
            c += 1
        else:
            d += 1
    den = math.sqrt((c + d + tx) * (c + d + ty))
    return (c - d) / den if den else float("nan")


@pytest.fixture(scope="module")
def chunk() -> tuple[ModelAdapter, list[ChunkExample], list, dict]:
    m, t = tiny_model("bert", seed=3)
    with torch.no_grad():
        m.classifier.weight.mul_(60)
    a = ModelAdapter(m.double(), t, "tiny-bert-sharp")
    enc = a.encode(TEXTS)
    examples = [
        ChunkExample(index=i, id=f"ex{i}", ids=enc.input_ids[i, : enc.lengths[i]].tolist(), text=s, gold=0)
        for i, s in enumerate(TEXTS)
    ]
    settings = EvalSettings(methods=METHODS, adv_steps=1, permutations=1)
    rows, arrays = evaluate_chunk(a, examples, settings)
    return a, examples, rows, arrays


def test_agreement_tau_is_a_brute_force_tau_b_on_the_stored_scores(chunk) -> None:
    a, examples, rows, arrays = chunk
    got = {(e, m): v for e, m, metric, v in rows if metric == "kendall_tau"}
    pairs = list(itertools.combinations(sorted(METHODS), 2))
    assert set(got) == {(e.id, f"{x}|{y}") for e in examples for x, y in pairs}
    with_specials_differ = 0
    for e in examples:
        keep = ~a.special_mask(e.ids)
        assert (~keep).sum() == 2  # [CLS] and [SEP]
        for x, y in pairs:
            sx = arrays[e.id][f"{x}.tokens"].astype(np.float64)
            sy = arrays[e.id][f"{y}.tokens"].astype(np.float64)
            want = brute_tau_b(sx[keep], sy[keep])
            assert got[(e.id, f"{x}|{y}")] == pytest.approx(want, abs=F64_TOL), (e.id, x, y)
            with_specials_differ += abs(brute_tau_b(sx, sy) - want) > 1e3 * F64_TOL
    # not vacuous: the taus are not all one number, and keeping [CLS] and [SEP] changes some of them
    assert len({round(v, 6) for v in got.values()}) > 3
    assert with_specials_differ > 0
