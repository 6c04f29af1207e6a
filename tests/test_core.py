"""Tests of perturb/relax.py: perturb, argmax, regularized_argmax, relax."""
import math

import pytest
import torch

from perturb import (
    Entropy,
    ExpFamilyEntropy,
    Gumbel,
    Logistic,
    NegativeExponential,
    Normal,
    Simplex,
    SquaredNorm,
    Structure,
    argmax,
    perturb,
    regularized_argmax,
    relax,
)

NOISES = [Gumbel(), Gumbel(0.7), Normal(0.5), Normal(), Logistic(), NegativeExponential(0.7)]


def _theta(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------------------------
# perturb
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("noise", NOISES)
def test_perturb_is_theta_plus_noise(noise):
    theta = _theta(3, 4)
    u = perturb(theta, noise, generator=torch.Generator().manual_seed(1))
    eps = noise.sample((3, 4), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    torch.testing.assert_close(u, theta + eps, rtol=0, atol=0)
    assert u.dtype == torch.float64 and u.device == theta.device


def test_perturb_n_samples_and_default_noise():
    theta = _theta(2, 3, dtype=torch.float32)
    u = perturb(theta, n_samples=5, generator=torch.Generator().manual_seed(2))
    assert u.shape == (5, 2, 3) and u.dtype == torch.float32
    eps = Gumbel().sample((5, 2, 3), generator=torch.Generator().manual_seed(2),
                          dtype=torch.float32)
    torch.testing.assert_close(u, theta + eps, rtol=0, atol=0)
    assert not torch.equal(u[0], u[1])  # independent samples


def test_perturb_differentiable_and_masks():
    theta = _theta(4).requires_grad_()
    perturb(theta).sum().backward()
    torch.testing.assert_close(theta.grad, torch.ones(4, dtype=torch.float64))
    masked = torch.tensor([0.0, -math.inf, 1.0])
    u = perturb(masked)
    assert u[1] == -math.inf and bool(torch.isfinite(u[[0, 2]]).all())


@pytest.mark.parametrize("call,match", [
    (lambda t: perturb(t, n_samples=0), "n_samples"),
    (lambda t: perturb(t, noise="gumbel"), "noise"),
    (lambda t: perturb(t.long()), "theta"),
    (lambda t: perturb(torch.full_like(t, math.nan)), "theta"),
])
def test_perturb_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call(_theta(3))


# --------------------------------------------------------------------------------------------
# argmax and regularized_argmax
# --------------------------------------------------------------------------------------------

def test_argmax_is_detached_one_hot():
    w = _theta(3, 5).requires_grad_()
    y = argmax(w)
    assert not y.requires_grad and bool(Simplex().check(y).all())
    torch.testing.assert_close(y.argmax(-1), w.argmax(-1))
    with pytest.raises(ValueError, match="structure"):
        argmax(w, structure="simplex")


def test_regularized_argmax_defaults_and_dispatch():
    w = _theta(2, 4)
    torch.testing.assert_close(regularized_argmax(w), torch.softmax(w, -1))
    torch.testing.assert_close(regularized_argmax(w, Simplex(), None, 0.5),
                               torch.softmax(w / 0.5, -1))
    torch.testing.assert_close(regularized_argmax(w, Simplex(), ExpFamilyEntropy()),
                               torch.softmax(w, -1))


def test_regularized_argmax_errors():
    w = _theta(2, 4)
    with pytest.raises(ValueError, match="supported: 'auto', 'analytic', 'unroll', "
                                         "'finite_difference'"):
        regularized_argmax(w, Simplex(), SquaredNorm(), backward="implicit")
    with pytest.raises(ValueError, match="backward"):
        regularized_argmax(w, backward="magic")
    with pytest.raises(ValueError, match="regularizer"):
        regularized_argmax(w, Simplex(), "entropy")
    with pytest.raises(ValueError, match="structure"):
        regularized_argmax(w, Entropy())
    with pytest.raises(ValueError, match="tau"):
        regularized_argmax(w, tau=0.0)
    with pytest.raises(ValueError, match="tau"):
        regularized_argmax(w, tau=torch.tensor([1.0, -1.0]))

    class _NoSolver(Structure):
        pass

    with pytest.raises(NotImplementedError, match=r"_NoSolver.*Entropy.*registered pairs"):
        regularized_argmax(w, _NoSolver())


# --------------------------------------------------------------------------------------------
# relax
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("noise", NOISES)
@pytest.mark.parametrize("reg", [Entropy(), SquaredNorm()])
@pytest.mark.parametrize("n_samples", [None, 3])
def test_relax_is_regularized_argmax_of_perturb(noise, reg, n_samples):
    theta = _theta(2, 5)
    y = relax(theta, Simplex(), noise, reg, 0.4, n_samples=n_samples,
              generator=torch.Generator().manual_seed(9))
    u = perturb(theta, noise, n_samples, generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(y, regularized_argmax(u, Simplex(), reg, 0.4), rtol=0, atol=0)
    assert y.shape == ((n_samples,) if n_samples else ()) + (2, 5)


@pytest.mark.parametrize("reg", [Entropy(), SquaredNorm()])
def test_relax_hard_is_straight_through(reg):
    theta = _theta(6, 5).requires_grad_()
    c = _theta(6, 5, seed=1)
    hard = relax(theta, regularizer=reg, tau=0.3, hard=True,
                 generator=torch.Generator().manual_seed(4))
    soft = relax(theta, regularizer=reg, tau=0.3, generator=torch.Generator().manual_seed(4))
    u = perturb(theta.detach(), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(hard, argmax(u), rtol=0, atol=1e-15)
    assert bool(Simplex().check(hard).all())
    (g_hard,) = torch.autograd.grad((hard * c).sum(), theta)
    (g_soft,) = torch.autograd.grad((soft * c).sum(), theta)
    torch.testing.assert_close(g_hard, g_soft)


@pytest.mark.parametrize("backward", ["auto", "analytic", "unroll", "finite_difference"])
def test_relax_backward_modes(backward):
    theta = _theta(3, 4).requires_grad_()
    c = _theta(3, 4, seed=2)
    y = relax(theta, tau=0.5, backward=backward, generator=torch.Generator().manual_seed(0))
    (g,) = torch.autograd.grad((y * c).sum(), theta)
    u = perturb(theta.detach(), generator=torch.Generator().manual_seed(0))
    s = torch.softmax(u / 0.5, -1)
    exact = s * (c - (c * s).sum(-1, keepdim=True)) / 0.5
    torch.testing.assert_close(g, exact, atol=1e-5 if backward == "finite_difference" else 1e-7,
                               rtol=1e-5)


def test_relax_gumbel_frequencies():
    """Hard Gumbel relax samples the categorical softmax(θ): 5 binomial standard errors."""
    theta = torch.tensor([0.3, -0.2, 1.1], dtype=torch.float64)
    n = 30_000
    y = relax(theta, hard=True, n_samples=n, generator=torch.Generator().manual_seed(5))
    p = torch.softmax(theta, -1)
    assert bool(((y.mean(0) - p).abs() <= 5 * (p * (1 - p) / n).sqrt()).all())


# --------------------------------------------------------------------------------------------
# the Gumbel sampler behind perturb/relax: one Exp(1) draw, G = −β log E
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_gumbel_sampler_distribution(dtype, scale):
    """Kolmogorov–Smirnov against the Gumbel CDF exp(−exp(−x/β)).

    n = 200,000 draws; the statistic must stay under 1.95/√n, the 0.1% critical value of the
    KS distribution (a fixed seed, so the test is deterministic: it failing means a wrong law).
    Plus moments within 5 standard errors and finite, bounded extremes.
    """
    n = 200_000
    x = Gumbel(scale).sample((n,), generator=torch.Generator().manual_seed(17), dtype=dtype)
    assert x.dtype == dtype and bool(torch.isfinite(x).all())
    xs = x.double().sort().values / scale
    cdf = torch.exp(-torch.exp(-xs))
    i = torch.arange(1, n + 1, dtype=torch.float64)
    ks = torch.maximum(i / n - cdf, cdf - (i - 1) / n).max().item()
    assert ks < 1.95 / math.sqrt(n), ks
    g = Gumbel(scale)
    assert abs(x.double().mean().item() - g.mean) < 5 * math.sqrt(g.variance / n)
    # float32: U ≥ tiny and −log U ≥ 2^-24 bound the draws to about [−4.5, 16.7]·β
    assert -4.5 * scale < x.min().item() and x.max().item() < 37.0 * scale


def test_gumbel_perturbation_is_bitwise_theta_plus_sample():
    """relax/perturb add θ − β log E; that is θ + Gumbel(β).sample(...) to the last bit."""
    for scale in (1.0, 0.7):
        theta = _theta(4, 6, dtype=torch.float32)
        u = perturb(theta, Gumbel(scale), n_samples=2, generator=torch.Generator().manual_seed(3))
        eps = Gumbel(scale).sample((2, 4, 6), generator=torch.Generator().manual_seed(3),
                                   dtype=torch.float32)
        assert torch.equal(u, theta + eps)


def test_relax_still_checks_user_noise():
    class _NaNNoise(Normal):
        def sample(self, shape, *, generator=None, device=None, dtype=None):
            return torch.full(tuple(shape), math.nan, dtype=dtype, device=device)

    with pytest.raises(ValueError, match="theta \\+ noise contains NaN"):
        relax(_theta(2, 3), noise=_NaNNoise())


@pytest.mark.parametrize("call,match", [
    (lambda t: relax(t, tau=0.0), "tau"),
    (lambda t: relax(t, tau=-2.0), "tau"),
    (lambda t: relax(torch.full_like(t, math.nan)), "theta"),
    (lambda t: relax(t.long()), "theta"),
    (lambda t: relax(t, hard="no"), "hard"),
    (lambda t: relax(t, backward="implicit"), "supported"),
    (lambda t: relax(t, n_samples=-1), "n_samples"),
    (lambda t: relax(t, structure=Gumbel()), "structure"),
    (lambda t: relax(t, generator=3), "generator"),
    (lambda t: relax(t, noise=Normal(), generator="g"), "generator"),
])
def test_relax_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call(_theta(2, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_relax_dtypes_and_stability(dtype):
    theta = (_theta(3, 8, dtype=dtype) * 1e4).requires_grad_()
    for reg in (Entropy(), SquaredNorm()):
        y = relax(theta, regularizer=reg, tau=1e-3, generator=torch.Generator().manual_seed(0))
        assert y.dtype == dtype and bool(torch.isfinite(y).all())
        (g,) = torch.autograd.grad(y[..., 0].sum(), theta)
        assert bool(torch.isfinite(g).all())
