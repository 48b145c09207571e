"""Encoder-decoder models (T5, BART): two stacks, three attention site families.

Sites (module paths: each encoder-decoder family's ``encoder_decoder`` stacks, :mod:`.families`; shapes as in :mod:`streetlamp.models.sites`):

=======================================  =====================================================================
name                                     what
=======================================  =====================================================================
``encoder.embed``                        source token embeddings ``[batch, src, d_model]`` (lookup output;
                                         BART's ``embed_scale`` included, positions not)
``decoder.embed``                        decoder-input token embeddings ``[batch, tgt, d_model]``
``encoder.layers.{l}.attn.*``            encoder self-attention: ``v``, ``pattern`` ``[batch, head, src, src]``,
                                         ``z``, ``out`` (after W_O); bidirectional over the source
``decoder.layers.{l}.self_attn.*``       decoder self-attention, causal over the target: ``pattern``
                                         ``[batch, head, tgt, tgt]``
``decoder.layers.{l}.cross_attn.*``      cross-attention: target queries, source keys and values: ``pattern``
                                         ``[batch, head, tgt, src]``, ``v`` ``[batch, src, head, d_head]``
``{encoder,decoder}.layers.{l}.mlp.out`` the feed-forward block's last linear
``{encoder,decoder}.layers.{l}.resid_post``  hidden state leaving layer l (before the stack's final norm)
=======================================  =====================================================================

T5's relative position bias (computed by the first layer of each stack and shared by the others) is
added to the scores inside streetlamp's attention function, which also honours T5's missing 1/sqrt(d)
scaling; cross-attention has no position bias. The model runs from embeddings (``inputs_embeds`` and
``decoder_inputs_embeds``), so gradients over source and target tokens are gradients over the two
``embed`` sites.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..errors import StreetlampError
from .adapter import ModelAdapter, eos_ids, route_attention, submodule
from .families import FAMILIES, EncoderDecoder, FamilyTable
from .kinds import ENCODER_DECODER
from .trace import Edit, Session

# model type -> its two stacks (the ``encoder_decoder`` of each encoder-decoder family object)
SEQ2SEQ_FAMILIES: FamilyTable[EncoderDecoder] = FamilyTable(lambda f: f.encoder_decoder)
ATTN_SITES = ("v", "pattern", "z", "out")
ENCODER_SITES = tuple(f"attn.{s}" for s in ATTN_SITES) + ("mlp.out", "resid_post")
DECODER_SITES = tuple(f"{k}.{s}" for k in ("self_attn", "cross_attn") for s in ATTN_SITES) + ("mlp.out", "resid_post")
# what each attention site family is, for docs, manifests and errors
SITE_FAMILIES = {
    "encoder.attn": "encoder self-attention (source over source, bidirectional)",
    "decoder.self_attn": "decoder self-attention (target over earlier target tokens, causal)",
    "decoder.cross_attn": "cross-attention (target over source)",
}
# the methods explain-generation runs on an encoder-decoder: those declaring the encoder-decoder kind
# (methods.registry.methods_of_kind("seq2seq"), each written once over methods.views.Seq2SeqView);
# named here for the one-line refusal, and checked against the registry by tests/methods/test_views.py
SEQ2SEQ_METHODS = (
    "attention",
    "saliency",
    "gradient_x_input",
    "integrated_gradients",
    "occlusion",
    "shap",
    "lime",
)
_ONE_STACK = (
    "it composes one stack's layers from the input up (I + A per layer), and an encoder-decoder has two "
    "stacks joined by cross-attention, for which streetlamp has no stated and tested rule"
)
_WHY_NOT: dict[str, str] = {
    "rollout": _ONE_STACK,
    "flow": _ONE_STACK,
    "gradient_rollout": _ONE_STACK,
    "alti": "it decomposes one stack's residual stream layer by layer (no rule for the cross-attention hop yet)",
    "norm": "it decomposes one stack's attention blocks (no rule for the cross-attention hop yet)",
    "value_zeroing": "it zeroes values in one stack (no rule for the cross-attention hop yet)",
    "attnlrp": "its relevance rules cover single-stack families only",
}


def seq2seq_site_names(n_encoder: int, n_decoder: int) -> list[str]:
    """Every site of an encoder-decoder, in forward order (encoder first)."""
    return (
        ["encoder.embed"]
        + [f"encoder.layers.{l}.{s}" for l in range(n_encoder) for s in ENCODER_SITES]
        + ["decoder.embed"]
        + [f"decoder.layers.{l}.{s}" for l in range(n_decoder) for s in DECODER_SITES]
    )


def refusal(method: str, model: str) -> str:
    """One line: why ``method`` does not run on the encoder-decoder ``model``."""
    why = _WHY_NOT.get(
        method, "it runs on one token sequence through one stack (not yet built for a source and a target)"
    )
    return (
        f"method {method!r} does not apply to the encoder-decoder {model}: {why}; "
        f"explain-generation runs {', '.join(SEQ2SEQ_METHODS)} on it"
    )


def require_one_stack(adapter: ModelAdapter, command: str) -> None:
    """One line for a command that reads one stack of layers when given an encoder-decoder."""
    if adapter.kind.stacks > 1:
        raise StreetlampError(
            f"{command} reads one stack of layers; {adapter.name} is an encoder-decoder ({adapter.family.name}): "
            "only explain-generation runs on it"
        )


@dataclass
class Seq2SeqForward:
    logits: torch.Tensor  # [batch, tgt, vocab]: the next-token logits after each decoder input
    cache: dict[str, torch.Tensor]


class Seq2SeqSession(Session):
    """A :class:`Session` whose sites are those of :func:`seq2seq_site_names`."""

    def __init__(
        self,
        adapter: Seq2SeqAdapter,
        record: Iterable[str] = (),
        edit: dict[str, Edit] | None = None,
        keep_grad: bool = False,
    ) -> None:
        super().__init__(adapter, record, edit, keep_grad)
        self._sites: dict[int, tuple[int, str]] = {}
        for l, layer in enumerate(adapter.encoder_layers):
            self._sites[id(submodule(layer, adapter.seq2seq.self_attn))] = (l, f"encoder.layers.{l}.attn")
        for l, layer in enumerate(adapter.decoder_layers):
            self._sites[id(submodule(layer, adapter.seq2seq.self_attn))] = (l, f"decoder.layers.{l}.self_attn")
            self._sites[id(submodule(layer, adapter.seq2seq.cross_attn))] = (l, f"decoder.layers.{l}.cross_attn")

    def attn_site(self, module: nn.Module) -> tuple[int, str] | None:
        return self._sites.get(id(module))

    def note_allowed(self, allowed: torch.Tensor, batch: int, layer: int, prefix: str = "") -> None:
        """Not kept: the source is bidirectional, the target causal and cross-attention full (unpadded rows)."""

    def __enter__(self) -> Seq2SeqSession:
        a = cast(Seq2SeqAdapter, self.adapter)
        f = a.seq2seq
        try:
            for stack, layers in (("encoder", a.encoder_layers), ("decoder", a.decoder_layers)):
                mlp = f.encoder_mlp_out if stack == "encoder" else f.decoder_mlp_out
                hooks = {
                    "resid_post": layer_list(layers, ""),
                    "mlp.out": layer_list(layers, mlp),
                    ("attn.out" if stack == "encoder" else "self_attn.out"): layer_list(layers, f.self_o),
                }
                if stack == "decoder":
                    hooks["cross_attn.out"] = layer_list(layers, f.cross_o)
                for site, modules in hooks.items():
                    for l, m in enumerate(modules):
                        name = f"{stack}.layers.{l}.{site}"
                        if self._wants(name):
                            self._handles.append(m.register_forward_hook(self._out_hook(name)))
            super().__enter__()
        except BaseException:
            self._remove()
            raise
        return self


def layer_list(layers: list[nn.Module], path: str) -> list[nn.Module]:
    return [submodule(l, path) if path else l for l in layers]


class Seq2SeqAdapter(ModelAdapter):
    """A T5 or BART ``*ForConditionalGeneration``: sites by stack, forward from embeddings, greedy decoding.

    It shares :class:`ModelAdapter`'s token facts (special tokens, labels, scores, devices); the
    single-stack passes (``forward``, ``logits_at``, ``prefix_forward``) refuse in one line."""

    def __init__(
        self, hf_model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, name: str, source: str = ""
    ) -> None:
        model_type = hf_model.config.model_type
        if model_type not in SEQ2SEQ_FAMILIES:
            raise StreetlampError(
                f"unsupported encoder-decoder {model_type!r}; supported: {', '.join(sorted(SEQ2SEQ_FAMILIES))}"
            )
        arch = type(hf_model).__name__
        if not arch.endswith("ForConditionalGeneration"):
            raise StreetlampError(
                f"unsupported architecture {arch}; encoder-decoders load as *ForConditionalGeneration"
            )
        self.family = FAMILIES[model_type]
        self.seq2seq = f = cast(EncoderDecoder, self.family.encoder_decoder)
        self.kind = ENCODER_DECODER
        self.modality = "text"
        route_attention(hf_model)
        hf_model.eval()
        self.hf_model, self.tokenizer, self.name, self.source = hf_model, tokenizer, name, source
        tokenizer.padding_side = "right"
        self.encoder_layers: list[nn.Module] = list(cast(nn.ModuleList, submodule(hf_model, f.encoder_layers)))
        self.decoder_layers: list[nn.Module] = list(cast(nn.ModuleList, submodule(hf_model, f.decoder_layers)))
        # the single-stack lists stay empty: no single-stack site exists on this model
        self.layer_modules, self.attn_modules, self.o_proj_modules, self.mlp_out_modules = [], [], [], []
        self.embed_module = submodule(hf_model, f.encoder_embed)
        self.decoder_embed_module = submodule(hf_model, f.decoder_embed)
        cfg: Any = hf_model.config
        self.n_encoder_layers, self.n_decoder_layers = len(self.encoder_layers), len(self.decoder_layers)
        self.n_layers = self.n_encoder_layers + self.n_decoder_layers  # for memory estimates
        self.n_heads = int(cfg.num_attention_heads)
        self.n_decoder_heads = int(getattr(cfg, "decoder_attention_heads", None) or self.n_heads)
        self.n_kv_heads = self.n_heads
        self.d_model = int(cfg.hidden_size)
        self.site_names = seq2seq_site_names(self.n_encoder_layers, self.n_decoder_layers)
        # BART's learned positions bound both sides; T5's relative buckets do not (512: its training length)
        self.max_positions = int(getattr(cfg, "max_position_embeddings", None) or 512)
        # the config's, else the pad token (T5's convention, what transformers' T5 falls back to)
        start = getattr(cfg, "decoder_start_token_id", None)
        start = start if start is not None else getattr(cfg, "pad_token_id", None)
        if start is None:
            raise StreetlampError(f"{name}: the config has no decoder_start_token_id (nor a pad token to start with)")
        self.decoder_start_token_id = int(start)
        self.eos_token_ids = eos_ids(hf_model, tokenizer)

    def describe(self) -> dict:
        d = super().describe()
        d.update(
            encoder_layers=self.n_encoder_layers,
            decoder_layers=self.n_decoder_layers,
            decoder_heads=self.n_decoder_heads,
            site_families=SITE_FAMILIES,
        )
        return d

    def session(
        self, record: Iterable[str] = (), edit: dict[str, Edit] | None = None, keep_grad: bool = False
    ) -> Seq2SeqSession:
        return Seq2SeqSession(self, record=record, edit=edit, keep_grad=keep_grad)

    # -- running --------------------------------------------------------------------------------
    def embed(self, ids: torch.Tensor, decoder: bool = False) -> torch.Tensor:
        """The ``encoder.embed`` / ``decoder.embed`` site of token ids ``[..., pos]``."""
        m = self.decoder_embed_module if decoder else self.embed_module
        return m(ids.to(self.device))

    def decoder_inputs(self, target: list[int]) -> torch.Tensor:
        """Teacher forcing: the decoder reads the start token then every target token but the last."""
        return torch.tensor([self.decoder_start_token_id] + [int(t) for t in target[:-1]], dtype=torch.long)

    def run(
        self,
        src_ids: torch.Tensor | None = None,
        tgt_ids: torch.Tensor | None = None,
        *,
        src_embeds: torch.Tensor | None = None,
        tgt_embeds: torch.Tensor | None = None,
        record: Iterable[str] = (),
        edit: dict[str, Edit] | None = None,
        keep_grad: bool = False,
        grad: bool = False,
    ) -> Seq2SeqForward:
        """Logits ``[batch, tgt, vocab]`` for unpadded source ``[batch, src]`` and decoder-input ``[batch, tgt]``
        rows (ids, or embeddings at the two ``embed`` sites), plus the recorded sites."""
        if (src_ids is None) == (src_embeds is None) or (tgt_ids is None) == (tgt_embeds is None):
            raise StreetlampError("give the source and the decoder inputs each as ids or as embeddings")
        with torch.set_grad_enabled(grad or keep_grad), self.session(record, edit, keep_grad) as s:
            es = src_embeds if src_embeds is not None else self.embed(cast(torch.Tensor, src_ids))
            et = tgt_embeds if tgt_embeds is not None else self.embed(cast(torch.Tensor, tgt_ids), decoder=True)
            es, et = s.site("encoder.embed", es), s.site("decoder.embed", et)
            out = self.hf_model(inputs_embeds=es, decoder_inputs_embeds=et, use_cache=False)
        return Seq2SeqForward(out.logits, s.cache)

    @torch.no_grad()
    def generate(
        self, prompt_ids: torch.Tensor, n_new: int, stop_at_eos: bool = True, kv_cache: bool = True
    ) -> list[int]:
        """Greedy decoding for the source ``prompt_ids`` ``[src]``: at most ``n_new`` target tokens, ending
        after the decoder's EOS (``</s>``, kept as the last token: it is what the model generated) when it
        comes first and ``stop_at_eos``, as Hugging Face's ``generate`` does. ``kv_cache`` is accepted for the
        base class's signature; the decoder reruns on the whole target each step."""
        if n_new < 1:
            raise StreetlampError(f"need at least one new token (got {n_new})")
        src = prompt_ids.view(1, -1)
        out: list[int] = []
        for _ in range(n_new):
            dec = self.decoder_inputs(out + [0])  # the last entry is never read
            out.append(int(self.run(src, dec.view(1, -1)).logits[0, -1].argmax()))
            if stop_at_eos and out[-1] in self.eos_token_ids:
                break
        return out

    def target_ids(self, text: str) -> list[int]:
        """A forced target text as ids, without special tokens; an error for text the tokenizer cannot encode."""
        ids = [int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"]]
        if not ids:
            raise StreetlampError(f"the target {text!r} has no tokens")
        unk = self.tokenizer.unk_token_id
        if unk is not None and unk in ids:
            raise StreetlampError(
                f"the target {text!r} has text this tokenizer cannot encode (it becomes the unknown token)"
            )
        return ids

    # -- single-stack passes ---------------------------------------------------------------------
    def _one_stack(self, what: str) -> StreetlampError:
        return StreetlampError(f"{what} runs one stack; {self.name} is an encoder-decoder: use Seq2SeqAdapter.run")

    def forward(self, *args: Any, **kwargs: Any) -> Any:  # noqa: D102
        raise self._one_stack("ModelAdapter.forward")

    def logits_at(self, *args: Any, **kwargs: Any) -> Any:  # noqa: D102
        raise self._one_stack("ModelAdapter.logits_at")

    def prefix_forward(self, *args: Any, **kwargs: Any) -> Any:  # noqa: D102
        raise self._one_stack("ModelAdapter.prefix_forward")
