"""Interventions on features (METHODS.md §13; issue 38, Must-have 2), all through the one patching engine.

A feature is one latent of a dictionary attached to the adapter (:meth:`ModelAdapter.attach_features`):
``Feature(layer, where, index)`` lives at the site ``layers.{layer}.{where}.features`` ``[batch, pos, feature]``
and the engine addresses it with ``head=index`` (:data:`.engine.FEATURE_AXIS_SITES`). The spliced layer then
reads ``decode(a') + error`` (:mod:`streetlamp.models.features`), so every edit below acts on the model through
the feature's decoder row ``W_dec[index]``.

Strategies (``strategy(activation) -> replacement`` as in :mod:`.engine`; the engine keeps only the feature's
column, at every position unless ``pos`` is given):

* zero ablation: :func:`.engine.zero`, ``a_f <- 0``;
* mean ablation: :func:`.engine.mean` with :func:`feature_means` ``per_position=False`` (the default: the mean
  over every real token of a reference set, *pooled* over positions), or :func:`position_mean` with
  ``per_position=True`` (the mean at each position over the reference texts that are that long);
* patching: :func:`.engine.patch` with the feature activations of a corrupted run (same token length), put
  into the clean run;
* :func:`steer` ``alpha``: ``a_f <- a_f + alpha``, which is adding ``alpha * W_dec[f]`` to the site's output
  (the decoder is linear in ``a``; a transcoder's skip term reads the input, not ``a``);
* :func:`clamp` ``value``: ``a_f <- value`` where the feature is active (``a_f != 0``; ``where="active"``) or at
  every position (``where="everywhere"``).

The error term (``x - x̂`` of an SAE, ``mlp_out - recon`` of a transcoder) of every dictionary *downstream* of
the first edited site is either ``recomputed`` -- what the spliced model does naturally: downstream layers see
the edited stream and their own error follows it, so downstream the model is the real model -- or ``frozen`` at
the clean run's value (Marks et al. 2025's sparse feature circuits): downstream dictionaries then pass on
``decode(encode(x')) + e_clean``. The edited dictionary's own error is the same either way (it is computed from
its input, which the edit does not change). :func:`run` takes ``error=`` explicitly; every record this module
returns carries it.

Attribution patching (:func:`attribution`): ``Σ_pos ∂m/∂a_f · (ã_f - a_f)`` at the clean run, ``ã`` the
strategy's replacement (the corrupted run's activation for patching, 0, the mean, ``a + α``); the gradient
reaches the features through their decoder (``keep_grad`` splices every dictionary) and, with ``frozen``,
not through any error term (the frozen errors are constants). :func:`exact` runs the edit, one row per
(prompt, feature), and :func:`audit` compares the two in the layout of ``circuit``'s audit of first-order edge
scores (:func:`.circuits.scores.audit`), with rank correlation, sign agreement and the top-k by each.
:func:`task_audit` (``streetlamp features-audit``) runs them for the features of a task chosen by
:func:`most_active` (mean activation) or :func:`most_attributed` (|attribution of zero ablation|, every feature of
every dictionary from one backward). The gradient is taken at the clean run, as EAP's: the estimate is of noising
(the clean run with the feature edited), not of :mod:`.patching`'s denoising.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..batching import rows_per_batch
from ..errors import StreetlampError
from ..models.adapter import Forward, Inputs, ModelAdapter
from ..models.features import feature_site
from ..stats import kendall_tau, spearman_rho
from . import engine
from .circuits.scores import metric_values
from .circuits.tasks import PairSet
from .engine import Intervention, Strategy

__all__ = [
    "CLAMP_WHERE",
    "EDITS",
    "ERRORS",
    "Feature",
    "attribution",
    "audit",
    "clamp",
    "clean_errors",
    "exact",
    "feature_means",
    "intervention",
    "most_active",
    "most_attributed",
    "position_mean",
    "run",
    "steer",
]

ERRORS = ("recomputed", "frozen")
CLAMP_WHERE = ("active", "everywhere")
# the edits the audit knows: each a strategy built per feature (and per batch of rows, for patching)
EDITS = ("patch", "zero", "mean", "steer", "clamp")
# which features the task audit takes: the most active, or the largest attribution of zero ablation
SELECT = ("active", "attribution")
ERROR_MEANING = {
    "recomputed": "downstream dictionaries' errors recomputed from the edited run (downstream = the real model)",
    "frozen": "downstream dictionaries' errors frozen at the clean run's value (downstream = decode(encode(x')) + "
    "e_clean)",
}


@dataclass(frozen=True, order=True)
class Feature:
    """Latent ``index`` of the dictionary at ``layer`` / ``where`` (``resid_pre``: an SAE, ``mlp``: a transcoder)."""

    layer: int
    where: str
    index: int

    @property
    def site(self) -> str:
        return feature_site(self.layer, self.where)

    @property
    def name(self) -> str:
        return f"L{self.layer}.{self.where}.{self.index}"


def _order(site: str) -> tuple[int, float]:
    """Forward order of a site: (layer, 0 resid_pre (and its features) < 0.5 attn < 1 mlp (and its features) <
    2 resid_post); ``embed`` first."""
    parts = site.split(".")
    if parts[0] != "layers":
        return -1, 0.0
    return int(parts[1]), {"resid_pre": 0.0, "attn": 0.5, "mlp": 1.0}.get(parts[2], 2.0)


def check_feature(adapter: ModelAdapter, f: Feature) -> None:
    fs = adapter.features
    if fs is None:
        raise StreetlampError("no feature set attached: give a dictionary (adapter.attach_features, --features DICT)")
    d = fs.get(f.layer, f.where)
    if d is None:
        have = ", ".join(f"L{x.layer}.{x.where}" for x in fs)
        raise StreetlampError(f"feature {f.name}: no dictionary at layer {f.layer} ({f.where}); the set has {have}")
    if not 0 <= f.index < d.width:
        raise StreetlampError(f"feature {f.name}: index out of range, the dictionary has features 0..{d.width - 1}")


def _check_error(error: str) -> None:
    if error not in ERRORS:
        raise StreetlampError(f"error term {error!r}: choose {' or '.join(ERRORS)}")


# -- strategies (the engine's zero / mean / patch, plus these) ------------------------------------------------
def steer(alpha: float | torch.Tensor) -> Strategy:
    """``a <- a + alpha``: on one feature (``head=f``) this adds ``alpha * W_dec[f]`` to the site's output."""

    def fn(a: torch.Tensor) -> torch.Tensor:
        return a + (alpha.to(a.device, a.dtype) if isinstance(alpha, torch.Tensor) else alpha)

    return fn


