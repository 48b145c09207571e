"""Fitting sparse dictionaries on a model's own activations: an SAE at ``resid_pre`` or a transcoder at the
MLP, one per layer, all layers from the same stream of shards (:mod:`.activations`), with checkpoints.

The losses are SAELens's (``sae_lens/saes/{standard,topk,jumprelu}_sae.py``, ``TrainingSAE``), written here
from their definitions. In units where the inputs are scaled to mean norm ``sqrt(d)`` (SAELens's
``expected_average_only_in``: ``s = sqrt(d) / mean ||x||`` over the first shard, for the input and, for a
transcoder, separately for the target), with ``z = x W_enc + b_enc`` (``x − b_dec`` for an SAE) and
``n_i = ||W_dec[i]||``:

- **mse** ``= mean over tokens of Σ_d (x̂ − y)²``;
- **relu**: ``a = relu(z)``, ``x̂ = a W_dec + b_dec``; loss ``mse + λ · mean Σ_i a_i n_i`` (L1 scaled by the
  decoder norms, λ ramped linearly from 0 over ``warmup`` steps);
- **topk**: ``a = TopK(z · n)`` (the k largest kept, ReLU'd: SAELens's ``rescale_acts_by_decoder_norm``),
  ``x̂ = (a / n) W_dec + b_dec``; loss ``mse`` + optionally the aux-k loss: the ``k_aux = d / 2`` largest
  pre-activations among dead latents (no firing for ``dead_window`` steps) reconstruct the detached residual
  ``y − x̂`` through the decoder (no bias), weighted by ``aux · min(dead / k_aux, 1)``;
- **jumprelu**: ``a = z · [z > θ]`` with ``θ = relu(threshold)``, ``x̂ = a W_dec + b_dec``; loss ``mse + λ · mean
  Σ_i H(z_i − θ_i)``; the gradient reaches θ through the straight-through estimator with a rectangle kernel
  of width ``ε``: ``∂a_i/∂θ_i = −(θ_i/ε) K((z_i − θ_i)/ε)``, ``∂H/∂θ_i = −(1/ε) K(...)``, and ``∂a_i/∂z_i =
  [z_i > θ_i]`` (no estimator on z).

Initialisation as SAELens: ``W_dec`` Kaiming-uniform with rows scaled to norm 0.1, ``W_enc = W_decᵀ``,
``b_enc = 0``, ``threshold`` 0.01 (JumpReLU); ``b_dec`` here starts at the target's mean over the first
shard. Adam (β = 0.9, 0.999, ε = 1e-8), constant learning rate.

The saved :class:`~streetlamp.models.features.Dictionary` is in the model's own units with unit-norm
decoder rows (the norms and scales folded into the encoder, exactly: ``W_enc ← W_enc · s_in n / s_out``,
``b_enc ← b_enc n / s_out``, ``θ ← θ n / s_out``, ``W_dec ← W_dec / n``, ``b_dec ← b_dec / s_out``).

**Checkpoints.** After every ``checkpoint_every`` shards the whole state (every weight, Adam's moments and
step, the scales, the dead-latent counters, the loss log and the next shard's number) goes to one
safetensors file (written to a temporary name, then moved): resuming loads it and continues the stream at
that shard, so an interrupted and resumed fit computes exactly what an uninterrupted one does with the same
seed (the same shards in the same order, none twice).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import StreetlampError
from ..models.features import Dictionary, FeatureSet
from .activations import Corpus, stream

if TYPE_CHECKING:
    from ..models.adapter import ModelAdapter

__all__ = ["CHECKPOINT", "FitConfig", "LayerFit", "fit", "load_checkpoint"]

CHECKPOINT = "checkpoint.safetensors"
DECODER_INIT_NORM = 0.1


@dataclass(frozen=True)
class FitConfig:
    """What a fit is: the site, the dictionary's shape and activation, the optimisation and the stream."""

    where: str  # resid_pre (SAE) | mlp (transcoder)
    width: int
    activation: str = "relu"
    k: int | None = None
    sparsity: float = 5.0  # λ: the L1 coefficient (relu) or the L0 coefficient (jumprelu); unused by topk
    lr: float = 1e-3
    batch_tokens: int = 1024
    batch_seqs: int = 16  # sequences per shard (one forward pass)
    shards: int = 1
    warmup: int = 0  # steps over which λ ramps from 0
    aux: float = 0.0  # TopK aux-k coefficient (0: off)
    dead_window: int = 200  # steps without firing after which a latent counts as dead (aux-k)
    bandwidth: float = 0.05  # JumpReLU's ε
    init_threshold: float = 0.01
    seed: int = 0

    def __post_init__(self) -> None:
        if self.where not in ("resid_pre", "mlp"):
            raise StreetlampError(f"a dictionary sits at resid_pre or mlp, not {self.where!r}")
        if self.width < 1:
            raise StreetlampError(f"--width {self.width}: a dictionary needs at least one latent")
        if self.activation == "topk" and not (self.k is not None and 0 < self.k <= self.width):
            raise StreetlampError(f"--k {self.k}: TopK needs 0 < k <= --width ({self.width})")

    def record(self) -> dict:
        return asdict(self)


