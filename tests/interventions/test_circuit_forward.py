"""The circuit forward and graph: with every edge present it is the model (every supported family); with
none, under patching, it is the corrupted run; the graph's shape is the one METHODS.md §9 defines."""

from __future__ import annotations

import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.interventions.circuits.blocks import Blocks, supported
from streetlamp.interventions.circuits.forward import run_graph
from streetlamp.interventions.circuits.graph import Graph
from streetlamp.interventions.circuits.scores import ablation_values
from streetlamp.interventions.circuits.tasks import TaskPair, encode_pairs
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.tiny import tiny_model
from tests.conftest import F64_TOL, f32_tol

PAIRS = [
    TaskPair(
        "when mary and john went to the store , john gave a drink to",
        "when mary and john went to the store , mary gave a drink to",
        " mary",
        " john",
    ),
    TaskPair("the movie was good", "the film was bad", " good", " bad"),  # shorter: right padding
]

# a classifier's answer and wrong answer are classes
CLASS_PAIRS = [TaskPair(p.clean, p.corrupt, "pos", "neg") for p in PAIRS]


def tol(a: ModelAdapter, scale: float) -> float:
    # Hugging Face runs RMSNorm (and the rotary tables) in float32 even in a float64 model; GPT-2 is float64 throughout
    return F64_TOL * max(1.0, scale) if a.family.name == "gpt2" else f32_tol(a.n_layers + 1, scale)


@pytest.mark.parametrize("family", supported())
def test_full_graph_is_the_model_and_empty_graph_is_the_corrupted_run(family: str) -> None:
    model, tok = tiny_model(family, seed=1)
    a = ModelAdapter(model.double(), tok, f"tiny-{family}")
    b = Blocks(a)
    pairs = encode_pairs(a, PAIRS if a.kind == "causal_lm" else CLASS_PAIRS)
    L = a.n_layers - 1
    sites = [f"layers.{L}.attn.head_out", f"layers.{L}.mlp.out"]
    fwd = a.forward(pairs.clean, record=sites)
    with torch.no_grad():
        run = run_graph(b, pairs.clean.input_ids, pairs.clean.attention_mask)
    scale = float(fwd.logits.abs().max())
    assert scale > 1e-2
    # the same modules on the same stream: equal to rounding (ModernBERT's own rotary step casts q and k to
    # float32, the engine keeps float64)
    exact = F64_TOL * max(1.0, scale) if family != "modernbert" else tol(a, scale)
    torch.testing.assert_close(run.logits, fwd.logits, rtol=0, atol=exact)
    real = pairs.clean.attention_mask.bool()
    s = b.graph.layer_start(L)
    torch.testing.assert_close(
        run.writers[:, :, s : s + a.n_heads][real], fwd.cache[sites[0]][real], rtol=0, atol=exact
    )
    torch.testing.assert_close(run.writers[:, :, s + a.n_heads][real], fwd.cache[sites[1]][real], rtol=0, atol=exact)
    # an all-ones mask with arbitrary ablated values is the model too; an all-zeros mask under patching
    # feeds every reader the corrupted stream: the corrupted run
    ab = ablation_values(b, pairs, "patch")
    R, U = b.graph.n_readers, b.graph.n_writers
    with torch.no_grad():
        ones = run_graph(b, pairs.clean.input_ids, pairs.clean.attention_mask, ablated=ab, mask=torch.ones(1, R, U))
        zeros = run_graph(b, pairs.clean.input_ids, pairs.clean.attention_mask, ablated=ab, mask=torch.zeros(1, R, U))
    corrupt = a.forward(pairs.corrupt).logits
    torch.testing.assert_close(ones.logits, fwd.logits, rtol=0, atol=tol(a, scale))
    torch.testing.assert_close(zeros.logits, corrupt, rtol=0, atol=tol(a, scale))
    assert (corrupt - fwd.logits).abs().max() > 1e3 * tol(a, scale)


def test_graph_shape() -> None:
    g = Graph(n_layers=2, n_heads=4, n_kv_heads=2)
    assert g.writers[:6] == ("embed", "L0.H0", "L0.H1", "L0.H2", "L0.H3", "L0.MLP")
    assert g.n_writers == 1 + 2 * 5
    # per layer 4 q + 2 k + 2 v (groups) + 1 mlp, then the logits
    assert g.n_readers == 2 * 9 + 1
    assert [(r.node, r.input) for r in g.readers[:9]] == (
        [(f"L0.H{h}", "q") for h in range(4)]
        + [("L0.KV0", "k"), ("L0.KV1", "k"), ("L0.KV0", "v"), ("L0.KV1", "v")]
        + [("L0.MLP", "mlp")]
    )
    assert g.readers[4].owners == (1, 2) and g.readers[5].owners == (3, 4)
    # edges: layer-0 attention readers see embed (8 x 1), layer-0 MLP embed + 4 heads (5), layer-1 attention
    # 8 x 6, layer-1 MLP 10, logits 11
    assert g.n_edges == 8 + 5 + 48 + 10 + 11
    ungrouped = Graph(1, 2, 2)
    assert [(r.node, r.input) for r in ungrouped.readers[:6]] == [
        ("L0.H0", "q"),
        ("L0.H1", "q"),
        ("L0.H0", "k"),
        ("L0.H1", "k"),
        ("L0.H0", "v"),
        ("L0.H1", "v"),
    ]
    t = g.edges_table(torch.arange(g.n_readers * g.n_writers, dtype=torch.float64).reshape(g.n_readers, -1), "eap")
    assert list(t.columns) == ["source", "target", "input", "score", "method", "kv_group", "edge"]
    assert t["edge"].nunique() == g.n_edges and set(t["input"]) == {"q", "k", "v", "mlp", "logits"}
    # heads only: a group's k/v edge is a row under each of its 2 heads (layer 0: embed; layer 1: 6 writers)
    assert t["target"].str.match(r"^(L\d+\.H\d+|L\d+\.MLP|logits)$").all()
    kv = t[t["kv_group"] != ""]
    assert len(kv) == 2 * (4 * 1 + 4 * 6) and len(t) == g.n_edges + len(kv) // 2
    r, w = g.edge_index()
    for x in kv.itertuples():  # each row is its group's edge: the score of that (reader, writer), its own head
        i, j = r[x.edge], w[x.edge]
        assert x.kv_group == g.readers[i].node and x.score == float(i * g.n_writers + j) and x.source == g.writers[j]
        assert x.target in [g.writers[o] for o in g.readers[i].owners] and g.reader_index(x.target, x.input) == i
    assert set(kv["target"]) == {f"L{l}.H{h}" for l in range(2) for h in range(4)}
    assert g.target_label(4) == "L0.H0,L0.H1" and g.reader_index("L0.H0,L0.H1", "k") == 4 == g.reader_index(
        "L0.KV0", "k"
    )
    assert (t[t["kv_group"] == ""].groupby("edge").size() == 1).all()


