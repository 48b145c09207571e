"""The exact bfloat16-screened encoder (models/screen.py): its bound holds, tightly, on inputs built to break it;
on pre-activations placed at the threshold to within bfloat16's error, the screened encode has the dense
float32 encode's active set and values, checked against float64 (up to the float32 rounding of the dot
product itself, which neither path can avoid); a screen without its bound gets them wrong on the same data."""

from __future__ import annotations

import pytest
import torch

from streetlamp.models import screen
from streetlamp.models.features import Dictionary

N, WIDTH, BASES, COPIES = 64, 256, 16, 8
GROUP = WIDTH // BASES


@pytest.fixture(autouse=True)
def _screen_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """The screen at test sizes, for every activation, on any CPU (an emulated bfloat16 product accumulates in
    float32 too)."""
    monkeypatch.setattr(screen, "MIN_WIDTH", 0)
    monkeypatch.setattr(screen, "NATIVE_BF16", True)
    monkeypatch.setattr(screen, "ACTIVATIONS", ("relu", "jumprelu", "topk"))


def _dense(d: Dictionary, x: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> torch.Tensor:
    with monkeypatch.context() as m:
        m.setattr(screen, "ENABLED", False)
        return d.encode(x)


def adversarial(act: str, seed: int = 0) -> tuple[Dictionary, torch.Tensor]:
    """BASES groups of COPIES near-copies of a token (relative perturbations of 2^-8, bfloat16's rounding);
    latent group g is placed at base token g's threshold (ReLU / JumpReLU; for TopK, GROUP near-ties far
    above the other latents): each latent's offset from the threshold (from the tie) is a random fraction of
    the bfloat16 error scale ``2^-8 ‖x‖ ‖w‖ / √n``, so the copies' pre-activations straddle it."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(BASES, N, generator=g) * (1 + 4 * torch.rand(N, generator=g))  # uneven dimensions
    x = base.repeat_interleave(COPIES, 0) * (1 + 2**-8 * torch.randn(BASES * COPIES, N, generator=g))
    x = x.float()
    owner = torch.arange(WIDTH) // GROUP  # latent j sits at base token owner[j]'s threshold
    # group g's columns lean towards base g: far above the other bases' tokens, whose latents are far below
    W = torch.randn(N, WIDTH, generator=g) / N**0.5 + (base / base.norm(dim=1, keepdim=True))[owner].t()
    s64 = base.double() @ W.double()
    scale = 2**-8 * base.norm(dim=1).double()[owner] * W.double().norm(dim=0) / N**0.5
    offset = (2 * torch.rand(WIDTH, generator=g, dtype=torch.float64) - 1) * 2 * scale
    theta = torch.rand(WIDTH, generator=g) * 0.5 if act == "jumprelu" else None
    b = -s64[owner, torch.arange(WIDTH)] + offset + (theta.double() if theta is not None else 0)
    d = Dictionary(
        0,
        "mlp",
        W,
        b.float(),
        torch.randn(WIDTH, N, generator=g),
        torch.zeros(N),
        activation=act,  # type: ignore[arg-type]
        k=GROUP // 4 if act == "topk" else None,
        threshold=theta,
    )
    return d, x


def float64_truth(d: Dictionary, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``y = x·w + b`` in float64 (exact to 2^-53 n relative) and the float32 rounding ``tol`` of it that no
    float32 encoder avoids: ``2 γ_n Σ|x_i w_i| + 2^-23 (|y| + |b|)`` (two float32 dot products of any order,
    and the bias's add)."""
    y = x.double() @ d.W_enc.double() + d.b_enc.double()
    mag = x.double().abs() @ d.W_enc.double().abs()
    tol = 2 * screen.gamma(x.shape[-1]) * mag + 2.0**-23 * (y.abs() + d.b_enc.double().abs())
    return y, tol


def check_against_truth(d: Dictionary, x: torch.Tensor, got: torch.Tensor, dense: torch.Tensor) -> int:
    """Both encodes agree with float64 everywhere outside the rounding band; returns the number of entries
    near the threshold (within 4 of the screen's bounds), to show the data tests something."""
    y, tol = float64_truth(d, x)
    if d.activation == "topk":
        assert d.k is not None
        kth = y.topk(d.k + 1, dim=1).values
        # a token whose k-th and (k+1)-th latents are tied within rounding has no defined top k
        clear = (kth[:, d.k - 1] - kth[:, d.k]) > 2 * tol.max(dim=1).values
        keep = y >= kth[:, d.k - 1 : d.k]
        want = keep & (y > 0)
        ambiguous = ~clear[:, None].expand_as(y) | ((y.abs() <= tol) & keep)
        unclear = int((~clear).sum())  # rows
    else:
        theta = d.threshold.double() if d.threshold is not None else torch.zeros(WIDTH, dtype=torch.float64)
        want = y > theta
        ambiguous = (y - theta).abs() <= tol
        unclear = int(ambiguous.sum())  # entries
    for enc in (got, dense):
        active = enc != 0
        assert torch.equal(active[~ambiguous], want[~ambiguous])
        assert bool(((enc.double() - y).abs() <= tol)[active].all())
    both = (got != 0) & (dense != 0)
    assert bool(((got.double() - dense.double()).abs() <= 2 * tol)[both].all())
    assert unclear <= x.shape[0] // 4  # rounding ties are rare; the adversarial band is not
    near = screen.bound(x, screen._cache(d, d.params(x)), WIDTH)  # type: ignore[arg-type]
    if d.activation == "topk":
        return int(((y - kth[:, d.k - 1 : d.k]).abs() <= 4 * near).sum())
    return int(((y - theta).abs() <= 4 * near).sum())


@pytest.mark.parametrize("act", ["relu", "jumprelu", "topk"])
def test_screened_encode_is_the_dense_encode(act: str, monkeypatch: pytest.MonkeyPatch) -> None:
    d, x = adversarial(act)
    with torch.no_grad():
        dense = _dense(d, x, monkeypatch)
        assert screen.screenable(d, x)
        got = screen.encode(d, x)
    assert got is not None and got.shape == dense.shape
    near = check_against_truth(d, x, got, dense)
    assert near >= 200  # many pre-activations within the screen's reach of the threshold (or of the k-th)
    assert int((dense != 0).sum()) > 0 and int((dense == 0).sum()) > 0
    # the candidates hold every latent the dense encode keeps
    found = screen.candidates(d, x, screen._cache(d, d.params(x)))  # type: ignore[arg-type]
    assert found is not None
    mask = torch.zeros(WIDTH, x.shape[0], dtype=torch.bool)
    if isinstance(found, tuple):
        mask[found[0], found[1]] = True
    else:
        mask = found
    assert bool(mask.t()[dense != 0].all())
    # a token count that is not a multiple of four (the sign test a word at a time does not apply)
    with torch.no_grad():
        odd = screen.encode(d, x[:-1])
    assert odd is not None
    check_against_truth(d, x[:-1], odd, dense[:-1])
    # through Dictionary.encode, with leading dimensions and an SAE's b_dec_in
    b_dec = torch.randn(N) * 0.1
    d = Dictionary(0, "mlp", d.W_enc, d.b_enc, d.W_dec, b_dec, d.activation, d.k, d.threshold, b_dec_in=True)
    x3 = (x + b_dec).reshape(BASES, COPIES, N)
    with torch.no_grad():
        want = _dense(d, x3, monkeypatch)
        got3 = d.encode(x3)
    assert got3.shape == (BASES, COPIES, WIDTH)
    check_against_truth(d, x, got3.reshape(-1, WIDTH), want.reshape(-1, WIDTH))


@pytest.mark.parametrize("act", ["relu", "jumprelu", "topk"])
def test_screen_without_its_bound_fails(act: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same data through a screen whose bound is zero (the bfloat16 values taken as exact, TopK's output
    rounding too): it misses latents the dense encode keeps, so the test above can fail."""
    d, x = adversarial(act)
    with torch.no_grad():
        dense = _dense(d, x, monkeypatch)
        monkeypatch.setattr(screen, "_round_up_bf16", lambda v: torch.zeros(v.shape, dtype=torch.bfloat16))
        monkeypatch.setattr(screen, "U", 0.0)
        got = screen.encode(d, x)
    assert got is not None
    missed = (dense != 0) & (got == 0)
    assert int(missed.sum()) >= 5


def aligned(n: int = 576, seed: int = 1) -> torch.Tensor:
    """Entries ``±2^e (1 + 2^-8 - 2^-20)``: bfloat16 rounds each down by almost its whole unit roundoff, so the
    residual is parallel to the rounded vector, the case where the Cauchy-Schwarz bound is attained."""
    g = torch.Generator().manual_seed(seed)
    sign = torch.randint(0, 2, (n,), generator=g) * 2 - 1
    e = torch.randint(-6, 3, (n,), generator=g)
    return (sign * 2.0 ** e.double() * (1 + 2**-8 - 2**-20)).float()


def test_bound_holds_and_is_tight_on_aligned_rounding() -> None:
    """A latent whose encoder column is the input itself, both rounded down by ~2^-8 in every entry: the
    bfloat16 product misses ``2c‖x̂‖² + c²‖x̂‖²`` (``c = 2^-8 - 2^-20``), which is exactly the bound's residual
    terms. The error is within the bound and at least 0.95 of it (a bound missing a term would fail one way,
    a loose one the other); random columns and inputs beside it stay within it too."""
    n = 576
    v = aligned(n)
    g = torch.Generator().manual_seed(2)
    W = torch.randn(n, 1024, generator=g) / n**0.5
    W[:, 0] = v
    W[:, 1] = -v
    x = torch.cat([v[None], torch.randn(63, n, generator=g) * 3])
    d = Dictionary(0, "mlp", W, torch.zeros(1024), torch.randn(1024, n), torch.zeros(n))
    cache = screen._cache(d, d.params(x))
    assert cache is not None
    E = screen.bound(x, cache, 1024)
    x_hat, w_hat = x.bfloat16().double(), W.bfloat16().double()
    err = (x.double() @ W.double() - x_hat @ w_hat).abs()
    # plus the dense float32 product's own rounding, which the bound also covers
    err = err + screen.gamma(n) * (x.double().abs() @ W.double().abs())
    assert bool((err <= E).all())
    ratio = err[0, :2] / E[0, :2]
    assert float(ratio.min()) >= 0.95 and float(ratio.max()) <= 1.0


@pytest.mark.parametrize("act", ["relu", "jumprelu", "topk"])
def test_aligned_latent_just_above_threshold_is_kept(act: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The aligned latent with its threshold 90% of the way from its bfloat16 value to its float32 value
    (TopK, k = 1: a rival latent there): active in the dense encode, below the threshold (behind the rival) by
    the bfloat16 product; the screen keeps it, with its value. The bound must reach 90% of the way: half of
    it (one of its two terms) would not."""
    n = 576
    v = aligned(n)
    g = torch.Generator().manual_seed(3)
    W = torch.randn(n, 1024, generator=g) / n**0.5
    W[:, 0] = v
    x = torch.cat([v[None], torch.randn(7, n, generator=g)])
    exact = float(v.double() @ v.double())
    low = float(v.bfloat16().double() @ v.bfloat16().double())
    cut = exact - 0.1 * (exact - low)
    theta = torch.full((1024,), 0.5) if act == "jumprelu" else None
    b = torch.full((1024,), -50.0, dtype=torch.float64)
    if act == "topk":
        b[0] = 0
        b[1] = cut - float(v.double() @ W[:, 1].double())  # the rival: cut exactly, well above any bf16 error
    else:
        b[0] = -cut + (0.5 if act == "jumprelu" else 0)
    d = Dictionary(
        0,
        "mlp",
        W,
        b.float(),
        torch.randn(1024, n),
        torch.zeros(n),
        activation=act,  # type: ignore[arg-type]
        threshold=theta,
        k=1 if act == "topk" else None,
    )
    with torch.no_grad():
        dense = _dense(d, x, monkeypatch)
        got = screen.encode(d, x)
    assert got is not None
    _, tol = float64_truth(d, x)  # y[0, 0] is a small difference of large numbers: float32 rounds it coarsely
    assert float(dense[0, 0]) > 0 and abs(float(got[0, 0]) - float(dense[0, 0])) <= 2 * float(tol[0, 0])
    assert 0.1 * (exact - low) > 10 * float(tol[0, 0])  # the margin is far outside float32's rounding
    assert torch.equal(got != 0, dense != 0)
    with torch.no_grad():
        monkeypatch.setattr(screen, "_round_up_bf16", lambda v: torch.zeros(v.shape, dtype=torch.bfloat16))
        monkeypatch.setattr(screen, "U", 0.0)
        d._screened.clear()
        naive = screen.encode(d, x)
    assert naive is not None and float(naive[0, 0]) == 0  # what the bound is for


def test_where_the_screen_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dense where a gradient is needed, for float64, a non-CPU-bf16 machine, narrow dictionaries and TopK by
    default; the cache follows a weight changed in place."""
    d, x = adversarial("relu")
    with torch.no_grad():
        assert screen.screenable(d, x)
        assert not screen.screenable(d, x.double())
    xg = x.clone().requires_grad_(True)
    assert not screen.screenable(d, xg)  # grad enabled and x requires grad
    out = d.encode(xg)
    assert out.grad_fn is not None  # the dense path, differentiable
    with torch.no_grad():
        assert screen.screenable(d, xg)
    monkeypatch.setattr(screen, "NATIVE_BF16", False)
    with torch.no_grad():
        assert not screen.screenable(d, x)
    monkeypatch.setattr(screen, "NATIVE_BF16", True)
    monkeypatch.setattr(screen, "MIN_WIDTH", WIDTH + 1)
    with torch.no_grad():
        assert not screen.screenable(d, x)
    monkeypatch.setattr(screen, "MIN_WIDTH", 0)
    monkeypatch.undo()
    assert "topk" not in screen.ACTIVATIONS
    # a weight changed in place: the screen's cached copies are rebuilt
    monkeypatch.setattr(screen, "MIN_WIDTH", 0)
    monkeypatch.setattr(screen, "NATIVE_BF16", True)
    with torch.no_grad():
        first = d.encode(x)
        d.W_enc.mul_(-1)
        d.b_enc.mul_(-1)
        got = d.encode(x)
        want = _dense(d, x, monkeypatch)
    assert not torch.equal(first != 0, got != 0)
    check_against_truth(d, x, got, want)
