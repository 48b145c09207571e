"""The ``streetlamp`` command: the parser generated from the command registry, one pipeline for all.

Each command is one object in :data:`streetlamp.commands.COMMANDS`; this module only builds the
argparse parser from it and runs :func:`streetlamp.commands.execute` (check settings -> refuse a bad
``--out`` -> load and place the model -> validate -> run -> write the report), then prints the
result's lines. ``streetlamp --help`` and ``streetlamp COMMAND --help`` import neither torch nor
transformers.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from .errors import StreetlampError


def build_parser() -> argparse.ArgumentParser:
    from . import commands
    from .commands.parser import build_parser as build

    return build(commands.COMMANDS)


def _quiet_transformers() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _print(res: object) -> None:
    for line in res.lines():  # type: ignore[attr-defined]
        print(line)
    out = getattr(res, "out", None)
    if out is not None and (Path(out) / "report.html").exists():  # every run folder says where its report is
        print(f"report: {Path(out) / 'report.html'}")


def main(argv: Sequence[str] | None = None) -> int:
    from .commands import execute
    from .commands.parser import values_of

    args = build_parser().parse_args(argv)
    _quiet_transformers()
    import warnings

    # a warning is one line for the user, not a source excerpt
    warnings.formatwarning = lambda message, category, filename, lineno, line=None: f"streetlamp: warning: {message}\n"
    try:
        _print(execute(args._command, values_of(args)))
        return 0
    except StreetlampError as e:
        print(f"streetlamp: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("streetlamp: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `streetlamp methods | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
