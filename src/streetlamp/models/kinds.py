"""The model kinds: one frozen object per kind, the facts every engine branches on.

A model kind is what the explained output is and how a method reaches it, whatever the architecture:
a **classifier** (one label of the whole input), a **causal LM** (one causal stack; the next token after
the last position) and an **encoder-decoder** (two stacks; the next target token, given a source). The
engines never compare a kind's name: they read its facts (``adapter.kind.readout``, ``.causal``,
``.removal``, ``.view``, ``.generative``), so a new kind is one object here plus one line in
:data:`KINDS` (``tests/models/test_kinds.py`` checks that no module compares a kind with its name).

A :class:`ModelKind` is also its name as a string (``adapter.kind == "causal_lm"``, a manifest's
``"kind": "causal_lm"``, ``Method.kinds``): the name is the key that manifests, messages and the
methods' declared kinds hold.
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = ["CAUSAL_LM", "CLASSIFIER", "ENCODER_DECODER", "KINDS", "ModelKind", "kind_named"]


class ModelKind(str):
    """One model kind (frozen): its name is the string itself.

    * ``readout``: what one explained output is: ``label`` (a class of the whole input; logits over
      ``config.num_labels``, read at the position the family reads) or ``next_token`` (logits over the
      vocabulary, after the last position);
    * ``view``: the attribution view the methods see (:mod:`streetlamp.methods.views`): ``sequence`` (one
      token row through one stack) or ``source_target`` (a source and a target through two stacks);
    * ``removal``: how the perturbation methods take tokens out (:mod:`streetlamp.methods.removal`):
      ``token``: the replacement token, or plain deletion; ``causal``: the same, except that deletion never
      removes the explained last position and a removed first position becomes the document start, and
      leave-one-out without a [MASK] deletes rather than insert a document marker mid-text;
    * ``stacks``: the stacks of layers the input passes (2: an encoder and a decoder joined by
      cross-attention; the single-stack engines and commands refuse it);
    * ``causal``: one causal stack (each position reads only earlier ones) whose explained output is the
      last position's next token: the LM head runs only there, a KV-cached prefix can be reused, and
      prefixes, lenses and the single-stack generation apply;
    * ``generative``: it continues a text (``explain-generation``);
    * ``architectures``: the endings of the Hugging Face class names that load as this kind.
    """

    readout: Literal["label", "next_token"]
    view: Literal["sequence", "source_target"]
    removal: Literal["token", "causal"]
    stacks: int
    causal: bool
    generative: bool
    architectures: tuple[str, ...]

    def __new__(
        cls,
        name: str,
        *,
        readout: Literal["label", "next_token"],
        view: Literal["sequence", "source_target"],
        removal: Literal["token", "causal"],
        stacks: int,
        causal: bool,
        generative: bool,
        architectures: tuple[str, ...],
    ) -> ModelKind:
        self = super().__new__(cls, name)
        facts = dict(
            readout=readout,
            view=view,
            removal=removal,
            stacks=stacks,
            causal=causal,
            generative=generative,
            architectures=architectures,
        )
        for k, v in facts.items():
            object.__setattr__(self, k, v)
        return self

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"a ModelKind is frozen (setting {key!r})")

    @property
    def name(self) -> str:
        """The kind's name as a plain string (manifests, ``Method.kinds``)."""
        return str.__str__(self)

    @property
    def labels(self) -> bool:
        """The explained outputs are the classes of a classifier (``config.id2label``)."""
        return self.readout == "label"

    def loads(self, architecture: str) -> bool:
        """A Hugging Face class of this name loads as this kind."""
        return architecture.endswith(self.architectures)

    def __repr__(self) -> str:
        return f"ModelKind({self.name!r})"

    # one object per kind: copies and pickles are the registered object
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return kind_named, (self.name,)

    def __copy__(self) -> ModelKind:
        return self

    def __deepcopy__(self, memo: dict) -> ModelKind:
        return self


CLASSIFIER = ModelKind(
    "classifier",
    readout="label",
    view="sequence",
    removal="token",
    stacks=1,
    causal=False,
    generative=False,
    architectures=("ForSequenceClassification", "ForImageClassification"),
)
CAUSAL_LM = ModelKind(
    "causal_lm",
    readout="next_token",
    view="sequence",
    removal="causal",
    stacks=1,
    causal=True,
    generative=True,
    architectures=("ForCausalLM", "LMHeadModel"),
)
ENCODER_DECODER = ModelKind(
    "seq2seq",
    readout="next_token",
    view="source_target",
    removal="token",
    stacks=2,
    causal=False,
    generative=True,
    architectures=("ForConditionalGeneration",),
)

# name -> kind; one line per kind
KINDS: dict[str, ModelKind] = {k.name: k for k in (CLASSIFIER, CAUSAL_LM, ENCODER_DECODER)}


def kind_named(name: str) -> ModelKind:
    """The registered kind called ``name``."""
    return KINDS[name]
