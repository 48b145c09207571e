"""The ambient state the registered attention function reads, in one place.

Hugging Face calls streetlamp's attention function (:mod:`streetlamp.models.attention`) with its own
arguments only, so what a call should do besides attend comes from context variables set by the code
around the forward pass:

* the active :class:`~streetlamp.models.trace.Session` (record / edit the attention sites);
* the long-context :class:`~streetlamp.models.chunked.Recorder` (attention in query chunks, rows to disk);
* the fused flag (layers whose weights nobody asked for run the fused kernel);
* AttnLRP's rule switch (the soft-cap's identity rule, :func:`streetlamp.models.relevance.soft_cap`).

Each is set for a ``with`` block (or a session's enter / exit) and always reset afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .chunked import Recorder
    from .trace import Session

_SESSION: ContextVar[Session | None] = ContextVar("streetlamp_session", default=None)
_RECORDER: ContextVar[Recorder | None] = ContextVar("streetlamp_long_recorder", default=None)
_FUSED: ContextVar[bool] = ContextVar("streetlamp_fused_attention", default=False)
_RULES_ON: ContextVar[bool] = ContextVar("streetlamp_relevance_rules", default=False)


# -- the session -------------------------------------------------------------------------------------
def active_session() -> Session | None:
    return _SESSION.get()


def enter_session(session: Session) -> Token[Session | None]:
    """Make ``session`` the active one; give the token back to :func:`exit_session`."""
    return _SESSION.set(session)


def exit_session(token: Token[Session | None]) -> None:
    _SESSION.reset(token)


# -- the long-context recorder -----------------------------------------------------------------------
def active_recorder() -> Recorder | None:
    return _RECORDER.get()


@contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Inside this block every attention call goes to ``recorder`` (chunked attention)."""
    token = _RECORDER.set(recorder)
    try:
        yield recorder
    finally:
        _RECORDER.reset(token)


# -- the fused kernel --------------------------------------------------------------------------------
@contextmanager
def fused_attention(on: bool = True) -> Iterator[None]:
    """Inside this block, layers whose weights nobody asked for (no recorded or edited ``attn.v``,
    ``attn.pattern`` or ``attn.z`` site) run ``torch.nn.functional.scaled_dot_product_attention``
    (no ``[head, query, key]`` tensor is returned; soft-capped layers, Gemma 2's, stay eager)."""
    token = _FUSED.set(on)
    try:
        yield
    finally:
        _FUSED.reset(token)


def fused_on() -> bool:
    return _FUSED.get()


# -- AttnLRP's rules ---------------------------------------------------------------------------------
@contextmanager
def rules_on() -> Iterator[None]:
    """AttnLRP's modified backward is installed for this block (see models/relevance.py)."""
    token = _RULES_ON.set(True)
    try:
        yield
    finally:
        _RULES_ON.reset(token)


def relevance_rules_on() -> bool:
    return _RULES_ON.get()
