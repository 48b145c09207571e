"""Smooth MPRT and Efficient MPRT (Hedström et al., "Sanity Checks Revisited: An Exploration to Repair the
Model Parameter Randomisation Test", XAI in Action 2023, arXiv 2401.06465; Quantus' ``SmoothMPRT`` and
``EfficientMPRT``): two repairs of the randomisation check of :mod:`.randomisation`.

**Smooth MPRT** (``--smooth-mprt N``) denoises both explanations before comparing them: each is the mean
of ``N`` explanations, ``N - 1`` of them on noisy inputs and the last on the clean input (as Quantus:
N = 1 is the plain explanation), and ``smprt_{mode}_spearman@{stage}`` is Spearman's rho between the
trained model's and the randomised model's mean explanations (``_abs``: of their absolute values, taken
after the mean, Quantus' default). For text the input is the ``embed`` site (the token lookup): draw
``n`` adds ``sigma * z[n, t]`` to the embedding of every occurrence of token ``t`` of the example, with
``sigma = noise * (max - min)`` of the example's trained embeddings (Quantus: ``noise_magnitude`` times
the input's range, default 0.1) and ``z[n, t] ~ N(0, I)`` drawn from the run seed, the example's
position, ``n`` and ``t`` (:func:`token_noise`). Keyed by token rather than position, so an occlusion
that deletes tokens leaves the others' noise as it was; a token repeated in the text gets the same
noise at each occurrence, and an id that is not in the example (a replacement or baseline token) none.
The same draws serve the trained and every randomised model (the same noisy inputs); each model
explains its own prediction on the clean input in every draw (one class averaged, as the plain check
explains each model's prediction).

**Efficient MPRT** (``--efficient-mprt``) compares explanation complexity instead of similarity, and only
two models: the trained one and the fully randomised one (the cascading ``embed`` stage, every
parameter redrawn; reused when ``--randomisation`` computes it). ``emprt_rise = (H(e_random) -
H(e_trained)) / H(e_trained)``, ``H`` the discrete entropy (nats) of the histogram of the explanation's
raw scores over the non-special tokens in ``bins`` equal-width bins spanning their range (Quantus'
``discrete_entropy``; its default 100 bins would give most of a sentence's ~20 scores a bin each, so
ours defaults to 10, Quantus' ``min_n_bins``); NaN when the trained explanation is constant (H = 0) or
has fewer than two tokens. ``emprt_entropy_trained`` / ``emprt_entropy_random`` are the two entropies.
A rise means the explanation became more disordered when the model was destroyed (higher is better);
our verdict: ``pass`` when the rise's 95% interval lies above 0, ``fail`` when at or below 0.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import StreetlampError
from ..methods.registry import get_method
from ..models.adapter import Inputs, ModelAdapter, Target

DEFAULT_NOISE = 0.1
DEFAULT_BINS = 10


@dataclass(frozen=True)
class Variants:
    """The run's Smooth / Efficient MPRT settings (``smooth = 0``: off)."""

    smooth: int = 0
    noise: float = DEFAULT_NOISE
    stages: str = "all"
    efficient: bool = False
    bins: int = DEFAULT_BINS


def variants_of(s: Any) -> Variants:
    """The :class:`Variants` of an :class:`~streetlamp.evaluation.pipeline.EvalSettings`."""
    return Variants(s.smooth_mprt, s.smooth_mprt_noise, s.smooth_mprt_stages, s.efficient_mprt, s.efficient_mprt_bins)


def check_variants(v: Variants, randomisation: str) -> None:
    """Refuse bad Smooth / Efficient MPRT settings (one line; before anything is written)."""
    if isinstance(v.smooth, bool) or not isinstance(v.smooth, int) or v.smooth < 0 or v.smooth == 1:
        raise StreetlampError(
            f"--smooth-mprt must be 0 (off) or a sample count of at least 2 (got {v.smooth!r}; 1 is the plain check)"
        )
    if v.smooth and not randomisation:
        raise StreetlampError("--smooth-mprt needs --randomisation cascading, independent or both")
    if not (isinstance(v.noise, (int, float)) and np.isfinite(v.noise) and v.noise > 0):
        raise StreetlampError(f"--smooth-mprt-noise must be a positive number (got {v.noise!r})")
    if not v.stages.strip():
        raise StreetlampError("--smooth-mprt-stages must be 'all' or stage names (head, top, layer.N, embed)")
    if isinstance(v.bins, bool) or not isinstance(v.bins, int) or v.bins < 2:
        raise StreetlampError(f"--efficient-mprt-bins must be an integer of at least 2 (got {v.bins!r})")


def smooth_stages(spec: str, stages: list[str]) -> set[str]:
    """The stages (names of ``stages``, top down) that Smooth MPRT runs at: ``all``, or a comma list of
    stage names where ``top`` is the top block (head and the last layer randomised)."""
    if spec.strip() == "all":
        return set(stages)
    layers = [s for s in stages if s.startswith("layer.")]
    out = set()
    for name in (p.strip() for p in spec.split(",")):
        if name == "top" and layers:
            out.add(max(layers, key=lambda s: int(s.split(".")[1])))
        elif name in stages:
            out.add(name)
        else:
            raise StreetlampError(
                f"--smooth-mprt-stages: unknown stage {name!r}; this model's stages are all, top, {', '.join(stages)}"
            )
    return out