def clamp(value: float, where: str = "active") -> Strategy:
    """``a <- value`` where the feature is active (``a != 0``) or at every position (``everywhere``)."""
    if where not in CLAMP_WHERE:
        raise StreetlampError(f"clamp where {where!r}: choose {' or '.join(CLAMP_WHERE)}")

    def fn(a: torch.Tensor) -> torch.Tensor:
        v = torch.full_like(a, float(value))
        return v if where == "everywhere" else torch.where(a != 0, v, a)

    return fn


def position_mean(value: torch.Tensor) -> Strategy:
    """Mean ablation with a per-position mean ``[pos, width]`` (:func:`feature_means` ``per_position=True``)."""

    def fn(a: torch.Tensor) -> torch.Tensor:
        if a.shape[1] > value.shape[0]:
            raise StreetlampError(
                f"per-position means cover {value.shape[0]} positions but the input has {a.shape[1]}: give "
                "reference texts at least as long, or pooled means"
            )
        return value[None, : a.shape[1]].to(a.device, a.dtype).expand_as(a)

    return fn


def intervention(
    f: Feature, strategy: Strategy, pos: int | None = None, rows: Sequence[int] | None = None
) -> Intervention:
    """The engine's :class:`Intervention` on feature ``f`` alone (``head=f.index`` at ``f.site``)."""
    return Intervention(f.site, strategy, head=f.index, pos=pos, rows=rows)


def feature_means(
    adapter: ModelAdapter, reference: Inputs, sites: Sequence[str], per_position: bool = False
) -> dict[str, torch.Tensor]:
    """Mean feature activations over the real tokens of ``reference``: pooled over positions ``[width]``
    (:func:`.engine.site_means`), or per position ``[pos, width]`` (each position over the texts that reach it)."""
    if not per_position:
        with torch.no_grad():
            return engine.site_means(adapter, reference, sites)
    with torch.no_grad():
        fwd = adapter.forward(reference, record=list(sites))
    real = reference.attention_mask.to(adapter.device)[..., None]
    out = {}
    for s in sites:
        a = fwd.cache[s]
        out[s] = (a * real).sum(0) / real.sum(0).clamp(min=1)
    return out


