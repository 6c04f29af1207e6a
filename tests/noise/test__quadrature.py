"""Tests for perturb/noise/_quadrature.py: the one quadrature behind ``argmax_probs``,
``expected_max`` and the identifiability Hessian.

Oracles: Gumbel max-stability (``softmax``, ``β·lse(θ/β) + βγ``, Hessian ``diag p − p pᵀ``, and
``log_softmax`` deep in the tail), the two-coordinate Gaussian ``Φ((θ₁−θ₂)/(σ√2))`` through
``log_ndtr``, adaptive QUADPACK for a Hessian entry, the autograd Jacobian of the absolute-mode
``argmax_probs``, Monte Carlo (tolerance 5 standard errors) for Normal/Logistic/Uniform, and
scipy quantiles for the declared ranges.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, special, stats

from perturb._math import EULER_GAMMA
from perturb.noise import Gumbel, Logistic, Noise, Normal, Uniform
from perturb.noise._quadrature import (_TAIL, gl_pieces, argmax_probs, expected_max,
                                       log_argmax_probs)

F64 = torch.float64


def ids(noise: Noise) -> str:
    return repr(noise)


@pytest.mark.parametrize("scale", [0.3, 1.0, 4.0])
@pytest.mark.parametrize("d", [2, 3, 7, 50])
def test_quadrature_matches_gumbel_closed_forms(scale, d):
    # the generic quadrature, run on Gumbel, against max-stability closed forms
    g = torch.Generator().manual_seed(d)
    noise = Gumbel(scale=scale)
    theta = torch.cat([torch.randn(4, d, generator=g, dtype=F64) * s for s in (0.01, 1, 5, 100)])
    p = argmax_probs(noise, theta)
    torch.testing.assert_close(p, torch.softmax(theta / scale, -1), atol=1e-12, rtol=0)
    e = expected_max(noise, theta)
    ref = scale * torch.logsumexp(theta / scale, -1) + scale * EULER_GAMMA
    torch.testing.assert_close(e, ref, atol=1e-11 * scale, rtol=0)


@pytest.mark.parametrize("scale", [0.5, 2.0])
@pytest.mark.parametrize("d", [2, 4, 9])
def test_log_form_matches_gumbel_closed_forms(scale, d):
    # relative accuracy of log p for probabilities down to ~1e-200, and the exact Hessian
    g = torch.Generator().manual_seed(10 + d)
    noise = Gumbel(scale=scale)
    for spread in (0.1, 3.0, 60.0):
        theta = torch.randn(3, d, generator=g, dtype=F64) * spread * scale
        p, log_p, hess = log_argmax_probs(noise, theta)
        ref = torch.log_softmax(theta / scale, -1)
        torch.testing.assert_close(log_p, ref, atol=1e-11, rtol=1e-13)
        q = ref.exp()
        exact = (torch.diag_embed(q) - q.unsqueeze(-1) * q.unsqueeze(-2)) / scale
        torch.testing.assert_close(hess, exact, atol=1e-12, rtol=0)
        # relative accuracy of the Hessian where it is tiny: J = diag(1/p) H (Newton's matrix)
        torch.testing.assert_close(hess / q.unsqueeze(-1), exact / q.unsqueeze(-1),
                                   atol=1e-10, rtol=0)


@pytest.mark.parametrize("sigma", [0.4, 1.0, 3.0])
def test_log_form_normal_two_coordinates_deep_tail(sigma):
    # log P(argmax = 1) = log Φ((θ₁ − θ₂)/(σ√2)); Δ down to −60σ: p ≈ 1e-400 underflows, log p not
    delta = torch.tensor([-60.0, -25.0, -8.0, -1.0, 0.0, 2.0], dtype=F64) * sigma
    theta = torch.stack([delta, torch.zeros_like(delta)], -1)
    _, log_p, hess = log_argmax_probs(Normal(sigma), theta)
    ref = torch.special.log_ndtr(delta / (sigma * math.sqrt(2)))
    torch.testing.assert_close(log_p[:, 0], ref, atol=1e-12, rtol=1e-13)
    # ∂p₁/∂θ₁ = φ(Δ/(σ√2)) / (σ√2)
    dens = torch.exp(-0.5 * (delta / (sigma * math.sqrt(2))) ** 2) / (math.sqrt(2 * math.pi)
                                                                     * sigma * math.sqrt(2))
    torch.testing.assert_close(hess[:, 0, 0], dens, atol=1e-13, rtol=1e-10)
    torch.testing.assert_close(hess[:, 0, 1], -dens, atol=1e-13, rtol=1e-10)


def test_hessian_entry_vs_scipy_quad():
    # −∫ φ(x − θ₀) φ(x − θ₁) Φ(x − θ₂) dx by QUADPACK on scipy's own density
    th = np.array([0.4, -0.3, 1.2])
    ref = -integrate.quad(lambda x: stats.norm.pdf(x - th[0]) * stats.norm.pdf(x - th[1])
                          * special.ndtr(x - th[2]), -40, 40, epsabs=1e-15, epsrel=1e-13)[0]
    _, _, hess = log_argmax_probs(Normal(), torch.tensor(th, dtype=F64))
    assert hess[0, 1].item() == pytest.approx(ref, abs=1e-13)
    assert hess[1, 0].item() == pytest.approx(ref, abs=1e-13)


@pytest.mark.parametrize("noise", [Normal(), Logistic(scale=0.6), Uniform(), Uniform(0.0, 2.5)],
                         ids=ids)
def test_log_form_agrees_with_autograd_of_absolute_form(noise):
    # the log-space form (cover="all", ratio f/F, closed-form Hessian) vs the absolute form
    # (cover="max", leave-one-out product) and its autograd Jacobian
    for values in ([0.3, -0.2, 0.65, 0.1], [0.0, 0.0, 0.0, 0.0], [1.5, -2.5, 0.2, 0.0]):
        theta = torch.tensor(values, dtype=F64)
        p, log_p, hess = log_argmax_probs(noise, theta)
        torch.testing.assert_close(p, argmax_probs(noise, theta), atol=1e-13, rtol=0)
        jac = torch.autograd.functional.jacobian(lambda t: argmax_probs(noise, t), theta)
        torch.testing.assert_close(hess, jac, atol=1e-11, rtol=0)
        torch.testing.assert_close(hess, hess.T, atol=0, rtol=0)
        torch.testing.assert_close(hess.sum(-1), torch.zeros(4, dtype=F64), atol=1e-13, rtol=0)
        if isinstance(noise, Uniform):
            # saturated coordinates are exact zeros, in both forms
            far = theta.clone()
            far[1] = -10.0
            p_far, log_far, _ = log_argmax_probs(noise, far)
            assert p_far[1].item() == 0.0 and torch.isneginf(log_far[1])
            assert argmax_probs(noise, far)[1].item() == 0.0


@pytest.mark.parametrize("noise", [Normal(), Logistic(), Gumbel(0.7)], ids=ids)
def test_refined_rule_changes_nothing(noise):
    # the accuracy policy: the default panels are already converged (what the checks measure)
    theta = torch.tensor([0.4, -3.0, 1.1, 0.0, -20.0], dtype=F64)
    p1, lp1, h1 = log_argmax_probs(noise, theta)
    p2, lp2, h2 = log_argmax_probs(noise, theta, refine=3)
    torch.testing.assert_close(lp1, lp2, atol=1e-12, rtol=0)
    torch.testing.assert_close(h1, h2, atol=1e-13, rtol=0)


def test_pieces_refine_is_exact_for_polynomials():
    edges = torch.tensor([-1.0, 0.5, 2.0], dtype=F64)
    for refine in (1, 2, 5):
        x, w = gl_pieces(edges, 3, refine)
        assert x.shape == (2 * 3 * refine,)
        # degree-5 polynomial: exact with 3 nodes per piece
        assert (w * x ** 5).sum().item() == pytest.approx((2.0 ** 6 - 1.0) / 6, abs=1e-13)


@pytest.mark.parametrize("noise", [Normal(), Normal(scale=0.3), Logistic(), Uniform(),
                                   Uniform(0.0, 3.0)], ids=ids)
def test_quadrature_vs_monte_carlo(noise):
    # argmax_probs (both forms) and expected_max against 200 000 draws; tolerance 5 standard
    # errors of the Monte-Carlo estimate
    g = torch.Generator().manual_seed(123)
    theta = torch.tensor([0.5, 0.0, -0.4, 0.2, -1.5], dtype=F64) * math.sqrt(noise.variance)
    n = 200_000
    u = theta + noise.sample((n, 5), generator=g, dtype=F64)
    freq = torch.bincount(u.argmax(-1), minlength=5).to(F64) / n
    se = torch.sqrt(freq * (1 - freq) / n).clamp_min(1e-6)
    for p in (argmax_probs(noise, theta), log_argmax_probs(noise, theta, hessian=False)[0]):
        assert ((freq - p).abs() < 5 * se).all(), (freq, p)
    top = u.max(-1).values
    assert abs(top.mean().item() - expected_max(noise, theta).item()) \
        < 5 * top.std().item() / math.sqrt(n)


@pytest.mark.parametrize("d", [2, 10, 1000])
def test_declared_ranges_leave_the_stated_mass_outside(d):
    # quadrature_layout's [low, high] around max θ: P(max < max θ + low) <= F(low) = 1e-14 and
    # P(max > max θ + high) <= d·F̄(high) = 1e-14
    for noise, ref in ((Normal(), stats.norm), (Logistic(), stats.logistic),
                       (Gumbel(), stats.gumbel_r)):
        layout = noise.quadrature_layout(d)
        assert ref.cdf(layout.low) == pytest.approx(_TAIL, rel=1e-6)
        assert d * ref.sf(layout.high) == pytest.approx(_TAIL, rel=1e-6)
        assert 0 < layout.width < layout.high - layout.low and layout.order >= 16
    lay = Uniform(0.0, 3.0).quadrature_layout(d)
    assert (lay.low, lay.high, lay.width) == (0.0, 3.0, math.inf)
    assert lay.order == min(d // 2 + 1, 32)


class _JumpNoise(Noise):
    """A user noise whose density jumps inside the grid (negative exponential, no closed form):
    only ``breakpoints`` tells the quadrature where."""

    breakpoints = (0.0,)

    def cdf(self, x):
        return torch.exp(torch.as_tensor(x).clamp(max=0.0))

    def log_prob(self, x):
        x = torch.as_tensor(x)
        return torch.where(x <= 0, x, torch.full_like(x, -math.inf))

    def icdf(self, u):
        return torch.log(torch.as_tensor(u))


@pytest.mark.parametrize("theta", [[0.0, 0.0, 0.0], [0.3, 0.3, -0.5], [0.0, 1.0, 0.0]])
def test_jacobian_at_tied_kinks_reaches_the_right_coordinate(theta):
    """At tied scores the kinks θ_j + 0 coincide; the derivative of the moving edges must reach
    the coordinate whose kink each edge is (the closed form of NegativeExponential is the
    reference: its Jacobian is checked against finite differences in test_exponential.py)."""
    from perturb.noise import NegativeExponential
    t = torch.tensor(theta, dtype=torch.float64)
    jac = torch.autograd.functional.jacobian(lambda v: argmax_probs(_JumpNoise(), v), t)
    ref = torch.autograd.functional.jacobian(NegativeExponential().argmax_probs, t)
    torch.testing.assert_close(jac, ref, rtol=0, atol=1e-10)
