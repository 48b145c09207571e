"""Circuit edge scores against independent code, float64 on tiny models.

``hand_forward`` below is a second, hand-written forward of tiny GPT-2 and tiny Llama (grouped-query:
4 heads, 2 key/value groups) straight from the weights, looping over the readers one by one: every
reader's input is the sum of its writers (each kept or ablated by the edge mask) plus an optional
extra term. It shares no code with the engine (``streetlamp.interventions.circuits``) beyond reading
the same weights. Against it, for **every edge** of the graph:

* EAP = autograd of the hand forward (every edge) and = the derivative ``d/dε m(x_r + ε Δ_u)`` at 0 by
  central float64 finite differences (a seeded sample of 12 edges per prompt, and the largest edge;
  tolerance from the Richardson estimate of their truncation error);
* exact edge patching = ``m(x_r + Δ_u) - m(clean)`` of the hand forward.

Hugging Face's Llama runs RMSNorm and the rotary tables in float32 even in a float64 model; the
``f64_llama`` fixture swaps both for float64 versions of the same formulas, so F64_TOL applies.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers.models.llama.modeling_llama as hf_llama

from streetlamp.errors import StreetlampError
from streetlamp.interventions import engine
from streetlamp.interventions.circuits import scores as S
from streetlamp.interventions.circuits.blocks import Blocks
from streetlamp.interventions.circuits.tasks import TaskPair, encode_pairs
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.tiny import tiny_model
from tests.conftest import F64_TOL

PAIRS = [
    TaskPair(
        "when mary and john went to the store , john gave a drink to",
        "when mary and john went to the store , mary gave a drink to",
        " mary",
        " john",
    ),
    TaskPair("the movie was good and the acting", "the film was bad and the acting", " good", " bad"),
]


@pytest.fixture
def f64_llama(monkeypatch: pytest.MonkeyPatch) -> None:
    def rms(self, x):  # the same formula as LlamaRMSNorm, without the float32 cast
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rot(self, x, position_ids):
        freqs = position_ids[..., None].double() * self.inv_freq.double()
        emb = torch.cat((freqs, freqs), -1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)

    monkeypatch.setattr(hf_llama.LlamaRMSNorm, "forward", rms)
    monkeypatch.setattr(hf_llama.LlamaRotaryEmbedding, "forward", rot)


def make(family: str, seed: int = 1) -> tuple[ModelAdapter, Blocks]:
    model, tok = tiny_model(family, seed=seed, attn_implementation="eager")
    a = ModelAdapter(model.double(), tok, f"tiny-{family}")
    return a, Blocks(a)


# -- the hand-written forward -------------------------------------------------------------------------
def hand_names(fam: str, L: int, H: int, KV: int) -> tuple[list[str], list[str]]:
    writers, readers = ["embed"], []
    G = H // KV
    for l in range(L):
        writers += [f"L{l}.H{h}" for h in range(H)] + [f"L{l}.MLP"]
        readers += [f"L{l}.H{h}.q" for h in range(H)]
        for i in "kv":
            readers += [f"L{l}.{'H' if G == 1 else 'KV'}{g}.{i}" for g in range(KV)]
        readers.append(f"L{l}.MLP.mlp")
    return writers, readers + ["logits.logits"]


def hand_forward(a: ModelAdapter, ids: list[int], mask=None, ablated=None, extra=None):
    """(metric-ready logits [vocab], writer outputs {name: [s, d]}) of one unpadded prompt.

    ``mask``: {(writer, reader): 0/1} (missing = 1); ``ablated``: {writer: [s, d]}; ``extra``: {reader: [s, d]}."""
    m, fam = a.hf_model, a.family.name
    L, H, KV, d = a.n_layers, a.n_heads, a.n_kv_heads, a.d_model
    dh, G, s = d // H, H // KV, len(ids)
    mask, ablated, extra = mask or {}, ablated or {}, extra or {}
    t = torch.tensor(ids)
    z: dict[str, torch.Tensor] = {}
    order: list[str] = []
    const = torch.zeros(s, d, dtype=torch.float64)

    def read(name: str, upto: list[str]) -> torch.Tensor:
        x = const.clone()
        for u in upto:
            keep = mask.get((u, name), 1)
            x = x + (z[u] if keep else ablated[u])
        return x + extra.get(name, 0)

    def ln(x, mod):
        if fam == "gpt2":
            mu = x.mean(-1, keepdim=True)
            return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + mod.eps) * mod.weight + mod.bias
        return x / torch.sqrt((x**2).mean(-1, keepdim=True) + mod.variance_epsilon) * mod.weight

    if fam == "gpt2":
        base = m.transformer
        z["embed"] = base.wte.weight[t] + base.wpe.weight[:s]
    else:
        base = m.model
        z["embed"] = base.embed_tokens.weight[t]
        inv = base.rotary_emb.inv_freq.double()
        ang = torch.arange(s, dtype=torch.float64)[:, None] * inv[None]
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

        def rope(x):
            h = x.shape[-1] // 2
            return x * cos + torch.cat([-x[:, h:], x[:, :h]], -1) * sin

    order.append("embed")
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    for l in range(L):
        layer = base.h[l] if fam == "gpt2" else base.layers[l]
        before = list(order)
        heads = []
        for h in range(H):
            g = h // G
            kname = f"L{l}.{'H' if G == 1 else 'KV'}{g}"
            xq, xk, xv = (read(n, before) for n in (f"L{l}.H{h}.q", f"{kname}.k", f"{kname}.v"))
            if fam == "gpt2":
                w, b = layer.attn.c_attn.weight, layer.attn.c_attn.bias
                cols = [slice(i * d + h * dh, i * d + (h + 1) * dh) for i in range(3)]
                q, k, v = (ln(x, layer.ln_1) @ w[:, c] + b[c] for x, c in zip((xq, xk, xv), cols))
                wo = layer.attn.c_proj.weight[h * dh : (h + 1) * dh]
            else:
                at = layer.self_attn
                q = rope(ln(xq, layer.input_layernorm) @ at.q_proj.weight[h * dh : (h + 1) * dh].T)
                k = rope(ln(xk, layer.input_layernorm) @ at.k_proj.weight[g * dh : (g + 1) * dh].T)
                v = ln(xv, layer.input_layernorm) @ at.v_proj.weight[g * dh : (g + 1) * dh].T
                wo = at.o_proj.weight[:, h * dh : (h + 1) * dh].T
            sc = (q @ k.T) / math.sqrt(dh)
            p = torch.softmax(sc.masked_fill(~causal, -math.inf), -1)
            heads.append((p @ v) @ wo)
        for h in range(H):
            z[f"L{l}.H{h}"] = heads[h]
            order.append(f"L{l}.H{h}")
        xm = read(f"L{l}.MLP.mlp", list(order))
        if fam == "gpt2":
            const = const + layer.attn.c_proj.bias
            xm = xm + layer.attn.c_proj.bias
            hdn = ln(xm, layer.ln_2) @ layer.mlp.c_fc.weight + layer.mlp.c_fc.bias
            act = 0.5 * hdn * (1 + torch.tanh(math.sqrt(2 / math.pi) * (hdn + 0.044715 * hdn**3)))
            z[f"L{l}.MLP"] = act @ layer.mlp.c_proj.weight + layer.mlp.c_proj.bias
        else:
            n = ln(xm, layer.post_attention_layernorm)
            gate = n @ layer.mlp.gate_proj.weight.T
            z[f"L{l}.MLP"] = (
                gate * torch.sigmoid(gate) * (n @ layer.mlp.up_proj.weight.T)
            ) @ layer.mlp.down_proj.weight.T
        order.append(f"L{l}.MLP")
    x = read("logits.logits", list(order))[-1]
    x = ln(x, base.ln_f if fam == "gpt2" else base.norm)
    return x @ m.lm_head.weight.T, z


def hand_metric(a, pairs, i, **kw) -> float:
    ids = pairs.clean.rows()[i]
    with torch.no_grad():
        lg, _ = hand_forward(a, ids, **kw)
    return float(lg[pairs.answer[i]] - lg[pairs.wrong[i]])


def corrupt_writers(a, pairs, i):
    return hand_forward(a, pairs.corrupt.rows()[i])[1]


def names_of(b: Blocks) -> tuple[list[str], list[str]]:
    g = b.graph
    return list(g.writers), [f"{r.node}.{r.input}" for r in g.readers]


# -- tests ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_hand_forward_is_the_model(family: str, f64_llama: None) -> None:
    """The hand forward reproduces the model (so it can judge the engine), and the engine's graph names
    are the hand forward's (k/v readers per group under grouped-query attention)."""
    a, b = make(family)
    pairs = encode_pairs(a, PAIRS)
    logits = a.forward(pairs.clean).logits
    for i in range(len(pairs)):
        lg, _ = hand_forward(a, pairs.clean.rows()[i])
        assert logits[i].abs().max() > 1e-2
        torch.testing.assert_close(lg, logits[i], rtol=0, atol=F64_TOL)
    assert names_of(b) == hand_names(family, a.n_layers, a.n_heads, a.n_kv_heads)
    if family == "llama":
        assert a.n_kv_heads < a.n_heads and "L0.KV1.k" in names_of(b)[1]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_eap_every_edge_matches_finite_differences_and_autograd(family: str, f64_llama: None) -> None:
    a, b = make(family)
    pairs = encode_pairs(a, PAIRS)
    eap = S.eap(b, pairs).per_prompt
    W, R = names_of(b)
    r_idx, w_idx = b.graph.edge_index()
    assert len(r_idx) == b.graph.n_edges > 50
    for i in range(len(pairs)):
        ids = pairs.clean.rows()[i]
        zc = hand_forward(a, ids)[1]
        zx = corrupt_writers(a, pairs, i)
        # autograd of the hand forward: one backward w.r.t. a zero extra term on every reader
        probe = {r: torch.zeros(len(ids), a.d_model, dtype=torch.float64, requires_grad=True) for r in R}
        lg, _ = hand_forward(a, ids, extra=probe)
        grads = dict(
            zip(
                R,
                torch.autograd.grad(lg[pairs.answer[i]] - lg[pairs.wrong[i]], list(probe.values()), allow_unused=True),
            )
        )
        big = 0.0
        for r, w in zip(r_idx, w_idx):
            delta = (zx[W[w]] - zc[W[w]]).detach()
            g = grads[R[r]]
            ag = float((delta * g).sum()) if g is not None else 0.0
            got = float(eap[i, r, w])
            assert abs(got - ag) <= F64_TOL * max(1.0, abs(ag)), (W[w], R[r])
            big = max(big, abs(got))
        assert big > 1e-3  # the comparisons are of values far above the tolerance
        # finite differences on a sample of edges (every edge: 2 x 3 forwards each; the sample is seeded)
        pick = np.random.default_rng(i).choice(len(r_idx), size=12, replace=False)
        for e in pick:
            r, w = R[r_idx[e]], W[w_idx[e]]
            delta = (zx[w] - zc[w]).detach()

            def f(eps: float) -> float:
                return hand_metric(a, pairs, i, extra={r: eps * delta})

            fd = lambda h: (f(h) - f(-h)) / (2 * h)  # noqa: E731
            d1, d2 = fd(1e-3), fd(5e-4)
            tol = 4 * abs(d1 - d2) + 1e-10  # Richardson: the h-error of d2 is about |d1 - d2| / 3
            assert abs(float(eap[i, r_idx[e], w_idx[e]]) - d2) <= tol, (w, r)


