"""Tests for perturb.boxes.expected_volumes: boxes perturbed by any noise object.

References: the Gumbel closed form (``volume(intersection(...))``, itself tested against mpmath
in test_volumes.py), the closed form of one box under Normal noise (the side U − L is Gaussian),
mpmath at 40 digits, Monte Carlo with 400k draws, float64 gradcheck, the hard volume as the
zero-noise limit.
"""
from __future__ import annotations

import math

import mpmath
import numpy as np
import scipy.special
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from perturb.boxes import (Box, containment_prob, expected_volume, intersection,
                           log1m_containment_prob, log_containment_prob, overlap, volume,
                           volume_regularizer)
from perturb.boxes.volumes import _log_volume
from perturb.noise import (Discrete, Gumbel, Logistic, NegativeExponential, Noise, Normal,
                           Uniform)

F64 = torch.float64


class _QuadratureGumbel(Gumbel):
    """Gumbel noise that is not the Gumbel class: takes the quadrature path."""


def _boxes(seed: int, n: int = 6, d: int = 3, spread: float = 2.0) -> tuple[Box, Box]:
    g = torch.Generator().manual_seed(seed)
    lo_a = torch.randn(n, d, generator=g, dtype=F64)
    lo_b = lo_a + 0.3 * torch.randn(n, d, generator=g, dtype=F64)
    up_a = lo_a + spread * torch.rand(n, d, generator=g, dtype=F64) + 0.2
    up_b = lo_b + spread * torch.rand(n, d, generator=g, dtype=F64) + 0.2
    return Box(lo_a, up_a), Box(lo_b, up_b)


def _normal_side(gap: float, sigma: float) -> mpmath.mpf:
    """E[(Z)_+], Z ~ N(gap, 2σ²): s·φ(g/s) + g·Φ(g/s), s = σ√2 (mpmath, 40 digits)."""
    mpmath.mp.dps = 40
    s = mpmath.sqrt(2) * sigma
    t = mpmath.mpf(gap) / s
    return s * mpmath.npdf(t) + gap * mpmath.ncdf(t)


# ------------------------------------------------------------------------------ Gumbel


