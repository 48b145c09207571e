"""An exact screened encoder: a sparse dictionary's float32 encode, with the dense ``x W_enc`` replaced by a
bfloat16 screen and a float32 recomputation of the latents that could be active.

The float32 encoder computes ``y = fl(s_d + b)`` (then ReLU, TopK or JumpReLU) for every latent, where
``s_d = x · w`` is the float32 dot product of the input with the latent's encoder column. Only the active
latents (L0 of them, tens out of thousands) matter. On a CPU with bfloat16 units (AMX, AVX512-BF16) a bfloat16
product is several times faster than the float32 one. So:

1. **Screen.** One bfloat16 product gives, for every (token, latent), a bound on ``y`` from above (and, for
   TopK, from below) that is *rigorous*: it holds for any float32 summation order of ``s_d``.
2. **Candidates.** ReLU / JumpReLU: the latents whose upper bound exceeds the threshold. TopK: those whose
   upper bound reaches the k-th largest lower bound of the row. Every latent active in the float32 encode is
   a candidate (proof below); most candidates are active.
3. **Recompute.** ``s_c = x · w`` in float32 for the candidates only (``torch.sparse.sampled_addmm``: one dot
   product per candidate, no dense product), ``y = fl(s_c + b)``, and the activation among the candidates.

The result equals the dense encoder's up to the float32 rounding of the dot product itself: ``s_c`` and
``s_d`` are both float32 sums of the same 576 products, in the orders of two kernels (the dense kernel's order
is the BLAS's and is not even fixed across matrix shapes). A latent whose value lies within that rounding
(~1e-7 relative) of its threshold may fall either way, in either path; beyond that the active set is
identical and the values equal to float32 rounding.

**The bound.** Notation: ``u = 2^-8`` (bfloat16's unit roundoff, round to nearest even), ``u32 = 2^-24``,
``n = d_in``, ``m = n + 8`` (the screen's product length, padding included), ``Γ = m u32 / (1 - m u32)`` (the
classical bound on the error of any order of float32 summation of ``m`` terms, FMA or not, relative to the sum
of their magnitudes: Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1 and §4.2). For one token
``x`` and one latent column ``w``:

- ``x̂ = bf16(x)``, ``ŵ = bf16(w)`` (the weights' values below bfloat16's smallest normal 2^-126 set to 0: the
  bf16 kernels may flush subnormal inputs; the input's, if flushed, lose at most ``2^-126 ‖ŵ‖₁``, which the
  offset's slack covers); ``r_x = x - x̂``, ``r_w = w - ŵ``, both exact in float32 (each is the low bits of a
  float32 number).
- ``x · w = x̂·ŵ + x̂·r_w + r_x·ŵ + r_x·r_w`` exactly, so by Cauchy-Schwarz
  ``|x·w - x̂·ŵ| ≤ A ‖r_w‖ + R ‖ŵ‖ + R ‖r_w‖`` with ``A = ‖x̂‖``, ``R = ‖r_x‖`` (per token), ``‖ŵ‖``, ``‖r_w‖``
  (per latent, cached): the *measured* residual norms, about half the worst case ``u ‖x‖``.
- ``|s_d - x·w| ≤ Γ Σ|x_i w_i| ≤ Γ (A + R)(‖ŵ‖ + ‖r_w‖)`` (the dense path's own rounding, whatever its order).
- The screen's product is the bfloat16 matmul of ``[x̂, 1, 1, 1, A↑, R↑]`` with ``[ŵ; h₁; h₂; h₃; P↑; Q↑]``
  (and three zeros, for a length of n + 8):
  the products of two bfloat16 numbers are exact in float32, the kernels accumulate in float32, so the
  computed sum ``T`` is within ``Γ (A ‖ŵ‖ + |h₁|+|h₂|+|h₃| + A↑P↑ + R↑Q↑)`` of the exact sum of its terms,
  plus ``2 m 2^-126`` for float32 underflows flushed to zero. ``h₁ + h₂ + h₃`` is a float32 number ``h⁺``
  split exactly into three bfloat16 pieces: an offset at least ``b`` (JumpReLU: ``b - θ``) plus its share of
  the rounding; ``A↑ ≥ A``, ``R↑ ≥ R``, ``P↑ ≥ (1 + 2Γ) P``, ``Q↑ ≥ (1 + 2Γ) Q`` are rounded up to bfloat16, with
  ``P = ‖r_w‖ + Γ (2‖ŵ‖ + ‖r_w‖)`` and ``Q = (1 + Γ)(‖ŵ‖ + ‖r_w‖)``, so that
  ``A P + R Q`` covers the three residual terms and both float32 roundings of the products, and the extra
  ``2Γ`` covers the accumulation error on the bound's own terms.
- Together: ``T ≥ s_d + b - θ`` (in real numbers). The output is ``T`` rounded to bfloat16, which keeps its sign.

ReLU / JumpReLU: the dense encode keeps a latent when ``fl(s_d + b) > θ`` (θ = 0 for ReLU), which implies
``s_d + b - θ > 0`` (rounding to nearest is monotone and θ is a float32 number), hence ``T > 0``, hence the
bfloat16 result has a clear sign bit: the candidates are the entries whose sign bit is clear. TopK: a second
product with ``[ŵ; h⁻ pieces; -P↑; -Q↑]``, the offset ``h⁻ ≤ b``, gives ``T⁻ ≤ s_d + b``; the bfloat16 result
``V`` of ``T`` is within ``u|T| ≤ c|V|``, ``c = u / (1 - u)``, so ``ℓ = V⁻ - c|V⁻| ≤ s_d + b ≤ V⁺ + c|V⁺| = υ``.
If ``λ`` is the k-th largest ``ℓ`` of a row, k latents have ``s_d + b ≥ λ``, so a latent of the dense top k
(ties aside) has ``υ ≥ λ``; the test ``υ ≥ λ - 2^-22 |λ| - 2^-126`` also keeps a latent tied with those k after
the float32 rounding of ``s_d + b``. Both maps ``v ↦ v ± c|v|`` are increasing, so the test is done on the
bfloat16 values against one threshold per row.

The one assumption about the kernel, that it accumulates bfloat16 products in float32 (AMX's TDPBF16PS and
AVX512-BF16's VDPBF16PS do, as does PyTorch's fallback), is checked by the tests on inputs where the bound is
attained to within 5% (tests/models/test_screen.py).

Where it applies (:func:`screenable`): a float32 input on a CPU with native bfloat16 (AMX or AVX512-BF16), no
gradient needed through the encode, ReLU or JumpReLU (:data:`ACTIVATIONS`), at least :data:`MIN_WIDTH` latents,
weights and inputs finite and below 2^100; else the dense path. The bfloat16 copy of the encoder (with its extra
rows) and a latent-major float32 copy for the recomputation (none when ``W_enc`` is already a transposed view)
are cached per dictionary and rebuilt when a weight is replaced or changed in place: 1.5x the encoder's
float32 memory.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .features import Dictionary

__all__ = ["ACTIVATIONS", "ENABLED", "MIN_WIDTH", "ScreenCache", "bound", "candidates", "encode", "screenable"]

# the screen is used where it applies (tests switch it off to compare against the dense encode)
ENABLED = True
# the activations it is used for: TopK's screen is exact too, but not faster than the dense encode (its k-th
# largest lower bound is a top-k over every latent, as costly as the dense encode's own; 30 against 23 ms for
# 512 tokens, width 4096, k 32), so TopK dictionaries keep the dense product unless this is widened
ACTIVATIONS = ("relu", "jumprelu")
# narrower dictionaries keep the dense product. Per token, the dense float32 product costs ~7 ns per latent
# (d_in 576, one thread), the screen ~1.7 ns per latent (the bfloat16 product and the candidate masks) and
# ~90 ns per candidate (the float32 dot product, the scattered write): it pays while the candidates are fewer
# than ~width / 17, about 2 L0 to 3 L0 of them (the bound is loose by construction: it holds for any rounding),
# so from width ~2,000 at L0 ~30-60. Measured: width 4096, L0 64, 100-150 candidates: 12-15 against 15 ms.
MIN_WIDTH = 2048

U = 2.0**-8  # bfloat16's unit roundoff (8 significant bits, round to nearest even)
U32 = 2.0**-24  # float32's
TINY = 2.0**-126  # the smallest normal float32 / bfloat16: the bf16 kernels flush anything below to zero
GRID = 2.0**-110  # offsets snapped to multiples of this, so that their three bfloat16 pieces are all normal
BIG = 2.0**100  # inputs and weights beyond this take the dense path (no overflow anywhere in the screen)
EXTRA = 8  # the screen's extra product terms: 3 offset pieces, 3 zeros (padding), 2 bound terms


def _native_bf16() -> bool:
    try:
        return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())
    except AttributeError:  # an older torch
        return False


NATIVE_BF16 = _native_bf16()


def screenable(d: Dictionary, x: torch.Tensor) -> bool:
    """Whether :func:`encode` may replace the dense encode of ``x``: a float32 input on a CPU with native
    bfloat16, at least :data:`MIN_WIDTH` latents, no gradient through the encode."""
    if not (ENABLED and NATIVE_BF16 and x.dtype == torch.float32 and x.device.type == "cpu"):
        return False
    if d.activation not in ACTIVATIONS:
        return False
    if d.width < MIN_WIDTH or x.numel() == 0:
        return False
    if torch.is_grad_enabled() and (
        x.requires_grad or any(t is not None and t.requires_grad for t in (d.W_enc, d.b_enc, d.b_dec, d.threshold))
    ):
        return False
    return True


def _round_up_bf16(v: torch.Tensor) -> torch.Tensor:
    """bfloat16 numbers ``≥ v`` (float64, non-negative): ``v (1 + 2^-7)`` rounded to nearest (through float32)
    is at least ``v (1 + 2^-7)(1 - 2^-24)(1 - 2^-8) ≥ v``; values below 2^-120 become 2^-120 (normal)."""
    return (v * (1 + 2.0**-7)).clamp_min(2.0**-120).to(torch.float32).to(torch.bfloat16)


def _directed_float32(v: torch.Tensor, up: bool) -> torch.Tensor:
    """float32 numbers on the GRID, ``≥ v`` (``up``) or ``≤ v``, for float64 ``v``."""
    snapped = torch.ceil(v / GRID) * GRID if up else torch.floor(v / GRID) * GRID
    f = snapped.to(torch.float32)
    wrong = f.double() < snapped if up else f.double() > snapped
    return torch.where(wrong, torch.nextafter(f, torch.full_like(f, math.inf if up else -math.inf)), f)


def _split3(f: torch.Tensor) -> torch.Tensor:
    """``[3, width]`` bfloat16 pieces summing exactly to the float32 ``f`` (24 bits = 3 x 8)."""
    hi = f.to(torch.bfloat16)
    r = f - hi.float()  # exact: the low 16 bits of f
    mid = r.to(torch.bfloat16)
    lo = (r - mid.float()).to(torch.bfloat16)  # exact: the last 8 bits
    pieces = torch.stack([hi, mid, lo])
    if not torch.equal(pieces.double().sum(0), f.double()):  # pragma: no cover - a grid value always splits
        raise ArithmeticError("an offset did not split into three bfloat16 pieces")
    return pieces


def _bf16_parts(t: torch.Tensor, flush: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``t̂ = bf16(t)`` (``flush``: with subnormals set to zero) and ``t - t̂`` (exact, float32)."""
    hat = t.to(torch.bfloat16)
    if flush:
        hat = hat.masked_fill(hat.abs() < TINY, 0)
    return hat, t - hat.float()


