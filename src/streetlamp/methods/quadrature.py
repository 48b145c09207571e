"""Quadrature on [0, 1] for integrated gradients: the rules, the cache of gradients along the path,
and the adaptive drivers (global doubling, and locally adaptive Boole panels).

with the integral replaced by a quadrature rule ``Σ_k w_k g(α_k)`` on [0, 1]:

* ``riemann_left`` α_k = k/n (k=0..n−1), ``riemann_right`` α_k = k/n (k=1..n),
  ``riemann_middle`` α_k = (k+½)/n, all with w_k = 1/n (error O(1/n), middle O(1/n²));
* ``riemann_trapezoid``: n intervals, n+1 points α_k = k/n, weights 1/(2n), 1/n, …, 1/n, 1/(2n)
  (they sum to 1; error O(1/n²)). Captum 0.9's ``riemann_trapezoid`` uses n points with weights
  summing to (n−1)/n, so its completeness error is ~1/n; we do not copy it.
* ``gauss_legendre``: n Gauss–Legendre nodes mapped to [0, 1] (exact for polynomials of degree 2n−1).
* ``panels``: locally adaptive 5-point Boole panels on a dyadic grid (see :func:`integrate_panels`);
  for integrands with narrow spikes, as pre-norm decoders give (SmolLM2: converged on 11 of 12
  factual prompts with 1,104 gradient evaluations where Clenshaw–Curtis converged on 10 with 1,548).
* ``clenshaw_curtis`` (default): n intervals, the n+1 Chebyshev extreme points; nested under
  doubling, so adaptive mode reuses every gradient. On minilm-sentiment it reached the 1e-3
  tolerance with 33 or 65 gradient evaluations where adaptive Gauss–Legendre (16, 24, 36, 54
  nodes, none reusable) spent 130 (benchmarks/bench_ig.py).

Completeness (the paper's axiom): ``Σ_i IG_i = F(e) − F(e')``. The error
``δ = |Σ_i IG_i − (F(e) − F(e'))|`` and ``δ / |F(e) − F(e')|`` are always recorded. In adaptive
mode the step count doubles for the nested rules (reusing every gradient already computed at the
same α: all points of the trapezoid and Riemann left/right rules) and grows 1.5x for
Gauss–Legendre (nodes not nested) until the relative error is under
``tolerance`` or the next count would exceed ``max_steps`` (then ``converged=False`` and a warning).

Completeness checks only the sum; token errors can cancel in it. For nested rules the record also
holds ``token_change_vs_half_steps``: ``max_i |IG_i(n) − IG_i(n/2)| / |F(e) − F(e')|`` from gradients
already computed (it bounds the n/2 rule's token error, so it over-estimates that of n).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np
import torch

from .. import progress
from ..batching import chunks
from ..errors import StreetlampError

RULES = (
    "auto",
    "riemann_left",
    "riemann_right",
    "riemann_middle",
    "riemann_trapezoid",
    "gauss_legendre",
    "clenshaw_curtis",
    "panels",
    "romberg",
)
BOOLE = np.array([7.0, 32.0, 12.0, 32.0, 7.0]) / 90.0  # 5-point closed Newton–Cotes on a panel of width 1


def clenshaw_curtis(n: int) -> tuple[np.ndarray, np.ndarray]:
    """n intervals: the n+1 Chebyshev extreme points on [0, 1] and their Clenshaw–Curtis weights.

    Exact for polynomials of degree n; converges about as fast as Gauss–Legendre on smooth
    integrands (Trefethen 2008), and the nodes of n are a subset of those of 2n, so doubling
    reuses every gradient already computed.
    """
    if n < 1:
        raise StreetlampError("clenshaw_curtis needs at least 1 interval")
    k = np.arange(n + 1)
    theta = np.pi * k / n
    w = np.empty(n + 1)
    for j in range(n + 1):
        m = np.arange(1, n // 2 + 1)
        b = np.where(2 * m == n, 1.0, 2.0)
        s = float(np.sum(b / (4 * m * m - 1) * np.cos(2 * m * theta[j])))
        w[j] = (1.0 if j in (0, n) else 2.0) / n * (1.0 - s)
    nodes = np.round((1.0 - np.cos(theta)) / 2.0, 15)  # rounded so nested nodes match exactly
    nodes[0], nodes[-1] = 0.0, 1.0
    return nodes, w / 2.0


def romberg(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Romberg's rule on the ``n + 1`` uniform points (``n`` a power of two): the trapezoid sums of
    1, 2, 4, ..., n intervals combined by Richardson extrapolation, ``R_k,j = R_k,j-1 + (R_k,j-1 -
    R_k-1,j-1) / (4^j - 1)``, ``R_m,m`` returned (exact for polynomials of degree 2m + 1, m = log2 n;
    positive weights). Nested under doubling: the points of n are those of 2n."""
    if n < 1 or n & (n - 1):
        raise StreetlampError(f"rule 'romberg' needs steps a power of 2 (got {n})")
    prev: list[np.ndarray] = []
    for k in range(n.bit_length()):
        t = np.zeros(n + 1)
        t[:: n >> k] = 1.0 / (1 << k)
        t[0] = t[-1] = 0.5 / (1 << k)
        row = [t]
        for j in range(1, k + 1):
            row.append(row[j - 1] + (row[j - 1] - prev[j - 1]) / (4**j - 1))
        prev = row
    return np.arange(n + 1, dtype=np.float64) / n, prev[-1]


