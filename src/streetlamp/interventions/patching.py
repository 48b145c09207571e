"""Activation patching, path patching and attribution patching on a clean/corrupted pair.

Metric (Wang et al. 2023; Heimersheim & Nanda 2024): the logit difference
``LD(x) = logit(answer) - logit(wrong)`` of the explained output, normalised as
``m = (LD_patched - LD_corrupt) / (LD_clean - LD_corrupt)``: 0 = the corrupted run, 1 = the clean run.

* **Activation patching** (denoising): run the *corrupted* input and copy one clean activation
  (residual stream entering layer l at one position, attention output, MLP output at one position,
  or one head's ``attn.z`` at every position) into it; ``m`` is the fraction of the clean
  behaviour that single activation restores.
* **Path patching** (Wang et al., ICLR 2023, "Interpretability in the Wild", section 3.1; noising as
  in the paper): run the *clean* input with the sender head's output taken from the corrupted run
  and every other head frozen at its clean value (MLPs recompute). With receiver ``logits`` the
  metric is read from that run (the sender's direct path plus paths through MLPs); with receiver
  heads, their ``attn.z`` from that run (optionally only at one position) is patched into a
  fresh clean run. ``m`` near 1 = the path does not matter, lower = it carries the behaviour.
* **Attribution patching** (Nanda 2023; Kramár et al. 2024): the first-order approximation of
  activation patching, ``(a_clean - a_corrupt) · ∂LD/∂a`` evaluated on the corrupted run, one
  backward pass for all sites, divided by ``LD_clean - LD_corrupt`` to be in units of ``m``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter, at_least_float32
from . import engine
from .engine import Intervention

KINDS = ("resid_pre", "attn.out", "mlp.out")  # by layer and position; heads: attn.z, by layer and head
# the sites of an attached feature set (--features): one feature at every position; one dictionary's error term
FEATURE_KINDS = ("features", "features_error")
# features.csv (patch --sites features): what each column holds
FEATURE_COLUMNS = {
    "layer": "the dictionary's layer",
    "site": "resid_pre (an SAE on the layer's input) or mlp (a transcoder of the layer's MLP)",
    "feature": "the latent's index in its dictionary",
    "restored": "normalised logit difference with this feature's clean activation patched into the corrupted run "
    "at every position (0 corrupt, 1 clean); the error term and the other features stay corrupted",
    "max_abs_change": "max over positions of |clean activation - corrupted activation|",
}


@dataclass
class Pair:
    clean: Inputs
    corrupt: Inputs
    answer: int
    wrong: int
    ld_clean: float
    ld_corrupt: float

    def normalise(self, ld: torch.Tensor | np.ndarray | float):
        return (ld - self.ld_corrupt) / (self.ld_clean - self.ld_corrupt)


def logit_diff(logits: torch.Tensor, answer: int, wrong: int) -> torch.Tensor:
    return at_least_float32(logits[:, answer]) - at_least_float32(logits[:, wrong])


def make_pair(
    adapter: ModelAdapter, clean_text: str, corrupt_text: str, answer: int | None = None, wrong: int | None = None
) -> Pair:
    """Encode both texts, check equal token length, choose answer/wrong, compute both LDs.

    Default answer: the clean prediction; default wrong: the corrupted prediction (or, when
    the two agree, the clean run's second most likely output).
    """
    clean, corrupt = adapter.encode(clean_text), adapter.encode(corrupt_text)
    n, m = clean.lengths[0], corrupt.lengths[0]
    if n != m:
        raise StreetlampError(
            f"clean text has {n} tokens and corrupted text has {m}; patching copies activations position by "
            f"position, so both must have the same token length (clean: {clean.labels[0]}, corrupted: "
            f"{corrupt.labels[0]})"
        )
    with torch.no_grad():
        lc = adapter.forward(clean).logits
        lx = adapter.forward(corrupt).logits
    if answer is None:
        answer = int(lc.argmax(-1))
    if wrong is None:
        wrong = int(lx.argmax(-1))
        if wrong == answer:
            wrong = int(lc[0].topk(2).indices[1])
    if answer == wrong:
        raise StreetlampError("answer and wrong output are the same; give two different ones")
    for i in (answer, wrong):
        if not 0 <= i < adapter.n_outputs:
            raise StreetlampError(f"output {i} out of range: the model has {adapter.n_outputs} outputs")
    ldc, ldx = float(logit_diff(lc, answer, wrong)), float(logit_diff(lx, answer, wrong))
    if abs(ldc - ldx) < 1e-6:
        raise StreetlampError(
            f"the logit difference is the same on both inputs ({ldc:.4f}); nothing to restore: "
            "choose a corruption that changes the answer"
        )
    return Pair(clean, corrupt, answer, wrong, ldc, ldx)


def _sites(adapter: ModelAdapter) -> list[str]:
    return [f"layers.{l}.{k}" for l in range(adapter.n_layers) for k in KINDS + ("attn.z",)]


def first_difference(pair: Pair) -> int:
    """First position where the clean and corrupted token ids differ."""
    a, b = pair.clean.input_ids[0], pair.corrupt.input_ids[0]
    diff = (a != b).nonzero()
    return int(diff[0]) if len(diff) else len(a)


def activation_patching(
    adapter: ModelAdapter,
    pair: Pair,
    progress: bool = False,
    kinds: Sequence[str] = KINDS + ("heads",),
    batch_size: int | None = None,
) -> dict[str, np.ndarray]:
    """Normalised metric for patching each clean activation into the corrupted run.

    Returns ``{"resid_pre"|"attn.out"|"mlp.out": [layer, pos], "heads": [layer, head]}`` (the
    ``kinds`` asked for). In a causal LM every activation before the first differing token is the
    same in both runs, so patching it is exactly 0 and is not run.
    """
    bad = set(kinds) - set(KINDS + ("heads",))
    if bad:
        raise StreetlampError(f"unknown site kind(s) {sorted(bad)}; choose from {', '.join(KINDS + ('heads',))}")
    L, H, P = adapter.n_layers, adapter.n_heads, pair.clean.lengths[0]
    clean = adapter.forward(pair.clean, record=_sites(adapter)).cache
    out = {k: np.zeros((L, P), np.float32) for k in KINDS if k in kinds}
    if "heads" in kinds:
        out["heads"] = np.zeros((L, H), np.float32)
    start = first_difference(pair) if adapter.kind.causal else 0
    positions = list(range(start, P))
    by_pos = engine.repeat_inputs(pair.corrupt, len(positions))
    by_head = engine.repeat_inputs(pair.corrupt, H)
    it = range(L)
    if progress:
        from tqdm import tqdm

        it = tqdm(it, desc="activation patching", leave=False)
    with torch.no_grad():
        for l in it:
            for k in KINDS:
                if k not in kinds or not positions:
                    continue
                s = f"layers.{l}.{k}"
                ivs = [Intervention(s, engine.patch(clean[s]), pos=p, rows=[i]) for i, p in enumerate(positions)]
                out[k][l, positions] = (
                    pair.normalise(
                        logit_diff(engine.run_batched(adapter, by_pos, ivs, batch_size).logits, pair.answer, pair.wrong)
                    )
                    .cpu()
                    .numpy()
                )
            if "heads" not in kinds:
                continue
            s = f"layers.{l}.attn.z"
            ivs = [Intervention(s, engine.patch(clean[s]), head=h, rows=[h]) for h in range(H)]
            out["heads"][l] = (
                pair.normalise(
                    logit_diff(engine.run_batched(adapter, by_head, ivs, batch_size).logits, pair.answer, pair.wrong)
                )
                .cpu()
                .numpy()
            )
    return out


@dataclass
class FeaturePatching:
    """Patching an attached feature set's sites. ``features``: one row per (dictionary, feature) whose clean and
    corrupted activations differ somewhere (the others restore exactly 0 and are not run): ``layer``, ``site``
    (``resid_pre`` SAE or ``mlp`` transcoder), ``feature``, ``restored`` (normalised logit difference with that
    feature's clean activation at every position patched into the corrupted run, the error term and every other
    feature kept at their corrupted values), ``max_abs_change`` (max over positions of |clean − corrupted|).
    ``error``: ``[dictionary, pos]`` patching one dictionary's error term at one position (NaN: not asked)."""

    dictionaries: list[tuple[int, str]]
    features: list[dict]
    error: np.ndarray | None


def feature_patching(
    adapter: ModelAdapter,
    pair: Pair,
    kinds: Sequence[str] = FEATURE_KINDS,
    batch_size: int | None = None,
    progress: bool = False,
) -> FeaturePatching:
    """Activation patching of the feature sites (``--sites features,features_error``) of ``adapter.features``."""
    from ..models.features import feature_site

    fs = adapter.features
    if fs is None:
        raise StreetlampError("patching feature sites needs a feature set: give --features DICT")
    dicts = [(d.layer, d.where) for d in fs]
    f_sites = [feature_site(l, w) for l, w in dicts]
    e_sites = [feature_site(l, w, True) for l, w in dicts]
    with torch.no_grad():
        clean = adapter.forward(pair.clean, record=f_sites + e_sites).cache
        corrupt = adapter.forward(pair.corrupt, record=f_sites).cache
    P = pair.clean.lengths[0]
    start = first_difference(pair) if adapter.kind.causal else 0
    positions = list(range(start, P))
    rows: list[dict] = []
    error = None
    it = list(enumerate(dicts))
    if progress:
        from tqdm import tqdm

        it = tqdm(it, desc="feature patching", leave=False)
    with torch.no_grad():
        for i, (l, w) in it:
            if "features" in kinds:
                s = f_sites[i]
                change = (at_least_float32(clean[s]) - at_least_float32(corrupt[s])).abs()[0].amax(0)
                feats = [int(f) for f in (change > 0).nonzero().flatten()]
                if feats:
                    by = engine.repeat_inputs(pair.corrupt, len(feats))
                    ivs = [Intervention(s, engine.patch(clean[s]), head=f, rows=[j]) for j, f in enumerate(feats)]
                    ld = logit_diff(engine.run_batched(adapter, by, ivs, batch_size).logits, pair.answer, pair.wrong)
                    restored = pair.normalise(ld).cpu().numpy()
                    rows += [
                        {
                            "layer": l,
                            "site": w,
                            "feature": f,
                            "restored": float(r),
                            "max_abs_change": float(change[f]),
                        }
                        for f, r in zip(feats, restored)
                    ]
            if "features_error" in kinds:
                if error is None:
                    error = np.full((len(dicts), P), np.nan, np.float32)
                    error[:, :start] = 0.0  # before the first differing token both runs are the same
                if positions:
                    s = e_sites[i]
                    by = engine.repeat_inputs(pair.corrupt, len(positions))
                    ivs = [Intervention(s, engine.patch(clean[s]), pos=p, rows=[j]) for j, p in enumerate(positions)]
                    ld = logit_diff(engine.run_batched(adapter, by, ivs, batch_size).logits, pair.answer, pair.wrong)
                    error[i, positions] = pair.normalise(ld).cpu().numpy()
    rows.sort(key=lambda r: -abs(r["restored"]))
    return FeaturePatching(dicts, rows, error)


def attribution_patching(adapter: ModelAdapter, pair: Pair) -> dict[str, np.ndarray]:
    """``(a_clean - a_corrupt) · ∂LD/∂a`` at the corrupted run, normalised; same keys as
    :func:`activation_patching` (heads: summed over positions and ``d_head``)."""
    sites = _sites(adapter)
    clean = adapter.forward(pair.clean, record=sites).cache
    fwd = adapter.forward(pair.corrupt, record=sites, keep_grad=True, grad=True)
    ld = logit_diff(fwd.logits, pair.answer, pair.wrong).sum()
    grads = torch.autograd.grad(ld, [fwd.cache[s] for s in sites], allow_unused=True)
    g = dict(zip(sites, grads))
    L, P = adapter.n_layers, pair.clean.lengths[0]
    scale = pair.ld_clean - pair.ld_corrupt
    out = {k: np.zeros((L, P), np.float32) for k in KINDS}
    out["heads"] = np.zeros((L, adapter.n_heads), np.float32)
    for s in sites:
        l, k = int(s.split(".")[1]), s.split(".", 2)[2]
        gr = g[s] if g[s] is not None else torch.zeros_like(fwd.cache[s])
        prod = at_least_float32((clean[s] - fwd.cache[s].detach()) * gr)[0]
        if k == "attn.z":
            out["heads"][l] = (prod.sum((0, 2)) / scale).cpu().numpy()
        else:
            out[k][l] = (prod.sum(-1) / scale).cpu().numpy()
    return out


def compare(real: dict[str, np.ndarray], approx: dict[str, np.ndarray], top: int = 5) -> dict:
    """Pearson correlation per site kind and the sites where approximation and truth differ most."""
    res = {}
    for k in real:
        a, b = real[k].reshape(-1), approx[k].reshape(-1)
        r = float(np.corrcoef(a, b)[0, 1]) if a.std() > 0 and b.std() > 0 else float("nan")
        worst = np.argsort(-np.abs(a - b))[:top]
        cols = real[k].shape[1]
        res[k] = {
            "pearson": r,
            "largest_disagreements": [
                {
                    "layer": int(i // cols),
                    ("head" if k == "heads" else "pos"): int(i % cols),
                    "patching": float(a[i]),
                    "attribution": float(b[i]),
                }
                for i in worst
            ],
        }
    return res


def path_patching(
    adapter: ModelAdapter,
    pair: Pair,
    receivers: Sequence[tuple[int, int]] | None = None,
    receiver_pos: int | None = None,
    progress: bool = False,
    batch_size: int | None = None,
) -> np.ndarray:
    """Normalised metric ``[layer, head]`` for the path sender (l, h) -> receivers.

    ``receivers=None``: the logits (sender's direct path, MLPs recomputed). Otherwise a list of
    (layer, head): senders must lie in earlier layers (NaN elsewhere).
    """
    L, H, P = adapter.n_layers, adapter.n_heads, pair.clean.lengths[0]
    for lr, hr in receivers or []:
        engine.check_layer_head(adapter, lr, hr)
    if receiver_pos is not None and not 0 <= receiver_pos < P:
        raise StreetlampError(f"receiver position {receiver_pos} out of range 0..{P - 1}")
    zs = [f"layers.{l}.attn.z" for l in range(L)]
    clean = adapter.forward(pair.clean, record=zs).cache
    corrupt = adapter.forward(pair.corrupt, record=zs).cache
    rec_layers = sorted({lr for lr, _ in receivers or []})
    last = min(rec_layers) if rec_layers else L
    out = np.full((L, H), np.nan, np.float32)
    base = engine.repeat_inputs(pair.clean, H)

    def freeze(l: int) -> engine.Strategy:
        keep = [hr for lr, hr in receivers or [] if lr == l]

        def fn(a: torch.Tensor) -> torch.Tensor:
            new = clean[f"layers.{l}.attn.z"].to(a.dtype).expand_as(a).clone()
            if keep:
                new[:, :, keep] = a[:, :, keep]
            return new

        return fn

    it = range(last)
    if progress:
        from tqdm import tqdm

        it = tqdm(it, desc="path patching", leave=False)
    with torch.no_grad():
        for ls in it:
            ivs = [Intervention(zs[l], freeze(l)) for l in range(L)]
            ivs += [Intervention(zs[ls], engine.patch(corrupt[zs[ls]]), head=h, rows=[h]) for h in range(H)]
            rec = [zs[l] for l in rec_layers]
            fwd = engine.run_batched(adapter, base, ivs, batch_size, record=rec)
            if not receivers:
                ld = logit_diff(fwd.logits, pair.answer, pair.wrong)
            else:
                ivs2 = [
                    Intervention(zs[lr], engine.patch(fwd.cache[zs[lr]]), head=hr, pos=receiver_pos)
                    for lr, hr in receivers
                ]
                ld = logit_diff(engine.run(adapter, base, ivs2).logits, pair.answer, pair.wrong)
            out[ls] = pair.normalise(ld).cpu().numpy()
    return out