class _Jump(torch.autograd.Function):
    """``z · [z > θ]``; gradient to z: ``[z > θ]``; to θ: ``−(θ/ε) K((z − θ)/ε)`` (rectangle K), summed over rows."""

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, theta: torch.Tensor, eps: float) -> torch.Tensor:
        ctx.save_for_backward(z, theta)
        ctx.eps = eps
        return z * (z > theta)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:  # type: ignore[override]
        z, theta = ctx.saved_tensors
        k = ((z - theta).abs() < ctx.eps / 2).to(g)
        return (z > theta) * g, (-(theta / ctx.eps) * k * g).sum(0), None


class _Step(torch.autograd.Function):
    """``H(z − θ)``; no gradient to z; to θ: ``−(1/ε) K((z − θ)/ε)``, summed over rows."""

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, theta: torch.Tensor, eps: float) -> torch.Tensor:
        ctx.save_for_backward(z, theta)
        ctx.eps = eps
        return (z > theta).to(z)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[None, torch.Tensor, None]:  # type: ignore[override]
        z, theta = ctx.saved_tensors
        k = ((z - theta).abs() < ctx.eps / 2).to(g)
        return None, (-(1.0 / ctx.eps) * k * g).sum(0), None


def topk_relu(h: torch.Tensor, k: int) -> torch.Tensor:
    top = torch.topk(h, k, dim=-1)
    return torch.zeros_like(h).scatter(-1, top.indices, torch.relu(top.values))


