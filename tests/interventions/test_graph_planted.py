"""Planted ground truth for attribution graphs (issue 39, Must-have 4): on the model of
``groundtruth/planted_graph.py`` the graph, its head loadings, its QK attribution and both audits are compared
with values computed by hand from the construction (RMSNorm scales, softmax, RoPE's rotation), not read from
the model.

Tolerances: transformers' Llama computes RMSNorm's scale and RoPE's cos/sin in float32 whatever the model's dtype
and the graph stores float32 edges, so values agree to a few float32 roundings: ``REL = 16 · 2⁻²⁴`` relative."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from streetlamp.cli import main
from streetlamp.groundtruth.planted_graph import NAMES, A, B, C, PlantedGraph, Q, planted_graph_model
from streetlamp.interventions.engine import Intervention, run, zero
from streetlamp.interventions.graphs import attribute, graph_scores, prune
from streetlamp.interventions.graphs.audit import audit, propagate
from streetlamp.interventions.graphs.heads import cross_position_edges, head_loadings
from streetlamp.interventions.graphs.pruning import top_paths
from streetlamp.interventions.graphs.qk_audit import qk_audit, qk_explain, qk_heads
from streetlamp.models.adapter import Inputs
from streetlamp.models.dictionaries import save_features
from streetlamp.models.features import feature_site

REL = 16 * 2.0**-24
VARIANTS = [dict(), dict(qk=1.3, live_head=1), dict(qk=0.0)]  # qk 0: no match, attention uniform


class Hand:
    """The construction's quantities computed by hand (float64) from its parameters."""

    def __init__(
        self, pg: PlantedGraph, qk: float, value: float = 1.0, readout: float = 3.0, key: int | None = None
    ) -> None:
        key = pg.source if key is None else key  # the position the planted match points at
        cfg = pg.adapter.hf_model.config
        d, eps, n = cfg.hidden_size, cfg.rms_norm_eps, len(pg.ids)
        hd = d // cfg.num_attention_heads
        self.n, self.V = n, cfg.vocab_size
        # layer 0: the embedding e_f is unit, its RMSNorm scale 1/sqrt(1/d + eps); a feature's activation
        self.act = 1.0 / math.sqrt(1.0 / d + eps)
        # layer 1's input at the source and the query: e_f + act * d_f
        self.rms1 = math.sqrt((1 + self.act**2) / d + eps)
        read = self.act / self.rms1  # d_A . norm(x) at the source, d_Q . norm(x) at the query
        # RoPE: u in the last rotary pair's first coordinate turns by omega per position of distance
        omega = cfg.rope_parameters["rope_theta"] ** (-(hd - 2) / hd)
        self.score = qk**2 * read * read * math.cos(omega * (pg.query - key)) / math.sqrt(hd)
        self.alpha = math.exp(self.score) / (math.exp(self.score) + n - 1)  # every other key scores 0
        # the source's share of the head's attention: alpha when the match points at it, else an unmatched key's
        self.alpha_source = self.alpha if key == pg.source else 1 / (math.exp(self.score) + n - 1)
        moved = self.alpha_source * value * read  # the r component written at the query position (only A moves)
        self.rms_f = math.sqrt((1 + self.act**2 + moved**2) / d + eps)
        # the demeaned target logit's weight on r is readout * (1 - 1/V); the edge A -> logit is linear in A's
        # activation through the frozen pattern and norm scales
        self.edge = readout * (1 - 1 / self.V) * self.alpha_source * value * (self.act / self.rms1) / self.rms_f
        self.logit = readout * moved / self.rms_f
        self.d, self.eps, self.readout, self.read, self.value = d, eps, readout, read, value

    def without_query(self) -> float:
        """The demeaned target logit's change when Q is zeroed in the real model: the query reads nothing, every
        key scores 0, the head moves 1/n of the value; the final norm at the query loses d_Q."""
        moved = self.value * self.read / self.n
        rms = math.sqrt((1 + moved**2) / self.d + self.eps)
        return (self.readout * moved / rms - self.logit) * (1 - 1 / self.V)


def built(**kw: float) -> tuple[PlantedGraph, Hand]:
    pg = planted_graph_model(**kw)  # type: ignore[arg-type]
    return pg, Hand(pg, kw.get("qk", 0.8))


