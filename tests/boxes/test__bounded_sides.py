"""Tests for perturb.boxes._bounded_sides: expected sides of boxes under noise of bounded
support, against mpmath at 40 digits on the pieces between the kinks (the defining integral),
Monte Carlo, float64 gradcheck, the empty and zero-noise limits, the lost side of nested pairs
and a user noise with a curved CDF."""
from __future__ import annotations

import math

import mpmath
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from perturb.boxes._bounded_sides import is_bounded_noise, log_lost_side, log_sides
from perturb.noise import Gumbel, NegativeExponential, Noise, Normal, Uniform

from _draws import perturbed_side

F64 = torch.float64


class _Arcsine(Noise):
    """A user noise on [−1, 1] with a curved CDF F(x) = (1 + x)²/4 on [−1, 1]: smooth between
    the ends, so the per-piece Gauss–Legendre rule of its layout is accurate, not exact."""

    bounded = True
    continuous = True
    has_cdf = True
    has_log_prob = True

    @property
    def support(self) -> tuple[float, float]:
        return (-1.0, 1.0)

    def cdf(self, x: torch.Tensor) -> torch.Tensor:
        return ((1 + x.clamp(-1.0, 1.0)) ** 2 / 4)

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log((1 + x) / 2)


def _mp_cdf(noise: Noise, z):
    low, high = (mpmath.mpf(e) for e in noise.support)
    if z <= low:
        return mpmath.mpf(0)
    if z >= high:
        return mpmath.mpf(1)
    if isinstance(noise, Uniform):
        return (z - low) / (high - low)
    return (1 + z) ** 2 / 4


def _reference(lo: list[float], up: list[float], noise: Noise, lost_of: tuple | None = None
               ) -> float:
    """log ∫ Π F(x − l_j) Π F(u_j − x) dx at 40 digits, split at every kink (or the lost side
    ∫ g_b (1 − h_a) when ``lost_of = (l_a, u_a)``)."""
    with mpmath.workdps(40):
        low, high = noise.support
        lo_m, up_m = [mpmath.mpf(v) for v in lo], [mpmath.mpf(v) for v in up]
        corners = lo + up + (list(lost_of) if lost_of else [])
        kinks = sorted({v + o for v in corners for o in (low, high, -low, -high)})

        def g(x):
            out = mpmath.mpf(1)
            for v in lo_m:
                out *= _mp_cdf(noise, x - v)
            for v in up_m:
                out *= _mp_cdf(noise, v - x)
            if lost_of:
                la, ua = (mpmath.mpf(v) for v in lost_of)
                out *= 1 - _mp_cdf(noise, x - la) * _mp_cdf(noise, ua - x)
            return out

        total = mpmath.quad(g, kinks)
        return float(mpmath.log(total)) if total > 0 else -math.inf


def _tensors(lo: list[float], up: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.tensor(lo, dtype=F64).reshape(-1, 1, 1),
            torch.tensor(up, dtype=F64).reshape(-1, 1, 1))


def test_which_noises_are_bounded():
    assert is_bounded_noise(Uniform(-1.0, 2.0)) and is_bounded_noise(_Arcsine())
    for noise in (Gumbel(0.1), Normal(0.1), NegativeExponential(0.1)):
        assert not is_bounded_noise(noise)


@pytest.mark.parametrize("lo,up", [
    ([0.0], [1.0]), ([0.0], [0.2]), ([0.0], [-0.5]),                 # one box: long, short, inverted
    ([0.0, 0.3], [1.0, 0.9]), ([0.0, 0.0], [1.0, 1.0]),              # nested, identical
    ([0.0, 0.8], [1.0, 1.9]), ([0.0, 0.55], [0.5, 1.2]),             # overlapping, barely
    ([0.0, 0.2, 0.4], [1.0, 1.1, 0.9]),                              # three boxes
    ([1e4, 1e4 + 0.3], [1e4 + 1.0, 1e4 + 0.9]),                      # far from the origin
])
@pytest.mark.parametrize("noise", [Uniform(-0.3, 0.5), Uniform(-0.01, 0.01)], ids=repr)
def test_uniform_sides_match_mpmath(lo, up, noise):
    want = _reference(lo, up, noise)
    got = float(log_sides(*_tensors(lo, up), noise))
    if want == -math.inf:
        assert got == -math.inf
    else:
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(-2, 2), st.floats(0.0, 3.0)), min_size=1, max_size=3),
       st.floats(0.01, 1.0), st.floats(0.0, 1.0))
def test_uniform_sides_property(boxes, width, skew):
    """Any boxes (inverted sides included, l > u by up to 1.2) under any uniform noise, exact
    to rounding: the rule is exact for the piecewise polynomials of degree 2m, evaluated in
    float64 at nodes inside the side's support (w = min u − max l − 2a for the support [a, b]).
    Where w is a few ulps of the corners, log side is ill-conditioned: the side ∝ w^(2m+1) near
    the edge, so rounding the corners and nodes by δ ≈ 8·eps·max(1, |corner|) moves its log by
    up to (2m + 1)·δ/w, which the check allows on top of 1e-11 (hypothesis found w = 5.6e-17:
    log side −113.97 against −114.08; the allowance is at most 5e-11 once w ≥ 1e-3)."""
    noise = Uniform(-width * skew, width * (1 - skew) + 1e-3)
    lo = [b[0] for b in boxes]
    up = [b[0] + b[1] - 1.2 for b in boxes]
    want = _reference(lo, up, noise)
    got = float(log_sides(*_tensors(lo, up), noise))
    if want < -600:             # the side underflows the mpmath-to-float comparison: tiny or 0
        assert got < -600 or got == -math.inf
    else:
        low = noise.support[0]
        w = min(up) - max(lo) - 2 * low
        delta = 8 * torch.finfo(F64).eps * max(1.0, *map(abs, lo + up), abs(low))
        conditioning = (2 * len(lo) + 1) * delta / w
        assert abs(got - want) <= 1e-11 * max(1.0, abs(want)) + conditioning


