"""A command as one registered object, and the one pipeline every command runs through.

A :class:`Command` names its settings dataclass (whose fields carry the CLI metadata,
:func:`streetlamp.settings.option`), the shared options it takes (:class:`~streetlamp.settings.Shared`),
whether it needs a model, the report views its run folder has, and one ``run``. :func:`execute` is the
pipeline of the CLI and the Python API alike: check settings -> refuse a bad output folder -> load
and place the model -> validate the settings against it -> run -> write the report. The result
implements ``lines()`` (what the CLI prints) and has ``out`` (its run folder, or None).

Nothing here imports torch at module level: ``streetlamp --help`` builds the parser from these objects.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import StreetlampError, command_flags
from ..settings import RunOptions, Shared, build, cli_fields, flag_of


@dataclass
class Lines:
    """The result of a command that prints and writes no run folder (``models``, ``report``, ...)."""

    text: list[str] = field(default_factory=list)
    out: Path | None = None

    def lines(self) -> list[str]:
        return self.text


@dataclass(frozen=True)
class Command:
    """One CLI command: ``run(adapter, settings, out, options)`` -> a result with ``lines()``.

    ``out`` is what ``run`` writes into: a checked :class:`~streetlamp.store.run_folder.RunFolder`
    (``writes="folder"``), the folder path of a resumable run store (``writes="store"``), or None.
    ``adapter`` is the loaded, placed and validated model when ``needs_model``, else None.
    ``views``: the report views its folder opens (``report.html`` is written after ``run`` when any);
    ``extra``: the pip extra the command needs (``streetlamp[serve]``), None when the core suffices."""

    name: str
    help: str
    settings: type
    run: Callable[..., Any]
    shared: Shared = Shared()
    needs_model: bool = True
    writes: str | None = "folder"
    out_kind: str | None = None  # default folder runs/<out_kind>-<time> (default: the name)
    views: tuple[str, ...] = ()
    extra: str | None = None
    one_stack: bool = True  # refuses an encoder-decoder (explain-generation alone runs on both stacks)
    description: str | None = None
    check_options: Callable[[RunOptions], None] | None = None  # a command's own refusal of an option

    def flags(self) -> frozenset[str]:
        """The options (``--x``) of this command's parser, read from its fields as the parser reads them (its
        settings' non-positional fields, less ``--seed``/``--batch-size`` where not shared, and the shared
        options it takes): what its messages may tell the user to pass."""
        wanted = set(self.shared.options())
        skip = {n for n, shared in (("seed", self.shared.seed), ("batch_size", self.shared.batch_size)) if not shared}
        fields = cli_fields(self.settings) if dataclasses.is_dataclass(self.settings) else []
        own = [f for f, o, _ in fields if not o.positional and f.name not in skip]
        run = [f for f, _, _ in cli_fields(RunOptions) if f.name in wanted]
        return frozenset(flag_of(f) for f in own + run)

    def options(self, values: dict[str, Any]) -> RunOptions:
        """The run options of ``values`` (the rest are settings), with this command's defaults."""
        names = set(self.shared.options())
        opts = {k: values.pop(k) for k in list(values) if k in names}
        own = {f.name for f in dataclasses.fields(self.settings)} if dataclasses.is_dataclass(self.settings) else set()
        stray = [k for k in values if k in RunOptions.__dataclass_fields__ and k not in own]
        if stray:
            raise StreetlampError(f"{self.name} takes no {', '.join(stray)}")
        vals = {**self.shared.defaults(), **opts}
        model = vals.get("model")
        keep = ("model",) if model is not None and hasattr(model, "encode") and hasattr(model, "forward") else ()
        o = build(RunOptions, vals, keep=keep)  # types, choices, check(): the API's model may be an adapter
        if self.check_options is not None:
            self.check_options(o)
        return o


