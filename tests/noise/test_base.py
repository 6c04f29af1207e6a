"""Tests for perturb/noise/base.py: the Noise interface, over every built-in family and
user-defined subclasses, and the declared capabilities.

Oracles: scipy.stats (cdf, log density, quantiles), Monte Carlo with tolerances of 5 standard
errors, adaptive QUADPACK on user densities, autograd identities (∇ expected_max =
argmax_probs; symmetric Jacobian with zero row sums), and, for the capabilities, calling the
methods they declare.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

from perturb.noise import (Discrete, Gaussian, Gumbel, Logistic, NegativeExponential, Noise,
                           Normal, Uniform)
from perturb.noise.base import QuadratureLayout

F64 = torch.float64

CONTINUOUS = [Gumbel(), Gumbel(scale=0.4), Normal(), Normal(scale=2.5), Logistic(),
              Logistic(scale=0.3), NegativeExponential(), NegativeExponential(scale=0.6),
              Uniform(), Uniform(0.0, 3.0)]
DISCRETE = [Discrete([-1.0, 0.0, 1.0]), Discrete([0.5, -2.0, 1.0], [0.2, 0.5, 0.3])]
ALL = CONTINUOUS + DISCRETE


def ids(noise: Noise) -> str:
    return repr(noise)


def excess_kurtosis(noise: Noise) -> float:
    if isinstance(noise, Gumbel):
        return 12 / 5
    if isinstance(noise, Normal):
        return 0.0
    if isinstance(noise, Logistic):
        return 6 / 5
    if isinstance(noise, Uniform):
        return -6 / 5
    if isinstance(noise, NegativeExponential):
        return 6.0
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
    if isinstance(noise, NegativeExponential):
        return _Reflected(stats.expon(scale=noise.scale))
    raise TypeError(noise)


class _Reflected:
    """The law of −X for a frozen scipy distribution of X (scipy has no negative exponential)."""

    def __init__(self, dist):
        self.dist = dist

    def cdf(self, x):
        return self.dist.sf(-np.asarray(x))

    def logcdf(self, x):
        return self.dist.logsf(-np.asarray(x))

    def logpdf(self, x):
        return self.dist.logpdf(-np.asarray(x))

    def ppf(self, u):
        return -self.dist.isf(u)


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


@pytest.mark.parametrize("noise", ALL, ids=ids)
def test_sample_moments(noise):
    n = 40000
    x = noise.sample((n,), generator=torch.Generator().manual_seed(11), dtype=F64)
    se_mean = math.sqrt(noise.variance / n)
    assert abs(x.mean().item() - noise.mean) < 5 * se_mean
    se_var = noise.variance * math.sqrt((excess_kurtosis(noise) + 2) / n)
    assert abs(x.var().item() - noise.variance) < 5 * se_var
    assert noise.stddev == pytest.approx(math.sqrt(noise.variance))


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
# argmax_probs and expected_max: Monte Carlo, gradients, shapes


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
# declared capabilities


_FLAGS = ("has_log_prob", "has_cdf", "has_icdf", "has_sample", "has_variance",
          "has_closed_form", "has_argmax_probs")


def _works(fn, *args) -> bool:
    try:
        out = fn(*args)
    except NotImplementedError:
        return False
    return out is not None


@pytest.mark.parametrize("noise", ALL + [Noise()], ids=ids)
def test_declared_capabilities_are_true(noise, monkeypatch):
    # each flag of every built-in says exactly whether the method it names works
    x = torch.tensor([-0.3, 0.0, 0.4], dtype=F64)
    assert noise.has_log_prob == _works(noise.log_prob, x)
    assert noise.has_cdf == _works(noise.cdf, x)
    assert noise.has_icdf == _works(noise.icdf, torch.tensor([0.2, 0.7], dtype=F64))
    assert noise.has_sample == _works(noise.sample, (3,))
    assert noise.has_variance == _works(lambda: noise.variance)
    assert noise.has_argmax_probs == _works(noise.argmax_probs, x)
    assert noise.has_argmax_probs == _works(noise.expected_max, x)
    # has_closed_form: argmax_probs/expected_max never reach the quadrature
    from perturb.noise import _quadrature

    def refuse(*args, **kwargs):
        raise NotImplementedError("quadrature called")

    monkeypatch.setattr(_quadrature, "argmax_probs", refuse)
    monkeypatch.setattr(_quadrature, "expected_max", refuse)
    assert noise.has_closed_form == _works(noise.argmax_probs, x)
    assert noise.has_closed_form == _works(noise.expected_max, x)
    # declared on the class, not per instance; built-ins declare every flag in their own body
    assert all(isinstance(getattr(type(noise), f), bool) for f in _FLAGS)
    if type(noise) is not Noise:
        declared = {f for klass in type(noise).__mro__[:-1] if klass is not Noise
                    for f in _FLAGS if f in vars(klass)}
        assert declared == set(_FLAGS)


def test_continuous_and_bounded_flags_match_the_support():
    for noise in ALL:
        low, high = noise.support
        assert noise.bounded == (math.isfinite(low) and math.isfinite(high))
    assert [n.continuous for n in ALL] == [True] * len(CONTINUOUS) + [False] * len(DISCRETE)


def test_user_subclass_capabilities_come_from_the_base_class():
    # derived from what the subclass defines, at class creation; nothing is called
    assert (_LogisticByCdf.has_cdf, _LogisticByCdf.has_log_prob, _LogisticByCdf.has_icdf,
            _LogisticByCdf.has_sample, _LogisticByCdf.has_closed_form,
            _LogisticByCdf.has_argmax_probs) == (True, True, False, False, False, True)
    assert _Laplace.has_icdf and _Laplace.has_sample and not _Laplace.has_variance
    assert _Triangle.has_sample and _Triangle.has_argmax_probs and not _Triangle.has_icdf
    assert _OnlySample.has_sample and not _OnlySample.has_argmax_probs
    assert not any(getattr(Noise, f) for f in _FLAGS)

    class MyGumbel(Gumbel):            # inherits the parent's declarations
        pass

    assert all(getattr(MyGumbel, f) for f in _FLAGS)
    torch.testing.assert_close(MyGumbel().argmax_probs(torch.tensor([0.0, 1.0])),
                               torch.softmax(torch.tensor([0.0, 1.0]), -1))

    class Declared(_LogisticByCdf):    # a declaration in the class body wins over derivation
        has_cdf = False

    assert not Declared.has_cdf and not Declared.has_argmax_probs
    with pytest.raises(NotImplementedError, match="has_cdf=False"):
        Declared().argmax_probs(torch.zeros(3))

    class Counted(Noise):              # argmax_probs of its own: a closed form
        def _argmax_probs(self, theta):
            return torch.softmax(theta, -1)

    assert Counted.has_closed_form and Counted.has_argmax_probs and not Counted.has_cdf
    torch.testing.assert_close(Counted().argmax_probs(torch.tensor([0.0, 1.0])),
                               torch.softmax(torch.tensor([0.0, 1.0]), -1))


def test_default_quadrature_layout():
    # unbounded: quantiles from bisection on cdf (no icdf) or from icdf; bounded: the support
    lay = _LogisticByCdf().quadrature_layout(4)
    assert isinstance(lay, QuadratureLayout) and lay.order == 20
    assert lay.low == pytest.approx(special_logit(1e-14), abs=1e-9)
    assert lay.high == pytest.approx(special_logit(1 - 1e-14 / 4), abs=1e-6)
    assert lay.width == pytest.approx((lay.high - lay.low) / 64)
    lap = _Laplace().quadrature_layout(2)      # from its own icdf
    assert lap.low == _Laplace().icdf(torch.tensor(1e-14, dtype=F64)).item()
    assert _Triangle().quadrature_layout(3) == QuadratureLayout(-1.0, 1.0, math.inf, 24)


def special_logit(p: float) -> float:
    return math.log(p) - math.log1p(-p)