@pytest.mark.parametrize("beta", [0.01, 0.1, 0.3, 1.0])
def test_gumbel_equals_the_closed_form_of_volume_and_intersection(beta):
    a, b = _boxes(0)
    got = expected_volume(a, b, noise=Gumbel(beta), log=True)
    want = _log_volume(intersection(a, b, beta=beta), "gumbel", beta, None, False)
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-12)
    torch.testing.assert_close(expected_volume(a, noise=Gumbel(beta)), volume(a, beta=beta),
                               rtol=1e-13, atol=0)
    c = Box(a.lower - 0.1, a.upper + 0.2)        # three boxes: the intersection folded
    three = _log_volume(intersection(intersection(a, b, beta), c, beta), "gumbel", beta, None,
                        False)
    torch.testing.assert_close(expected_volume(a, b, c, noise=Gumbel(beta), log=True), three,
                               rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(gap=st.floats(-4.0, 30.0), beta=st.floats(0.02, 2.0), m=st.integers(1, 3),
       shift=st.floats(-0.5, 0.5))
def test_gumbel_quadrature_matches_the_closed_form(gap, beta, m, shift):
    """The generic quadrature with Gumbel noise reproduces the Bessel closed form to 1e-8
    relative over inverted, touching, nested and wide sides (gap in scales of β)."""
    lo = torch.tensor([[0.0], [shift * beta], [-shift * beta]], dtype=F64)[:m]
    up = lo[:1] + gap * beta + torch.tensor([[0.0], [0.3 * beta], [beta]], dtype=F64)[:m]
    boxes = [Box(lo[j], up[j]) for j in range(m)]
    quad = expected_volume(*boxes, noise=_QuadratureGumbel(beta), log=True)
    closed = expected_volume(*boxes, noise=Gumbel(beta), log=True)
    assert abs(float(quad - closed)) <= 1e-8 * max(1.0, abs(float(closed)))


# ------------------------------------------------------------------------------ Normal


@pytest.mark.parametrize("gap", [-6.0, -3.0, -1.0, -0.2, 0.0, 0.3, 1.0, 5.0, 40.0, 400.0])
@pytest.mark.parametrize("sigma", [0.05, 0.3, 1.0])
def test_one_box_under_normal_noise_matches_its_closed_form(gap, sigma):
    """One side perturbed by Normal noise: U − L ~ N(u − l, 2σ²), so E[(U − L)+] has a closed
    form; log space keeps the relative accuracy of sides inverted by up to 120σ (log side
    down to about −3600)."""
    box = Box(torch.tensor([0.7], dtype=F64), torch.tensor([0.7 + gap], dtype=F64))
    got = float(expected_volume(box, noise=Normal(sigma), log=True))
    want = float(mpmath.log(_normal_side(gap, sigma)))
    assert got == pytest.approx(want, rel=1e-11, abs=1e-11)


def _monte_carlo_volumes(noise, draw):
    """The boxes of the Monte Carlo tests, the number of draws and ``n`` draws of vol(a ∩ b)
    and vol(b) with corners perturbed by ``draw(generator, shape)`` (float64 draws of
    ``noise``)."""
    a, b = _boxes(1, n=4)
    n = 400_000
    eps = draw(torch.Generator().manual_seed(2), (4, n, *a.lower.shape))
    lo_a, up_a = a.lower + eps[0], a.upper - eps[1]
    lo_b, up_b = b.lower + eps[2], b.upper - eps[3]
    inter = (torch.minimum(up_a, up_b) - torch.maximum(lo_a, lo_b)).clamp_min(0).prod(-1)
    return a, b, n, inter, (up_b - lo_b).clamp_min(0).prod(-1)


@pytest.mark.parametrize("noise", [Normal(0.3), Logistic(0.2), Normal(0.05)],
                         ids=["normal", "logistic", "narrow-normal"])
def test_monte_carlo_400k(noise):
    """E[vol(a ∩ b)], E[vol(a)] and containment against 400k draws of the perturbed corners:
    within 1% and within 5 standard errors."""
    a, b, n, inter, vol_b = _monte_carlo_volumes(noise, lambda g, shape: noise.sample(
        shape, generator=g).to(F64))
    for draws, got in ((inter, expected_volume(a, b, noise=noise)),
                       (vol_b, expected_volume(b, noise=noise))):
        mean, se = draws.mean(0), draws.std(0) / math.sqrt(n)
        assert bool((mean > 0).all())
        assert float(((got - mean) / mean).abs().max()) < 0.01
        assert float(((got - mean) / se).abs().max()) < 5.0
    ratio = inter.mean(0) / vol_b.mean(0)
    got = containment_prob(a, b, noise=noise)
    assert float(((got - ratio) / ratio).abs().max()) < 0.01


@pytest.mark.parametrize("noise", [Normal(0.3), Logistic(0.2), _QuadratureGumbel(0.2)],
                         ids=["normal", "logistic", "gumbel-quadrature"])
def test_gradcheck_float64(noise):
    a, b = _boxes(3, n=2, d=2)
    lo = a.lower.clone().requires_grad_()
    up = (a.upper - torch.tensor([[0.0, 3.0], [0.0, 0.0]], dtype=F64)).requires_grad_()  # inverted
    fn = lambda lo, up: expected_volume(Box(lo, up), b, noise=noise, log=True)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (lo, up), eps=1e-6, atol=1e-6, rtol=1e-5)
    fn = lambda lo, up: containment_prob(Box(lo, up), b, noise=noise, log=True)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (lo, up), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_gradients_match_the_gumbel_closed_form():
    a, b = _boxes(4)
    grads = []
    for noise in (Gumbel(0.2), _QuadratureGumbel(0.2)):
        lo = a.lower.clone().requires_grad_()
        expected_volume(Box(lo, a.upper), b, noise=noise, log=True).sum().backward()
        grads.append(lo.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-8, atol=1e-10)


# ------------------------------------------------------------------------------ limits, ±inf


@pytest.mark.parametrize("noise", [Normal(1e-7), Logistic(1e-7), Gumbel(1e-7)])
def test_zero_noise_limit_is_the_hard_volume(noise):
    a, b = _boxes(5)
    hard = expected_volume(a, b)
    torch.testing.assert_close(expected_volume(a, b, noise=noise), hard, rtol=1e-5, atol=1e-9)
    assert torch.equal(hard, volume(intersection(a, b)))


@pytest.mark.parametrize("noise", [None, Normal(0.1), Logistic(0.1), Gumbel(0.1)],
                         ids=["hard", "normal", "logistic", "gumbel"])
