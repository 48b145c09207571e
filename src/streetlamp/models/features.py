"""Features as sites: sparse dictionaries (SAEs, transcoders) spliced into the model at named sites.

A :class:`Dictionary` is one sparse dictionary at one layer (METHODS.md §13):

- an **SAE** on ``layers.{l}.resid_pre``: ``a = σ(W_enc (x − b_dec) + b_enc)``, ``x̂ = a W_dec + b_dec``;
- a **transcoder** at ``layers.{l}.mlp``: reads the MLP's input (the block's own input, after the pre-MLP
  norm of a pre-norm family), reconstructs the MLP's output (the ``mlp.out`` site), optionally with a
  linear skip term ``x W_skip`` (circuit-tracer's skip transcoders).

σ is ReLU, TopK (the k largest pre-activations kept, ReLU'd) or JumpReLU (``z · [z > θ]`` per latent).

A :class:`FeatureSet` attached to an adapter (:meth:`ModelAdapter.attach_features`) adds, per dictionary,

==========================================  ============================  ===================================
name                                        shape                         what
==========================================  ============================  ===================================
``layers.{l}.resid_pre.features``           ``[batch, pos, feature]``     the SAE's latent activations
``layers.{l}.resid_pre.features_error``     ``[batch, pos, d_model]``     ``x − x̂`` (the SAE's error)
``layers.{l}.mlp.features``                 ``[batch, pos, feature]``     the transcoder's latents
``layers.{l}.mlp.features_error``           ``[batch, pos, d_model]``     ``mlp_out − recon`` (its error)
==========================================  ============================  ===================================

The spliced activation is ``decode(a') + e'`` where ``a'``, ``e'`` are the (possibly edited) features and
error: with both kept the model is the original one. When neither site is edited and no gradient is asked
for, the original activation flows on untouched (bit for bit); with ``keep_grad`` the splice is always made,
so that gradients reach the recorded features (through the decoder only) and the error (identity), and
the input's gradient is unchanged (``I − D E' + D E' = I``). The feature sites come before the layer's own
site in the forward order: editing features changes what ``resid_pre`` / ``mlp.out`` then record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

from ..errors import StreetlampError
from . import screen

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

    from .adapter import ModelAdapter
    from .trace import Session

__all__ = [
    "ACTIVATIONS",
    "FEATURE_KINDS",
    "FEATURE_SITES",
    "Dictionary",
    "FeatureSet",
    "feature_hooks",
    "feature_site",
]

Activation = Literal["relu", "topk", "jumprelu"]
ACTIVATIONS: tuple[str, ...] = ("relu", "topk", "jumprelu")
# where a dictionary sits -> its kind: an SAE on the residual stream, a transcoder replacing the MLP
FEATURE_KINDS: dict[str, str] = {"resid_pre": "sae", "mlp": "transcoder"}
# the sites a dictionary adds to its layer (relative to ``layers.{l}.``), in forward order
FEATURE_SITES: dict[str, tuple[str, str]] = {
    "resid_pre": ("resid_pre.features", "resid_pre.features_error"),
    "mlp": ("mlp.features", "mlp.features_error"),
}


# decode from the active latents only when at most this share of a row's latents is nonzero (Dictionary.decode)
SPARSE_DECODE = 1 / 16


def feature_site(layer: int, where: str, error: bool = False) -> str:
    """``layers.{layer}.{where}.features`` (or ``.features_error``)."""
    return f"layers.{layer}.{FEATURE_SITES[where][int(error)]}"


@dataclass(eq=False)
class Dictionary:
    """One sparse dictionary at ``layer``: ``where`` is ``resid_pre`` (an SAE) or ``mlp`` (a transcoder).

    ``W_enc [d_in, width]``, ``b_enc [width]``, ``W_dec [width, d_out]``, ``b_dec [d_out]``; ``threshold
    [width]`` for JumpReLU; ``k`` for TopK; ``b_dec_in``: subtract ``b_dec`` from the input before encoding
    (the standard SAE; transcoders do not); ``W_skip [d_in, d_out]``: a transcoder's linear skip term.
    """

    layer: int
    where: Literal["resid_pre", "mlp"]
    W_enc: torch.Tensor
    b_enc: torch.Tensor
    W_dec: torch.Tensor
    b_dec: torch.Tensor
    activation: Activation = "relu"
    k: int | None = None
    threshold: torch.Tensor | None = None
    b_dec_in: bool = False
    W_skip: torch.Tensor | None = None
    _cast: dict[tuple[torch.device, torch.dtype], dict[str, torch.Tensor | None]] = field(
        default_factory=dict, repr=False
    )
    _screened: dict = field(default_factory=dict, repr=False)  # the bfloat16 screen's cache (models/screen.py)

    def __post_init__(self) -> None:
        d_in, width = self.W_enc.shape
        if self.where not in FEATURE_SITES:
            raise StreetlampError(f"a dictionary sits at resid_pre or mlp, not {self.where!r}")
        if self.activation not in ACTIVATIONS:
            raise StreetlampError(f"activation {self.activation!r}: use one of {', '.join(ACTIVATIONS)}")
        shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
            "b_enc": (tuple(self.b_enc.shape), (width,)),
            "W_dec": (tuple(self.W_dec.shape[:1]), (width,)),
            "b_dec": (tuple(self.b_dec.shape), (self.W_dec.shape[1],)),
        }
        if self.threshold is not None:
            shapes["threshold"] = (tuple(self.threshold.shape), (width,))
        if self.W_skip is not None:
            shapes["W_skip"] = (tuple(self.W_skip.shape), (d_in, self.W_dec.shape[1]))
        for name, (got, want) in shapes.items():
            if tuple(got) != tuple(want):
                raise StreetlampError(
                    f"dictionary at layer {self.layer} ({self.where}): {name} has shape {tuple(got)}, expected "
                    f"{tuple(want)} (W_enc is {tuple(self.W_enc.shape)})"
                )
        if self.where == "resid_pre" and self.d_in != self.d_out:
            raise StreetlampError(f"an SAE reads and writes one space: d_in {self.d_in} != d_out {self.d_out}")
        if self.activation == "topk" and not (self.k and 0 < self.k <= width):
            raise StreetlampError(f"a TopK dictionary needs 0 < k <= width ({width}), got k={self.k}")
        if self.activation == "jumprelu" and self.threshold is None:
            raise StreetlampError("a JumpReLU dictionary needs a threshold per latent")

    @property
    def width(self) -> int:
        return int(self.W_enc.shape[1])

    @property
    def d_in(self) -> int:
        return int(self.W_enc.shape[0])

    @property
    def d_out(self) -> int:
        return int(self.W_dec.shape[1])

    @property
    def kind(self) -> str:
        return FEATURE_KINDS[self.where]

    def params(self, like: torch.Tensor) -> dict[str, torch.Tensor | None]:
        """The weights on ``like``'s device and dtype (cast once per device and dtype)."""
        key = (like.device, like.dtype)
        hit = self._cast.get(key)
        if hit is None:
            names = ("W_enc", "b_enc", "W_dec", "b_dec", "threshold", "W_skip")
            hit = {n: None if getattr(self, n) is None else getattr(self, n).to(like.device, like.dtype) for n in names}
            self._cast[key] = hit
        return hit

    def pre(self, x: torch.Tensor) -> torch.Tensor:
        """The latents' pre-activations ``[..., width]``."""
        p = self.params(x)
        if self.b_dec_in:
            x = x - p["b_dec"]  # type: ignore[operator]
        # the bias added in place: the product is a fresh tensor, and a second [tokens, width] buffer costs
        # its page faults (2 ms a layer at width 4096, 512 tokens; autograd is unaffected: mm keeps no output)
        return (x @ p["W_enc"]).add_(p["b_enc"])  # type: ignore[operator,arg-type]

    def activate(self, z: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        """σ(z): ReLU; TopK (the k largest kept, then ReLU; ties by index, as torch.topk); JumpReLU ``z [z > θ]``.

        ``inplace``: ``z`` may be overwritten (:meth:`encode`'s own pre-activations), outside autograd only."""
        inplace = inplace and not (z.requires_grad and torch.is_grad_enabled())
        if self.activation == "relu":
            return z.relu_() if inplace else torch.relu(z)
        if self.activation == "topk":
            assert self.k is not None
            top = torch.topk(z, self.k, dim=-1)
            return (z.zero_() if inplace else torch.zeros_like(z)).scatter_(-1, top.indices, torch.relu(top.values))
        theta = self.params(z)["threshold"]
        assert theta is not None  # __post_init__
        return z.mul_(z > theta) if inplace else z * (z > theta)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """σ(pre(x)). Outside autograd, on a float32 input on a CPU with bfloat16 units, through the exact
        bfloat16 screen (:mod:`.screen`: the same active latents and values, without the dense float32
        product); else densely."""
        if screen.screenable(self, x):
            out = screen.encode(self, x)
            if out is not None:
                return out
        return self.activate(self.pre(x), inplace=True)

    def decode(self, a: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        """``a W_dec + b_dec`` (+ ``x W_skip`` for a skip transcoder: ``x`` is its input).

        Sparse activations (at most :data:`SPARSE_DECODE` of the latents nonzero in every row, TopK's at most
        ``k``) outside autograd are decoded from the active latents' rows only (``embedding_bag``: the same sum,
        ``k · d_out`` multiply-adds a token instead of ``width · d_out``); a gradient through ``a`` takes the
        dense product, so every latent, active or not, gets its gradient."""
        p = self.params(a)
        out = self.product(a) + p["b_dec"]  # type: ignore[operator]
        if p["W_skip"] is not None:
            if x is None:
                raise ValueError("a skip transcoder decodes with its input")
            out = out + x.to(a.dtype) @ p["W_skip"]
        return out

    def product(self, a: torch.Tensor) -> torch.Tensor:
        """``a W_dec`` (no bias, no skip term): sparse where :meth:`decode` says."""
        W_dec = self.params(a)["W_dec"]
        out = self._sparse_decode(a, W_dec) if not (a.requires_grad and torch.is_grad_enabled()) else None
        return a @ W_dec if out is None else out  # type: ignore[operator]

    def _sparse_decode(self, a: torch.Tensor, W_dec: torch.Tensor | None) -> torch.Tensor | None:
        """``a @ W_dec`` from the nonzero latents of each row, or None when ``a`` is not sparse enough for that
        to pay (or is on a device / dtype where ``embedding_bag`` is not the better path)."""
        assert W_dec is not None
        if a.dim() == 0 or a.shape[-1] < 64 or a.device.type != "cpu" or a.dtype not in (torch.float32, torch.float64):
            return None
        flat = a.reshape(-1, a.shape[-1])
        nnz = (flat != 0).sum(-1)
        most = int(nnz.max()) if flat.shape[0] else 0
        if most > SPARSE_DECODE * flat.shape[-1]:
            return None
        if most == 0:
            return torch.zeros(*a.shape[:-1], W_dec.shape[1], dtype=a.dtype, device=a.device)
        idx = torch.topk(flat.abs(), most, dim=-1, sorted=False).indices  # every nonzero of a row among its `most`
        weights = flat.gather(-1, idx)
        out = torch.nn.functional.embedding_bag(idx, W_dec, per_sample_weights=weights, mode="sum")
        return out.reshape(*a.shape[:-1], W_dec.shape[1])

    def to(self, dtype: torch.dtype) -> Dictionary:
        """A copy with every weight in ``dtype`` (for saving in bfloat16, or float64 checks)."""
        cast = {n: None if getattr(self, n) is None else getattr(self, n).to(dtype) for n in _WEIGHTS}
        return Dictionary(self.layer, self.where, activation=self.activation, k=self.k, b_dec_in=self.b_dec_in, **cast)  # type: ignore[arg-type]


_WEIGHTS = ("W_enc", "b_enc", "W_dec", "b_dec", "threshold", "W_skip")


@dataclass
class FeatureSet:
    """Dictionaries at (layer, where), with where they came from: ``source`` (a folder), ``format``
    (``streetlamp``, ``saelens``, ``circuit-tracer``), ``model`` (the model they were fit on, when known)
    and ``info`` (what the format records: training settings, hook names)."""

    dictionaries: dict[tuple[int, str], Dictionary]
    source: str = ""
    format: str = "streetlamp"
    model: str | None = None
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.dictionaries:
            raise StreetlampError(f"no dictionary in {self.source or 'the feature set'}")
        for (l, w), d in self.dictionaries.items():
            if (d.layer, d.where) != (l, w):
                raise StreetlampError(f"dictionary keyed ({l}, {w}) says it sits at ({d.layer}, {d.where})")

    def __iter__(self):
        return iter(sorted(self.dictionaries.values(), key=lambda d: (d.layer, d.where != "resid_pre")))

    def get(self, layer: int, where: str) -> Dictionary | None:
        return self.dictionaries.get((layer, where))

    def site_names(self) -> list[str]:
        """Every feature and error site the set adds, in forward order."""
        return [feature_site(d.layer, d.where, e) for d in self for e in (False, True)]

    def describe(self) -> dict:
        """What a run records of the set (its manifest's ``features``)."""
        return {
            "source": self.source,
            "format": self.format,
            "model": self.model,
            "dictionaries": [
                {
                    "layer": d.layer,
                    "site": d.where,
                    "kind": d.kind,
                    "width": d.width,
                    "d_in": d.d_in,
                    "activation": d.activation,
                    "k": d.k,
                }
                for d in self
            ],
        }

    def check(self, adapter: ModelAdapter) -> None:
        """One clear line where the set cannot splice into ``adapter``: a layer out of range, a ``d_in`` or
        ``d_out`` other than the model's width, a transcoder on a family whose MLP input is not one module."""
        for d in self:
            if not 0 <= d.layer < adapter.n_layers:
                raise StreetlampError(
                    f"{self.source or 'feature set'}: a dictionary at layer {d.layer}, but the model has layers "
                    f"0..{adapter.n_layers - 1}"
                )
            if d.d_in != adapter.d_model or d.d_out != adapter.d_model:
                raise StreetlampError(
                    f"{self.source or 'feature set'}: the dictionary at layer {d.layer} ({d.where}) reads d_in="
                    f"{d.d_in} and writes d_out={d.d_out}, but {adapter.name} has d_model={adapter.d_model}: "
                    "a dictionary for another model"
                )
            if d.where == "mlp" and adapter.family.mlp is None:
                raise StreetlampError(
                    f"{adapter.family.name}: a transcoder needs the MLP's input as one module's input, and this "
                    "family's MLP is split across modules around a post-norm; use an SAE at resid_pre"
                )


def _splice(session: Session, d: Dictionary, layer: int, x_in: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Features of ``x_in`` and the error against ``value`` (what the dictionary reconstructs) through the
    session's feature sites; the spliced value, or ``value`` itself where nothing is edited nor kept for
    gradients."""
    f_name, e_name = feature_site(layer, d.where), feature_site(layer, d.where, True)
    a = d.encode(x_in)
    if not session.keep_grad and f_name not in session.edits and not session.wants(e_name):
        # only the features are read: the forward continues with ``value`` itself, no reconstruction needed
        session.site(f_name, a)
        return value
    if not session.keep_grad and e_name not in session.edits:
        # the error kept as computed: spliced = decode(a') + value - decode(a) = value + (a' - a) W_dec, one
        # product of the (sparse) change instead of two decodes
        if session.wants(e_name):
            session.site(e_name, value - d.decode(a, x_in))
        if f_name not in session.edits:
            session.site(f_name, a)
            return value
        a_site = session.site(f_name, a.clone())  # a copy: an edit may work in place
        return value + d.product(a_site - a).to(value.dtype)
    recon = d.decode(a, x_in)
    err = value - recon
    # a copy, so that a gradient taken at the recorded features flows through the decoder only (the error
    # was computed from ``a`` itself, and its path would cancel the decoder's)
    a_site = session.site(f_name, a.clone() if session.keep_grad else a)
    e_site = session.site(e_name, err)
    return d.decode(a_site, x_in) + e_site  # kept for gradients, or the error itself edited


def feature_hooks(session: Session, layer: int, layer_module: nn.Module) -> list[RemovableHandle]:
    """The hooks splicing layer ``layer``'s dictionaries into the session's forward passes (only those whose
    sites it records or edits). Registered before the layer's own ``resid_pre`` / ``mlp.out`` hooks."""
    a = session.adapter
    fs = a.features
    if fs is None:
        return []
    handles: list[RemovableHandle] = []
    wants = session.wants
    sae = fs.get(layer, "resid_pre")
    if sae is not None and any(wants(feature_site(layer, "resid_pre", e)) for e in (False, True)):

        def resid_hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            if args:
                x = args[0]
                return (_splice(session, sae, layer, x, x),) + tuple(args[1:]), kwargs
            kwargs = dict(kwargs)
            x = kwargs["hidden_states"]
            kwargs["hidden_states"] = _splice(session, sae, layer, x, x)
            return args, kwargs

        handles.append(layer_module.register_forward_pre_hook(resid_hook, with_kwargs=True))
    tc = fs.get(layer, "mlp")
    if tc is not None and any(wants(feature_site(layer, "mlp", e)) for e in (False, True)):
        assert a.family.mlp is not None  # FeatureSet.check
        from .sites import submodule

        mlp = submodule(layer_module, a.family.mlp)
        stash: list[torch.Tensor] = []

        def mlp_in(module: nn.Module, args: tuple, kwargs: dict) -> None:
            stash.append(args[0] if args else kwargs["hidden_states"])

        def mlp_out(module: nn.Module, args: tuple, output: object) -> object:
            x = stash.pop()
            if isinstance(output, tuple):
                return (_splice(session, tc, layer, x, output[0]),) + tuple(output[1:])
            return _splice(session, tc, layer, x, output)  # type: ignore[arg-type]

        handles.append(mlp.register_forward_pre_hook(mlp_in, with_kwargs=True))
        handles.append(a.mlp_out_modules[layer].register_forward_hook(mlp_out))
    return handles
