"""NegativeExponential: closed forms against the generic quadrature, Monte Carlo and n = 2."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from perturb.noise import NegativeExponential, _quadrature

F64 = torch.float64


def test_two_scores_closed_form():
    """Gap Δ >= 0: P = (1 − e^{−Δ/s}/2, e^{−Δ/s}/2); E[max] = θ₁ − s(1 − e^{−Δ/s}/2)."""
    s, gap = 0.7, 0.9
    theta = torch.tensor([gap, 0.0], dtype=F64)
    e = math.exp(-gap / s)
    torch.testing.assert_close(NegativeExponential(s).argmax_probs(theta),
                               torch.tensor([1 - e / 2, e / 2], dtype=F64), rtol=0, atol=1e-15)
    # E[max] = θ₁ − ∫_{−∞}^{θ₁} F_max: the segments give s(1 − e^{−Δ/s}) + s e^{−Δ/s}/2
    want = gap - s * (1 - e) - s * e / 2
    assert NegativeExponential(s).expected_max(theta).item() == pytest.approx(want, abs=1e-15)


@settings(max_examples=60, deadline=None)
@given(d=st.integers(2, 7), scale=st.floats(0.05, 5.0), seed=st.integers(0, 2 ** 31 - 1),
       ties=st.booleans())
def test_closed_forms_match_the_generic_quadrature(d, scale, seed, ties):
    """The quadrature splits its panels at the density's jump (breakpoints = (0,)): an
    independent computation of the same integrals."""
    gen = torch.Generator().manual_seed(seed)
    theta = torch.randn(3, d, generator=gen, dtype=F64) * 2
    if ties:
        theta[:, 1] = theta[:, 0]
    noise = NegativeExponential(scale)
    torch.testing.assert_close(noise.argmax_probs(theta), _quadrature.argmax_probs(noise, theta),
                               rtol=0, atol=1e-11)
    torch.testing.assert_close(noise.expected_max(theta), _quadrature.expected_max(noise, theta),
                               rtol=1e-11, atol=1e-11 * scale)


def test_monte_carlo_400k():
    """400k draws: |P − P̂| below 5 standard errors, E[max] likewise."""
    noise = NegativeExponential(0.8)
    theta = torch.tensor([[0.3, -0.2, 0.0, 1.1], [0.0, 0.0, 0.0, 0.0]], dtype=F64)
    n = 400_000
    x = theta[:, None] + noise.sample((2, n, 4), generator=torch.Generator().manual_seed(3),
                                      dtype=F64)
    freq = torch.nn.functional.one_hot(x.argmax(-1), 4).to(F64).mean(1)
    p = noise.argmax_probs(theta)
    assert ((freq - p).abs() < 5 * (p * (1 - p) / n).sqrt()).all()
    m = x.amax(-1)
    assert ((m.mean(1) - noise.expected_max(theta)).abs() < 5 * m.std(1) / math.sqrt(n)).all()


def test_argmax_probs_is_the_gradient_of_expected_max_and_gradchecks():
    theta = torch.tensor([[0.4, -0.3, 0.1], [0.2, 0.2, -1.0]], dtype=F64, requires_grad=True)
    noise = NegativeExponential(0.6)
    (grad,) = torch.autograd.grad(noise.expected_max(theta).sum(), theta)
    torch.testing.assert_close(grad, noise.argmax_probs(theta.detach()), rtol=0, atol=1e-15)
    torch.autograd.gradcheck(noise.argmax_probs, (theta,))
    torch.autograd.gradcheck(noise.expected_max, (theta,))


def test_tied_scores_have_finite_gradients_equal_to_the_quadrature_jacobian():
    noise = NegativeExponential(0.7)
    theta = torch.zeros(3, dtype=F64, requires_grad=True)
    jac = torch.autograd.functional.jacobian(noise.argmax_probs, theta)
    ref = torch.autograd.functional.jacobian(lambda t: _quadrature.argmax_probs(noise, t), theta)
    assert torch.isfinite(jac).all()
    torch.testing.assert_close(jac, ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=str)
def test_extremes_stay_finite(dtype):
    noise = NegativeExponential(1e-3)
    theta = torch.tensor([[1e4, -1e4, 0.0, 1e4 - 1e-3], [5.0, 5.0, 5.0, 5.0]], dtype=dtype,
                         requires_grad=True)
    p = noise.argmax_probs(theta)
    m = noise.expected_max(theta)
    (p[:, 0].sum() + m.sum()).backward()
    assert torch.isfinite(p).all() and torch.isfinite(m).all()
    assert torch.isfinite(theta.grad).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(2, dtype=dtype))
    assert p.dtype == dtype


def test_dim_and_batch():
    noise = NegativeExponential()
    theta = torch.randn(2, 5, 3, dtype=F64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(noise.argmax_probs(theta, dim=1),
                               noise.argmax_probs(theta.transpose(1, 2)).transpose(1, 2))
    assert noise.expected_max(theta, dim=1).shape == (2, 3)


def test_support_and_bad_scale():
    assert NegativeExponential().support == (-math.inf, 0.0)
    assert NegativeExponential(2.0) == NegativeExponential(2.0) != NegativeExponential(1.0)
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="scale"):
            NegativeExponential(bad)


def test_jacobian_matches_finite_differences_at_ties():
    noise = NegativeExponential(0.7)
    theta = torch.tensor([0.2, 0.2, 0.2, -0.4], dtype=F64)
    jac = torch.autograd.functional.jacobian(noise.argmax_probs, theta)
    # P is C¹ but not C² at ties (the density jumps): central differences are only O(h) there
    # (about 1e-6 at h = 1e-6, measured), so h = 1e-7 and a 1e-6 tolerance
    h = 1e-7
    fd = torch.stack([(noise.argmax_probs(theta + h * e) - noise.argmax_probs(theta - h * e))
                      / (2 * h) for e in torch.eye(4, dtype=F64)], -1)
    torch.testing.assert_close(jac, fd, rtol=0, atol=1e-6)
