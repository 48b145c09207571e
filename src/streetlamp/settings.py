"""Settings: one typed dataclass per command whose fields carry their command-line metadata once.

A field declared with :func:`option` holds its default, its flag, help, choices and, for a string the
user types that becomes a richer value (a list of methods, JSON parameters), the ``parse`` function
from :mod:`streetlamp.specs`. The CLI's parser, the Python API's keywords and the checks all come
from these fields (``streetlamp.commands``). Two checks: :meth:`Settings.check` needs nothing
(ranges, choices, JSON) and runs before any output exists; :meth:`Settings.validate` needs the model
(layers, heads, classes, model kind) and runs right after loading it. Both raise
:class:`~streetlamp.errors.StreetlampError` (one line, exit 2). ``batch_size`` is the token budget of
one forward pass (:mod:`streetlamp.batching`), under that one name from ``--batch-size`` to the engine.

The options every model-running command shares (model, out, overwrite, seed, batch size, device,
dtype, device map, max memory, offload folder, force) are declared here once: ``seed`` and
``batch_size`` as :func:`seed_option` / :func:`batch_size_option` fields, the rest in
:class:`RunOptions`; a command says which it takes and with which defaults in :class:`Shared`.
This module imports no model and no torch (``streetlamp --help`` reads it).
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field
from typing import TYPE_CHECKING, Any, Self

from .errors import StreetlampError
from .specs import layer_spec

if TYPE_CHECKING:
    from .models.adapter import ModelAdapter

DEFAULT_MODEL = "minilm-sentiment"  # models.loading.DEFAULT_MODEL (the same: tests/commands/test_cli_commands.py)
__all__ = ["DEFAULT_MODEL", "Opt", "RunOptions", "Settings", "Shared", "layer_spec", "option"]


# -- one field, its command-line metadata ----------------------------------------------------------------
@dataclass(frozen=True)
class Opt:
    """A field's command line: ``flag`` (default ``--field-name``; ``--no-x`` stores False), help,
    choices, a positional argument, ``parse`` (the user's string -> the field's value) and whether
    the flag is ``required``. ``cli=False``: a field the command fills, not the user."""

    help: str | None = None
    flag: str | None = None
    choices: tuple[str, ...] | None = None
    positional: bool = False
    nargs: str | None = None
    required: bool = False
    parse: Callable[[str], Any] | None = None
    type: Callable[[str], Any] | None = None
    action: str | None = None
    cli: bool = True
    # the value's constraints, declared once and checked by :func:`build` for the CLI and the API alike
    ge: float | None = None  # at least
    gt: float | None = None  # greater than
    le: float | None = None  # at most
    lt: float | None = None  # less than
    finite: bool = True  # a float field refuses nan and +-inf unless False


def option(default: Any = MISSING, *, default_factory: Any = MISSING, **opt: Any) -> Any:
    """A dataclass field with its command-line metadata (:class:`Opt`), declared once."""
    if opt.get("choices") is not None:
        opt["choices"] = tuple(opt["choices"])
    meta = {"cli": Opt(**opt)}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def opt_of(f: dataclasses.Field) -> Opt | None:
    return f.metadata.get("cli")


def flag_of(f: dataclasses.Field) -> str:
    o = opt_of(f)
    return (o and o.flag) or "--" + f.name.replace("_", "-")


def cli_fields(cls: type) -> list[tuple[dataclasses.Field, Opt, Any]]:
    """``(field, Opt, its type)`` for every field of ``cls`` the user sets."""
    hints = typing.get_type_hints(cls)
    return [(f, o, hints[f.name]) for f in dataclasses.fields(cls) if (o := opt_of(f)) is not None and o.cli]


def seed_option(default: int = 0) -> Any:
    return option(default, help="random seed (default 0)")


def batch_size_option() -> Any:
    return option(None, help="token budget per forward pass (rows x padded length; default 1024 on CPU)")


def scalar_type(hint: Any) -> Any:
    """``int | None`` -> ``int``; ``list[str]`` -> ``list``; a union of several types -> ``str``."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return scalar_type(args[0]) if len(args) == 1 else str
    return typing.get_origin(hint) or hint


def _optional(hint: Any) -> bool:
    return (isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union) and type(None) in (
        typing.get_args(hint)
    )


TRUE, FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


