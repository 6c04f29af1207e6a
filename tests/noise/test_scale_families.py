"""Tests for perturb/noise/scale_families.py: Gumbel, Normal (= Gaussian), Logistic.

Oracles: scipy.stats (tails of log_cdf), closed forms (Gumbel max-stability, the two-coordinate
Gaussian formula, tabulated iid Gaussian maxima), adaptive QUADPACK on independently written
densities, Monte Carlo with 5 standard errors, float64 gradcheck.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, special, stats

from perturb._math import EULER_GAMMA
from perturb.noise import Gumbel, Logistic, Noise, Normal

F64 = torch.float64


def ids(noise: Noise) -> str:
    return repr(noise)


@pytest.mark.parametrize("noise", [Gumbel(), Logistic(), Normal()], ids=ids)
def test_samples_finite_at_extreme_uniforms(noise):
    # the clamp of U into (0, 1) keeps inverse-CDF transforms finite, even in float32
    for dtype in (torch.float32, torch.float64):
        fi = torch.finfo(dtype)
        u = torch.tensor([fi.tiny, 1 - fi.eps / 2], dtype=dtype)
        assert torch.isfinite(noise.icdf(u)).all()
    x = noise.sample((200000,), dtype=torch.float32, generator=torch.Generator().manual_seed(3))
    assert torch.isfinite(x).all()


def test_gumbel_moments_closed_form():
    assert Gumbel(2.0).mean == pytest.approx(2.0 * 0.5772156649015329)
    assert Gumbel(2.0).variance == pytest.approx(4.0 * math.pi ** 2 / 6)
    assert Logistic(2.0).variance == pytest.approx(4.0 * math.pi ** 2 / 3)


def test_log_cdf_accurate_in_tails():
    x = torch.tensor([-30.0, 40.0], dtype=F64)
    np.testing.assert_allclose(Normal().log_cdf(x).numpy(), stats.norm.logcdf(x.numpy()),
                               rtol=1e-12)
    np.testing.assert_allclose(Logistic().log_cdf(x).numpy(), stats.logistic.logcdf(x.numpy()),
                               rtol=1e-12)
    np.testing.assert_allclose(Gumbel().log_cdf(x).numpy(), stats.gumbel_r.logcdf(x.numpy()),
                               rtol=1e-12)


def test_gumbel_argmax_frequencies_are_softmax():
    theta = torch.tensor([1.0, 0.0, -0.5, 0.3], dtype=F64)
    n = 100000
    eps = Gumbel(scale=0.7).sample((n, 4), generator=torch.Generator().manual_seed(2), dtype=F64)
    freq = torch.bincount((theta + eps).argmax(-1), minlength=4).double() / n
    p = torch.softmax(theta / 0.7, -1)
    se = torch.sqrt(p * (1 - p) / n)
    assert ((freq - p).abs() < 5 * se).all()
    torch.testing.assert_close(Gumbel(scale=0.7).argmax_probs(theta), p)


def test_gumbel_expected_max_closed_form():
    theta = torch.tensor([[0.0, 0.0], [1.0, -2.0]], dtype=F64)
    e = Gumbel(scale=2.0).expected_max(theta)
    ref = 2.0 * torch.logsumexp(theta / 2.0, -1) + 2.0 * EULER_GAMMA
    torch.testing.assert_close(e, ref)
    assert e[0].item() == pytest.approx(2.0 * (math.log(2) + 0.5772156649015329), abs=1e-14)


@pytest.mark.parametrize("sigma", [0.2, 1.0, 3.0])
def test_normal_two_coordinates_closed_form(sigma):
    theta = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.3, -1.1], [-4.0, 2.0], [50.0, 0.0]], dtype=F64)
    s = sigma * math.sqrt(2)
    delta = theta[:, 0] - theta[:, 1]
    phi = torch.special.ndtr(delta / s)
    p = Normal(scale=sigma).argmax_probs(theta)
    torch.testing.assert_close(p, torch.stack([phi, 1 - phi], -1), atol=1e-12, rtol=0)
    density = torch.exp(-0.5 * (delta / s) ** 2) / math.sqrt(2 * math.pi)
    ref = theta[:, 0] * phi + theta[:, 1] * (1 - phi) + s * density
    torch.testing.assert_close(Normal(scale=sigma).expected_max(theta), ref, atol=1e-11, rtol=0)


@pytest.mark.parametrize("d, ref", [(2, 1 / math.sqrt(math.pi)), (3, 1.5 / math.sqrt(math.pi)),
                                    (5, 1.1629644736405196)])
def test_normal_iid_expected_max(d, ref):
    # E[max of d iid N(0,1)]: 1/√π, 3/(2√π), and the tabulated value for d = 5
    theta = torch.zeros(d, dtype=F64)
    assert Normal(scale=2.0).expected_max(theta).item() == pytest.approx(2 * ref, abs=1e-12)
    torch.testing.assert_close(Normal().argmax_probs(theta), torch.full((d,), 1 / d, dtype=F64),
                               atol=1e-13, rtol=0)


def _scalar_pdf_cdf(noise: Noise):
    """Scalar density and CDF written with scipy.special (fast inside scipy.integrate.quad)."""
    s = noise.scale
    if isinstance(noise, Logistic):
        return (lambda x: special.expit(x / s) * special.expit(-x / s) / s,
                lambda x: special.expit(x / s))
    return (lambda x: math.exp(-0.5 * (x / s) ** 2) / (s * math.sqrt(2 * math.pi)),
            lambda x: special.ndtr(x / s))


@pytest.mark.parametrize("noise", [Logistic(), Logistic(scale=0.5), Normal(scale=0.7)], ids=ids)
def test_quadrature_vs_scipy_quad(noise):
    # an independent integrator (adaptive QUADPACK) on independently written densities
    pdf, cdf = _scalar_pdf_cdf(noise)
    theta = np.array([0.4, -0.3, 1.2, 0.0])

    def integrand(x, i):
        others = np.prod([cdf(x - t) for j, t in enumerate(theta) if j != i])
        return pdf(x - theta[i]) * others

    p_ref = [integrate.quad(integrand, -60, 60, args=(i,), epsabs=1e-13, epsrel=1e-12,
                            limit=200, points=[0.0, 1.0])[0] for i in range(4)]
    e_ref = integrate.quad(lambda x: x * sum(integrand(x, i) for i in range(4)), -60, 60,
                           epsabs=1e-13, epsrel=1e-12, limit=200, points=[0.0, 1.0])[0]
    t = torch.tensor(theta, dtype=F64)
    np.testing.assert_allclose(noise.argmax_probs(t).numpy(), p_ref, atol=1e-11)
    assert noise.expected_max(t).item() == pytest.approx(e_ref, abs=1e-10)


@pytest.mark.parametrize("noise", [Normal(), Logistic(scale=0.6)], ids=ids)
def test_gradcheck(noise):
    theta = torch.tensor([[0.3, -0.2, 0.65], [1.1, 0.0, -0.4]], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(noise.argmax_probs, (theta,), atol=1e-7)
    assert torch.autograd.gradcheck(noise.expected_max, (theta,), atol=1e-7)


@pytest.mark.parametrize("noise", [Gumbel(0.7), Normal(0.3), Logistic(2.0)], ids=repr)
def test_log_sf_is_log_of_one_minus_cdf_and_finite_in_the_far_tail(noise):
    """log S(x) = log(1 − F(x)) where 1 − F is representable (scipy in float64), and in the far
    upper tail, where F rounds to 1, the tail's own asymptotics instead of −inf."""
    x = torch.linspace(-3, 3, 61, dtype=torch.float64) * noise.scale
    cdf = noise.cdf(x).numpy()
    torch.testing.assert_close(noise.log_sf(x), torch.from_numpy(np.log1p(-cdf)),
                               rtol=1e-12, atol=1e-14)
    z = torch.tensor([40.0, 800.0, 1e4], dtype=torch.float64)
    far = noise.log_sf(z * noise.scale)
    if isinstance(noise, Gumbel):
        want = -z - 0.5 * torch.exp(-z)                         # log(1 − exp(−e^{−z}))
    elif isinstance(noise, Normal):
        want = torch.from_numpy(special.log_ndtr(-z.numpy()))
    else:
        want = -torch.nn.functional.softplus(z)                 # log σ(−z)
    torch.testing.assert_close(far, want, rtol=1e-12, atol=0)
    assert torch.isfinite(far).all()


