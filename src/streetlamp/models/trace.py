"""Sessions: record and edit activations at named sites for one or more forward passes.

Hooks exist only inside :meth:`Session.__enter__` / ``__exit__`` and are always removed in
``finally``. The attention function finds the active session through a context variable
(:mod:`streetlamp.models.context`). A family's extra hooks (its ``embed_hook``, its ``attention_hooks``
when it computes attention in its own module) come from its object in :mod:`streetlamp.models.families`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from contextvars import Token
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..errors import StreetlampError
from .context import active_session, enter_session, exit_session
from .sites import output_matrix, parse_site

if TYPE_CHECKING:
    from .adapter import ModelAdapter

Edit = Callable[[torch.Tensor], torch.Tensor]
__all__ = ["Edit", "Session", "active_session", "expand_sites"]


def expand_sites(patterns: Iterable[str], names: list[str]) -> list[str]:
    """Expand glob patterns (``layers.*.attn.pattern``) against the model's site names."""
    out: list[str] = []
    for p in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, p)]
        if not hits:
            example = next((n for n in names if n.endswith(".pattern")), "")
            raise StreetlampError(f"no site matches {p!r}; sites look like {names[0]!r}, {example!r}")
        out.extend(h for h in hits if h not in out)
    return out


class Session:
    """Record and/or edit named sites during forward passes of ``adapter.hf_model``.

    ``record``: site names or glob patterns to keep in :attr:`cache` (the last forward pass wins).
    ``edit``: site name -> function mapping the activation to its replacement (same shape).
    ``keep_grad``: keep recorded tensors in the autograd graph (for gradients w.r.t. a site).
    ``cache["allowed"]`` is always filled: ``[batch, query, key]`` bool, the mask the model applied;
    where layers differ (sliding-window and global layers) the union over layers: a key is allowed
    if some layer lets the query see it (a sliding layer's out-of-window weights are exactly 0).
    """

    def __init__(
        self,
        adapter: ModelAdapter,
        record: Iterable[str] = (),
        edit: dict[str, Edit] | None = None,
        keep_grad: bool = False,
    ) -> None:
        names = adapter.site_names
        self.adapter = adapter
        self.record = set(expand_sites(record, names))
        self.edits: dict[str, Edit] = dict(edit or {})
        for e in self.edits:
            if e not in names:
                raise StreetlampError(f"unknown site {e!r}")
        self.keep_grad = keep_grad
        self.cache: dict[str, torch.Tensor] = {}
        self._layer_of = {id(m): i for i, m in enumerate(adapter.attn_modules)}
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._token: Token[Session | None] | None = None
        self._z: dict[int, torch.Tensor] = {}
        self._allowed_batch: int | None = None
        wanted = self.record | set(self.edits)
        self._head_out_layers = {parse_site(s)[0] for s in wanted if s.endswith("attn.head_out")}

    # -- called from the attention function -------------------------------------------------
    def layer_of(self, module: nn.Module) -> int | None:
        return self._layer_of.get(id(module))

    def attn_site(self, module: nn.Module) -> tuple[int, str] | None:
        """(layer, site prefix) of an attention module's call, e.g. (3, "layers.3.attn"); None if not ours."""
        l = self._layer_of.get(id(module))
        return None if l is None else (l, f"layers.{l}.attn")

    def note_allowed(self, allowed: torch.Tensor, batch: int, layer: int, prefix: str = "") -> None:
        a = allowed[:, 0] if allowed.dim() == 4 else allowed
        a = a.expand(batch, *a.shape[-2:]).detach()
        prev = self.cache.get("allowed")
        # layer 0 starts a forward pass; later layers widen it (union over layers)
        self.cache["allowed"] = a if layer == 0 or prev is None or prev.shape != a.shape else prev | a

    def stash_z(self, layer: int, z: torch.Tensor) -> None:
        if layer in self._head_out_layers:
            self._z[layer] = z

    def site(self, name: str, value: torch.Tensor) -> torch.Tensor:
        fn = self.edits.get(name)
        if fn is not None:
            new = fn(value)
            if not isinstance(new, torch.Tensor) or new.shape != value.shape:
                raise StreetlampError(f"edit at {name} must return a tensor of shape {tuple(value.shape)}")
            value = new
        if name in self.record:
            self.cache[name] = value if self.keep_grad else value.detach()
        return value

    # -- module hooks --------------------------------------------------------------------------
    def wants(self, name: str) -> bool:
        """The session records or edits site ``name``."""
        return name in self.record or name in self.edits

    _wants = wants

    def _out_hook(self, name: str) -> Callable:
        def hook(module: nn.Module, args: tuple, output: object) -> object:
            if isinstance(output, tuple):
                return (self.site(name, output[0]),) + tuple(output[1:])
            return self.site(name, output)  # type: ignore[arg-type]

        return hook

    def _pre_hook(self, name: str) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            if args:
                return (self.site(name, args[0]),) + tuple(args[1:]), kwargs
            kwargs = dict(kwargs)
            kwargs["hidden_states"] = self.site(name, kwargs["hidden_states"])
            return args, kwargs

        return hook

    def _head_out_hook(self, layer: int, o_proj: nn.Module) -> Callable:
        name = f"layers.{layer}.attn.head_out"
        n_heads = self.adapter.n_heads

        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
            z = self._z.pop(layer)
            w = output_matrix(o_proj, n_heads)  # [head, d_head, d_model]
            heads = torch.einsum("bshd,hdm->bshm", z, w.to(z.dtype))
            new = self.site(name, heads)
            if new is not heads:
                output = output + (new - heads).sum(2)
            return output

        return hook

    def __enter__(self) -> Session:
        a = self.adapter
        fam = a.family
        try:
            if self._wants("embed") and fam.embed_hook is not None:
                self._handles.append(a.embed_module.register_forward_hook(fam.embed_hook(self), with_kwargs=True))
            elif self._wants("embed"):
                self._handles.append(a.embed_module.register_forward_hook(self._out_hook("embed")))
            for l, layer in enumerate(a.layer_modules):
                if a.features is not None:  # before the layer's own resid_pre / mlp.out hooks
                    from .features import feature_hooks

                    self._handles.extend(feature_hooks(self, l, layer))
                if self._wants(f"layers.{l}.resid_pre"):
                    self._handles.append(
                        layer.register_forward_pre_hook(self._pre_hook(f"layers.{l}.resid_pre"), with_kwargs=True)
                    )
                if self._wants(f"layers.{l}.resid_post"):
                    self._handles.append(layer.register_forward_hook(self._out_hook(f"layers.{l}.resid_post")))
                if fam.attention_hooks is not None:
                    self._handles.extend(fam.attention_hooks(self, l, a.attn_modules[l]))
                o_proj = a.o_proj_modules[l]
                if l in self._head_out_layers:
                    self._handles.append(o_proj.register_forward_hook(self._head_out_hook(l, o_proj)))
                if self._wants(f"layers.{l}.attn.out"):
                    self._handles.append(o_proj.register_forward_hook(self._out_hook(f"layers.{l}.attn.out")))
                if fam.experts is not None:
                    from .moe import expert_hooks

                    self._handles.extend(expert_hooks(self, l, layer, fam.experts))
                if self._wants(f"layers.{l}.mlp.out"):
                    self._handles.append(
                        a.mlp_out_modules[l].register_forward_hook(self._out_hook(f"layers.{l}.mlp.out"))
                    )
            self._token = enter_session(self)
        except BaseException:
            self._remove()
            raise
        return self

    def _remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._z.clear()

    def __exit__(self, *exc: object) -> None:
        try:
            if self._token is not None:
                exit_session(self._token)
                self._token = None
        finally:
            self._remove()
