"""Kernel SHAP and LIME over token presence (METHODS.md section 4).

Both sample *coalitions* ``z`` in {0,1}^M (1 = feature present; features are tokens or words as
in occlusion, special tokens never perturbed by default), read ``F`` on the text with the absent
features replaced (or deleted; on causal LMs under the decoder removal rule of :mod:`.removal`), and fit
a weighted linear model ``F(z) ~ phi_0 + sum_i phi_i z_i``.
The fitting functions :func:`kernel_shap_fit`, :func:`lime_fit` and the samplers are pure numpy
on a value function, so they are tested on analytic functions.

Kernel SHAP (Lundberg & Lee 2017, "A unified approach to interpreting model predictions"): Shapley
kernel ``pi(z) = (M-1) / (C(M,|z|) |z| (M-|z|))``, with the efficiency constraint imposed exactly
(``phi_0 = F(all absent)``, ``sum phi = F(x) - F(all absent)``) by eliminating one coefficient, as
the ``shap`` package does. When ``2^M - 2 <= n_samples`` every coalition is enumerated with its
kernel weight, which gives the exact Shapley values; otherwise coalition sizes are drawn from the
kernel's size distribution (then weight 1 each) in complementary pairs (z, 1-z) (Covert & Lee 2021,
paired sampling), which leaves the estimate unbiased and much less noisy.

LIME (Ribeiro, Singh & Guestrin 2016, "Why should I trust you?"), as its reference text
explainer: the first sample is the text itself, the others remove a number of features drawn
uniformly from 1..M-1 (a random subset of that size); weights
``sqrt(exp(-d^2 / width^2))`` with ``d`` = 100 x cosine distance between ``z`` and all-ones and
``width = 25`` (the ``lime`` package's text defaults); weighted ridge regression with intercept
(``alpha = 1``, scikit-learn's ``Ridge`` with ``sample_weight``).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

import numpy as np

from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter, Target
from ..results import Explanation
from .base import CAUSAL_LM, CLASSIFIER, ENCODER_DECODER, Method, ViewAttribution
from .scorer import check_replacement, explanation_common
from .views import SequenceView, View


# ---- pure numpy: samplers and fits --------------------------------------------------------------------
def shap_coalitions(m: int, n_samples: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, bool]:
    """Coalitions ``[k, m]`` (bool), their regression weights ``[k]``, and whether the set is exhaustive."""
    if m < 2:
        return np.zeros((0, m), dtype=bool), np.zeros(0), True
    if m < 31 and 2**m - 2 <= n_samples:
        codes = np.arange(1, 2**m - 1)
        z = (codes[:, None] >> np.arange(m)) & 1 == 1
        s = z.sum(1)
        w = (m - 1) / (np.array([comb(m, int(k)) for k in s], dtype=np.float64) * s * (m - s))
        return z, w, True
    sizes = np.arange(1, m)
    p = (m - 1) / (sizes * (m - sizes))
    p = p / p.sum()
    n_pairs = (n_samples + 1) // 2
    z = np.zeros((2 * n_pairs, m), dtype=bool)
    for j, s in enumerate(rng.choice(sizes, size=n_pairs, p=p)):
        z[2 * j, rng.permutation(m)[:s]] = True
        z[2 * j + 1] = ~z[2 * j]
    z = z[:n_samples]
    return z, np.ones(len(z)), False


def kernel_shap_fit(z: np.ndarray, f: np.ndarray, w: np.ndarray, f_full: float, f_empty: float) -> np.ndarray:
    """Weighted least squares with ``sum(phi) = f_full - f_empty`` exactly (last coefficient eliminated)."""
    m = z.shape[1]
    delta = f_full - f_empty
    if m == 0:
        return np.zeros(0)
    if m == 1:
        return np.array([delta])
    zf = z.astype(np.float64)
    x = zf[:, :-1] - zf[:, -1:]
    y = f - f_empty - zf[:, -1] * delta
    sw = np.sqrt(w)
    head, *_ = np.linalg.lstsq(x * sw[:, None], y * sw, rcond=None)
    return np.append(head, delta - head.sum())


def lime_coalitions(m: int, n_samples: int, rng: np.random.Generator) -> np.ndarray:
    """``[n_samples, m]`` bool: row 0 is the text itself, then 1..m-1 random features removed."""
    z = np.ones((n_samples, m), dtype=bool)
    if m == 0:
        return z
    hi = max(1, m - 1)
    for j in range(1, n_samples):
        k = int(rng.integers(1, hi + 1))
        z[j, rng.choice(m, size=k, replace=False)] = False
    return z


def lime_weights(z: np.ndarray, kernel_width: float) -> np.ndarray:
    """``sqrt(exp(-d^2/width^2))``, ``d`` = 100 x cosine distance from all-ones (lime's text explainer)."""
    zf = z.astype(np.float64)
    norm = np.sqrt(zf.sum(1)) * np.sqrt(z.shape[1])
    cos = np.divide(zf.sum(1), norm, out=np.zeros(len(z)), where=norm > 0)
    d = (1.0 - cos) * 100.0
    return np.sqrt(np.exp(-(d**2) / kernel_width**2))


def lime_fit(z: np.ndarray, f: np.ndarray, w: np.ndarray, alpha: float) -> tuple[np.ndarray, float, float]:
    """Weighted ridge with intercept (intercept not penalised): ``(coef, intercept, weighted R^2)``."""
    zf = z.astype(np.float64)
    sw = w / w.sum()
    xm, ym = sw @ zf, sw @ f
    xc, yc = zf - xm, f - ym
    a = (xc * w[:, None]).T @ xc + alpha * np.eye(z.shape[1])
    coef = np.linalg.solve(a, (xc * w[:, None]).T @ yc) if z.shape[1] else np.zeros(0)
    intercept = float(ym - xm @ coef)
    resid = f - (zf @ coef + intercept)
    ss = float(w @ yc**2)
    r2 = 1.0 - float(w @ resid**2) / ss if ss > 0 else 1.0
    return coef, intercept, r2


# ---- the methods --------------------------------------------------------------------------------------
@dataclass
class _Sampled(Method):
    n_samples: int = 512
    replacement: str = "mask"
    group: str = "token"
    kv_cache: bool = True

    family = "perturbation"
    stochastic = True
    kinds = (CLASSIFIER, CAUSAL_LM, ENCODER_DECODER)

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        self._check_model(adapter)

    def check_view(self, view: View) -> None:
        super().check_view(view)
        check_replacement(self.replacement, self.group)
        if self.group not in view.groups:
            raise StreetlampError(
                f"{self.name} on an encoder-decoder perturbs single tokens: group {self.group!r} is not built there "
                "(use 'token')"
            )
        self._check_model(view.adapter)

    def _check_model(self, adapter: ModelAdapter) -> None:
        check_replacement(self.replacement, self.group)
        adapter.replacement_token(self.replacement)
        if not isinstance(self.n_samples, int) or self.n_samples < 2:
            raise StreetlampError(f"{self.name}: n_samples must be an integer >= 2, got {self.n_samples!r}")

    def sample(self, view: View, batch_size: int | None, seed: int) -> tuple[np.ndarray, np.ndarray, list[dict], dict]:
        """The method, once: each row of ``view`` is one problem over that row's features (coalitions of
        absent features removed by the view's rule, F of that row read on each): ``scores`` ``[k, n]`` (each
        feature's coefficient in its row), ``groups`` ``[k, n]``, the fit's record per row, the common record."""
        adapter = view.adapter
        used, tid, tok = adapter.replacement_token(self.replacement)
        groups, _ = view.features(self.group, False, tid is None, coalitions=True)
        scores = np.zeros((view.k, view.n))
        rows: list[dict] = []
        pert = None
        extra: dict = {}
        for j in range(view.k):
            g = groups[j]
            feats = np.unique(g[g >= 0])  # the row's feature ids, in column order
            m = len(feats)
            self.check_samples(m)
            if pert is None:
                pert = view.perturber(tid, batch_size, self.kv_cache, self.name)
            rng = view.rng(seed, j)

            def value(z: np.ndarray, g: np.ndarray = g, feats: np.ndarray = feats, j: int = j) -> np.ndarray:
                absent = [np.isin(g, feats[~np.asarray(row, dtype=bool)]) for row in z]
                return pert(absent, [j])[:, j]

            f_full = float(pert.base[j])
            phi, arrays, axes, meaning, info = self.fit(m, value, f_full, rng)
            scores[j] = np.where(g >= 0, phi[np.searchsorted(feats, np.maximum(g, 0))] if m else 0.0, 0.0)
            rows.append({"features": m, "F": f_full, **info})
            extra = {"arrays": arrays, "axes": axes, "meaning": meaning}
        assert pert is not None
        common = {
            "used": used,
            "token": tok,
            "rule": view.removal_rule(used, tok, False),
            "index": pert.index,
            "base": pert.base,
            **pert.stats,
            **extra,
        }
        return scores, groups, rows, common

    def attribute_view(self, view: View, *, batch_size: int | None = None, seed: int = 0) -> ViewAttribution:
        self.check_view(view)
        scores, groups, rows, rec = self.sample(view, batch_size, seed)
        return ViewAttribution(
            {"": scores},
            {
                "features": (
                    (groups >= 0).astype(np.uint8),
                    ["generated", "token"],
                    f"1 where the token is one of that row's {self.name} features (0: not an input of the row, a "
                    "special token, the decoder start token or, with delete, the input the row is read after)",
                )
            },
            {
                "replacement": self.replacement,
                "replacement_used": rec["used"],
                "replacement_token": rec["token"],
                "removal_rule": rec["rule"],
                "rows": rows,
            },
            rows,
        )

    def attribute(
        self, adapter: ModelAdapter, inputs: Inputs, *, target: Target, batch_size: int | None = None, seed: int = 0
    ) -> list[Explanation]:
        self.check(adapter)
        used, _, tok = adapter.replacement_token(self.replacement)
        common = explanation_common(self.name, used, tok, self.replacement)
        out = []
        for b in range(len(inputs)):
            view = SequenceView(adapter, inputs, b, target)
            scores, groups, rows, rec = self.sample(view, batch_size, seed)
            rule_note = rec["rule"]
            info = {k: v for k, v in rows[0].items() if k not in ("features", "F")}
            out.append(
                self.explanation(
                    adapter,
                    inputs,
                    b,
                    int(rec["index"][0]),
                    target,
                    arrays={"tokens": scores[0].astype(np.float32), "groups": groups[0], **rec["arrays"]},
                    axes={"tokens": ["token"], "groups": ["token"], **rec["axes"]},
                    meaning={
                        "tokens": f"{self.name} coefficient of the {self.group}'s presence; "
                        + common["replacement_note"]
                        + (f"; {rule_note}" if rule_note else ""),
                        "groups": f"{self.group} id per token (-1: never perturbed, e.g. special tokens"
                        + (", the explained position)" if rule_note else ")"),
                        **rec["meaning"],
                    },
                    base_score=float(rec["base"][0]),
                    n_features=rows[0]["features"],
                    n_evaluated=rec["rows"],
                    seed=seed,
                    kv_cache_used=rec["kv_cache_used"],
                    removal_rule=rule_note,
                    **info,
                    **common,
                )
            )
        return out

    def check_samples(self, m: int) -> None:
        pass

    def fit(self, m, value, f_full, rng):  # type: ignore[no-untyped-def]
        raise NotImplementedError


@dataclass
class Shap(_Sampled):
    """Kernel SHAP over token (or word) presence; exact Shapley values when every coalition fits."""

    name = "shap"
    description = "Kernel SHAP over token presence (absent tokens replaced), efficiency imposed exactly"

    def check_samples(self, m: int) -> None:
        if m > 1 and self.n_samples < m and 2**m - 2 > self.n_samples:
            raise StreetlampError(
                f"shap: n_samples={self.n_samples} is too small for {m} features; "
                f"give at least {m} (better several times more)"
            )

    def fit(self, m, value, f_full, rng):  # type: ignore[no-untyped-def]
        f_empty = float(value(np.zeros((1, m), dtype=bool))[0]) if m else f_full
        z, w, exact = shap_coalitions(m, self.n_samples, rng)
        phi = kernel_shap_fit(z, value(z), w, f_full, f_empty)
        return (
            phi,
            {},
            {},
            {},
            {"f_all_absent": f_empty, "exhaustive": exact, "efficiency_error": float(phi.sum() - (f_full - f_empty))},
        )


@dataclass
class Lime(_Sampled):
    """LIME over token (or word) presence: exponential kernel on cosine distance, weighted ridge."""

    kernel_width: float = 25.0
    alpha: float = 1.0

    name = "lime"
    description = "LIME over token presence: exponential cosine kernel, weighted ridge fit"

    def check_samples(self, m: int) -> None:
        if self.kernel_width <= 0 or self.alpha < 0:
            raise StreetlampError("lime: kernel_width must be > 0 and alpha >= 0")

    def fit(self, m, value, f_full, rng):  # type: ignore[no-untyped-def]
        z = lime_coalitions(m, self.n_samples, rng)
        f = np.concatenate([[f_full], value(z[1:])])
        w = lime_weights(z, self.kernel_width)
        coef, intercept, r2 = lime_fit(z, f, w, self.alpha)
        return coef, {}, {}, {}, {"intercept": intercept, "r2": r2}
