"""The Method protocol: one verb, one signature, one result type.

Every method is a small dataclass whose fields are its explicit keyword parameters (what a run
records and a report prints) and whose class attributes declare its capabilities::

    method.attribute(adapter, inputs, *, target, batch_size=None, seed=0) -> list[Explanation]

One :class:`~streetlamp.results.Explanation` per text of ``inputs``, each with at least the
array ``tokens`` ``[token]`` (one score per real token of the text) and whatever raw arrays
the method has (e.g. ``matrix`` ``[query, key]``, ``attention`` ``[layer, head, query, key]``).

The capability flags are checked for every method by ``tests/test_conformance.py``:
``needs_gradients=False`` means the method runs under ``torch.inference_mode()``; ``stochastic=False``
means the seed does not change the result; ``reports_completeness=True`` means the explanation
records how far its scores are from the completeness axiom, and that record is verified against an
independent forward pass; ``kinds`` lists the model kinds it applies to.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter, Target
from ..results import Explanation


class Method(ABC):
    name: ClassVar[str]
    family: ClassVar[str]
    description: ClassVar[str] = ""
    needs_gradients: ClassVar[bool] = False
    reports_completeness: ClassVar[bool] = False
    stochastic: ClassVar[bool] = False
    kinds: ClassVar[tuple[str, ...]] = ("classifier", "causal_lm")

    def params(self) -> dict[str, Any]:
        return dataclasses.asdict(self) if dataclasses.is_dataclass(self) else {}

    def check(self, adapter: ModelAdapter) -> None:
        """Raise a StreetlampError saying why this method cannot apply to ``adapter``."""
        if adapter.kind == "seq2seq":
            from ..models.seq2seq import refusal

            raise StreetlampError(refusal(self.name, adapter.name))
        if adapter.kind not in self.kinds:
            raise StreetlampError(f"method {self.name!r} does not apply to a {adapter.kind}")

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