def gamma(m: int) -> float:
    """Γ_m = m u32 / (1 - m u32): float32 summation of m terms, any order."""
    return m * U32 / (1 - m * U32)


@dataclass
class ScreenCache:
    """What the screen keeps of one dictionary: the bfloat16 encoder with its extra rows, latent-major
    (``V_t [width, n + 8]``; TopK: ``[2 width, n + 8]``, the lower bound's latents after the upper's), the
    float32 encoder latent-major (``W_t [width, n]``, for the recomputation), the bias and the threshold."""

    V_t: torch.Tensor
    W_t: torch.Tensor
    b: torch.Tensor
    threshold: torch.Tensor | None

    @classmethod
    def build(cls, d: Dictionary, p: dict[str, torch.Tensor | None]) -> ScreenCache | None:
        W, b, theta = p["W_enc"], p["b_enc"], p["threshold"]
        assert W is not None and b is not None
        if not bool(torch.isfinite(W).all()) or float(W.abs().max()) >= BIG:
            return None
        n = W.shape[0]
        g = gamma(n + EXTRA)
        w_hat, r_w = _bf16_parts(W, flush=True)
        nw, nr = w_hat.double().norm(dim=0), r_w.double().norm(dim=0)
        # float64 norms of float32 numbers: their own error (n 2^-53 relative) is covered by the bfloat16 rounding up
        P = (nr + g * (2 * nw + nr)) * (1 + 2 * g)
        Q = (1 + g) * (nw + nr) * (1 + 2 * g)
        h = b.double() - (theta.double() if d.activation == "jumprelu" and theta is not None else 0)
        if float(h.abs().max()) >= BIG:
            return None
        # Γ on the offset's own pieces; underflows flushed to zero: products and sums (2 m of them) and the
        # input's subnormal bfloat16 entries, if the kernel flushes them (each loses at most 2^-126 |ŵ_i|)
        slack = 2 * g * h.abs() + (2 * (n + EXTRA + 1) + w_hat.double().abs().sum(0)) * TINY
        pad = torch.zeros(3, W.shape[1], dtype=torch.bfloat16)  # the product's length n + 8, a multiple of 8
        up = torch.cat(
            [
                w_hat,
                _split3(_directed_float32(h + slack, up=True)),
                pad,
                _round_up_bf16(P)[None],
                _round_up_bf16(Q)[None],
            ]
        )
        cols = [up]
        if d.activation == "topk":
            cols.append(torch.cat([w_hat, _split3(_directed_float32(h - slack, up=False)), pad, -up[-2:]]))
        V_t = torch.cat(cols, dim=1).t().contiguous()
        W_t = W.t() if W.t().is_contiguous() else W.t().contiguous()
        return cls(V_t, W_t, b, theta)