def test_infinite_corners(noise):
    inf = math.inf
    lo = torch.tensor([[-inf, 0.0], [0.0, 0.0], [inf, 0.0], [0.0, 0.0]], dtype=F64)
    up = torch.tensor([[1.0, 1.0], [1.0, inf], [inf, 1.0], [1.0, -inf]], dtype=F64)
    out = expected_volume(Box(lo, up), noise=noise)
    assert out[0] == inf and out[1] == inf and out[2] == 0 and out[3] == 0
    # a half-line does not constrain an intersection with a bounded box: the bounded box's
    # side (and its gradient) as if alone
    bounded = Box(torch.tensor([[0.0, 0.0]], dtype=F64, requires_grad=True),
                  torch.tensor([[1.0, 2.0]], dtype=F64))
    half = Box(torch.tensor([[-inf, -inf]], dtype=F64), torch.tensor([[inf, 5.0]], dtype=F64))
    both = expected_volume(bounded, half, noise=noise, log=True)
    alone = expected_volume(bounded, noise=noise, log=True)
    assert torch.isfinite(both).all()
    if noise is not None:
        alone_u5 = expected_volume(bounded, Box(torch.tensor([[-1e3, -1e3]], dtype=F64),
                                                torch.tensor([[1e3, 5.0]], dtype=F64)),
                                   noise=noise, log=True)
        torch.testing.assert_close(both, alone_u5, rtol=1e-12, atol=1e-12)
        assert float(both.detach()) <= float(alone.detach()) + 1e-12
        (g,) = torch.autograd.grad(both.sum(), bounded.lower)
        assert torch.isfinite(g).all()


def test_float32_follows_float64():
    a, b = _boxes(6)
    a32, b32 = (Box(x.lower.float(), x.upper.float()) for x in (a, b))
    for noise in (Normal(0.2), Logistic(0.2), Gumbel(0.2)):
        out = expected_volume(a32, b32, noise=noise, log=True)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out.double(), expected_volume(a, b, noise=noise, log=True),
                                   rtol=1e-5, atol=1e-5)


def test_extremes_stay_finite():
    """Coordinates of ±1e4 and a noise scale of 1e-3: finite values and gradients."""
    lo = torch.tensor([[1e4, -1e4, 0.0]], dtype=F64, requires_grad=True)
    up = torch.tensor([[1e4 + 1.0, -1e4 - 1.0, 1e4]], dtype=F64)
    for noise in (Normal(1e-3), Logistic(1e-3), Normal(10.0)):
        out = expected_volume(Box(lo, up), noise=noise, log=True)
        (g,) = torch.autograd.grad(out.sum(), lo)
        assert torch.isfinite(out).all() and torch.isfinite(g).all()


# ------------------------------------------------------------------------------ containment


@pytest.mark.parametrize("noise", [Normal(0.2), Logistic(0.1)])
def test_containment_and_overlap_are_ratios_of_expected_volumes(noise):
    a, b = _boxes(7)
    inter = expected_volume(a, b, noise=noise, log=True)
    la, lb = expected_volume(a, noise=noise, log=True), expected_volume(b, noise=noise, log=True)
    torch.testing.assert_close(log_containment_prob(a, b, noise=noise),
                               (inter - lb).clamp(max=0.0))
    union = torch.logaddexp(la, lb) + torch.log1p(-torch.exp(inter - torch.logaddexp(la, lb)))
    torch.testing.assert_close(overlap(a, b, noise=noise, log=True), inter - union)
    torch.testing.assert_close(log1m_containment_prob(a, b, noise=noise),
                               torch.log(-torch.expm1(log_containment_prob(a, b, noise=noise))))


def test_gumbel_noise_is_the_beta_path():
    a, b = _boxes(8)
    for fn in (containment_prob, overlap, log1m_containment_prob):
        torch.testing.assert_close(fn(a, b, noise=Gumbel(0.1)), fn(a, b, beta=0.1))


# ------------------------------------------------------------------------------ bad input


class _NoCdf(Noise):
    continuous = True

    def sample(self, shape, *, generator=None, dtype=None, device=None):
        return torch.zeros(shape)


class _HalfLine(Noise):
    """A user noise on [0, inf): bounded on one side only (no engine integrates it)."""

    continuous = True
    has_cdf = True
    has_log_prob = True

    @property
    def support(self):
        return (0.0, math.inf)

    def cdf(self, x):
        return -torch.expm1(-x.clamp(min=0))

    def log_prob(self, x):
        return -x


@pytest.mark.parametrize("noise, match", [
    (Discrete([0.0, 1.0], [0.5, 0.5]), "lacks continuous"),
    (_NoCdf(), "lacks has_cdf, has_log_prob"),
    (_HalfLine(), r"support \(0.0, inf\), bounded on one side only"),
    ("gumbel", "must be a perturb.noise.Noise"),
    (Normal, r"got the class Normal; pass noise=Normal\(\)"),
])
def test_noise_without_what_the_quadrature_needs(noise, match):
    a, b = _boxes(9)
    with pytest.raises(ValueError, match=match):
        expected_volume(a, b, noise=noise)
    with pytest.raises(ValueError, match=match):
        containment_prob(a, b, noise=noise)