def test_eap_finite_differences_tolerance_is_tight_where_it_matters(f64_llama: None) -> None:
    """The largest-scored edge's finite-difference check has a tolerance far below its value."""
    a, b = make("llama")
    pairs = encode_pairs(a, PAIRS[:1])
    eap = S.eap(b, pairs).per_prompt[0]
    W, R = names_of(b)
    flat = torch.nan_to_num(eap.abs()).argmax()
    r, w = divmod(int(flat), eap.shape[1])
    zc, zx = hand_forward(a, pairs.clean.rows()[0])[1], corrupt_writers(a, pairs, 0)
    delta = (zx[W[w]] - zc[W[w]]).detach()
    f = lambda eps: hand_metric(a, pairs, 0, extra={R[r]: eps * delta})  # noqa: E731
    d1, d2 = (f(1e-3) - f(-1e-3)) / 2e-3, (f(5e-4) - f(-5e-4)) / 1e-3
    tol = 4 * abs(d1 - d2) + 1e-10
    assert abs(float(eap[r, w]) - d2) <= tol < 1e-3 * abs(d2)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_exact_patching_every_edge_matches_the_hand_forward(family: str, f64_llama: None) -> None:
    a, b = make(family)
    pairs = encode_pairs(a, PAIRS)
    ex = S.exact(b, pairs, batch_size=40).per_prompt
    W, R = names_of(b)
    r_idx, w_idx = b.graph.edge_index()
    for i in range(len(pairs)):
        zc, zx = hand_forward(a, pairs.clean.rows()[i])[1], corrupt_writers(a, pairs, i)
        base = hand_metric(a, pairs, i)
        big = 0.0
        for r, w in zip(r_idx, w_idx):
            want = hand_metric(a, pairs, i, extra={R[r]: (zx[W[w]] - zc[W[w]]).detach()}) - base
            assert abs(float(ex[i, r, w]) - want) <= F64_TOL * max(1.0, abs(want)), (W[w], R[r])
            big = max(big, abs(want))
        assert big > 1e-3