def clean_errors(adapter: ModelAdapter, inputs: Inputs) -> dict[str, torch.Tensor]:
    """Every attached dictionary's error ``[batch, pos, d]`` on ``inputs`` (recorded only: the model is untouched)."""
    fs = adapter.features
    if fs is None:
        raise StreetlampError("no feature set attached")
    sites = [feature_site(d.layer, d.where, True) for d in fs]
    with torch.no_grad():
        return dict(adapter.forward(inputs, record=sites).cache)


def _frozen(
    adapter: ModelAdapter, after: tuple[int, float] | None, errors: dict[str, torch.Tensor], rows: Sequence[int] | None
) -> list[Intervention]:
    """Interventions freezing each dictionary's error downstream of ``after`` (None: every dictionary) at
    ``errors`` (``rows``: which rows of the recorded errors this batch holds)."""
    assert adapter.features is not None
    out = []
    for d in adapter.features:
        s = feature_site(d.layer, d.where, True)
        if after is not None and _order(s) <= after:
            continue
        src = errors[s] if rows is None else errors[s][list(rows)]
        out.append(Intervention(s, engine.patch(src)))
    return out


def run(
    adapter: ModelAdapter,
    inputs: Inputs,
    interventions: Iterable[Intervention],
    *,
    error: str,
    errors: dict[str, torch.Tensor] | None = None,
    record: Iterable[str] = (),
    keep_grad: bool = False,
    grad: bool = False,
) -> Forward:
    """:func:`.engine.run` with the error term ``recomputed`` or ``frozen`` (module docstring): frozen errors take
    ``errors`` (:func:`clean_errors` of ``inputs``; recorded here when not given)."""
    _check_error(error)
    if adapter.features is None:
        raise StreetlampError("no feature set attached: give a dictionary (adapter.attach_features, --features DICT)")
    ivs = list(interventions)
    extra: list[Intervention] = []
    if error == "frozen" and ivs:
        first = min(_order(iv.site) for iv in ivs)
        if errors is None:
            errors = clean_errors(adapter, inputs)
        extra = [iv for iv in _frozen(adapter, first, errors, None) if iv.site not in {v.site for v in ivs}]
    return engine.run(adapter, inputs, [*ivs, *extra], record=record, keep_grad=keep_grad, grad=grad)


# -- which features: the most active on a set of prompts ------------------------------------------------------
def activity(adapter: ModelAdapter, inputs: Inputs) -> dict[str, dict[str, np.ndarray]]:
    """Per feature site: ``mean`` activation over real tokens, ``max``, and ``frequency`` (share of real tokens
    where it is active), each ``[width]``."""
    fs = adapter.features
    if fs is None:
        raise StreetlampError("no feature set attached")
    sites = [feature_site(d.layer, d.where) for d in fs]
    with torch.no_grad():
        fwd = adapter.forward(inputs, record=sites)
    real = inputs.attention_mask.bool().to(adapter.device)
    out = {}
    for s in sites:
        a = fwd.cache[s][real].double()
        out[s] = {
            "mean": a.mean(0).cpu().numpy(),
            "max": a.max(0).values.cpu().numpy(),
            "frequency": (a != 0).double().mean(0).cpu().numpy(),
        }
    return out


def most_active(adapter: ModelAdapter, inputs: Inputs, n: int, by: str = "mean") -> list[Feature]:
    """The ``n`` features with the largest ``by`` (``mean`` or ``max`` activation over the real tokens of
    ``inputs``), over every attached dictionary; ties broken by (layer, site, index)."""
    act = activity(adapter, inputs)
    cand = []
    for s, v in act.items():
        l, w = int(s.split(".")[1]), s.split(".")[2]
        cand += [(-float(x), Feature(l, w, i)) for i, x in enumerate(v[by]) if x > 0]
    cand.sort()
    return [f for _, f in cand[:n]]


