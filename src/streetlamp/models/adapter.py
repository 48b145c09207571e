"""ModelAdapter: one object around a Hugging Face model that streetlamp methods talk to.

Methods never touch Hugging Face internals; they use :meth:`ModelAdapter.encode` /
:meth:`Inputs.from_ids` (the one way to build a batch), :meth:`ModelAdapter.forward` (logits of
the explained output plus recorded sites), :meth:`ModelAdapter.score`, and the model facts kept
here: the explained position, the structural special tokens, the replacement token, output labels,
the KV-cached prefix forward, logits at chosen positions and greedy generation.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..errors import StreetlampError, takes
from . import attention, readout
from .families import single_stack
from .features import FeatureSet
from .images import PatchVocabulary, looks_like_image_file, read_image, token_embeddings
from .kinds import CAUSAL_LM, CLASSIFIER, ModelKind
from .relevance import relevance_rules
from .sites import FAMILIES, Family, site_names, submodule
from .trace import Edit, Session

Modality = Literal["text", "image"]
Quantity = Literal["prob", "logit", "logprob", "kl_divergence"]
# ``kl_divergence``: F(x') = -KL(p(.|x) || p(.|x')) of the unedited input x, read only by the perturbation
# methods' scorer (methods/scorer.py), so that occlusion's F(x) - F(x') is the KL divergence itself.
KL = "kl_divergence"
# the pretraining document separator of GPT-2-style BPE vocabularies (see ModelAdapter.empty_context_token)
DOCUMENT_SEPARATOR = "<|endoftext|>"
# When the asked-for replacement token does not exist (causal LMs have no [MASK]), use the next one.
REPLACEMENT_FALLBACK = {"mask": ("mask", "unk", "pad", "eos"), "unk": ("unk", "pad", "eos"), "pad": ("pad", "eos")}


# The tokens a model uses for structure: never scored, perturbed or erased. [UNK] and [MASK] are not
# among them: an [UNK] stands for a real (unknown) piece of the text.
def eos_ids(hf_model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """The ids that end a greedy generation: the generation config's ``eos_token_id`` (an id or a list),
    else the model config's, else the tokenizer's EOS (T5 and BART: ``</s>``; SmolLM2-Instruct:
    ``<|im_end|>``)."""
    for src in (getattr(hf_model, "generation_config", None), hf_model.config):
        eos = getattr(src, "eos_token_id", None)
        if eos is not None:
            return frozenset(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))
    return frozenset([int(tokenizer.eos_token_id)]) if tokenizer.eos_token_id is not None else frozenset()


STRUCTURAL_SPECIALS = ("cls", "sep", "bos", "eos", "pad")


def at_least_float32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32, or float64 if it already is (half precision is upcast, double is kept)."""
    return t if t.dtype == torch.float64 else t.float()


def route_attention(hf_model: PreTrainedModel) -> None:
    """Route the model's attention through streetlamp's function, or refuse in one line."""
    hf_model.set_attn_implementation(attention.register())
    routed = getattr(hf_model.config, "_attn_implementation", None)
    if routed != attention.ATTN_IMPLEMENTATION:  # transformers only warns and keeps its own
        raise StreetlampError(
            f"{type(hf_model).__name__}'s attention cannot be routed through streetlamp's attention function (its "
            f"attention modules do not call ALL_ATTENTION_FUNCTIONS; transformers kept attn_implementation={routed!r}), "
            "so streetlamp could neither record nor edit it"
        )


