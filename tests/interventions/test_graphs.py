"""Attribution graphs (interventions/graphs): edges against the frozen replacement model run forward in
float64 with every frozen quantity substituted by value (an independent computation: no gradients, no detach),
pruning and scores against hand computations, the replacement model's forward = the model's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.interventions.graphs import Graph, attribute, graph_scores, influence, normalize, prune
from streetlamp.interventions.graphs.replacement import freeze_edits, frozen_norms
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.features import Dictionary, FeatureSet, feature_site
from streetlamp.models.sites import submodule
from streetlamp.models.tiny import tiny_model

TEXT = "when mary and john went to the store , john gave a drink to"


def random_transcoder(layer: int, d: int, width: int, seed: int, skip: bool = False) -> Dictionary:
    g = torch.Generator().manual_seed(seed)
    return Dictionary(
        layer,
        "mlp",
        W_enc=torch.randn(d, width, generator=g, dtype=torch.float64) / d**0.5,
        b_enc=torch.randn(width, generator=g, dtype=torch.float64) * 0.1 - 0.3,
        W_dec=torch.randn(width, d, generator=g, dtype=torch.float64) / width**0.5,
        b_dec=torch.randn(d, generator=g, dtype=torch.float64) * 0.1,
        W_skip=torch.randn(d, d, generator=g, dtype=torch.float64) * 0.1 if skip else None,
    )


def llama64(layers: int = 3, skip_at: int | None = 1, missing: int | None = None) -> ModelAdapter:
    model, tok = tiny_model("llama", seed=1, layers=layers)
    a = ModelAdapter(model.double(), tok, "tiny-llama")
    dicts = {
        (l, "mlp"): random_transcoder(l, a.d_model, 48, 10 + l, skip=l == skip_at)
        for l in range(layers)
        if l != missing
    }
    a.attach_features(FeatureSet(dicts, source="random"))
    return a


class Frozen:
    """The replacement model by value: a clean run records every attention pattern, every norm's scale, the
    features and errors; ``run(...)`` then replays the model with those patterns and scales substituted and
    the given node values (features, errors, token embeddings), and returns what the graph's targets read:
    each layer's MLP input and the LM head's input at the last position."""

    def __init__(self, a: ModelAdapter, ids: torch.Tensor) -> None:
        self.a, self.inputs = a, a.encode([TEXT])
        self.norms = [m for m in a.hf_model.modules() if type(m).__name__.endswith("RMSNorm")]
        self.scale: dict[int, torch.Tensor] = {}
        self.layers = sorted(l for (l, _) in a.features.dictionaries)
        rec = ["embed"] + [f"layers.{l}.attn.pattern" for l in range(a.n_layers)]
        rec += [feature_site(l, "mlp", e) for l in self.layers for e in (False, True)]
        rec += [f"layers.{l}.mlp.out" for l in range(a.n_layers)]
        rec += [f"layers.{l}.attn.v" for l in range(a.n_layers)]
        self.mode = "record"
        fwd = self._forward(record=rec)
        self.clean = {k: v.clone() for k, v in fwd.cache.items()}
        self.mode = "frozen"

    def _forward(self, record=(), edit=None):
        self.mlp_in: dict[int, torch.Tensor] = {}
        self.h: list[torch.Tensor] = []
        handles = []
        for m in self.norms:

            def hook(m, args, out, key=id(m)):
                x = args[0]
                if self.mode == "record":
                    self.scale[key] = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.variance_epsilon)
                return m.weight * (x * self.scale[key])

            handles.append(m.register_forward_hook(hook))
        for l, layer in enumerate(self.a.layer_modules):
            mlp = submodule(layer, self.a.family.mlp)
            handles.append(mlp.register_forward_pre_hook(lambda m, args, l=l: self.mlp_in.__setitem__(l, args[0][0])))
        head = self.a.hf_model.get_output_embeddings()
        handles.append(head.register_forward_pre_hook(lambda m, args: self.h.append(args[0][0, -1])))
        try:
            with torch.no_grad():
                return self.a.forward(self.inputs, record=record, edit=edit)
        finally:
            for h in handles:
                h.remove()

    def run(self, acts=None, errors=None, embed=None, heads=None):
        """MLP inputs {layer: [pos, d]} and the LM head's input [d] with the given node values (default clean);
        ``heads``: the (layer, head)s whose values may move, every other head's values held at the clean run's
        (default: all move)."""
        c = self.clean
        edit = {"embed": lambda e: (c["embed"] if embed is None else embed).clone()}
        if heads is not None:
            for l in range(self.a.n_layers):

                def hold(v, l=l):
                    out = c[f"layers.{l}.attn.v"].clone()
                    for h in range(v.shape[2]):
                        if (l, h) in heads:
                            out[:, :, h] = v[:, :, h]
                    return out

                edit[f"layers.{l}.attn.v"] = hold
        for l in range(self.a.n_layers):
            edit[f"layers.{l}.attn.pattern"] = lambda p, l=l: c[f"layers.{l}.attn.pattern"].clone()
            if l in self.layers:
                edit[feature_site(l, "mlp")] = lambda x, l=l: (acts or {}).get(l, c[feature_site(l, "mlp")]).clone()
                edit[feature_site(l, "mlp", True)] = lambda x, l=l: (
                    (errors or {}).get(l, c[feature_site(l, "mlp", True)]).clone()
                )
            else:  # no transcoder: the whole MLP output is the error node
                edit[f"layers.{l}.mlp.out"] = lambda x, l=l: (errors or {}).get(l, c[f"layers.{l}.mlp.out"]).clone()
        self._forward(edit=edit)
        return dict(self.mlp_in), self.h[-1]


def target_value(a: ModelAdapter, g: Graph, t: int, mlp_in: dict, h: torch.Tensor) -> float:
    """The graph's target ``t`` read from a frozen run: ``W_enc[:, f] · x`` or the demeaned logit."""
    if g.kind(t) == "feature":
        l, p, f = (int(v) for v in g.features[t])
        return float(mlp_in[l][p] @ a.features.get(l, "mlp").W_enc[:, f])
    W = a.hf_model.get_output_embeddings().weight
    i = int(g.logit_ids[t - g.logit_start])
    return float(h @ (W[i] - W.mean(0)).detach())