def test_bad_boxes():
    a, b = _boxes(10)
    with pytest.raises(ValueError, match="at least one box"):
        expected_volume(noise=Normal(0.1))
    with pytest.raises(ValueError, match=r"boxes\[1\] must be a Box"):
        expected_volume(a, a.lower, noise=Normal(0.1))
    with pytest.raises(ValueError, match="dim"):
        expected_volume(a, Box(torch.zeros(4, dtype=F64), torch.ones(4, dtype=F64)))
    with pytest.raises(ValueError, match="dtype"):
        expected_volume(a, Box(b.lower.float(), b.upper.float()))
    with pytest.raises(ValueError, match="broadcast"):
        expected_volume(a, Box(torch.zeros(4, 3, dtype=F64), torch.ones(4, 3, dtype=F64)))
    with pytest.raises(ValueError, match="drop beta"):
        containment_prob(a, b, beta=0.1, noise=Normal(0.1))
    with pytest.raises(ValueError, match="drop temperature"):
        overlap(a, b, temperature=0.1, noise=Normal(0.1))


def _log1m_reference(la, ua, lb, ub, s, kind):
    """log(1 − P(b ⊆ a)) in one dimension by mpmath at 55 digits (1 − F·F cancels ~35 digits
    for deeply nested boxes), the integrals split at 41 points around every peak."""
    mpmath.mp.dps = 55
    F = ((lambda z: mpmath.ncdf(z / s)) if kind == "normal"
         else (lambda z: 1 / (1 + mpmath.e ** (-z / s))))
    g_b = lambda x: F(x - lb) * F(ub - x)                                   # noqa: E731
    lost = lambda x: g_b(x) * (1 - F(x - la) * F(ua - x))                   # noqa: E731
    width = 20 if kind == "normal" else 120
    step = width / 20
    around = lambda c: [c + (i - 20) * step * s for i in range(41)]           # noqa: E731
    delta = mpmath.quad(lost, around((la + lb) / 2)) + mpmath.quad(lost, around((ub + ua) / 2))
    side = mpmath.quad(g_b, [lb - width * s, lb, ub, ub + width * s])
    return float(mpmath.log(delta / side))


def _check_nested_log1m(kind, s, depth, reference, rel):
    """b = [depth·s, 1 − 0.7·depth·s] nested in a = [0, 1] (one dimension): log(1 − P(b ⊆ a))
    equals ``reference(la, ua, lb, ub, s, kind)`` to ``rel``, and its gradient in b's lower
    corner is non-zero and equal to the central difference. Returns the reference value."""
    noise = Normal(s) if kind == "normal" else Logistic(s)
    la, ua, lb, ub = 0.0, 1.0, depth * s, 1.0 - 0.7 * depth * s
    t = lambda v: torch.tensor([v], dtype=F64)                              # noqa: E731
    lower = t(lb).requires_grad_()
    got = log1m_containment_prob(Box(t(la), t(ua)), Box(lower, t(ub)), noise=noise)
    want = reference(la, ua, lb, ub, s, kind)
    assert float(got.detach()) == pytest.approx(want, rel=rel)
    (g,) = torch.autograd.grad(got, lower)
    h = 1e-5 * s
    f = lambda v: float(log1m_containment_prob(Box(t(la), t(ua)), Box(t(v), t(ub)),  # noqa
                                               noise=noise))
    assert float(g) != 0 and float(g) == pytest.approx((f(lb + h) - f(lb - h)) / (2 * h),
                                                       rel=1e-5)
    return want


@pytest.mark.parametrize("kind, s, depths", [("normal", 0.01, (0.5, 8.0, 35.0)),
                                             ("logistic", 0.005, (2.0, 35.0))])
def test_log1m_containment_of_nested_pairs_matches_mpmath(kind, s, depths):
    """A child nested deep in its parent: P rounds to 1 (float64 from about 8σ for Normal), yet
    log(1 − P) keeps 1e-10 relative accuracy and a non-zero gradient (the negative-pair loss),
    equal to the central difference."""
    for depth in depths:
        # the reference's own error here is ~2e-12 (at 90 digits and unit-σ splits the two agree
        # to 1e-16, but that reference takes a minute)
        _check_nested_log1m(kind, s, depth, _log1m_reference, rel=1e-10)


def _log1m_reference_sf(la, ua, lb, ub, s, kind):
    """log(1 − P(b ⊆ a)) in one dimension from scipy's log CDFs on a uniform grid of 10⁶
    points (~400 per scale; the trapezoid rule on a smooth integrand that decays at both ends
    is exact to rounding), in log space with 1 − F(x − l_a) F(u_a − x) written as
    S(x − l_a) + F(x − l_a) S(u_a − x), so nothing cancels at any depth."""
    if kind == "normal":
        log_f = lambda z: scipy.special.log_ndtr(z / s)                     # noqa: E731
    else:
        log_f = lambda z: scipy.special.log_expit(z / s)                    # noqa: E731
    x = np.linspace(la - 0.05, ua + 0.05, 1_000_001)
    log_g_b = log_f(x - lb) + log_f(ub - x)
    log_lost = log_g_b + np.logaddexp(log_f(la - x), log_f(x - la) + log_f(x - ua))
    return float(scipy.special.logsumexp(log_lost) - scipy.special.logsumexp(log_g_b))


