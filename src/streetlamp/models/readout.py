"""Model facts for lenses, direct logit attribution and QK attribution on pre-norm causal LMs.

* the final norm and the unembedding (``logits = W_U · norm_f(resid) + b_U``);
* a norm "linearised with its own scale": ``norm(x) = Σ_c lin(c) + β`` for ``x = Σ_c c``, where
  ``lin(c) = (c - mean(c)) / σ(x) · γ`` (LayerNorm) or ``c / rms(x) · γ`` (RMSNorm) with ``σ(x)`` /
  ``rms(x)`` (eps included) taken from the whole ``x``: exact for that ``x``, linear in each part;
* the query and key vectors of one layer's heads from an already-normalised input, rotary
  position embedding included (Llama family), with or without their biases.

Supported: GPT-2 (LayerNorm, fused ``c_attn``), the Llama family (Llama, Mistral, Qwen2: RMSNorm,
``q_proj``/``k_proj``, grouped-query keys repeated per query head, RoPE), Qwen3 (and per-head
``q_norm``/``k_norm`` RMSNorms before RoPE), Phi-3 (fused ``qkv_proj``, partial RoPE allowed), Gemma 2
and Gemma 3 text (RMSNorm gain ``1 + w``; sandwich norms: the attention and MLP outputs are
RMS-normalised before they join the residual stream; embeddings scaled by ``sqrt(d)`` inside the
embedding module, so the recorded residual already holds them; Gemma 2's attention-logit soft-cap and
both's final-logit soft-cap). Post-LN encoders have no residual stream that adds up to the output, so
lenses do not apply to them.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from ..errors import StreetlampError
from .families import FamilyTable, Readout

if TYPE_CHECKING:
    from .adapter import ModelAdapter


# family -> its readout (the ``readout`` of each family object) and final norm, for callers of the old tables
READOUT: FamilyTable[Readout] = FamilyTable(lambda f: f.readout)
FINAL_NORM: FamilyTable[str] = FamilyTable(
    lambda f: f.readout.final_norm if f.readout else None
)  # relative to base_model


def check_lens(adapter: ModelAdapter) -> None:
    if not adapter.kind.causal or adapter.family.readout is None:
        raise StreetlampError(
            f"lenses need a pre-norm causal LM ({', '.join(sorted(FINAL_NORM))}); "
            f"{adapter.name} is a {adapter.family.name} {adapter.kind}"
        )


@dataclass
class Norm:
    """A LayerNorm or RMSNorm's parameters (float64 on the model's device); ``weight`` is the gain as
    applied (Gemma's ``1 + w``)."""

    kind: str  # "layernorm" | "rmsnorm"
    weight: torch.Tensor
    bias: torch.Tensor | None
    eps: float

    @classmethod
    def of(cls, m: nn.Module, gain_offset: float = 0.0) -> Norm:
        kind = "layernorm" if isinstance(m, nn.LayerNorm) else "rmsnorm"
        mod: Any = m  # HF norm modules: attributes differ per family
        eps = float(getattr(mod, "eps", None) or mod.variance_epsilon)
        b = getattr(mod, "bias", None)
        w = mod.weight.detach().double() + (gain_offset if kind == "rmsnorm" else 0.0)
        return cls(kind, w, b.detach().double() if b is not None else None, eps)

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


def _norm_at(adapter: ModelAdapter, root: nn.Module, path: str) -> Norm:
    m: Any = root
    for part in path.split("."):
        m = getattr(m, part)
    return Norm.of(m, adapter.family.norm_offset)


def _readout(adapter: ModelAdapter) -> Readout:
    check_lens(adapter)
    return cast(Readout, adapter.family.readout)


def final_norm(adapter: ModelAdapter) -> Norm:
    return _norm_at(adapter, adapter.hf_model.base_model, _readout(adapter).final_norm)


def pre_attn_norm(adapter: ModelAdapter, layer: int) -> Norm:
    return _norm_at(adapter, adapter.layer_modules[layer], _readout(adapter).attn_in)


def output_norms(adapter: ModelAdapter, layer: int) -> tuple[Norm | None, Norm | None]:
    """The norms on layer ``layer``'s attention output and MLP output before they join the residual
    stream (Gemma's sandwich norms), or None where the output is added as it is."""
    r, m = _readout(adapter), adapter.layer_modules[layer]
    return (
        _norm_at(adapter, m, r.attn_out) if r.attn_out else None,
        _norm_at(adapter, m, r.mlp_out) if r.mlp_out else None,
    )


def final_softcap(adapter: ModelAdapter) -> float | None:
    """The LM head's soft-cap ``cap`` (Gemma 2 and 3: ``logits = cap · tanh(l / cap)``), or None."""
    cap = getattr(adapter.hf_model.config, "final_logit_softcapping", None)
    return float(cap) if cap and adapter.kind.causal else None


def lm_head_logits(adapter: ModelAdapter, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head on final hidden states ``[..., d]`` as the model's own forward applies it: the output
    embedding, then any final soft-cap (:func:`final_softcap`), in the model's dtype."""
    logits = adapter.hf_model.get_output_embeddings()(hidden)
    cap = final_softcap(adapter)
    return torch.tanh(logits / cap) * cap if cap else logits


def attention_softcap(adapter: ModelAdapter, layer: int) -> float | None:
    """The attention-logit soft-cap of layer ``layer`` (Gemma 2), or None."""
    cap = getattr(adapter.attn_modules[layer], "attn_logit_softcapping", None)
    return float(cap) if cap else None


def sliding_window(adapter: ModelAdapter, layer: int) -> int | None:
    """Layer ``layer``'s window (a query i sees keys i - window + 1 .. i), or None for full attention."""
    attn: Any = adapter.attn_modules[layer]
    w = (
        attn.sliding_window
        if hasattr(attn, "sliding_window")
        else getattr(adapter.hf_model.config, "sliding_window", None)
    )
    return int(w) if w else None


def unembedding(adapter: ModelAdapter) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``W_U`` ``[vocab, d]`` (the output embedding's weight, as stored) and ``b_U`` (usually None)."""
    check_lens(adapter)
    head = adapter.hf_model.get_output_embeddings()
    b = getattr(head, "bias", None)
    return head.weight.detach(), (b.detach() if b is not None else None)


def unembed(adapter: ModelAdapter, normed: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
    """Logits ``normed · W_Uᵀ + b_U`` ``[..., vocab]`` (or only the columns ``index``), float64, before
    any final soft-cap (see :func:`final_softcap`)."""
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
    adapter: ModelAdapter, layer: int, z: torch.Tensor, bias: bool = True, full: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries and keys ``[pos, head, d_head]`` (keys repeated per query head) of layer ``layer``
    for a normalised input ``z`` ``[pos, d]`` at positions ``0..pos-1``, float64; ``bias=False``
    leaves out b_Q and b_K (the linear part only). Rotary embeddings are applied (linear).

    Per-head q/k norms (Qwen3, Gemma 3: RMSNorm over ``d_head`` before RoPE) are linearised with the
    scale of the query / key of ``full`` (the layer's whole normalised input; default ``z`` itself, which
    gives the exact q and k of ``z``), so the q and k of parts of ``full`` sum to those of ``full``."""
    check_lens(adapter)
    attn: Any = adapter.attn_modules[layer]
    z = z.double()
    q, k = _project(adapter, attn, z, bias)
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    if q_norm is not None and k_norm is not None:
        qf, kf = (q, k) if full is None else _project(adapter, attn, full.double(), True)
        off = adapter.family.norm_offset
        qn, kn = Norm.of(q_norm, off), Norm.of(k_norm, off)
        q, k = qn.linear(q, qn.scale(qf)), kn.linear(k, kn.scale(kf))
    H = adapter.n_heads
    k = k.repeat_interleave(H // k.shape[1], dim=1)
    if not adapter.family.rotary:
        return q.detach(), k.detach()
    rot: Any = adapter.hf_model.base_model.rotary_emb
    pos = torch.arange(z.shape[0], device=z.device)[None]
    kw = {"layer_type": attn.layer_type} if "layer_type" in inspect.signature(rot.forward).parameters else {}
    cos, sin = rot(z[None].float(), pos, **kw)
    cos, sin = cos[0].double()[:, None], sin[0].double()[:, None]
    r = cos.shape[-1]  # rotary dimensions (the first r of each head; the rest pass through)

    def rope(x: torch.Tensor) -> torch.Tensor:
        xr, xp = x[..., :r], x[..., r:]
        h = r // 2
        return torch.cat((xr * cos + torch.cat((-xr[..., h:], xr[..., :h]), -1) * sin, xp), -1)

    return rope(q).detach(), rope(k).detach()


def _project(adapter: ModelAdapter, attn: Any, z: torch.Tensor, bias: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``W_Q z (+ b_Q)`` ``[pos, head, d_head]`` and ``W_K z (+ b_K)`` ``[pos, kv_head, d_head]``, float64:
    GPT-2's fused ``c_attn`` (Conv1D), a fused linear (Phi-3's ``qkv_proj``) or separate ``q_proj`` / ``k_proj``
    (the family's :attr:`~streetlamp.models.families.Family.qkv`)."""
    check_lens(adapter)
    n, H, KV = z.shape[0], adapter.n_heads, adapter.n_kv_heads
    qkv = adapter.family.qkv
    if qkv == "c_attn":
        w, b = attn.c_attn.weight.double(), attn.c_attn.bias.double()  # Conv1D: [d, 3d]
        d = adapter.d_model
        qk = z @ w[:, : 2 * d] + (b[: 2 * d] if bias else 0)
        return qk[:, :d].reshape(n, H, -1), qk[:, d:].reshape(n, H, -1)
    lin = nn.functional.linear

    def proj(m: Any, rows: slice | None = None) -> torch.Tensor:
        w, b = m.weight.double(), (m.bias.double() if bias and m.bias is not None else None)
        if rows is not None:
            w, b = w[rows], (b[rows] if b is not None else None)
        return lin(z, w, b)

    if qkv != "q_proj":  # one fused linear (Phi-3's qkv_proj): rows [q (H·dh), k (KV·dh), v]
        fused = getattr(attn, qkv)
        dq, dk = H * attn.head_dim, KV * attn.head_dim
        return (
            proj(fused, slice(0, dq)).reshape(n, H, -1),
            proj(fused, slice(dq, dq + dk)).reshape(n, KV, -1),
        )
    return proj(attn.q_proj).reshape(n, H, -1), proj(attn.k_proj).reshape(n, KV, -1)