def _cache(d: Dictionary, p: dict[str, torch.Tensor | None]) -> ScreenCache | None:
    """The dictionary's :class:`ScreenCache` (None: its weights take the dense path), rebuilt when a weight it
    was built from is another tensor or was changed in place."""
    key = tuple(
        None if t is None else (id(t), t.data_ptr(), t._version)
        for t in (p["W_enc"], p["b_enc"], p["threshold"], d.W_enc, d.b_enc, d.threshold)
    )
    held = d._screened
    if held.get("key") != key:
        held["cache"], held["key"] = ScreenCache.build(d, p), key
    return held["cache"]


def bound(x: torch.Tensor, cache: ScreenCache, width: int) -> torch.Tensor:
    """The bound ``A↑P↑ + R↑Q↑ ≥ |s_d - x̂·ŵ|`` the screen adds, ``[tokens, width]`` in float64, from the
    very numbers the screen's product multiplies (for tests)."""
    x_hat, r_x = _bf16_parts(x)
    A, R = _round_up_bf16(x_hat.double().norm(dim=1)), _round_up_bf16(r_x.double().norm(dim=1))
    PQ = cache.V_t[:width, -2:].double()
    return A.double()[:, None] * PQ[:, 0] + R.double()[:, None] * PQ[:, 1]