def test_grouped_attention_never_repeats_keys_per_query_head() -> None:
    """Under grouped-query attention the circuit forward's k and v inputs are [b, s, groups, d]."""
    model, tok = tiny_model("llama", seed=1)
    a = ModelAdapter(model.double(), tok, "tiny-llama")
    b = Blocks(a)
    pairs = encode_pairs(a, PAIRS)
    run = run_graph(b, pairs.clean.input_ids, pairs.clean.attention_mask)
    assert a.n_kv_heads < a.n_heads
    assert run.readers[0].shape[2] == a.n_heads + 2 * a.n_kv_heads


@pytest.mark.parametrize("family", ["bert", "gemma2"])
def test_unsupported_families_say_why(family: str) -> None:
    model, tok = tiny_model(family)
    with pytest.raises(StreetlampError, match="not supported: "):
        Blocks(ModelAdapter(model, tok, f"tiny-{family}"))


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_sparse_masks_are_the_dense_sum(family: str) -> None:
    """A mask that ablates few edges (exact patching's one per row, here two per row and a partial one) is
    summed as stream + (1 - M)(z̃ - z) without gradients; with gradients the dense Σ M z + (1 - M) z̃ runs.
    Both give the same logits and writers (float64), and the edges moved the output (not a no-op)."""
    model, tok = tiny_model(family, seed=1)
    a = ModelAdapter(model.double(), tok, f"tiny-{family}")
    b = Blocks(a)
    g = b.graph
    pairs = encode_pairs(a, PAIRS)
    ab = ablation_values(b, pairs, "patch")
    r, w = g.edge_index()
    mask = g.valid().double()[None].repeat(len(pairs), 1, 1)
    big = torch.randperm(len(r), generator=torch.Generator().manual_seed(0))[:3]
    mask[0, r[big[0]], w[big[0]]] = 0
    mask[0, r[big[1]], w[big[1]]] = 0.25  # a partial ablation
    mask[1, g.logits_reader, 0] = 0  # embed -> logits
    mask[1, r[big[2]], w[big[2]]] = 0
    ids, am = pairs.clean.input_ids, pairs.clean.attention_mask
    with torch.no_grad():
        sparse = run_graph(b, ids, am, ablated=ab, mask=mask)
        full = run_graph(b, ids, am)
    with torch.enable_grad():
        dense = run_graph(b, ids, am, ablated=ab, mask=mask)
    scale = float(full.logits.abs().max())
    t = tol(a, scale)
    torch.testing.assert_close(sparse.logits, dense.logits.detach(), rtol=0, atol=t)
    tw = tol(a, float(full.writers.abs().max()))
    torch.testing.assert_close(sparse.writers, dense.writers.detach(), rtol=0, atol=tw)
    assert float((sparse.logits - full.logits).abs().max()) > 1e3 * t  # the ablated edges changed the output


def test_circuit_support_is_read_from_the_family_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """A family registered at test time (Llama's facts under another model type: one object, one registry
    line) is accepted and its circuit forward is the model; the same object without its circuit wiring,
    or marked post-LN, is refused with the reason its object gives. No family name is read."""
    import dataclasses

    from streetlamp.models.families import FAMILIES, NormPlacement
    from tests.models.test_sites import _toy_family

    monkeypatch.setitem(FAMILIES, "toy-llama", _toy_family())
    assert "toy-llama" in supported()
    test_full_graph_is_the_model_and_empty_graph_is_the_corrupted_run("toy-llama")
    model, tok = tiny_model("toy-llama", seed=1)
    a = ModelAdapter(model, tok, "tiny-toy-llama")
    monkeypatch.setitem(FAMILIES, "toy-llama", dataclasses.replace(_toy_family(), circuit=None))
    assert "toy-llama" not in supported()
    with pytest.raises(StreetlampError, match=r"\(toy-llama\) is not supported: not wired"):
        Blocks(ModelAdapter(model, tok, "tiny-toy-llama"))
    post = dataclasses.replace(_toy_family(), norm=NormPlacement("post", "input_layernorm", "rmsnorm"))
    monkeypatch.setitem(FAMILIES, "toy-llama", post)
    with pytest.raises(StreetlampError, match="post-LN"):
        Blocks(ModelAdapter(model, tok, "tiny-toy-llama"))
    assert a.family.circuit is not None
