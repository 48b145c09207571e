"""The per-family pieces of the circuit forward: embeddings, each layer's norms and projections, the
attention core, the MLP and the readout, called on the model's own modules and weights.

The model's forward feeds one residual stream to every head; the circuit graph gives every reader its
own input (:mod:`.graph`), which no site edit can express (a site is shared by every reader). So the
circuit forward (:mod:`.forward`) calls these pieces itself; ``tests/interventions/test_circuit_forward.py`` checks
that with every edge present it reproduces ``adapter.forward`` and the ``attn.head_out`` / ``mlp.out``
sites on every supported family.

Which families it runs on, and how, are facts of each family object (:class:`~streetlamp.models.families.Family`):
its :class:`~streetlamp.models.families.Circuit` (MLP and final norms, the ``embed`` writer, learned
positions, the readout), the attention norm of its :class:`~streetlamp.models.families.NormPlacement`, its
q/k/v layout (``qkv``), ``rotary`` and ``bidirectional``; no family is named here. Supported today: the
pre-norm decoders GPT-2, Llama, Mistral, Qwen2, Qwen3, Phi-3 and the mixtures of experts Mixtral, Qwen2-MoE and
Qwen3-MoE (their sparse block one MLP node, or with ``experts=True`` one node per expert: :meth:`Blocks.experts`),
as causal LMs or sequence classifiers (readout at the last real token), and the pre-norm encoder ModernBERT (bidirectional, alternating global
and local layers). Refused, with the reason as the error: post-LN encoders (a post-LN residual stream is no
sum of writers), sandwich norms (each layer's heads are normalised together before they join the stream),
image models, encoder-decoders and any family without a ``circuit``.
"""

from __future__ import annotations

import inspect
from typing import Any, cast

import torch
from torch import nn

from ...errors import StreetlampError
from ...models.adapter import ModelAdapter, submodule
from ...models.families import FAMILIES, Circuit, Family
from ...models.readout import sliding_window
from ...models.sites import output_matrix
from .graph import Graph

_WHY = {
    "post": "its residual stream is normalised after each block (post-LN), so it is no sum of writers",
    "sandwich": "it normalises each layer's heads together before they join the residual stream",
}


def circuit_of(family: Family) -> Circuit | None:
    """The family's circuit wiring when the engine accepts it: a pre-norm family that has one."""
    if family.circuit is None or family.norm is None or family.norm.placement != "pre":
        return None
    return family.circuit


def supported() -> list[str]:
    """The registered families ``circuit`` accepts (read from :data:`FAMILIES` at each call)."""
    return [name for name, f in FAMILIES.items() if f.modality == "text" and circuit_of(f) is not None]


def check_supported(adapter: ModelAdapter) -> None:
    fam = adapter.family
    if circuit_of(fam) is not None and adapter.modality == "text":
        if getattr(adapter.hf_model.config, "scale_attn_by_inverse_layer_idx", False):
            raise StreetlampError(f"circuits: {fam.name} with scale_attn_by_inverse_layer_idx is not supported")
        return
    placement = fam.norm.placement if fam.norm is not None else ""
    why = _WHY.get(placement, "not wired into the circuit engine yet")
    if adapter.modality != "text":
        why = f"it is an {adapter.modality} model (the circuit engine reads token ids)"
    raise StreetlampError(
        f"circuits: {adapter.name} ({fam.name}) is not supported: {why}; supported: {', '.join(supported())}"
    )


def expert_layout(adapter: ModelAdapter) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    """Per layer: how many routed experts its MoE block has (0: a dense MLP layer, as Qwen2-MoE's
    ``mlp_only_layers``) and whether it has a shared expert; refused in one line for a model without experts."""
    spec = adapter.family.experts
    if spec is None:
        raise StreetlampError(
            f"--expert-nodes: {adapter.name} ({adapter.family.name}) is no mixture-of-experts model: it has no experts "
            "to split its MLP nodes into"
        )
    counts, shared = [], []
    for layer in adapter.layer_modules:
        try:
            router = submodule(layer, spec.router)
            experts = submodule(layer, spec.experts)
        except (AttributeError, IndexError):
            counts.append(0)
            shared.append(False)
            continue
        counts.append(int(getattr(experts, "num_experts", 0) or getattr(router, "num_experts", 0)))
        has = (
            spec.shared_expert is not None and getattr(submodule(layer, spec.block), "shared_expert", None) is not None
        )
        shared.append(bool(has))
    return tuple(counts), tuple(shared)


def graph_of(adapter: ModelAdapter, experts: bool = False) -> Graph:
    """The circuit graph of ``adapter``'s model; ``experts``: each MoE layer's MLP node split into its experts."""
    if not experts:
        return Graph(adapter.n_layers, adapter.n_heads, adapter.n_kv_heads)
    counts, shared = expert_layout(adapter)
    return Graph(adapter.n_layers, adapter.n_heads, adapter.n_kv_heads, counts, shared)


