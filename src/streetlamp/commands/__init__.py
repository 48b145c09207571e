"""Every CLI command as one registered object (:class:`~streetlamp.commands.base.Command`).

``COMMANDS`` is the one literal list: the CLI's parser, the Python API (``streetlamp.explain(...)``),
the manifests test, the README's command table and the views test are generated from it. Adding a
command = one module (its settings dataclass, its ``run``, its ``Command``) + one line here.
Importing this package imports no torch (``streetlamp --help`` reads it).
"""

from __future__ import annotations

from .atlas import ATLAS
from .base import Command, Lines, execute
from .circuit import CIRCUIT
from .cite import CITE, CITE_BENCH
from .cot import COT
from .evaluate import BENCHMARK, EVALUATE
from .experts import EXPERTS
from .explain import ATTENTION_ROW, EXPLAIN, EXPLAIN_GENERATION
from .features import FEATURES
from .features_audit import FEATURES_AUDIT
from .features_fit import FEATURES_FIT
from .graph import GRAPH
from .heads import HEADS, PRUNE
from .lens import LENS
from .lens_fit import LENS_FIT
from .listing import METHODS, MODELS, REPORT, SERVE
from .patch import MEDIATE, PATCH
from .probe import PROBE
from .replicate import REPLICATE

COMMANDS: list[Command] = [
    MODELS,
    METHODS,
    EXPLAIN,
    ATTENTION_ROW,
    EXPLAIN_GENERATION,
    HEADS,
    PRUNE,
    PATCH,
    LENS,
    LENS_FIT,
    FEATURES_FIT,
    MEDIATE,
    EVALUATE,
    REPLICATE,
    BENCHMARK,
    REPORT,
    SERVE,
    COT,
    PROBE,
    CIRCUIT,
    ATLAS,
    EXPERTS,
    FEATURES_AUDIT,
    FEATURES,
    CITE,
    CITE_BENCH,
    GRAPH,
]


def get(name: str) -> Command:
    """The registered command ``name`` (read at call time: a test may register one)."""
    for c in COMMANDS:
        if c.name == name:
            return c
    raise KeyError(name)


__all__ = ["COMMANDS", "Command", "Lines", "execute", "get"]
