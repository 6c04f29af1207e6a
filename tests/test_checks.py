"""Tests for perturb.checks: completeness, minimality, identify.

Oracles: the Gumbel-argmax inverse log(p/p_d) (closed form), the d = 2 Gaussian-argmax closed
form Φ((θ_1 − θ_2)/(σ√2)), Monte Carlo with tolerances from the standard error, and witnesses
re-checked through the user-facing ``noise.argmax_probs``.
"""
import math

import pytest
import torch

from perturb.checks import (
    CompletenessReport,
    MinimalityReport,
    check_completeness,
    check_minimality,
    identify,
)
from perturb.noise import Discrete, Gumbel, Logistic, NegativeExponential, Noise, Normal, Uniform

F64 = torch.float64
FAST = {"n_samples": 2 ** 9, "n_reps": 8}          # QMC settings for the softmax checks


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------ identify

@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_identify_gumbel_argmax_is_log_ratio(scale):
    p = torch.tensor([0.05, 0.15, 0.3, 0.2, 0.3], dtype=F64)
    res = identify(p, Gumbel(scale), kind="argmax")
    expected = scale * torch.log(p / p[-1])
    torch.testing.assert_close(res.theta, expected, atol=1e-10, rtol=0)
    assert res.converged and res.residual < 1e-12 and res.std_error == 0.0


def test_identify_gaussian_d2_matches_phi_closed_form():
    # P(θ_1 + ε_1 > θ_2 + ε_2) = Φ((θ_1 − θ_2)/(σ√2)) => θ_1 = σ√2 Φ⁻¹(p_1) with θ_2 = 0
    sigma = 1.3
    for p1 in (0.02, 0.3, 0.5, 0.9):
        p = torch.tensor([p1, 1 - p1], dtype=F64)
        res = identify(p, Normal(sigma), kind="argmax")
        closed = sigma * math.sqrt(2) * torch.special.ndtri(torch.tensor(p1, dtype=F64))
        assert abs(res.theta[0].item() - closed.item()) < 1e-8
        assert res.theta[1].item() == 0.0


@pytest.mark.parametrize("noise", [Normal(), Logistic(), Uniform(), Gumbel(0.5),
                                   NegativeExponential(0.8)],
                         ids=lambda n: type(n).__name__)
def test_identify_argmax_round_trip(noise):
    theta0 = torch.tensor([0.4, -0.7, 0.1, 0.0], dtype=F64)
    p = noise.argmax_probs(theta0).to(F64)
    res = identify(p, noise, kind="argmax")
    assert res.converged
    assert res.residual < 1e-10
    torch.testing.assert_close(res.theta, theta0, atol=1e-5, rtol=0)
    torch.testing.assert_close(noise.argmax_probs(res.theta).to(F64), p, atol=1e-10, rtol=0)


@pytest.mark.parametrize("noise", [Gumbel(), Normal()], ids=lambda n: type(n).__name__)
def test_identify_softmax_round_trip_within_mc_error(noise):
    tau = 0.5
    theta0 = torch.tensor([0.5, -0.4, 0.2, 0.0], dtype=F64)
    # the target from an independent plain Monte-Carlo estimate with its own standard error
    g = _g(7)
    eps = noise.sample((2 ** 17, 4), generator=g, dtype=F64)
    s = torch.softmax((theta0 + eps) / tau, -1)
    p, p_se = s.mean(0), s.std(0) / math.sqrt(s.shape[0])
    res = identify(p, noise, kind="softmax", tau=tau, n_samples=2 ** 11, n_reps=8, generator=_g(1))
    assert res.converged
    se = math.sqrt(res.std_error ** 2 + float(p_se.max()) ** 2)
    assert res.residual <= 5 * se + 1e-9, (res.residual, se)
    # θ error ~ H⁻¹ (p error): H's smallest eigenvalue on θ_d = 0 bounds the amplification
    assert float((res.theta - theta0).abs().max()) < 50 * se / tau + 1e-6


def test_identify_softmax_gumbel_is_not_argmax_inverse():
    # E[softmax((θ+G)/τ)] ≠ softmax(θ): the exact Gumbel-argmax inverse is off for τ = 1
    p = torch.tensor([0.1, 0.3, 0.6], dtype=F64)
    res = identify(p, Gumbel(), kind="softmax", tau=1.0, generator=_g(), **FAST)
    assert res.residual <= 5 * res.std_error + 1e-9
    assert float((res.theta - torch.log(p / p[-1])).abs().max()) > 0.1