def knock_out(a: ModelAdapter, fr: Frozen, g: Graph, s: int, heads=None) -> tuple[dict, torch.Tensor]:
    """The frozen run with source node ``s``'s value set to zero (``heads``: as :meth:`Frozen.run`)."""
    c = fr.clean
    k = g.kind(s)
    if k == "feature":
        l, p, f = (int(v) for v in g.features[s])
        x = c[feature_site(l, "mlp")].clone()
        x[0, p, f] = 0
        return fr.run(acts={l: x}, heads=heads)
    if k == "error":
        l, p = g.where(s)
        name = feature_site(l, "mlp", True) if l in fr.layers else f"layers.{l}.mlp.out"
        x = c[name].clone()
        x[0, p] = 0
        return fr.run(errors={l: x}, heads=heads)
    _, p = g.where(s)
    x = c["embed"].clone()
    x[0, p] = 0
    return fr.run(embed=x, heads=heads)


@pytest.mark.parametrize("missing", [None, 2])
def test_edges_equal_knockouts_through_the_frozen_replacement(missing: int | None) -> None:
    """Every edge A[t, s] equals target(clean) − target(source s set to zero) in the replacement model run by
    value (it is affine in its nodes: the difference is exact up to float64 rounding); with a skip transcoder at
    layer 1 and (second case) no transcoder at layer 2 (its MLP output an error node)."""
    a = llama64(missing=missing)
    ids = a.encode([TEXT]).input_ids[0]
    g = attribute(a, ids, batch_size=7, zero_bos=False)
    fr = Frozen(a, ids)
    base_in, base_h = fr.run()
    rng = np.random.default_rng(0)
    targets = [g.logit_start, g.logit_start + 1] + [
        int(i)
        for i in rng.choice(np.flatnonzero(g.features[:, 0] == 2 if missing is None else g.features[:, 0] == 1), 3)
    ]
    feats = [int(i) for i in rng.choice(g.n_features, 12, replace=False)]
    errors = [g.error_start + l * g.n_pos + p for l in range(3) for p in (0, 5, g.n_pos - 1)]
    tokens = [g.token_start + p for p in (0, 3, g.n_pos - 1)]
    A = g.adjacency.double()
    scale = float(A.abs().max())
    for s in feats + errors + tokens:
        mlp_in, h = knock_out(a, fr, g, s)
        for t in targets:
            want = target_value(a, g, t, base_in, base_h) - target_value(a, g, t, mlp_in, h)
            assert abs(float(A[t, s]) - want) <= 1e-6 * scale, (g.label(t), g.label(s), float(A[t, s]), want)
    # a feature's pre-activation = its incoming edges + what no node carries (b_dec's, b_enc): zero every node
    zero_acts = {l: torch.zeros_like(fr.clean[feature_site(l, "mlp")]) for l in fr.layers}
    zero_err = {
        l: torch.zeros_like(fr.clean[feature_site(l, "mlp", True) if l in fr.layers else f"layers.{l}.mlp.out"])
        for l in range(3)
    }
    z_in, z_h = fr.run(acts=zero_acts, errors=zero_err, embed=torch.zeros_like(fr.clean["embed"]))
    for t in targets:
        want = target_value(a, g, t, base_in, base_h) - target_value(a, g, t, z_in, z_h)
        assert abs(float(A[t].sum()) - want) <= 1e-6 * scale * A.shape[1] ** 0.5


