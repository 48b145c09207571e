"""The Python API: one function per registered command, from the same registry as the CLI.

``streetlamp.explain(text, model="minilm-sentiment", methods=["attention"])`` runs exactly what
``streetlamp explain TEXT --model minilm-sentiment --methods attention`` runs (the one pipeline of
:func:`streetlamp.commands.execute`: settings checked, model loaded and validated, run, report
written) and returns a :class:`RunResult`: ``.arrays`` (named numpy arrays), ``.tables`` (pandas
DataFrames of every table the run has), ``.lines()`` (what the CLI prints) and, in a notebook, the
report inline. Keywords are the settings' field names (``method_params``, ``new_tokens``) and the
shared options (``model``, ``out``, ``overwrite``, ``device``, ``dtype``, ...); values are Python
values (a list of methods, a dict of parameters) or the strings the CLI takes. ``model`` may also be
an already loaded adapter. Without ``out`` the run goes to a new temporary folder.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import commands
from .commands.base import Command
from .settings import RunOptions, cli_fields

__all__ = ["RunResult", "function_of", "names"]


class RunResult:
    """A command's result (its attributes are reachable here too) and its run folder's contents."""

    def __init__(self, command: str, result: Any) -> None:
        self.command = command
        self.result = result
        self.out = Path(result.out) if getattr(result, "out", None) is not None else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["result"], name)

    def __repr__(self) -> str:
        return f"<streetlamp {self.command} run: {self.out}>"

    def lines(self) -> list[str]:
        return list(self.result.lines())

    @property
    def manifest(self) -> dict[str, Any]:
        return json.loads((self.out / "manifest.json").read_text()) if self.out else {}

    @property
    def arrays(self) -> dict[str, Any]:
        """Every stored array by name: those of ``arrays.safetensors`` under their manifest names
        (an array stored once for two names under both), other ``.safetensors`` files as ``path/key``."""
        from safetensors.numpy import load_file

        if self.out is None:
            return {}
        out: dict[str, Any] = {}
        for f in sorted(self.out.rglob("*.safetensors")):
            rel = f.relative_to(self.out).with_suffix("").as_posix()
            for k, v in load_file(str(f)).items():
                out[k if rel == "arrays" else f"{rel}/{k}"] = v
        for name, d in (self.manifest.get("arrays") or {}).items():
            if isinstance(d, dict) and d.get("key") in out and name not in out:
                out[name] = out[d["key"]]
        return out

    @property
    def tables(self) -> dict[str, Any]:
        """Every table of the run as a DataFrame: each CSV/TSV/Parquet file (by its path without the
        suffix) and each table of ``manifest["tables"]`` (by its title)."""
        import pandas as pd

        if self.out is None:
            return {}
        out: dict[str, Any] = {}
        for f in sorted(p for p in self.out.rglob("*") if p.suffix in (".csv", ".tsv", ".parquet")):
            name = f.relative_to(self.out).with_suffix("").as_posix()
            out[name] = (
                pd.read_parquet(f)
                if f.suffix == ".parquet"
                else pd.read_csv(f, sep="\t" if f.suffix == ".tsv" else ",")
            )
        for t in self.manifest.get("tables") or []:
            if isinstance(t, dict) and "columns" in t and "rows" in t:
                out.setdefault(str(t.get("title", f"table {len(out)}")), pd.DataFrame(t["rows"], columns=t["columns"]))
        return out

    def _repr_html_(self) -> str:
        if self.out is not None and (self.out / "report.html").exists():
            from .report.viewer import iframe_html

            return iframe_html(self.out)
        import html

        return "<pre>" + html.escape("\n".join(self.lines())) + "</pre>"


# a command named like a subpackage of streetlamp gets another Python name: ``import streetlamp.features.x`` sets
# the attribute ``streetlamp.features`` to the subpackage, which would replace the function
PYTHON_NAMES = {"features": "feature_dashboard"}


def python_name(cmd: Command) -> str:
    return PYTHON_NAMES.get(cmd.name, cmd.name.replace("-", "_"))


def names() -> dict[str, Command]:
    """``{python_name: command}`` for every registered command that runs something."""
    return {python_name(c): c for c in commands.COMMANDS if c.writes is not None}


def function_of(cmd: Command) -> Callable[..., RunResult]:
    """``streetlamp.<name>(*positionals, **settings_and_options)`` for ``cmd``."""
    positional = [f.name for f, o, _ in cli_fields(cmd.settings) if o.positional]

    def run(*args: Any, **kwargs: Any) -> RunResult:
        if len(args) > len(positional):
            raise TypeError(f"{cmd.name} takes {len(positional)} positional argument(s) ({', '.join(positional)})")
        values = {**dict(zip(positional, args)), **kwargs}
        if values.get("out") is None:
            values["out"] = tempfile.mkdtemp(prefix=f"streetlamp-{cmd.name}-")
        values["out"] = str(values["out"])
        return RunResult(cmd.name, commands.execute(cmd, values))

    fields = [f.name for f in dataclasses.fields(cmd.settings)]
    opts = [n for n in cmd.shared.options() if n in RunOptions.__dataclass_fields__]
    run.__name__ = run.__qualname__ = python_name(cmd)
    run.__doc__ = (
        f"{cmd.help}.\n\nThe CLI's ``streetlamp {cmd.name}``; positional: {', '.join(positional) or 'none'}; "
        f"settings: {', '.join(fields)}; options: {', '.join(opts)}. Returns a :class:`RunResult`."
    )
    return run