@pytest.mark.parametrize("kw", VARIANTS)
def test_graph_recovers_the_planted_path(kw: dict) -> None:
    pg, h = built(**kw)
    g = attribute(pg.adapter, pg.ids, batch_size=4)
    # the features: the planted one of each word, with the activation of the construction
    want = {pg.source: A, pg.distractor: B, pg.query: Q}
    feats = {(int(p), int(f)) for _, p, f in g.features}
    assert feats == {(p, want.get(p, C)) for p in range(h.n)}
    np.testing.assert_allclose(g.activations, h.act, rtol=REL)
    assert g.logit_labels[0] == "paris"
    nf = g.n_features
    src = next(i for i in range(nf) if tuple(g.features[i, 1:]) == (pg.source, A))
    col = g.adjacency[g.logit_start].double()
    # into the target logit: exactly one edge, from A at the source, of the hand-computed weight
    assert abs(float(col[src]) - h.edge) <= REL * abs(h.edge)
    others = col.clone()
    others[src] = 0
    assert float(others.abs().max()) <= REL * abs(h.edge)
    # token -> its feature: the feature's activation (b_enc = 0, the encoder reads the normed embedding)
    tok = g.token_start + pg.source
    assert abs(float(g.adjacency[src, tok]) - h.act) <= REL * h.act
    # the transcoder is exact and layer 1's MLP is zero: no error carries anything
    assert float(g.adjacency[:, g.error_start : g.token_start].abs().max()) <= 1e-5
    rep, comp = graph_scores(g)
    assert rep == pytest.approx(1.0, abs=1e-6) and comp == pytest.approx(1.0, abs=1e-6)
    if kw.get("qk", 0.8) == 0:
        return
    p = prune(g, 0.8, 0.98)
    best = top_paths(g, p, 1)[0][1]
    assert [g.label(i) for i in best] == [f"token 'mary' @{pg.source}", f"L0 F{A} @{pg.source}", "logit 'paris'"]


@pytest.mark.parametrize("kw", VARIANTS[:2])
def test_head_loading_and_qk_name_the_planted_head_and_pair(kw: dict) -> None:
    pg, h = built(**kw)
    g = attribute(pg.adapter, pg.ids, batch_size=4)
    p = prune(g, 0.8, 0.98)
    edges = cross_position_edges(g, p, 10)
    heads = head_loadings(pg.adapter, pg.ids, g, edges, batch_size=4)
    assert len(edges) == 1  # A @ source -> logit, the only cross-position edge
    carriers = heads[heads.carrier != "composition"]
    assert carriers[["layer", "head"]].values.tolist() == [[1, pg.head]]
    assert abs(float(carriers.loading.iloc[0]) - h.edge) <= REL * h.edge
    assert abs(float(heads[heads.carrier == "composition"].loading.iloc[0])) <= REL * h.edge
    chosen = qk_heads(heads, 3)
    assert [c[:4] for c in chosen] == [(1, pg.head, pg.query, pg.source)]
    ex = qk_explain(pg.adapter, g, chosen, top=5, batch_size=4)[0]
    assert ex.pattern == pytest.approx(h.alpha, rel=REL) and ex.score == pytest.approx(h.score, rel=REL)
    q_part, k_part, value = ex.pairs[0]
    assert (q_part, k_part) == (f"L0 F{Q} @{pg.query}", f"L0 F{A} @{pg.source}")
    assert value == pytest.approx(h.score, rel=REL)  # the planted match is the whole score
    assert all(abs(v) <= REL * h.score for _, _, v in ex.pairs[1:])


def test_a_misplanted_match_is_named_where_it_was_planted() -> None:
    """The key reads d_B instead of d_A: the head attends to the distractor (value 0) and moves only an unmatched
    key's share of A. The graph's edge A -> logit follows the hand value for that share; the QK attribution at
    (query, source) finds no pair (the (Q, A) pair of the planted model is not recovered because it is not
    there), and at (query, distractor) names (Q, B) with the hand-computed score."""
    pg = planted_graph_model(key=B)
    h = Hand(pg, 0.8, key=pg.distractor)
    right = built()[1]  # the correctly planted model's values, for contrast
    assert h.alpha_source < 0.5 * right.alpha  # the misplanting changes the numbers the test checks
    g = attribute(pg.adapter, pg.ids, batch_size=4)
    col = g.adjacency[g.logit_start].double()
    src = next(i for i in range(g.n_features) if tuple(g.features[i, 1:]) == (pg.source, A))
    assert abs(float(col[src]) - h.edge) <= REL * abs(h.edge)
    p = prune(g, 0.8, 0.98)
    heads = head_loadings(pg.adapter, pg.ids, g, cross_position_edges(g, p, 10), batch_size=4)
    chosen = qk_heads(heads, 3)
    assert [c[:4] for c in chosen] == [(1, pg.head, pg.query, pg.source)]
    at_source = qk_explain(pg.adapter, g, chosen, top=5, batch_size=4)[0]
    assert at_source.score == pytest.approx(0.0, abs=REL * h.score)
    assert at_source.pattern == pytest.approx(h.alpha_source, rel=REL)
    assert all(abs(v) <= REL * h.score for _, _, v in at_source.pairs)
    at_b = qk_explain(pg.adapter, g, [(1, pg.head, pg.query, pg.distractor, "probe")], top=5, batch_size=4)[0]
    assert at_b.pattern == pytest.approx(h.alpha, rel=REL) and at_b.score == pytest.approx(h.score, rel=REL)
    q_part, k_part, value = at_b.pairs[0]
    assert (q_part, k_part) == (f"L0 F{Q} @{pg.query}", f"L0 F{B} @{pg.distractor}")
    assert value == pytest.approx(h.score, rel=REL)
    assert all(abs(v) <= REL * h.score for _, _, v in at_b.pairs[1:])