def test_nodes_and_rows_are_the_replacement_models() -> None:
    """Feature nodes are exactly the active latents; feature rows only read earlier layers; logit choice as
    circuit-tracer's; zero_bos removes the special first token's features and error columns."""
    a = llama64()
    ids = a.encode([TEXT]).input_ids[0]
    g = attribute(a, ids, batch_size=64, zero_bos=False)
    fwd = a.forward(a.encode([TEXT]), record=[feature_site(l, "mlp") for l in range(3)])
    n_active = sum(int((fwd.cache[feature_site(l, "mlp")] > 0).sum()) for l in range(3))
    assert g.n_features == g.n_active == n_active
    l, p, f = (int(v) for v in g.features[5])
    assert g.activations[5] == pytest.approx(float(fwd.cache[feature_site(l, "mlp")][0, p, f]), abs=0)
    A = g.adjacency
    for t in range(g.n_features):
        lt, pt = g.where(t)
        src = torch.nonzero(A[t]).view(-1).tolist()
        assert all(g.where(s)[0] < lt and g.where(s)[1] <= pt for s in src)
    assert not A[g.error_start : g.logit_start].any()  # errors and tokens have no inputs
    probs = torch.softmax(fwd.logits[0], -1)
    top = torch.topk(probs, 10)
    cum = torch.cumsum(top.values, 0)
    k = int((cum < 0.95).sum()) + 1
    assert g.logit_ids.tolist() == top.indices[: min(k, 10)].tolist()
    # the special-token rule: a first token in special_ids has no nodes of its own
    bos = torch.cat([torch.tensor([min(a.special_ids)]), ids])
    gb = attribute(a, bos, batch_size=64)
    assert gb.info["zero_bos"] and (gb.features[:, 1] > 0).all()
    assert not gb.adjacency[:, [gb.error_start + l * gb.n_pos for l in range(3)]].any()


def test_negative_jumprelu_latents_are_nodes() -> None:
    """A JumpReLU latent with θ < 0 fires below zero (``z·[z > θ]``, z in (θ, 0)): it writes ``a W_dec`` into
    the MLP output, which the error (output − reconstruction) does not hold, so it must be a node (circuit-tracer
    makes every nonzero latent one). The feature nodes are the nonzero latents, negative ones among them, and a
    logit's row still sums to the demeaned logit less what no node carries (the frozen replay by value with every
    node zeroed), as in test_edges_equal_knockouts_through_the_frozen_replacement."""
    model, tok = tiny_model("llama", seed=1, layers=2)
    a = ModelAdapter(model.double(), tok, "tiny-llama")
    dicts = {}
    for l in range(2):
        d = random_transcoder(l, a.d_model, 48, 10 + l)
        theta = torch.rand(48, generator=torch.Generator().manual_seed(l), dtype=torch.float64) * 0.6 - 0.4
        dicts[(l, "mlp")] = Dictionary(l, "mlp", d.W_enc, d.b_enc, d.W_dec, d.b_dec, "jumprelu", threshold=theta)
    a.attach_features(FeatureSet(dicts, source="random jumprelu"))
    ids = a.encode([TEXT]).input_ids[0]
    g = attribute(a, ids, batch_size=64, zero_bos=False)
    fwd = a.forward(a.encode([TEXT]), record=[feature_site(l, "mlp") for l in range(2)])
    assert g.n_features == sum(int((fwd.cache[feature_site(l, "mlp")] != 0).sum()) for l in range(2))
    assert (g.activations < 0).sum() > 5
    fr = Frozen(a, ids)
    base_in, base_h = fr.run()
    zero_acts = {l: torch.zeros_like(fr.clean[feature_site(l, "mlp")]) for l in range(2)}
    zero_err = {l: torch.zeros_like(fr.clean[feature_site(l, "mlp", True)]) for l in range(2)}
    z_in, z_h = fr.run(acts=zero_acts, errors=zero_err, embed=torch.zeros_like(fr.clean["embed"]))
    A = g.adjacency.double()
    for t in range(g.logit_start, g.n_nodes):
        want = target_value(a, g, t, base_in, base_h) - target_value(a, g, t, z_in, z_h)
        assert abs(float(A[t].sum()) - want) <= 1e-6 * float(A.abs().max()) * A.shape[1] ** 0.5


def test_replacement_forward_is_the_model() -> None:
    """The frozen replacement (errors kept) reproduces the model's logits to float64 rounding; its gradients
    differ (frozen patterns and norms: the model is linear between its nodes)."""
    a = llama64()
    inputs = a.encode([TEXT])
    plain = a.forward(inputs).logits
    sinks: dict = {}
    stash: dict = {}
    with frozen_norms(a):
        fwd = a.forward(inputs, edit=freeze_edits(a, sinks, stash), keep_grad=True, grad=True)
    torch.testing.assert_close(fwd.logits, plain, rtol=0, atol=1e-12)
    # linear between nodes: doubling every node value doubles the logits' node-carried part exactly
    g = torch.autograd.grad(fwd.logits[0, 3], [sinks["embed"]])[0]
    assert g.abs().sum() > 0


