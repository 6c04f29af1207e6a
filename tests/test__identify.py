"""Tests of perturb/_identify.py, the identifiability engine behind perturb.checks: argument
checks, parameter spaces, the Perturb-Argmax statistics, the QMC softmax estimator and the
inverse solve, each against an independent reference (closed forms, finite differences,
Monte Carlo with stated tolerances)."""
import math

import pytest
import torch

from perturb import _identify as idf
from perturb.noise import Gumbel, Normal, Uniform

F64 = torch.float64


def test_check_distribution_normalises_and_names_the_problem():
    q = idf.check_distribution([0.2, 0.3, 0.5])
    assert q.dtype == F64 and torch.allclose(q.sum(), torch.tensor(1.0, dtype=F64))
    for bad, match in [([[0.5, 0.5]], "1-D"), ([1.0], "length"), ([0.5, float("nan")], "NaN"),
                       ([1.2, -0.2], "non-negative"), ([0.5, 0.6], "sum to 1"),
                       ([1.0, 0.0], "open simplex")]:
        with pytest.raises(ValueError, match=match):
            idf.check_distribution(bad, "p")
    assert torch.equal(idf.check_distribution([1.0, 0.0], strict=False),
                       torch.tensor([1.0, 0.0], dtype=F64))
    with pytest.raises(ValueError, match="d must be >= 2"):
        idf.check_d(1)


@pytest.mark.parametrize("space", ["free", "last_zero", "sum_zero"])
def test_tangent_basis_spans_the_space_and_to_space_keeps_the_class(space):
    d = 5
    basis = idf.tangent_basis(d, space)
    theta = torch.randn(d, dtype=F64, generator=torch.Generator().manual_seed(0))
    rep = idf.to_space(theta, space)
    diff = rep - theta
    assert torch.allclose(diff, diff[0].expand(d))                    # same θ + R·1 class
    if space == "free":
        assert torch.equal(basis, torch.eye(d, dtype=F64))
        return
    assert basis.shape == (d, d - 1)
    if space == "last_zero":
        assert rep[-1] == 0 and (basis[-1] == 0).all()
    else:
        assert abs(float(rep.sum())) < 1e-12
        torch.testing.assert_close(basis.T @ basis, torch.eye(d - 1, dtype=F64))   # orthonormal
        torch.testing.assert_close(basis.sum(0), torch.zeros(d - 1, dtype=F64), atol=1e-12,
                                   rtol=0)


def test_gumbel_argmax_stats_are_the_softmax_and_its_jacobian():
    """Perturb-Argmax under Gumbel(1) is softmax(θ): p and H = diag(p) − p pᵀ (closed form)."""
    theta = torch.tensor([0.3, -1.0, 0.8, 0.0], dtype=F64)
    p, log_p, h = idf.argmax_stats(theta, Gumbel())
    want = torch.softmax(theta, -1)
    torch.testing.assert_close(p, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(log_p, torch.log(want), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(h, torch.diag(want) - torch.outer(want, want), rtol=1e-8,
                               atol=1e-10)


def test_normal_argmax_of_two_is_a_probit_and_jacobian_matches_finite_differences():
    """d = 2, Normal(1): P(argmax = 0) = Φ((θ₀ − θ₁)/√2); H equals central differences of p."""
    theta = torch.tensor([0.4, -0.3], dtype=F64)
    p, _, h = idf.argmax_stats(theta, Normal())
    want = 0.5 * (1 + math.erf(0.7 / 2))
    assert float(p[0]) == pytest.approx(want, rel=1e-10)
    step = 1e-5
    cols = [(idf.argmax_stats(theta + step * e, Normal(), jacobian=False)[0]
             - idf.argmax_stats(theta - step * e, Normal(), jacobian=False)[0]) / (2 * step)
            for e in torch.eye(2, dtype=F64)]
    torch.testing.assert_close(h, torch.stack(cols, -1), rtol=1e-6, atol=1e-8)


def test_softmax_estimator_matches_monte_carlo_of_its_definition():
    """E[softmax((θ + ε)/τ)] by the QMC estimator against plain Monte Carlo (200k draws),
    within 5 combined standard errors; its Jacobian against finite differences on the same
    (common) points."""
    theta = torch.tensor([0.5, 0.0, -0.5], dtype=F64)
    est = idf.SoftmaxEstimator(Normal(), 3, 0.5, n_samples=2 ** 10, n_reps=8,
                               generator=torch.Generator().manual_seed(0))
    s = est.stats(theta)
    g = torch.Generator().manual_seed(1)
    eps = torch.randn(200_000, 3, dtype=F64, generator=g)
    draws = torch.softmax((theta + eps) / 0.5, -1)
    mc, mc_se = draws.mean(0), draws.std(0) / math.sqrt(len(draws))
    assert ((s["p"] - mc).abs() <= 5 * (s["se"] + mc_se)).all()
    step = 1e-6
    cols = [(est.stats(theta + step * e, jacobian=False)["p"]
             - est.stats(theta - step * e, jacobian=False)["p"]) / (2 * step)
            for e in torch.eye(3, dtype=F64)]
    torch.testing.assert_close(s["hess"], torch.stack(cols, -1), rtol=1e-5, atol=1e-8)


def test_draw_noise_uses_quasi_random_points_with_the_right_law():
    eps = idf.draw_noise(Normal(), (4, 2 ** 12, 2), torch.Generator().manual_seed(0))
    assert eps.shape == (4, 4096, 2) and torch.isfinite(eps).all()
    assert abs(float(eps.mean())) < 0.01 and abs(float(eps.std()) - 1.0) < 0.01


@pytest.mark.parametrize("noise", [Gumbel(), Normal()], ids=repr)
def test_solve_inverse_recovers_the_scores_of_a_distribution(noise):
    """θ* with ∇F(θ*) = p: for Gumbel the closed form log(p/p_d); for Normal, p(θ*) = p."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=F64)
    model = idf.Model(noise, 4, "argmax", 1.0)
    theta, converged, _, res = idf.solve_inverse(p, model)
    assert converged and res <= 1e-12 and theta[-1] == 0
    if isinstance(noise, Gumbel):
        torch.testing.assert_close(theta, torch.log(p / p[-1]), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(idf.argmax_probs_exact(theta, noise), p, rtol=1e-10, atol=1e-12)


def test_initial_theta_stays_inside_a_bounded_support():
    p = torch.tensor([0.9, 0.09, 0.01], dtype=F64)
    theta = idf.initial_theta(p, Uniform(-0.5, 0.5))
    assert theta[-1] == 0 and float(theta.max() - theta.min()) <= 0.9 + 1e-12