@pytest.mark.parametrize("kw", VARIANTS[:2])
def test_audits_agree_and_the_frozen_pattern_hides_the_query_feature(kw: dict) -> None:
    pg, h = built(**kw)
    a = pg.adapter
    g = attribute(a, pg.ids, batch_size=4)
    p = prune(g, 0.8, 0.98)
    table = audit(a, g, p, top=10)
    row = table[table.source == f"L0 F{A} @{pg.source}"].iloc[0]
    # zeroing A removes the value the head moves: the logit falls by all of it, in the graph and in the model
    assert bool(row.agree) and row.measured == pytest.approx(-h.edge, rel=REL)
    assert row.predicted_total == pytest.approx(-h.edge, rel=REL)
    heads = head_loadings(a, pg.ids, g, cross_position_edges(g, p, 10), batch_size=4)
    qk = qk_audit(a, g, qk_heads(heads, 3), batch_size=4)
    # either side zeroed removes the match: every key scores 0, attention uniform
    assert set(qk.side) == {"query", "key"} and qk.agree.all()
    np.testing.assert_allclose(qk.predicted_attention_shift, 1 / h.n - h.alpha, rtol=REL)
    np.testing.assert_allclose(qk.measured_attention_shift, 1 / h.n - h.alpha, rtol=REL)
    assert set(qk.feature) == {f"L0 F{Q} @{pg.query}", f"L0 F{A} @{pg.source}"}

    # Q and B have no edge to the logit in the graph; in the model zeroing Q spreads the head's attention
    # (uniform: 1/n of the value moved instead of alpha), zeroing B changes nothing
    def node(pos: int, f: int) -> int:
        return next(i for i in range(g.n_features) if tuple(g.features[i, 1:]) == (pos, f))

    inputs = Inputs.from_ids(a, [pg.ids.tolist()])
    base = run(a, inputs, []).logits[0].double()
    for pos, f, want in [(pg.query, Q, h.without_query()), (pg.distractor, B, 0.0)]:
        assert propagate(g, node(pos, f))[g.logit_start] == 0
        out = run(a, inputs, [Intervention(feature_site(0, "mlp"), zero, head=f, pos=pos)]).logits[0].double()
        moved = float((out - base)[pg.target] - (out - base).mean())
        assert moved == pytest.approx(want, rel=REL, abs=REL * h.logit), NAMES[f]
    assert h.without_query() < -0.3 * h.logit  # the hidden effect: over a third of the logit, where the graph says 0


def test_streetlamp_graph_on_the_planted_model(tmp_path: Path) -> None:
    """The command, as a user runs it, on the planted model saved as a checkpoint folder."""
    pg, h = built()
    model = tmp_path / "model"
    pg.adapter.hf_model.save_pretrained(model, safe_serialization=True)
    pg.adapter.tokenizer.save_pretrained(model)
    save_features(pg.feature_set(), tmp_path / "features")
    out = tmp_path / "run"
    argv = ["graph", "john went to the store and mary gave a drink", "--model", str(model)]
    assert main([*argv, "--features", str(tmp_path / "features"), "--out", str(out), "--rows", "4"]) == 0
    paths = pd.read_csv(out / "paths.csv")
    assert paths.path.iloc[0] == f"token 'mary' @{pg.source} -> L0 F{A} @{pg.source} -> logit 'paris'"
    heads = pd.read_csv(out / "heads.csv")
    assert set(zip(heads.layer, heads["head"])) >= {(1, pg.head)}
    pairs = pd.read_csv(out / "qk_pairs.csv")
    top = pairs[pairs["rank"] == 1].iloc[0]
    assert (top.query_part, top.key_part) == (f"L0 F{Q} @{pg.query}", f"L0 F{A} @{pg.source}")
    tol = 2 * 2.0**-24 * 64  # the checkpoint loads in float32: a few dozen roundings
    assert float(top.contribution) == pytest.approx(h.score, rel=tol)
    audit_t = pd.read_csv(out / "audit.csv")
    assert audit_t[audit_t.source == f"L0 F{A} @{pg.source}"].agree.all()
    assert pd.read_csv(out / "qk_audit.csv").agree.all()
    edges = pd.read_parquet(out / "edges.parquet")
    w = edges[(edges.source_label == f"L0 F{A} @{pg.source}") & (edges.target_label == "logit 'paris'")].weight
    assert float(w.iloc[0]) == pytest.approx(h.edge, rel=tol)
