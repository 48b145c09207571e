"""Optional parts of streetlamp and the packages each needs (``pip install 'streetlamp[EXTRA]'``).

The core (``explain``, the methods, ``evaluate``, ``heads``/``patch``, ``lens``, ``report``) needs only
the dependencies of pyproject.toml's ``[project] dependencies``. Each extra below is a table of
pyproject.toml's ``[project.optional-dependencies]`` (tests/test_extras.py checks that the two agree),
and :func:`require` is called where its packages are first needed, before any work: a missing one is
one line naming the ``pip install`` to run (a :class:`StreetlampError`, so the CLI exits 2).
"""

from __future__ import annotations

import importlib.util

from .errors import StreetlampError

# extra -> (what needs it, {import name: distribution name as pyproject.toml spells it})
EXTRAS: dict[str, tuple[str, dict[str, str]]] = {
    "serve": ("streetlamp serve", {"starlette": "starlette", "uvicorn": "uvicorn"}),
    "probe": ("streetlamp probe", {"spacy": "spacy", "concept_erasure": "concept-erasure"}),
    "cot": ("streetlamp cot --endpoint", {"httpx": "httpx"}),
    "ray": ("--engine ray", {"ray": "ray"}),
}


class MissingExtraError(StreetlampError):
    """An optional dependency is not installed."""


def missing(*modules: str) -> list[str]:
    """The ``modules`` that cannot be imported here (found without importing them)."""
    out = []
    for m in modules:
        try:
            if importlib.util.find_spec(m) is None:
                out.append(m)
        except (ImportError, ValueError):  # a parent package missing, or a module set to None
            out.append(m)
    return out


def require(extra: str, *modules: str) -> None:
    """Raise :class:`MissingExtraError` (one line) unless every module of ``extra`` (or just ``modules``)
    can be imported."""
    what, table = EXTRAS[extra]
    gone = missing(*(modules or tuple(table)))
    if gone:
        names = ", ".join(table.get(m, m) for m in gone)
        raise MissingExtraError(f"{what} needs {names}, which is not installed: pip install 'streetlamp[{extra}]'")
