"""One patching engine with small strategies (zero, mean, resample, patch).

An :class:`Intervention` names a site, optionally one head and/or one position, and a
*strategy*: a function that maps the live activation to the replacement values (same shape).
The engine turns a list of interventions into ``adapter.forward(..., edit=...)`` functions;
only the selected slice (head, position) is replaced, everything else flows on unchanged, so
gradients pass through untouched parts (TransformerLens ``generic_activation_patch`` style).

Strategies (all have the signature ``strategy(activation) -> replacement``):

* :func:`zero` -- zero ablation, ``a <- 0``;
* :func:`mean` -- mean ablation, ``a <- E_ref[a]`` (a per-site mean computed by :func:`site_means`
  over the real tokens of a reference set; broadcast to every position);
* :func:`resample` -- resample ablation, ``a_p <- a'(x', p')`` for a random reference text ``x'``
  and a random real position ``p'`` of it, drawn independently per position and per batch row
  (seeded), i.e. a sample from the reference distribution of that activation;
* :func:`patch` -- activation patching, ``a <- a(source run)`` (same shape: same token length).

Head axes: ``attn.z``, ``attn.head_out``, ``attn.v`` ``[batch, pos, head, .]`` (head = axis 2),
``attn.pattern`` ``[batch, head, query, key]`` (head = axis 1, position = query axis 2).
Zeroing a head's ``attn.z`` equals zeroing its output ``z_h W_O,h`` because ``W_O`` is linear.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter
from ..models.sites import parse_site

Strategy = Callable[[torch.Tensor], torch.Tensor]
HEAD_SITES = ("attn.z", "attn.head_out", "attn.v", "attn.pattern")
# a MoE layer's sites with an expert axis at 2 (``Intervention.head`` names the expert there)
EXPERT_AXIS_SITES = ("router.logits", "router.weights", "experts.out")
# a dictionary's latents ``[batch, pos, feature]`` (``Intervention.head`` names the feature)
FEATURE_AXIS_SITES = ("resid_pre.features", "mlp.features")


@dataclass
class Intervention:
    """Replace ``site`` (optionally only ``head`` / ``pos`` / batch ``rows``) by ``strategy(a)``."""

    site: str
    strategy: Strategy
    head: int | None = None
    pos: int | None = None
    rows: Sequence[int] | None = None  # batch rows the intervention applies to (None = all)


def axes_of(site: str) -> tuple[int | None, int]:
    """(head axis or None, position axis) of a site's activation."""
    _, kind = parse_site(site)
    if kind == "attn.pattern":
        return 1, 2
    if kind in HEAD_SITES or kind in EXPERT_AXIS_SITES or kind in FEATURE_AXIS_SITES:
        return 2, 1
    return None, 1


def selection_mask(
    a: torch.Tensor, site: str, head: int | None, pos: int | None, rows: Sequence[int] | None
) -> torch.Tensor:
    """Bool tensor broadcastable to ``a``: True where the intervention replaces values."""
    h_ax, p_ax = axes_of(site)
    if head is not None and h_ax is None:
        raise StreetlampError(
            f"site {site} has no head axis (nor an expert or feature axis); heads exist at attn.z/head_out/v/pattern, "
            "experts at router.logits/router.weights/experts.out, features at resid_pre.features/mlp.features"
        )
    shape = [1] * a.dim()
    mask = torch.ones(shape, dtype=torch.bool, device=a.device)
    if rows is not None:
        m = torch.zeros(a.shape[0], dtype=torch.bool, device=a.device)
        m[list(rows)] = True
        mask = mask & m.view([-1] + [1] * (a.dim() - 1))
    for ax, idx in ((h_ax, head), (p_ax, pos)):
        if idx is None:
            continue
        assert ax is not None
        if not 0 <= idx < a.shape[ax]:
            raise StreetlampError(f"index {idx} out of range for axis {ax} of {site} (size {a.shape[ax]})")
        m = torch.zeros(a.shape[ax], dtype=torch.bool, device=a.device)
        m[idx] = True
        v = [1] * a.dim()
        v[ax] = -1
        mask = mask & m.view(v)
    return mask


