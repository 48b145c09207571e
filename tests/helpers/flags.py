"""Which options a message names, checked against the command that printed it (issue 35 item 5).

:func:`foreign_flags` is applied to every error of every command run anywhere in the suite
(``tests/conftest.py`` wraps :func:`streetlamp.commands.execute`), so a message that tells the user to pass
an option the command does not have fails the test that provoked it."""

from __future__ import annotations

import re
from typing import Any

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
OTHER = re.compile(r"streetlamp ([a-z][a-z-]*[a-z])")  # `streetlamp lens-fit --convert`: that command's options
PIP = re.compile(r"pip install[^;,)]*")  # pip's own options


def foreign_flags(cmd: Any, message: str) -> list[str]:
    """The options named in ``message`` that ``cmd`` does not take (none of the options of a command the
    message names as ``streetlamp OTHER`` either)."""
    from streetlamp.commands import COMMANDS

    allowed = set(cmd.flags())
    by_name = {c.name: c for c in COMMANDS}
    for other in OTHER.findall(message):
        if other in by_name:
            allowed |= by_name[other].flags()
    text = PIP.sub("", message)
    return [f for f in FLAG.findall(text) if f not in allowed]
