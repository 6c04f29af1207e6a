"""Tests for perturb/noise.py.

Oracles: scipy.stats (cdf, log density, quantiles), closed forms (Gumbel max-stability,
two-coordinate Gaussian and uniform formulas, iid maxima), brute-force enumeration (discrete
noise), Monte Carlo with tolerances of 5 standard errors, and autograd identities
(∇ expected_max = argmax_probs; symmetric Jacobian with zero row sums) plus float64 gradcheck.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, special, stats

from perturb._noise_quadrature import _quadrature_argmax_probs, _quadrature_expected_max
from perturb.noise import (EULER_GAMMA, Discrete, Gaussian, Gumbel, Logistic, Noise, Normal,
                           Uniform)

F64 = torch.float64

CONTINUOUS = [Gumbel(), Gumbel(scale=0.4), Normal(), Normal(scale=2.5), Logistic(),
              Logistic(scale=0.3), Uniform(), Uniform(0.0, 3.0)]
DISCRETE = [Discrete([-1.0, 0.0, 1.0]), Discrete([0.5, -2.0, 1.0], [0.2, 0.5, 0.3])]
ALL = CONTINUOUS + DISCRETE


def ids(noise: Noise) -> str:
    return repr(noise)


# excess kurtosis, to get the standard error of the sample variance
def excess_kurtosis(noise: Noise) -> float:
    if isinstance(noise, Gumbel):
        return 12 / 5
    if isinstance(noise, Normal):
        return 0.0
    if isinstance(noise, Logistic):
        return 6 / 5
    if isinstance(noise, Uniform):
        return -6 / 5
    v, p = np.array(noise.values), np.array(noise.probs)
    c = v - noise.mean
    return float(np.dot(p, c ** 4)) / noise.variance ** 2 - 3


def scipy_dist(noise: Noise):
    if isinstance(noise, Gumbel):
        return stats.gumbel_r(scale=noise.scale)
    if isinstance(noise, Normal):
        return stats.norm(scale=noise.scale)
    if isinstance(noise, Logistic):
        return stats.logistic(scale=noise.scale)
    if isinstance(noise, Uniform):
        return stats.uniform(loc=noise.low, scale=noise.high - noise.low)
    raise TypeError(noise)


# ---------------------------------------------------------------------------------------------
# construction


def test_repr_eq_hash_alias():
    assert repr(Gumbel()) == "Gumbel(scale=1.0)"
    assert repr(Normal(scale=2)) == "Normal(scale=2.0)"
    assert repr(Uniform()) == "Uniform(low=-1.0, high=1.0)"
    assert repr(Discrete([0, 1], [0.25, 0.75])) == "Discrete(values=(0.0, 1.0), probs=(0.25, 0.75))"
    assert Gaussian is Normal
    assert Gumbel(2.0) == Gumbel(scale=2) and Gumbel(1.0) != Gumbel(2.0)
    assert Normal() != Logistic() and Uniform(0, 1) == Uniform(0.0, 1.0)
    assert Discrete([0, 1]) == Discrete([0.0, 1.0], [0.5, 0.5])
    assert len({Gumbel(), Gumbel(1.0), Normal(), Uniform(0, 1), Uniform(0, 1)}) == 3
    assert (Gumbel().bounded, Gumbel().continuous) == (False, True)
    assert (Uniform().bounded, Uniform().continuous) == (True, True)
    assert (Discrete([0.0]).bounded, Discrete([0.0]).continuous) == (True, False)


@pytest.mark.parametrize("make, name", [
    (lambda: Gumbel(0.0), "scale"), (lambda: Gumbel(-1.0), "scale"),
    (lambda: Normal(float("nan")), "scale"), (lambda: Logistic(float("inf")), "scale"),
    (lambda: Normal("1"), "scale"), (lambda: Gumbel(True), "scale"),
    (lambda: Uniform(1.0, 1.0), "low"), (lambda: Uniform(2.0, 1.0), "high"),
    (lambda: Uniform(float("-inf"), 1.0), "low"),
    (lambda: Discrete([]), "values"), (lambda: Discrete([0.0, 0.0]), "values"),
    (lambda: Discrete([0.0, float("nan")]), "values"), (lambda: Discrete([[0.0, 1.0]]), "values"),
    (lambda: Discrete([0.0, 1.0], [1.0]), "probs"), (lambda: Discrete([0.0, 1.0], [0.6, 0.6]), "probs"),
    (lambda: Discrete([0.0, 1.0], [-0.5, 1.5]), "probs"),
])
def test_bad_parameters(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def test_discrete_normalises_and_drops_zero_mass():
    n = Discrete([2.0, -1.0, 0.0], [0.5 + 5e-7, 0.5, 0.0])
    assert abs(sum(n.probs) - 1.0) < 1e-15
    assert n.support == (-1.0, 2.0)
    x = n.sample((20000,), generator=torch.Generator().manual_seed(0))
    assert set(x.unique().tolist()) == {-1.0, 2.0}


# ---------------------------------------------------------------------------------------------
# sampling


@pytest.mark.parametrize("noise", ALL, ids=ids)
def test_sample_shape_dtype_reproducible(noise):
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    a = noise.sample((3, 4), generator=g1)
    b = noise.sample(torch.Size([3, 4]), generator=g2)
    assert a.shape == (3, 4) and a.dtype == torch.get_default_dtype()
    assert torch.equal(a, b)
    assert not torch.equal(a, noise.sample((3, 4), generator=g1))
    for dtype in (torch.float32, torch.float64):
        x = noise.sample(5, dtype=dtype, device="cpu")
        assert x.shape == (5,) and x.dtype == dtype and x.device.type == "cpu"
    assert noise.sample((0, 2)).shape == (0, 2)


@pytest.mark.parametrize("noise", ALL, ids=ids)
def test_sample_bad_arguments(noise):
    with pytest.raises(ValueError, match="dtype"):
        noise.sample((2,), dtype=torch.int64)
    with pytest.raises(ValueError, match="shape"):
        noise.sample((2, -1))
    with pytest.raises(ValueError, match="shape"):
        noise.sample("ab")


@pytest.mark.parametrize("noise", [Gumbel(), Logistic(), Normal()], ids=ids)
def test_samples_finite_at_extreme_uniforms(noise):
    # the clamp of U into (0, 1) keeps inverse-CDF transforms finite, even in float32
    for dtype in (torch.float32, torch.float64):
        fi = torch.finfo(dtype)
        u = torch.tensor([fi.tiny, 1 - fi.eps / 2], dtype=dtype)
        assert torch.isfinite(noise.icdf(u)).all()
    x = noise.sample((200000,), dtype=torch.float32, generator=torch.Generator().manual_seed(3))
    assert torch.isfinite(x).all()


@pytest.mark.parametrize("noise", ALL, ids=ids)
def test_sample_moments(noise):
    n = 40000
    x = noise.sample((n,), generator=torch.Generator().manual_seed(11), dtype=F64)
    se_mean = math.sqrt(noise.variance / n)
    assert abs(x.mean().item() - noise.mean) < 5 * se_mean
    se_var = noise.variance * math.sqrt((excess_kurtosis(noise) + 2) / n)
    assert abs(x.var().item() - noise.variance) < 5 * se_var
    assert noise.stddev == pytest.approx(math.sqrt(noise.variance))


def test_gumbel_moments_closed_form():
    assert Gumbel(2.0).mean == pytest.approx(2.0 * 0.5772156649015329)
    assert Gumbel(2.0).variance == pytest.approx(4.0 * math.pi ** 2 / 6)
    assert Logistic(2.0).variance == pytest.approx(4.0 * math.pi ** 2 / 3)
    assert Uniform(0.0, 3.0).variance == pytest.approx(9 / 12)


# ---------------------------------------------------------------------------------------------
# cdf, log_prob, icdf


@pytest.mark.parametrize("noise", CONTINUOUS, ids=ids)
def test_cdf_log_prob_icdf_vs_scipy(noise):
    ref = scipy_dist(noise)
    x = np.linspace(-6, 9, 61)
    xt = torch.tensor(x, dtype=F64)
    np.testing.assert_allclose(noise.cdf(xt).numpy(), ref.cdf(x), rtol=1e-12, atol=1e-15)
    low, high = noise.support
    inside = (x >= low) & (x <= high)
    np.testing.assert_allclose(noise.log_prob(xt).numpy()[inside], ref.logpdf(x)[inside],
                               rtol=1e-12, atol=1e-12)
    assert torch.isneginf(noise.log_prob(xt)[torch.tensor(~inside)]).all()
    with np.errstate(divide="ignore"):
        ref_log_cdf = ref.logcdf(x)
    np.testing.assert_allclose(noise.log_cdf(xt).numpy(), ref_log_cdf, rtol=1e-10, atol=1e-12)
    u = np.linspace(1e-6, 1 - 1e-6, 41)
    np.testing.assert_allclose(noise.icdf(torch.tensor(u, dtype=F64)).numpy(), ref.ppf(u),
                               rtol=1e-10, atol=1e-10)
    # float32 inputs and python numbers
    assert noise.cdf(torch.tensor([0.5], dtype=torch.float32)).dtype == torch.float32
    assert noise.cdf(0.5).item() == pytest.approx(ref.cdf(0.5))


def test_log_cdf_accurate_in_tails():
    x = torch.tensor([-30.0, 40.0], dtype=F64)
    np.testing.assert_allclose(Normal().log_cdf(x).numpy(), stats.norm.logcdf(x.numpy()),
                               rtol=1e-12)
    np.testing.assert_allclose(Logistic().log_cdf(x).numpy(), stats.logistic.logcdf(x.numpy()),
                               rtol=1e-12)
    np.testing.assert_allclose(Gumbel().log_cdf(x).numpy(), stats.gumbel_r.logcdf(x.numpy()),
                               rtol=1e-12)


def test_discrete_distribution_functions():
    v, p = np.array([0.5, -2.0, 1.0]), np.array([0.2, 0.5, 0.3])
    n = Discrete(v, torch.tensor(p))
    x = np.array([-3.0, -2.0, -1.0, 0.5, 0.7, 1.0, 4.0])
    ref_cdf = np.array([(p * (v <= xi)).sum() for xi in x])
    np.testing.assert_allclose(n.cdf(torch.tensor(x)).numpy(), ref_cdf, atol=1e-15)
    ref_lp = np.array([np.log((p * (v == xi)).sum()) if np.any(v == xi) else -np.inf for xi in x])
    np.testing.assert_allclose(n.log_prob(torch.tensor(x)).numpy(), ref_lp)
    u = torch.tensor([0.0, 0.3, 0.5, 0.50001, 0.7, 0.71, 1.0], dtype=F64)
    # generalised inverse: smallest v with F(v) >= u
    assert n.icdf(u).tolist() == [-2.0, -2.0, -2.0, 0.5, 0.5, 1.0, 1.0]
    assert n.mean == pytest.approx(float(p @ v))
    assert n.variance == pytest.approx(float(p @ v ** 2 - (p @ v) ** 2))
    counts = torch.stack([(n.sample((30000,), generator=torch.Generator().manual_seed(5)) == vi)
                          .double().mean() for vi in v.tolist()])
    se = np.sqrt(p * (1 - p) / 30000)
    assert np.all(np.abs(counts.numpy() - p) < 5 * se)


# ---------------------------------------------------------------------------------------------
# argmax_probs and expected_max: closed forms


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


@pytest.mark.parametrize("scale", [0.3, 1.0, 4.0])
@pytest.mark.parametrize("d", [2, 3, 7, 50])
def test_quadrature_matches_gumbel_closed_forms(scale, d):
    # the generic quadrature, run on Gumbel, against max-stability closed forms
    g = torch.Generator().manual_seed(d)
    noise = Gumbel(scale=scale)
    theta = torch.cat([torch.randn(4, d, generator=g, dtype=F64) * s for s in (0.01, 1, 5, 100)])
    p = _quadrature_argmax_probs(noise, theta)
    torch.testing.assert_close(p, torch.softmax(theta / scale, -1), atol=1e-12, rtol=0)
    e = _quadrature_expected_max(noise, theta)
    ref = scale * torch.logsumexp(theta / scale, -1) + scale * EULER_GAMMA
    torch.testing.assert_close(e, ref, atol=1e-11 * scale, rtol=0)


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


# ---------------------------------------------------------------------------------------------
# discrete: brute-force enumeration


def _brute_force_discrete(noise: Discrete, theta: list[float]) -> tuple[np.ndarray, float]:
    d = len(theta)
    probs = np.zeros(d)
    emax = 0.0
    for combo in itertools.product(range(len(noise.values)), repeat=d):
        weight = np.prod([noise.probs[k] for k in combo])
        u = np.array([theta[i] + noise.values[k] for i, k in enumerate(combo)])
        winners = np.flatnonzero(np.isclose(u, u.max(), rtol=0, atol=1e-9))
        probs[winners] += weight / len(winners)
        emax += weight * u.max()
    return probs, emax


@pytest.mark.parametrize("noise", DISCRETE + [Discrete([0.0, 1.0, 3.0], [0.3, 0.0, 0.7])], ids=ids)
@pytest.mark.parametrize("theta", [[0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0, -1.0],
                                   [0.5, 0.0, -0.5, 1.5], [0.13, -0.71, 0.44],
                                   [2.5, 0.0, 0.5], [10.0, 0.0, 0.0]])
def test_discrete_vs_enumeration(noise, theta):
    probs, emax = _brute_force_discrete(noise, theta)
    t = torch.tensor(theta, dtype=F64)
    np.testing.assert_allclose(noise.argmax_probs(t).numpy(), probs, atol=1e-13)
    assert noise.expected_max(t).item() == pytest.approx(emax, abs=1e-12)


def test_discrete_ties_are_split_and_many_coordinates():
    # d = 9 coordinates all tied, two-point noise: symmetric, exact 1/9 each (with the exact
    # polynomial integral of the tie count; 2^9 outcomes checked by enumeration too)
    noise = Discrete([-1.0, 1.0])
    theta = [0.0] * 9
    probs, emax = _brute_force_discrete(noise, theta)
    p = noise.argmax_probs(torch.zeros(9, dtype=F64))
    np.testing.assert_allclose(p.numpy(), probs, atol=1e-13)
    np.testing.assert_allclose(p.numpy(), np.full(9, 1 / 9), atol=1e-13)
    assert noise.expected_max(torch.zeros(9, dtype=F64)).item() == pytest.approx(emax, abs=1e-12)
    # float32 scores: 0.1 + 0.2 and 0.2 + 0.1 tie (tolerance of theta's dtype): P = (1/8, 7/8)
    theta32 = torch.tensor([0.1, 0.2], dtype=torch.float32)
    p32 = Discrete([0.2, 0.1]).argmax_probs(theta32)
    np.testing.assert_allclose(p32.numpy(), [1 / 8, 7 / 8], atol=1e-7)
    # distinct float64 scores that differ by much more than roundoff are not ties
    p64 = Discrete([0.0, 1.0]).argmax_probs(torch.tensor([1e-9, 0.0], dtype=F64))
    np.testing.assert_allclose(p64.numpy(), [0.75, 0.25], atol=1e-15)


def test_discrete_gradients():
    noise = Discrete([-1.0, 0.0, 2.0], [0.2, 0.5, 0.3])
    theta = torch.tensor([0.3, -0.2, 0.45], dtype=F64, requires_grad=True)
    jac = torch.autograd.functional.jacobian(noise.argmax_probs, theta)
    assert torch.equal(jac, torch.zeros(3, 3, dtype=F64))  # piecewise constant in θ
    (grad,) = torch.autograd.grad(noise.expected_max(theta), theta)
    torch.testing.assert_close(grad, noise.argmax_probs(theta.detach()), atol=1e-13, rtol=0)


# ---------------------------------------------------------------------------------------------
# Monte Carlo for every noise


@pytest.mark.parametrize("noise", ALL, ids=ids)
def test_argmax_probs_and_expected_max_vs_monte_carlo(noise):
    theta = torch.tensor([0.4, 0.0, -0.3], dtype=F64)
    n = 100000
    eps = noise.sample((n, 3), generator=torch.Generator().manual_seed(21), dtype=F64)
    u = theta + eps
    top = u.max(-1, keepdim=True).values
    winners = (u == top).double()           # exact ties (discrete noise) split uniformly
    freq = (winners / winners.sum(-1, keepdim=True)).mean(0)
    p = noise.argmax_probs(theta)
    se = torch.sqrt(p * (1 - p) / n).clamp_min(1e-6)
    assert ((freq - p).abs() < 5 * se).all(), (freq, p)
    m = top.squeeze(-1)
    assert abs(m.mean().item() - noise.expected_max(theta).item()) < 5 * m.std().item() / math.sqrt(n)


# ---------------------------------------------------------------------------------------------
# gradients


@pytest.mark.parametrize("noise", [Normal(), Logistic(scale=0.6), Uniform(), Uniform(0.0, 2.5)],
                         ids=ids)
def test_gradcheck(noise):
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


@pytest.mark.parametrize("values", [[0.3, -0.2, 0.65, 0.1], [0.5, 0.5, -0.4, 0.5]],
                         ids=["distinct", "tied"])
@pytest.mark.parametrize("noise", CONTINUOUS, ids=ids)
def test_gradient_identities(noise, values):
    # ∇ E[max] = argmax probs; their Jacobian (the Hessian of E[max]) is symmetric with zero
    # row sums (translation invariance). Also at tied scores (where max θ switches).
    theta = torch.tensor(values, dtype=F64, requires_grad=True)
    (grad,) = torch.autograd.grad(noise.expected_max(theta), theta)
    p = noise.argmax_probs(theta)
    torch.testing.assert_close(grad, p.detach(), atol=1e-11, rtol=0)
    jac = torch.autograd.functional.jacobian(noise.argmax_probs, theta.detach())
    torch.testing.assert_close(jac, jac.T, atol=1e-10, rtol=0)
    torch.testing.assert_close(jac.sum(-1), torch.zeros(4, dtype=F64), atol=1e-10, rtol=0)
    assert (jac.diagonal() > 0).all()


# ---------------------------------------------------------------------------------------------
# shapes, dtypes, dims, edge cases


@pytest.mark.parametrize("noise", ALL, ids=ids)
def test_batched_dim_dtype(noise):
    g = torch.Generator().manual_seed(4)
    theta = torch.randn(2, 3, 4, generator=g, dtype=F64)
    p = noise.argmax_probs(theta)
    e = noise.expected_max(theta)
    assert p.shape == (2, 3, 4) and e.shape == (2, 3)
    for i, j in itertools.product(range(2), range(3)):
        torch.testing.assert_close(p[i, j], noise.argmax_probs(theta[i, j]), atol=1e-14, rtol=0)
        torch.testing.assert_close(e[i, j], noise.expected_max(theta[i, j]), atol=1e-14, rtol=0)
    torch.testing.assert_close(noise.argmax_probs(theta.transpose(0, 2), dim=0),
                               p.transpose(0, 2), atol=1e-14, rtol=0)
    torch.testing.assert_close(noise.expected_max(theta, dim=1),
                               noise.expected_max(theta.transpose(1, 2)), atol=1e-14, rtol=0)
    p32 = noise.argmax_probs(theta.float())
    assert p32.dtype == torch.float32 and noise.expected_max(theta.float()).dtype == torch.float32
    torch.testing.assert_close(p32.double(), p, atol=1e-6, rtol=0)


@pytest.mark.parametrize("noise", ALL, ids=ids)
def test_one_coordinate(noise):
    theta = torch.tensor([[0.7], [-2.0]], dtype=F64)
    torch.testing.assert_close(noise.argmax_probs(theta), torch.ones(2, 1, dtype=F64))
    torch.testing.assert_close(noise.expected_max(theta), theta[:, 0] + noise.mean,
                               atol=1e-12, rtol=0)


@pytest.mark.parametrize("noise", CONTINUOUS + DISCRETE[:1], ids=ids)
def test_extreme_scores_finite(noise):
    theta = torch.tensor([1e4, -1e4, 0.0, 1e4 - 0.5], dtype=F64, requires_grad=True)
    p = noise.argmax_probs(theta)
    e = noise.expected_max(theta)
    assert torch.isfinite(p).all() and torch.isfinite(e)
    assert p[1].item() == 0.0 and p[2].item() == 0.0
    assert abs(p.sum().item() - 1) < 1e-12
    (grad,) = torch.autograd.grad(e, theta)
    assert torch.isfinite(grad).all()
    assert e.item() >= 1e4 + noise.mean - 1e-9


@pytest.mark.parametrize("noise", [Gumbel(), Uniform()], ids=ids)
def test_bad_theta(noise):
    with pytest.raises(ValueError, match="theta"):
        noise.argmax_probs(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="theta"):
        noise.expected_max(torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="theta"):
        noise.argmax_probs(torch.zeros(3, 0))
    with pytest.raises(ValueError, match="dim"):
        noise.argmax_probs(torch.zeros(3), dim=1)


def test_icdf_roundtrip_for_qmc():
    u = torch.linspace(0.01, 0.99, 50, dtype=F64)
    for noise in CONTINUOUS:
        torch.testing.assert_close(noise.cdf(noise.icdf(u)), u, atol=1e-13, rtol=0)
    # randomised quasi-Monte Carlo (8 independent Sobol scrambles through icdf) reproduces the
    # exact expected max within 5 standard errors of the scramble-to-scramble spread
    theta = torch.tensor([0.4, 0.0, -0.3], dtype=F64)
    points = torch.stack([torch.quasirandom.SobolEngine(3, scramble=True, seed=s)
                          .draw(2 ** 11, dtype=F64) for s in range(8)]).clamp(1e-12, 1 - 1e-12)
    for noise in [Normal(), Logistic(), Gumbel(), Uniform()]:
        est = (theta + noise.icdf(points)).max(-1).values.mean(-1)
        se = est.std() / math.sqrt(8)
        assert abs(est.mean().item() - noise.expected_max(theta).item()) < 5 * se.item() + 1e-12


@pytest.mark.parametrize("noise", ALL, ids=ids)
def test_icdf_rejects_out_of_range(noise):
    with pytest.raises(ValueError, match="u must lie"):
        noise.icdf(torch.tensor([0.5, 1.5]))


# ---------------------------------------------------------------------------------------------
# user-defined noise


class _LogisticByCdf(Noise):
    """A user noise giving only cdf and log_prob: the generic layout and bisection quantiles."""

    def cdf(self, x):
        return torch.sigmoid(x)

    def log_prob(self, x):
        return -x - 2 * torch.nn.functional.softplus(-x)


class _Triangle(Noise):
    """Bounded user noise (triangular on [-1, 1]) with only sample/cdf/log_prob."""

    bounded = True
    support = (-1.0, 1.0)
    breakpoints = (0.0,)

    def sample(self, shape, *, generator=None, device=None, dtype=None):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        u = torch.rand((2, *shape), generator=generator, dtype=dtype or torch.get_default_dtype())
        return u[0] - u[1]

    def cdf(self, x):
        x = x.clamp(-1.0, 1.0)
        return torch.where(x < 0, (1 + x) ** 2 / 2, 1 - (1 - x) ** 2 / 2)

    def log_prob(self, x):
        inside = x.abs() < 1
        return torch.where(inside, torch.log((1 - x.abs()).clamp_min(1e-300)),
                           torch.full_like(x, -math.inf))


def test_user_defined_noise():
    theta = torch.tensor([0.3, -0.1, 0.5, 0.0], dtype=F64)
    user = _LogisticByCdf()
    torch.testing.assert_close(user.argmax_probs(theta), Logistic().argmax_probs(theta),
                               atol=1e-10, rtol=0)
    torch.testing.assert_close(user.expected_max(theta), Logistic().expected_max(theta),
                               atol=1e-9, rtol=0)
    assert repr(user) == "_LogisticByCdf()" and user == user and user != _LogisticByCdf()
    with pytest.raises(NotImplementedError, match="sample"):
        user.sample((2,))
    # bounded user noise with a kink inside: split at θ_j + {-1, 0, 1}; vs scipy's triangular
    tri, ref = _Triangle(), stats.triang(c=0.5, loc=-1.0, scale=2.0)
    th = theta.numpy()
    kinks = sorted({t + k for t in th for k in (-1.0, 0.0, 1.0)})

    def pdf(x):
        return max(0.0, 1.0 - abs(x))

    def cdf(x):
        x = min(max(x, -1.0), 1.0)
        return (1 + x) ** 2 / 2 if x < 0 else 1 - (1 - x) ** 2 / 2

    grid = np.linspace(-1.5, 1.5, 31)
    np.testing.assert_allclose([cdf(x) for x in grid], ref.cdf(grid), atol=1e-15)
    np.testing.assert_allclose([pdf(x) for x in grid], ref.pdf(grid), atol=1e-15)

    def integrand(x, i):
        return pdf(x - th[i]) * np.prod([cdf(x - t) for j, t in enumerate(th) if j != i])

    p_ref = [integrate.quad(integrand, th.max() - 1, th.max() + 1, args=(i,), points=kinks,
                            epsabs=1e-14, epsrel=1e-13, limit=200)[0] for i in range(4)]
    p = tri.argmax_probs(theta)
    np.testing.assert_allclose(p.numpy(), p_ref, atol=1e-12)
    assert abs(p.sum().item() - 1) < 1e-12
    n = 100000
    u = theta + tri.sample((n, 4), generator=torch.Generator().manual_seed(8), dtype=F64)
    freq = torch.bincount(u.argmax(-1), minlength=4).double() / n
    assert ((freq - p).abs() < 5 * torch.sqrt(p * (1 - p) / n)).all()


class _Laplace(Noise):
    """Unbounded user noise with a kink at 0 (the example of the Noise docstring)."""

    breakpoints = (0.0,)

    def cdf(self, x):
        return torch.where(x < 0, 0.5 * torch.exp(x.clamp_max(0)), 1 - 0.5 * torch.exp(-x.clamp_min(0)))

    def log_prob(self, x):
        return -x.abs() - math.log(2)

    def icdf(self, u):
        return -torch.sign(u - 0.5) * torch.log1p(-2 * (u - 0.5).abs())


def test_user_noise_with_kink_vs_scipy():
    th = np.array([0.3, -0.1, 0.5, 0.0])
    kinks = sorted(th)

    def pdf(x):
        return 0.5 * math.exp(-abs(x))

    def cdf(x):
        return 0.5 * math.exp(x) if x < 0 else 1 - 0.5 * math.exp(-x)

    grid = np.linspace(-5, 5, 21)
    np.testing.assert_allclose([cdf(x) for x in grid], stats.laplace.cdf(grid), rtol=1e-14)

    def integrand(x, i):
        return pdf(x - th[i]) * np.prod([cdf(x - t) for j, t in enumerate(th) if j != i])

    p_ref = [integrate.quad(integrand, -50, 60, args=(i,), points=kinks, epsabs=1e-14,
                            epsrel=1e-13, limit=400)[0] for i in range(4)]
    theta = torch.tensor(th, dtype=F64, requires_grad=True)
    p = _Laplace().argmax_probs(theta)
    np.testing.assert_allclose(p.detach().numpy(), p_ref, atol=1e-11)
    (grad,) = torch.autograd.grad(_Laplace().expected_max(theta), theta)
    torch.testing.assert_close(grad, p.detach(), atol=1e-10, rtol=0)
    x = _Laplace().sample((4,), generator=torch.Generator().manual_seed(0))
    assert x.shape == (4,) and torch.isfinite(x).all()


class _OnlySample(Noise):
    def sample(self, shape, *, generator=None, device=None, dtype=None):
        return torch.zeros(shape)


def test_user_noise_without_density_raises():
    with pytest.raises(NotImplementedError, match="cdf"):
        _OnlySample().argmax_probs(torch.zeros(3))


# ---------------------------------------------------------------------------------------------
# properties


@settings(max_examples=25, deadline=None)
@given(d=st.integers(2, 6), spread=st.sampled_from([0.01, 0.5, 2.0, 30.0]),
       seed=st.integers(0, 2 ** 31 - 1), which=st.integers(0, len(ALL) - 1))
def test_argmax_probs_on_simplex(d, spread, seed, which):
    noise = ALL[which]
    theta = torch.randn(d, generator=torch.Generator().manual_seed(seed), dtype=F64) * spread
    p = noise.argmax_probs(theta)
    assert (p >= -1e-15).all()
    assert abs(p.sum().item() - 1.0) < 1e-10
    # Jensen: E[max] >= max E; and E[max] <= max θ + E[max of iid noise]
    e = noise.expected_max(theta).item()
    assert e >= (theta.max().item() + noise.mean) - 1e-10
    iid = noise.expected_max(torch.zeros(d, dtype=F64)).item()
    assert e <= theta.max().item() + iid + 1e-10


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("noise", ALL, ids=ids)
def test_cuda(noise):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = noise.sample((5, 3), generator=g)
    assert x.device.type == "cuda"
    theta = torch.tensor([0.4, 0.0, -0.3], device="cuda")
    p = noise.argmax_probs(theta)
    assert p.device.type == "cuda" and p.dtype == torch.float32
    torch.testing.assert_close(p.cpu(), noise.argmax_probs(theta.cpu()), atol=1e-6, rtol=0)
    torch.testing.assert_close(noise.expected_max(theta).cpu(), noise.expected_max(theta.cpu()),
                               atol=1e-6, rtol=0)