def noise_sigma(adapter: ModelAdapter, ids: list[int], noise: float) -> float:
    """``noise * (max - min)`` of the example's embeddings on the trained model (the ``embed`` site)."""
    with torch.no_grad():
        e = adapter.embed_tokens(torch.as_tensor(ids, dtype=torch.long)).double()
    return float(noise * (e.max() - e.min()))


def token_noise(seed: int, draw: int, ids: list[int], d: int) -> dict[int, torch.Tensor]:
    """``z[draw, t] ~ N(0, I_d)`` (float64) for each distinct token ``t`` of ``ids``, seeded by ``seed``
    (the run seed and the example's position), the draw and the token."""
    out = {}
    for t in sorted(set(int(i) for i in ids)):
        h = int.from_bytes(hashlib.sha256(f"smprt:{seed}:{draw}:{t}".encode()).digest()[:8], "little")
        out[t] = torch.randn(d, generator=torch.Generator().manual_seed(h % (2**63)), dtype=torch.float64)
    return out


@contextmanager
def embedding_noise(adapter: ModelAdapter, sigma: float, z: dict[int, torch.Tensor]) -> Iterator[None]:
    """Inside the block every lookup of token ``t`` (a key of ``z``) at ``adapter``'s ``embed`` site comes
    out as ``embedding + sigma * z[t]``; other ids are unchanged. A forward hook on the lookup module, so
    every method (its own embedding calls and forward passes alike) sees the same noisy input."""
    ids = torch.tensor(sorted(z), dtype=torch.long)
    table = torch.stack([z[int(t)] for t in ids]) * sigma

    def hook(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        x = args[0]
        pos = torch.searchsorted(ids, x.cpu().clamp(min=0))
        hit = (pos < len(ids)) & (ids[pos.clamp(max=len(ids) - 1)] == x.cpu())
        eps = torch.where(hit[..., None], table[pos.clamp(max=len(ids) - 1)], torch.zeros(()))
        return output + eps.to(output.device, output.dtype)

    handle = adapter.embed_module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def predictions(adapter: ModelAdapter, inputs: Inputs) -> list[int]:
    """The model's prediction on each clean input (what every draw of Smooth MPRT explains)."""
    with torch.no_grad():
        return [int(i) for i in adapter.forward(inputs).logits.argmax(-1).cpu()]


class Smoother:
    """Smooth MPRT's mean explanations for one chunk: the noise of each example and draw fixed once."""

    def __init__(
        self, trained: ModelAdapter, inputs: Inputs, v: Variants, seeds: list[int], budget: int | None, seed: int
    ) -> None:
        self.inputs, self.v, self.budget, self.seed = inputs, v, budget, seed
        rows = inputs.rows()
        self.sigma = [noise_sigma(trained, r, v.noise) for r in rows]
        self.z = [
            [token_noise(seeds[b], n, r, trained.d_model) for n in range(v.smooth - 1)] for b, r in enumerate(rows)
        ]

    def mean(
        self,
        adapter: ModelAdapter,
        name: str,
        params: dict,
        clean: list[np.ndarray],
        targets: list[int] | None = None,
    ) -> list[np.ndarray]:
        """Per example the mean of ``smooth - 1`` noisy explanations of ``name`` on ``adapter`` and the
        clean one given (``clean[b]``), each explaining the model's clean prediction (or ``targets[b]``)."""
        method = get_method(name, **params)
        pred = predictions(adapter, self.inputs) if targets is None else targets
        out = []
        for b in range(len(self.inputs)):
            one = self.inputs.select([b])
            noisy = []
            for z in self.z[b]:
                with embedding_noise(adapter, self.sigma[b], z):
                    x = method.attribute(
                        adapter, one, target=Target(index=pred[b]), batch_size=self.budget, seed=self.seed
                    )[0]
                noisy.append(x.scores)
            out.append(smooth_mean(clean[b], noisy))
        return out


def smooth_mean(clean: np.ndarray, noisy: list[np.ndarray]) -> np.ndarray:
    """Quantus' denoised explanation: the mean of the noisy explanations and the clean one (float64)."""
    total = np.asarray(clean, np.float64).copy()
    for x in noisy:
        total += np.asarray(x, np.float64)
    return total / (len(noisy) + 1)


def histogram_entropy(x: np.ndarray, bins: int) -> float:
    """Discrete entropy (nats) of the histogram of ``x`` in ``bins`` equal-width bins over its range."""
    counts, _ = np.histogram(np.asarray(x, np.float64), bins=bins)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def entropy_rise(trained: np.ndarray, random: np.ndarray, special: np.ndarray, bins: int) -> dict[str, float]:
    """Efficient MPRT of one example over its non-special tokens (module docstring)."""
    keep = ~np.asarray(special, bool)
    if keep.sum() < 2:
        nan = float("nan")
        return {"emprt_rise": nan, "emprt_entropy_trained": nan, "emprt_entropy_random": nan}
    h0 = histogram_entropy(np.asarray(trained)[keep], bins)
    h1 = histogram_entropy(np.asarray(random)[keep], bins)
    return {
        "emprt_rise": (h1 - h0) / h0 if h0 > 0 else float("nan"),
        "emprt_entropy_trained": h0,
        "emprt_entropy_random": h1,
    }
