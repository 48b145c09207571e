"""One exception type for everything a user can get wrong; the CLI prints it in one line.

A message names only options of the command that prints it (issue 35 item 5): code shared by several
commands (the model's encoder, the data readers) asks :func:`takes` before it names an option, and
:func:`~streetlamp.commands.base.execute` says which options the running command has
(:func:`command_flags`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_FLAGS: ContextVar[frozenset[str] | None] = ContextVar("streetlamp_command_flags", default=None)


class StreetlampError(Exception):
    """Bad input or an impossible request, explained in one line for the user."""


def takes(flag: str) -> bool:
    """Whether the command running now has the option ``flag`` (e.g. ``"--truncate"``), so that a message
    may tell the user to pass it. Outside a command (the library called directly) every option counts."""
    flags = _FLAGS.get()
    return flags is None or flag in flags


@contextmanager
def command_flags(flags: Iterable[str]) -> Iterator[None]:
    """Within: :func:`takes` answers for a command whose options are ``flags``."""
    token = _FLAGS.set(frozenset(flags))
    try:
        yield
    finally:
        _FLAGS.reset(token)