def lazy(module: str, name: str = "run") -> Callable[..., Any]:
    """``run`` of a :class:`Command`: ``module.name(adapter, settings, out, options)``, imported at call time
    (``streetlamp --help`` imports no torch). ``lazy(__name__ + ".run")`` in ``commands/<x>/__init__.py``."""

    def run(adapter: Any, settings: Any, out: Any, options: RunOptions) -> Any:
        import importlib

        return getattr(importlib.import_module(module), name)(adapter, settings, out, options)

    run.__qualname__ = run.__name__ = f"lazy({module}.{name})"
    return run


EXTRAS = {"serve": ("starlette", "uvicorn")}  # pip extra -> the modules it installs


def check_extra(cmd: Command) -> None:
    """A command whose extra is missing says which ``pip install`` to run, in one line."""
    import importlib.util

    missing = [m for m in EXTRAS.get(cmd.extra or "", ()) if importlib.util.find_spec(m) is None]
    if missing:
        raise StreetlampError(f"{cmd.name} needs {', '.join(missing)}: pip install 'streetlamp[{cmd.extra}]'")


def place(cmd: Command, opts: RunOptions, settings: Any) -> Any:
    """Load the model, place it (device or device map), check every setting against it."""
    from ..models.loading import load
    from ..specs import parse_max_memory

    adapter: Any = load(opts.model) if isinstance(opts.model, (str, Path)) else opts.model  # the API: an adapter
    if cmd.one_stack:
        from ..models.seq2seq import require_one_stack

        require_one_stack(adapter, cmd.name)
    if opts.device_map is not None:
        adapter.dispatch(parse_max_memory(opts.max_memory), opts.offload_folder, opts.dtype)
    else:
        adapter.to(opts.device, opts.dtype)
    attach_features(adapter, opts)
    settings.validate(adapter)
    return adapter


def attach_features(adapter: Any, opts: RunOptions) -> None:
    """``--features DICT``: the feature set read (given the model: hooks before a norm's gain fold into the
    encoder), checked against the model and attached, before any folder is written; one line where it is bad."""
    path = getattr(opts, "features", None)
    if path is None:
        return
    from ..models.dictionaries import load_features

    adapter.attach_features(load_features(path, adapter))


def out_of(cmd: Command, opts: RunOptions) -> Any:
    """Refuse a bad output folder before any work: a checked RunFolder, a store path, or None."""
    if cmd.writes == "folder":
        from ..store.run_folder import RunFolder, default_out

        return RunFolder(opts.out or default_out(cmd.out_kind or cmd.name), cmd.name, opts.overwrite)
    if cmd.writes == "store":
        if opts.out is None:
            raise StreetlampError(f"{cmd.name} needs --out (its run folder; the same command resumes it)")
        from ..store.run_folder import check_store_out

        check_store_out(opts.out)
        return Path(opts.out)
    return None


def write_report_or_warn(folder: Path) -> None:
    """``report.html`` for a finished run: a viewer failure warns (the results are kept and
    ``streetlamp report DIR`` can be run again), it never discards the computed results."""
    from ..report.viewer import write_report

    try:
        write_report(folder)
    except Exception as e:  # noqa: BLE001 - the results matter more than their page
        print(
            f"streetlamp: warning: report.html not written ({type(e).__name__}: {e}); "
            f"rerun `streetlamp report {folder}`",
            file=sys.stderr,
        )


def execute(cmd: Command, values: dict[str, Any]) -> Any:
    """The one pipeline: settings and options from ``values`` (checked), the output folder (refused
    when bad), the model (loaded, placed, validated), ``run``, then ``report.html`` when the command
    declares views. Every refusal is a StreetlampError raised before anything is written."""
    values = dict(values)
    with command_flags(cmd.flags()):  # shared code names only this command's options in its messages
        opts = cmd.options(values)
        settings = build(cmd.settings, values)
        check_extra(cmd)
        out = out_of(cmd, opts)
        adapter = place(cmd, opts, settings) if cmd.needs_model else None
        res = cmd.run(adapter, settings, out, opts)
        if cmd.views and getattr(res, "out", None) is not None:
            write_report_or_warn(Path(res.out))
        return res