# four bfloat16 sign bits in one int64 word (a tensor: a Python scalar takes a slower kernel)
SIGNS = torch.tensor(int.from_bytes(bytes.fromhex("8000800080008000"), "big", signed=True), dtype=torch.int64)


def _flat_nonzero(mask: torch.Tensor) -> torch.Tensor:
    """Ascending flat indices of the True entries of a contiguous bool tensor: eight at a time first (the
    mask read as int64 words), then within the words that hold one (``nonzero`` costs per entry read)."""
    flat = mask.reshape(-1)
    if flat.numel() % 8:
        return flat.nonzero().squeeze(1)
    words = flat.view(torch.int64).nonzero().squeeze(1)
    which, at = flat.view(-1, 8).index_select(0, words).nonzero().unbind(1)
    return words[which] * 8 + at


def _sign_clear(V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) of the entries of the bfloat16 matrix ``V`` whose sign bit is clear, row-major: the
    words of four entries with some sign bit clear first (one test a word), then the entries of those."""
    rows, cols = V.shape
    if cols % 4 or not V.is_contiguous():
        row, col = (V.view(torch.int16) >= 0).nonzero().unbind(1)
        return row, col
    words = _flat_nonzero(torch.bitwise_and(V.view(torch.int64), SIGNS) != SIGNS)
    which, lane = (V.view(torch.int16).view(-1, 4).index_select(0, words) >= 0).nonzero().unbind(1)
    flat = words[which] * 4 + lane
    return flat // cols, flat % cols


def candidates(d: Dictionary, x: torch.Tensor, cache: ScreenCache) -> torch.Tensor | tuple | None:
    """The candidates of the float32 rows ``x [tokens, n]``, latent-major: ReLU / JumpReLU as (latent, token)
    index pairs, TopK as a mask ``[width, tokens]``; None where the screen does not apply (an input not finite
    or beyond 2^100)."""
    x_hat, r_x = _bf16_parts(x)
    A, R = x_hat.double().norm(dim=1), r_x.double().norm(dim=1)
    top = float(A.max())
    if not math.isfinite(top) or top >= BIG:
        return None
    one = torch.tensor([1, 1, 1, 0, 0, 0], dtype=torch.bfloat16).expand(x.shape[0], 6)  # offset pieces, padding
    bound = torch.stack([_round_up_bf16(A), _round_up_bf16(R)], dim=1)
    x_aug = torch.cat([x_hat, one, bound], dim=1)
    width = d.width
    V = cache.V_t[:width] @ x_aug.t()  # bfloat16 [width, tokens]
    if d.activation != "topk":
        return _sign_clear(V)  # T > 0 rounds to a number with a clear sign bit (+0 included)
    assert d.k is not None
    c = U / (1 - U)
    low = (x_aug @ cache.V_t[width:].t()).float()  # the lower bounds V⁻, token-major [tokens, width]
    kth = torch.topk(low, d.k, dim=1, sorted=False).values.amin(dim=1).double()  # the k-th largest V⁻
    lam = kth - c * kth.abs()  # the k-th largest ℓ of the token (v ↦ v - c|v| is increasing)
    lam = lam - 2.0**-22 * lam.abs() - TINY  # float32 ties of s_d + b with the k-th
    tau = torch.where(lam >= 0, lam / (1 + c), lam / (1 - c))  # υ ≥ λ  ⟺  V⁺ ≥ τ
    tau = _directed_float32(tau - 2.0**-40 * tau.abs(), up=False)
    return V.float() >= tau[None, :]


def encode(d: Dictionary, x: torch.Tensor) -> torch.Tensor | None:
    """The dense encoder's ``σ(x W_enc + b_enc)`` (``x - b_dec`` first for an SAE), screened; None where the
    screen does not apply (the caller encodes densely)."""
    p = d.params(x)
    cache = _cache(d, p)
    if cache is None:
        return None
    if d.b_dec_in:
        x = x - p["b_dec"]  # type: ignore[operator]
    lead, n, width = x.shape[:-1], x.shape[-1], d.width
    flat = x.reshape(-1, n)
    tokens = flat.shape[0]
    found = candidates(d, flat, cache)
    if found is None:
        return None
    lat, tok = (
        found if isinstance(found, tuple) else found.nonzero().unbind(1)
    )  # latent-major: each encoder row is read once, the input rows stay in cache
    crow = torch.zeros(width + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(lat, minlength=width), 0, out=crow[1:])
    with warnings.catch_warnings():  # "sparse CSR support is in beta": sampled_addmm is all it is used for
        warnings.simplefilter("ignore", UserWarning)
        pattern = torch.sparse_csr_tensor(
            crow, tok, torch.zeros(tok.shape[0]), size=(width, tokens), check_invariants=False
        )
    s = torch.sparse.sampled_addmm(pattern, cache.W_t, flat.t(), beta=0.0).values()
    y = s + cache.b[lat]  # fl(s + b), as the dense encoder's add
    if d.activation != "topk":  # only the active candidates are written (the writes are scattered)
        keep = (y > (0 if d.activation == "relu" else cache.threshold[lat])).nonzero().squeeze(1)  # type: ignore[index]
        at, y = (tok * width + lat)[keep], y[keep]
    else:  # topk among each token's candidates, which hold every latent of the dense top k
        assert d.k is not None
        order = torch.argsort(tok, stable=True)
        lat, tok, y = lat[order], tok[order], y[order]
        counts = torch.bincount(tok, minlength=tokens)
        most = int(counts.max())
        if int(counts.min()) < d.k:  # pragma: no cover - a token has at least k candidates (its k largest ℓ)
            raise ArithmeticError("the TopK screen kept fewer than k candidates")
        start = torch.cumsum(counts, 0) - counts
        pos = torch.arange(tok.shape[0]) - start[tok]
        padded = torch.full((tokens, most), -math.inf, dtype=x.dtype)
        padded[tok, pos] = y
        index = torch.zeros((tokens, most), dtype=torch.int64)
        index[tok, pos] = lat
        top = torch.topk(padded, d.k, dim=1)
        lat = index.gather(1, top.indices).reshape(-1)
        tok = torch.arange(tokens).repeat_interleave(d.k)
        y = top.values.reshape(-1).clamp_min_(0)
        at = tok * width + lat
    out = torch.zeros(tokens * width, dtype=x.dtype)
    out.put_(at, y)
    return out.view(*lead, width)