def hand_graph() -> Graph:
    """Two features f0 (layer 0) -> f1 (layer 1), an error node at each layer, one position, one logit.
    Node order: f0, f1, err0, err1, token, logit."""
    A = torch.zeros(6, 6)
    A[0, 4] = 2.0  # token -> f0
    A[1, 0] = 1.0  # f0 -> f1
    A[1, 2] = -1.0  # err0 -> f1
    A[1, 4] = 1.0  # token -> f1
    A[5, 1] = 3.0  # f1 -> logit
    A[5, 3] = 1.0  # err1 -> logit
    A[5, 4] = -0.5  # token -> logit
    return Graph(
        ids=[7],
        tokens=["x"],
        features=np.array([[0, 0, 3], [1, 0, 5]]),
        activations=np.array([1.0, 2.0]),
        n_layers=2,
        logit_ids=np.array([9]),
        logit_probs=np.array([0.5]),
        logit_labels=["y"],
        rows=A[[0, 1, 5]],  # the targets' rows: f0, f1, the logit
        error_norms=np.ones((2, 1)),
    )


def test_scores_on_a_hand_made_graph() -> None:
    """Influence, replacement and completeness by hand. Normalised rows: f0 = [token 1]; f1 = [f0 1/3, err0 1/3,
    token 1/3]; logit = [f1 3/4.5, err1 1/4.5, token 0.5/4.5]. With w = 0.5 at the logit:
    infl(f1) = 0.5·2/3 = 1/3; infl(err1) = 0.5/4.5 = 1/9; infl(f0) = 1/3·1/3 = 1/9; infl(err0) = 1/9;
    infl(token) = 0.5·(0.5/4.5) + 1/3·1/3 + 1/9·1 = 1/18 + 1/9 + 1/9 = 5/18."""
    g = hand_graph()
    w = g.logit_weights()
    inf = influence(normalize(g.adjacency), w)
    want = torch.tensor([1 / 9, 1 / 3, 1 / 9, 1 / 9, 5 / 18, 0], dtype=torch.float64)
    torch.testing.assert_close(inf, want, rtol=0, atol=1e-15)
    # the graph's own form: the targets' rows only
    torch.testing.assert_close(influence(normalize(g.rows), w, g.row_nodes), want, rtol=0, atol=1e-15)
    # (I - A)^{-1} - I, the closed form
    An = normalize(g.adjacency)
    closed = w @ (torch.linalg.inv(torch.eye(6, dtype=torch.float64) - An) - torch.eye(6, dtype=torch.float64))
    torch.testing.assert_close(inf, closed, rtol=0, atol=1e-14)
    rep, comp = graph_scores(g)
    assert rep == pytest.approx((5 / 18) / (5 / 18 + 1 / 9 + 1 / 9), abs=1e-15)
    # completeness: non-error input share per node, weighted by influence + w
    non_err = torch.tensor([1, 2 / 3, 1, 1, 1, 1 - 1 / 4.5], dtype=torch.float64)
    out = want + w
    assert comp == pytest.approx(float((non_err * out).sum() / out.sum()), abs=1e-15)


def test_pruning_by_hand() -> None:
    """Influences (f0 1/9, f1 1/3, err0 1/9, err1 1/9, token 5/18, logit 0): total 17/18. Node threshold 0.5:
    sorted f1 (6/17), token (5/17) -> cumulative 11/17 ≥ 0.5: the threshold score is the token's 5/18, so f1
    and the token survive with the logit (always kept); f0, err0, err1 go. Edge scores on the pruned matrix:
    rows f1 = [token 1] (f0, err0 pruned), logit = [f1 3/2.5, token -0.5/2.5 -> |.|]: logit row normalised
    f1 6/7, token 1/7; influence(f1) = 0.5·6/7, so edge scores: logit<-f1 0.5·6/7 = 3/7, logit<-token 1/14,
    f1<-token 3/7·1. Edge threshold 0.9: sorted 3/7, 3/7, 1/14 (total 13/14): 6/7 / (13/14) = 12/13 ≥ 0.9, so
    the token -> logit edge goes."""
    g = hand_graph()
    p = prune(g, node_threshold=0.5, edge_threshold=0.9)
    assert p.node_mask.tolist() == [False, True, False, False, True, True]
    kept = {(int(t), int(s)) for t, s, _ in zip(*p.edges())}
    assert kept == {(1, 4), (5, 1)}
    # everything kept at thresholds 1
    p1 = prune(g, 1.0, 1.0)
    assert p1.node_mask.all()
    with pytest.raises(StreetlampError, match=r"outside \(0, 1\]"):
        prune(g, 0.0, 0.5)
    with pytest.raises(StreetlampError, match=r"outside \(0, 1\]"):
        prune(g, 0.5, 1.5)


def test_refusals() -> None:
    model, tok = tiny_model("llama", seed=1)
    a = ModelAdapter(model.double(), tok, "tiny-llama")
    ids = a.encode([TEXT]).input_ids[0]
    with pytest.raises(StreetlampError, match="needs a dictionary"):
        attribute(a, ids)
    sae = Dictionary(0, "resid_pre", torch.zeros(32, 8), torch.zeros(8), torch.zeros(8, 32), torch.zeros(32))
    a.attach_features(FeatureSet({(0, "resid_pre"): sae}, source="sae"))
    with pytest.raises(StreetlampError, match="no transcoder"):
        attribute(a, ids)


