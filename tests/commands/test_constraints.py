"""Every field's type and range are declared once (``option(ge=, gt=, le=, lt=, finite=, choices=)``) and checked
by ``settings.coerce`` for the CLI (strings) and the API (Python values) alike (issues 35 item 3, 36 item 2)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from streetlamp.commands import COMMANDS
from streetlamp.errors import StreetlampError
from streetlamp.settings import Opt, RunOptions, build, cli_fields, coerce, flag_of


@pytest.mark.parametrize(
    "value,hint,opt,want",
    [
        ("3", int, Opt(), 3),
        (3.0, int, Opt(), 3),
        ("0.5", float, Opt(), 0.5),
        (1, float, Opt(), 1.0),
        ("true", bool, Opt(), True),
        ("off", bool, Opt(), False),
        (None, int | None, Opt(), None),
        ("inf", float, Opt(finite=False), math.inf),
        ("a", str, Opt(choices=("a", "b")), "a"),
    ],
)
def test_coerce_accepts_the_cli_strings_and_the_python_values(value, hint, opt, want) -> None:
    got = coerce(value, hint, opt, "--x")
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize(
    "value,hint,opt,msg",
    [
        (2.5, int, Opt(), "--x must be an integer (got 2.5)"),
        (True, int, Opt(), "--x must be an integer (got True)"),
        ("ten", int, Opt(), "--x must be an integer (got 'ten')"),
        ("nan", float, Opt(), "--x must be a finite number (got nan)"),
        (math.inf, float, Opt(), "--x must be a finite number (got inf)"),
        ("maybe", bool, Opt(), "--x must be true or false (got 'maybe')"),
        (123, str, Opt(), "--x must be a string (got 123)"),
        (None, int, Opt(), "--x must be given (got None)"),
        ("c", str, Opt(choices=("a", "b")), "--x must be one of a, b (got 'c')"),
        (0, int, Opt(ge=1), "--x must be at least 1 (got 0)"),
        (0.0, float, Opt(gt=0), "--x must be greater than 0 (got 0)"),
        (11, int, Opt(le=10), "--x must be at most 10 (got 11)"),
        (1.0, float, Opt(lt=1), "--x must be less than 1 (got 1)"),
        ([1, 2], dict, Opt(parse=dict), "--x must be a JSON object (got [1, 2])"),
        (5, list, Opt(parse=list), "--x must be a list (got 5)"),
    ],
)
def test_coerce_refuses_in_one_line(value, hint, opt, msg) -> None:
    with pytest.raises(StreetlampError) as e:
        coerce(value, hint, opt, "--x")
    assert str(e.value) == msg


def _cases() -> list[tuple[str, type, dataclasses.Field, Opt, object]]:
    out = []
    for c in COMMANDS:
        for f, o, hint in cli_fields(c.settings):
            out.append((c.name, c.settings, f, o, hint))
    return out


@pytest.mark.parametrize("name,cls,f,o,hint", _cases(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_default_satisfies_its_own_declaration(name, cls, f, o, hint) -> None:
    if f.default is dataclasses.MISSING or o.required or o.parse is not None:
        return  # a required field has no real default; a parsed one holds the parsed value
    assert coerce(f.default, hint, o, flag_of(f)) == f.default, (name, f.name)


def _bounded() -> list[tuple[str, type, str, str, object]]:
    out = []
    for c in COMMANDS:
        for f, o, _hint in cli_fields(c.settings):
            for k, delta in (("ge", -1), ("gt", 0), ("le", 1), ("lt", 0)):
                b = getattr(o, k)
                if b is not None:
                    out.append((c.name, c.settings, f.name, flag_of(f), b + delta))
    return out


@pytest.mark.parametrize("name,cls,field,flag,bad", _bounded())
def test_a_value_out_of_its_declared_range_is_refused_alike_from_cli_and_api(name, cls, field, flag, bad) -> None:
    msgs = []
    for v in (str(bad), bad):  # the CLI passes the string, the API the value
        with pytest.raises(StreetlampError) as e:
            build(cls, {field: v})
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1] and msgs[0].startswith(flag), msgs


def test_run_options_refuse_a_wrong_type_in_one_line() -> None:
    with pytest.raises(StreetlampError, match=r"^--model must be a string \(got 42\)$"):
        build(RunOptions, {"model": 42})
    with pytest.raises(StreetlampError, match=r"^--dtype must be one of float32, bfloat16, float16 \(got 'int8'\)$"):
        build(RunOptions, {"dtype": "int8"})
