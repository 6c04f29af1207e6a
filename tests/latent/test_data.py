"""Tests of perturb/latent/data.py: the synthetic nonlinear-ICA data, perturbed binary
observations and the binarised 8×8 digits."""
import math

import pytest
import torch

from perturb.latent.data import binarized_digits, make_nonlinear_ica, perturbed_binary
from perturb.noise import Logistic, Normal


def test_nonlinear_ica_shapes_and_injective_mixing(generator):
    data = make_nonlinear_ica(n_sources=3, n_segments=4, n_per_segment=50, d_obs=10,
                              generator=generator)
    assert data.x.shape == (200, 10) and data.s.shape == (200, 3) and data.u.shape == (200,)
    # the mixing is injective: a linear read-out of x through an MLP is not needed to tell
    # sources apart; at least the Jacobian has full column rank at the data
    j = torch.autograd.functional.jacobian(data.mixing, data.s[:1])[0, :, 0, :]
    assert torch.linalg.matrix_rank(j) == 3


def test_nonlinear_ica_segments_follow_their_own_gaussians():
    """Within a segment the sources are independent Gaussians with their own mean and spread:
    the segment means lie in (−3, 3) and the standard deviations in (0.5, 3), up to Monte Carlo
    error (4,000 draws per segment: 5 standard errors), and segments differ."""
    data = make_nonlinear_ica(n_sources=2, n_segments=3, n_per_segment=4000, d_obs=4,
                              generator=torch.Generator().manual_seed(1))
    for seg in range(3):
        s = data.s[data.u == seg]
        mean, sd = s.mean(0), s.std(0)
        assert ((mean > -3 - 5 * sd / 63) & (mean < 3 + 5 * sd / 63)).all()
        assert ((sd > 0.5 * 0.95) & (sd < 3 * 1.05)).all()
        assert abs(torch.corrcoef(s.T)[0, 1]) < 5 / math.sqrt(4000)      # independent
    means = torch.stack([data.s[data.u == g].mean(0) for g in range(3)])
    assert (means[0] - means[1]).abs().max() > 0.1


def test_nonlinear_ica_is_reproducible_and_noise_is_additive():
    a = make_nonlinear_ica(2, 2, 30, 4, generator=torch.Generator().manual_seed(3))
    b = make_nonlinear_ica(2, 2, 30, 4, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.x, b.x) and torch.equal(a.s, b.s) and torch.equal(a.u, b.u)
    torch.testing.assert_close(a.mixing(a.s), a.x, rtol=0, atol=0)    # no observation noise
    noisy = make_nonlinear_ica(2, 2, 30, 4, obs_noise=0.1,
                               generator=torch.Generator().manual_seed(3))
    resid = noisy.x - noisy.mixing(noisy.s)
    assert 0.05 < resid.std().item() < 0.15


def test_perturbed_binary_limit_frequencies(generator):
    f = torch.full((20000,), 0.7)
    x = perturbed_binary(f, 0.0, Logistic(), generator)
    p = torch.sigmoid(torch.tensor(0.7)).item()
    assert abs(x.mean().item() - p) < 5 * math.sqrt(p * (1 - p) / len(f))
    xs = perturbed_binary(f, 0.01, Logistic(), generator)
    assert ((xs > 0.5).float().mean() - p).abs() < 5 * math.sqrt(p * (1 - p) / len(f))


def test_perturbed_binary_normal_noise_gives_probit_frequencies(generator):
    """τ = 0 with standard normal noise: P(x = 1) = Φ(f) (Monte Carlo, 5 standard errors)."""
    f = torch.full((40000,), -0.4)
    x = perturbed_binary(f, 0.0, Normal(), generator)
    p = 0.5 * (1 + math.erf(-0.4 / math.sqrt(2)))
    assert abs(x.mean().item() - p) < 5 * math.sqrt(p * (1 - p) / len(f))
    soft = perturbed_binary(f, 1.0, Normal(), generator)
    assert ((soft > 0) & (soft < 1)).all()


def test_digits_are_binary_and_split():
    pytest.importorskip("sklearn")
    xtr, ytr, xte, yte = binarized_digits()
    assert xtr.shape[1] == 64 and set(xtr.unique().tolist()) <= {0.0, 1.0}
    assert len(xtr) + len(xte) == 1797 and len(ytr) == len(xtr)