@pytest.mark.parametrize("kind, s, depth", [("normal", 0.005, 100.0), ("normal", 0.002, 200.0),
                                            ("logistic", 0.0004, 1200.0)])
def test_log1m_containment_beyond_double_range(kind, s, depth):
    """Nested so deep that 1 − P is below 1e-308 (the lost mass of b, e^{−900} and less): the
    survival-function integrand and the sum over coordinates keep log(1 − P) finite and
    accurate (it was −inf, with NaN gradients, from log1mexp of log h = 0), and the gradient
    equals the central difference."""
    want = _check_nested_log1m(kind, s, depth, _log1m_reference_sf, rel=1e-9)
    assert want < -700                                  # below the double range of 1 − P


def test_log1m_containment_in_two_dims_sums_the_coordinates_without_underflow():
    """d = 2, b deep inside a in both coordinates: log(1 − P) = log(1 − (1 − r₁)(1 − r₂)) is
    log(r₁ + r₂ − r₁r₂) ≈ logaddexp(log r₁, log r₂), computed from the one-dimensional values."""
    noise = Normal(0.01)
    a = Box(torch.tensor([[-10.0, -10.0]], dtype=F64), torch.tensor([[10.0, 10.0]], dtype=F64))
    lo = torch.tensor([[-0.1, -0.2]], dtype=F64, requires_grad=True)
    up = torch.tensor([[0.1, 0.3]], dtype=F64, requires_grad=True)
    got = log1m_containment_prob(a, Box(lo, up), noise=noise)
    ones = [log1m_containment_prob(Box(a.lower[:, i:i + 1], a.upper[:, i:i + 1]),
                                   Box(lo[:, i:i + 1], up[:, i:i + 1]), noise=noise)
            for i in range(2)]
    assert torch.isfinite(got).all() and float(got) < -1e5
    torch.testing.assert_close(got, torch.logaddexp(*ones), rtol=1e-12, atol=0)
    got.sum().backward()
    assert torch.isfinite(lo.grad).all() and torch.isfinite(up.grad).all()


def test_log1m_with_unbounded_and_bounded_pairs_in_one_batch():
    """An unbounded pair takes the limit log(1 − P) from log P; the bounded pairs of the same
    batch keep the direct integral (equal to what they give alone)."""
    inf = math.inf
    a = Box(torch.tensor([[0.0, 0.0], [-inf, 0.0]], dtype=F64),
            torch.tensor([[1.0, 1.0], [inf, 1.0]], dtype=F64))
    b = Box(torch.tensor([[0.2, 0.3], [0.2, 0.3]], dtype=F64),
            torch.tensor([[0.7, 0.6], [0.7, 0.6]], dtype=F64))
    noise = Normal(0.05)
    out = log1m_containment_prob(a, b, noise=noise)
    alone = log1m_containment_prob(a[:1], b[:1], noise=noise)
    torch.testing.assert_close(out[:1], alone, rtol=1e-12, atol=0)
    log_p = log_containment_prob(a[1:], b[1:], noise=noise)
    torch.testing.assert_close(out[1:], torch.log(-torch.expm1(log_p)))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("noise", [Normal(0.1), Logistic(0.1), Gumbel(0.1)])
def test_empty_batches(noise):
    empty = Box(torch.zeros(0, 3, dtype=F64), torch.ones(0, 3, dtype=F64))
    assert expected_volume(empty, empty, noise=noise).shape == (0,)
    assert log1m_containment_prob(empty, empty, noise=noise).shape == (0,)
    assert containment_prob(empty, empty, noise=noise).shape == (0,)


@pytest.mark.parametrize("noise", [Normal(0.2), Logistic(0.1)], ids=["normal", "logistic"])
def test_log1m_gradcheck_float64(noise):
    """The direct log(1 − P) integral: float64 gradcheck in both boxes' corners, one pair
    nested (b inside a), one overlapping."""
    a_lo = torch.tensor([[0.0, 0.0], [0.0, 0.1]], dtype=F64, requires_grad=True)
    a_up = torch.tensor([[1.0, 1.2], [0.6, 0.9]], dtype=F64, requires_grad=True)
    b_lo = torch.tensor([[0.3, 0.2], [0.4, 0.0]], dtype=F64, requires_grad=True)
    b_up = torch.tensor([[0.7, 0.9], [1.1, 0.5]], dtype=F64, requires_grad=True)
    fn = lambda al, au, bl, bu: log1m_containment_prob(Box(al, au), Box(bl, bu),  # noqa: E731
                                                       noise=noise)
    assert torch.autograd.gradcheck(fn, (a_lo, a_up, b_lo, b_up), eps=1e-6, atol=1e-6,
                                    rtol=1e-5)


