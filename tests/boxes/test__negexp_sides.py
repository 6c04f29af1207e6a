"""Tests for perturb.boxes._negexp_sides: the closed forms of expected sides under
NegativeExponential noise, against mpmath at 40 digits (the defining integral split at the
corners), Monte Carlo, float64 gradcheck, finiteness far beyond the double range, and the lost
side of nested pairs on both branches of its difference term."""
from __future__ import annotations

import math

import mpmath
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from perturb.boxes._negexp_sides import log_lost_side, log_sides
from perturb.noise import NegativeExponential

from _draws import perturbed_side

F64 = torch.float64


def _reference(lo: list[float], up: list[float], s: float, lost_of: tuple | None = None
               ) -> float:
    """log ∫ Π F(x − l_j) Π F(u_j − x) dx (times 1 − h_a when ``lost_of = (l_a, u_a)``),
    ``F(z) = min(1, e^{z/s})``, at 40 digits."""
    with mpmath.workdps(40):
        s_m = mpmath.mpf(s)

        def F(z):
            return mpmath.e ** (z / s_m) if z < 0 else mpmath.mpf(1)

        lo_m, up_m = [mpmath.mpf(v) for v in lo], [mpmath.mpf(v) for v in up]

        def g(x):
            out = mpmath.mpf(1)
            for v in lo_m:
                out *= F(x - v)
            for v in up_m:
                out *= F(v - x)
            if lost_of:
                la, ua = (mpmath.mpf(v) for v in lost_of)
                out *= 1 - F(x - la) * F(ua - x)
            return out

        # split at the corners, and every piece into steps of s (the integrand's exponentials
        # vary on that scale: one piece of 100·s loses digits in mpmath's rule)
        corners = sorted({mpmath.mpf(v) for v in lo + up + list(lost_of or ())})
        pts = [corners[0] - s_m * 2 ** i for i in range(6, -1, -1)]
        for a, b in zip(corners, corners[1:]):
            n = min(int((b - a) / s_m) + 1, 400)
            pts += [a + (b - a) * i / n for i in range(n)]
        pts += [corners[-1]] + [corners[-1] + s_m * 2 ** i for i in range(7)]
        return float(mpmath.log(mpmath.quad(g, [-mpmath.inf, *pts, mpmath.inf])))


def _t(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=F64).reshape(-1, 1, 1)


@pytest.mark.parametrize("lo,up", [
    ([0.0], [1.0]), ([0.0], [-0.5]), ([0.0], [0.0]),                 # one box, inverted, point
    ([0.0, 0.3], [1.0, 0.9]), ([0.0, 0.0], [1.0, 1.0]),              # nested, identical
    ([0.0, 2.0], [1.0, 3.0]), ([0.0, 0.2, 0.4], [1.0, 1.1, 0.9]),    # disjoint, three boxes
])
@pytest.mark.parametrize("s", [0.01, 0.3, 2.0])
def test_sides_match_mpmath(lo, up, s):
    got = float(log_sides(_t(lo), _t(up), NegativeExponential(s)))
    assert got == pytest.approx(_reference(lo, up, s), rel=1e-13, abs=1e-13)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.floats(-2, 2), st.floats(0.0, 3.0)), min_size=1, max_size=3),
       st.floats(0.2, 2.0))
def test_sides_property(boxes, s):
    lo = [b[0] for b in boxes]
    up = [b[0] + b[1] - 1.0 for b in boxes]
    got = float(log_sides(_t(lo), _t(up), NegativeExponential(s)))
    assert got == pytest.approx(_reference(lo, up, s), rel=1e-12, abs=1e-12)


def test_far_beyond_the_double_range():
    """Disjoint by 19 with s = 1e−3 (the side is about e^−19000): finite and exact in log space.
    By hand: h = −19/s on [1, 20], rising/falling by 1/s over [0, 1] and [20, 21], tails of
    slope 2/s beyond, so the side is e^{−19/s} (19 + 2s(1 − e^{−1/s}) + s e^{−1/s})."""
    s = 1e-3
    got = float(log_sides(_t([0.0, 20.0]), _t([1.0, 21.0]), NegativeExponential(s)))
    want = -19 / s + math.log(19 + 2 * s * (1 - math.exp(-1 / s)) + s * math.exp(-1 / s))
    assert got == pytest.approx(want, rel=1e-14)


def test_monte_carlo():
    noise = NegativeExponential(0.3)
    lo, up = torch.tensor([0.0, 0.3], dtype=F64), torch.tensor([1.0, 0.9], dtype=F64)
    mean, se = perturbed_side(noise, lo, up)
    exact = float(log_sides(lo.reshape(2, 1, 1), up.reshape(2, 1, 1), noise).exp())
    assert abs(mean - exact) < 4 * se


@pytest.mark.parametrize("m", [1, 2, 3])
def test_gradcheck(m):
    g = torch.Generator().manual_seed(m)
    lo = torch.rand(m, 2, 3, dtype=F64, generator=g).requires_grad_()
    up = (lo.detach() - 0.5 + 2 * torch.rand(m, 2, 3, dtype=F64, generator=g)).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: log_sides(a, b, NegativeExponential(0.3)),
                                    (lo, up))


@pytest.mark.parametrize("b", [(0.5, 1.5), (0.05, 2.9), (1.0, 1.2), (2.8, 3.6), (-1.0, 4.0),
                               (1.0, 1.0 + 1e-9), (1.0, 1.1), (2.9, 2.95), (-0.2, 0.1)])
def test_lost_side_matches_mpmath(b):
    """b against a = [0, 3]: inside, deep inside, sticking out, containing a, and pieces both
    narrower (the Gauss–Legendre branch) and wider than s (the closed-form branch)."""
    s = 0.3
    la, ua = torch.zeros(1, dtype=F64), torch.full((1,), 3.0, dtype=F64)
    lb, ub = torch.tensor([b[0]], dtype=F64), torch.tensor([b[1]], dtype=F64)
    got = float(log_lost_side(la, ua, lb, ub, NegativeExponential(s)))
    assert got == pytest.approx(_reference([b[0]], [b[1]], s, lost_of=(0.0, 3.0)), rel=1e-13)


def test_lost_side_deep_inside_beyond_cancellation():
    """b 40·s inside each end of a: δ/s_b ~ e^−40, where s_b − s_ab in float64 is 0 or noise;
    the closed form matches mpmath."""
    s = 0.05
    la, ua = torch.zeros(1, dtype=F64), torch.full((1,), 5.0, dtype=F64)
    lb, ub = torch.tensor([2.0], dtype=F64), torch.tensor([3.0], dtype=F64)
    got = float(log_lost_side(la, ua, lb, ub, NegativeExponential(s)))
    want = _reference([2.0], [3.0], s, lost_of=(0.0, 5.0))
    assert want < math.log(1e-15) and got == pytest.approx(want, rel=1e-12)


def test_lost_side_gradcheck():
    la = torch.tensor([0.0, 0.1, 0.0], dtype=F64, requires_grad=True)
    ua = torch.tensor([3.0, 2.5, 1.0], dtype=F64, requires_grad=True)
    lb = torch.tensor([0.2, 0.7, 0.5], dtype=F64, requires_grad=True)
    ub = torch.tensor([1.3, 2.4, 0.55], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda *c: log_lost_side(*c, NegativeExponential(0.3)), (la, ua, lb, ub))