# -- attribution vs exact on clean/corrupted pairs ------------------------------------------------------------
@dataclass
class EditSpec:
    """One edit of the audit: ``how`` in :data:`EDITS` with its values (``means`` per site for ``mean``,
    ``alpha`` per feature for ``steer``, ``value`` / ``where`` for ``clamp``); ``patch`` reads the pairs'
    corrupted prompts."""

    how: str
    means: dict[str, torch.Tensor] | None = None
    alpha: dict[Feature, float] | None = None
    value: float = 0.0
    where: str = "active"

    def __post_init__(self) -> None:
        if self.how not in EDITS:
            raise StreetlampError(f"unknown feature edit {self.how!r}; choose from {', '.join(EDITS)}")
        if self.how == "mean" and self.means is None:
            raise StreetlampError("mean ablation needs the reference means (feature_means)")
        if self.how == "steer" and self.alpha is None:
            raise StreetlampError("steering needs an alpha per feature")

    def describe(self) -> str:
        return {
            "patch": "the corrupted prompt's activation of the feature put into the clean run, every position",
            "zero": "the feature set to 0 at every position",
            "mean": "the feature set to its mean over the reference tokens, every position",
            "steer": "alpha added to the feature at every position (alpha W_dec[f] added to the site's output)",
            "clamp": f"the feature set to {self.value:g} "
            + ("where active" if self.where == "active" else "at every position"),
        }[self.how]

    def strategy(self, f: Feature, corrupt: dict[str, torch.Tensor] | None, rows: Sequence[int]) -> Strategy:
        if self.how == "zero":
            return engine.zero
        if self.how == "mean":
            assert self.means is not None
            m = self.means[f.site]
            return engine.mean(m) if m.dim() == 1 else position_mean(m)
        if self.how == "steer":
            assert self.alpha is not None
            return steer(float(self.alpha[f]))
        if self.how == "clamp":
            return clamp(self.value, self.where)
        assert corrupt is not None
        return engine.patch(corrupt[f.site][list(rows)])


def _corrupt(adapter: ModelAdapter, pairs: PairSet, sites: Sequence[str]) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return dict(adapter.forward(pairs.corrupt, record=list(sites)).cache)


def _metric(logits: torch.Tensor, pairs: PairSet, rows: Sequence[int], metric: str) -> torch.Tensor:
    idx = list(rows)
    return metric_values(logits, pairs.answer[idx], pairs.wrong[idx], metric)


def _clean_grads(
    adapter: ModelAdapter, pairs: PairSet, error: str, metric: str, sites: Sequence[str]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor | None]]:
    """The clean run's feature activations at ``sites`` and ``∂(Σ_prompts m)/∂a`` there (one forward, one
    backward through the splice; ``frozen``: every error a constant)."""
    fs = adapter.features
    assert fs is not None
    every = [feature_site(d.layer, d.where) for d in fs]
    extra = _frozen(adapter, None, clean_errors(adapter, pairs.clean), None) if error == "frozen" else []
    fwd = engine.run(adapter, pairs.clean, extra, record=every, keep_grad=True, grad=True)
    m = _metric(fwd.logits, pairs, range(len(pairs)), metric).sum()
    want = list(sites)
    got = torch.autograd.grad(m, [fwd.cache[s] for s in want], allow_unused=True)
    grads: dict[str, torch.Tensor | None] = dict(zip(want, got))
    return {s: fwd.cache[s].detach() for s in want}, grads


def attribution(
    adapter: ModelAdapter,
    pairs: PairSet,
    features: Sequence[Feature],
    edit: EditSpec,
    *,
    error: str,
    metric: str = "logit_diff",
) -> np.ndarray:
    """First-order estimates ``[prompt, feature]`` of ``m(edited) - m(clean)``: ``Σ_pos ∂m/∂a_f (ã_f - a_f)``
    at the clean run (float64 sum), one forward and one backward for every feature."""
    _check_error(error)
    for f in features:
        check_feature(adapter, f)
    want = sorted({f.site for f in features})
    corrupt = _corrupt(adapter, pairs, want) if edit.how == "patch" else None
    n = len(pairs)
    acts, grads = _clean_grads(adapter, pairs, error, metric, want)
    real = pairs.clean.attention_mask.to(adapter.device).bool()
    out = np.zeros((n, len(features)))
    for j, f in enumerate(features):
        a = acts[f.site]
        g = grads[f.site]
        if g is None:
            continue
        new = edit.strategy(f, corrupt, range(n))(a)
        new = new.expand_as(a) if new.shape != a.shape else new
        delta = (new[..., f.index] - a[..., f.index]).double() * real
        out[:, j] = (g[..., f.index].double() * delta).sum(1).cpu().numpy()
    return out


