"""The Method protocol: one verb, one signature, one result type.

Every method is a small dataclass whose fields are its explicit keyword parameters (what a run
records and a report prints) and whose class attributes declare its capabilities::

    method.attribute(adapter, inputs, *, target, batch_size=None, seed=0) -> list[Explanation]

One :class:`~streetlamp.results.Explanation` per text of ``inputs``, each with at least the
array ``tokens`` ``[token]`` (one score per real token of the text) and whatever raw arrays
the method has (e.g. ``matrix`` ``[query, key]``, ``attention`` ``[layer, head, query, key]``).

The capability flags are checked for every method by ``tests/methods/test_conformance.py``:
``needs_gradients=False`` means the method runs under ``torch.inference_mode()``; ``stochastic=False``
means the seed does not change the result; ``reports_completeness=True`` means the explanation
records how far its scores are from the completeness axiom, and that record is verified against an
independent forward pass; ``kinds`` lists the model kinds it applies to (``seq2seq``: the
encoder-decoder kind, through :meth:`Method.attribute_view` on a
:class:`~streetlamp.methods.views.Seq2SeqView`); ``long_input=True`` means the method has a long-input
implementation, :meth:`Method.attribute_long`, run by ``explain --rows/--layers/--heads`` in bounded memory.

A method written over the attribution view (:mod:`streetlamp.methods.views`) implements
:meth:`Method.attribute_view` once; its ``attribute`` applies it to one :class:`SequenceView` per text.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter, Target
from ..models.kinds import CAUSAL_LM, CLASSIFIER, ENCODER_DECODER, ModelKind
from ..results import Explanation

if TYPE_CHECKING:
    from .long_input import LongInput, LongRow
    from .views import View

__all__ = ["CAUSAL_LM", "CLASSIFIER", "ENCODER_DECODER", "Method", "ViewAttribution"]


@dataclass
class ViewAttribution:
    """What a method gives over a :class:`~streetlamp.methods.views.View`: ``matrices`` ``[k, n]`` (key
    ``""``: the method's scores; the attention method gives one per attention site family), extra
    ``arrays`` (name -> (array, axes, meaning)), ``info`` (the run-level record) and ``rows`` (per row)."""

    matrices: dict[str, np.ndarray]
    arrays: dict[str, tuple[np.ndarray, list[str], str]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)


class Method(ABC):
    name: ClassVar[str]
    family: ClassVar[str]
    description: ClassVar[str] = ""
    needs_gradients: ClassVar[bool] = False
    reports_completeness: ClassVar[bool] = False
    stochastic: ClassVar[bool] = False
    kinds: ClassVar[tuple[ModelKind, ...]] = (CLASSIFIER, CAUSAL_LM)
    long_input: ClassVar[bool] = False
    long_needs_graph: ClassVar[bool] = False  # the long recording keeps the last layer's graph for this method
    uses_weights: ClassVar[bool] = True  # reads the model's weights (evaluate's randomisation check needs it)

    def params(self) -> dict[str, Any]:
        return dataclasses.asdict(self) if dataclasses.is_dataclass(self) else {}

    def check(self, adapter: ModelAdapter) -> None:
        """Raise a StreetlampError saying why this method cannot apply to ``adapter``."""
        if adapter.kind.stacks > 1:  # attribute() runs one stack; a method over the view has check_view
            from ..models.seq2seq import refusal

            raise StreetlampError(refusal(self.name, adapter.name))
        if adapter.kind not in self.kinds:
            raise StreetlampError(f"method {self.name!r} does not apply to a {adapter.kind}")

    def check_view(self, view: View) -> None:
        """Raise a StreetlampError saying why this method cannot attribute over ``view``."""
        kind = view.adapter.kind
        if kind not in self.kinds:
            if kind.stacks > 1:
                from ..models.seq2seq import refusal

                raise StreetlampError(refusal(self.name, view.adapter.name))
            raise StreetlampError(f"method {self.name!r} does not apply to a {kind}")

    def attribute_view(self, view: View, *, batch_size: int | None = None, seed: int = 0) -> ViewAttribution:
        """The method over an attribution view: one row of scores per explained output."""
        raise StreetlampError(f"method {self.name!r} is not written over the attribution view")

    def check_long(self, long: LongInput) -> None:
        """Raise a StreetlampError saying why the long-input implementation cannot run on this text."""
        if not self.long_input:
            raise StreetlampError(f"method {self.name!r} has no long-input implementation")

    def attribute_long(self, long: LongInput) -> LongRow:
        """The explained row from a long recording (methods with ``long_input``)."""
        raise StreetlampError(f"method {self.name!r} has no long-input implementation")

    @abstractmethod
    def attribute(
        self, adapter: ModelAdapter, inputs: Inputs, *, target: Target, batch_size: int | None = None, seed: int = 0
    ) -> list[Explanation]: ...

    def explanation(
        self,
        adapter: ModelAdapter,
        inputs: Inputs,
        b: int,
        target_index: int,
        target: Target,
        arrays: dict,
        axes: dict,
        meaning: dict,
        **info: Any,
    ) -> Explanation:
        """Build the Explanation for text ``b`` with the common info filled in."""
        base = {
            "method": self.name,
            "family": self.family,
            "params": self.params(),
            "model": adapter.name,
            "target": {
                "index": int(target_index),
                "label": adapter.output_label(int(target_index)),
                "contrast": target.contrast,
                "quantity": target.quantity,
                "explained": target.describe(adapter, int(target_index)),
            },
        }
        base.update(info)
        return Explanation(self.name, arrays, axes, meaning, list(inputs.tokens[b]), base)
