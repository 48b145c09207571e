"""Experts as nodes of the circuit graph (``circuit --expert-nodes``; issue 40 item 4), float64, on the tiny
Mixtral and Qwen2-MoE (its shared expert, and Qwen1.5-MoE's unrenormalised top-k weights):

(a) the spliced graph with nothing edited is the model (each expert node its ``experts.out`` slice, their sum
    ``mlp.out``); (b) every EAP score of an edge into or out of an expert, the router's input or the shared
    expert, and every expert node's score, is the float64 central finite difference of the masked forward it
    linearises; (c) exact patching of one expert node is a hand-written forward that patches that expert's output
    (routing and expert MLP written out from the weights); (d) a dense model's graph is unchanged.

The routers of transformers take their softmax in float32 even in a float64 model; the engine's expert nodes take
it in float64 (a float32 rounding would swamp a float64 finite difference). The model is compared with its routers'
softmax made float64 by a hook (:func:`float64_routers`), bit for bit to rounding, and with its own routers to
the float32 tolerance.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.interventions.circuits.blocks import Blocks, graph_of
from streetlamp.interventions.circuits.forward import run_graph
from streetlamp.interventions.circuits.graph import Graph
from streetlamp.interventions.circuits.scores import (
    ablation_values,
    eap,
    exact,
    exact_nodes,
    metric_values,
    node_scores,
)
from streetlamp.interventions.circuits.tasks import TaskPair, encode_pairs
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.moe import route
from streetlamp.models.sites import submodule
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
FAMILIES = ["mixtral", "qwen2_moe"]
EPS64 = float(torch.finfo(torch.float64).eps)


def tiny(family: str) -> ModelAdapter:
    model, tok = tiny_model(family, seed=1)
    return ModelAdapter(model.double(), tok, f"tiny-{family}")


@contextmanager
def float64_routers(a: ModelAdapter) -> Iterator[None]:
    """The model's routers with their softmax in float64 (their logits and top-k rule unchanged)."""
    spec = a.family.experts
    assert spec is not None
    handles = []
    for layer in a.layer_modules:

        def hook(m: Any, args: tuple, out: tuple) -> tuple:
            w, i = route(out[0], m.top_k, spec.rule, bool(getattr(m, "norm_topk_prob", True)), torch.float64)
            return out[0], w, i

        handles.append(submodule(layer, spec.router).register_forward_hook(hook))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@pytest.mark.parametrize("family", FAMILIES)
def test_expert_graph_unedited_is_the_model(family: str) -> None:
    a = tiny(family)
    b = Blocks(a, experts=True)
    g = b.graph
    pairs = encode_pairs(a, PAIRS)
    L = a.n_layers - 1
    sites = [f"layers.{L}.experts.out", f"layers.{L}.mlp.out"]
    with float64_routers(a):
        fwd = a.forward(pairs.clean, record=sites)
    own = a.forward(pairs.clean).logits  # the routers' own float32 softmax
    with torch.no_grad():
        run = run_graph(b, pairs.clean.input_ids, pairs.clean.attention_mask)
    scale = float(fwd.logits.abs().max())
    atol = F64_TOL * max(1.0, scale)
    torch.testing.assert_close(run.logits, fwd.logits, rtol=0, atol=atol)
    torch.testing.assert_close(run.logits, own, rtol=0, atol=f32_tol(a.n_layers + 1, scale))
    real = pairs.clean.attention_mask.bool()
    E = g.experts[L]
    ws = g.mlp_writers(L)
    experts = run.writers[:, :, ws.start : ws.start + E]
    torch.testing.assert_close(experts[real], fwd.cache[sites[0]][real], rtol=0, atol=atol)
    torch.testing.assert_close(run.writers[:, :, ws].sum(2)[real], fwd.cache[sites[1]][real], rtol=0, atol=atol)
    # every expert is routed some token (else its node would say nothing), and a token's routed experts are top_k
    routed = (experts[real].abs().sum(-1) > 0).sum(-1)
    assert (routed == a.hf_model.config.num_experts_per_tok).all() and (experts[real].abs().sum((0, 2)) > 0).all()
    if family == "qwen2_moe":
        assert g.shared[L] and g.writers[ws.stop - 1] == f"L{L}.SE"
    # no edge present under patching: every reader reads the corrupted stream, the corrupted run
    ab = ablation_values(b, pairs, "patch")
    with torch.no_grad():
        zeros = run_graph(
            b,
            pairs.clean.input_ids,
            pairs.clean.attention_mask,
            ablated=ab,
            mask=torch.zeros(1, g.n_readers, g.n_writers),
        )
    with float64_routers(a):
        corrupt = a.forward(pairs.corrupt).logits
    torch.testing.assert_close(zeros.logits, corrupt, rtol=0, atol=atol)
    assert (corrupt - fwd.logits).abs().max() > 1e3 * atol


