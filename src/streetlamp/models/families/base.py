"""The facts of one architecture family, as one frozen object.

A :class:`Family` holds everything streetlamp knows about an architecture that the Hugging Face
model does not say itself: where the modules are (paths relative to ``model.base_model``), where the
norm around the attention block sits, how the residual stream is read out (lenses), whether the MLP
is gated, the RMSNorm gain offset, whether AttnLRP's rules cover it (or why not), the special-token
layout of its published tokenizer, its extra hooks and the recipe of its tiny random model. The
registry is :data:`streetlamp.models.families.FAMILIES`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from torch import nn
    from torch.utils.hooks import RemovableHandle

    from ..trace import Session

# Sliding-window size of the tiny Mistral and Gemma configs (and ModernBERT's local layers): shorter than
# the test texts, so the window mask matters (a 4-token window lets query i see keys i-3 .. i).
TINY_WINDOW = 4
# why a family has no AttnLRP rules, unless its file says more
NO_RULES_YET = "its norms, q/k norms or fused gates have no rule yet: conservation fails there"


@dataclass(frozen=True)
class NormPlacement:
    """``placement``: where the norm around the attention block sits (**post**-LN ``LN(x + Attn(x))``,
    **pre**-LN ``x + Attn(LN(x))``, **sandwich** ``x + N(Attn(LN(x)))``); ``attn_norm``: its path relative
    to a layer module (applied to ``x + Attn`` when post-LN, to ``x`` when pre-LN, to the attention output
    for sandwich); ``kind``: ``layernorm`` (mean-centred, gamma, beta) or ``rmsnorm`` (gamma only)."""

    placement: Literal["post", "pre", "sandwich"]
    attn_norm: str
    kind: Literal["layernorm", "rmsnorm", "rmsnorm_1p"]  # rmsnorm_1p: Gemma's gain (1 + w)


@dataclass(frozen=True)
class Readout:
    """How a pre-norm causal LM's residual stream is read out (lenses, direct logit and QK attribution).

    Module paths of the norms around the residual stream (final norm relative to the base model, the
    others relative to a layer); ``attn_out`` / ``mlp_out``: Gemma's sandwich norms, applied to the
    attention / MLP output before it joins the residual stream. ``qkv``: how queries and keys are
    projected (``q_proj``: separate ``q_proj`` / ``k_proj``; ``qkv_proj``: Phi-3's fused rows
    ``[q, k, v]``; ``c_attn``: GPT-2's fused Conv1D); ``rotary``: RoPE applied to them."""

    final_norm: str
    attn_in: str
    attn_out: str | None = None
    mlp_out: str | None = None
    qkv: Literal["q_proj", "qkv_proj", "c_attn"] = "q_proj"
    rotary: bool = True


@dataclass(frozen=True)
class SpecialTokens:
    """The special-token layout of a family's published tokenizer: which of bos/eos/pad/unk/mask exist
    (role -> token string) and whether the tokenizer prepends BOS. The tiny tokenizer copies it, so the
    methods' fallbacks (a [MASK] stand-in, the pad token, BOS as the empty context) run as on the real
    models. A family without one gets the generic tiny layout (``[CLS] text [SEP]`` for classifiers)."""

    names: Mapping[str, str]
    prepend_bos: bool = False


@dataclass(frozen=True)
class TinySpec:
    """The family's tiny random model (tests, examples): ``kind`` (``classifier`` or ``causal_lm``) and
    ``build(tokenizer, layers, heads, d_model)`` -> an untrained ``PreTrainedModel`` (seeded by the
    caller). ``tokenizer``: the family's own stand-in for a tokenizer (ViT: its image processor); by
    default the word-level tokenizer with the family's :class:`SpecialTokens`."""

    kind: Literal["classifier", "causal_lm"]
    build: Callable[[Any, int, int, int], Any]
    tokenizer: Callable[[], Any] | None = None


@dataclass(frozen=True)
class Experts:
    """A mixture-of-experts MLP (paths relative to a layer): ``block`` (the sparse MLP block: its output is
    ``mlp.out``), ``router`` (returns ``(logits [token, expert], top-k weights, top-k indices)``), ``experts``
    (the fused experts, called as ``experts(hidden, indices, weights)``), ``shared_expert`` (Qwen-MoE's
    always-on expert, gated by a sigmoid). ``rule``: how the router turns logits into weights:
    ``softmax_topk`` (softmax over every expert, the top k kept, renormalised where the router's
    ``norm_topk_prob`` says so or it has none: Mixtral) or ``topk_softmax`` (the top k logits, then a softmax
    over them: gpt-oss)."""

    block: str = "mlp"
    router: str = "mlp.gate"
    experts: str = "mlp.experts"
    shared_expert: str | None = None
    rule: Literal["softmax_topk", "topk_softmax"] = "softmax_topk"


@dataclass(frozen=True)
class Family:
    """Every fact streetlamp keeps about one architecture family; module paths relative to
    ``model.base_model`` (``o_proj``, ``mlp_out``, ``attn`` relative to a layer)."""

    name: str  # the config's model_type
    layers: str
    attn: str  # the module that calls the attention function
    o_proj: str  # relative to a layer
    mlp_out: str  # relative to a layer
    embed: str  # token-embedding lookup, relative to the base model
    # the norm around the attention block (norm, ALTI, value zeroing); None: no decomposition
    norm: NormPlacement | None = None
    # pre-norm causal LMs: the residual-stream readout (lenses); None: lenses do not apply
    readout: Readout | None = None
    gated_mlp: bool = False  # act(gate) * up before the MLP's last linear (AttnLRP halves its gradient)
    norm_offset: float = 0.0  # 1.0 where RMSNorm multiplies by (1 + w) (Gemma; q/k norms included)
    # None: AttnLRP's rules cover the family (its conservation test passes); else why it is refused
    attnlrp_refusal: str | None = NO_RULES_YET
    # (module whose output enters an activation applied as a plain function, module whose input is its
    # output), paths relative to the Hugging Face model: AttnLRP's identity rule reaches it through them
    functional_activations: tuple[tuple[str, str], ...] = ()
    reads_cls: bool = False  # a classifier reads position 0 ([CLS]); else the last token
    reserved_positions: int = 0  # position slots never usable (RoBERTa numbers from padding_idx + 1)
    specials: SpecialTokens | None = None
    modality: Literal["text", "image"] = "text"
    # extra hooks: ``embed_hook(session)`` -> the ``embed`` site's forward hook on the embedding module
    # (registered with_kwargs=True; ViT's patch embedding, before positions), and
    # ``attention_hooks(session, layer, attn_module)`` -> the handles exposing the attention sites of a
    # family that computes attention in its own module (DeBERTa's disentangled attention with
    # relative-position scores), not through ALL_ATTENTION_FUNCTIONS (so ours is not registered for it)
    embed_hook: Callable[[Session], Callable] | None = field(default=None, compare=False)
    attention_hooks: Callable[[Session, int, nn.Module], list[RemovableHandle]] | None = field(
        default=None, compare=False
    )
    tiny: TinySpec | None = field(default=None, compare=False)
    experts: Experts | None = None  # a mixture-of-experts MLP: router and expert sites (models/moe.py)

    @property
    def normed_attention_output(self) -> bool:
        """Gemma 2/3's sandwich norms RMS-normalise a layer's attention output before the residual add: the
        output is then unchanged when all of a layer's attention is scaled by α > 0."""
        return self.norm is not None and self.norm.placement == "sandwich"

    @property
    def own_attention(self) -> bool:
        """The family computes attention inside its own module (sites from :attr:`attention_hooks`)."""
        return self.attention_hooks is not None


# -- shared pieces of the tiny configs -------------------------------------------------------------
def classifier_config(tok: Any) -> dict[str, Any]:
    """Config keywords every tiny classifier shares: the vocabulary and three labels."""
    return dict(
        vocab_size=len(tok),
        num_labels=3,
        id2label={0: "neg", 1: "neu", 2: "pos"},
        label2id={"neg": 0, "neu": 1, "pos": 2},
        pad_token_id=0,
    )


def decoder_config(tok: Any, layers: int, heads: int, d_model: int) -> dict[str, Any]:
    """Config keywords of the tiny modern decoders (Qwen, Mistral, Phi-3, Gemma): grouped-query keys
    (half as many key heads), untied embeddings, the tokenizer's special ids, and initializer_range 0.2
    (HF's default is 0.02): attention scores of order 1, so patterns are far from uniform and Gemma's
    soft-capping (tanh) is not a near-identity on them."""
    return dict(
        initializer_range=0.2,
        vocab_size=len(tok),
        hidden_size=d_model,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        intermediate_size=2 * d_model,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
