"""Context-mixing methods (decompositions of the attention block): what each token contributes
once the values, W_O, the residual and the LayerNorm are counted, not just the attention weight.

* ``norm`` -- Kobayashi, Kuribayashi, Yokoi & Inui, EMNLP 2020, "Attention is Not Only a Weight".
* ``alti`` -- Ferrando, Gállego & Costa-jussà, EMNLP 2022, "Measuring the Mixing of Contextual
  Information in the Transformer" (Aggregation of Layer-wise Token-to-token Interactions).
* ``value_zeroing`` -- Mohebbi, Zuidema, Chrupała & Alishahi, EACL 2023, "Quantifying Context
  Mixing in Transformers".

Notation: ``A[h,i,j]`` attention of query i on key j in head h; ``v[j,h]`` the value vector the
model used (site ``layers.{l}.attn.v``: includes b_V, and for pre-LN families the pre-attention
LayerNorm/RMSNorm of x_j); ``f_h(x_j) = v[j,h] W_O,h`` (``[d_model]``, without b_O, which is no
token's). METHODS.md writes ``‖A[i,j] f(x_j)‖`` with one head; the papers sum heads inside the
norm, ``‖Σ_h A[h,i,j] f_h(x_j)‖`` -- the paper wins, as here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from tqdm import tqdm  # text bars everywhere (tqdm.auto warns in notebooks without ipywidgets)

from ..batching import chunks, group_by_budget
from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter, Target, at_least_float32
from ..models.attention_block import output_weights, placement, post_norm, sandwich_norm
from ..results import Explanation
from .base import Method

_TINY = 1e-12


def rollout(mats: torch.Tensor) -> torch.Tensor:
    """``R = C_L · … · C_1`` for per-layer row-stochastic ``mats`` ``[layer, query, key]``.

    No identity is added: ALTI's and value zeroing's matrices already contain the residual
    (both papers aggregate with ``res=False``)."""
    r = mats[0]
    for m in mats[1:]:
        r = m @ r
    return r


def normalise_rows(c: torch.Tensor) -> torch.Tensor:
    return c / c.sum(-1, keepdim=True).clamp_min(_TINY)


def transformed_values(v: torch.Tensor, w_o: torch.Tensor) -> torch.Tensor:
    """``f_h(x_j) = v[j,h] W_O,h``: ``v`` ``[pos, head, d_head]``, ``w_o`` ``[head, d_head, d_model]``
    -> ``[pos, head, d_model]``."""
    v = at_least_float32(v)
    return torch.einsum("shk,hkd->shd", v, w_o.to(v.dtype))


def record_layers(adapter: ModelAdapter, inputs: Inputs, sites: tuple[str, ...]) -> tuple[torch.Tensor, dict]:
    fwd = adapter.forward(inputs, record=[f"layers.*.{s}" for s in sites])
    return fwd.logits, fwd.cache


def _groups(adapter: ModelAdapter, inputs: Inputs, batch_size: int | None) -> list[list[int]]:
    return group_by_budget(inputs.lengths, batch_size, adapter.device)


# ---------------------------------------------------------------------------------------- norm
def norm_matrix(a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Kobayashi's norms for one layer and text.

    ``a`` ``[head, query, key]``, ``g = f_h(x_j)`` ``[key, head, d_model]``. Returns
    ``‖Σ_h A[h,i,j] f_h(x_j)‖₂`` ``[query, key]`` and per head ``A[h,i,j] ‖f_h(x_j)‖₂``
    ``[head, query, key]``. The sum over heads is done through the Gram matrix
    ``<f_h(x_j), f_h'(x_j)>`` so memory stays ``O(S²H)``, not ``O(S² d_model)``."""
    gram = torch.einsum("shd,sgd->shg", g, g)
    sq = torch.einsum("hij,jhg,gij->ij", a, gram, a)
    heads = a * gram.diagonal(dim1=1, dim2=2).clamp_min(0).sqrt().t()[:, None, :]
    return sq.clamp_min(0).sqrt(), heads