@pytest.mark.parametrize("noise", [Normal(0.3), Logistic(0.2)], ids=repr)
def test_volume_takes_a_noise(noise):
    """volume(box, noise=N) is expected_volume(box, noise=N); Gumbel(β) is volume(beta=β)."""
    gen = torch.Generator().manual_seed(11)
    lo = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    b = Box(lo, lo + torch.rand(5, 3, generator=gen, dtype=torch.float64) - 0.2)
    torch.testing.assert_close(volume(b, noise=noise, log=True),
                               expected_volume(b, noise=noise, log=True), rtol=0, atol=0)
    torch.testing.assert_close(volume(b, noise=Gumbel(0.3)), volume(b, beta=0.3),
                               rtol=0, atol=0)
    reg = volume_regularizer(b, 0.01, noise=noise, reduction="none")
    vol = volume(b, noise=noise)
    torch.testing.assert_close(reg, torch.where(vol > 0.01, vol, torch.zeros_like(vol)))


@pytest.mark.parametrize("kw,match", [
    (dict(beta=0.1), "drop beta"), (dict(temperature=0.1), "drop temperature"),
    (dict(approx=True), "drop approx"), (dict(method="gumbel"), "drop method"),
])
def test_volume_noise_excludes_the_other_models(kw, match):
    b = Box(torch.zeros(2), torch.ones(2))
    with pytest.raises(ValueError, match=match):
        volume(b, noise=Normal(0.1), **kw)
    with pytest.raises(ValueError, match="bounded on one side only"):
        volume(b, noise=_HalfLine())


@pytest.mark.parametrize("cls", [Normal, Logistic, _QuadratureGumbel],
                         ids=["normal", "logistic", "gumbel"])
def test_sides_of_two_boxes_match_a_finer_rule(cls, monkeypatch):
    """The coarse locating passes and the last pass (twice the width, order 16 for
    Normal/Logistic) against a rule 4× finer than the noise's layout, of order 24, with two
    fine locating passes: random
    pairs and sides inverted by 3 to 600 scales (20 for Gumbel), log sides within 2e-15
    relative; for Logistic noise the quadrature (the closed form of pairs switched off) and
    the two-box closed form both."""
    import perturb.boxes.expected_volumes as ev
    g = torch.Generator().manual_seed(2)
    lo = torch.rand(2, 300, generator=g, dtype=F64)
    up = lo + 0.1 + 0.4 * torch.rand(2, 300, generator=g, dtype=F64)
    # Gumbel sides inverted by 30 scales have log sides of −6.5e6, where the quadrature (old
    # and new) is 1e-10 from the closed form: its deep inversions are tested against it above
    depth = torch.tensor([3.0, 20.0] + ([] if cls is _QuadratureGumbel else [30.0, 100.0, 600.0]),
                         dtype=F64) * 0.1
    k = len(depth)
    lo = torch.cat([lo, torch.stack([torch.zeros(k, dtype=F64), 1.0 + depth])], 1)
    up = torch.cat([up, torch.stack([torch.ones(k, dtype=F64), 2.0 + depth])], 1)
    closed = ev._log_sides(lo, up, cls(0.1))    # Logistic: the two-box closed form
    monkeypatch.setattr(ev, "_LOGISTIC_PAIRS_CLOSED", False)    # the quadrature's rule
    got = ev._log_sides(lo, up, cls(0.1))

    class Fine(cls):
        def quadrature_layout(self, d):
            layout = super().quadrature_layout(d)
            return type(layout)(layout.low, layout.high, layout.width / 4, 24)

    monkeypatch.setattr(ev, "_MAX_PANELS", 4096)
    monkeypatch.setattr(ev, "_SIDE_RULE", {})
    monkeypatch.setattr(ev, "log_side", lambda lo_, up_, x, log_w, noise: torch.logsumexp(
        log_w + ev._log_g(lo_, up_, noise, x), -1))
    want = ev._log_integral
    monkeypatch.setattr(ev, "_log_integral", lambda *args, **kwargs: want(*args))
    ref = ev._log_sides(lo, up, Fine(0.1))
    assert float(((got - ref).abs() / ref.abs().clamp_min(1.0)).max()) < 2e-15
    assert float(((closed - ref).abs() / ref.abs().clamp_min(1.0)).max()) < 2e-15


# ------------------------------------------------------------------------------ bounded noise


_PIECEWISE = [Uniform(-0.3, 0.4), NegativeExponential(0.2)]


