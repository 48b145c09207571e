"""Model facts for lenses, direct logit attribution and QK attribution on pre-norm causal LMs.

* the final norm and the unembedding (``logits = W_U · norm_f(resid) + b_U``);
* a norm "linearised with its own scale": ``norm(x) = Σ_c lin(c) + β`` for ``x = Σ_c c``, where
  ``lin(c) = (c - mean(c)) / σ(x) · γ`` (LayerNorm) or ``c / rms(x) · γ`` (RMSNorm) with ``σ(x)`` /
  ``rms(x)`` (eps included) taken from the whole ``x``: exact for that ``x``, linear in each part;
* the query and key vectors of one layer's heads from an already-normalised input, rotary
  position embedding included (Llama family), with or without their biases.

Supported: GPT-2 (LayerNorm, fused ``c_attn``) and the Llama family (RMSNorm, ``q_proj``/``k_proj``,
grouped-query keys repeated per query head, RoPE). Post-LN encoders have no residual stream that
adds up to the output, so lenses do not apply to them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..errors import StreetlampError
from .attention_block import placement

if TYPE_CHECKING:
    from .adapter import ModelAdapter

FINAL_NORM = {"gpt2": "ln_f", "llama": "norm", "mistral": "norm", "qwen2": "norm"}  # relative to base_model


def check_lens(adapter: ModelAdapter) -> None:
    if adapter.kind != "causal_lm" or adapter.family.name not in FINAL_NORM:
        raise StreetlampError(
            f"lenses need a pre-norm causal LM ({', '.join(sorted(FINAL_NORM))}); "
            f"{adapter.name} is a {adapter.family.name} {adapter.kind}"
        )


@dataclass
class Norm:
    """A LayerNorm or RMSNorm's parameters (float64 on the model's device)."""

    kind: str  # "layernorm" | "rmsnorm"
    weight: torch.Tensor
    bias: torch.Tensor | None
    eps: float

    @classmethod
    def of(cls, m: nn.Module) -> Norm:
        kind = "layernorm" if isinstance(m, nn.LayerNorm) else "rmsnorm"
        mod: Any = m  # HF norm modules: attributes differ per family
        eps = float(getattr(mod, "eps", None) or mod.variance_epsilon)
        b = getattr(mod, "bias", None)
        return cls(kind, mod.weight.detach().double(), b.detach().double() if b is not None else None, eps)

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        """σ (LayerNorm) or rms (RMSNorm) of ``x`` ``[..., d]``, eps included: ``[..., 1]``."""
        x = x.double()
        if self.kind == "layernorm":
            return (x.var(-1, unbiased=False, keepdim=True) + self.eps).sqrt()
        return (x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()

    def linear(self, c: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """``lin(c)`` for a part ``c`` ``[..., d]`` of an input whose scale is ``scale`` (no β)."""
        c = c.double()
        if self.kind == "layernorm":
            c = c - c.mean(-1, keepdim=True)
        return c / scale * self.weight

    def beta(self, d: int) -> torch.Tensor:
        return self.bias if self.bias is not None else torch.zeros(d, dtype=torch.float64, device=self.weight.device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x, self.scale(x)) + self.beta(x.shape[-1])


def final_norm(adapter: ModelAdapter) -> Norm:
    check_lens(adapter)
    return Norm.of(getattr(adapter.hf_model.base_model, FINAL_NORM[adapter.family.name]))


def pre_attn_norm(adapter: ModelAdapter, layer: int) -> Norm:
    check_lens(adapter)
    p = placement(adapter)
    m: nn.Module = adapter.layer_modules[layer]
    for part in p.attn_norm.split("."):
        m = getattr(m, part)
    return Norm.of(m)


def unembedding(adapter: ModelAdapter) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``W_U`` ``[vocab, d]`` (the output embedding's weight, as stored) and ``b_U`` (usually None)."""
    check_lens(adapter)
    head = adapter.hf_model.get_output_embeddings()
    b = getattr(head, "bias", None)
    return head.weight.detach(), (b.detach() if b is not None else None)


def unembed(adapter: ModelAdapter, normed: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
    """Logits ``normed · W_Uᵀ + b_U`` ``[..., vocab]`` (or only the columns ``index``), float64."""
    w, b = unembedding(adapter)
    if index is not None:
        w = w[index]
        b = b[index] if b is not None else None
    out = normed.double() @ w.double().t()
    return out + b.double() if b is not None else out


def attention_scaling(adapter: ModelAdapter, layer: int) -> float:
    m: Any = adapter.attn_modules[layer]
    s = getattr(m, "scaling", None)
    return float(s) if s is not None else float(m.head_dim) ** -0.5


def query_key(
    adapter: ModelAdapter, layer: int, z: torch.Tensor, bias: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries and keys ``[pos, head, d_head]`` (keys repeated per query head) of layer ``layer``
    for a normalised input ``z`` ``[pos, d]`` at positions ``0..pos-1``, float64; ``bias=False``
    leaves out b_Q and b_K (the linear part only). Rotary embeddings are applied (linear)."""
    check_lens(adapter)
    attn: Any = adapter.attn_modules[layer]
    z = z.double()
    n, H = z.shape[0], adapter.n_heads
    if adapter.family.name == "gpt2":
        w, b = attn.c_attn.weight.double(), attn.c_attn.bias.double()  # Conv1D: [d, 3d]
        d = adapter.d_model
        qk = z @ w[:, : 2 * d] + (b[: 2 * d] if bias else 0)
        q, k = qk[:, :d].reshape(n, H, -1), qk[:, d:].reshape(n, H, -1)
        return q.detach(), k.detach()
    lin = nn.functional.linear
    qb = attn.q_proj.bias.double() if bias and attn.q_proj.bias is not None else None
    kb = attn.k_proj.bias.double() if bias and attn.k_proj.bias is not None else None
    q = lin(z, attn.q_proj.weight.double(), qb).reshape(n, H, -1)
    k = lin(z, attn.k_proj.weight.double(), kb).reshape(n, adapter.n_kv_heads, -1)
    k = k.repeat_interleave(H // adapter.n_kv_heads, dim=1)
    rot: Any = adapter.hf_model.base_model.rotary_emb
    pos = torch.arange(n, device=z.device)[None]
    cos, sin = rot(z[None].float(), pos)
    cos, sin = cos[0].double()[:, None], sin[0].double()[:, None]

    def rope(x: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin

    return rope(q).detach(), rope(k).detach()