def test_identify_returns_dtype_of_p_and_last_zero():
    p = torch.tensor([0.25, 0.25, 0.5], dtype=torch.float32)
    res = identify(p, Gumbel(), kind="argmax")
    assert res.theta.dtype == torch.float32 and res.theta[-1].item() == 0.0


# --------------------------------------------------------------------------------- minimality

@pytest.mark.parametrize("kind", ["softmax", "argmax"])
def test_free_space_is_not_minimal_translation_witness(kind):
    noise = Normal()
    rep = check_minimality(noise, 3, kind=kind, param_space="free", n_points=2, generator=_g(),
                           **FAST)
    assert isinstance(rep, MinimalityReport) and not rep.minimal
    w = rep.witness
    shift = w.theta_prime - w.theta
    assert float(shift.abs().max()) > 0.5
    torch.testing.assert_close(shift, shift[0].expand(3), atol=1e-12, rtol=0)  # c·1
    torch.testing.assert_close(w.probs, w.probs_prime, atol=1e-12, rtol=0)
    if kind == "argmax":
        torch.testing.assert_close(noise.argmax_probs(w.theta), noise.argmax_probs(w.theta_prime),
                                   atol=1e-12, rtol=0)
    assert abs(rep.details["min_eigenvalue"]) < 1e-8      # F is affine along 1
    assert "translation" in str(rep)


def test_uniform_argmax_not_minimal_verified_witness():
    noise = Uniform(-1.0, 1.0)
    rep = check_minimality(noise, 3, kind="argmax", param_space="last_zero", n_points=2,
                           generator=_g())
    assert not rep.minimal and rep.witness is not None
    th, th2 = rep.witness.theta, rep.witness.theta_prime
    assert th[-1].item() == 0.0 and th2[-1].item() == 0.0           # both in Θ
    assert float((th - th2).abs().max()) >= 0.5
    pa, pb = noise.argmax_probs(th), noise.argmax_probs(th2)
    torch.testing.assert_close(pa, pb, atol=1e-12, rtol=0)
    # Monte-Carlo confirmation that both give the same distribution
    eps = noise.sample((20000, 3), generator=_g(3), dtype=F64)
    for t in (th, th2):
        freq = torch.bincount((t + eps).argmax(-1), minlength=3).to(F64) / eps.shape[0]
        assert float((freq - pa).abs().max()) < 5 * 0.5 / math.sqrt(eps.shape[0])


def test_discrete_argmax_not_minimal_verified_witness():
    noise = Discrete(torch.tensor([-1.0, 0.0, 1.5]), torch.tensor([0.3, 0.5, 0.2]))
    rep = check_minimality(noise, 3, kind="argmax", param_space="sum_zero", n_points=2,
                           generator=_g())
    assert not rep.minimal and rep.witness is not None
    th, th2 = rep.witness.theta, rep.witness.theta_prime
    assert abs(th.sum().item()) < 1e-12 and abs(th2.sum().item()) < 1e-12   # both in Θ
    assert float((th - th2).abs().max()) > 0
    torch.testing.assert_close(noise.argmax_probs(th), noise.argmax_probs(th2), atol=1e-12,
                               rtol=0)
    assert rep.details["subgradient_jump_at_0"] > 0.01   # ∂F multi-valued at a tie


@pytest.mark.parametrize("noise", [Gumbel(), Normal()], ids=lambda n: type(n).__name__)
@pytest.mark.parametrize("space", ["last_zero", "sum_zero"])
def test_softmax_minimal_on_slices(noise, space):
    rep = check_minimality(noise, 3, kind="softmax", param_space=space, n_points=3, tau=0.5,
                           generator=_g(), **FAST)
    assert rep.minimal and rep.witness is None, str(rep)
    assert rep.details["min_eigenvalue"] > 5 * rep.details["min_eigenvalue_uncertainty"]


@pytest.mark.parametrize("noise", [Gumbel(), Normal(), Logistic()],
                         ids=lambda n: type(n).__name__)
def test_continuous_argmax_minimal_on_last_zero(noise):
    rep = check_minimality(noise, 3, kind="argmax", param_space="last_zero", n_points=3,
                           generator=_g())
    assert rep.minimal and rep.witness is None, str(rep)