def test_eap_ig_one_step_is_eap_and_steps_match_a_hand_riemann_sum() -> None:
    a, b = make("gpt2")
    pairs = encode_pairs(a, PAIRS)
    e = S.eap(b, pairs).per_prompt
    v = b.graph.valid()
    for mode in ("inputs", "activations"):
        one = S.eap_ig(b, pairs, steps=1, mode=mode).per_prompt
        torch.testing.assert_close(one[:, v], e[:, v], rtol=0, atol=F64_TOL)
    assert e[:, v].abs().max() > 1e-3
    # inputs, 3 steps: (z̃_u - z_u) · mean_k ∂m/∂x_r at embeddings ẽ + (k/3)(e - ẽ), by the hand forward
    ig = S.eap_ig(b, pairs, steps=3, mode="inputs").per_prompt
    W, R = names_of(b)
    r_idx, w_idx = b.graph.edge_index()
    i = 0
    ids = pairs.clean.rows()[i]
    zc, zx = hand_forward(a, ids)[1], corrupt_writers(a, pairs, i)
    acc = {r: 0.0 for r in R}
    for k in (1, 2, 3):
        emb = (zx["embed"] + k / 3 * (zc["embed"] - zx["embed"])).detach()
        probe = {r: torch.zeros(len(ids), a.d_model, dtype=torch.float64, requires_grad=True) for r in R}
        # the embeddings enter every reader: feed the interpolated value through the ablated path
        mask = {("embed", r): 0 for r in R}
        lg, _ = hand_forward(a, ids, mask=mask, ablated={"embed": emb}, extra=probe)
        gs = torch.autograd.grad(lg[pairs.answer[i]] - lg[pairs.wrong[i]], list(probe.values()), allow_unused=True)
        for r, g in zip(R, gs):
            acc[r] = acc[r] + (g if g is not None else 0) / 3
    diff = 0.0
    for r, w in zip(r_idx, w_idx):
        want = float(((zx[W[w]] - zc[W[w]]).detach() * acc[R[r]]).sum())
        assert abs(float(ig[i, r, w]) - want) <= F64_TOL * max(1.0, abs(want))
        diff = max(diff, abs(want - float(e[i, r, w])))
    assert diff > 1e4 * F64_TOL  # three steps differ from one: the check is not EAP again


