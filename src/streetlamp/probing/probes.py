"""Probes: linear (multinomial logistic regression) and MLPs with 1-2 hidden layers, in torch.

Capacity controls (Hewitt & Liang 2019, section 5): hidden size, rank of a linear probe
(``W = A B``, ``A`` ``[d, rank]``), weight decay (L2), dropout, early stopping on a dev split,
and the seed. Features are standardised with the training items' mean and standard deviation.

The full-rank linear probe is fitted to convergence by L-BFGS in float64 on the objective

    mean_i CE(y_i, x_i W + b) + (weight_decay / 2) * ||W||^2        (b not penalised)

which is scikit-learn's ``LogisticRegression(C=1 / (weight_decay * n))`` divided by ``C n``;
binary tasks use one logit (sigmoid), as scikit-learn does, more classes the softmax. MLPs and
rank-constrained linear probes are trained with Adam on minibatches, stopped early when the
dev loss has not improved for ``patience`` epochs (the best epoch's weights are kept).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Literal, cast

import numpy as np
import torch
from torch import nn

from ..errors import StreetlampError


@dataclass(frozen=True)
class ProbeSpec:
    kind: Literal["linear", "mlp"] = "linear"
    hidden: int = 0  # MLP width
    depth: int = 1  # MLP hidden layers (1 or 2)
    rank: int | None = None  # linear probes only: W = A B of this rank (None = full rank, fitted by L-BFGS)
    weight_decay: float = 1e-3
    dropout: float = 0.0
    early_stopping: bool = True
    patience: int = 5
    max_epochs: int = 100
    lr: float = 1e-3
    batch_size: int = 64
    seed: int = 0
    tol: float = 1e-4  # L-BFGS: stop when the largest |gradient| entry is below this ...
    max_iter: int = 500  # ... or after this many L-BFGS iterations

    def __post_init__(self) -> None:
        if self.kind not in ("linear", "mlp"):
            raise StreetlampError(f"unknown probe {self.kind!r}; use linear or mlp")
        if self.kind == "mlp" and (self.hidden < 1 or self.depth not in (1, 2)):
            raise StreetlampError("an MLP probe needs hidden >= 1 and 1 or 2 hidden layers")
        if self.rank is not None and self.rank < 1:
            raise StreetlampError("probe rank must be at least 1")
        if self.weight_decay < 0 or not 0 <= self.dropout < 1:
            raise StreetlampError("weight decay must be >= 0 and dropout in [0, 1)")

    @property
    def name(self) -> str:
        if self.kind == "linear":
            return "linear" if self.rank is None else f"linear-rank{self.rank}"
        return f"mlp{self.depth}-h{self.hidden}"

    def params(self) -> dict:
        return asdict(self)


def parse_probes(
    spec: str,
    hidden: int = 256,
    weight_decay: float = 1e-3,
    dropout: float = 0.0,
    seed: int = 0,
    early_stopping: bool = True,
    max_epochs: int = 100,
) -> list[ProbeSpec]:
    """``linear,mlp`` -> specs; ``mlp2`` = two hidden layers; ``linear-rank8`` = rank 8.

    ``early_stopping`` and ``max_epochs`` apply to the probes trained by Adam (MLPs, rank-constrained linear).
    """
    if max_epochs < 1:
        raise StreetlampError("--max-epochs must be at least 1")
    out = []
    for s in (x.strip() for x in spec.split(",")):
        if not s:
            continue
        if s == "linear":
            out.append(ProbeSpec("linear", weight_decay=weight_decay, seed=seed))
        elif s.startswith("linear-rank") and s[11:].isdigit():
            out.append(
                ProbeSpec(
                    "linear",
                    rank=int(s[11:]),
                    weight_decay=weight_decay,
                    seed=seed,
                    early_stopping=early_stopping,
                    max_epochs=max_epochs,
                )
            )
        elif s in ("mlp", "mlp1", "mlp2"):
            out.append(
                ProbeSpec(
                    "mlp",
                    hidden=hidden,
                    depth=2 if s == "mlp2" else 1,
                    weight_decay=weight_decay,
                    dropout=dropout,
                    seed=seed,
                    early_stopping=early_stopping,
                    max_epochs=max_epochs,
                )
            )
        else:
            raise StreetlampError(f"unknown probe {s!r}; use linear, linear-rankR, mlp (= mlp1) or mlp2")
    if not out:
        raise StreetlampError("no probe named")
    return out


class _Net(nn.Module):
    def __init__(self, spec: ProbeSpec, d: int, k_out: int) -> None:
        super().__init__()
        if spec.kind == "linear":
            r = spec.rank
            self.net: nn.Module = (
                nn.Sequential(nn.Linear(d, r, bias=False), nn.Linear(r, k_out)) if r else nn.Linear(d, k_out)
            )
        else:
            layers: list[nn.Module] = []
            width = d
            for _ in range(spec.depth):
                layers += [nn.Linear(width, spec.hidden), nn.ReLU(), nn.Dropout(spec.dropout)]
                width = spec.hidden
            layers.append(nn.Linear(width, k_out))
            self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _log_probs(logits: torch.Tensor, binary: bool) -> torch.Tensor:
    """``[n, K]`` log-probabilities from the net's output (one logit column when binary)."""
    if binary:
        z = logits[:, 0]
        return torch.stack([nn.functional.logsigmoid(-z), nn.functional.logsigmoid(z)], 1)
    return torch.log_softmax(logits, -1)


