"""Logit lens and direct logit attribution on pre-norm causal LMs (GPT-2, Llama, Mistral, Qwen2/3,
Phi-3, Gemma 2/3; the family facts are in :mod:`streetlamp.models.readout`).

* **Logit lens** (nostalgebraist, 2020): ``logits_l = W_U · norm_f(resid_post_l) + b_U`` for every
  layer ``l`` and position, then the model's final-logit soft-cap ``cap · tanh(· / cap)`` where it has
  one (Gemma 2/3); the last layer's equals the model's logits.
* **Direct logit attribution** (Elhage et al., 2021, "A Mathematical Framework"): the residual
  leaving the last layer at the explained position is
  ``x = embed + Σ_l (Σ_h head_l,h + b_O,l + mlp_l)``; with the final norm linearised with the
  scale ``σ(x)`` of this ``x`` (``lin(c) = (c - mean c)/σ(x) · γ``; RMSNorm: ``c/rms(x) · γ``),
  each part's direct effect on the logit of token ``y`` is ``lin(c) · W_U[y]`` and
  ``logit_y = Σ_parts + β · W_U[y] + b_U[y]`` exactly. A head's part further splits over the
  key positions it reads, ``head_l,h = Σ_j A[h, pos, j] · v_j W_O,h`` (v with its bias).
  ``embed`` is the residual entering layer 0 at the explained position (GPT-2: token + position
  embedding; Gemma: the embedding times ``sqrt(d)``). MLPs are position-local, so only the explained
  position's MLP outputs act directly.
* **Sandwich norms** (Gemma 2/3): a layer writes ``N_attn(attn_out)`` and ``N_mlp(mlp_out)`` into the
  residual stream, each an RMSNorm. A head's write is ``N_attn`` **linearised with the scale of the
  whole attention output at that position** (``head / rms(attn_out) · (1 + w)``: exact for the sum of
  the heads, linear in each head, and per key likewise); the MLP's write is ``N_mlp(mlp_out)`` itself
  (one part, exact). So with a sandwich norm a head's DLA is linear in the head's output only once
  both norms' scales are held fixed: two linearisations, both at the actual scales.
* **Final-logit soft-cap** (Gemma 2/3): DLA splits the logit **before** the cap, ``l`` (the cap is not
  linear); ``DLA.logit`` is that ``l`` and ``DLA.model_logit = cap · tanh(l / cap)`` is the model's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..methods.gradient import ids_inputs
from ..models.adapter import ModelAdapter
from ..models.attention_block import output_weights
from ..models.readout import check_lens, final_norm, final_softcap, output_norms, unembedding
from .lenses.base import Lens, capped, readout  # noqa: F401  (capped: re-exported, its home was here)


def attn_writes(adapter: ModelAdapter, layer: int, parts: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
    """What parts ``[..., pos, d]`` of layer ``layer``'s attention output write into the residual stream:
    themselves, or (sandwich norm) the norm linearised with the scale of the whole output ``attn_out``
    ``[pos, d]`` at each position (no β: an RMSNorm)."""
    norm, _ = output_norms(adapter, layer)
    return parts.double() if norm is None else norm.linear(parts, norm.scale(attn_out))


def mlp_writes(adapter: ModelAdapter, layer: int, mlp_out: torch.Tensor) -> torch.Tensor:
    """What layer ``layer``'s MLP output ``[pos, d]`` writes into the residual stream (after its sandwich norm)."""
    _, norm = output_norms(adapter, layer)
    return mlp_out.double() if norm is None else norm(mlp_out)


def _ids(adapter: ModelAdapter, ids: torch.Tensor) -> torch.Tensor:
    return ids.view(-1).to(adapter.device)


def logit_lens(
    adapter: ModelAdapter, ids: torch.Tensor, index: int, top: int = 5, lens: Lens | None = None
) -> dict[str, np.ndarray]:
    """The lens at every layer (row 0: the embedding, row l+1: resid_post of layer l) and position:
    the logit lens, or ``lens`` (a tuned or Jacobian lens, :mod:`streetlamp.interventions.lenses`).

    Returns ``logit``/``prob``/``logprob``/``rank`` of token ``index`` ``[layer+1, pos]`` (``logprob``: the
    log-softmax in float64, finite where ``prob`` underflows: a probability below float32's smallest
    normal, ~1.2e-38, is stored as 0 in a float32 array, its log is not), the ``top`` tokens and
    their probabilities ``[layer+1, pos, top]``, and ``last_logits`` ``[vocab]``: the lens of the
    last layer at the last position (equal to the model's logits there, for every lens)."""
    check_lens(adapter)
    lens = lens or Lens.logit(adapter)
    ids = _ids(adapter, ids)
    L = adapter.n_layers
    sites = ["layers.0.resid_pre"] + [f"layers.{l}.resid_post" for l in range(L)]
    with torch.no_grad():
        fwd = adapter.forward(ids_inputs(adapter, ids.cpu()), record=sites)
        n = ids.shape[0]
        out = {
            "logit": np.zeros((L + 1, n)),
            "prob": np.zeros((L + 1, n)),
            "logprob": np.zeros((L + 1, n)),
            "rank": np.zeros((L + 1, n), np.int64),
            "top_ids": np.zeros((L + 1, n, top), np.int64),
            "top_prob": np.zeros((L + 1, n, top)),
        }
        last = None
        for r, s in enumerate(sites):
            lg = readout(adapter, lens, r, fwd.cache[s][0])  # [pos, vocab]
            logp = torch.log_softmax(lg.double(), -1)  # float64: log p stays finite where p underflows
            p = logp.exp()
            t = lg[:, index]
            out["logit"][r] = t.cpu().numpy()
            out["prob"][r] = p[:, index].cpu().numpy()
            out["logprob"][r] = logp[:, index].cpu().numpy()
            out["rank"][r] = (lg > t[:, None]).sum(-1).cpu().numpy()
            tp, ti = p.topk(top, -1)
            out["top_ids"][r], out["top_prob"][r] = ti.cpu().numpy(), tp.cpu().numpy()
            last = lg[-1]
    assert last is not None
    out["last_logits"] = last.cpu().numpy()
    out["model_logits"] = fwd.logits[0].double().cpu().numpy()
    return out