def test_node_scores_and_exact_node_patching_agree_with_the_intervention_engine() -> None:
    """First-order node scores are the out-edge sums; exact node patching of a head equals patching that
    head's ``attn.head_out`` with the corrupted run's through the intervention engine (another route)."""
    a, b = make("gpt2")
    pairs = encode_pairs(a, PAIRS)
    e = S.eap(b, pairs)
    nodes = S.node_scores(e)
    terms = torch.nan_to_num(e.per_prompt[:, :, 3])
    # the same terms summed in another order: equal to the float rounding of a sum of |terms| (any CPU's kernels)
    bound = terms.shape[1] * torch.finfo(terms.dtype).eps * terms.abs().sum(1)
    assert ((nodes[:, 3] - terms.sum(1)).abs() <= bound).all() and bool((terms.abs().sum(1) > 0).all())
    ex = S.exact_nodes(b, pairs)
    site = "layers.1.attn.head_out"
    corrupt = a.forward(pairs.corrupt, record=[site]).cache[site]
    clean = a.forward(pairs.clean).logits
    for h in range(a.n_heads):
        fwd = engine.run(a, pairs.clean, [engine.Intervention(site, engine.patch(corrupt), head=h)])
        rows = torch.arange(len(pairs))
        want = (fwd.logits - clean)[rows, pairs.answer] - (fwd.logits - clean)[rows, pairs.wrong]
        w = b.graph.writers.index(f"L1.H{h}")
        torch.testing.assert_close(ex[:, w], want, rtol=0, atol=F64_TOL)
    assert ex.abs().max() > 1e-3