@dataclass
class FittedProbe:
    spec: ProbeSpec
    net: _Net
    mean: np.ndarray
    std: np.ndarray
    n_classes: int
    binary: bool
    epochs: int = 0
    grad_max: float = float("nan")  # L-BFGS: largest |gradient| entry at the solution

    def _x(self, X: np.ndarray) -> torch.Tensor:
        dt = next(self.net.parameters()).dtype
        return torch.as_tensor((np.asarray(X, np.float64) - self.mean) / self.std, dtype=dt)

    def log_proba(self, X: np.ndarray) -> np.ndarray:
        self.net.eval()
        with torch.no_grad(), one_thread():
            return _log_probs(self.net(self._x(X)), self.binary).double().numpy()

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.log_proba(X).argmax(1)

    def accuracy(self, X: np.ndarray, y: np.ndarray) -> float:
        return float((self.predict(X) == np.asarray(y)).mean()) if len(y) else float("nan")

    def coef(self) -> tuple[np.ndarray, np.ndarray]:
        """Full-rank linear probe: ``(W [K_out, d], b [K_out])`` on the standardised features."""
        lin = self.net.net
        assert isinstance(lin, nn.Linear)
        return lin.weight.detach().double().numpy(), lin.bias.detach().double().numpy()


def standardiser(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = X.mean(0)
    std = X.std(0)
    return mean, np.where(std > 0, std, 1.0)


@contextmanager
def one_thread() -> Iterator[None]:
    """Probes are small: torch's intra-op threads only add synchronisation (20x slower on a busy 2-core machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def fit_probe(
    spec: ProbeSpec,
    X: np.ndarray,
    y: np.ndarray,
    n_classes: int,
    X_dev: np.ndarray | None = None,
    y_dev: np.ndarray | None = None,
    standardise: bool = True,
) -> FittedProbe:
    """Fit one probe on ``X [n, d]``, ``y [n]`` (class ids < n_classes); dev data for early stopping."""
    with one_thread():
        return _fit(spec, X, y, n_classes, X_dev, y_dev, standardise)


def _fit(
    spec: ProbeSpec,
    X: np.ndarray,
    y: np.ndarray,
    n_classes: int,
    X_dev: np.ndarray | None,
    y_dev: np.ndarray | None,
    standardise: bool,
) -> FittedProbe:
    X = np.asarray(X, np.float64)
    y = np.asarray(y, np.int64)
    if len(X) == 0:
        raise StreetlampError("no training items for the probe")
    mean, std = standardiser(X) if standardise else (np.zeros(X.shape[1]), np.ones(X.shape[1]))
    binary = n_classes == 2 and spec.kind == "linear"
    torch.manual_seed(spec.seed)
    full_rank_linear = spec.kind == "linear" and spec.rank is None
    dtype = torch.float64 if full_rank_linear else torch.float32
    net = _Net(spec, X.shape[1], 1 if binary else n_classes).to(dtype)
    probe = FittedProbe(spec, net, mean, std, n_classes, binary)
    Xt = probe._x(X)
    yt = torch.as_tensor(y)
    if full_rank_linear:
        _fit_lbfgs(probe, Xt, yt)
    else:
        _fit_adam(
            probe,
            Xt,
            yt,
            None
            if X_dev is None or y_dev is None or not len(y_dev)
            else (probe._x(X_dev), torch.as_tensor(np.asarray(y_dev, np.int64))),
        )
    return probe


def objective(net: nn.Module, X: torch.Tensor, y: torch.Tensor, weight_decay: float, binary: bool) -> torch.Tensor:
    """Mean cross-entropy plus ``weight_decay/2 * ||W||^2`` over the weight matrices (not biases)."""
    lp = _log_probs(net(X), binary)
    loss = -lp.gather(1, y.view(-1, 1)).mean()
    l2 = sum((p**2).sum() for n, p in net.named_parameters() if n.endswith("weight"))
    return loss + 0.5 * weight_decay * l2


def _fit_lbfgs(probe: FittedProbe, X: torch.Tensor, y: torch.Tensor) -> None:
    net, spec = probe.net, probe.spec
    for p in net.parameters():
        nn.init.zeros_(p)
    per_round = min(100, spec.max_iter)
    max_rounds = max(1, -(-spec.max_iter // per_round))
    opt = torch.optim.LBFGS(
        net.parameters(),
        lr=1.0,
        max_iter=per_round,
        tolerance_grad=spec.tol,
        tolerance_change=0.0,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        f = objective(net, X, y, spec.weight_decay, probe.binary)
        f.backward()
        return f

    for r in range(max_rounds):
        opt.step(closure)
        closure()
        g = max(float(cast(torch.Tensor, p.grad).abs().max()) for p in net.parameters())  # set by closure()
        probe.epochs = r + 1
        probe.grad_max = g
        if g <= spec.tol:
            break


def _fit_adam(
    probe: FittedProbe, X: torch.Tensor, y: torch.Tensor, dev: tuple[torch.Tensor, torch.Tensor] | None
) -> None:
    net, spec = probe.net, probe.spec
    opt = torch.optim.Adam(net.parameters(), lr=spec.lr)
    g = torch.Generator().manual_seed(spec.seed)
    best, best_state, since = float("inf"), None, 0
    for epoch in range(spec.max_epochs):
        net.train()
        for idx in torch.randperm(len(X), generator=g).split(spec.batch_size):
            opt.zero_grad()
            objective(net, X[idx], y[idx], spec.weight_decay, probe.binary).backward()
            opt.step()
        probe.epochs = epoch + 1
        if spec.early_stopping and dev is not None:
            net.eval()
            with torch.no_grad():
                loss = float(-_log_probs(net(dev[0]), probe.binary).gather(1, dev[1].view(-1, 1)).mean())
            if loss < best - 1e-6:
                best, since = loss, 0
                best_state = {k: v.clone() for k, v in net.state_dict().items()}
            else:
                since += 1
                if since >= spec.patience:
                    break
    if best_state is not None:
        net.load_state_dict(best_state)
    net.eval()