@dataclass
class Norm(Method):
    """Norm-based analysis (Kobayashi et al., EMNLP 2020).

    In layer l, the contribution of token j to token i is ``‖Σ_h A[h,i,j] f_h(x_j)‖₂`` with
    ``f_h(x) = (x W_V,h + b_V,h) W_O,h``: the weight times the transformed value, summed over heads
    inside the norm (the paper's ``‖Σ αf(x)‖``; METHODS.md's one-head formula is the per-head view,
    kept as ``norm_heads`` when ``per_head``). For pre-LN families x is the pre-attention
    LayerNorm/RMSNorm of the residual stream, i.e. the input the attention really sees.

    ``aggregate``: ``last`` (default; the paper's own quantity): ``tokens`` is the explained
    position's row of the last layer's matrix. ``rollout``: each layer's matrix is row-normalised,
    mixed with the residual as in rollout (``0.5·N + 0.5·I``, rows renormalised) and multiplied
    across layers (an extension, not in the paper); ``tokens`` is then that product's row.
    """

    aggregate: Literal["last", "rollout"] = "last"
    per_head: bool = False

    name = "norm"
    family = "decomposition"
    description = "Kobayashi 2020: ‖Σ_h A·f_h(x_j)‖, attention weight times transformed value"

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        if self.aggregate not in ("last", "rollout"):
            raise StreetlampError(f"norm: aggregate must be 'last' or 'rollout', not {self.aggregate!r}")

    def attribute(
        self, adapter: ModelAdapter, inputs: Inputs, *, target: Target, batch_size: int | None = None, seed: int = 0
    ) -> list[Explanation]:
        self.check(adapter)
        out: dict[int, Explanation] = {}
        w_o = [output_weights(adapter, l)[0].to(adapter.device) for l in range(adapter.n_layers)]
        for group in _groups(adapter, inputs, batch_size):
            sub = inputs.select(group)
            logits, cache = record_layers(adapter, sub, ("attn.v", "attn.pattern"))
            index = adapter.resolve(sub, target, logits)
            for k, b in enumerate(group):
                n = inputs.lengths[b]
                mats, heads = [], []
                for l in range(adapter.n_layers):
                    a = at_least_float32(cache[f"layers.{l}.attn.pattern"][k, :, :n, :n])
                    g = transformed_values(cache[f"layers.{l}.attn.v"][k, :n], w_o[l])
                    m, h = norm_matrix(a, g)
                    mats.append(m)
                    heads.append(h)
                norm = torch.stack(mats)
                pos = adapter.explained_position(n)
                if self.aggregate == "last":
                    tokens = norm[-1, pos]
                    how = f"last layer, row of position {pos} ({inputs.labels[b][pos]})"
                else:
                    allowed = at_least_float32(cache["allowed"][k, :n, :n])
                    eye = torch.eye(n, device=norm.device)
                    mixed = normalise_rows(0.5 * normalise_rows(norm) + 0.5 * eye * allowed)
                    tokens = rollout(mixed)[pos]
                    how = f"rollout of row-normalised norms (0.5·N + 0.5·I), row of position {pos}"
                arrays = {
                    "tokens": tokens.cpu().numpy().astype(np.float32),
                    "norm": norm.cpu().numpy().astype(np.float32),
                }
                axes = {"tokens": ["token"], "norm": ["layer", "query", "key"]}
                meaning = {
                    "tokens": f"‖Σ_h A·f_h(x_j)‖, {how}",
                    "norm": "‖Σ_h A[h,i,j] (x_j W_V,h + b_V,h) W_O,h‖₂ per layer",
                }
                if self.per_head:
                    arrays["norm_heads"] = torch.stack(heads).cpu().numpy().astype(np.float32)
                    axes["norm_heads"] = ["layer", "head", "query", "key"]
                    meaning["norm_heads"] = "A[h,i,j] ‖(x_j W_V,h + b_V,h) W_O,h‖₂ per layer and head"
                out[b] = self.explanation(
                    adapter,
                    sub,
                    k,
                    int(index[k]),
                    target,
                    arrays,
                    axes,
                    meaning,
                    position=pos,
                    aggregate=self.aggregate,
                )
        return [out[b] for b in range(len(inputs))]


# ---------------------------------------------------------------------------------------- ALTI
@dataclass
class AltiLayer:
    """One layer's exact decomposition for one text: ``y[i] = Σ_j T[i,j] + bias[i]``."""

    t: torch.Tensor | None  # [query, key, d_model] (None when only contributions were asked for)
    bias: torch.Tensor  # [query, d_model]
    y: torch.Tensor  # [query, d_model]: the attention block's real output
    contributions: torch.Tensor  # [query, key], rows normalised