def test_expert_graph_shape() -> None:
    g = Graph(2, 4, 2, experts=(3, 0), shared=(True, False))
    assert g.writers[5:9] == ("L0.E0", "L0.E1", "L0.E2", "L0.SE") and g.writers[13] == "L1.MLP"
    layer0 = [(r.node, r.input, r.owners) for r in g.readers[8:13]]
    assert layer0 == [
        ("L0.router", "router", (5, 6, 7)),
        ("L0.E0", "mlp", (5,)),
        ("L0.E1", "mlp", (6,)),
        ("L0.E2", "mlp", (7,)),
        ("L0.SE", "mlp", (8,)),
    ]
    assert list(g.mlp_readers(0)) == [8, 9, 10, 11, 12] and g.mlp_writers(0) == slice(5, 9)
    assert list(g.mlp_readers(1)) == [21] and g.mlp_writers(1) == slice(13, 14) and g.layer_start(1) == 9
    # the experts read embed and the layer's heads (not each other); layer 1 reads every writer before it
    assert all(g.n_upstream(i) == 5 for i in g.mlp_readers(0))
    assert g.n_upstream(g.mlp_reader(1)) == 13 and g.n_upstream(g.attn_readers(1).start) == 9
    # edges: layer 0 attention 8 x 1, its 5 MLP readers x 5, layer 1 attention 8 x 9, MLP 13, logits 14
    assert g.n_edges == 8 + 25 + 72 + 13 + 14
    assert dict(g.blocks())["mlp0"] == slice(5, 9)


@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_dense_graph_unchanged(family: str) -> None:
    """(d) Without --expert-nodes (and on a dense model) the graph is the one it always was: one MLP node a layer."""
    a = tiny(family)
    g = Blocks(a).graph
    plain = Graph(a.n_layers, a.n_heads, a.n_kv_heads)
    assert g == plain and g.writers == plain.writers and g.readers == plain.readers
    assert g.n_edges == 82 and not g.has_experts  # 2 layers, 4 heads, 2 key/value groups: test_graph_shape's count
    assert Graph(2, 4, 2, experts=(0, 0)).readers == plain.readers
    if family == "llama":
        with pytest.raises(StreetlampError, match="no mixture-of-experts model"):
            graph_of(a, experts=True)


def central(b: Blocks, pairs: Any, ab: torch.Tensor, cols: list[tuple[list[int], list[int]]], h: float) -> np.ndarray:
    """``[prompt, job]``: ``(m(M = 1 - h) - m(M = 1 + h)) / 2h`` with ``M`` set on the (reader, writer) entries of
    each job (an edge, or a node's every out-edge), every other edge present: the derivative EAP claims,
    ``d m / d t`` at ``t = 0`` of the readers fed ``z + t (z̃ - z)``, from masked forwards only."""
    g = b.graph
    n, J = len(pairs), len(cols)
    valid = g.valid().double()
    out = np.zeros((n, J))
    ids, am = pairs.clean.input_ids, pairs.clean.attention_mask
    for sign in (1.0, -1.0):
        mask = valid[None].repeat(J * n, 1, 1)
        for j, (rr, ww) in enumerate(cols):
            mask[j * n : (j + 1) * n, rr, ww] = 1.0 - sign * h
        with torch.no_grad():
            run = run_graph(b, ids.repeat(J, 1), am.repeat(J, 1), ablated=ab.repeat(J, 1, 1, 1), mask=mask)
            m = metric_values(run.logits, pairs.answer.repeat(J), pairs.wrong.repeat(J), "logit_diff")
        out += sign * m.double().cpu().numpy().reshape(J, n).T / (2 * h)
    return out