def test_feature_cap_keeps_the_rows_of_the_visited_features() -> None:
    """With max_feature_nodes below the active count, features are visited by estimated influence: the graph
    holds exactly that many, and each kept row equals the full graph's row on the kept columns."""
    a = llama64()
    ids = a.encode([TEXT]).input_ids[0]
    full = attribute(a, ids, batch_size=16, zero_bos=False)
    cap = attribute(a, ids, batch_size=16, zero_bos=False, max_feature_nodes=40)
    assert cap.n_features == 40 and cap.n_active == full.n_active
    where = {tuple(f): i for i, f in enumerate(full.features.tolist())}
    cols = [where[tuple(f)] for f in cap.features.tolist()] + list(range(full.error_start, full.n_nodes))
    rows = cols[:40] + list(range(full.logit_start, full.n_nodes))
    want = full.adjacency[rows][:, cols]
    got = cap.adjacency[list(range(40)) + list(range(cap.logit_start, cap.n_nodes))]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6 * float(want.abs().max()))
    # one ranking (40 < 4 x 256): circuit-tracer's partial influence from the logit rows alone,
    # sum_k p_k |A[k, c]| / sum_c' |A[k, c']|, picks the 40 visited
    L = full.adjacency[full.logit_start :].double().abs()
    score = (torch.as_tensor(full.logit_probs)[:, None] * L / L.sum(1, keepdim=True)).sum(0)[: full.n_features]
    assert set(cols[:40]) == set(torch.argsort(score, descending=True)[:40].tolist())


