"""What removing a head changes on one sequence (METHODS.md §10): the atlas' effects.

A head (l, h) is ablated at ``layers.{l}.attn.z`` (its context vector before ``W_O``; the same as
ablating its output ``z_h W_O,h``, see :mod:`.heads`) at every position of the sequence, by

* ``mean``: the mean of ``attn.z`` over every real token of the corpus actually read (default);
* ``zero``: 0;
* ``resample``: the activation of the same head on another sequence of the corpus (its source, drawn
  with the seed, never the sequence itself), position by position; past the end of the source a
  random real position of it (seeded per sequence).

Exact effects (one ablated forward pass per (head, sequence); a pass for layer ``l`` starts there,
:mod:`.atlas_midstack`, so it costs ``(L - l) / L`` of a full pass), with ``p``/``p'`` the clean/ablated
output distributions and ``y`` the clean prediction at the explained position:

* ``kl_explained``: ``KL(p ‖ p')`` at the explained position (nats);
* ``dlogp`` = ``log p'(y) - log p(y)``; ``dprob`` = ``p'(y) - p(y)`` (the ``heads`` command's ΔF);
* decoders: ``kl_mean``, the mean over positions ``0..n-2`` of the next-token KL, and ``dloss``, the mean
  over the same positions of the change in cross-entropy of the actual next token.

Attribution estimate (Nanda 2023; METHODS §5): ``dlogp_est = (z_abl - z) · ∂ log p(y) / ∂z`` at the
clean run, summed over positions and ``d_head``: the first-order estimate of ``dlogp``, one backward
pass for every head of a batch. (The gradient of ``KL(p ‖ p')`` is zero at the clean point, so KL itself
has no first-order estimate; METHODS §10.) ``dla``: direct logit attribution of the head to ``y``'s logit
(:func:`streetlamp.interventions.lens.direct_logit_attribution`), where the model has a readout
(pre-norm causal LMs); NaN elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..batching import rows_per_batch
from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter, at_least_float32
from .atlas_midstack import layer_output_arity, start_at

ABLATIONS = ("mean", "zero", "resample")
EXACT = ("kl_explained", "dlogp", "dprob", "kl_mean", "dloss")


def z_sites(adapter: ModelAdapter) -> list[str]:
    return [f"layers.{l}.attn.z" for l in range(adapter.n_layers)]


def _logp(adapter: ModelAdapter, inputs: Inputs, edits: dict | None = None, record: Sequence[str] = ()):
    """``(log p at the explained position [B, V], log p at every position [B, n, V] or None, cache)``."""
    if not adapter.kind.causal:
        fwd = adapter.forward(inputs, record=record, edit=edits)
        return torch.log_softmax(at_least_float32(fwd.logits), -1), None, fwd.cache
    dev = adapter.device
    with torch.no_grad(), adapter.session(record, edits) as s:
        out = adapter.hf_model(
            input_ids=inputs.input_ids.to(dev), attention_mask=inputs.attention_mask.to(dev), use_cache=False
        )
    lp = torch.log_softmax(at_least_float32(out.logits), -1)
    last = torch.tensor(inputs.lengths, device=lp.device) - 1
    return lp[torch.arange(len(inputs), device=lp.device), last], lp, s.cache


@dataclass
class Clean:
    """The clean run of a batch: what every ablation of it is compared with."""

    logp: torch.Tensor  # [B, V] at the explained position
    logp_pos: torch.Tensor | None  # [B, n, V] decoders
    pred: torch.Tensor  # [B] clean prediction y
    resid: dict[int, torch.Tensor]  # layer -> hidden state entering it [B, n, d]
    z: dict[int, torch.Tensor]  # layer -> attn.z [B, n, H, dh]


def clean_run(adapter: ModelAdapter, inputs: Inputs) -> Clean:
    L = adapter.n_layers
    rec = [f"layers.{l}.resid_pre" for l in range(L)] + z_sites(adapter)
    with torch.no_grad():
        lp, lpp, cache = _logp(adapter, inputs, record=rec)
    return Clean(
        lp,
        lpp,
        lp.argmax(-1),
        {l: cache[f"layers.{l}.resid_pre"] for l in range(L)},
        {l: cache[f"layers.{l}.attn.z"] for l in range(L)},
    )


def resample_positions(n: int, n_source: int, rng: np.random.Generator) -> np.ndarray:
    """Source position of each of ``n`` positions: itself while the source has it, else a random real one."""
    pos = np.arange(n)
    late = pos >= n_source
    pos[late] = rng.integers(0, n_source, int(late.sum()))
    return pos


def replacement(
    kind: str,
    z: torch.Tensor,
    mean: torch.Tensor | None = None,
    source: torch.Tensor | None = None,
    source_pos: Sequence[np.ndarray] | None = None,
) -> torch.Tensor:
    """What an ablated head's ``attn.z`` becomes, ``[B, n, H, dh]`` like ``z``: zero, ``mean`` ``[H, dh]``,
    or ``source`` ``[B, n_s, H, dh]`` (each row's source sequence) at ``source_pos[b]`` ``[n]``."""
    if kind == "zero":
        return torch.zeros_like(z)
    if kind == "mean":
        assert mean is not None
        return mean.to(z.device, z.dtype).expand_as(z).clone()
    if kind == "resample":
        assert source is not None and source_pos is not None
        out = torch.zeros_like(z)
        for b, pos in enumerate(source_pos):
            out[b, : len(pos)] = source[b, torch.as_tensor(pos, device=source.device)].to(z.dtype)
        return out
    raise StreetlampError(f"unknown ablation {kind!r}; choose {', '.join(ABLATIONS)}")


def _real(inputs: Inputs, like: torch.Tensor) -> torch.Tensor:
    return inputs.attention_mask.to(like.device, like.dtype)


def estimate(adapter: ModelAdapter, inputs: Inputs, repl: dict[int, torch.Tensor], pred: torch.Tensor) -> np.ndarray:
    """``dlogp_est`` ``[B, L, H]``: ``(z_abl - z) · ∂ log p(y) / ∂z`` at the clean run (module docstring)."""
    fwd = adapter.forward(inputs, record=z_sites(adapter), keep_grad=True, grad=True)
    logp = torch.log_softmax(at_least_float32(fwd.logits), -1)
    return _attribution(adapter, inputs, fwd.cache, logp, pred, repl)


def _attribution(
    adapter: ModelAdapter, inputs: Inputs, cache: dict, logp: torch.Tensor, pred: torch.Tensor, repl: dict
) -> np.ndarray:
    sites = z_sites(adapter)
    metric = logp.gather(1, pred.view(-1, 1).to(logp.device)).sum()
    grads = torch.autograd.grad(metric, [cache[s] for s in sites], allow_unused=True)
    out = np.zeros((len(inputs), adapter.n_layers, adapter.n_heads))
    for l, (s, g) in enumerate(zip(sites, grads)):
        if g is None:
            continue
        z = cache[s].detach()
        real = _real(inputs, z).view(z.shape[0], z.shape[1], 1, 1)
        prod = (repl[l].to(z.device, z.dtype) - z) * g * real
        out[:, l] = at_least_float32(prod).double().sum((1, 3)).cpu().numpy()
    return out


def estimate_and_dla(
    adapter: ModelAdapter, inputs: Inputs, replace: Callable[[dict[int, torch.Tensor]], dict[int, torch.Tensor]]
) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    """``(dlogp_est, dla, pred)`` of a batch from ONE forward + backward: the clean prediction ``y`` is
    the forward's own argmax, ``replace(z)`` (``{layer: attn.z}`` of that forward) gives each layer's
    replacement, and the DLA reads the same forward's ``attn.z`` and final residual (:func:`dla_from`)."""
    sites = z_sites(adapter)
    fwd = adapter.forward(inputs, record=sites + dla_sites(adapter), keep_grad=True, grad=True)
    logp = torch.log_softmax(at_least_float32(fwd.logits), -1)
    pred = logp.detach().argmax(-1)
    z = {l: fwd.cache[s].detach() for l, s in enumerate(sites)}
    est = _attribution(adapter, inputs, fwd.cache, logp, pred, replace(z))
    cache = {k: v.detach() for k, v in fwd.cache.items() if isinstance(v, torch.Tensor)}
    return est, dla_from(adapter, inputs, cache, pred), pred


def _metrics(adapter: ModelAdapter, clean: Clean, rows: list[int], inputs: Inputs, lp: torch.Tensor, lpp) -> dict:
    """Exact effects of ablated rows (``rows``: the clean row of each) from their log-probs."""
    lc = clean.logp[rows].to(lp.device)
    y = clean.pred[rows].to(lp.device).view(-1, 1)
    out = {
        "kl_explained": (lc.exp() * (lc - lp)).sum(-1),
        "dlogp": (lp.gather(1, y) - lc.gather(1, y))[:, 0],
        "dprob": (lp.gather(1, y).exp() - lc.gather(1, y).exp())[:, 0],
    }
    res = {k: v.double().cpu().numpy() for k, v in out.items()}
    if lpp is None:
        return res
    assert clean.logp_pos is not None
    n = lpp.shape[1]
    lcp = clean.logp_pos[rows][:, :n].to(lpp.device)
    ids = inputs.input_ids.to(lpp.device)
    kl = (lcp.exp() * (lcp - lpp)).sum(-1)  # [R, n]
    nxt = ids[:, 1:].unsqueeze(-1)
    dl = (lcp[:, :-1].gather(2, nxt) - lpp[:, :-1].gather(2, nxt))[..., 0]  # CE ablated - CE clean
    lengths = np.array(inputs.lengths)
    km, dm = np.full(len(rows), np.nan), np.full(len(rows), np.nan)
    for r, m in enumerate(lengths):
        if m > 1:
            km[r] = float(kl[r, : m - 1].double().mean())
            dm[r] = float(dl[r, : m - 1].double().mean())
    res["kl_mean"], res["dloss"] = km, dm
    return res


_ARITY: dict[int, int] = {}


def head_edit(r: torch.Tensor, heads: Sequence[int]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The edit of ``attn.z`` ``[R, n, H, dh]`` that puts row k's head ``heads[k]`` to ``r[k]`` at every
    position and leaves the rest: one mask, one ``where`` (``engine.selection_mask``'s meaning per row)."""

    def edit(a: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(a.shape[0], 1, a.shape[2], 1, dtype=torch.bool, device=a.device)
        mask[torch.arange(a.shape[0], device=a.device), 0, torch.as_tensor(list(heads), device=a.device), 0] = True
        return torch.where(mask, r.to(a.device, a.dtype), a)

    return edit


def exact(
    adapter: ModelAdapter,
    inputs: Inputs,
    clean: Clean,
    repl: dict[int, torch.Tensor],
    pairs: Sequence[tuple[int, int, int]],
    batch_size: int | None = None,
) -> dict[str, np.ndarray]:
    """Exact effects of ablating head ``h`` of layer ``l`` on row ``b`` for each ``(b, l, h)`` of ``pairs``:
    ``{metric: [pair]}``. Pairs of one layer share passes (one row per pair, within the token budget),
    each pass starting at that layer."""
    key = id(adapter)
    if key not in _ARITY:
        _ARITY[key] = layer_output_arity(adapter, inputs)
    arity = _ARITY[key]
    names = EXACT if adapter.kind.causal else EXACT[:3]
    out = {k: np.full(len(pairs), np.nan) for k in names}
    by_layer: dict[int, list[int]] = {}
    for i, (_, l, _) in enumerate(pairs):
        by_layer.setdefault(l, []).append(i)
    lengths = inputs.lengths
    for l, idx in sorted(by_layer.items()):
        idx.sort(key=lambda i: lengths[pairs[i][0]])  # rows of like length share a pass: little padding
        step = rows_per_batch(int(inputs.input_ids.shape[1]), batch_size, adapter.device)
        for s in range(0, len(idx), step):
            part = idx[s : s + step]
            rows = [pairs[i][0] for i in part]
            sub = inputs.select(rows)
            w = int(sub.input_ids.shape[1])
            edit = head_edit(repl[l][rows, :w], [pairs[i][2] for i in part])
            with torch.no_grad(), start_at(adapter, l, clean.resid[l][rows, :w], arity):
                lp, lpp, _ = _logp(adapter, sub, {f"layers.{l}.attn.z": edit})
            for k, v in _metrics(adapter, clean, rows, sub, lp, lpp).items():
                out[k][part] = v
    return out


def _has_readout(adapter: ModelAdapter) -> bool:
    from ..models.readout import check_lens

    try:
        check_lens(adapter)
    except StreetlampError:
        return False
    return True


def dla_sites(adapter: ModelAdapter) -> list[str]:
    """What :func:`dla_from` reads besides ``attn.z``: the last layer's residual output (the final norm's
    scale) and, with sandwich norms (Gemma), each layer's attention output; none without a readout."""
    if not _has_readout(adapter):
        return []
    from ..models.readout import output_norms

    L = adapter.n_layers
    sandwich = output_norms(adapter, 0)[0] is not None
    return [f"layers.{L - 1}.resid_post"] + ([f"layers.{l}.attn.out" for l in range(L)] if sandwich else [])


def dla_from(adapter: ModelAdapter, inputs: Inputs, cache: dict[str, torch.Tensor], pred: torch.Tensor) -> np.ndarray:
    """Direct logit attribution ``[B, L, H]`` of each head to the clean prediction's logit at each row's last
    real token, batched from a forward's ``attn.z`` and :func:`dla_sites`: the same quantity as
    :func:`streetlamp.interventions.lens.direct_logit_attribution`'s ``heads`` (head output ``z_h W_O,h``,
    through the sandwich norm linearised at the whole attention output, through the final norm linearised
    at the final residual, onto ``W_U[y]``; float64). NaN without a readout."""
    out = np.full((len(inputs), adapter.n_layers, adapter.n_heads), np.nan)
    if not _has_readout(adapter):
        return out
    from ..models.attention_block import output_weights
    from ..models.readout import final_norm, unembedding
    from .lens import attn_writes

    L = adapter.n_layers
    sites = dla_sites(adapter)
    first = cache[sites[0]]
    rows = torch.arange(len(inputs), device=first.device)
    last = torch.tensor(inputs.lengths, device=first.device) - 1
    norm = final_norm(adapter)
    scale = norm.scale(first[rows, last])[:, None]  # [B, 1, 1]
    w_u, _ = unembedding(adapter)
    u = w_u[pred.to(w_u.device)].double()  # [B, d]
    for l in range(L):
        w_o, _ = output_weights(adapter, l)
        z = cache[f"layers.{l}.attn.z"][rows, last].double()  # [B, H, d_head]
        heads = torch.einsum("bhd,hdm->bhm", z, w_o.double().to(z.device))
        attn_out = cache[f"layers.{l}.attn.out"][rows, last][:, None] if len(sites) > 1 else heads.sum(1, keepdim=True)
        written = attn_writes(adapter, l, heads, attn_out)
        out[:, l] = torch.einsum("bhm,bm->bh", norm.linear(written, scale), u.to(written.device)).cpu().numpy()
    return out


def dla(adapter: ModelAdapter, inputs: Inputs, pred: torch.Tensor) -> np.ndarray:
    """Direct logit attribution ``[B, L, H]`` of each head to the clean prediction's logit, one sequence at
    a time through :func:`streetlamp.interventions.lens.direct_logit_attribution` (the reference the
    batched :func:`dla_from` is tested against; NaN without a readout)."""
    from .lens import direct_logit_attribution

    out = np.full((len(inputs), adapter.n_layers, adapter.n_heads), np.nan)
    if not _has_readout(adapter):
        return out
    for b, ids in enumerate(inputs.rows()):
        out[b] = direct_logit_attribution(adapter, torch.tensor(ids), int(pred[b])).heads
    return out