def coerce(value: Any, hint: Any, o: Opt | None, flag: str) -> Any:
    """One user value (a CLI string, or a Python value from the API) as its field's type, checked against
    the field's declared constraints (choices, ge/gt/le/lt, finite). The one check of a value's type and
    range: the CLI and the API refuse the same values with the same one-line message."""
    o = o or Opt()
    if value is None:
        if _optional(hint) or o.parse is not None:
            return None
        raise StreetlampError(f"{flag} must be given (got None)")
    t = scalar_type(hint)
    if o.parse is not None:
        if not isinstance(value, str) and t in (list, dict, tuple) and not isinstance(value, (list, tuple, dict)):
            raise StreetlampError(f"{flag} must be {'a JSON object' if t is dict else 'a list'} (got {value!r})")
        if t is dict and isinstance(value, (list, tuple)):
            raise StreetlampError(f"{flag} must be a JSON object (got {value!r})")
        if t is list and isinstance(value, (list, tuple)) and not all(isinstance(x, str) for x in value):
            raise StreetlampError(f"{flag} must be a list of names (got {value!r})")
        try:
            value = o.parse(value)
        except StreetlampError:
            raise
        except (TypeError, ValueError, AttributeError) as e:
            raise StreetlampError(f"{flag}: cannot read {value!r} ({e})") from None
    elif t is bool:
        if isinstance(value, str) and value.strip().lower() in TRUE + FALSE:
            value = value.strip().lower() in TRUE
        elif not isinstance(value, bool):
            raise StreetlampError(f"{flag} must be true or false (got {value!r})")
    elif t is int:
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise StreetlampError(f"{flag} must be an integer (got {value!r})") from None
        elif isinstance(value, float) and value.is_integer():
            value = int(value)
        elif isinstance(value, bool) or not isinstance(value, int):
            raise StreetlampError(f"{flag} must be an integer (got {value!r})")
    elif t is float:
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise StreetlampError(f"{flag} must be a number (got {value!r})") from None
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise StreetlampError(f"{flag} must be a number (got {value!r})")
        value = float(value)
        if o.finite and not math.isfinite(value):
            raise StreetlampError(f"{flag} must be a finite number (got {value})")
    elif t is str:
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str):
            raise StreetlampError(f"{flag} must be a string (got {value!r})")
    if o.choices is not None and isinstance(value, str) and value not in o.choices:
        raise StreetlampError(f"{flag} must be one of {', '.join(o.choices)} (got {value!r})")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        bound(value, o, flag)
    return value


def bound(value: float, o: Opt, flag: str) -> None:
    """``value`` within the field's declared ``ge``/``gt``/``le``/``lt``."""
    if o.ge is not None and value < o.ge:
        raise StreetlampError(f"{flag} must be at least {_num(o.ge)} (got {_num(value)})")
    if o.gt is not None and value <= o.gt:
        raise StreetlampError(f"{flag} must be greater than {_num(o.gt)} (got {_num(value)})")
    if o.le is not None and value > o.le:
        raise StreetlampError(f"{flag} must be at most {_num(o.le)} (got {_num(value)})")
    if o.lt is not None and value >= o.lt:
        raise StreetlampError(f"{flag} must be less than {_num(o.lt)} (got {_num(value)})")


def _num(x: float) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


def build(cls: type, values: dict[str, Any], *, keep: tuple[str, ...] = ()) -> Any:
    """``cls`` from user values: each through :func:`coerce` (its field's ``parse`` for a CLI string or
    the Python value, its type, its declared constraints), then ``check()``. ``keep``: fields passed
    through as they are (``model``: an already loaded adapter)."""
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in values if k not in names]
    if unknown:
        raise StreetlampError(f"unknown setting(s) {', '.join(unknown)}; settings: {', '.join(names)}")
    hints = typing.get_type_hints(cls)
    parsed = {}
    for k, v in values.items():
        f = names[k]
        o = opt_of(f)
        name = f.name.upper() if o is not None and o.positional else flag_of(f)  # a positional has no flag
        parsed[k] = v if k in keep else coerce(v, hints[k], o, name)
    s = cls(**parsed)
    check = getattr(s, "check", None)
    if check is not None:
        check()
    return s


# -- shared checks -------------------------------------------------------------------------------------
def at_least(value: int | float | None, minimum: int | float, flag: str) -> None:
    """``value`` (when given) is at least ``minimum``."""
    if value is not None and value < minimum:
        raise StreetlampError(f"{flag} must be at least {minimum} (got {value})")


def check_layer(adapter: ModelAdapter, layer: int | None, flag: str = "--layer") -> None:
    if layer is not None and not 0 <= layer < adapter.n_layers:
        raise StreetlampError(f"{flag} {layer} out of range: the model has layers 0..{adapter.n_layers - 1}")


