"""Progress of a long computation, for a listener in the same thread (``streetlamp serve`` shows it in the page).

Methods count their work with :func:`bar` (a tqdm bar on the console, as before) or :func:`iterate`; each
step is also reported to the listener installed by :func:`listening` in the calling thread, if any, as
``(what, done, total)``, and the console bar is left out. A listener may raise to stop the computation at
its next step (the server's timeout does). Without a listener nothing changes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from tqdm import tqdm  # text bars everywhere (tqdm.auto warns in notebooks without ipywidgets)

Listener = Callable[[str, int, int], None]
T = TypeVar("T")
_local = threading.local()


@contextmanager
def listening(fn: Listener) -> Iterator[None]:
    """Send this thread's progress reports to ``fn(what, done, total)`` inside the block."""
    old = getattr(_local, "fn", None)
    _local.fn = fn
    try:
        yield
    finally:
        _local.fn = old


def report(what: str, done: int, total: int) -> None:
    fn = getattr(_local, "fn", None)
    if fn is not None:
        fn(what, done, total)


class Bar:
    """A tqdm bar (same arguments) whose updates also reach the thread's listener."""

    def __init__(self, total: int, desc: str, **kw: Any) -> None:
        if getattr(_local, "fn", None) is not None:  # the listener shows it: no console bar as well
            kw["disable"] = True
        self.bar, self.total, self.desc, self.done = tqdm(total=total, desc=desc, **kw), total, desc, 0
        report(desc, 0, total)

    def update(self, n: int = 1) -> None:
        self.bar.update(n)
        self.done += n
        report(self.desc, self.done, self.total)

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()


def bar(total: int, desc: str, **kw: Any) -> Bar:
    return Bar(total, desc, **kw)


def iterate(items: Iterable[T], desc: str, **kw: Any) -> Iterator[T]:
    """``items`` one by one, counted after each has been processed."""
    xs = list(items)
    with Bar(len(xs), desc, **kw) as b:
        for x in xs:
            yield x
            b.update(1)