class LayerFit:
    """One layer's dictionary in training (parameters in scaled units, Adam's state, the dead counters)."""

    NAMES = ("W_enc", "b_enc", "W_dec", "b_dec", "threshold")

    def __init__(self, layer: int, d_in: int, d_out: int, cfg: FitConfig, device: torch.device | str) -> None:
        self.layer, self.cfg, self.d_in, self.d_out = layer, cfg, d_in, d_out
        g = torch.Generator().manual_seed(int(np.random.default_rng([cfg.seed, layer, 11]).integers(2**62)))
        w_dec = torch.empty(cfg.width, d_out)
        torch.nn.init.kaiming_uniform_(w_dec, generator=g)
        w_dec = w_dec / w_dec.norm(dim=-1, keepdim=True) * DECODER_INIT_NORM
        w_enc = w_dec.T.clone() if d_in == d_out else torch.empty(d_in, cfg.width).uniform_(-1, 1, generator=g) * 0.1
        self.p: dict[str, torch.Tensor] = {
            "W_enc": w_enc.contiguous(),
            "b_enc": torch.zeros(cfg.width),
            "W_dec": w_dec.contiguous(),
            "b_dec": torch.zeros(d_out),
        }
        if cfg.activation == "jumprelu":
            self.p["threshold"] = torch.full((cfg.width,), cfg.init_threshold)
        self.p = {k: v.to(device).requires_grad_(True) for k, v in self.p.items()}
        self.m = {k: torch.zeros_like(v) for k, v in self.p.items()}
        self.v = {k: torch.zeros_like(v) for k, v in self.p.items()}
        self.t = 0
        self.since_fired = torch.zeros(cfg.width, dtype=torch.long, device=device)
        self.scale_in = 0.0
        self.scale_out = 0.0

    @property
    def b_dec_in(self) -> bool:
        return self.cfg.where == "resid_pre"

    def init_from(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """The scales (mean norm → sqrt(d)) and ``b_dec`` (the target's mean), from the first shard."""
        self.scale_in = float(math.sqrt(self.d_in) / x.double().norm(dim=-1).mean())
        self.scale_out = (
            self.scale_in if self.b_dec_in else float(math.sqrt(self.d_out) / y.double().norm(dim=-1).mean())
        )
        with torch.no_grad():
            self.p["b_dec"].copy_((y.double() * self.scale_out).mean(0).float())

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Scaled input -> (pre-activations z, activations a, reconstruction x̂), in scaled units."""
        p, c = self.p, self.cfg
        xin = x - p["b_dec"] if self.b_dec_in else x
        z = xin @ p["W_enc"] + p["b_enc"]
        if c.activation == "topk":
            n = p["W_dec"].norm(dim=-1)
            assert c.k is not None
            a = topk_relu(z * n, c.k)
            return z, a, (a / n) @ p["W_dec"] + p["b_dec"]
        if c.activation == "jumprelu":
            a = _Jump.apply(z, torch.relu(p["threshold"]), c.bandwidth)
        else:
            a = torch.relu(z)
        return z, a, a @ p["W_dec"] + p["b_dec"]  # type: ignore[operator]

    def loss(self, x: torch.Tensor, y: torch.Tensor, lam: float) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
        """Total loss, its parts, and which latents fired (``[width]`` bool) on scaled ``x``, ``y``."""
        p, c = self.p, self.cfg
        z, a, recon = self.forward(x)
        mse = (recon - y).pow(2).sum(-1).mean()
        total = mse
        parts = {"mse": float(mse.detach())}
        if c.activation == "relu":
            sp = lam * (a * p["W_dec"].norm(dim=-1)).sum(-1).mean()
            total = total + sp
            parts["sparsity"] = float(sp.detach())
        elif c.activation == "jumprelu":
            sp = lam * _Step.apply(z, torch.relu(p["threshold"]), c.bandwidth).sum(-1).mean()  # type: ignore[union-attr]
            total = total + sp
            parts["sparsity"] = float(sp.detach())
        elif c.aux > 0:
            dead = self.since_fired > c.dead_window
            n_dead = int(dead.sum())
            if n_dead:
                k_aux = self.d_out // 2
                scale = min(n_dead / k_aux, 1.0)
                n = p["W_dec"].norm(dim=-1)
                h = torch.where(dead[None], z * n, torch.tensor(-torch.inf, device=z.device))
                top = torch.topk(h, min(k_aux, n_dead), dim=-1)
                aux_a = torch.zeros_like(h).scatter(-1, top.indices, top.values)
                err = (aux_a / n) @ p["W_dec"] - (y - recon).detach()
                aux = c.aux * scale * err.pow(2).sum(-1).mean()
                total = total + aux
                parts["aux"] = float(aux.detach())
        fired = (a != 0).any(0)
        parts["l0"] = float((a != 0).sum(-1).float().mean())
        return total, parts, fired

    def step(self, x: torch.Tensor, y: torch.Tensor, lam: float) -> dict[str, float]:
        """One Adam step on raw ``x``, ``y`` (scaled here)."""
        total, parts, fired = self.loss(x * self.scale_in, y * self.scale_out, lam)
        grads = torch.autograd.grad(total, list(self.p.values()))
        self.t += 1
        b1, b2, eps, lr = 0.9, 0.999, 1e-8, self.cfg.lr
        with torch.no_grad():
            for (name, p), g in zip(self.p.items(), grads, strict=True):
                m, v = self.m[name], self.v[name]
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                mhat = m / (1 - b1**self.t)
                vhat = v / (1 - b2**self.t)
                p.sub_(lr * mhat / (vhat.sqrt() + eps))
            self.since_fired.add_(1)
            self.since_fired[fired] = 0
        return parts

    def dictionary(self) -> Dictionary:
        """The fitted dictionary in the model's units, decoder rows of unit norm (module docstring)."""
        with torch.no_grad():
            p = {k: v.detach().double().cpu() for k, v in self.p.items()}
            n = p["W_dec"].norm(dim=-1).clamp_min(1e-12)
            so = self.scale_out
            kw: dict[str, Any] = {}
            if self.cfg.activation == "jumprelu":
                kw["threshold"] = (torch.relu(p["threshold"]) * n / so).float()
            if self.cfg.activation == "topk":
                kw["k"] = self.cfg.k
            return Dictionary(
                self.layer,
                self.cfg.where,  # type: ignore[arg-type]
                W_enc=(p["W_enc"] * (self.scale_in * n / so)[None, :]).float(),
                b_enc=(p["b_enc"] * n / so).float(),
                W_dec=(p["W_dec"] / n[:, None]).float(),
                b_dec=(p["b_dec"] / so).float(),
                activation=self.cfg.activation,  # type: ignore[arg-type]
                b_dec_in=self.b_dec_in,
                **kw,
            )

    def state(self) -> dict[str, torch.Tensor]:
        out = {}
        for k in self.p:
            out[f"{self.layer}.p.{k}"] = self.p[k].detach()
            out[f"{self.layer}.m.{k}"] = self.m[k]
            out[f"{self.layer}.v.{k}"] = self.v[k]
        out[f"{self.layer}.since_fired"] = self.since_fired
        return out

    def load(self, tensors: dict[str, torch.Tensor], info: dict) -> None:
        with torch.no_grad():
            for k in self.p:
                self.p[k].copy_(tensors[f"{self.layer}.p.{k}"])
                self.m[k].copy_(tensors[f"{self.layer}.m.{k}"])
                self.v[k].copy_(tensors[f"{self.layer}.v.{k}"])
            self.since_fired.copy_(tensors[f"{self.layer}.since_fired"])
        self.t, self.scale_in, self.scale_out = int(info["t"]), float(info["scale_in"]), float(info["scale_out"])


def _save_checkpoint(path: Path, fits: dict[int, LayerFit], next_shard: int, log: list[dict], cfg: FitConfig) -> None:
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for f in fits.values():
        tensors.update({k: v.detach().contiguous().cpu() for k, v in f.state().items()})
    meta = {
        "next_shard": next_shard,
        "config": cfg.record(),
        "layers": {str(l): {"t": f.t, "scale_in": f.scale_in, "scale_out": f.scale_out} for l, f in fits.items()},
        "log": log,
    }
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    save_file(tensors, str(tmp), metadata={"streetlamp": json.dumps(meta)})
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors and the JSON state of a checkpoint (one clear line where it is unreadable)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {})["streetlamp"])
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
    except (SafetensorError, OSError, KeyError, json.JSONDecodeError, ValueError) as err:
        raise StreetlampError(f"{path}: not a readable checkpoint ({err}); delete it to start again") from None
    return tensors, meta