@pytest.mark.parametrize("noise", _PIECEWISE, ids=repr)
def test_piecewise_noises_monte_carlo_400k(noise):
    """Uniform and NegativeExponential corners (exact piecewise integrals): E[vol(a ∩ b)],
    E[vol(b)] and containment against 400k draws, within 1% and 5 standard errors."""
    a, b, n, inter, vol_b = _monte_carlo_volumes(noise, lambda g, shape: noise.sample(
        shape, generator=g, dtype=F64))
    for draws, got in ((inter, expected_volume(a, b, noise=noise)),
                       (vol_b, expected_volume(b, noise=noise))):
        mean, se = draws.mean(0), draws.std(0) / math.sqrt(n)
        keep = mean > 0
        assert float(((got - mean) / se)[keep].abs().max()) < 5.0
        assert float(((got - mean) / mean)[keep].abs().max()) < 0.01
        assert bool((got[~keep] == 0).all())
    ratio = inter.mean(0) / vol_b.mean(0)
    got = containment_prob(a, b, noise=noise)
    assert float(((got - ratio) / ratio).abs().max()) < 0.01


@pytest.mark.parametrize("noise", _PIECEWISE, ids=repr)
def test_piecewise_noises_gradcheck(noise):
    a, b = _boxes(3, n=2, d=2)
    lo = a.lower.clone().requires_grad_()
    up = (a.upper + 0.5).requires_grad_()
    for fn in (lambda lo, up: expected_volume(Box(lo, up), b, noise=noise, log=True),
               lambda lo, up: containment_prob(Box(lo, up), b, noise=noise, log=True),
               lambda lo, up: log1m_containment_prob(Box(lo, up), b, noise=noise)):
        assert torch.autograd.gradcheck(fn, (lo, up))


