"""Tests of perturb/latent/categorical_vae.py: forward/backward and unbiased ELBO estimators."""
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from perturb.latent.categorical_vae import CategoricalVAE
from perturb.noise import Normal


@pytest.mark.parametrize("noise,hard", [(None, False), (Normal(), False), (None, True)])
def test_forward_backward(noise, hard, seed):
    model = CategoricalVAE(n_obs=16, n_latents=3, n_categories=4, hidden=16, noise=noise, hard=hard)
    x = (torch.rand(5, 16) > 0.5).float()
    loss = -model(x).mean()
    loss.backward()
    grads = [p.grad for p in model.encoder.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def test_elbo_estimator_is_unbiased(seed):
    model = CategoricalVAE(n_obs=12, n_latents=2, n_categories=3, hidden=8).double()
    x = (torch.rand(3, 12) > 0.5).double()
    exact = model.exact_elbo(x)
    gen = torch.Generator().manual_seed(3)
    reps = 4000  # one single-sample estimate per copy of each example
    draws = model.elbo(x.repeat(reps, 1), n_samples=1, generator=gen).view(reps, 3)
    se = draws.std(0) / math.sqrt(len(draws))
    assert ((draws.mean(0) - exact).abs() <= 5 * se + 1e-12).all()


def test_iw_bound_between_elbo_and_log_likelihood(seed):
    model = CategoricalVAE(n_obs=12, n_latents=2, n_categories=3, hidden=8).double()
    x = (torch.rand(3, 12) > 0.5).double()
    configs = torch.tensor(list(itertools.product(range(3), repeat=2)))
    z = F.one_hot(configs, 3).double()[:, None]
    with torch.no_grad():
        log_px = torch.logsumexp(model._log_lik(x, z) - 2 * math.log(3), 0)
    elbo = model.exact_elbo(x)
    iw = model.iw_elbo(x, n_samples=20000, generator=torch.Generator().manual_seed(0))
    assert (elbo <= log_px + 1e-12).all()
    assert torch.allclose(iw, log_px, atol=2e-3)


def test_exact_elbo_refuses_large_models():
    with pytest.raises(ValueError, match="too many"):
        CategoricalVAE(n_latents=10, n_categories=10).exact_elbo(torch.zeros(1, 64))


def test_normal_posterior_is_the_gaussian_argmax_distribution():
    from perturb.latent.categorical_vae import _normal_argmax_log_probs

    g = torch.Generator().manual_seed(0)
    th = 3 * torch.randn(50, 6, dtype=torch.float64, generator=g)
    assert torch.allclose(_normal_argmax_log_probs(th).exp(), Normal().argmax_probs(th), atol=1e-4)
    x = torch.randn(3, 4, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(_normal_argmax_log_probs, (x,))