def test_uniform_softmax_is_minimal_saturation_rejected():
    rep = check_minimality(Uniform(), 3, kind="softmax", n_points=2, tau=0.2, generator=_g(),
                           **FAST)
    assert rep.minimal, str(rep)
    assert "rejected" in rep.details["witness_search"]


def test_gumbel_hessian_matches_closed_form():
    # Gumbel-argmax: ∇²F = diag(p) − p pᵀ; on θ_d = 0 the smallest eigenvalue is positive
    from perturb._identify import argmax_quadrature

    theta = torch.tensor([0.3, -1.0, 0.0], dtype=F64)
    p, _, hess = argmax_quadrature(theta, Gumbel())
    torch.testing.assert_close(hess, torch.diag(p) - torch.outer(p, p), atol=1e-10, rtol=0)


# ------------------------------------------------------------------------------- completeness

@pytest.mark.parametrize("noise", [Gumbel(), Normal()], ids=lambda n: type(n).__name__)
def test_softmax_complete_on_last_zero(noise):
    rep = check_completeness(noise, 3, kind="softmax", n_interior=1, vertex_eps=(1e-2, 1e-4),
                             n_vertices=1, generator=_g(), **FAST)
    assert isinstance(rep, CompletenessReport)
    assert rep.complete and rep.witness is None, str(rep)
    assert rep.details["n_targets"] == 1 + 1 + 1 * 2     # uniform, Dirichlet, vertex x 2
    assert "complete: YES" in str(rep)


@pytest.mark.parametrize("noise", [Gumbel(), Normal(), Uniform()], ids=lambda n: type(n).__name__)
def test_argmax_complete_continuous(noise):
    rep = check_completeness(noise, 3, kind="argmax", param_space="sum_zero", n_interior=2,
                             generator=_g())
    assert rep.complete, str(rep)
    assert rep.details["worst_residual"] < 1e-8


def test_softmax_completeness_worst_target_with_wide_acceptance():
    # every excess residual − n_sigma·std_error is below −1 here: the worst target is still the
    # one of largest excess (this used to raise a TypeError)
    rep = check_completeness(Gumbel(), 3, kind="softmax", n_interior=1, n_vertices=1,
                             vertex_eps=(1e-2,), n_sigma=1e12, generator=_g(), **FAST)
    assert rep.complete and rep.witness is None, str(rep)
    per = rep.details["per_target"]
    excess = [t["residual"] - 1e12 * t["std_error"] for t in per]
    assert max(excess) < -1.0
    worst = per[excess.index(max(excess))]
    assert rep.details["worst_target"] == worst["target"]
    assert rep.details["worst_residual"] == worst["residual"]


def test_discrete_argmax_not_complete_witness():
    noise = Discrete(torch.tensor([-1.0, 1.0]), torch.tensor([0.5, 0.5]))
    rep = check_completeness(noise, 2, kind="argmax", generator=_g())
    assert not rep.complete and rep.witness is not None
    w = rep.witness
    assert w.residual > 1e-3
    torch.testing.assert_close(noise.argmax_probs(w.theta).to(F64), w.probs.to(F64), atol=1e-12,
                               rtol=0)
    # exhaustive for d = 2: P(argmax = 1) only takes finitely many values; check a fine sweep
    sweep = torch.linspace(-4, 4, 801, dtype=F64)
    probs = torch.stack([noise.argmax_probs(torch.stack([t, torch.zeros((), dtype=F64)]))
                         for t in sweep]).to(F64)
    assert float((probs - w.target).abs().max(-1).values.min()) >= w.residual - 1e-12


# -------------------------------------------------------------------------------- bad inputs

@pytest.mark.parametrize("p, match", [
    ([0.5, -0.1, 0.6], "non-negative"),
    ([0.2, 0.2, 0.2], "sum to 1"),
    ([1.0], "length"),
    ([[0.5, 0.5]], "1-D"),
    ([0.0, 1.0], "open simplex"),
    ([float("nan"), 1.0], "NaN"),
])
def test_identify_bad_p(p, match):
    with pytest.raises(ValueError, match=match):
        identify(torch.tensor(p, dtype=F64), Gumbel(), kind="argmax")


