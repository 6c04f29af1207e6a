"""Tests for perturb/noise/discrete.py.

Oracles: brute-force enumeration of the ``K^d`` outcomes (ties split uniformly), the
distribution functions written out with numpy, Monte Carlo frequencies with 5 standard errors.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from perturb.noise import Discrete, Noise

F64 = torch.float64

DISCRETE = [Discrete([-1.0, 0.0, 1.0]), Discrete([0.5, -2.0, 1.0], [0.2, 0.5, 0.3])]


def ids(noise: Noise) -> str:
    return repr(noise)


def test_discrete_normalises_and_drops_zero_mass():
    n = Discrete([2.0, -1.0, 0.0], [0.5 + 5e-7, 0.5, 0.0])
    assert abs(sum(n.probs) - 1.0) < 1e-15
    assert n.support == (-1.0, 2.0)
    x = n.sample((20000,), generator=torch.Generator().manual_seed(0))
    assert set(x.unique().tolist()) == {-1.0, 2.0}


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