def test_feature_qk_parts_are_knockouts_and_sum_to_the_score() -> None:
    """QK attribution with nodes as units: a feature's query-side part q_i(X) equals the change of the head's
    (rotated) query when X is zeroed in the replacement model run by value; the parts sum to the score that
    qk.py's component-level attribution computes from the model."""
    from streetlamp.interventions.graphs.qk import feature_qk
    from streetlamp.interventions.qk import qk_attribution
    from streetlamp.models.readout import pre_attn_norm, query_key

    a = llama64()
    ids = a.encode([TEXT]).input_ids[0]
    layer, head, q = 2, 1, len(ids) - 1
    res = feature_qk(a, ids, layer, head, q, batch_size=16, zero_bos=False)
    ref = qk_attribution(a, ids, layer, head, q, res.key)
    assert res.score == pytest.approx(ref.score, abs=1e-9 * abs(ref.score) + 1e-12)
    assert res.q_side.sum() == pytest.approx(ref.score, abs=1e-9) and res.k_side.sum() == pytest.approx(
        ref.score, abs=1e-9
    )
    fr = Frozen(a, ids)
    resid: list = []
    h = a.layer_modules[layer].register_forward_pre_hook(
        lambda m, args, kwargs: resid.append((args[0] if args else kwargs["hidden_states"])[0]), with_kwargs=True
    )
    try:
        fr.run()
        base = resid[-1]
        g = attribute(a, ids, batch_size=64, zero_bos=False)
        norm = pre_attn_norm(a, layer)
        z = norm(base)
        scale = norm.scale(base)
        feats = [i for i in range(g.n_features) if g.features[i, 0] < layer][:: max(1, g.n_features // 8)][:8]
        # the query map dx[q] -> dq is linear: its matrix J [d, d_head], one basis vector at a time
        basis = torch.zeros(a.d_model, *base.shape, dtype=base.dtype)
        basis[torch.arange(a.d_model), q, torch.arange(a.d_model)] = 1
        J = torch.stack([query_key(a, layer, norm.linear(e, scale), bias=False, full=z)[0][q, head] for e in basis])
        for i in feats + [g.token_start + 2]:
            knock_out(a, fr, g, i)
            dx = base - resid[-1]  # what node i carries into layer `layer`'s input
            lin = norm.linear(dx, scale)
            dq = query_key(a, layer, lin, bias=False, full=z)[0][q, head]
            got = torch.as_tensor(res.q_parts[i], dtype=torch.float64)
            # Hugging Face's LlamaRMSNorm computes in float32 even in a float64 model: each of the 2L + 1 norms
            # (L before the test's layer) rounds its output to 2^-24 of the residual's size, in the clean and in
            # the knocked-out run, so dx (a difference of the two) carries 2 (2L + 1) 2^-24 |x| through J; the
            # graph's float32 rows add 2^-24 of each coordinate of dx
            n_norms = 2 * layer + 1
            bound = 2.0**-24 * (2 * n_norms * (base[q].abs() @ J.abs()) + dx[q].abs() @ J.abs())
            err = (got - dq).abs()
            assert bool((err <= bound).all()), f"node {i}: error {err.max():.3g} above the float32 bound"
    finally:
        h.remove()


def test_head_loadings_are_single_head_knockouts_and_sum_to_the_edge() -> None:
    """Head loadings: head h's loading on a cross-position edge s -> t equals, in the replacement model run by value
    (float64), target(clean) - target(s zeroed) with every other head's values held at their clean values (only
    h's OV path lets the change through); the loadings plus the composition term (paths through two or more
    heads) sum to the edge the graph holds; with one attention layer between source and target the composition
    term vanishes and a loading is also the edge less the edge with that head's values held (knocked out).
    Tolerance: Llama's RMSNorm normalises in float32 even in a float64 model, so the model (which the loadings
    differentiate) and the by-value replay (float64 scales) differ at float32 rounding, 6e-8 relative per
    norm: 1e-6 of the edge's total absolute path weight; sums of float64 rows against each other: 1e-12."""
    from streetlamp.interventions.graphs.heads import head_loadings

    a = llama64()
    ids = a.encode([TEXT]).input_ids[0]
    g = attribute(a, ids, batch_size=16, zero_bos=False)
    A = g.adjacency.double()
    n = g.n_pos
    rng = np.random.default_rng(1)

    def pick(targets, sources, k):
        pairs = [(t, s) for t in targets for s in sources if g.where(t)[1] != g.where(s)[1] and A[t, s] != 0]
        return [pairs[i] for i in rng.choice(len(pairs), min(k, len(pairs)), replace=False)]

    f0 = [i for i in range(g.n_features) if g.features[i, 0] == 0]
    f1 = [i for i in range(g.n_features) if g.features[i, 0] == 1]
    f2 = [i for i in range(g.n_features) if g.features[i, 0] == 2]
    toks = list(range(g.token_start, g.logit_start))
    errs = [g.error_start + n + p for p in range(n)]  # layer-1 error nodes
    logit = [g.logit_start]
    adjacent = pick(f2, f1, 3) + pick(f0, toks, 2)  # one attention layer between (layer 2's; layer 0's)
    deep = pick(f2, f0, 2) + pick(logit, f0 + toks, 3) + pick(f2, errs, 1)
    edges = adjacent + deep
    tab = head_loadings(a, ids, g, edges, batch_size=7)
    fr = Frozen(a, ids)
    base_in, base_h = fr.run()
    all_heads = {(l, h) for l in range(a.n_layers) for h in range(a.n_heads)}
    scale = float(A.abs().max())
    for t, s in edges:
        rows = tab[(tab.target_node == t) & (tab.source_node == s)]
        edge = float(rows.edge_weight.iloc[0])
        assert edge == pytest.approx(float(A[t, s]), abs=1e-6 * scale)  # the graph's float32 edge
        assert rows.loading.sum() == pytest.approx(edge, abs=1e-12 * scale)
        none_in, none_h = knock_out(a, fr, g, s, heads=set())
        e_none = target_value(a, g, t, base_in, base_h) - target_value(a, g, t, none_in, none_h)
        assert abs(e_none) <= 1e-12 * scale  # no path without a head across positions (exactly 0 up to rounding)
        by_head = {(int(r.layer), int(r.head)): float(r.loading) for r in rows.itertuples() if r.layer >= 0}
        tol = 1e-6 * float(rows.loading.abs().sum())
        checked = 0
        for l, h in sorted(all_heads):
            mi, mh = knock_out(a, fr, g, s, heads={(l, h)})
            want = target_value(a, g, t, base_in, base_h) - target_value(a, g, t, mi, mh) - e_none
            assert by_head.get((l, h), 0.0) == pytest.approx(want, abs=tol), (g.label(t), g.label(s), l, h)
            checked += abs(want) > 1e-6 * scale
        assert checked >= 1
        comp = float(rows[rows.carrier == "composition"].loading.iloc[0])
        if (t, s) in adjacent:
            assert abs(comp) <= 1e-12 * scale
            for (l, h), v in by_head.items():  # knock one head out: the edge loses exactly its loading
                mi, mh = knock_out(a, fr, g, s, heads=all_heads - {(l, h)})
                without = target_value(a, g, t, base_in, base_h) - target_value(a, g, t, mi, mh)
                assert edge - without == pytest.approx(v, abs=tol)
    # somewhere in the deep edges two heads compose (else the composition row says nothing)
    deep_comp = tab[(tab.carrier == "composition") & tab.target_node.isin([t for t, _ in deep])]
    assert deep_comp.loading.abs().max() > 1e-6 * scale


def test_qk_audit_prediction_is_the_replacement_models_row() -> None:
    """The QK audit's prediction: zeroing a feature moves the layer's input by the forward-mode derivative
    through the replacement model; it equals the by-value replay with that feature zeroed (float64; the model's
    float32 RMSNorm bounds the difference), and its score change at (query, key) equals the bilinear formula from
    the QK parts, (q − q(X))·(k − k(X))·scale − q·k·scale (rows stored in float32). The table: one row per head
    and side, disagreements first, the measured shift read from the original model."""
    from streetlamp.interventions.graphs.heads import cross_position_edges, head_loadings
    from streetlamp.interventions.graphs.qk import feature_qk
    from streetlamp.interventions.graphs.qk_audit import predicted_row, qk_audit, qk_heads
    from streetlamp.models.readout import pre_attn_norm, query_key

    a = llama64()
    ids = a.encode([TEXT]).input_ids[0]
    g = attribute(a, ids, batch_size=32, zero_bos=False)
    p = prune(g, 0.8, 0.98)
    tab = head_loadings(a, ids, g, cross_position_edges(g, p, 6), batch_size=32)
    heads = qk_heads(tab, 2)
    assert len(heads) == 2
    layer, head, query, key, _ = heads[0]
    fq = feature_qk(a, ids, layer, head, query, key, batch_size=32, zero_bos=False)
    nf = len(fq.features)
    i = int(np.argmax(np.abs(fq.q_side[:nf])))
    raw0, raw1, p0, p1 = predicted_row(a, ids, layer, head, query, fq.features[i], zero_bos=False)
    Q, K = torch.as_tensor(fq.q_parts), torch.as_tensor(fq.k_parts)
    q, k = Q.sum(0), K.sum(0)
    bilinear = float(((q - Q[i]) @ (k - K[i]) - q @ k) * fq.scale)
    mag = float((Q.norm(dim=1).sum() * K.norm(dim=1).sum()) * fq.scale)
    assert float(raw1[key] - raw0[key]) == pytest.approx(bilinear, abs=1e-6 * mag)
    assert float(raw0[key]) == pytest.approx(fq.score, abs=1e-9 * mag)
    # the by-value replay: the feature zeroed in the frozen replacement model, the layer's input recorded
    fr = Frozen(a, ids)
    resid: list = []
    hk = a.layer_modules[layer].register_forward_pre_hook(
        lambda m, args, kwargs: resid.append((args[0] if args else kwargs["hidden_states"])[0]), with_kwargs=True
    )
    try:
        fr.run()
        base = resid[-1]
        lab = {tuple(int(v) for v in g.features[j]): j for j in range(g.n_features)}
        knock_out(a, fr, g, lab[fq.features[i]])
        moved = resid[-1]
    finally:
        hk.remove()
    norm = pre_attn_norm(a, layer)
    scale, z0 = norm.scale(base), norm(base)
    z1 = norm.linear(moved, scale) + norm.beta(base.shape[-1])
    qq, kk = query_key(a, layer, z1, bias=True, full=z0)
    want = (kk[: query + 1, head] @ qq[query, head]) * fq.scale
    torch.testing.assert_close(raw1, want, rtol=0, atol=1e-6 * float(want.abs().max()))
    assert float(p1.sum()) == pytest.approx(1.0, abs=1e-12)
    table = qk_audit(a, g, heads)
    assert len(table) == 4 and set(table.side) == {"query", "key"}
    assert list(table["agree"]) == sorted(table["agree"])
    assert (table.clean_attention > 0).all() and table.predicted_attention_shift.abs().gt(0).all()


def test_partial_influences_equal_circuit_tracers_loop() -> None:
    """The influence ranking iterates on the rows' own square block and reads the wide rows once; it equals
    circuit-tracer's loop (prod <- prod[row_node] @ |rows|/rowsum over every column, summed) on a random DAG,
    float64 reference."""
    from streetlamp.interventions.graphs.attribution import partial_influences

    g = torch.Generator().manual_seed(3)
    n_cols, K, m_feat = 300, 4, 60
    level = torch.randint(0, 6, (n_cols,), generator=g)  # a node's layer: sources come from lower levels
    feats = torch.randperm(n_cols, generator=g)[:m_feat]
    row_node = torch.cat([torch.arange(K) + n_cols, feats])
    rows = torch.randn(K + m_feat, n_cols + K, generator=g, dtype=torch.float64)
    rows[:, n_cols:] = 0  # logits are nobody's source
    rows[K:, :n_cols] *= (level[None, :] < level[feats][:, None]).double()
    rows[:K, :n_cols] *= torch.rand(K, n_cols, generator=g) < 0.5
    logit_p = torch.tensor([0.5, 0.2, 0.2, 0.1], dtype=torch.float64)
    A = rows.abs() / rows.abs().sum(1, keepdim=True).clamp(min=1e-8)
    infl = torch.zeros(n_cols + K, dtype=torch.float64)
    prod = torch.zeros(n_cols + K, dtype=torch.float64)
    prod[n_cols:] = logit_p
    for _ in range(100):
        prod = prod[row_node] @ A
        if not prod.any():
            break
        infl += prod
    assert not prod.any() and infl[feats].abs().sum() > 0  # deep enough to test the iteration
    got = partial_influences(rows.float(), logit_p, row_node, rows.abs().sum(1).float(), n_cols)
    torch.testing.assert_close(got.double(), infl[:n_cols], rtol=1e-5, atol=1e-7 * float(infl.max()))


def test_rows_on_disk_give_the_same_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past --rows-memory-gb the rows buffer lives in a temporary file (written and read in row blocks): the
    graph, its visited features under a cap (five re-rankings of 8 rows each read the file) and every edge,
    is the in-memory one exactly; the file is gone afterwards."""
    import tempfile as tf
    from pathlib import Path

    from streetlamp.interventions.graphs import attribution as at

    monkeypatch.setattr(at, "QUEUE_BATCH", 8)
    a = llama64()
    ids = a.encode([TEXT]).input_ids[0]
    before = set(Path(tf.gettempdir()).glob("streetlamp-graph-rows-*"))
    mem = attribute(a, ids, batch_size=16, zero_bos=False, max_feature_nodes=40, update_interval=1)
    disk = attribute(a, ids, batch_size=16, zero_bos=False, max_feature_nodes=40, update_interval=1, rows_memory=0)
    assert disk.info["rows_on_disk"] and not mem.info["rows_on_disk"]
    assert set(Path(tf.gettempdir()).glob("streetlamp-graph-rows-*")) == before
    assert np.array_equal(disk.features, mem.features)
    assert torch.equal(disk.rows, mem.rows)


def test_row_store_blocks() -> None:
    """RowStore on disk: rows written at any offset read back exactly, in blocks of any size; untouched rows
    are zero."""
    from streetlamp.interventions.graphs.attribution import RowStore

    g = torch.Generator().manual_seed(0)
    want = torch.zeros(37, 11)
    store = RowStore(37, 11, in_memory=0)
    try:
        assert store.on_disk
        for start, m in ((0, 5), (9, 3), (20, 17)):
            block = torch.randn(m, 11, generator=g)
            store.write(start, block)
            want[start : start + m] = block
        assert torch.equal(store.read(0, 37), want)
        got = torch.cat([b for _, b in store.blocks(30, target_bytes=4 * 11 * 4)])  # 4 rows a block
        assert torch.equal(got, want[:30])
    finally:
        store.close()


def test_projected_decoder_columns_equal_the_padded_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past DECODER_MEMORY the feature columns come from the gradients projected on the whole decoder instead
    of the held written vectors: the same graph to float32 rounding of each product (float64 model here: to
    float64 rounding of a d-term dot product, relative to the row's largest entry)."""
    from streetlamp.interventions.graphs import attribution as at

    a = llama64()
    ids = a.encode([TEXT]).input_ids[0]
    held = attribute(a, ids, batch_size=16, zero_bos=False)
    monkeypatch.setattr(at, "DECODER_MEMORY", 0)
    proj = attribute(a, ids, batch_size=16, zero_bos=False)
    assert np.array_equal(held.features, proj.features)
    d = a.d_model
    scale = held.rows.abs().amax(1, keepdim=True).double()
    # stored in float32: two roundings of 2^-24 each, plus float64 rounding of the d-term sums (far below)
    assert ((proj.rows.double() - held.rows.double()).abs() <= 2 * 2.0**-24 * scale + d * 2.0**-52 * scale).all()
    assert (held.rows != 0).any()


def test_rows_at_some_columns_equal_the_full_rows() -> None:
    """Replacement.rows_at (head loadings' rows, only the edges' sources) equals the full rows at those columns:
    features, errors and tokens, for feature and logit targets (float64 model: to float64 rounding of a
    d-term dot product)."""
    from streetlamp.interventions.graphs.attribution import Replacement

    a = llama64()
    ids = a.encode([TEXT]).input_ids[0]
    g = attribute(a, ids, batch_size=16, zero_bos=False)
    rep = Replacement(a, ids, 4, False)
    targets = [g.logit_start, g.n_features - 1, g.n_features // 2, 3]
    nodes = [
        0,
        g.n_features // 3,
        g.n_features - 2,
        g.error_start + 1,
        g.token_start - 1,
        g.token_start,
        g.logit_start - 1,
    ]
    parts = [rep.target(g, t, b) for b, t in enumerate(targets)]
    full = rep.rows(parts, dtype=torch.float64)
    some = rep.rows_at([rep.target(g, t, b) for b, t in enumerate(targets)], g, nodes)
    want = full[:, [rep.column(g, s) for s in nodes]]
    assert want.abs().max() > 0
    torch.testing.assert_close(some, want, rtol=0, atol=a.d_model * 2.0**-52 * float(full.abs().max()))


def test_propagate_many_is_the_linear_solve() -> None:
    """The audit's predicted change when a source is zeroed, for many sources at once, equals the closed form
    δ = (I − M)⁻¹ d (d = −A[:, s] on the target rows, M[r, f] = A[r, f] / activation(f) for feature columns f),
    solved in float64, and the one-source function."""
    from streetlamp.interventions.graphs.audit import propagate, propagate_many

    a = llama64()
    ids = a.encode([TEXT]).input_ids[0]
    g = attribute(a, ids, batch_size=16, zero_bos=False)
    A = g.rows.double()
    nf, R = g.n_features, A.shape[0]
    sources = [0, nf // 2, nf - 1, g.error_start + 2, g.token_start + 1]
    got = propagate_many(g, sources, A)
    M = torch.zeros(R, R, dtype=torch.float64)
    M[:, :nf] = A[:, :nf] / torch.as_tensor(g.activations, dtype=torch.float64)
    want = torch.linalg.solve(torch.eye(R, dtype=torch.float64) - M, -A[:, sources])
    rn = g.row_nodes.numpy()
    scale = float(want.abs().max())
    assert scale > 0
    np.testing.assert_allclose(got[rn], want.numpy(), rtol=0, atol=1e-10 * scale)
    for j, s in enumerate(sources):
        np.testing.assert_allclose(propagate(g, s, A), got[:, j], rtol=0, atol=1e-12 * scale)  # matvec vs matmul