def test_bad_arguments():
    with pytest.raises(ValueError, match="d must be >= 2"):
        check_minimality(Gumbel(), 1)
    with pytest.raises(ValueError, match="tau"):
        check_completeness(Gumbel(), 3, tau=0.0)
    with pytest.raises(ValueError, match="tau"):
        identify(torch.tensor([0.5, 0.5]), Gumbel(), tau=-1.0)
    with pytest.raises(ValueError, match="kind"):
        check_minimality(Gumbel(), 3, kind="sparsemax")
    with pytest.raises(ValueError, match="param_space"):
        check_completeness(Gumbel(), 3, param_space="first_zero")
    with pytest.raises(ValueError, match="not identifiable"):
        identify(torch.tensor([0.5, 0.5]), Discrete(torch.tensor([0.0, 1.0]),
                                                     torch.tensor([0.5, 0.5])), kind="argmax")


def test_noise_without_needed_methods():
    class OnlySample:
        def sample(self, shape, generator=None, device=None, dtype=None):
            return torch.randn(shape, generator=generator, dtype=dtype or F64)

    class Nothing:
        pass

    with pytest.raises(ValueError, match="cdf"):
        check_minimality(OnlySample(), 3, kind="argmax")
    with pytest.raises(ValueError, match="sample"):
        check_completeness(Nothing(), 3, kind="softmax")
    # a user noise with only `sample` works for Perturb-Softmax (plain Monte Carlo)
    rep = check_minimality(OnlySample(), 3, kind="softmax", n_points=1, generator=_g(), **FAST)
    assert rep.minimal


def test_user_noise_with_cdf_and_log_prob_argmax():
    class HyperbolicSecant:  # not a perturb Noise: duck-typed, quadrature from cdf/log_prob
        variance = 1.0
        # the same density as the Noise subclass below, borrowed as plain functions
        sample, cdf, log_prob = _SechNoise.sample, _SechNoise.cdf, _SechNoise.log_prob

    noise = HyperbolicSecant()
    res = identify(torch.tensor([0.3, 0.2, 0.5], dtype=F64), noise, kind="argmax")
    assert res.converged and res.residual < 1e-10
    # Monte-Carlo check of the quadrature model at the solution
    eps = noise.sample((200000, 3), generator=_g(5))
    freq = torch.bincount((res.theta + eps).argmax(-1), minlength=3).to(F64) / eps.shape[0]
    assert float((freq - torch.tensor([0.3, 0.2, 0.5], dtype=F64)).abs().max()) \
        < 5 * 0.5 / math.sqrt(eps.shape[0])


# ------------------------------------------------- one quadrature, declared capabilities

# Computed on main at 0461c72, before the noise package: identify(p, noise, kind="argmax")
# (θ with θ_d = 0) and the smallest Hessian eigenvalue of check_minimality(noise, 3,
# kind="argmax", n_points=3, generator=manual_seed(0)); then by a separate quadrature in
# perturb/_identify.py (panels of 0.25 std, 16 nodes). The values must not move beyond the
# accuracy of either rule.
_MAIN_THETA = [
    (Normal(), [0.05, 0.15, 0.3, 0.2, 0.3],
     [-1.1358019488990654, -0.4865734746473811, 0.0, -0.2932842396066442, 0.0]),
    (Logistic(0.6), [1e-12, 1e-6, 0.3, 0.7 - 1e-6 - 1e-12],
     [-16.918287548448305, -8.628973262634444, -0.7581664997544955, 0.0]),
    (Uniform(), [0.2, 0.3, 0.5], [-0.4317518227663526, -0.25563033135879976, 0.0]),
]
_MAIN_MIN_EIGENVALUE = [(Normal(), 0.0028495501996448), (Logistic(0.6), 0.0030428955891380616),
                        (Gumbel(0.5), 0.007492397348436694)]


@pytest.mark.parametrize("noise, p, theta", _MAIN_THETA, ids=lambda x: repr(x)[:20])
def test_identify_same_as_before_the_refactor(noise, p, theta):
    res = identify(torch.tensor(p, dtype=F64), noise, kind="argmax")
    assert res.converged
    torch.testing.assert_close(res.theta, torch.tensor(theta, dtype=F64), atol=1e-12, rtol=0)


@pytest.mark.parametrize("noise, lam", _MAIN_MIN_EIGENVALUE, ids=lambda x: repr(x)[:20])
def test_minimality_same_as_before_the_refactor(noise, lam):
    rep = check_minimality(noise, 3, kind="argmax", n_points=3, generator=_g())
    assert rep.minimal
    assert rep.details["min_eigenvalue"] == pytest.approx(lam, rel=1e-12, abs=1e-15)
    assert rep.details["min_eigenvalue_uncertainty"] < 1e-15   # the 2x refined rule agrees