def compile_edits(interventions: Iterable[Intervention]) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Group interventions per site into ``edit`` functions for :meth:`ModelAdapter.forward`.

    Interventions at one site are applied in order (a later one wins where they overlap).
    """
    per_site: dict[str, list[Intervention]] = {}
    for iv in interventions:
        per_site.setdefault(iv.site, []).append(iv)

    def make(ivs: list[Intervention]) -> Callable[[torch.Tensor], torch.Tensor]:
        def fn(a: torch.Tensor) -> torch.Tensor:
            for iv in ivs:
                new = iv.strategy(a)
                if new.shape != a.shape:
                    new = new.expand_as(a)
                mask = selection_mask(a, iv.site, iv.head, iv.pos, iv.rows)
                a = torch.where(mask, new.to(a.dtype), a)
            return a

        return fn

    return {site: make(ivs) for site, ivs in per_site.items()}


def run(
    adapter: ModelAdapter,
    inputs: Inputs,
    interventions: Iterable[Intervention] = (),
    record: Iterable[str] = (),
    keep_grad: bool = False,
    grad: bool = False,
    extra_edits: dict[str, Callable[[torch.Tensor], torch.Tensor]] | None = None,
):
    """``adapter.forward`` with the interventions applied; returns the :class:`Forward`."""
    edits = compile_edits(interventions)
    for site, fn in (extra_edits or {}).items():
        if site in edits:
            first, second = edits[site], fn
            edits[site] = lambda a, f=first, g=second: g(f(a))  # type: ignore[misc]  # defaults bind the pair
        else:
            edits[site] = fn
    return adapter.forward(inputs, record=record, edit=edits, keep_grad=keep_grad, grad=grad)


def run_batched(
    adapter: ModelAdapter,
    inputs: Inputs,
    interventions: Sequence[Intervention] = (),
    batch_size: int | None = None,
    record: Iterable[str] = (),
):
    """:func:`run` in passes of at most ``batch_size`` tokens (rows x padded length; None: the
    device's default budget, :mod:`streetlamp.batching`). Each intervention keeps to its own rows;
    logits and recorded activations are concatenated over the rows. For row-wise strategies (the
    activation of one row never depends on another row's), as patching and mediation use."""
    from ..batching import rows_per_batch
    from ..models.adapter import Forward

    n, width = len(inputs), int(inputs.input_ids.shape[1])
    step = rows_per_batch(width, batch_size, adapter.device)
    if step >= n:
        return run(adapter, inputs, interventions, record=record)
    record = list(record)
    parts = []
    for start in range(0, n, step):
        stop = min(n, start + step)
        ivs = []
        for iv in interventions:
            if iv.rows is None:
                ivs.append(iv)
                continue
            rows = [r - start for r in iv.rows if start <= r < stop]
            if rows:
                ivs.append(Intervention(iv.site, iv.strategy, iv.head, iv.pos, rows))
        parts.append(run(adapter, inputs.select(range(start, stop)), ivs, record=record))
    return Forward(torch.cat([f.logits for f in parts]), {k: torch.cat([f.cache[k] for f in parts]) for k in record})


# -- strategies ------------------------------------------------------------------------------------
def zero(a: torch.Tensor) -> torch.Tensor:
    """Zero ablation."""
    return torch.zeros_like(a)


def mean(value: torch.Tensor) -> Strategy:
    """Mean ablation with a precomputed per-site mean (shape broadcastable to the site, e.g. ``[head, d]``)."""

    def fn(a: torch.Tensor) -> torch.Tensor:
        return value.to(a.device, a.dtype).expand_as(a)

    return fn


def patch(source: torch.Tensor) -> Strategy:
    """Activation patching: the activation recorded in another run (same shape, or batch 1 broadcast)."""

    def fn(a: torch.Tensor) -> torch.Tensor:
        if source.shape[1:] != a.shape[1:] or source.shape[0] not in (1, a.shape[0]):
            raise StreetlampError(
                f"patch source has shape {tuple(source.shape)} but the site has {tuple(a.shape)}; "
                "clean and corrupted inputs must have the same token length"
            )
        return source.to(a.device, a.dtype).expand_as(a)

    return fn


def resample(pool: torch.Tensor, seed: int = 0) -> Strategy:
    """Resample ablation: each ``[batch, pos]`` cell gets a random row of ``pool`` ``[n, *rest]``.

    ``pool`` holds the site's activation at every real token of the reference set (for
    ``attn.z``: ``[n_tokens, head, d_head]``). Draws are seeded, so a run is reproducible.
    """

    def fn(a: torch.Tensor) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        idx = torch.randint(0, pool.shape[0], (a.shape[0] * a.shape[1],), generator=g)
        return pool[idx].reshape(a.shape).to(a.device, a.dtype)

    return fn


def site_pool(adapter: ModelAdapter, reference: Inputs, sites: Sequence[str]) -> dict[str, torch.Tensor]:
    """Every real-token activation of the reference set, per site: ``[n_tokens, *rest]``.

    Only for sites with the position on axis 1 (not ``attn.pattern``).
    """
    for s in sites:
        if parse_site(s)[1] == "attn.pattern":
            raise StreetlampError("mean/resample of attention patterns is not supported (lengths differ)")
    fwd = adapter.forward(reference, record=list(sites))
    real = reference.attention_mask.bool().to(adapter.device)
    return {s: fwd.cache[s][real].detach() for s in sites}


def site_means(adapter: ModelAdapter, reference: Inputs, sites: Sequence[str]) -> dict[str, torch.Tensor]:
    """Mean activation over every real token of the reference set, per site: ``[*rest]``."""
    return {s: p.mean(0) for s, p in site_pool(adapter, reference, sites).items()}


def check_layer_head(adapter: ModelAdapter, layer: int, head: int | None = None) -> None:
    if not 0 <= layer < adapter.n_layers:
        raise StreetlampError(f"layer {layer} out of range: the model has layers 0..{adapter.n_layers - 1}")
    if head is not None and not 0 <= head < adapter.n_heads:
        raise StreetlampError(f"head {head} out of range: the model has heads 0..{adapter.n_heads - 1}")


def repeat_inputs(inputs: Inputs, k: int) -> Inputs:
    """Each row of ``inputs`` repeated ``k`` times (row-major: row b copy c at index b*k + c)."""
    idx = [b for b in range(len(inputs)) for _ in range(k)]
    return inputs.select(idx)