NOISE_FLOOR = 1e-6
# emb [rows, pos, d] -> grads [targets, rows, pos, d], or (F [targets, rows], grads): with F the
# "panels" rule knows each panel's exact share F(b) - F(a) of the completeness sum
GradFn = Callable[[torch.Tensor], "torch.Tensor | tuple[torch.Tensor, torch.Tensor]"]


def quadrature(rule: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes α and weights w on [0, 1] (weights sum to 1) of ``rule`` with ``n`` steps."""
    k = np.arange(n, dtype=np.float64)
    if rule == "riemann_left":
        return k / n, np.full(n, 1.0 / n)
    if rule == "riemann_right":
        return (k + 1) / n, np.full(n, 1.0 / n)
    if rule == "riemann_middle":
        return (k + 0.5) / n, np.full(n, 1.0 / n)
    if rule == "riemann_trapezoid":
        w = np.full(n + 1, 1.0 / n)
        w[0] = w[-1] = 0.5 / n
        return np.arange(n + 1, dtype=np.float64) / n, w
    if rule == "gauss_legendre":
        x, w = np.polynomial.legendre.leggauss(n)
        return (x + 1) / 2, w / 2
    if rule in ("clenshaw_curtis", "auto"):  # auto at fixed steps: nothing to choose from (integrate_auto)
        return clenshaw_curtis(n)
    if rule == "romberg":
        return romberg(n)
    if rule == "panels":
        if n % 4:
            raise StreetlampError(f"rule 'panels' needs steps divisible by 4 (got {n}): 5-point Boole panels")
        w = np.zeros(n + 1)
        for j in range(0, n, 4):
            w[j : j + 5] += BOOLE * 4 / n
        return np.arange(n + 1, dtype=np.float64) / n, w
    raise StreetlampError(f"unknown IG rule {rule!r}; choose one of {', '.join(RULES)}")


class PathCache:
    """Gradients along the straight path e' → e, cached per α as ``[target, pos]`` dot products."""

    def __init__(
        self, e: torch.Tensor, eb: torch.Tensor, grad_fn: GradFn, batch_size: int | None, device: torch.device
    ) -> None:
        self.e, self.eb, self.diff = e, eb, (e - eb)
        self.grad_fn, self.batch_size, self.device = grad_fn, batch_size, device
        self.cache: dict[float, torch.Tensor] = {}
        self.fvals: dict[float, torch.Tensor] = {}  # F per target at alpha, when grad_fn returns it
        self.passes = 0  # calls of grad_fn (one forward + backward each)

    def evaluate(self, alphas: np.ndarray) -> None:
        todo = sorted({float(a) for a in alphas} - set(self.cache))
        if not todo:
            return
        n = self.e.shape[0]
        parts = list(chunks(len(todo), n, self.batch_size, self.device))
        for sl in progress.iterate(parts, "IG steps", disable=len(parts) < 8, leave=False, delay=2.0):
            a = torch.tensor(todo[sl], dtype=self.e.dtype, device=self.device).view(-1, 1, 1)
            # alpha = 1 is the input itself, not eb + (e - eb) rounded: F there is F(e) exactly (integrate's ends)
            emb = torch.where(a == 1, self.e, self.eb + a * self.diff)
            out = self.grad_fn(emb)  # grads [targets, rows, pos, d], or (F [targets, rows], grads)
            self.passes += 1
            f, g = out if isinstance(out, tuple) else (None, out)
            s = (g.double() * self.diff.double()).sum(-1)  # [targets, rows, pos]
            if not bool(torch.isfinite(s).all()):
                bad = [alpha for r, alpha in enumerate(todo[sl]) if not bool(torch.isfinite(s[:, r]).all())]
                raise StreetlampError(
                    f"integrated_gradients: the gradient is not finite at alpha={bad[0]:g} on this path (e.g. an "
                    "all-zero embedding in a pre-norm model); use baseline='pad' or 'mask', or "
                    "rule='gauss_legendre' (no endpoint nodes)"
                )
            for r, alpha in enumerate(todo[sl]):
                self.cache[alpha] = s[:, r]
                if f is not None:
                    self.fvals[alpha] = f[:, r].detach().double()

    def integrate(self, rule: str, n: int) -> torch.Tensor:
        alphas, w = quadrature(rule, n)
        self.evaluate(alphas)
        return sum(float(wk) * self.cache[float(a)] for a, wk in zip(alphas, w))  # type: ignore[return-value]

    def integrate_cached(self, rule: str, n: int) -> torch.Tensor | None:
        """The rule with ``n`` steps if every node is already cached (no new gradient), else None."""
        alphas, w = quadrature(rule, n)
        if any(float(a) not in self.cache for a in alphas):
            return None
        return sum(float(wk) * self.cache[float(a)] for a, wk in zip(alphas, w))  # type: ignore[return-value]


def coarse_steps(steps: int) -> int:
    """The intervals of ``auto``'s coarse pass: ``steps`` rounded up to a power of two, at least 4."""
    return steps if steps >= 4 and not steps & (steps - 1) else 1 << max(2, (steps - 1).bit_length())


def first_nodes(rule: str, steps: int, adaptive: bool) -> np.ndarray:
    """The α the first pass of ``integrate_adaptive`` evaluates (``auto``: its coarse uniform grid)."""
    if rule == "auto" and adaptive:
        return quadrature("romberg", coarse_steps(steps))[0]
    return quadrature(rule, steps)[0]


def integrate_adaptive(
    path: PathCache,
    fdiff: torch.Tensor,
    fscale: torch.Tensor,
    rule: str,
    steps: int,
    adaptive: bool,
    tolerance: float,
    max_steps: int,
    lengths: Sequence[int],
) -> tuple[torch.Tensor, dict]:
    """IG ``[target, pos]`` and the completeness record; doubles steps in adaptive mode.

    Converged when every target has ``δ/|ΔF| <= tolerance`` or ``δ <= NOISE_FLOOR · max(|F(e)|, |F(e')|)``
    (``fscale``): below that float32 noise, e.g. when F(e) ≈ F(e'), the relative error means nothing.
    """
    if rule == "panels":
        return integrate_panels(path, fdiff, fscale, steps, adaptive, tolerance, max_steps, lengths)
    if rule == "auto" and adaptive:
        return integrate_auto(path, fdiff, fscale, steps, tolerance, max_steps, lengths)
    n, history = steps, []
    # float32 forward passes cannot resolve F better than ~1e-6 of its size: a smaller delta is noise
    noise = NOISE_FLOOR * fscale.double().abs().clamp_min(1e-30)
    while True:
        ig = path.integrate(rule, n)
        total = torch.stack([ig[j, :L].sum() for j, L in enumerate(lengths)])
        delta = (total - fdiff.double()).abs()
        rel = delta / fdiff.double().abs().clamp_min(1e-12)
        # per-token check the completeness sum cannot give (token errors can cancel in the sum): the
        # same rule at half the steps, free for nested rules; |IG_n - IG_n/2| bounds IG_n/2's error,
        # so it over-estimates IG_n's
        half = path.integrate_cached(rule, n // 2) if n % 2 == 0 and n >= 2 else None
        tok = None
        if half is not None:
            tok = float(
                max(
                    ((ig[j, :L] - half[j, :L]).abs().max() / fdiff[j].double().abs().clamp_min(1e-12))
                    for j, L in enumerate(lengths)
                )
            )
        history.append({"steps": n, "max_relative_error": float(rel.max()), "token_change_vs_half_steps": tok})
        ok = bool(((rel <= tolerance) | (delta <= noise)).all())
        if ok or not adaptive:
            break
        # nested rules (trapezoid, Clenshaw–Curtis, left, right) double and reuse every point; Gauss–Legendre nodes
        # are not nested, so it grows by 1.5x to overshoot less
        nxt = -(-3 * n // 2) if rule == "gauss_legendre" else 2 * n
        if nxt > max_steps:
            hint = "; a narrow spike in the integrand (pre-norm decoders) is what rule='panels' is for"
            warnings.warn(
                f"integrated_gradients: relative completeness error {float(rel.max()):.3g} > tolerance "
                f"{tolerance:g} after {n} steps ({rule}); max_steps={max_steps} reached{hint}",
                stacklevel=3,
            )
            break
        n = nxt
    info = {
        "steps": n,
        "gradient_evaluations": len(path.cache),
        "passes": path.passes,
        "converged": ok,
        "token_change_vs_half_steps": history[-1]["token_change_vs_half_steps"],
        "converged_by_noise_floor": bool(ok and rel.max() > tolerance),
        "tolerance": tolerance,
        "history": history,
        "delta": delta.tolist(),
        "relative_error": rel.tolist(),
        "sum_attributions": total.tolist(),
    }
    return ig, info


SMOOTH_RATIO = 1 / 16  # the coarse pass calls the integrand smooth when Romberg's error falls this fast per doubling


def relative_errors(
    path: PathCache, rule: str, n: int, fdiff: torch.Tensor, fscale: torch.Tensor, lengths: Sequence[int]
) -> float | None:
    """Largest relative completeness error over the targets of ``rule`` at ``n`` steps from cached gradients
    (None if a node is not cached); an error under the float32 noise floor counts as 0."""
    ig = path.integrate_cached(rule, n)
    if ig is None:
        return None
    total = torch.stack([ig[j, :L].sum() for j, L in enumerate(lengths)])
    delta = (total - fdiff.double()).abs()
    delta = torch.where(delta <= NOISE_FLOOR * fscale.double().abs().clamp_min(1e-30), 0.0, delta)
    return float((delta / fdiff.double().abs().clamp_min(1e-12)).max())


def integrate_auto(
    path: PathCache,
    fdiff: torch.Tensor,
    fscale: torch.Tensor,
    steps: int,
    tolerance: float,
    max_steps: int,
    lengths: Sequence[int],
) -> tuple[torch.Tensor, dict]:
    """The rule chosen from the integrand (the default ``rule="auto"``).

    A coarse pass evaluates the ``steps + 1`` uniform points that both candidates start from. Romberg's
    rules on 1/4, 1/2 and all of them are nested in it, and their exact completeness errors ``e(n)``
    (``F`` is known at both ends) say how the integrand behaves: a smooth one is in Richardson's
    asymptotic regime, ``e(steps) <= e(steps/2) / 16`` (each doubling gains at least a factor 16),
    and Romberg doubling continues globally while each doubling keeps that rate (else the panels take over
    from the coarse grid, every point reused); anything else (a narrow spike, as a pre-norm decoder's
    path has near its input end, or kinks the coarse grid does not resolve) goes to the locally
    adaptive Boole ``panels``, which bisect where each panel's exact share of ``F`` is missed. Both reuse
    every gradient of the coarse pass. Recorded: ``rule_used`` and ``rule_choice`` (the three errors).
    """
    n = coarse_steps(steps)
    path.evaluate(quadrature("romberg", n)[0])
    errs = {k: relative_errors(path, "romberg", k, fdiff, fscale, lengths) for k in (n // 4, n // 2, n)}
    e4, e2, e1 = (float(errs[k] or 0.0) for k in (n // 4, n // 2, n))
    if e1 <= tolerance:
        rule, why = "romberg", "the coarse pass met the tolerance"
    elif e1 <= SMOOTH_RATIO * e2 and e2 <= e4:
        rule, why = "romberg", f"smooth: Romberg's error fell {e2 / max(e1, 1e-300):.3g}x on the last doubling"
    else:
        rule, why = (
            "panels",
            "not smooth at the coarse scale (a spike or kinks): Romberg's error fell "
            + (f"{e2 / e1:.3g}x on the last doubling" if e1 > 0 else "to 0"),
        )
    start = n
    if rule == "romberg":
        # Romberg doubles while it stays in Richardson's regime; where a doubling gains less than 16x (the coarse
        # grid looked smooth but is not: kinks or a feature finer than it) the panels take over from the coarse
        # grid, every uniform point computed so far reused as a panel node
        k, ek = n, e1
        while ek > tolerance and 2 * k <= max(max_steps, n):
            path.evaluate(quadrature("romberg", 2 * k)[0])
            e2k = float(relative_errors(path, "romberg", 2 * k, fdiff, fscale, lengths) or 0.0)
            if e2k > tolerance and e2k > SMOOTH_RATIO * ek:
                rule = "panels"
                why += f"; then at {2 * k} steps it fell only {ek / max(e2k, 1e-300):.3g}x: panels from the coarse grid"
                break
            k, ek = 2 * k, e2k
        start = n if rule == "panels" else k
    ig, rec = integrate_adaptive(path, fdiff, fscale, rule, start, True, tolerance, max(max_steps, n), lengths)
    rec["rule_used"] = rule
    rec["rule_choice"] = {"coarse_steps": n, "romberg_relative_errors": [e4, e2, e1], "reason": why}
    return ig, rec


# panels: a panel's per-token error is estimated by |Boole - Simpson| / 15 (TOKEN_SHARE); the per-token estimate
# summed over panels must be within TOKEN_STOP tolerances of |dF| (completeness checks the sum only). Each round
# bisects (4 new gradients each) the SPLITS panels with the largest error (a second one only if it is within
# SPLIT_FRACTION of the worst) and, in the same forward/backward pass, every panel whose error alone exceeds
# MUST_SPLIT tolerances of |dF|: such a panel fails the stopping test by itself unless other panels' errors
# happen to cancel it (1.5: between the completeness test's bound, 1, and the token test's, TOKEN_STOP), so it
# is bisected sooner or later, and bisecting it now saves a round (a pass's fixed cost, every weight read once
# forward and once backward, is that of a few rows on a CPU). Before issue 28 item 1: SPLITS = 2, no MUST_SPLIT:
# 442 evaluations in 57 passes on benchmarks/bench_ig_tolerance.py's 10 sentences, now 426 in 40 (MUST_SPLIT 1:
# 438 in 40; 2: 426 in 43), the same answers within the tolerance (tests/methods/test_quadrature_auto.py).
TOKEN_SHARE = 1 / 15
SPLITS = 1
SPLIT_FRACTION = 0.5
TOKEN_STOP = 2.0
MUST_SPLIT = 1.5


def integrate_panels(
    path: PathCache,
    fdiff: torch.Tensor,
    fscale: torch.Tensor,
    steps: int,
    adaptive: bool,
    tolerance: float,
    max_steps: int,
    lengths: Sequence[int],
) -> tuple[torch.Tensor, dict]:
    """Locally adaptive IG: 5-point Boole panels, bisected where the error is.

    Start from ``steps / 4`` equal panels. Each panel [a, b] knows two errors: its exact share of the
    completeness error, ``|Σ_i Q_i − (F(b) − F(a))|`` (every gradient evaluation's forward pass gives
    F(α)), and a per-token estimate, ``max_i |Boole_i − Simpson_i| / 15`` (Simpson on every other node of
    the same panel; the difference over 15 is Richardson's estimate of the error of the 5-point composite
    Simpson rule, which Boole's rule, its extrapolation, improves on). While the relative completeness
    error exceeds ``tolerance`` or the summed per-token estimate exceeds ``TOKEN_STOP`` tolerances (token
    errors can cancel in the sum), the panel with the largest error is bisected (``SPLITS``), and with it,
    in the same pass, every panel whose error alone exceeds ``MUST_SPLIT`` (1.5) tolerances of |ΔF| (it
    fails the stopping test by itself unless others cancel it); a child reuses 3 of its 5 nodes, so a split costs 4 new gradients,
    and a round is one forward/backward pass of its new nodes (``info["passes"]``). A panel at the finest grid (a step in F no bisection
    resolves) is left as it is and the others go on; when only such panels carry error the method warns
    and stops. Suited to integrands with narrow spikes (pre-norm decoders, where global rules need
    hundreds of points).
    """
    if steps % 4:
        raise StreetlampError(f"rule 'panels' needs steps divisible by 4 (got {steps}): 5-point Boole panels")
    n0 = steps // 4
    # panels are integer intervals [lo, hi] of a grid of D points, so a node shared by two panels (or
    # a parent and its children) is one cache key even when n0 is not a power of two; 56 bisections
    # deep (panels of ~1e-17: the tiny Gemma 2 and 3 paths step within ~1e-13 of alpha = 0, which 40 missed)
    width = 4 << 56
    grid = n0 * width
    node = lambda lo, hi, q: float(lo + (hi - lo) * q // 4) / grid  # noqa: E731  (q = 0..4)
    panels = [(k * width, (k + 1) * width) for k in range(n0)]
    fd = fdiff.double()
    scale = fd.abs().clamp_min(1e-12)
    noise = NOISE_FLOOR * fscale.double().abs().clamp_min(1e-30)
    history: list[dict] = []
    while True:
        nodes = np.array([node(lo, hi, q) for lo, hi in panels for q in range(5)])
        path.evaluate(nodes)
        ig: torch.Tensor | None = None
        half: torch.Tensor | None = None
        est: torch.Tensor | None = None  # per-token error estimate, summed over panels
        ind = []
        for lo, hi in panels:
            h = (hi - lo) / grid
            g = [path.cache[node(lo, hi, q)] for q in range(5)]
            qb = cast(torch.Tensor, h * sum(float(w) * gk for w, gk in zip(BOOLE, g)))  # sum of 5 tensors
            qs = h * (g[0] + 4 * g[2] + g[4]) / 6
            ig = qb if ig is None else ig + qb
            half = qs if half is None else half + qs
            est = TOKEN_SHARE * (qb - qs).abs() if est is None else est + TOKEN_SHARE * (qb - qs).abs()
            tok = torch.stack([(qb[j, :L] - qs[j, :L]).abs().max() for j, L in enumerate(lengths)])
            if node(lo, hi, 0) in path.fvals and node(lo, hi, 4) in path.fvals:
                share = path.fvals[node(lo, hi, 4)] - path.fvals[node(lo, hi, 0)]
                err = torch.stack([(qb[j, :L].sum() - share[j]).abs() for j, L in enumerate(lengths)])
            else:  # no F from grad_fn: the panel's sum difference between the two rules
                err = torch.stack([(qb[j, :L] - qs[j, :L]).sum().abs() for j, L in enumerate(lengths)])
            ind.append(float((torch.maximum(err, TOKEN_SHARE * tok) / scale).max()))
        assert ig is not None and half is not None and est is not None
        tok_est = torch.stack([est[j, :L].max() for j, L in enumerate(lengths)])
        total = torch.stack([ig[j, :L].sum() for j, L in enumerate(lengths)])
        delta = (total - fd).abs()
        rel = delta / scale
        tok_change = float(max(((ig[j, :L] - half[j, :L]).abs().max() / scale[j]) for j, L in enumerate(lengths)))
        history.append(
            {
                "steps": 4 * len(panels),
                "panels": len(panels),
                "max_relative_error": float(rel.max()),
                "token_change_vs_half_steps": tok_change,
            }
        )
        ok = bool(((rel <= tolerance) | (delta <= noise)).all())
        tokens_ok = bool(((tok_est <= TOKEN_STOP * tolerance * scale) | (tok_est <= noise)).all())
        if (ok and tokens_ok) or not adaptive:
            break
        # a panel at the finest grid (a step no bisection resolves) stays as it is; the others go on
        # (and one whose error is under 1e-3 tolerances cannot matter: a thousand such panels sum to less)
        split = [i for i, (lo, hi) in enumerate(panels) if hi - lo >= 8 and ind[i] > 1e-3 * tolerance]
        room = (max_steps + 1 - len(path.cache)) // 4
        if (room < 1 or not split) and ok:
            break  # the completeness tolerance is met; the token estimate is only a refinement target
        if not split:
            warnings.warn(
                f"integrated_gradients: relative completeness error {float(rel.max()):.3g} > tolerance "
                f"{tolerance:g}: every panel that carries error is at the finest grid (a step in F); stopping",
                stacklevel=3,
            )
            break
        if room < 1:
            warnings.warn(
                f"integrated_gradients: relative completeness error {float(rel.max()):.3g} > tolerance "
                f"{tolerance:g} after {len(path.cache)} gradient evaluations (panels); max_steps={max_steps} "
                "reached",
                stacklevel=3,
            )
            break
        worst = max(ind[i] for i in split)
        order = sorted(split, key=lambda i: -ind[i])[:room]
        chosen = {i for i in order[:SPLITS] if ind[i] >= SPLIT_FRACTION * worst}
        chosen |= {i for i in order if ind[i] > MUST_SPLIT * tolerance}
        new = []
        for i, (lo, hi) in enumerate(panels):
            if i in chosen:
                c = (lo + hi) // 2
                new += [(lo, c), (c, hi)]
            else:
                new.append((lo, hi))
        panels = new
    info = {
        "steps": 4 * len(panels),
        "gradient_evaluations": len(path.cache),
        "converged": ok,
        "token_change_vs_half_steps": history[-1]["token_change_vs_half_steps"],
        "converged_by_noise_floor": bool(ok and rel.max() > tolerance),
        "panels": len(panels),
        "smallest_panel": min(hi - lo for lo, hi in panels) / grid,
        "passes": path.passes,
        "token_error_estimate": float((tok_est / scale).max()),
        "tolerance": tolerance,
        "history": history,
        "delta": delta.tolist(),
        "relative_error": rel.tolist(),
        "sum_attributions": total.tolist(),
    }
    return ig, info