@pytest.mark.parametrize("noise", [Uniform(-1e-9, 1e-9), NegativeExponential(1e-9)], ids=repr)
def test_piecewise_zero_noise_limit_is_the_hard_volume(noise):
    a, b = _boxes(5)
    torch.testing.assert_close(expected_volume(a, b, noise=noise), expected_volume(a, b),
                               rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("noise", _PIECEWISE, ids=repr)
def test_piecewise_infinite_corners(noise):
    inf = math.inf
    lo = torch.tensor([[-inf, 0.0], [0.0, 0.0], [inf, 0.0], [0.0, 0.0]], dtype=F64)
    up = torch.tensor([[1.0, 1.0], [1.0, inf], [inf, 1.0], [1.0, -inf]], dtype=F64)
    out = expected_volume(Box(lo, up), noise=noise)
    assert out[0] == inf and out[1] == inf and out[2] == 0 and out[3] == 0
    bounded = Box(torch.tensor([[0.0, 0.0]], dtype=F64), torch.tensor([[1.0, 2.0]], dtype=F64))
    half = Box(torch.tensor([[-inf, -inf]], dtype=F64), torch.tensor([[inf, 5.0]], dtype=F64))
    stand_in = Box(torch.tensor([[-1e3, -1e3]], dtype=F64), torch.tensor([[1e3, 5.0]], dtype=F64))
    torch.testing.assert_close(expected_volume(bounded, half, noise=noise, log=True),
                               expected_volume(bounded, stand_in, noise=noise, log=True),
                               rtol=1e-12, atol=1e-12)


def test_uniform_disjoint_boxes_have_zero_volume_and_zero_gradients():
    """Uniform corners cannot bridge a gap wider than the support: E[vol] = 0 exactly, log
    −inf, containment 0, log(1 − P) = 0, and every gradient 0 (not NaN)."""
    noise = Uniform(-0.1, 0.1)
    lo = torch.tensor([[0.0, 0.0]], dtype=F64, requires_grad=True)
    a = Box(lo, torch.tensor([[1.0, 1.0]], dtype=F64))
    b = Box(torch.tensor([[1.5, 0.0]], dtype=F64), torch.tensor([[2.0, 1.0]], dtype=F64))
    assert float(expected_volume(a, b, noise=noise, log=True).detach()) == -math.inf
    assert float(containment_prob(a, b, noise=noise).detach()) == 0.0
    out = log1m_containment_prob(b, a, noise=noise) + containment_prob(a, b, noise=noise)
    assert float(out.detach()) == 0.0
    (g,) = torch.autograd.grad(out, lo)
    assert torch.equal(g, torch.zeros_like(g))


@pytest.mark.parametrize("noise", _PIECEWISE, ids=repr)
def test_piecewise_log1m_of_nested_pairs(noise):
    """b nested in a = [0, 1]: log(1 − P) from the lost side (exact pieces) equals the
    difference of the two sides where that is well conditioned (depth 0), and stays finite
    and exact where the difference cancels: Uniform at a depth where b's support just pokes
    out of the region where h_a = 1, NegativeExponential 60 scales deep (1 − P ~ e^−60)."""
    t = lambda v: torch.tensor([[v]], dtype=F64)                            # noqa: E731
    a = Box(t(0.0), t(1.0))
    shallow = Box(t(0.05), t(0.9))
    log_p = log_containment_prob(a, shallow, noise=noise)
    torch.testing.assert_close(log1m_containment_prob(a, shallow, noise=noise),
                               torch.log(-torch.expm1(log_p)), rtol=1e-12, atol=0)
    if isinstance(noise, Uniform):         # h_a = 1 on [0.4, 2.6]; b's support from 0.4 − 1e−7
        a, deep = Box(t(0.0), t(3.0)), Box(t(0.7 - 1e-7), t(1.0))
    else:                                   # 60 scales inside both ends of a
        a, deep = Box(t(0.0), t(30.0)), Box(t(12.0), t(18.0))
    got = float(log1m_containment_prob(a, deep, noise=noise))
    assert math.isfinite(got) and got < math.log(1e-9)


def test_uniform_child_of_zero_expected_volume_is_contained_like_an_empty_hard_box():
    """b inverted beyond what Uniform corners can bridge: E[vol(b)] = 0 exactly, so P(b ⊆ a)
    is 0/0, defined as for an empty hard box: P = 1, log(1 − P) = −inf, gradients 0."""
    noise = Uniform(-0.1, 0.1)
    lo = torch.tensor([[0.5, 0.2]], dtype=F64, requires_grad=True)
    a = Box(torch.tensor([[0.0, 0.0]], dtype=F64), torch.tensor([[1.0, 1.0]], dtype=F64))
    b = Box(lo, torch.tensor([[-0.5, 0.8]], dtype=F64))
    assert float(expected_volume(b, noise=noise).detach()) == 0.0
    assert float(containment_prob(a, b, noise=noise).detach()) == 1.0
    out = log1m_containment_prob(a, b, noise=noise)
    assert float(out.detach()) == -math.inf
    (g,) = torch.autograd.grad(out.sum() + log_containment_prob(a, b, noise=noise).sum(), lo)
    assert torch.equal(g, torch.zeros_like(g))


def _normal_side_mpmath(lo, up, sigma):
    """log ∫ Π_j Φ((x − l_j)/σ) Π_j Φ((u_j − x)/σ) dx by mpmath.quad at 30 digits, split at
    the corners (the integrand's bends)."""
    with mpmath.workdps(30):
        lo = [mpmath.mpf(float(v)) for v in lo]
        up = [mpmath.mpf(float(v)) for v in up]
        s = mpmath.mpf(sigma)
        f = lambda x: mpmath.fprod([mpmath.ncdf((x - l) / s) for l in lo]      # noqa: E731
                                   + [mpmath.ncdf((u - x) / s) for u in up])
        pts = sorted(lo + up)
        edges = mpmath.linspace(pts[0] - 40 * s, pts[-1] + 40 * s, 400)
        return float(mpmath.log(mpmath.quad(f, sorted(set(edges) | set(pts)))))


def test_normal_sides_on_both_sides_of_the_inversion_switch():
    """Normal sides locate their peak only where inverted (min u < max l): sides just inverted,
    just not, coincident corners and deeper inversions, in one batch with sides that are not
    inverted (the located rows are a subset), against mpmath to 1e-14 relative on the log
    side, each equal to itself computed alone (fewer panels: 2e-15), and a float64
    gradcheck across the switch."""
    import perturb.boxes.expected_volumes as ev
    s = 0.1
    gaps = [-1e-9, 0.0, 1e-9, -0.05, 0.05, -0.3, 0.3, -1.5]
    lo = torch.tensor([[0.0] * len(gaps), [0.02, 0.0, -0.1, 0.0, 0.01, -0.05, 0.0, 0.0]],
                      dtype=F64)
    up = torch.stack([torch.tensor(gaps, dtype=F64), torch.tensor(gaps, dtype=F64) + 0.07])
    up[1, 1] = 0.0                                               # four coincident corners
    got = ev._log_sides(lo, up, Normal(s))
    for i in range(len(gaps)):
        want = _normal_side_mpmath(lo[:, i], up[:, i], s)
        assert abs(float(got[i]) - want) <= 1e-14 * max(1.0, abs(want)), (gaps[i], want)
        alone = ev._log_sides(lo[:, i:i + 1], up[:, i:i + 1], Normal(s))
        torch.testing.assert_close(got[i:i + 1], alone, rtol=2e-15, atol=2e-15)
    lo_, up_ = lo[:, 1:5].clone().requires_grad_(), up[:, 1:5].clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda l, u: ev._log_sides(l, u, Normal(s)), (lo_, up_))