def test_audit_reports_error_and_misranking_against_exact() -> None:
    a, b = make("gpt2")
    pairs = encode_pairs(a, PAIRS)
    e = S.eap(b, pairs)
    rep = S.audit(b, pairs, e, n_edges=15, seed=3)
    ex = S.exact(b, pairs).mean
    v = b.graph.valid()
    assert len(rep["edges"]) == 15
    names = b.graph.edge_names()
    r_idx, w_idx = b.graph.edge_index()
    for (src, tgt, inp), x, est in zip(rep["edges"], rep["exact"], rep["estimate"]):
        j = names.index((src, tgt, inp))
        assert abs(x - float(ex[r_idx[j], w_idx[j]])) <= F64_TOL
        assert abs(est - float(e.mean[r_idx[j], w_idx[j]])) <= F64_TOL
    err = np.abs(rep["exact"] - rep["estimate"])
    assert rep["max_abs_error"] == pytest.approx(err.max()) and rep["mean_abs_error"] == pytest.approx(err.mean())
    assert 0 <= rep["misranked_share"] <= 1 and ex[v].abs().max() > 1e-3


def test_bad_inputs_raise_one_line() -> None:
    a, b = make("gpt2")
    with pytest.raises(StreetlampError, match="same token length"):
        encode_pairs(a, [TaskPair("the movie was good", "the movie was very good", " good", " bad")])
    with pytest.raises(StreetlampError, match="one token"):
        encode_pairs(a, [TaskPair("the movie was good", "the film was bad", " good bad", " bad")])
    pairs = encode_pairs(a, PAIRS)
    with pytest.raises(StreetlampError, match="steps"):
        S.eap_ig(b, pairs, steps=0)
    with pytest.raises(StreetlampError, match="ablation"):
        S.eap(b, pairs, ablation="resample")
    with pytest.raises(StreetlampError, match="metric"):
        S.eap(b, pairs, metric="kl")
    bert, tok = tiny_model("bert")
    with pytest.raises(StreetlampError, match="post-LN"):
        Blocks(ModelAdapter(bert, tok, "tiny-bert"))


@pytest.mark.parametrize("family", ["modernbert", "qwen3", "phi3"])
def test_eap_is_the_mask_derivative_on_the_other_families(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the encoder (ModernBERT: bidirectional, local layers, [CLS] readout), Qwen3 (per-head q/k norms)
    and Phi-3 (fused qkv, partial RoPE): EAP(u -> r) = -d m / d M_ru at M = 1, by float64 central
    differences of the circuit forward with that one mask entry moved (the forward itself is the model:
    test_circuit_forward). RMSNorm is swapped for its float64 formula (Hugging Face casts to float32)."""
    import importlib

    from streetlamp.interventions.circuits.forward import run_graph

    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    norm = getattr(mod, f"{type(tiny_model(family)[0]).__name__.split('For')[0].replace('Model', '')}RMSNorm", None)
    if norm is not None:
        monkeypatch.setattr(
            norm,
            "forward",
            lambda self, x: self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)),
        )
    a, b = make(family)
    pairs = encode_pairs(
        a, PAIRS if a.kind == "causal_lm" else [TaskPair(p.clean, p.corrupt, "pos", "neg") for p in PAIRS]
    )
    e = S.eap(b, pairs).per_prompt
    ab = S.ablation_values(b, pairs, "patch")
    g = b.graph
    r_idx, w_idx = g.edge_index()
    pick = np.random.default_rng(0).choice(len(r_idx), size=10, replace=False)
    top = int(torch.nan_to_num(e.abs().sum(0)).flatten().argmax())
    checked = 0.0
    for r, w in [(r_idx[j], w_idx[j]) for j in pick] + [divmod(top, g.n_writers)]:

        def m(eps: float) -> np.ndarray:
            mask = g.valid().double()[None].clone()
            mask[0, r, w] = 1 - eps
            with torch.no_grad():
                run = run_graph(b, pairs.clean.input_ids, pairs.clean.attention_mask, ablated=ab, mask=mask)
                return S.metric_values(run.logits, pairs.answer, pairs.wrong, "logit_diff").numpy()

        d1 = (m(1e-3) - m(-1e-3)) / 2e-3
        d2 = (m(5e-4) - m(-5e-4)) / 1e-3
        tol = 4 * np.abs(d1 - d2) + 1e-10
        assert np.all(np.abs(e[:, r, w].numpy() - d2) <= tol), (g.writers[w], g.readers[r])
        checked = max(checked, float(np.abs(d2).max() / max(tol.max(), 1e-300)))
    assert checked > 1e3  # the largest edge's value is far above its finite-difference tolerance


def test_exact_refuses_pairs_that_are_not_edges() -> None:
    a, b = make("gpt2")
    pairs = encode_pairs(a, PAIRS[:1])
    # reader 0 (L0.H0's query) reads only the embeddings: writer 1 (L0.H0 itself) is no edge of it
    with pytest.raises(StreetlampError, match="not edges"):
        S.exact(b, pairs, edges=(np.array([0]), np.array([1])))