def test_checks_use_the_noise_quadrature():
    # one rule: the model's p equals noise.argmax_probs, its Hessian the autograd Jacobian of it
    from perturb import _identify
    from perturb.noise import _quadrature

    theta = torch.tensor([0.3, -1.0, 0.0], dtype=F64)
    for noise in (Normal(), Logistic(), Uniform()):
        p, _, hess = _identify.argmax_quadrature(theta, noise)
        torch.testing.assert_close(p, noise.argmax_probs(theta), atol=1e-13, rtol=0)
        jac = torch.autograd.functional.jacobian(noise.argmax_probs, theta)
        torch.testing.assert_close(hess, jac, atol=1e-11, rtol=0)
        ref = _quadrature.log_argmax_probs(noise, theta)
        assert all(torch.equal(a, b) for a, b in zip((p, hess), (ref[0], ref[2])))


class _SechNoise(Noise):
    """A user Noise subclass with only sample, cdf and log_prob (hyperbolic secant, variance 1)."""

    def sample(self, shape, *, generator=None, device=None, dtype=None):
        u = torch.rand(shape, generator=generator, dtype=dtype or F64)
        return (2 / math.pi) * torch.log(torch.tan(math.pi * u / 2))

    def cdf(self, x):
        return (2 / math.pi) * torch.atan(torch.exp(math.pi * x / 2))

    def log_prob(self, x):
        return -math.log(2.0) - torch.log(torch.cosh(math.pi * x / 2))


def test_user_noise_subclass_with_sample_cdf_log_prob_works_in_checks():
    noise = _SechNoise()
    assert noise.has_argmax_probs and not noise.has_icdf and not noise.has_variance
    target = torch.tensor([0.3, 0.2, 0.5], dtype=F64)
    res = identify(target, noise, kind="argmax")
    assert res.converged and res.residual < 1e-10
    # Monte-Carlo check of the quadrature model at the solution
    eps = noise.sample((200000, 3), generator=_g(5))
    freq = torch.bincount((res.theta + eps).argmax(-1), minlength=3).to(F64) / eps.shape[0]
    assert float((freq - target).abs().max()) < 5 * 0.5 / math.sqrt(eps.shape[0])
    rep = check_minimality(noise, 3, kind="argmax", n_points=2, generator=_g())
    assert rep.minimal, str(rep)
    assert not check_minimality(noise, 3, kind="argmax", param_space="free", n_points=1,
                                generator=_g()).minimal
    assert check_completeness(noise, 3, kind="argmax", n_interior=1, generator=_g()).complete
    # Perturb-Softmax through its sample (no icdf: plain Monte Carlo)
    assert check_minimality(noise, 3, kind="softmax", n_points=1, generator=_g(), **FAST).minimal
    # the same density as the duck-typed HyperbolicSecant of the test above: same θ
    class Duck:
        variance = 1.0
        sample, cdf, log_prob = _SechNoise.sample, _SechNoise.cdf, _SechNoise.log_prob

    torch.testing.assert_close(identify(target, Duck(), kind="argmax").theta, res.theta,
                               atol=1e-12, rtol=0)


def test_capabilities_are_read_not_probed():
    # checking what a noise can do calls none of its methods
    from perturb import _identify

    calls = []

    class Recorder:
        def __getattr__(self, name):
            if name in ("sample", "cdf", "log_prob", "icdf", "argmax_probs", "log_cdf"):
                return lambda *a, **k: calls.append(name)
            raise AttributeError(name)

    wrapped = _identify.as_noise(Recorder())
    _identify.check_noise(wrapped, "argmax")
    _identify.check_noise(wrapped, "softmax")
    assert not _identify.is_discrete(wrapped) and not _identify.is_bounded(wrapped)
    assert _identify.noise_std(wrapped) == 1.0
    assert calls == []
    assert wrapped.has_cdf and wrapped.has_icdf and wrapped.has_closed_form
    for noise in (Gumbel(), Normal(), Uniform(), _SechNoise()):
        assert _identify.as_noise(noise) is noise
    with pytest.raises(ValueError, match="cdf"):
        check_minimality(object(), 3, kind="argmax")