def fit(
    adapter: ModelAdapter,
    corpus: Corpus,
    layers: Sequence[int],
    cfg: FitConfig,
    *,
    checkpoint: Path | None = None,
    checkpoint_every: int = 10,
    resume: bool = False,
    stop_after: int | None = None,
    progress: Callable[[int, int, list[dict]], None] | None = None,
) -> tuple[FeatureSet | None, dict]:
    """Fit one dictionary per layer on ``cfg.shards`` shards of ``corpus``'s training sequences.

    ``checkpoint``: the file of the state (written every ``checkpoint_every`` shards and at the end);
    ``resume``: continue from it. ``stop_after``: stop (checkpointed) once that many shards are done in
    total, returning ``(None, info)`` while shards remain (an interruption, for tests and for sessions that
    fit in parts). Returns the fitted set (in the model's units) and the training record."""
    d = adapter.d_model
    fits = {l: LayerFit(l, d, d, cfg, adapter.device) for l in layers}
    start, log = 0, []
    if resume:
        if checkpoint is None or not checkpoint.is_file():
            raise StreetlampError(f"nothing to resume: no checkpoint {checkpoint}")
        tensors, meta = load_checkpoint(checkpoint)
        if meta["config"] != json.loads(json.dumps(cfg.record())):
            raise StreetlampError(f"{checkpoint} was written by a fit with other settings; resume with the same ones")
        if sorted(int(k) for k in meta["layers"]) != sorted(layers):
            raise StreetlampError(f"{checkpoint} holds layers {sorted(meta['layers'])}, not {list(layers)}")
        tensors = {k: v.to(adapter.device) for k, v in tensors.items()}
        for l, f in fits.items():
            f.load(tensors, meta["layers"][str(l)])
        start, log = int(meta["next_shard"]), list(meta["log"])
    end = cfg.shards if stop_after is None else min(cfg.shards, stop_after)
    done = start
    for shard in stream(
        adapter, corpus.train, list(layers), cfg.where, batch_seqs=cfg.batch_seqs, seed=cfg.seed, start=start, stop=end
    ):
        entry: dict[str, Any] = {"shard": shard.index}
        for l, f in fits.items():
            x, y = shard.acts[l]
            if shard.index == 0:
                f.init_from(x, y)
            sums: dict[str, float] = {}
            steps = 0
            for i in range(0, x.shape[0], cfg.batch_tokens):
                lam = cfg.sparsity * min(1.0, (f.t + 1) / cfg.warmup) if cfg.warmup > 0 else cfg.sparsity
                parts = f.step(x[i : i + cfg.batch_tokens], y[i : i + cfg.batch_tokens], lam)
                for k, v in parts.items():
                    sums[k] = sums.get(k, 0.0) + v
                steps += 1
            entry[str(l)] = {k: v / steps for k, v in sums.items()}
        entry["tokens"] = int(shard.token_ids.numel())
        log.append(entry)
        done = shard.index + 1
        if checkpoint is not None and (done % checkpoint_every == 0 or done == end):
            _save_checkpoint(checkpoint, fits, done, log, cfg)
        if progress is not None:
            progress(done, cfg.shards, log)
    info = {
        "shards_done": done,
        "shards": cfg.shards,
        "steps_per_layer": next(iter(fits.values())).t,
        "tokens_seen": sum(e["tokens"] for e in log),
        "log": log,
        "scales": {l: {"in": f.scale_in, "out": f.scale_out} for l, f in fits.items()},
    }
    if done < cfg.shards:
        return None, info
    fs = FeatureSet(
        {(l, cfg.where): f.dictionary() for l, f in fits.items()}, source="features-fit", model=adapter.name
    )
    return fs, info