@dataclass
class Inputs:
    """A tokenised, right-padded batch. Real tokens keep the positions they have when alone."""

    input_ids: torch.Tensor  # [batch, pos]
    attention_mask: torch.Tensor  # [batch, pos], 1 = real token
    tokens: list[list[str]]  # per text, real tokens only (tokenizer's own strings)
    labels: list[list[str]]  # per text, readable token labels for figures
    texts: list[str]
    truncated: list[bool] = field(default_factory=list)

    @property
    def lengths(self) -> list[int]:
        return [int(n) for n in self.attention_mask.sum(1)]

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @classmethod
    def from_ids(
        cls,
        adapter: ModelAdapter,
        rows: Sequence[Sequence[int] | torch.Tensor] | torch.Tensor,
        texts: Sequence[str] | None = None,
        truncated: Sequence[bool] | None = None,
        strings: bool = True,
    ) -> Inputs:
        """The one constructor from token ids (special tokens included as given): right-padded with the
        tokenizer's pad id. An empty row (erasure removed every token of a causal LM's prompt) becomes
        :meth:`ModelAdapter.empty_context_token`. ``strings=False`` leaves ``tokens``/``labels`` empty
        (for the many perturbed rows that only go through the model)."""
        rows = [r.tolist() if isinstance(r, torch.Tensor) else [int(t) for t in r] for r in rows]
        if not rows:
            raise StreetlampError("no token rows given")
        rows = [r if r else [adapter.empty_context_token()] for r in rows]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), adapter.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, : len(r)] = 1
        # the stubs say int | list[int] -> str | list[str]; a row (list or 1-d tensor) gives list[str]
        tokens = [
            cast(list[str], adapter.tokenizer.convert_ids_to_tokens(cast(list[int], r))) if strings else []
            for r in rows
        ]
        labels = [[adapter.token_label(t) for t in toks] for toks in tokens]
        return cls(
            ids,
            mask,
            tokens,
            labels,
            list(texts) if texts is not None else [""] * len(rows),
            list(truncated) if truncated is not None else [False] * len(rows),
        )

    def rows(self) -> list[list[int]]:
        """Each text's token ids (real tokens only, special tokens included)."""
        return [self.input_ids[b, :n].tolist() for b, n in enumerate(self.lengths)]

    def repeat(self, rows: int) -> Inputs:
        """``rows`` copies of a one-text batch (views, no copy of the ids)."""
        if len(self) != 1:
            raise ValueError("repeat needs a batch of one text")
        return Inputs(
            self.input_ids.expand(rows, -1),
            self.attention_mask.expand(rows, -1),
            self.tokens * rows,
            self.labels * rows,
            self.texts * rows,
            (self.truncated or [False]) * rows,
        )

    def select(self, idx: Sequence[int]) -> Inputs:
        ids = list(idx)
        width = max(self.lengths[i] for i in ids)
        return Inputs(
            self.input_ids[ids, :width],
            self.attention_mask[ids, :width],
            [self.tokens[i] for i in ids],
            [self.labels[i] for i in ids],
            [self.texts[i] for i in ids],
            [self.truncated[i] for i in ids] if self.truncated else [],
        )


@dataclass(frozen=True)
class Target:
    """What is explained: one output index (a class id or a vocabulary token id).

    ``index=None`` means the model's own prediction (argmax). ``contrast`` makes the explained
    scalar ``F = q(index) - q(contrast)``. ``quantity`` is the probability, logit or log-prob.
    For a causal LM the output is the distribution over the next token after the text.
    """

    index: int | None = None
    contrast: int | None = None
    quantity: Quantity = "prob"

    def describe(self, adapter: ModelAdapter, index: int) -> str:
        if self.quantity == KL:
            return "-KL(p(.|x) || p(.|x')), x the unedited input (the whole output distribution)"
        s = f"{self.quantity}({adapter.output_label(index)!r})"
        if self.contrast is not None:
            s += f" - {self.quantity}({adapter.output_label(self.contrast)!r})"
        return s


@dataclass
class Forward:
    logits: torch.Tensor  # [batch, n_outputs]: class logits, or next-token logits after the last real token
    cache: dict[str, torch.Tensor]


