"""How good a fitted dictionary is, per layer, on held-out sequences (the metrics SAELens and SAEBench report).

Over the held-out tokens (position 0 of every sequence left out, as in training; ``N`` tokens):

- **fvu** (fraction of variance unexplained) ``= Σ_t ||y_t − ŷ_t||² / Σ_t ||y_t − ȳ||²``, ȳ the mean target over
  the N tokens, ``ŷ = decode(encode(x))`` (float64 sums). It is a variance-weighted mean of the tokens' own
  ratios, so a few tokens far from the rest decide it: on SmolLM2 the MLPs write *massive activations* on a
  few tokens (at layer 11, 58 of 2,032 held-out tokens carry 97 % of the variance), and a dictionary that fits
  those can have a small fvu while reconstructing ordinary tokens worse than a constant would. Two columns
  read the ordinary tokens (:func:`fvu_columns`):
- **fvu_token_median** ``= median_t ||y_t − ŷ_t||² / ||y_t − ỹ||²`` over the N tokens, ỹ the coordinatewise
  median of the targets (numpy's median: the mean of the two middle values when N is even; a ratio 0/0 is
  0, c/0 is +inf). Each token counts once, whatever its norm. The centre is the median, not ȳ: the few
  massive tokens drag ȳ so far that every ordinary token sits far from it, and the ratio against ȳ then
  flatters (SmolLM2 layer 11: ||ȳ|| is 362 where an ordinary token's distance from ỹ is about 30; the
  median ratio is 0.011 against ȳ, 1.5 against ỹ; docs/features.md);
- **fvu_without_massive**: fvu over the tokens that are not massive, ``Σ_K ||y_t − ŷ_t||² / Σ_K ||y_t −
  ȳ_K||²``, ȳ_K the mean target over K; a token is **massive** (left out of K) when its distance from ỹ
  exceeds :data:`MASSIVE` (10) times the median over the N tokens of that distance. **massive_tokens** is
  N − |K|. (A cut at a fixed fraction does not fit: SmolLM2's massive tokens are 0–3 % of the held-out
  tokens depending on the layer, and where they exist they sit 50–500 times the median distance away.)
- **l0**: the mean number of non-zero latents per token;
- **dead**: the fraction of latents that fire on none of the N tokens; **dense**: the fraction that fire on
  more than :data:`DENSE` (10 %) of them;
- **cross-entropy recovered**: the model's mean next-token loss (nats, predictions from positions ``1 ..
  seq_len − 2``) clean, with the dictionary spliced in (its error site zeroed through the engine: the
  replacement, ``layers.{l}.{site}.features_error`` → 0 at positions ≥ 1) and with the site zero-ablated
  (``mlp.out`` or ``resid_pre`` → 0 at positions ≥ 1); recovered ``= (CE_zero − CE_spliced) / (CE_zero −
  CE_clean)``. Position 0 keeps the model's own value in both (the dictionary was not fitted there).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ..models.features import Dictionary, FeatureSet, feature_site
from .activations import SKIP_FIRST, site_activations

if TYPE_CHECKING:
    from ..models.adapter import ModelAdapter

__all__ = ["DENSE", "MASSIVE", "METRIC_COLUMNS", "cross_entropy", "fvu_columns", "layer_metrics", "reconstruction"]

DENSE = 0.1  # a latent firing on more than this fraction of tokens is dense
MASSIVE = 10.0  # a token whose target lies more than this many median distances from the median is massive
METRIC_COLUMNS = {
    "layer": "the layer",
    "site": "resid_pre (SAE) or mlp (transcoder)",
    "fvu": "fraction of variance unexplained: sum ||y - y_hat||^2 / sum ||y - mean y||^2 over held-out tokens",
    "fvu_token_median": "median over held-out tokens of ||y - y_hat||^2 / ||y - median y||^2 (median y: the "
    "coordinatewise median target): the per-token fvu of a typical token, not decided by a few massive ones",
    "fvu_without_massive": "fvu over the held-out tokens that are not massive, each sum over those tokens and "
    "their own mean; a token is massive when ||y - median y|| exceeds "
    f"{MASSIVE:g} times its median over held-out tokens",
    "massive_tokens": "held-out tokens left out of fvu_without_massive as massive",
    "l0": "mean number of active latents per held-out token",
    "dead_fraction": "fraction of latents active on none of the held-out tokens",
    "dense_fraction": f"fraction of latents active on more than {DENSE:g} of the held-out tokens",
    "ce_clean": "mean next-token cross-entropy of the model (nats)",
    "ce_spliced": "the same with the dictionary replacing the site (its error zeroed) at positions >= 1",
    "ce_zero_ablated": "the same with the site zeroed at positions >= 1",
    "ce_recovered": "(ce_zero_ablated - ce_spliced) / (ce_zero_ablated - ce_clean)",
    "heldout_tokens": "tokens the metrics are computed on",
}


def _median(t: torch.Tensor) -> torch.Tensor:
    """numpy's median along dim 0 (the mean of the two middle values when the count is even)."""
    s = t.sort(0).values
    n = t.shape[0]
    return (s[(n - 1) // 2] + s[n // 2]) / 2


def fvu_columns(y: torch.Tensor, err2: torch.Tensor) -> dict[str, float]:
    """fvu, fvu_token_median, fvu_without_massive and massive_tokens (module docstring) from the targets
    ``y`` ``[N, d]`` and each token's squared error ``err2 = ||y_t − ŷ_t||²`` ``[N]``, in float64."""
    y, err2 = y.double(), err2.double()
    var = (y - y.mean(0)).pow(2).sum()
    dist2 = (y - _median(y)).pow(2).sum(-1)
    ratio = torch.where(dist2 > 0, err2 / dist2, torch.where(err2 > 0, torch.inf, 0.0))
    dist = dist2.sqrt()
    keep = dist <= MASSIVE * _median(dist)
    yk = y[keep]
    return {
        "fvu": float(err2.sum() / var),
        "fvu_token_median": float(_median(ratio)),
        "fvu_without_massive": float(err2[keep].sum() / (yk - yk.mean(0)).pow(2).sum()),
        "massive_tokens": int((~keep).sum()),
    }


def _batches(seqs: torch.Tensor, batch_seqs: int) -> list[torch.Tensor]:
    return [seqs[i : i + batch_seqs] for i in range(0, seqs.shape[0], batch_seqs)]


@torch.no_grad()
def reconstruction(
    adapter: ModelAdapter, fs: FeatureSet, held: torch.Tensor, batch_seqs: int = 8
) -> dict[int, dict[str, float]]:
    """fvu (and :func:`fvu_columns`' per-token columns), l0, dead and dense fractions per dictionary of ``fs``
    (one site) over ``held``. The targets are kept in memory (``N × d_out`` per layer, in the model's dtype)
    for the medians."""
    dicts: list[Dictionary] = list(fs)
    where = dicts[0].where
    layers = [d.layer for d in dicts]
    ys: dict[int, list[torch.Tensor]] = {d.layer: [] for d in dicts}  # targets, model dtype
    err2s: dict[int, list[torch.Tensor]] = {d.layer: [] for d in dicts}  # per-token squared errors
    acc = {
        d.layer: {
            "nnz": torch.zeros((), dtype=torch.float64),
            "fires": torch.zeros(d.width, dtype=torch.float64),
        }
        for d in dicts
    }
    n = 0
    for ids in _batches(held, batch_seqs):
        acts = site_activations(adapter, ids, layers, where)
        for d in dicts:
            x, y = acts[d.layer]
            x = x[:, SKIP_FIRST:].reshape(-1, x.shape[-1]).double().cpu()
            y = y[:, SKIP_FIRST:].reshape(-1, y.shape[-1]).cpu()
            d64 = d.to(torch.float64)
            a = d64.encode(x)
            yh = d64.decode(a, x)
            r = acc[d.layer]
            ys[d.layer].append(y)  # the model's dtype: .double() of it is exact
            err2s[d.layer].append((y.double() - yh).pow(2).sum(-1))
            active = a != 0
            r["nnz"] += active.sum()
            r["fires"] += active.sum(0)
        n += ids.shape[0] * (ids.shape[1] - SKIP_FIRST)
    out = {}
    for l, r in acc.items():
        frac = r["fires"] / n
        out[l] = {
            **fvu_columns(torch.cat(ys[l]), torch.cat(err2s[l])),
            "l0": float(r["nnz"] / n),
            "dead_fraction": float((r["fires"] == 0).double().mean()),
            "dense_fraction": float((frac > DENSE).double().mean()),
            "heldout_tokens": n,
        }
    return out


def _zero_from(first: int):  # noqa: ANN202 - an edit function
    def edit(t: torch.Tensor) -> torch.Tensor:
        keep = torch.zeros(t.shape[1], dtype=t.dtype, device=t.device)
        keep[:first] = 1
        return t * keep.view(1, -1, *([1] * (t.dim() - 2)))

    return edit


@torch.no_grad()
def _ce(adapter: ModelAdapter, held: torch.Tensor, edit: dict | None, batch_seqs: int) -> float:
    total, count = 0.0, 0
    for ids in _batches(held, batch_seqs):
        pos = torch.arange(SKIP_FIRST, ids.shape[1] - 1)
        logits = adapter.logits_at(ids, pos, edit=edit).double()
        target = ids[:, SKIP_FIRST + 1 :].to(logits.device)
        lp = torch.log_softmax(logits, -1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
        total += float(-lp.sum())
        count += lp.numel()
    return total / count


def cross_entropy(
    adapter: ModelAdapter, fs: FeatureSet, held: torch.Tensor, batch_seqs: int = 8, clean: float | None = None
) -> dict[int, dict[str, float]]:
    """Clean, spliced and zero-ablated cross-entropy per dictionary of ``fs`` (module docstring). The
    adapter's attached features are restored afterwards."""
    before = adapter.features
    out = {}
    try:
        if clean is None:
            adapter.attach_features(None)
            clean = _ce(adapter, held, None, batch_seqs)
        for d in fs:
            one = FeatureSet({(d.layer, d.where): d}, source=fs.source, model=fs.model)
            adapter.attach_features(one)
            spliced = _ce(adapter, held, {feature_site(d.layer, d.where, True): _zero_from(SKIP_FIRST)}, batch_seqs)
            adapter.attach_features(None)
            site = f"layers.{d.layer}.{'mlp.out' if d.where == 'mlp' else 'resid_pre'}"
            zero = _ce(adapter, held, {site: _zero_from(SKIP_FIRST)}, batch_seqs)
            denom = zero - clean
            out[d.layer] = {
                "ce_clean": clean,
                "ce_spliced": spliced,
                "ce_zero_ablated": zero,
                "ce_recovered": (zero - spliced) / denom if denom != 0 else float("nan"),
            }
    finally:
        adapter.attach_features(before)
    return out


def layer_metrics(
    adapter: ModelAdapter, fs: FeatureSet, held: torch.Tensor, batch_seqs: int = 8, ce: bool = True
) -> list[dict]:
    """One row per dictionary with every column of :data:`METRIC_COLUMNS` (the CE columns when ``ce``)."""
    rec = reconstruction(adapter, fs, held, batch_seqs)
    ces = cross_entropy(adapter, fs, held, batch_seqs) if ce else {}
    rows = []
    for d in fs:
        row = {"layer": d.layer, "site": d.where, **rec[d.layer], **ces.get(d.layer, {})}
        rows.append({k: row[k] for k in METRIC_COLUMNS if k in row})
    return rows


def layers_of(fs: FeatureSet) -> Sequence[int]:
    return [d.layer for d in fs]