@dataclass
class DLA:
    """Direct logit attribution of one token's logit at the last position (float64 arrays)."""

    embed: float
    heads: np.ndarray  # [layer, head]
    head_source: np.ndarray  # [layer, head, key]
    attn_bias: np.ndarray  # [layer]
    mlp: np.ndarray  # [layer]
    norm_bias: float  # β · W_U[y]
    unembed_bias: float  # b_U[y]
    logit: float  # the logit the parts sum to: the model's, before its final soft-cap if it has one
    scale: float  # σ or rms of the final residual (the linearisation)
    model_logit: float = float("nan")  # the model's logit (= logit, or cap · tanh(logit / cap))
    softcap: float | None = None  # the final-logit soft-cap

    def total(self) -> float:
        return float(
            self.embed + self.heads.sum() + self.attn_bias.sum() + self.mlp.sum() + self.norm_bias + self.unembed_bias
        )


def direct_logit_attribution(adapter: ModelAdapter, ids: torch.Tensor, index: int) -> DLA:
    check_lens(adapter)
    ids = _ids(adapter, ids)
    L = adapter.n_layers
    sites = ["layers.0.resid_pre", f"layers.{L - 1}.resid_post"] + [
        f"layers.{l}.{s}" for l in range(L) for s in ("attn.head_out", "attn.out", "attn.pattern", "attn.v", "mlp.out")
    ]
    with torch.no_grad():
        fwd = adapter.forward(ids_inputs(adapter, ids.cpu()), record=sites)
        c = {k: v[0] for k, v in fwd.cache.items() if k != "allowed"}
        norm = final_norm(adapter)
        x = c[f"layers.{L - 1}.resid_post"][-1].double()
        scale = norm.scale(x)
        w_u, b_u = unembedding(adapter)
        u = w_u[index].double()

        def direct(part: torch.Tensor) -> torch.Tensor:  # [..., d] -> [...]
            return norm.linear(part, scale) @ u

        heads = np.zeros((L, adapter.n_heads))
        source = np.zeros((L, adapter.n_heads, ids.shape[0]))
        attn_bias, mlp = np.zeros(L), np.zeros(L)
        for l in range(L):
            out_l = c[f"layers.{l}.attn.out"][-1:]  # [1, d]: the whole attention output at the last position

            def write(part: torch.Tensor, l: int = l, out_l: torch.Tensor = out_l) -> torch.Tensor:
                return attn_writes(adapter, l, part, out_l)

            heads[l] = direct(write(c[f"layers.{l}.attn.head_out"][-1])).cpu().numpy()
            w_o, b_o = output_weights(adapter, l)  # [head, d_head, d_model]
            a = c[f"layers.{l}.attn.pattern"][:, -1].double()  # [head, key]
            v = c[f"layers.{l}.attn.v"].double()  # [key, head, d_head]
            per_key = torch.einsum("hk,khd,hdm->hkm", a, v, w_o.double().to(v.device))
            source[l] = direct(write(per_key)).cpu().numpy()
            attn_bias[l] = float(direct(write(b_o.to(x.device)[None])[0])) if b_o is not None else 0.0
            mlp[l] = float(direct(mlp_writes(adapter, l, c[f"layers.{l}.mlp.out"][-1:])[0]))
        cap = final_softcap(adapter)
        model_logit = float(fwd.logits[0, index])
        return DLA(
            embed=float(direct(c["layers.0.resid_pre"][-1])),
            heads=heads,
            head_source=source,
            attn_bias=attn_bias,
            mlp=mlp,
            norm_bias=float(norm.beta(x.shape[-1]) @ u),
            unembed_bias=float(b_u[index]) if b_u is not None else 0.0,
            logit=float(cap * np.arctanh(model_logit / cap)) if cap else model_logit,
            scale=float(scale),
            model_logit=model_logit,
            softcap=cap,
        )
