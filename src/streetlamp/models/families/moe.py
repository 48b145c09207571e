"""Mixture-of-experts decoders (transformers 5's fused experts): Mixtral, Qwen2-MoE (with its shared expert),
Qwen3-MoE (q/k norms), OLMoE (q/k norms over the full projections). Attention is Llama's (pre-RMSNorm, RoPE,
grouped-query keys); the MLP is a sparse block whose router and experts are sites of their own
(``layers.{l}.router.logits``, ``router.weights``, ``experts.out``, ``shared_expert.out``: models/moe.py), and
whose whole output is ``mlp.out``. AttnLRP has no rule for the routing yet. Real checkpoints load from a local
folder as every family does; none ships here."""

from __future__ import annotations

from typing import Any

from ..kinds import CAUSAL_LM
from .base import Experts, Family, SpecialTokens, TinySpec, decoder_config
from .llama import CIRCUIT, PRE_RMS, READOUT

MOE_REFUSAL = "the router's top-k selection and the experts' weighting have no AttnLRP rule yet"
PATHS: dict[str, Any] = dict(
    layers="layers", attn="self_attn", o_proj="self_attn.o_proj", mlp_out="mlp", mlp="mlp", embed="embed_tokens"
)
# the circuit engine runs Llama's attention and the sparse block itself (one MLP node, or with
# ``circuit --expert-nodes`` one node per expert: interventions/circuits/blocks.py); OLMoE (q/k norms over all
# heads together) and gpt-oss (attention sinks) are refused by it
MOE_LIKE: dict[str, Any] = dict(
    **PATHS, norm=PRE_RMS, readout=READOUT, rotary=True, gated_mlp=True, attnlrp_refusal=MOE_REFUSAL, circuit=CIRCUIT
)
# 4 experts, 2 per token: every token's choice matters and most experts see some tokens in a short text
TINY_EXPERTS, TINY_TOP_K = 4, 2


def _moe_config(tok: Any, layers: int, heads: int, d_model: int) -> dict[str, Any]:
    cfg = decoder_config(tok, layers, heads, d_model)
    return dict(cfg, num_experts_per_tok=TINY_TOP_K, router_jitter_noise=0.0)


def _tiny_mixtral(tok: Any, layers: int, heads: int, d_model: int) -> Any:
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(
        num_local_experts=TINY_EXPERTS, head_dim=d_model // heads, **_moe_config(tok, layers, heads, d_model)
    )
    return MixtralForCausalLM(cfg)


def _tiny_qwen2_moe(tok: Any, layers: int, heads: int, d_model: int) -> Any:
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    cfg = Qwen2MoeConfig(
        num_experts=TINY_EXPERTS,
        moe_intermediate_size=d_model,
        shared_expert_intermediate_size=2 * d_model,
        norm_topk_prob=False,  # Qwen1.5-MoE's default: the top-k probabilities are not renormalised
        **_moe_config(tok, layers, heads, d_model),
    )
    return Qwen2MoeForCausalLM(cfg)


def _tiny_qwen3_moe(tok: Any, layers: int, heads: int, d_model: int) -> Any:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(  # type: ignore[call-arg]  # head_dim is a config attribute the stubs omit
        num_experts=TINY_EXPERTS,
        moe_intermediate_size=d_model,
        head_dim=d_model // heads,
        norm_topk_prob=True,
        **_moe_config(tok, layers, heads, d_model),
    )
    return Qwen3MoeForCausalLM(cfg)


def _tiny_olmoe(tok: Any, layers: int, heads: int, d_model: int) -> Any:
    from transformers import OlmoeConfig, OlmoeForCausalLM

    cfg = OlmoeConfig(num_experts=TINY_EXPERTS, **_moe_config(tok, layers, heads, d_model))
    return OlmoeForCausalLM(cfg)


QWEN_SPECIALS = SpecialTokens({"eos": "<|endoftext|>", "pad": "<|endoftext|>"})
MIXTRAL = Family(
    "mixtral",
    **MOE_LIKE,
    experts=Experts(),
    specials=SpecialTokens({"bos": "<s>", "eos": "</s>", "unk": "<unk>"}, prepend_bos=True),
    tiny=TinySpec(CAUSAL_LM, _tiny_mixtral),
)
QWEN2_MOE = Family(
    "qwen2_moe",
    **MOE_LIKE,
    experts=Experts(shared_expert="mlp.shared_expert"),
    specials=QWEN_SPECIALS,
    tiny=TinySpec(CAUSAL_LM, _tiny_qwen2_moe),
)
QWEN3_MOE = Family(
    "qwen3_moe", **MOE_LIKE, experts=Experts(), specials=QWEN_SPECIALS, tiny=TinySpec(CAUSAL_LM, _tiny_qwen3_moe)
)
OLMOE = Family(
    "olmoe",
    # its q/k RMSNorms act over all heads' projections together (not per head, as Qwen3's), which the readout's
    # QK attribution does not model yet: no readout, so lenses and QK attribution refuse OLMoE in one line
    **{**MOE_LIKE, "readout": None, "circuit": None},
    experts=Experts(),
    specials=SpecialTokens({"eos": "<|endoftext|>", "pad": "<|padding|>"}),
    tiny=TinySpec(CAUSAL_LM, _tiny_olmoe),
)


def _tiny_gpt_oss(tok: Any, layers: int, heads: int, d_model: int) -> Any:
    from transformers import GptOssConfig, GptOssForCausalLM

    from .base import TINY_WINDOW

    kw = _moe_config(tok, layers, heads, d_model)
    cfg = GptOssConfig(
        num_local_experts=TINY_EXPERTS,
        head_dim=d_model // heads,
        sliding_window=TINY_WINDOW,
        layer_types=["sliding_attention" if l % 2 == 0 else "full_attention" for l in range(layers)],
        rope_parameters={"rope_type": "default", "rope_theta": 150000.0},  # no YaRN at a 64-token window
        **kw,
    )
    model = GptOssForCausalLM(cfg)
    import torch

    with torch.no_grad():  # the sinks start at 0 in transformers: give them sizes that matter
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)
    return model


# gpt-oss: learned attention sinks (one logit per head in every row's softmax), sliding-window layers alternating
# with full ones, a router that takes the top-k logits before its softmax, experts with biases and a clamped SwiGLU
GPT_OSS = Family(
    "gpt_oss",
    **{**MOE_LIKE, "circuit": None},
    experts=Experts(router="mlp.router", rule="topk_softmax"),
    specials=SpecialTokens({"eos": "<|return|>", "pad": "<|endoftext|>"}),
    tiny=TinySpec(CAUSAL_LM, _tiny_gpt_oss),
)
