"""Tests of perturb/latent/ivae.py (its data: tests/latent/test_data.py)."""
import math

import pytest
import torch

from perturb.latent.data import make_nonlinear_ica, perturbed_binary
from perturb.latent.ivae import IVAE
from perturb.latent.metrics import mean_corr_coef
from perturb.noise import Logistic, Normal


@pytest.mark.parametrize("conditional", [True, False])
@pytest.mark.parametrize("likelihood,temperature,noise", [
    ("gaussian", 0.0, None), ("perturbed", 0.0, Logistic()), ("perturbed", 0.3, Normal())])
def test_ivae_forward_backward(conditional, likelihood, temperature, noise, generator):
    data = make_nonlinear_ica(n_sources=2, n_segments=3, n_per_segment=10, d_obs=6,
                              generator=generator)
    x = data.x if likelihood == "gaussian" else perturbed_binary(data.x, temperature, noise,
                                                                 generator)
    model = IVAE(6, 2, 3, hidden=8, conditional_prior=conditional, likelihood=likelihood,
                 noise=noise, tau=temperature)
    elbo = model(x, data.u)
    assert elbo.shape == (30,) and torch.isfinite(elbo).all()
    (-elbo.mean()).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert model.latents(x, data.u).shape == (30, 2)


def test_binary_likelihood_is_exact_bernoulli():
    # temperature 0: P(x=1 | z) = 1 − F(−f) = σ(f) for logistic noise
    model = IVAE(3, 2, 2, hidden=4, likelihood="perturbed", tau=0.0)
    z = torch.randn(5, 2)
    f = model.decoder(z)
    ones, zeros = torch.ones(5, 3), torch.zeros(5, 3)
    assert torch.allclose(model.log_likelihood(ones, z), torch.log(torch.sigmoid(f)).sum(-1),
                          atol=1e-5)
    assert torch.allclose(model.log_likelihood(zeros, z), torch.log(torch.sigmoid(-f)).sum(-1),
                          atol=1e-5)


def test_bad_arguments():
    with pytest.raises(ValueError, match="likelihood"):
        IVAE(3, 2, 2, likelihood="poisson")
    model = IVAE(3, 2, 2)
    with pytest.raises(ValueError, match="u must lie"):
        model(torch.zeros(1, 3), torch.tensor([5]))
    with pytest.raises(ValueError, match="tau"):
        perturbed_binary(torch.zeros(2), -1.0)


def test_deprecated_temperature_names():
    x = torch.randn(5)
    new = perturbed_binary(x, 0.3, generator=torch.Generator().manual_seed(0))
    with pytest.warns(FutureWarning, match="temperature= is deprecated"):
        old = perturbed_binary(x, temperature=0.3, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(old, new, rtol=0, atol=0)
    with pytest.warns(FutureWarning, match="temperature= is deprecated"):
        model = IVAE(3, 2, 2, likelihood="perturbed", temperature=0.2)
    assert model.tau == 0.2 and model.temperature == 0.2
    with pytest.raises(TypeError, match="tau"):
        perturbed_binary(x)


def test_trained_ivae_beats_chance(generator):
    # a few hundred steps on an easy problem: the iVAE recovers the sources well above chance
    torch.manual_seed(0)
    data = make_nonlinear_ica(n_sources=2, n_segments=8, n_per_segment=60, d_obs=4,
                              n_layers=2, generator=generator)
    torch.manual_seed(0)
    model = IVAE(4, 2, 8, hidden=32)
    before = mean_corr_coef(data.s, model.latents(data.x, data.u)).item()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(250):
        opt.zero_grad()
        (-model(data.x, data.u).mean()).backward()
        opt.step()
    after = mean_corr_coef(data.s, model.latents(data.x, data.u)).item()
    assert after > 0.8 and after > before


@pytest.mark.parametrize("noise", [Logistic(), Normal()])
@pytest.mark.parametrize("temperature", [0.0, 0.05, 1.0])
def test_perturbed_likelihood_gradients_finite_at_extreme_logits(noise, temperature):
    model = IVAE(4, 2, 2, hidden=4, likelihood="perturbed", noise=noise, tau=temperature)
    with torch.no_grad():
        model.decoder[-1].bias.copy_(torch.tensor([60.0, -60.0, 60.0, -60.0]))
    x = torch.tensor([[0.0, 1.0, 0.5, 1e-9], [1.0, 0.0, 0.999, 0.3]])
    ll = model.log_likelihood(x, torch.randn(2, 2))
    ll.sum().backward()
    assert torch.isfinite(ll).all()
    assert all(torch.isfinite(p.grad).all() for p in model.decoder.parameters())