def check_head(adapter: ModelAdapter, head: int | None, flag: str = "--head") -> None:
    if head is not None and not 0 <= head < adapter.n_heads:
        raise StreetlampError(f"{flag} {head} out of range: the model has heads 0..{adapter.n_heads - 1}")


def layers_of(adapter: ModelAdapter, spec: str, flag: str = "layers") -> list[int]:
    """The layers a ``last`` / ``all`` / number choice means for this model; out of range is an error."""
    if layer_spec(spec, flag) == "all":
        return list(range(adapter.n_layers))
    if spec == "last":
        return [adapter.n_layers - 1]
    check_layer(adapter, int(spec), flag)
    return [int(spec)]


@dataclass
class Settings:
    """Fields shared by every command that writes a run folder."""

    seed: int = seed_option()
    batch_size: int | None = batch_size_option()

    @classmethod
    def from_values(cls, **values: Any) -> Self:
        """The settings from user values (CLI strings or Python values), parsed and checked."""
        return build(cls, values)

    def check(self) -> None:
        at_least(self.batch_size, 1, "--batch-size")

    def validate(self, adapter: ModelAdapter) -> None:
        """Checks that need the model; run after loading it and before any output."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class NoSettings:
    """A command without settings of its own (``models``, ``methods``)."""

    def check(self) -> None:
        pass

    def validate(self, adapter: ModelAdapter) -> None:
        pass


# -- the options that place the model and the run, declared once --------------------------------------
@dataclass
class RunOptions:
    """Where the model comes from and goes, and where the run is written."""

    model: str | None = option(None, help="embedded name or checkpoint folder")
    out: str | None = option(None, help="output folder")
    overwrite: bool = option(False, help="replace a non-empty output folder")
    device: str = option("cpu", help="cpu, cuda, cuda:0 ...")
    dtype: str = option(
        "float32",
        choices=("float32", "bfloat16", "float16"),
        help="model weights' dtype (bfloat16/float16 for GPUs; scores are returned as float32)",
    )
    force: bool = option(False, help="run even when the memory estimate says it will not fit")
    device_map: str | None = option(
        None,
        choices=("auto",),
        help="spread the model over GPUs, CPU and disk (accelerate); see --max-memory, --offload-folder",
    )
    max_memory: str | None = option(None, help="with --device-map: e.g. '0=20GiB,cpu=30GiB'")
    offload_folder: str | None = option(None, help="with --device-map: where layers that do not fit go")
    features: str | None = option(
        None,
        help="a feature set folder (streetlamp's, SAELens's or circuit-tracer's): its SAEs and transcoders "
        "spliced in as sites layers.L.resid_pre.features / layers.L.mlp.features (docs/feature-sets.md)",
    )

    def check(self) -> None:
        from .specs import parse_max_memory

        if self.device_map is None and (self.max_memory or self.offload_folder):
            raise StreetlampError("--max-memory and --offload-folder need --device-map auto")
        if self.device_map is not None and self.device != "cpu":
            raise StreetlampError("--device and --device-map exclude each other: the map places the model")
        parse_max_memory(self.max_memory)


PLACEMENT = ("dtype", "device_map", "max_memory", "offload_folder")


@dataclass(frozen=True)
class Shared:
    """Which shared options a command takes, with its defaults: ``takes_model``/``model`` (its default),
    ``out`` (its help; None: no ``--out``), ``device`` (``--device`` and ``--dtype``, always together: every
    command that places a model takes both), ``placement`` (``--device-map`` and its two companions),
    ``force`` (only where the memory estimate is checked), ``seed``/``batch_size`` (the settings fields of
    those names get a flag), ``features`` (``--features DICT``, opt-in: a command whose own settings have a
    ``features`` field keeps it)."""

    takes_model: bool = True
    model: str | None = DEFAULT_MODEL
    model_help: str | None = None
    out: str | None = "output folder"
    out_required: bool = False
    overwrite: bool = True
    seed: bool = True
    batch_size: bool = True
    device: bool = True
    placement: bool = True
    force: bool = False
    features: bool = False  # ``--features DICT``: a feature set loaded, checked and attached to the model

    def options(self) -> list[str]:
        """The :class:`RunOptions` fields this command takes."""
        names = ["model"] * self.takes_model + ["out"] * (self.out is not None)
        names += ["overwrite"] * self.overwrite + ["device", "dtype"] * self.device
        if self.placement:
            names += [*(["force"] if self.force else []), "device_map", "max_memory", "offload_folder"]
        return names + ["features"] * self.features

    def defaults(self) -> dict[str, Any]:
        return {"model": self.model}


NONE = Shared(takes_model=False, out=None, overwrite=False, seed=False, batch_size=False, device=False, placement=False)
