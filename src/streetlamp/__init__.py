"""streetlamp: what a Transformer's attention really explains.

>>> import streetlamp
>>> adapter = streetlamp.load("minilm-sentiment")
>>> inputs = adapter.encode("The movie was not good, but the acting was great.")
>>> fwd = adapter.forward(inputs, record=["layers.*.attn.pattern"])

One function per command, from the same registry as the CLI (:mod:`streetlamp.api`)::

    res = streetlamp.explain("The movie was not good.", model="minilm-sentiment", methods=["attention"])
    res.arrays["attention"], res.tables, res   # the last shows the report inline in a notebook

Importing this package is cheap: torch and transformers load on first use of a name that needs them.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from .errors import StreetlampError
from .version import __version__ as __version__

_LAZY = {
    "load": ".models.loading",
    "EMBEDDED": ".models.loading",
    "DEFAULT_MODEL": ".models.loading",
    "ModelAdapter": ".models.adapter",
    "Inputs": ".models.adapter",
    "Target": ".models.adapter",
    "Forward": ".models.adapter",
}
_API = (
    "explain",
    "explain_generation",
    "heads",
    "prune",
    "patch",
    "lens",
    "lens_fit",
    "features_fit",
    "mediate",
    "evaluate",
    "replicate",
    "benchmark",
    "cot",
    "probe",
    "circuit",
    "atlas",
    "experts",
    "features_audit",
    "feature_dashboard",  # the command `features` (streetlamp.features is the subpackage)
    "cite",
    "cite_bench",
    "graph",
    "RunResult",
)  # one function per command that runs (api.names(); the same list: tests/commands/test_cli_api.py)

__all__ = ["StreetlampError", *_LAZY, *_API]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
    elif name in _API:
        api = import_module(".api", __name__)
        value = api.RunResult if name == "RunResult" else api.function_of(api.names()[name])
    else:
        raise AttributeError(f"module 'streetlamp' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
