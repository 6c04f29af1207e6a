"""Tests for perturb.boxes._noise_sides: the closed forms of one perturbed box's expected side
under Normal and Logistic noise, against mpmath at 40 digits (the defining integral
E[(g − S)+] = ∫_{−∞}^g F_S), against the generic quadrature (a subclass, which takes it), float64
gradcheck across the regimes, and finiteness at extreme gaps."""
from __future__ import annotations

import math

import mpmath
import pytest
import torch

from perturb.boxes._noise_sides import _CF_FROM, side_closed_form
from perturb.boxes.expected_volumes import _log_sides
from perturb.noise import Gumbel, Logistic, Normal

F64 = torch.float64
GAPS = [-60.0, -8.0, -1.3, -0.57, -0.4, -0.1, -1e-7, 0.0, 1e-7, 0.05, 0.3, 1.0, 3.0, 50.0]


class _QuadratureNormal(Normal):
    """Normal noise that is not the Normal class: the generic quadrature."""


class _QuadratureLogistic(Logistic):
    """Logistic noise that is not the Logistic class: the generic quadrature."""


def _reference(kind: str, gap: float, scale: float) -> float:
    """log E[(g − S)+] at 40 digits: S ~ N(0, 2σ²) (Normal), or the sum of two logistics, by
    integrating its CDF F_S(y) = e^y (e^y − 1 − y)/(e^y − 1)² (scale 1) from −∞ to g/s."""
    with mpmath.workdps(40):
        g, s = mpmath.mpf(gap), mpmath.mpf(scale)
        if kind == "normal":
            t = s * mpmath.sqrt(2)
            z = g / t
            return float(mpmath.log(t * (z * mpmath.ncdf(z) + mpmath.npdf(z))))

        def cdf(y):
            if abs(y) < mpmath.mpf("1e-20"):
                return mpmath.mpf(1) / 2
            e = mpmath.exp(y)
            return e * (e - 1 - y) / (e - 1) ** 2

        y = g / s
        return float(mpmath.log(s * mpmath.quad(cdf, [-mpmath.inf, min(y, 0), y] if y > 0
                                                 else [-mpmath.inf, y])))


@pytest.mark.parametrize("kind", ["normal", "logistic"])
@pytest.mark.parametrize("scale", [0.1, 1.0])
def test_against_mpmath(kind, scale):
    """Relative error of the log side below 1e-14 (absolute where |log side| < 1), through
    every regime: direct, erfcx, the continued fraction (Normal), the series near 0
    (Logistic)."""
    noise = Normal(scale) if kind == "normal" else Logistic(scale)
    got = side_closed_form(noise)(torch.tensor(GAPS, dtype=F64) * scale)
    for g, v in zip(GAPS, got.tolist()):
        want = _reference(kind, g * scale, scale)
        assert v == pytest.approx(want, rel=1e-14, abs=1e-14), g


@pytest.mark.parametrize("noise, quad", [(Normal(0.2), _QuadratureNormal(0.2)),
                                         (Logistic(0.2), _QuadratureLogistic(0.2))])
def test_equals_the_quadrature(noise, quad):
    """The generic quadrature of one box (what a subclass takes) agrees to 1e-13."""
    gap = torch.tensor(GAPS, dtype=F64) * 0.2
    lo = torch.zeros(1, len(GAPS), dtype=F64)
    got = side_closed_form(noise)(gap)
    want = _log_sides(lo, gap.unsqueeze(0), quad)
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("noise", [Normal(0.3), Logistic(0.3)], ids=repr)
def test_gradcheck_float64(noise):
    """float64 gradcheck across the regimes (the gaps avoid the series' |y| < 1e−5 and the
    regime edges, where central differences would straddle two formulas)."""
    gap = torch.tensor([-30.0, -2.5, -0.9, -0.2, 0.2, 1.7, 20.0], dtype=F64) * 0.3
    assert torch.autograd.gradcheck(side_closed_form(noise), (gap.requires_grad_(),))


def test_normal_regimes_join():
    """On both sides of the erfcx/continued-fraction edge (t = 4) the Normal form is within
    1e-14 of mpmath."""
    edge = -_CF_FROM * math.sqrt(2.0)
    gaps = [edge * (1 - 1e-9), edge, edge * (1 + 1e-9)]
    got = side_closed_form(Normal(1.0))(torch.tensor(gaps, dtype=F64))
    for g, v in zip(gaps, got.tolist()):
        assert v == pytest.approx(_reference("normal", g, 1.0), rel=1e-14)


@pytest.mark.parametrize("noise", [Normal(1e-3), Logistic(1e-3)], ids=repr)
def test_extremes_stay_finite(noise):
    """Gaps of ±2e4 at scale 1e−3: finite values and gradients (log sides down to −1e14 for
    Normal, −2e7 for Logistic)."""
    gap = torch.tensor([-2e4, -1.0, 0.0, 1.0, 2e4], dtype=F64, requires_grad=True)
    out = side_closed_form(noise)(gap)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(gap.grad).all()


def test_no_closed_form_for_other_noises():
    """Gumbel (its own closed form lives in volumes.py) and subclasses of Normal/Logistic (a
    subclass may change the law) take the quadrature."""
    assert side_closed_form(Gumbel(0.1)) is None
    assert side_closed_form(_QuadratureNormal(0.1)) is None
    assert side_closed_form(_QuadratureLogistic(0.1)) is None