def test_user_noise_with_a_curved_cdf():
    noise = _Arcsine()
    for lo, up in (([0.0, 0.3], [1.0, 0.9]), ([0.0], [2.5]), ([0.0, 1.0], [2.0, 3.5])):
        assert float(log_sides(*_tensors(lo, up), noise)) == pytest.approx(
            _reference(lo, up, noise), rel=1e-12)


def test_monte_carlo():
    """400k draws of the corners: within 4 standard errors of the mean side."""
    noise = Uniform(-0.3, 0.5)
    lo, up = torch.tensor([0.0, 0.3], dtype=F64), torch.tensor([1.0, 0.9], dtype=F64)
    mean, se = perturbed_side(noise, lo, up)
    exact = float(log_sides(lo.reshape(2, 1, 1), up.reshape(2, 1, 1), noise).exp())
    assert abs(mean - exact) < 4 * se


def test_empty_side_is_minus_inf_with_zero_gradient():
    noise = Uniform(-0.3, 0.5)
    lo = torch.tensor([[[0.0]], [[3.0]]], dtype=F64, requires_grad=True)
    up = torch.tensor([[[1.0]], [[4.0]]], dtype=F64, requires_grad=True)
    out = log_sides(lo, up, noise)
    assert out.item() == -math.inf
    out.sum().backward()
    assert torch.equal(lo.grad, torch.zeros_like(lo)) and torch.equal(up.grad, torch.zeros_like(up))


@pytest.mark.parametrize("m", [1, 2, 3])
def test_gradcheck(m):
    g = torch.Generator().manual_seed(m)
    lo = torch.rand(m, 2, 3, dtype=F64, generator=g).requires_grad_()
    up = (lo.detach() + 0.4 + torch.rand(m, 2, 3, dtype=F64, generator=g)).requires_grad_()
    for noise in (Uniform(-0.3, 0.5), _Arcsine()):
        assert torch.autograd.gradcheck(lambda a, b: log_sides(a, b, noise), (lo, up))


def test_zero_noise_limit_is_the_hard_side():
    lo = torch.tensor([[[0.0, 0.1]], [[0.3, -1.0]]], dtype=F64)
    up = torch.tensor([[[1.0, 2.0]], [[0.9, 0.6]]], dtype=F64)
    hard = (up.amin(0) - lo.amax(0)).log()
    got = log_sides(lo, up, Uniform(-1e-9, 1e-9))
    torch.testing.assert_close(got, hard, rtol=0, atol=1e-8)


@pytest.mark.parametrize("b", [(0.5, 1.5), (0.05, 2.9), (0.01, 2.99), (1.0, 1.2), (2.8, 3.6)])
def test_lost_side_matches_mpmath(b):
    """δ = ∫ g_b (1 − h_a): b inside a = [0, 3] (near the ends, deep inside, sticking out)."""
    noise = Uniform(-0.3, 0.5)
    la, ua = torch.zeros(1, dtype=F64), torch.full((1,), 3.0, dtype=F64)
    lb, ub = torch.tensor([b[0]], dtype=F64), torch.tensor([b[1]], dtype=F64)
    got = float(log_lost_side(la, ua, lb, ub, noise))
    want = _reference([b[0]], [b[1]], noise, lost_of=(0.0, 3.0))
    if want == -math.inf:
        assert got == -math.inf
    else:
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_lost_side_is_exact_where_the_difference_cancels():
    """b's support (l_b − 0.3, u_b + 0.3) pokes 1e−6 out of [0.5, 2.5], where h_a = 1: δ is
    tiny against s_b and equals the mpmath value, where s_b − s_ab in float64 would have lost
    every digit."""
    noise = Uniform(-0.3, 0.5)
    la, ua = torch.zeros(1, dtype=F64), torch.full((1,), 3.0, dtype=F64)
    lb, ub = torch.tensor([0.8 - 1e-6], dtype=F64), torch.tensor([1.0], dtype=F64)
    got = float(log_lost_side(la, ua, lb, ub, noise))
    assert got == pytest.approx(_reference([0.8 - 1e-6], [1.0], noise, lost_of=(0.0, 3.0)),
                                rel=1e-10)
    assert got < math.log(1e-15)


def test_lost_side_gradcheck():
    noise = Uniform(-0.3, 0.5)
    la = torch.tensor([0.0, 0.1], dtype=F64, requires_grad=True)
    ua = torch.tensor([3.0, 2.5], dtype=F64, requires_grad=True)
    lb = torch.tensor([0.2, 0.7], dtype=F64, requires_grad=True)
    ub = torch.tensor([1.3, 2.4], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *c: log_lost_side(*c, noise), (la, ua, lb, ub))