def most_attributed(
    adapter: ModelAdapter, pairs: PairSet, n: int, *, error: str = "recomputed", metric: str = "logit_diff"
) -> list[Feature]:
    """The ``n`` features of every attached dictionary with the largest ``|mean over prompts of the attribution of
    zero-ablating them|`` (``Σ_pos ∂m/∂a_f (0 - a_f)``, all features at once from one backward); only features
    active somewhere on the clean prompts; ties broken by (layer, site, index)."""
    _check_error(error)
    fs = adapter.features
    if fs is None:
        raise StreetlampError("no feature set attached")
    sites = [feature_site(d.layer, d.where) for d in fs]
    acts, grads = _clean_grads(adapter, pairs, error, metric, sites)
    real = pairs.clean.attention_mask.to(adapter.device).bool()[..., None]
    cand = []
    for s in sites:
        g, a = grads[s], acts[s].double()
        if g is None:
            continue
        score = (-(g.double() * a) * real).sum(1).mean(0).abs().cpu().numpy()
        active = ((a != 0) & real).any(1).any(0).cpu().numpy()
        l, w = int(s.split(".")[1]), s.split(".")[2]
        cand += [(-float(score[i]), Feature(l, w, int(i))) for i in np.flatnonzero(active)]
    cand.sort()
    return [f for _, f in cand[:n]]


def exact(
    adapter: ModelAdapter,
    pairs: PairSet,
    features: Sequence[Feature],
    edit: EditSpec,
    *,
    error: str,
    metric: str = "logit_diff",
    batch_size: int | None = None,
) -> np.ndarray:
    """``m(edited) - m(clean)`` ``[prompt, feature]``: each feature edited alone in the clean run, one row per
    (prompt, feature), rows batched by the token budget ``batch_size``."""
    _check_error(error)
    for f in features:
        check_feature(adapter, f)
    fs = adapter.features
    assert fs is not None
    sites = sorted({f.site for f in features})
    corrupt = _corrupt(adapter, pairs, sites) if edit.how == "patch" else None
    errs = clean_errors(adapter, pairs.clean) if error == "frozen" else {}
    with torch.no_grad():
        base = _metric(adapter.forward(pairs.clean).logits, pairs, range(len(pairs)), metric).double().cpu()
    jobs = [(i, j) for i in range(len(pairs)) for j in range(len(features))]
    jobs.sort(key=lambda ij: pairs.clean.lengths[ij[0]])  # similar lengths together: less padding
    out = np.full((len(pairs), len(features)), np.nan)
    width = int(pairs.clean.input_ids.shape[1])
    step = rows_per_batch(width, batch_size, adapter.device)
    for s in range(0, len(jobs), step):
        part = jobs[s : s + step]
        idx = [i for i, _ in part]
        inp = pairs.clean.select(idx)
        w = int(inp.input_ids.shape[1])
        cut = None if corrupt is None else {k: v[:, :w] for k, v in corrupt.items()}
        ivs = [
            intervention(features[j], edit.strategy(features[j], cut, idx), rows=[r]) for r, (_, j) in enumerate(part)
        ]
        if error == "frozen":
            first = min(_order(iv.site) for iv in ivs)
            ivs += _frozen(adapter, first, {k: v[:, :w] for k, v in errs.items()}, idx)
        with torch.no_grad():
            mv = _metric(engine.run(adapter, inp, ivs).logits, pairs, idx, metric).double().cpu()
        for r, (i, j) in enumerate(part):
            out[i, j] = float(mv[r] - base[i])
    return out


def audit(estimate: np.ndarray, exact_: np.ndarray, names: Sequence[str], top_k: int = 10) -> dict:
    """The first-order estimate vs the exact effect per feature (each the mean over prompts), in the layout of
    ``circuit``'s audit of edge scores (:func:`.circuits.scores.audit`): both scores, mean and max absolute error
    (and relative to the largest exact effect), Kendall's tau and the share of misranked pairs (ties in either
    excluded), plus Spearman's rho, the share of features whose signs agree (exact effects of exactly 0
    excluded), and the top-k features by |estimate| and by |exact| with their overlap."""
    ap, ex = np.asarray(estimate, np.float64), np.asarray(exact_, np.float64)
    err = np.abs(ap - ex)
    di, dj = np.subtract.outer(ex, ex), np.subtract.outer(ap, ap)
    upper = np.triu(np.ones_like(di, dtype=bool), 1) & (di != 0) & (dj != 0)
    mis = float((np.sign(di) != np.sign(dj))[upper].mean()) if upper.any() else float("nan")
    nz = ex != 0
    k = min(top_k, len(ex))
    top_a = [names[i] for i in np.argsort(-np.abs(ap), kind="stable")[:k]]
    top_e = [names[i] for i in np.argsort(-np.abs(ex), kind="stable")[:k]]
    return {
        "features": list(names),
        "exact": ex,
        "estimate": ap,
        "mean_abs_error": float(err.mean()) if len(err) else float("nan"),
        "max_abs_error": float(err.max()) if len(err) else float("nan"),
        "relative_error": float(err.max() / max(np.abs(ex).max(), 1e-300)) if len(err) else float("nan"),
        "kendall_tau": kendall_tau(ap, ex),
        "spearman_rho": spearman_rho(ap, ex),
        "misranked_share": mis,
        "sign_agreement": float((np.sign(ap[nz]) == np.sign(ex[nz])).mean()) if nz.any() else float("nan"),
        "top_k": k,
        "top_by_estimate": top_a,
        "top_by_exact": top_e,
        "top_k_overlap": len(set(top_a) & set(top_e)) / k if k else float("nan"),
    }