def test_logistic_log_prob_is_exact_in_both_tails():
    """log f(z) = −|z| − 2 log1p(e^{−|z|}) against scipy over |z| ≤ 700, float64: to 1e-15
    relative (softplus' threshold at 20 once dropped e^{z}, 2e-9 absolute at z = −20)."""
    x = torch.cat([torch.linspace(-700, 700, 2801, dtype=torch.float64),
                   torch.tensor([-20.5, -25.0, 20.5, 25.0], dtype=torch.float64)])
    for scale in (1.0, 0.3):
        got = Logistic(scale).log_prob(x).numpy()
        want = stats.logistic.logpdf(x.numpy(), scale=scale)
        np.testing.assert_allclose(got, want, rtol=1e-15, atol=0)
    z = torch.tensor([-21.0, 21.0], dtype=torch.float64)
    assert torch.equal(Logistic().log_prob(z), Logistic().log_prob(-z))     # symmetric
    assert float(Logistic().log_prob(z)[0] - (-21.0 - 2 * math.log1p(math.exp(-21.0)))) == 0.0


# ------------------------------------------------- the in-place hooks of the box quadrature


def _nodes_like() -> torch.Tensor:
    """Standardised values across both tails and the deep-tail switch of Normal._log_cdf_
    (z = −30), with the values on each side of it."""
    z = torch.cat([torch.linspace(-45, 45, 1801, dtype=F64),
                   torch.tensor([-30.0, math.nextafter(-30.0, -1), math.nextafter(-30.0, 0),
                                 -31.0, 31.0], dtype=F64)])
    return z.view(-1, 2)


