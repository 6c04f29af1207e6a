"""Tests for perturb/noise/uniform.py.

Oracles: the triangular law of U₂ − U₁ (two coordinates), iid maxima ``d/(d+1)``, float64
gradcheck (also at tied scores, where the kinks of the integrand coincide).
"""
from __future__ import annotations

import math

import pytest
import torch

from perturb.noise import Noise, Uniform

F64 = torch.float64


def ids(noise: Noise) -> str:
    return repr(noise)


def test_uniform_moments_closed_form():
    assert Uniform(0.0, 3.0).variance == pytest.approx(9 / 12)
    assert Uniform(-1.0, 2.0).mean == pytest.approx(0.5)


def _triangular_cdf(delta: float, w: float) -> float:
    if delta <= -w:
        return 0.0
    if delta >= w:
        return 1.0
    return (w + delta) ** 2 / (2 * w * w) if delta <= 0 else 1 - (w - delta) ** 2 / (2 * w * w)


def _positive_part_mean(delta: float, w: float) -> float:
    """E[(delta − D)^+] for D = U₂ − U₁ triangular on [−w, w]."""
    if delta <= -w:
        return 0.0
    if delta >= w:
        return delta
    return (delta + w) ** 3 / (6 * w * w) if delta <= 0 else delta + (w - delta) ** 3 / (6 * w * w)


@pytest.mark.parametrize("low, high", [(-1.0, 1.0), (0.0, 3.0)])
def test_uniform_two_coordinates_closed_form(low, high):
    w = high - low
    noise = Uniform(low, high)
    for t1, t2 in [(0.0, 0.0), (0.4, 0.0), (-1.3, 0.2), (0.0, 2.5), (5.0, 0.0), (0.1, 1e-9)]:
        theta = torch.tensor([t1, t2], dtype=F64)
        p1 = _triangular_cdf(t1 - t2, w)   # P(U₂ − U₁ < θ₁ − θ₂)
        torch.testing.assert_close(noise.argmax_probs(theta),
                                   torch.tensor([p1, 1 - p1], dtype=F64), atol=1e-13, rtol=0)
        ref = t2 + noise.mean + _positive_part_mean(t1 - t2, w)
        assert noise.expected_max(theta).item() == pytest.approx(ref, abs=1e-13)


def test_uniform_iid_exact():
    # max of d iid U(0,1) has mean d/(d+1); exact quadrature of polynomials
    for d in (2, 3, 6, 11):
        theta = torch.zeros(d, dtype=F64)
        assert Uniform(0.0, 1.0).expected_max(theta).item() == pytest.approx(d / (d + 1), abs=1e-14)
        torch.testing.assert_close(Uniform().argmax_probs(theta),
                                   torch.full((d,), 1 / d, dtype=F64), atol=1e-14, rtol=0)


@pytest.mark.parametrize("noise", [Uniform(), Uniform(0.0, 2.5)],
                         ids=ids)
def test_uniform_gradcheck(noise):
    theta = torch.tensor([[0.3, -0.2, 0.65], [1.1, 0.0, -0.4]], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(noise.argmax_probs, (theta,), atol=1e-7)
    assert torch.autograd.gradcheck(noise.expected_max, (theta,), atol=1e-7)


@pytest.mark.parametrize("noise", [Uniform(), Uniform(0.0, 2.5)], ids=ids)
def test_uniform_gradients_at_ties(noise):
    # tied scores and scores exactly one support width apart make kinks coincide; the
    # argmax probabilities are still C¹ there and the derivative must not depend on the tie
    w = noise.high - noise.low
    for values in ([0.0, 0.0, 0.0], [0.0, w, 0.0, 0.5], [0.0, w, 2 * w]):
        theta = torch.tensor(values, dtype=F64, requires_grad=True)
        assert torch.autograd.gradcheck(noise.argmax_probs, (theta,), atol=1e-7)
        jac = torch.autograd.functional.jacobian(noise.argmax_probs, theta.detach())
        torch.testing.assert_close(jac, jac.T, atol=1e-12, rtol=0)


def test_log_cdf_and_log_sf_are_exact_with_finite_gradients():
    """log F and log S of the support computed directly (S not as 1 − F: exact where F is
    within 1e-12 of 1), −inf outside with zero gradients (no 0·inf in the backward)."""
    u = Uniform(-1.0, 3.0)
    x = torch.tensor([-2.0, -1.0, 0.0, 3.0 - 4e-12, 3.0, 5.0], dtype=torch.float64,
                     requires_grad=True)
    log_f, log_s = u.log_cdf(x), u.log_sf(x)
    want_f = [-math.inf, -math.inf, math.log(0.25), math.log1p(-1e-12), 0.0, 0.0]
    want_s = [0.0, 0.0, math.log(0.75), math.log(1e-12), -math.inf, -math.inf]
    for got, want in ((log_f, want_f), (log_s, want_s)):
        for g, w in zip(got.tolist(), want):
            assert g == w or g == pytest.approx(w, rel=1e-4 if w == math.log(1e-12) else 1e-15)
    (log_f + log_s).masked_fill(~torch.isfinite(log_f + log_s), 0).sum().backward()
    assert torch.isfinite(x.grad).all()