# -- the audit of a task: the most active features, attribution vs exact per edit and error mode --------------
@dataclass
class TaskAudit:
    """What :func:`task_audit` measured: ``features`` (the audited ones, most active first), their ``activity``
    on the clean prompts (``mean``/``max``/``frequency`` ``[feature]``), ``alpha`` (steering value per feature),
    per (edit, error) the per-prompt ``estimate`` and ``exact`` ``[prompt, feature]`` and the :func:`audit`
    summary, and ``metric_clean`` ``[prompt]``."""

    features: list[Feature]
    activity: dict[str, np.ndarray]
    alpha: np.ndarray
    estimate: dict[tuple[str, str], np.ndarray]
    exact: dict[tuple[str, str], np.ndarray]
    summary: dict[tuple[str, str], dict]
    metric_clean: np.ndarray
    metric: str


def task_audit(
    adapter: ModelAdapter,
    pairs: PairSet,
    *,
    top: int = 32,
    edits: Sequence[str] = ("patch", "zero", "steer"),
    errors: Sequence[str] = ("recomputed",),
    steer_scale: float = 1.0,
    metric: str = "logit_diff",
    batch_size: int | None = None,
    top_k: int = 10,
    select: str = "active",
) -> TaskAudit:
    """For the ``top`` features most active on the clean prompts (``select="active"``: mean activation over real
    tokens, every attached dictionary; ``"attribution"``: :func:`most_attributed`), each edit of ``edits`` (:data:`EDITS` but ``clamp``) under each error mode: the
    attribution-patching estimate and the exact effect of ``m(edited) - m(clean)`` per prompt, and their audit.
    ``mean`` ablates to the mean over the clean prompts' real tokens (pooled over positions); ``steer`` adds
    ``alpha = steer_scale x`` the feature's largest activation on the clean prompts at every position."""
    for e in edits:
        if e not in EDITS or e == "clamp":
            raise StreetlampError(f"unknown audit edit {e!r}; choose from patch, zero, mean, steer")
    for e in errors:
        _check_error(e)
    if select not in SELECT:
        raise StreetlampError(f"select {select!r}: choose {' or '.join(SELECT)}")
    if select == "active":
        feats = most_active(adapter, pairs.clean, top)
    else:
        feats = most_attributed(adapter, pairs, top, error=errors[0] if errors else "recomputed", metric=metric)
    if not feats:
        raise StreetlampError("no feature is active on the prompts: nothing to audit")
    act = activity(adapter, pairs.clean)
    take = {k: np.array([act[f.site][k][f.index] for f in feats]) for k in ("mean", "max", "frequency")}
    alpha = steer_scale * take["max"]
    means = None
    if "mean" in edits:
        means = feature_means(adapter, pairs.clean, sorted({f.site for f in feats}))
    names = [f.name for f in feats]
    est, exa, summ = {}, {}, {}
    for how in edits:
        spec = EditSpec(how, means=means, alpha=dict(zip(feats, alpha.tolist())))
        for err in errors:
            a = attribution(adapter, pairs, feats, spec, error=err, metric=metric)
            x = exact(adapter, pairs, feats, spec, error=err, metric=metric, batch_size=batch_size)
            est[how, err], exa[how, err] = a, x
            summ[how, err] = audit(a.mean(0), x.mean(0), names, top_k)
    with torch.no_grad():
        lg = adapter.forward(pairs.clean).logits
    m0 = _metric(lg, pairs, range(len(pairs)), metric).double().cpu().numpy()
    return TaskAudit(feats, take, alpha, est, exa, summ, m0, metric)
