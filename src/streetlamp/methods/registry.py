"""The explicit method registry: it feeds the CLI choices, the docs and the conformance tests.

Registration is a literal table here, not an import side effect.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from ..errors import StreetlampError
from ..settings import coerce
from .attention import Attention
from .attention_grad import AttentionAttribution, AttentionXGradient
from .base import Method
from .context_mixing import Alti, Norm, ValueZeroing
from .gradient import GradientXInput, Saliency
from .ig import IntegratedGradients
from .lrp import AttnLRP
from .occlusion import Occlusion
from .rollout import Flow, GradientRollout, Rollout
from .shap_lime import Lime, Shap

REGISTRY: dict[str, type[Method]] = {
    cls.name: cls
    for cls in (
        Attention,
        Rollout,
        Flow,
        GradientRollout,
        AttentionXGradient,
        AttentionAttribution,
        Occlusion,
        Shap,
        Lime,
        Norm,
        Alti,
        ValueZeroing,
        Saliency,
        GradientXInput,
        IntegratedGradients,
        AttnLRP,
    )
}


def list_methods() -> list[str]:
    return list(REGISTRY)


def long_methods() -> list[str]:
    """The methods with a long-input implementation (``long_input``), in registry order."""
    return [name for name, cls in REGISTRY.items() if cls.long_input]


def methods_of_kind(kind: str) -> list[str]:  # a kind's name, or the kind (it is its name)
    """The methods that declare the model kind ``kind`` (e.g. ``seq2seq``, the encoder-decoder kind)."""
    return [name for name, cls in REGISTRY.items() if kind in cls.kinds]


def get_method(name: str, **params: Any) -> Method:
    if name not in REGISTRY:
        raise StreetlampError(f"unknown method {name!r}; registered: {', '.join(REGISTRY)}")
    try:
        return REGISTRY[name](**typed_params(name, params))
    except TypeError as e:
        raise StreetlampError(f"bad parameters for {name}: {e}") from None


def typed_params(name: str, params: dict[str, Any], label: str | None = None) -> dict[str, Any]:
    """``params`` of the method ``name``, each checked against its field's declared type (``int``, ``float``:
    finite, ``bool``, ``str``, a ``Literal`` choice; :func:`streetlamp.settings.coerce`, the settings' one
    check) -- ``steps='abc'``, ``steps=2.5``, ``steps=True`` or ``tolerance=nan`` are one line, not a
    traceback mid-run. ``label``: how the message names a parameter (default ``method.param``).
    A name the method has not is left to its constructor (``bad parameters for ...``)."""
    cls = REGISTRY[name]
    if not dataclasses.is_dataclass(cls):
        return dict(params)
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    out = {}
    for key, value in params.items():
        if key not in fields:
            out[key] = value
            continue
        flag = (label or "{method}.{param}").format(method=name, param=key)
        hint = hints[key]
        if typing.get_origin(hint) is typing.Literal:
            choices = typing.get_args(hint)
            if value not in choices or isinstance(value, bool) != isinstance(choices[0], bool):
                raise StreetlampError(f"{flag} must be one of {', '.join(map(str, choices))} (got {value!r})")
            out[key] = value
        else:
            out[key] = coerce(value, hint, None, flag)
    return out


def parse_methods(spec: str) -> list[str]:
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if names == ["all"]:
        return list_methods()
    for n in names:
        if n not in REGISTRY:
            raise StreetlampError(f"unknown method {n!r}; registered: {', '.join(REGISTRY)}")
    if not names:
        raise StreetlampError("no method named")
    return names
