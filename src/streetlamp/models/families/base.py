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

from ..kinds import ModelKind, kind_named

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
    attention / MLP output before it joins the residual stream. How queries and keys are projected and
    rotated is the family's :attr:`Family.qkv` and :attr:`Family.rotary`."""

    final_norm: str
    attn_in: str
    attn_out: str | None = None
    mlp_out: str | None = None


# How a layer projects queries, keys and values: ``q_proj``: separate ``q_proj`` / ``k_proj`` / ``v_proj``
# linears; ``qkv_proj`` (Phi-3) and ``Wqkv`` (ModernBERT): one fused linear of that name whose rows are
# ``[q (heads x d_head), k (kv heads x d_head), v (kv heads x d_head)]``; ``c_attn``: GPT-2's fused Conv1D
# (``y = x W + b``, ``W`` ``[d, 3d]``, columns ``[q, k, v]``).
QKV = Literal["q_proj", "qkv_proj", "Wqkv", "c_attn"]


@dataclass(frozen=True)
class Circuit:
    """What the circuit engine (``interventions/circuits/blocks.py``) reads to run a pre-norm family's
    forward piece by piece, besides the facts every engine reads (:attr:`Family.norm`'s ``attn_norm``,
    :attr:`Family.qkv`, :attr:`Family.rotary`, :attr:`Family.bidirectional`): a family with one is
    accepted by ``circuit``, whose test checks its forward against the model's own.

    ``mlp_norm``: the norm before the MLP (relative to a layer); ``final_norm``: relative to the base
    model; ``embeddings``: the module whose output is the ``embed`` writer when it does more than the token
    lookup (ModernBERT's embedding norm), relative to the base model, else None (the ``embed`` lookup);
    ``positions``: learned absolute positions added to the lookup (GPT-2's ``wpe``), or None;
    ``readout``: ``last``: the final norm at each row's last real token, then the LM head (the score head of
    a sequence classifier); ``pooled``: the final norm, the classifier's pooling (``config.classifier_pooling``:
    [CLS] or the mean over real tokens), then its ``head`` and ``classifier`` (ModernBERT)."""

    mlp_norm: str
    final_norm: str
    embeddings: str | None = None
    positions: str | None = None
    readout: Literal["last", "pooled"] = "last"


@dataclass(frozen=True)
class SpecialTokens:
    """The special-token layout of a family's published tokenizer: which of bos/eos/pad/unk/mask exist
    (role -> token string) and whether the tokenizer prepends BOS, or the ``template`` it wraps a text in
    (``$A`` the text: T5's ``$A </s>``, BART's ``<s> $A </s>``). The tiny tokenizer copies it, so the
    methods' fallbacks (a [MASK] stand-in, the pad token, BOS as the empty context) run as on the real
    models. A family without one gets the generic tiny layout (``[CLS] text [SEP]`` for classifiers)."""

    names: Mapping[str, str]
    prepend_bos: bool = False
    template: str | None = None


@dataclass(frozen=True)
class TinySpec:
    """The family's tiny random model (tests, examples): its model ``kind`` (a name in
    :data:`~streetlamp.models.kinds.KINDS`, held as the kind object) and ``build(tokenizer, layers, heads,
    d_model)`` -> an untrained ``PreTrainedModel`` (seeded by the caller). ``tokenizer``: the family's own
    stand-in for a tokenizer (ViT: its image processor); by default the word-level tokenizer with the
    family's :class:`SpecialTokens`."""

    kind: ModelKind
    build: Callable[[Any, int, int, int], Any]
    tokenizer: Callable[[], Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", kind_named(self.kind))


@dataclass(frozen=True)
class EncoderDecoder:
    """The two stacks of an encoder-decoder (T5, BART), module paths relative to its
    ``*ForConditionalGeneration`` model: each stack's layers, the self-attention (relative to a layer of
    either stack) and its output projection, the decoder's cross-attention and its output projection, each
    stack's MLP output linear and token embedding. Sites: :mod:`streetlamp.models.seq2seq`."""

    encoder_layers: str
    decoder_layers: str
    self_attn: str
    self_o: str
    cross_attn: str
    cross_o: str
    encoder_mlp_out: str
    decoder_mlp_out: str
    encoder_embed: str
    decoder_embed: str


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
    ``model.base_model`` (``o_proj``, ``mlp_out``, ``attn`` relative to a layer). An encoder-decoder
    (``encoder_decoder`` set) loads as the encoder-decoder kind only, through its own adapter
    (:class:`~streetlamp.models.seq2seq.Seq2SeqAdapter`); its single-stack paths name its encoder's
    modules, relative to the model, and no single-stack engine reads them."""

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
    qkv: QKV = "q_proj"  # how a layer projects queries, keys and values (see QKV)
    rotary: bool = False  # rotary position embeddings on queries and keys (RoPE; partial RoPE allowed)
    bidirectional: bool = False  # every position attends to every (unpadded) position: an encoder's attention
    # the circuit engine's wiring; None: circuit refuses the family (the reason from its norm placement)
    circuit: Circuit | None = None
    encoder_decoder: EncoderDecoder | None = None  # the two stacks of an encoder-decoder; None: one stack
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
    # the MLP block, relative to a layer: its input is the MLP's input (after a pre-norm family's pre-MLP norm)
    # and ``mlp_out`` its output; a transcoder (models/features.py) reads and writes there. None: the MLP is
    # split across modules around a post-norm (BERT), and transcoders are refused
    mlp: str | None = None

    @property
    def normed_attention_output(self) -> bool:
        """Gemma 2/3's sandwich norms RMS-normalise a layer's attention output before the residual add: the
        output is then unchanged when all of a layer's attention is scaled by α > 0."""
        return self.norm is not None and self.norm.placement == "sandwich"

    @property
    def stacks(self) -> int:
        """The stacks of layers a model of the family has (2: an encoder-decoder)."""
        return 1 if self.encoder_decoder is None else 2

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
