"""Ground truth for dictionary learning (issue 38, Must-have 4): a tiny model whose MLP *is* a sparse dictionary.

A one-layer Llama (float64, the tiny word-level tokenizer) built so that its MLP's input is a sparse, non-negative
combination of ``m`` planted feature directions and its output is the planted decoder applied to them:

- attention writes nothing (``o_proj = 0``), so the MLP reads ``x = RMSNorm(embed(token))`` (gain 1);
- token ``t``'s embedding is ``Σ_{i ∈ S_t} c_{t,i} e_i`` with orthonormal ``e_i`` (the planted encoder),
  ``c > 0`` and ``|S_t| ≤ 2`` (every feature alone on at least one token; special tokens embed to 0);
- the MLP (``hidden_act = relu``, ``mlp_bias``) has ``gate = E`` (no bias), ``up = 0`` with bias 1 and
  ``down = Dᵀ`` with bias ``b``: ``mlp(x) = Σ_i relu(e_i · x) d_i + b``, i.e. exactly the transcoder
  ``W_enc = Eᵀ``, ``b_enc = 0``, ``W_dec = D`` (unit rows), ``b_dec = b`` (:meth:`Planted.dictionary`).

:func:`recovery` matches a fitted transcoder's decoder rows to the planted ones (Hungarian matching on the
cosine, ``scipy.optimize.linear_sum_assignment``) and returns the matched cosines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..models.adapter import ModelAdapter
from ..models.features import Dictionary, FeatureSet

__all__ = ["Planted", "planted_model", "recovery"]


@dataclass
class Planted:
    adapter: ModelAdapter
    encoder: torch.Tensor  # [m, d] orthonormal rows e_i
    decoder: torch.Tensor  # [m, d] unit rows d_i
    bias: torch.Tensor  # [d]
    supports: dict[int, list[int]]  # token id -> the features it carries

    @property
    def n_features(self) -> int:
        return int(self.encoder.shape[0])

    def dictionary(self) -> Dictionary:
        """The MLP as the transcoder it is by construction."""
        m = self.n_features
        return Dictionary(
            0,
            "mlp",
            W_enc=self.encoder.T.clone(),
            b_enc=torch.zeros(m, dtype=torch.float64),
            W_dec=self.decoder.clone(),
            b_dec=self.bias.clone(),
        )

    def feature_set(self) -> FeatureSet:
        return FeatureSet({(0, "mlp"): self.dictionary()}, source="planted", model=self.adapter.name)

    def zero_planted(self, i: int):  # noqa: ANN201 - a removable hook handle
        """Zero the MLP's hidden unit ``i`` (the planted feature) in the model itself until ``.remove()``."""
        down: Any = self.adapter.layer_modules[0].mlp.down_proj  # type: ignore[union-attr]

        def hook(module: torch.nn.Module, args: tuple) -> tuple:
            h = args[0].clone()
            h[..., i] = 0
            return (h,)

        return down.register_forward_pre_hook(hook)


def planted_model(n_features: int = 12, d_model: int = 32, seed: int = 0) -> Planted:
    from transformers import LlamaConfig, LlamaForCausalLM

    from ..models.families.base import decoder_config
    from ..models.tiny import family_tokenizer

    if n_features > d_model:
        raise ValueError("orthonormal planted encoder directions need n_features <= d_model")
    tok = family_tokenizer("llama")
    cfg = decoder_config(tok, 1, 4, d_model)
    cfg.update(intermediate_size=n_features, hidden_act="relu", mlp_bias=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).double().eval()
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d_model, n_features, generator=g, dtype=torch.float64))
    enc = q.T.contiguous()  # [m, d], orthonormal rows
    dec = torch.randn(n_features, d_model, generator=g, dtype=torch.float64)
    dec = dec / dec.norm(dim=-1, keepdim=True)
    bias = torch.randn(d_model, generator=g, dtype=torch.float64) * 0.1
    special = set(tok.all_special_ids)
    words = [i for i in range(len(tok)) if i not in special]
    rng = np.random.default_rng(seed)
    supports: dict[int, list[int]] = {}
    for j, t in enumerate(words):
        if j < n_features:
            supports[t] = [j]
        else:
            supports[t] = sorted(int(i) for i in rng.choice(n_features, size=int(rng.integers(1, 3)), replace=False))
    emb = torch.zeros(len(tok), d_model, dtype=torch.float64)
    for t, s in supports.items():
        for i in s:
            emb[t] += float(rng.uniform(0.5, 1.5)) * enc[i]
    layer = model.model.layers[0]
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(emb)
        layer.self_attn.o_proj.weight.zero_()
        layer.post_attention_layernorm.weight.fill_(1.0)
        layer.mlp.gate_proj.weight.copy_(enc)
        layer.mlp.gate_proj.bias.zero_()
        layer.mlp.up_proj.weight.zero_()
        layer.mlp.up_proj.bias.fill_(1.0)
        layer.mlp.down_proj.weight.copy_(dec.T)
        layer.mlp.down_proj.bias.copy_(bias)
    return Planted(ModelAdapter(model, tok, "planted-mlp"), enc, dec, bias, supports)


def recovery(planted: Planted, fitted: Dictionary) -> tuple[np.ndarray, np.ndarray]:
    """(matched fitted latent per planted feature ``[m]``, their decoder cosines ``[m]``) after Hungarian
    matching of planted decoder rows to fitted ones on the cosine."""
    from scipy.optimize import linear_sum_assignment

    want = planted.decoder / planted.decoder.norm(dim=-1, keepdim=True)
    got = fitted.W_dec.double()
    got = got / got.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    cos = (want @ got.T).numpy()
    rows, cols = linear_sum_assignment(-cos)
    order = np.argsort(rows)
    return cols[order], cos[rows[order], cols[order]]