def l1_contributions(t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁)`` (not yet normalised); ``t`` ``[i, j, d]``, ``y`` ``[i, d]``."""
    return (y.abs().sum(-1)[:, None] - (y[:, None, :] - t).abs().sum(-1)).clamp_min(0)


def alti_layer(
    adapter: ModelAdapter,
    cache: dict,
    k: int,
    n: int,
    layer: int,
    keep_vectors: bool = False,
    chunk_elems: int = 1 << 24,
) -> AltiLayer:
    """ALTI's decomposition of layer ``layer`` for row ``k`` (``n`` real tokens) of a recorded batch.

    ``T̂_i(x_j) = Σ_h A[h,i,j] f_h(x_j) + [i = j] x_i`` (attention with values, W_O and the
    residual), ``Σ_j T̂_i(x_j) + b_O = x_i + Attn(x)_i``.

    * post-LN (BERT, RoBERTa, DistilBERT; the paper): ``y_i = LN(x_i + Attn(x)_i)``; LayerNorm is
      linear given the token's own standard deviation ``σ_i = sqrt(Var(x_i + Attn_i) + eps)``:
      ``L_i(u) = γ ⊙ (u − mean(u)) / σ_i``, so ``T_i(x_j) = L_i(T̂_i(x_j))`` and
      ``y_i = Σ_j T_i(x_j) + L_i(b_O) + β`` exactly. (The authors' code takes the unbiased std of
      ``z + eps``; we use LayerNorm's own σ so the decomposition is exact.)
    * pre-LN (GPT-2 LayerNorm, Llama RMSNorm; adaptation, as in Ferrando et al. 2023 for decoder
      LMs): no norm follows the sum, so ``y_i = x_i + Attn(LN(x))_i`` (the residual stream after
      attention), ``T_i = T̂_i`` and ``bias = b_O``; the pre-attention norm acts on each x_j alone,
      so it stays inside ``f_h`` (exactly as b_V does in the paper), no linearisation needed.
    * sandwich (Gemma 2/3; adaptation): ``y_i = x_i + N(Attn(RMSNorm(x))_i)`` with a second RMSNorm
      ``N(u) = gain ⊙ u / rms(u)`` on the attention output; like post-LN, N is linear given the
      query's own ``rms_i``, so ``T_i(x_j) = gain ⊙ Σ_h A[h,i,j] f_h(x_j) / rms_i + [i = j] x_i`` and
      ``bias = gain ⊙ b_O / rms_i``, exactly.
    """
    place = placement(adapter)
    w_o, b_o = output_weights(adapter, layer)
    dev = adapter.device
    w_o = w_o.to(dev)
    a = at_least_float32(cache[f"layers.{layer}.attn.pattern"][k, :, :n, :n])
    g = transformed_values(cache[f"layers.{layer}.attn.v"][k, :n], w_o)  # [key, head, d]
    x = at_least_float32(cache[f"layers.{layer}.resid_pre"][k, :n])
    attn_out = at_least_float32(cache[f"layers.{layer}.attn.out"][k, :n])
    z = x + attn_out
    bias = (b_o.to(dev) if b_o is not None else torch.zeros_like(x[0])).expand_as(x)
    if place.placement == "post":
        gamma, beta, eps = post_norm(adapter, layer)
        gamma, beta = gamma.to(dev), beta.to(dev)
        sigma = (z.var(-1, unbiased=False) + eps).sqrt()[:, None]  # [query, 1]

        def lin(u: torch.Tensor) -> torch.Tensor:  # γ ⊙ (u − mean u), σ applied per query below
            return (u - u.mean(-1, keepdim=True)) * gamma

        y = torch.nn.functional.layer_norm(z, (z.shape[-1],), gamma, beta, eps)
        g, x_hat = lin(g), lin(x)
        bias = lin(bias) / sigma + beta
    elif place.placement == "sandwich":
        # y_i = x_i + N(o_i), N(u) = gain ⊙ u / rms(u): linear given the query's own
        # rms_i = sqrt(mean(o_i²) + eps), so the attention terms are scaled by gain / rms_i while the
        # residual x_i is not (it bypasses the norm); o_i = Σ_j Σ_h A f_h(x_j) + b_O
        gain, eps = sandwich_norm(adapter, layer)
        gain = gain.to(dev)
        rms = (attn_out.pow(2).mean(-1) + eps).sqrt()[:, None]  # [query, 1]
        y = x + attn_out * gain / rms
        g = g * gain
        bias = bias * gain / rms
        sigma = torch.ones(n, 1, device=dev)
        scale = rms
        x_hat = x
    else:
        sigma = torch.ones(n, 1, device=dev)
        y, x_hat = z, x
    if place.placement != "sandwich":
        scale = torch.ones(n, 1, device=dev)
    d = g.shape[-1]
    step = max(1, chunk_elems // max(1, n * d))
    contrib, ts = [], []
    for s in range(0, n, step):
        rows = slice(s, min(n, s + step))
        t = torch.einsum("hij,jhd->ijd", a[:, rows], g) / scale[rows, None]
        idx = torch.arange(rows.start, rows.stop, device=dev)
        t[idx - rows.start, idx] += x_hat[idx]
        t = t / sigma[rows, None]
        contrib.append(l1_contributions(t, y[rows]))
        if keep_vectors:
            ts.append(t)
    c = normalise_rows(torch.cat(contrib))
    return AltiLayer(torch.cat(ts) if keep_vectors else None, bias, y, c)


@dataclass
class Alti(Method):
    """ALTI (Ferrando, Gállego & Costa-jussà, EMNLP 2022).

    Per layer, the attention block output ``y_i`` is decomposed exactly into one vector per input
    token, ``T_i(x_j)`` (values, W_O, residual and the linearised LayerNorm; see
    :func:`alti_layer`), plus bias terms. The contribution of j to i is the L1 proximity
    ``c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁)``, rows normalised to sum to 1. Layers are
    aggregated with rollout without an added identity (the residual is already in ``T_i(x_i)``):
    ``R = C_L · … · C_1``. ``tokens`` is the explained position's row of ``R``.
    The FFN is not decomposed (the paper's choice: it does not mix tokens).
    Post-LN families follow the paper exactly; pre-LN families (GPT-2, Llama) use the documented
    adaptation in :func:`alti_layer`.
    """

    name = "alti"
    family = "decomposition"
    description = "Ferrando 2022: L1 token-to-token contributions incl. values, residual, LayerNorm; rollout"

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        placement(adapter)

    def attribute(
        self, adapter: ModelAdapter, inputs: Inputs, *, target: Target, batch_size: int | None = None, seed: int = 0
    ) -> list[Explanation]:
        self.check(adapter)
        out: dict[int, Explanation] = {}
        for group in _groups(adapter, inputs, batch_size):
            sub = inputs.select(group)
            logits, cache = record_layers(adapter, sub, ("attn.v", "attn.pattern", "resid_pre", "attn.out"))
            index = adapter.resolve(sub, target, logits)
            for k, b in enumerate(group):
                n = inputs.lengths[b]
                c = torch.stack([alti_layer(adapter, cache, k, n, l).contributions for l in range(adapter.n_layers)])
                r = rollout(c)
                pos = adapter.explained_position(n)
                out[b] = self.explanation(
                    adapter,
                    sub,
                    k,
                    int(index[k]),
                    target,
                    arrays={
                        "tokens": r[pos].cpu().numpy().astype(np.float32),
                        "matrix": r.cpu().numpy().astype(np.float32),
                        "contributions": c.cpu().numpy().astype(np.float32),
                    },
                    axes={"tokens": ["token"], "matrix": ["query", "key"], "contributions": ["layer", "query", "key"]},
                    meaning={
                        "tokens": f"ALTI rollout, row of position {pos} ({inputs.labels[b][pos]})",
                        "matrix": "ALTI rollout R = C_L…C_1: share of output i from input token j",
                        "contributions": "per-layer normalised max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁)",
                    },
                    position=pos,
                    norm_placement=placement(adapter).placement,
                )
        return [out[b] for b in range(len(inputs))]


# ------------------------------------------------------------------------------- value zeroing
class _Stop(Exception):
    """Raised from a site edit to end a forward pass once the needed layer has run."""


def zeroed_outputs(adapter: ModelAdapter, inputs: Inputs, b: int, layer: int, zero: list[int]) -> torch.Tensor:
    """``layers.{layer}.resid_post`` ``[len(zero), n, d_model]`` of text ``b`` with, in row r, the
    value vector of token ``zero[r]`` zeroed (all heads) in ``layer``; layers after it are skipped."""
    rows = inputs.select([b] * len(zero))
    js = torch.tensor(zero, device=adapter.device)
    got: dict[str, torch.Tensor] = {}

    def zero_v(v: torch.Tensor) -> torch.Tensor:
        v = v.clone()
        v[torch.arange(v.shape[0], device=v.device), js] = 0
        return v

    def stop(h: torch.Tensor) -> torch.Tensor:
        got["h"] = h.detach()
        raise _Stop

    try:
        adapter.forward(rows, edit={f"layers.{layer}.attn.v": zero_v, f"layers.{layer}.resid_post": stop})
    except _Stop:
        pass
    if "h" not in got:
        raise RuntimeError(f"value zeroing: layer {layer} output was never reached")
    return got["h"]


def cosine_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``1 − cos(a, b)`` over the last axis as ``½‖â − b̂‖²`` in float64: small changes of a
    representation give distances near 1e-7, where ``1 − cos`` in float32 is rounding noise."""
    a, b = a.double(), b.double()
    da = a / a.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    db = b / b.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    return 0.5 * (da - db).pow(2).sum(-1)


@dataclass
class ValueZeroing(Method):
    """Value zeroing (Mohebbi, Zuidema, Chrupała & Alishahi, EACL 2023).

    In layer l, the value vector of token j is set to zero in every head (the layer's input held
    at the original, i.e. earlier layers untouched), and ``C_l[i,j] = 1 − cos(x̃_i^{¬j}, x_i)``
    compares token i's output of layer l (the whole layer: attention, residual, FFN, norms;
    site ``layers.{l}.resid_post``) with and without j's value. Rows are normalised to sum to 1;
    keys the mask forbids (causal) are exactly 0. Layers are aggregated with rollout without an
    added identity (the residual is inside ``x̃``), ``R = C_L · … · C_1``; ``tokens`` is the
    explained position's row of ``R``. The S zeroings of a layer run as batch rows within the
    token budget ``batch_size``; each pass stops after layer l.
    """

    name = "value_zeroing"
    family = "decomposition"
    description = "Mohebbi 2023: 1 − cos of a layer's output when token j's value vectors are zeroed; rollout"

    def attribute(
        self, adapter: ModelAdapter, inputs: Inputs, *, target: Target, batch_size: int | None = None, seed: int = 0
    ) -> list[Explanation]:
        self.check(adapter)
        out: dict[int, Explanation] = {}
        groups = _groups(adapter, inputs, batch_size)
        total = sum(adapter.n_layers * len(list(chunks(n, n, batch_size, adapter.device))) for n in inputs.lengths)
        bar = tqdm(total=total, desc="value zeroing", unit="pass", delay=2.0, leave=False)
        try:
            for group in groups:
                sub = inputs.select(group)
                logits, cache = record_layers(adapter, sub, ("resid_post",))
                index = adapter.resolve(sub, target, logits)
                for k, b in enumerate(group):
                    n = inputs.lengths[b]
                    allowed = cache["allowed"][k, :n, :n]
                    layers = []
                    for l in range(adapter.n_layers):
                        orig = cache[f"layers.{l}.resid_post"][k, :n]
                        c = torch.zeros(n, n, device=orig.device)
                        for sl in chunks(n, n, batch_size, adapter.device):
                            js = list(range(sl.start, sl.stop))
                            new = zeroed_outputs(adapter, inputs, b, l, js)  # [rows, i, d]
                            c[:, sl] = at_least_float32(cosine_distance(new, orig[None]).t())
                            bar.update(1)
                        layers.append(normalise_rows(c.clamp_min(0) * allowed))
                    cm = torch.stack(layers)
                    r = rollout(cm)
                    pos = adapter.explained_position(n)
                    out[b] = self.explanation(
                        adapter,
                        sub,
                        k,
                        int(index[k]),
                        target,
                        arrays={
                            "tokens": r[pos].cpu().numpy().astype(np.float32),
                            "matrix": r.cpu().numpy().astype(np.float32),
                            "scores": cm.cpu().numpy().astype(np.float32),
                        },
                        axes={"tokens": ["token"], "matrix": ["query", "key"], "scores": ["layer", "query", "key"]},
                        meaning={
                            "tokens": f"value-zeroing rollout, row of position {pos} ({inputs.labels[b][pos]})",
                            "matrix": "rollout R = C_L…C_1 of the per-layer value-zeroing matrices",
                            "scores": "per layer 1 − cos(x̃_i without j's values, x_i), rows normalised",
                        },
                        position=pos,
                    )
        finally:
            bar.close()
        return [out[b] for b in range(len(inputs))]
