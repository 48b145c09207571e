"""Head damage and Sink₁^ε (issue 37 item 6) against direct computations: each head's node effect and the
cumulative ablation recomputed here with masked forwards; the sink share from hand-made patterns."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streetlamp.interventions.circuits import faithfulness as F
from streetlamp.interventions.circuits import scores as S
from streetlamp.interventions.circuits.heads import first_token_attention, head_damage, sink_share
from streetlamp.interventions.circuits.tasks import encode_pairs
from tests.conftest import F64_TOL
from tests.interventions.test_circuit_faithfulness import PAIRS3
from tests.interventions.test_circuit_scores import make


@pytest.mark.parametrize("ablation", ["patch", "mean"])
def test_head_damage_is_cumulative_node_ablation(ablation: str) -> None:
    a, b = make("gpt2")
    pairs = encode_pairs(a, PAIRS3)
    g = b.graph
    r = head_damage(b, pairs, target=0.5, ablation=ablation)
    heads = [i for i, w in enumerate(g.writers) if ".H" in w]
    assert sorted(r.heads) == sorted(g.writers[i] for i in heads) and list(r.effect) == sorted(r.effect)
    base = S.clean_metric(b, pairs).double().numpy().mean()
    assert r.m_model == pytest.approx(base, abs=F64_TOL)
    # each head's effect: its writer's every out-edge ablated, one masked forward
    for name, e in zip(r.heads[:3], r.effect[:3]):
        m = g.valid().clone()
        m[:, g.writers.index(name)] = False
        want = F.circuit_metrics(b, pairs, [m], ablation)[0].mean() - base
        assert e == pytest.approx(want, abs=10 * F64_TOL)
    # the damage curve: the top k heads ablated together
    m = g.valid().clone()
    for k, d in enumerate(r.damage):
        m[:, g.writers.index(r.heads[k])] = False
        want = 1 - F.circuit_metrics(b, pairs, [m.clone()], ablation)[0].mean() / base
        assert d == pytest.approx(want, abs=10 * F64_TOL)
    if r.count is not None:
        assert r.damage[r.count - 1] >= 0.5 and (r.count == 1 or r.damage[: r.count - 1].max() < 0.5)
    assert len(r.damage) >= 1


def test_sink_share() -> None:
    # 2 sequences, 1 layer, 3 heads, 3 tokens; the second sequence's last token is padding
    p = torch.zeros(2, 1, 3, 3, 3, dtype=torch.float64)
    p[:, :, :, :, 0] = (
        torch.tensor([1.0, 0.2, 0.1], dtype=torch.float64)[None, None, None, :].expand(2, 1, 3, 3).clone()
    )
    p[:, 0, 1, :, 0] = 1.0  # head 1: everything on the first token
    p[:, 0, 2, 1:, 0] = 0.0  # head 2: only the first query (forced) attends there
    am = torch.tensor([[1, 1, 1], [1, 1, 0]])
    a = first_token_attention(p, am)
    # head 0: queries (1, .2, .1) and (1, .2) -> 2.5 / 5 real queries
    np.testing.assert_allclose(a.numpy()[0], [2.5 / 5, 1.0, 2 / 5], rtol=0, atol=1e-15)
    assert sink_share(a, 0.3) == pytest.approx(1.0) and sink_share(a, 0.45) == pytest.approx(2 / 3)
    assert sink_share(np.array([[0.3, 0.31]]), 0.3) == 0.5  # strictly above eps
