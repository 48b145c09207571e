"""The argparse parser of a :class:`~streetlamp.commands.base.Command`, generated from its fields.

Every argument's default is ``argparse.SUPPRESS``: a flag the user did not give is absent from the
namespace, so the dataclass default (declared once, on the field) applies.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..settings import RunOptions, Shared, cli_fields, flag_of, scalar_type
from .base import Command


def add_field(p: argparse.ArgumentParser, f: Any, o: Any, hint: Any, default: Any = None, **over: Any) -> None:
    # no argparse type= or choices=: every value goes through settings.coerce, so the CLI and the API
    # refuse the same values with the same message (choices still show in --help as the metavar)
    kw: dict[str, Any] = {"help": over.get("help", o.help), "default": argparse.SUPPRESS}
    t = scalar_type(hint)
    flag = flag_of(f)
    if o.choices is not None:
        kw["metavar"] = "{" + ",".join(o.choices) + "}"
    if o.action is not None:
        kw["action"] = o.action
    elif t is bool and o.parse is None:
        kw["action"] = "store_false" if flag.startswith("--no-") else "store_true"
    elif o.type is not None:
        kw["type"] = o.type
    if o.positional:
        if o.nargs:
            kw["nargs"] = o.nargs
        p.add_argument(f.name, **kw)
        return
    if over.get("required", o.required):
        kw["required"] = True
    if o.choices is None and (
        flag != "--" + f.name.replace("_", "-") and t in (int, float) or kw.get("action") == "append"
    ):
        kw["metavar"] = flag.lstrip("-").replace("-", "_").upper()
    p.add_argument(flag, dest=f.name, **kw)


def add_command(sub: Any, cmd: Command) -> argparse.ArgumentParser:
    """The command's parser: its positionals, the shared options (in the order they always had:
    model, out, overwrite, seed, batch size, device, placement), then its own options."""
    p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.description)
    shared: Shared = cmd.shared
    wanted = shared.options()
    settings = [
        (f, o, h)
        for f, o, h in cli_fields(cmd.settings)
        if not (f.name == "seed" and not shared.seed) and not (f.name == "batch_size" and not shared.batch_size)
    ]
    run_opts = {f.name: (f, o, h) for f, o, h in cli_fields(RunOptions) if f.name in wanted}
    first = [x for x in settings if x[1].positional]
    first += [run_opts[n] for n in ("model", "out", "overwrite") if n in run_opts]
    first += [x for x in settings if x[0].name in ("seed", "batch_size")]
    first += [x for n, x in run_opts.items() if n not in ("model", "out", "overwrite")]
    for f, o, hint in first + [x for x in settings if x not in first]:
        over: dict[str, Any] = {}
        if f.name == "model" and f in (x[0] for x in run_opts.values()):
            over["help"] = shared.model_help or (
                f"embedded name or checkpoint folder (default {shared.model})" if shared.model else o.help
            )
        elif f.name == "out" and f in (x[0] for x in run_opts.values()):
            over = {"help": shared.out, "required": shared.out_required}
        add_field(p, f, o, hint, **over)
    p.set_defaults(_command=cmd)
    return p


def build_parser(commands: list[Command]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streetlamp", description="What a Transformer's attention really explains.")
    sub = p.add_subparsers(dest="command", required=True)
    for cmd in commands:
        add_command(sub, cmd)
    return p


def values_of(args: argparse.Namespace) -> dict[str, Any]:
    """The user's values of a parsed command line (without the parser's own keys)."""
    return {k: v for k, v in vars(args).items() if k not in ("command", "_command")}