def float64_norms(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The family's RMSNorm in float64 (Hugging Face's casts its input to float32, whose rounding would swamp a
    float64 finite difference): the same formula without the cast."""
    import importlib

    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    norm = next(v for k, v in vars(mod).items() if k.endswith("RMSNorm") and isinstance(v, type))
    monkeypatch.setattr(
        norm,
        "forward",
        lambda self, x: self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)),
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_expert_eap_is_the_float64_finite_difference(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """(b) EAP of every edge touching an expert node (out of an expert, into the router or an expert's input) and
    every expert node's score (its out-edges summed) against central differences of the masked forward. The
    tolerance is the difference's own error: its truncation error, estimated from the step h against 2h
    (Richardson: error(h) ~ (D(2h) - D(h)) / 3), and its rounding, eps64 |m| / h. RMSNorm in float64
    (:func:`float64_norms`), the routers' softmax float64 in the engine already."""
    float64_norms(family, monkeypatch)
    a = tiny(family)
    b = Blocks(a, experts=True)
    g = b.graph
    pairs = encode_pairs(a, PAIRS)
    ab = ablation_values(b, pairs, "patch")
    sc = eap(b, pairs, batch_size=len(pairs)).per_prompt.double().numpy()  # [n, R, U]
    expert_w = {j for j, w in enumerate(g.writers) if ".E" in w or w.endswith(".SE")}
    rr, ww = g.edge_index()
    into = {i for i, r in enumerate(g.readers) if r.input == "router" or (r.input == "mlp" and r.owners[0] in expert_w)}
    jobs = [([int(i)], [int(j)]) for i, j in zip(rr, ww) if j in expert_w or i in into]
    jobs += [(list(range(g.n_readers)), [j] * g.n_readers) for j in sorted(expert_w)]  # nodes: every out-edge
    n_edges = len(jobs) - len(expert_w)
    assert n_edges == sum(1 for i, j in zip(rr, ww) if j in expert_w or i in into) > 100
    h = 1e-4
    d1, d2 = central(b, pairs, ab, jobs, h), central(b, pairs, ab, jobs, 2 * h)
    scale = float(metric_values(a.forward(pairs.clean).logits, pairs.answer, pairs.wrong, "logit_diff").abs().max())
    tol = 4 * np.abs(d2 - d1) / 3 + 16 * EPS64 * max(1.0, scale) / h
    node = node_scores(eap(b, pairs, batch_size=len(pairs))).double().numpy()
    want = np.stack(
        [sc[:, rows[0], cols[0]] for rows, cols in jobs[:n_edges]] + [node[:, cols[0]] for _, cols in jobs[n_edges:]],
        1,
    )
    assert np.all(np.abs(want - d1) <= tol), np.max(np.abs(want - d1) - tol)
    # the check has teeth: the scores are far above the tolerance, and the router's edges matter
    router = [k for k, (rows, _) in enumerate(jobs[:n_edges]) if g.readers[rows[0]].input == "router"]
    assert np.abs(d1).max() > 1e4 * tol.max() and np.abs(d1[:, router]).max() > 1e3 * tol.max()
    # a router path counted twice (or its weight's gradient dropped) would be caught: those edges differ from 0
    assert np.abs(d1[:, router]).max() > 1e-3


def hand_expert(a: ModelAdapter, l: int, hid: torch.Tensor, e: int) -> torch.Tensor:
    """Expert ``e``'s routed, weighted output at every token ``[N, d]`` from the block's input ``hid`` ``[N, d]``
    (after the layer's MLP norm), written out from the weights: router logits, softmax (float64), top-k (weights
    renormalised where the router says so), the expert's SwiGLU; 0 where e is not routed; ``e = -1``: the shared
    expert's ``sigmoid(x W_g) · down(act(gate x) ⊙ up x)``."""
    block: Any = submodule(a.layer_modules[l], "mlp")
    if e < 0:
        s = block.shared_expert
        y = s.down_proj(s.act_fn(s.gate_proj(hid)) * s.up_proj(hid))
        return torch.sigmoid(hid @ block.shared_expert_gate.weight.T) * y
    router, ex = block.gate, block.experts
    probs = torch.softmax(hid @ router.weight.T, -1)
    top, idx = torch.topk(probs, router.top_k, -1)
    if getattr(router, "norm_topk_prob", True):
        top = top / top.sum(-1, keepdim=True)
    w = (top * (idx == e)).sum(-1, keepdim=True)
    gate, up = (hid @ ex.gate_up_proj[e].T).chunk(2, -1)
    return w * ((ex.act_fn(gate) * up) @ ex.down_proj[e].T)


@pytest.mark.parametrize("family", FAMILIES)
def test_exact_expert_node_is_a_hand_patched_forward(family: str) -> None:
    """(c) ``exact_nodes`` on an expert node (every out-edge fed the corrupted run's value) is the model's own
    forward with that expert's output replaced, at its block, by the corrupted prompt's (both written by hand);
    and exact patching of one edge out of it into the logits is the same where the logits are its only reader."""
    a = tiny(family)
    b = Blocks(a, experts=True)
    g = b.graph
    pairs = encode_pairs(a, PAIRS)
    nodes = exact_nodes(b, pairs).double().numpy()  # [n, U]
    last = a.n_layers - 1  # its experts act only at the explained token: the one routed there that matters most
    top = max(range(g.experts[last]), key=lambda e: np.abs(nodes[:, g.writers.index(f"L{last}.E{e}")]).max())
    picks = [(0, 1), (last, top)] + ([(0, -1)] if family == "qwen2_moe" else [])
    for l, e in picks:
        u = g.writers.index(f"L{l}.SE" if e < 0 else f"L{l}.E{e}")
        block = submodule(a.layer_modules[l], "mlp")
        seen: dict[str, torch.Tensor] = {}

        def keep(m: Any, args: tuple, out: torch.Tensor) -> None:
            seen["in"] = args[0].reshape(-1, args[0].shape[-1])

        with float64_routers(a):
            h = block.register_forward_hook(keep)
            base = a.forward(pairs.clean).logits
            a.forward(pairs.corrupt)
            h.remove()
            patched_in = hand_expert(a, l, seen["in"], e)

            def patch(m: Any, args: tuple, out: torch.Tensor) -> torch.Tensor:
                x = args[0].reshape(-1, args[0].shape[-1])
                return out + (patched_in - hand_expert(a, l, x, e)).reshape(out.shape)

            h = block.register_forward_hook(patch)
            got = a.forward(pairs.clean).logits
            h.remove()
        m = metric_values(got, pairs.answer, pairs.wrong, "logit_diff")
        m0 = metric_values(base, pairs.answer, pairs.wrong, "logit_diff")
        want = (m - m0).double().numpy()
        scale = float(m0.abs().max())
        np.testing.assert_allclose(nodes[:, u], want, rtol=0, atol=F64_TOL * max(1.0, scale))
        assert np.abs(want).max() > 1e-4, (l, e)  # the expert matters: the check is not 0 = 0
        if l == last:  # the last layer's experts feed only the logits: the one edge is the node
            one = exact(b, pairs, edges=(np.array([g.logits_reader]), np.array([u]))).per_prompt
            np.testing.assert_allclose(one[:, g.logits_reader, u].numpy(), want, rtol=0, atol=F64_TOL * max(1.0, scale))


def test_other_methods_on_expert_nodes() -> None:
    """EAP-IG at one step is EAP (its one point is the clean run: inputs or each block's activations, the experts
    one block per layer); the QK fix leaves every edge but those into queries and keys at its EAP score (the
    experts' and the router's included); the MIB-format names of expert nodes."""
    from streetlamp.interventions.circuits.corrections import eap_qk
    from streetlamp.interventions.circuits.mib import edge_names
    from streetlamp.interventions.circuits.scores import eap_ig

    a = tiny("qwen2_moe")
    b = Blocks(a, experts=True)
    g = b.graph
    pairs = encode_pairs(a, PAIRS)
    ref = eap(b, pairs).per_prompt
    scale = float(torch.nan_to_num(ref).abs().max())
    assert scale > 1e-3
    for mode in ("inputs", "activations"):
        got = eap_ig(b, pairs, steps=1, mode=mode).per_prompt
        torch.testing.assert_close(got, ref, rtol=0, atol=F64_TOL * max(1.0, scale), equal_nan=True)
    qk = eap_qk(b, pairs)
    assert isinstance(qk.per_prompt, torch.Tensor)
    keep = torch.tensor([r.input not in ("q", "k") for r in g.readers])
    torch.testing.assert_close(
        qk.per_prompt[:, keep], ref[:, keep], rtol=0, atol=F64_TOL * max(1.0, scale), equal_nan=True
    )
    names = {n for ns in edge_names(g) for n in ns}
    assert {"input->m0.router", "m0.e1->logits", "m0.se->m1.e3", "a0.h2->m0.se"} <= names