@pytest.mark.parametrize("noise", [Gumbel(0.7), Normal(0.3), Logistic(2.0)], ids=repr)
def test_log_cdf_hook_agrees_with_log_cdf_and_may_overwrite_its_input(noise):
    """``_log_cdf_`` (the in-place hook the box quadrature calls) equals ``log_cdf`` to the
    absolute accuracy its contract states (1e-15 where log F is of order 1, relative 1e-14 in
    the lower tail), on both sides of Normal's switch to log_ndtr at −30 scales; it may
    overwrite its input (the caller passes a fresh tensor) and leaves no NaN or inf."""
    x = _nodes_like() * noise.scale
    want = noise.log_cdf(x)
    z = x.clone()
    got = noise._log_cdf_(z)
    assert got.shape == x.shape and torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-15)
    # mpmath-free check of the deep lower tail of Normal against scipy (log_ndtr)
    if isinstance(noise, Normal):
        ref = torch.from_numpy(special.log_ndtr((x / noise.scale).numpy()))
        torch.testing.assert_close(got, ref, rtol=1e-14, atol=1e-15)


def test_log_cdf_hook_default_is_log_cdf():
    """The base-class default is ``log_cdf`` itself (a user noise needs no override)."""
    class Laplace(Noise):
        continuous = True

        def cdf(self, x):
            return torch.where(x < 0, 0.5 * torch.exp(x), 1 - 0.5 * torch.exp(-x))

        def log_prob(self, x):
            return -x.abs() - math.log(2.0)

    noise = Laplace()
    x = torch.linspace(-5, 5, 41, dtype=F64)
    assert torch.equal(noise._log_cdf_(x.clone()), noise.log_cdf(x))
    torch.testing.assert_close(noise._log_hazard_(x.clone(), noise.log_cdf(x)),
                               noise.log_prob(x) - noise.log_cdf(x), rtol=0, atol=0)


@pytest.mark.parametrize("noise", [Gumbel(0.7), Normal(0.3), Logistic(2.0)], ids=repr)
def test_log_hazard_hook_is_log_density_over_cdf(noise):
    """``_log_hazard_(z, log F(z)) = log f(z) − log F(z)``: against log_prob − log_cdf where
    both are exact, and for Logistic against log S(z) − log s (its exact form) in the far
    lower tail, where log_prob's softplus loses digits; the input may be overwritten."""
    x = _nodes_like() * noise.scale
    log_cdf = noise.log_cdf(x)
    got = noise._log_hazard_(x.clone(), log_cdf)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, noise.log_prob(x) - log_cdf, rtol=1e-13, atol=1e-13)
    if isinstance(noise, Logistic):
        torch.testing.assert_close(got, noise.log_sf(x) - math.log(noise.scale), rtol=1e-15,
                                   atol=1e-15)


def test_normal_log_cdf_hook_keeps_autograd_exact():
    """Under autograd the Normal hook takes log_ndtr out of place (erfc_ in place would lose
    the input its derivative needs): gradients equal those of log_cdf."""
    x = torch.linspace(-40, 8, 97, dtype=F64).requires_grad_()
    noise = Normal(0.3)
    g1, = torch.autograd.grad(noise._log_cdf_(x * 0.3).sum(), x)
    g2, = torch.autograd.grad(noise.log_cdf(x * 0.3).sum(), x)
    torch.testing.assert_close(g1, g2, rtol=1e-14, atol=0)