class Blocks:
    """The model's pieces in circuit form, for one adapter (weights read from its modules when used);
    ``experts``: mixture-of-experts layers as expert nodes (:mod:`.graph`)."""

    def __init__(self, adapter: ModelAdapter, experts: bool = False) -> None:
        check_supported(adapter)
        self.adapter = adapter
        self.graph = graph_of(adapter, experts)
        self.family = adapter.family
        self.circuit = cast(Circuit, circuit_of(adapter.family))
        self.base: Any = adapter.hf_model.base_model
        self.layers: list[Any] = list(adapter.layer_modules)
        self.H, self.KV = adapter.n_heads, adapter.n_kv_heads
        attn: Any = adapter.attn_modules[0]
        self.dh = int(getattr(attn, "head_dim", adapter.d_model // self.H))

    # -- embeddings ----------------------------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The ``embed`` writer ``[b, s, d]``: token embeddings (plus learned positions where the family adds
        them: GPT-2), or the output of the family's embedding module (ModernBERT: after its norm)."""
        c = self.circuit
        if c.embeddings is not None:
            return submodule(self.base, c.embeddings)(input_ids=ids)
        e = self.adapter.embed_module(ids)
        if c.positions is not None:
            e = e + submodule(self.base, c.positions)(torch.arange(ids.shape[1], device=ids.device))[None]
        return e

    # -- attention ---------------------------------------------------------------------------------
    def _norms(self, l: int) -> tuple[nn.Module, nn.Module]:
        """Layer ``l``'s norms before the attention and before the MLP."""
        layer = self.layers[l]
        return submodule(layer, cast(Any, self.family.norm).attn_norm), submodule(layer, self.circuit.mlp_norm)

    def _qkv_weights(self, l: int) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """``[(W [n, d, dh], b [n, dh] | None)]`` for q (n = heads), k and v (n = kv groups)."""
        attn: Any = self.adapter.attn_modules[l]
        H, KV, dh = self.H, self.KV, self.dh
        qkv = self.family.qkv
        if qkv == "c_attn":  # Conv1D: y = x W + b, W [d, 3d]
            w, b = attn.c_attn.weight, attn.c_attn.bias
            d = w.shape[0]
            return [
                (w[:, i * d : (i + 1) * d].reshape(d, H, dh).permute(1, 0, 2), b[i * d : (i + 1) * d].reshape(H, dh))
                for i in range(3)
            ]

        def lin(w: torch.Tensor, b: torch.Tensor | None, n: int):
            return w.reshape(n, dh, -1).transpose(1, 2), (b.reshape(n, dh) if b is not None else None)

        if qkv != "q_proj":  # one fused linear (Phi-3's qkv_proj, ModernBERT's Wqkv): rows [q (H·dh), k, v (KV·dh)]
            fused = getattr(attn, qkv)
            w, b = fused.weight, fused.bias
            cuts = [0, H * dh, (H + KV) * dh, (H + 2 * KV) * dh]
            return [
                lin(w[cuts[i] : cuts[i + 1]], b[cuts[i] : cuts[i + 1]] if b is not None else None, n)
                for i, n in enumerate((H, KV, KV))
            ]
        return [lin(m.weight, m.bias, n) for m, n in ((attn.q_proj, H), (attn.k_proj, KV), (attn.v_proj, KV))]

    def rotary(self, x: torch.Tensor, l: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Layer ``l``'s cos, sin ``[s, r]`` (r rotary dimensions of a head), or None (no RoPE: GPT-2)."""
        if not self.family.rotary:
            return None
        pos = torch.arange(x.shape[1], device=x.device)[None]
        rot = self.base.rotary_emb
        if "layer_type" in inspect.signature(rot.forward).parameters:  # per layer type (ModernBERT's global, local)
            cos, sin = rot(x, pos, self.layers[l].attention_type)
        else:
            cos, sin = rot(x, pos)
        return cos[0], sin[0]

    def allowed(self, l: int, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """``[b, query, key]`` bool: which keys layer ``l``'s queries see (padding keys never)."""
        s = x.shape[1]
        i = torch.arange(s, device=x.device)
        if self.family.bidirectional:  # local layers: the window transformers' own mask builder draws
            from transformers import masking_utils

            build = (
                masking_utils.create_bidirectional_sliding_window_mask
                if self.layers[l].attention_type == "sliding_attention"
                else masking_utils.create_bidirectional_mask
            )
            m = build(config=self.adapter.hf_model.config, inputs_embeds=x, attention_mask=key_mask)
            if m is None:
                return key_mask.bool()[:, None, :].expand(-1, s, -1)
            m = m[:, 0]
            return (m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min / 2) & key_mask.bool()[:, None, :]
        allowed = (i[None, :] <= i[:, None])[None] & key_mask.bool()[:, None, :]
        w = sliding_window(self.adapter, l)
        if w:
            allowed = allowed & (i[None, :] > i[:, None] - int(w))[None]
        return allowed

    @staticmethod
    def _rope(x: torch.Tensor, cs: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """RoPE on ``x`` ``[b, s, n, dh]`` (the first r dimensions rotate, the rest pass: partial RoPE)."""
        if cs is None:
            return x
        cos, sin = cs[0][None, :, None].to(x.dtype), cs[1][None, :, None].to(x.dtype)
        r = cos.shape[-1]
        xr, xp = x[..., :r], x[..., r:]
        h = r // 2
        return torch.cat((xr * cos + torch.cat((-xr[..., h:], xr[..., :h]), -1) * sin, xp), -1)

    def attention(
        self,
        l: int,
        xq: torch.Tensor,
        xk: torch.Tensor,
        xv: torch.Tensor,
        allowed: torch.Tensor,
        cs: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        """Layer ``l``'s head outputs ``z_h W_O,h`` ``[b, s, H, d]`` from its readers' inputs: ``xq``
        ``[b, s, H, d]`` (one per head), ``xk``, ``xv`` ``[b, s, KV, d]`` (one per group). Grouped
        attention runs on ``[b, KV, heads per group, ...]``: keys and values are never repeated."""
        q, k = self.queries_keys(l, xq, xk, cs)
        probs = self.pattern(l, q, k, allowed)
        v = self._value(l, xv)
        b, s = q.shape[:2]
        z = torch.einsum("bkgqs,bskd->bqkgd", probs, v).reshape(b, s, self.H, self.dh)
        wo = output_matrix(self.adapter.o_proj_modules[l], self.H)  # [H, dh, d]
        return torch.einsum("bshe,hed->bshd", z, wo.to(z.dtype))

    def _value(self, l: int, xv: torch.Tensor) -> torch.Tensor:
        ln1, _ = self._norms(l)
        _, _, (wv, bv) = self._qkv_weights(l)
        return self._proj(ln1, xv, wv, bv)  # [b, s, KV, dh]

    def queries_keys(
        self, l: int, xq: torch.Tensor, xk: torch.Tensor, cs: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``l``'s queries ``[b, s, H, dh]`` and keys ``[b, s, KV, dh]`` (norm, projection, Qwen3's
        per-head norm, RoPE) from the q and k readers' inputs."""
        ln1, _ = self._norms(l)
        attn: Any = self.adapter.attn_modules[l]
        (wq, bq), (wk, bk), _ = self._qkv_weights(l)
        q, k = self._proj(ln1, xq, wq, bq), self._proj(ln1, xk, wk, bk)
        if getattr(attn, "q_norm", None) is not None:  # Qwen3: RMSNorm over each head's d_head
            q, k = attn.q_norm(q), attn.k_norm(k)
        return self._rope(q, cs), self._rope(k, cs)

    @staticmethod
    def _proj(ln: nn.Module, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        y = torch.einsum("bsnd,nde->bsne", ln(x), w.to(x.dtype))
        return y + b.to(x.dtype) if b is not None else y

    def pattern(self, l: int, q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """Attention probabilities ``[b, KV, G, query, key]`` from queries and keys."""
        attn: Any = self.adapter.attn_modules[l]
        b, s = q.shape[:2]
        qg = q.reshape(b, s, self.KV, self.H // self.KV, self.dh)
        scale = getattr(attn, "scaling", None)
        scale = float(scale) if scale is not None else self.dh**-0.5
        scores = torch.einsum("bqkgd,bskd->bkgqs", qg, k) * scale
        scores = scores.masked_fill(~allowed[:, None, None], torch.finfo(scores.dtype).min)
        return torch.softmax(scores, -1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(q.dtype)

    def transformed_values(self, l: int, xv: torch.Tensor) -> torch.Tensor:
        """``f_h(x_j) = v_j W_O,h`` ``[b, s, KV, G, d]``: each key's value vector (with b_V) through each
        head's output projection (a group's value shared by its heads)."""
        v = self._value(l, xv)
        wo = output_matrix(self.adapter.o_proj_modules[l], self.H).to(v.dtype)  # [H, dh, d]
        return torch.einsum("bskd,kgde->bskge", v, wo.reshape(self.KV, self.H // self.KV, self.dh, -1))

    def attention_parts(
        self,
        l: int,
        xq: torch.Tensor,
        xk: torch.Tensor,
        xv: torch.Tensor,
        allowed: torch.Tensor,
        cs: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(probs [b, KV, G, query, key], f [b, s, KV, G, d])``: a head's output at query i is
        ``Σ_j probs[i, j] f[j]``."""
        q, k = self.queries_keys(l, xq, xk, cs)
        return self.pattern(l, q, k, allowed), self.transformed_values(l, xv)

    def out_bias(self, l: int) -> torch.Tensor | None:
        """``b_O`` of layer ``l`` (a constant in every reader after it), or None."""
        return cast(Any, self.adapter.o_proj_modules[l]).bias

    # -- MLP and readout ---------------------------------------------------------------------------
    def mlp(self, l: int, x: torch.Tensor) -> torch.Tensor:
        _, ln2 = self._norms(l)
        return self.layers[l].mlp(ln2(x))

    def mlp_nodes(self, l: int, x: torch.Tensor) -> torch.Tensor:
        """Layer ``l``'s MLP writers ``[b, s, W, d]`` from its MLP readers' inputs ``x`` ``[b, s, R, d]``: the
        MLP's output (R = W = 1), or with expert nodes each expert's routed, weighted output and the shared
        expert's gated output (:meth:`experts`)."""
        if self.graph.experts and self.graph.experts[l]:
            return self.experts(l, x)
        return self.mlp(l, x[:, :, 0])[:, :, None]

    def experts(self, l: int, x: torch.Tensor) -> torch.Tensor:
        """Expert nodes ``[b, s, E (+ 1), d]`` from the router's input ``x[:, :, 0]``, expert e's ``x[:, :, 1 + e]``
        and the shared expert's ``x[:, :, -1]`` (each through the MLP's norm). The router's own logits, routed by
        the family's rule (:func:`streetlamp.models.moe.route`) with the softmax in float32 at least (float64 in a
        float64 model: the router's own rounds to float32, which would swamp a float64 finite difference); expert
        e's output is the experts module's own forward on the tokens routed to it, times their weight (zero
        elsewhere; its gradient flows to both the expert's input and, through the weight, the router's); the
        shared expert's is ``sigmoid(shared_expert_gate(x)) · shared_expert(x)`` (Qwen2-MoE)."""
        from ...models.moe import route

        spec = cast(Any, self.family.experts)
        layer = self.layers[l]
        _, ln2 = self._norms(l)
        router: Any = submodule(layer, spec.router)
        experts: Any = submodule(layer, spec.experts)
        E = self.graph.experts[l]
        b, s, _, d = x.shape
        xr = ln2(x[:, :, 0]).reshape(b * s, d)
        logits = router(xr)[0]
        top_k = int(getattr(router, "top_k", 0) or self.adapter.hf_model.config.num_experts_per_tok)
        renorm = bool(getattr(router, "norm_topk_prob", True))
        weights, idx = route(logits, top_k, spec.rule, renorm, torch.promote_types(logits.dtype, torch.float32))
        weights = weights.to(x.dtype)
        own = type(experts).forward.__get__(experts)  # the class's forward (not a site hook's stand-in)
        outs = []
        for e in range(E):
            slot, tok = torch.where(idx.t() == e)  # the module's order: by top-k slot, then token
            col = x.new_zeros(b * s, d)
            if tok.numel():
                xe = ln2(x[:, :, 1 + e]).reshape(b * s, d)[tok]
                ids = torch.full((tok.numel(), 1), e, dtype=idx.dtype, device=idx.device)
                col = col.index_add(0, tok, own(xe, ids, weights[tok, slot][:, None]).to(col.dtype))
            outs.append(col)
        if self.graph.shared and self.graph.shared[l]:
            block: Any = submodule(layer, spec.block)
            xs = ln2(x[:, :, -1]).reshape(b * s, d)
            out = block.shared_expert(xs)
            gate = getattr(block, "shared_expert_gate", None)
            outs.append(torch.sigmoid(gate(xs)) * out if gate is not None else out)
        return torch.stack(outs, 1).reshape(b, s, len(outs), d)

    def readout(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """Explained logits ``[b, n_outputs]`` from the logits reader's input ``x`` ``[b, s, d]``:
        the final norm and the LM head (or a decoder classifier's score head) at each row's last real
        token; a pooled readout (ModernBERT): the final norm, its pooling ([CLS] or the mean over real
        tokens), head and classifier."""
        hf: Any = self.adapter.hf_model
        norm = submodule(self.base, self.circuit.final_norm)
        if self.circuit.readout == "pooled":
            h = norm(x)
            if hf.config.classifier_pooling == "cls":
                h = h[:, 0]
            else:
                km = key_mask.to(h.dtype)[:, :, None]
                h = (h * km).sum(1) / km.sum(1)
            return hf.classifier(hf.head(h))
        last = key_mask.sum(1) - 1
        h = norm(x[torch.arange(x.shape[0], device=x.device), last])
        head = hf.score if self.adapter.kind.labels else hf.get_output_embeddings()
        return head(h)
