"""Checks of settings against the registries (methods), run before anything is written. Here, not in
``settings.py``: the registries import torch and sit above the settings' floor; commands sit above both."""

from __future__ import annotations

from ..errors import StreetlampError
from ..evaluation.settings import parse_methods  # ``--methods`` of every command, declared beside evaluate's

__all__ = ["check_method_params", "parse_methods"]


def check_method_params(mparams: dict[str, dict], methods: list[str], flag: str = "--method-params") -> None:
    """Every method of ``mparams`` is among this run's, and every parameter builds it (unknown names,
    values of the wrong type: a clear error now, before any work)."""
    from ..methods.registry import get_method, typed_params  # at run time: the registry imports torch

    stray = [k for k in mparams if k not in methods]
    if stray:
        raise StreetlampError(
            f"{flag} names {', '.join(map(repr, stray))}, not among the methods of this run ({', '.join(methods)})"
        )
    label = f"{flag} {{param}}" if flag == "--ig-params" else f"{flag} {{method}}.{{param}}"
    for name, params in mparams.items():
        get_method(name, **typed_params(name, params, label))  # types as declared on the method's fields