class ModelAdapter:
    """Wraps a Hugging Face classifier or causal LM of a supported family, or a ViT image classifier.

    For an image model pass its image processor as ``tokenizer``: the adapter wraps it in a
    :class:`~streetlamp.models.images.PatchVocabulary` (patches as tokens) and ``modality`` is ``image``.
    """

    def __init__(
        self, hf_model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | Any, name: str, source: str = ""
    ) -> None:
        model_type = hf_model.config.model_type
        if model_type not in FAMILIES:
            raise StreetlampError(f"unsupported model type {model_type!r}; supported: {', '.join(single_stack())}")
        self.family: Family = FAMILIES[model_type]
        if self.family.stacks > 1:
            raise StreetlampError(
                f"{model_type} is an encoder-decoder: it runs through Seq2SeqAdapter (streetlamp.load picks it)"
            )
        arch = type(hf_model).__name__
        self.modality: Modality = "text"
        # the kind (models/kinds.py) this class loads as; the encoder-decoders have their own adapter (seq2seq.py)
        kind = next((k for k in (CLASSIFIER, CAUSAL_LM) if k.loads(arch)), None)
        if kind is not None:
            self.kind: ModelKind = kind
            if arch.endswith("ForImageClassification"):
                self.modality = "image"
                if not isinstance(tokenizer, PatchVocabulary):  # an image processor; a vocabulary is shared as is
                    tokenizer = PatchVocabulary(tokenizer, hf_model.config)
        else:
            raise StreetlampError(
                f"unsupported architecture {arch}; supported: *ForSequenceClassification "
                "(bert, roberta, distilbert, gpt2, llama, ...), *ForCausalLM / GPT2LMHeadModel and "
                "ViTForImageClassification"
            )
        if not self.family.own_attention:  # DeBERTa-v2: hooks on its own module instead (models/deberta.py)
            route_attention(hf_model)
        if self.family.experts is not None:
            # the experts' reference loop (exact in any dtype, float64 included; models/moe.py calls it per expert)
            hf_model.set_experts_implementation("eager")
        hf_model.eval()
        self.hf_model = hf_model
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_ids(hf_model, tokenizer)  # what ends a greedy generation
        self.name = name
        self.source = source
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "right"
        base = hf_model.base_model
        self.layer_modules: list[nn.Module] = list(cast(nn.ModuleList, submodule(base, self.family.layers)))
        self.attn_modules = [submodule(l, self.family.attn) for l in self.layer_modules]
        self.o_proj_modules = [submodule(l, self.family.o_proj) for l in self.layer_modules]
        self.mlp_out_modules = [submodule(l, self.family.mlp_out) for l in self.layer_modules]
        self.embed_module = submodule(base, self.family.embed)
        cfg = hf_model.config
        self.n_layers = len(self.layer_modules)
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        self.d_model = int(cfg.hidden_size)
        self.site_names = site_names(self.n_layers, self.family)
        self.features: FeatureSet | None = None  # attach_features
        max_pos = int(getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", 0) or 10**9)
        # RoBERTa numbers positions from padding_idx + 1, so two position slots are never usable.
        self.max_positions = max_pos - self.family.reserved_positions
        if self.modality == "image":
            self.max_positions = 1 + cast(Any, tokenizer).n_patches

    def to(self, device: str | torch.device = "cpu", dtype: str = "float32") -> ModelAdapter:
        """Move the model (e.g. ``"cuda"``, ``dtype="bfloat16"``); a clear error if the device is missing."""
        dt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)
        if dt is None:
            raise StreetlampError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise StreetlampError(f"device {device!r} asked for, but torch sees no CUDA GPU here")
        cast(Any, self.hf_model).to(device=dev, dtype=dt)  # transformers types .to() as a decorated method wrongly
        return self

    def attach_features(self, features: FeatureSet | None) -> ModelAdapter:
        """Splice a feature set's dictionaries in as sites (``layers.{l}.resid_pre.features``, ...; see
        :mod:`streetlamp.models.features`); ``None`` detaches. One clear line where the set does not fit the
        model (its layers, its width, a transcoder on a family without one MLP module)."""
        if features is not None:
            features.check(self)
        self.features = features
        at = [] if features is None else list(features.dictionaries)
        self.site_names = site_names(self.n_layers, self.family, at)
        return self

    def dispatch(
        self, max_memory: dict[Any, str] | None = None, offload_folder: str | Path | None = None, dtype: str = "float32"
    ) -> ModelAdapter:
        """``--device-map auto``: spread the model over the GPUs, the CPU and the disk with accelerate
        (layers that do not fit ``max_memory``, e.g. ``{"0": "20GiB", "cpu": "30GiB"}``, are offloaded
        to ``offload_folder`` and loaded for each forward pass); results are those of the undispatched model."""
        from accelerate import dispatch_model, infer_auto_device_map

        self.to("cpu", dtype)
        model: Any = self.hf_model
        try:
            dmap = infer_auto_device_map(
                model, max_memory=cast(Any, max_memory), no_split_module_classes=model._no_split_modules
            )
        except (ValueError, KeyError) as e:
            raise StreetlampError(f"--max-memory {max_memory}: {e}") from None
        if set(dmap.values()) == {"disk"}:
            raise StreetlampError(f"--max-memory {max_memory} leaves no room for the model's first layers: raise it")
        if "disk" in dmap.values() and offload_folder is None:
            raise StreetlampError(
                "the model does not fit --max-memory: give --offload-folder DIR for the layers offloaded to disk"
            )
        dispatch_model(model, device_map=dmap, offload_dir=str(offload_folder) if offload_folder else None)
        return self

    # -- metadata ------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Where inputs go: the first device of a dispatched model's map, else where its weights are."""
        dmap = getattr(self.hf_model, "hf_device_map", None)
        if dmap:
            first = next(iter(dmap.values()))
            return torch.device(
                "cpu" if first in ("cpu", "disk") else f"cuda:{first}" if isinstance(first, int) else first
            )
        return next(self.hf_model.parameters()).device

    @property
    def n_outputs(self) -> int:
        cfg: Any = self.hf_model.config
        return int(cfg.num_labels if self.kind.labels else cfg.vocab_size)

    def output_label(self, index: int) -> str:
        if self.kind.labels:
            cfg: Any = self.hf_model.config
            return str(cfg.id2label.get(index, index))
        return cast(str, self.tokenizer.decode([index]))  # one id list decodes to one str

    def parse_label(self, label: str) -> int:
        """An output index from a class name (any case) or id (classifier), or a one-token string
        (causal LM). The one parser of labels and targets given by a user or a data file."""
        if not self.kind.labels:
            return self.token_id(label)
        cfg: Any = self.hf_model.config
        names = {str(v).lower(): int(k) for k, v in cfg.id2label.items()}
        s = str(label).strip()
        if s.lower() in names:
            return names[s.lower()]
        if s.lstrip("-").isdigit():
            i = int(s)
            if not 0 <= i < self.n_outputs:
                raise StreetlampError(
                    f"target {i} out of range: classes are 0..{self.n_outputs - 1} ({', '.join(names)})"
                )
            return i
        raise StreetlampError(f"unknown target {label!r}: not a class of the model; classes: {', '.join(names)}")

    def explained_position(self, length: int) -> int:
        """The position whose output is explained: [CLS] (0) for BERT-style classifiers, else the last token."""
        if self.kind.labels and self.family.reads_cls:
            return 0
        return length - 1

    # -- special tokens ------------------------------------------------------------------------
    @property
    def pad_token_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    @functools.cached_property
    def special_ids(self) -> frozenset[int]:
        """Ids of the model's structural special tokens (CLS/SEP/BOS/EOS/PAD that the tokenizer has).

        [UNK] is not one of them, unless the tokenizer uses the same id for EOS (SmolLM2)."""
        ids = (getattr(self.tokenizer, f"{k}_token_id", None) for k in STRUCTURAL_SPECIALS)
        return frozenset(int(i) for i in ids if i is not None)

    def special_mask(self, ids: Sequence[int] | torch.Tensor) -> np.ndarray:
        """Bool ``[n]``: True where ``ids`` holds a structural special token (never scored nor removed)."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
        return np.array([int(i) in self.special_ids for i in ids], dtype=bool)

    def replacement_token(self, replacement: str) -> tuple[str, int | None, str | None]:
        """``(used, token_id, token_string)`` for ``mask`` / ``unk`` / ``pad`` / ``delete``, after fallbacks.

        ``mask`` falls back to ``unk``, then ``pad``, then ``eos`` (causal LMs usually have no [MASK];
        SmolLM2's ``unk`` is ``<|endoftext|>``). ``delete`` has no token."""
        if replacement == "delete":
            if self.modality == "image":
                raise StreetlampError(
                    "an image's patches cannot be deleted (a ViT's positions are a fixed grid): use replacement "
                    "'mask', the mean-pixel patch [MEAN]"
                )
            return "delete", None, None
        if replacement not in REPLACEMENT_FALLBACK:
            raise StreetlampError(f"unknown replacement {replacement!r}; choose one of mask, unk, pad, delete")
        for kind in REPLACEMENT_FALLBACK[replacement]:
            tid = getattr(self.tokenizer, f"{kind}_token_id", None)
            if tid is not None:
                return kind, int(tid), str(getattr(self.tokenizer, f"{kind}_token"))
        raise StreetlampError(f"the tokenizer has no {replacement}, unk, pad or eos token; use replacement='delete'")

    def empty_context_token(self) -> int:
        """The token a causal LM reads as the start of a document, also what it reads when erasure leaves
        no token at all: ``<|endoftext|>`` where the vocabulary has it (the pretraining document separator
        of GPT-2-style BPE vocabularies, SmolLM2's included: its BOS ``<|im_start|>`` is a chat marker),
        else BOS, else EOS. A classifier always keeps its [CLS]/[SEP]."""
        tok = self.tokenizer
        sep = tok.get_vocab().get(DOCUMENT_SEPARATOR)
        if sep is not None:
            return int(sep)
        return int(tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id)

    def describe(self) -> dict:
        cfg: Any = self.hf_model.config
        dmap: dict[str, Any] | None = getattr(self.hf_model, "hf_device_map", None)
        return {
            "name": self.name,
            "source": self.source,
            "kind": self.kind.name,
            "modality": self.modality,
            **(self.patch_grid() if self.modality == "image" else {}),
            "family": self.family.name,
            "architecture": type(self.hf_model).__name__,
            "layers": self.n_layers,
            "heads": self.n_heads,
            "kv_heads": self.n_kv_heads,
            "d_model": self.d_model,
            "max_positions": self.max_positions,
            "labels": ({str(k): v for k, v in cfg.id2label.items()} if self.kind.labels else None),
            "device": str(self.device),
            **({"device_map": {k: str(v) for k, v in dmap.items()}} if dmap else {}),
            "dtype": str(next(self.hf_model.parameters()).dtype).replace("torch.", ""),
            # the feature set spliced in (--features), as every manifest records it
            **({"features": fs.describe()} if (fs := getattr(self, "features", None)) is not None else {}),
        }

    def patch_grid(self) -> dict[str, int]:
        """Image models: the patch grid (``rows`` x ``cols`` patches of ``patch`` pixels)."""
        v: Any = self.tokenizer
        return {"patch_rows": v.rows, "patch_cols": v.cols, "patch_size": v.patch}

    # -- inputs --------------------------------------------------------------------------------
    def encode(self, texts: Any, truncate: bool = False) -> Inputs:
        """Texts (a text model), or images (an image model: file paths or PIL images) -> :class:`Inputs`."""
        if self.modality == "image":
            return self._encode_images(texts)
        texts = [texts] if isinstance(texts, str) or not isinstance(texts, Iterable) else list(texts)
        if not texts:
            raise StreetlampError("no text given")
        for t in texts:
            if looks_like_image_file(t):
                raise StreetlampError(
                    f"{self.name} is a text model ({self.family.name}): it cannot read the image "
                    f"{str(getattr(t, 'filename', '') or t)[:80]!r}; give text, or an image model (ViT)"
                )
            if not isinstance(t, str):
                raise StreetlampError(f"a text model reads strings, not {type(t).__name__}")
            if not t or not t.strip():
                raise StreetlampError("empty text: give at least one non-space character")
        enc = self.tokenizer(texts, padding=False, truncation=False)
        rows = enc["input_ids"]
        truncated = []
        for i, r in enumerate(rows):
            if len(r) > self.max_positions:
                if not truncate:
                    fix = (
                        "pass --truncate to cut it (recorded in the manifest)" if takes("--truncate") else "shorten it"
                    )
                    raise StreetlampError(
                        f"text {i} has {len(r)} tokens but the model takes at most {self.max_positions}; {fix}"
                    )
                # the tokenizer keeps its special tokens ([CLS] ... [SEP]) when it truncates
                rows[i] = self.tokenizer(texts[i], truncation=True, max_length=self.max_positions)["input_ids"]
            truncated.append(len(r) > self.max_positions)
        return Inputs.from_ids(self, rows, texts, truncated)

    def _encode_images(self, images: Any) -> Inputs:
        items = [images] if isinstance(images, (str, Path)) or not isinstance(images, Iterable) else list(images)
        if not items:
            raise StreetlampError("no image given")
        pil, names = [], []
        for k, x in enumerate(items):
            if isinstance(x, (str, Path)):
                if not Path(x).expanduser().is_file():
                    raise StreetlampError(
                        f"{self.name} is an image model ({self.family.name}): give an image file (PNG, JPEG, ...), "
                        f"not text or a missing file: {str(x)[:80]!r}"
                    )
                pil.append(read_image(x))
                names.append(str(x))
            elif hasattr(x, "convert") and hasattr(x, "size"):  # a PIL image
                pil.append(x.convert("RGB"))
                names.append(str(getattr(x, "filename", "") or f"<image {k}>"))
            else:
                raise StreetlampError(f"an image model reads image files or PIL images, not {type(x).__name__}")
        rows, _ = cast(Any, self.tokenizer).encode(pil)
        return Inputs.from_ids(self, rows, names)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """The ``embed`` site of one row of ids ``[pos]`` -> ``[pos, d_model]`` (the lookup alone, no forward
        pass); for an image model ``[CLS]`` and the patch embeddings of the row's pixels."""
        if self.modality == "image":
            vocab: Any = self.tokenizer
            row = ids.view(-1).cpu().clone()
            first, row[0] = int(row[0]), vocab.cls_token_id  # a baseline row may hold a patch at position 0
            e = token_embeddings(self.embed_module, vocab.pixels(row[None]).to(self.device, self._dtype))[0]
            if first != vocab.cls_token_id:
                patch = vocab.patch_pixels(first).to(self.device, self._dtype)
                e = torch.cat([token_embeddings(self.embed_module, patch)[0, 1:], e[1:]])
            return e
        return self.embed_module(ids.view(1, -1).to(self.device))[0]

    @property
    def _dtype(self) -> torch.dtype:
        return next(self.hf_model.parameters()).dtype

    def token_label(self, token: str) -> str:
        s = self.tokenizer.convert_tokens_to_string([token])
        return s if s.strip() else repr(s)

    def token_id(self, text: str) -> int:
        """The single vocabulary id of ``text`` (for causal-LM targets)."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise StreetlampError(f"target {text!r} is {len(ids)} tokens for this tokenizer; give one token")
        return int(ids[0])

    # -- running -------------------------------------------------------------------------------
    def session(
        self, record: Iterable[str] = (), edit: dict[str, Edit] | None = None, keep_grad: bool = False
    ) -> Session:
        return Session(self, record=record, edit=edit, keep_grad=keep_grad)

    def relevance_rules(self) -> AbstractContextManager[None]:
        """AttnLRP's modified backward on this model's norms, activations and gated products for a
        ``with`` block (forward values unchanged); the attention rules are site edits, see
        :mod:`streetlamp.models.relevance`."""
        return relevance_rules(self)

    def forward(
        self,
        inputs: Inputs,
        record: Iterable[str] = (),
        edit: dict[str, Edit] | None = None,
        keep_grad: bool = False,
        grad: bool = False,
    ) -> Forward:
        """Run the model; return the explained logits ``[batch, n_outputs]`` and recorded sites."""
        dev = self.device
        kw = {}
        if self.kind.causal:
            # the LM head only at the explained positions (each row's last real token), not at every
            # position: on SmolLM2 it would add ~20% to a forward pass and hold [rows, length, vocab]
            last = inputs.attention_mask.sum(1) - 1
            keep = torch.unique(last)
            kw["logits_to_keep"] = keep.to(dev)
            # no KV cache: nothing reads it, and it held every layer's keys and values (1.4 GiB for a
            # 32k-token text on SmolLM2's shape, growing layer by layer through the pass)
            kw["use_cache"] = False
        with torch.set_grad_enabled(grad or keep_grad), self.session(record, edit, keep_grad) as s:
            if self.modality == "image":  # every row is [CLS] + all patches: no padding, no mask
                pixel = cast(Any, self.tokenizer).pixels(inputs.input_ids)
                out = self.hf_model(pixel_values=pixel.to(dev, self._dtype))
            else:
                out = self.hf_model(
                    input_ids=inputs.input_ids.to(dev), attention_mask=inputs.attention_mask.to(dev), **kw
                )
        if self.kind.labels:
            return Forward(out.logits, s.cache)
        col = torch.searchsorted(keep, last).to(out.logits.device)
        return Forward(out.logits[torch.arange(out.logits.shape[0], device=out.logits.device), col], s.cache)

    def select_logits(self, logits: torch.Tensor, inputs: Inputs) -> torch.Tensor:
        """The explained logits from a model's full output ``[batch, (pos,) n]`` (e.g. an independent copy)."""
        if self.kind.labels:
            return logits
        last = inputs.attention_mask.sum(1).to(logits.device) - 1
        return logits[torch.arange(logits.shape[0], device=logits.device), last]

    @staticmethod
    def score(logits: torch.Tensor, index: torch.Tensor, target: Target) -> torch.Tensor:
        """The explained scalar per example, ``[batch]``, from explained logits ``[batch, n]``."""
        if target.quantity == KL:
            raise StreetlampError("the kl_divergence step function needs the unedited run: perturbation methods only")
        if target.quantity == "logit":
            q = logits
        elif target.quantity == "logprob":
            q = torch.log_softmax(at_least_float32(logits), -1)
        else:
            q = torch.softmax(at_least_float32(logits), -1)
        f = q.gather(1, index.view(-1, 1).to(q.device)).squeeze(1)
        if target.contrast is not None:
            f = f - q[:, target.contrast]
        return f

    def resolve(self, inputs: Inputs, target: Target, logits: torch.Tensor | None = None) -> torch.Tensor:
        """Concrete output index per example: the target's, or the prediction when it has none."""
        if target.index is not None:
            if not 0 <= target.index < self.n_outputs:
                raise StreetlampError(f"target {target.index} out of range: the model has {self.n_outputs} outputs")
            if target.contrast is not None and not 0 <= target.contrast < self.n_outputs:
                raise StreetlampError(f"contrast {target.contrast} out of range")
            return torch.full((len(inputs),), target.index, dtype=torch.long)
        if logits is None:
            logits = self.forward(inputs).logits
        return logits.argmax(-1).cpu()

    # -- causal-LM passes that need more than :meth:`forward` ---------------------------------------
    def logits_at(
        self, ids: torch.Tensor, positions: torch.Tensor, edit: dict[str, Edit] | None = None, grad: bool = False
    ) -> torch.Tensor:
        """Causal LM: next-token logits ``[rows, k, vocab]`` at ``positions`` ``[k]`` of unpadded rows
        ``ids`` ``[rows, pos]`` (the LM head only there, via ``logits_to_keep``)."""
        ids = ids.to(self.device)
        with torch.set_grad_enabled(grad), self.session(edit=edit):
            return self.hf_model(
                input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=positions.to(self.device)
            ).logits

    @torch.no_grad()
    def generate(
        self, prompt_ids: torch.Tensor, n_new: int, stop_at_eos: bool = True, kv_cache: bool = True
    ) -> list[int]:
        """Greedy continuation of at most ``n_new`` tokens after ``prompt_ids`` ``[pos]``, ending after the
        model's EOS (:func:`eos_ids`, kept as the last token: the model generated it) when it comes first and
        ``stop_at_eos``, as Hugging Face's ``generate`` does.

        A causal LM reuses its KV cache (:meth:`prefix_forward`): one forward of the prompt, then one position
        per new token, as Hugging Face's ``generate`` does (at 4k tokens of context a 5-token answer costs about
        one forward, not five). ``kv_cache=False`` (and every other kind) runs one full forward per token."""
        if n_new < 1:
            raise StreetlampError(f"need at least one new token (got {n_new})")
        ids, out = prompt_ids.cpu(), []
        if kv_cache and self.kind.causal:
            logits, cache = self.prefix_forward(Inputs.from_ids(self, [ids], strings=False), keep_cache=True)
            for step in range(n_new):
                nxt = int(logits[0].argmax())
                out.append(nxt)
                if (stop_at_eos and nxt in self.eos_token_ids) or step == n_new - 1:
                    break
                one = Inputs.from_ids(self, [[nxt]], strings=False)
                logits, cache = self.prefix_forward(one, cache, start=len(ids) + step, keep_cache=True)
            return out
        for _ in range(n_new):
            nxt = int(self.forward(Inputs.from_ids(self, [ids])).logits[0].argmax())
            out.append(nxt)
            if stop_at_eos and nxt in self.eos_token_ids:
                break
            ids = torch.cat([ids, torch.tensor([nxt])])
        return out

    def prefix_forward(
        self,
        inputs: Inputs,
        cache: list | None = None,
        start: int = 0,
        keep_cache: bool = False,
        grad: bool = False,
        tail: int | None = None,
    ) -> tuple[torch.Tensor, list]:
        """Causal LM only: next-token logits after each row's last real token, reusing a cached prefix.

        ``inputs`` holds right-padded *suffixes* that start at position ``start``; ``cache`` is the
        per-layer ``(keys, values)`` list returned by an earlier call on the full original text
        (``start == 0``), cropped here to its first ``start`` positions and shared by every row
        (expanded, not recomputed). Positions follow from the cache length, so RoPE / learned positions
        are those of the full text. The registered streetlamp attention function handles
        ``q_len < k_len`` (the causal mask is offset by the cache). Only the hidden state of each row's
        last real token goes through the LM head (not ``[rows, width, vocab]`` logits).

        Returns the logits ``[rows, vocab]`` (with ``tail``: ``[rows, tail, vocab]`` at each row's last ``tail``
        real positions, which the suffix must hold) and, with ``keep_cache``, this call's cache as
        ``[(keys, values)]`` per layer (else ``[]``). ``grad``: keep the autograd graph (the cache is a constant).
        """
        with torch.set_grad_enabled(grad):
            return self._prefix_forward(inputs, cache, start, keep_cache, tail)

    def _prefix_forward(
        self, inputs: Inputs, cache: list | None, start: int, keep_cache: bool, tail: int | None = None
    ) -> tuple[torch.Tensor, list]:
        from transformers import DynamicCache

        if not self.kind.causal:
            raise StreetlampError("prefix_forward needs a causal LM")
        dev = self.device
        ids, mask = inputs.input_ids, inputs.attention_mask
        rows = ids.shape[0]
        past = None
        full_mask = mask
        if start:
            assert cache is not None
            past = DynamicCache(
                ddp_cache_data=[
                    (k[:, :, :start].expand(rows, -1, -1, -1), v[:, :, :start].expand(rows, -1, -1, -1))
                    for k, v in cache
                ]
            )
            full_mask = torch.cat([torch.ones(rows, start, dtype=mask.dtype), mask], 1)
        elif keep_cache:
            # a cache without the config keeps every position in every layer: with the config, sliding-window
            # layers (Gemma, Mistral) would keep only the last window's keys, and the prefix cropped above
            # (the first ``start`` positions) would be the wrong ones; the window stays in the mask
            past = DynamicCache()
        base = self.hf_model.base_model
        name = cache_keyword(type(base))  # type: ignore[arg-type]  # classes are hashable
        out = base(
            input_ids=ids.to(dev),
            attention_mask=full_mask.to(dev),
            use_cache=keep_cache or past is not None,
            **{name: past},
        )
        last = mask.sum(1).to(dev) - 1
        if tail is None:
            hidden = out.last_hidden_state[torch.arange(rows, device=dev), last]
        else:
            if int(last.min()) + 1 < tail:
                raise StreetlampError(f"prefix_forward: a suffix is shorter than the {tail} positions asked for")
            pos = last[:, None] - torch.arange(tail - 1, -1, -1, device=dev)[None]
            hidden = out.last_hidden_state[torch.arange(rows, device=dev)[:, None], pos]
        logits = readout.lm_head_logits(self, hidden)  # with Gemma 2/3's final soft-cap
        new_cache = [(layer.keys, layer.values) for layer in getattr(out, name).layers] if keep_cache else []
        return logits, new_cache


@functools.cache
def cache_keyword(model_class: Any) -> str:
    """The KV-cache argument (and output field) of a base model's forward: transformers renamed
    ``past_key_values`` to ``cache`` within 5.x, and ``**kwargs`` would swallow the wrong one (the
    prefix silently ignored), so ask the signature, once per class."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"
