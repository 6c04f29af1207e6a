r"""Identifiable VAE (iVAE, Khemakhem et al. 2020) and the plain VAE it is compared with.

The generative model is z | u ~ N(μ(u), diag σ²(u)) (a conditionally factorial prior computed by
a small network of the auxiliary variable u), x | z ~ p(x | f(z)). The encoder is
q(z | x, u) = N(m(x, u), diag s²(x, u)) and training maximises the ELBO

    E_q[log p(x | z) + log p(z | u) − log q(z | x, u)]     (reparameterised, one sample).

With ``conditional_prior=False`` the prior is N(0, I) and the encoder sees x only: a plain VAE,
which is not identifiable (any rotation of z gives the same marginal likelihood).

Observation models (``likelihood``):

- ``"gaussian"``: x = f(z) + N(0, obs_scale²).
- ``"perturbed"``: x = σ((f(z) + ε)/τ) with ε from ``noise`` (Logistic: the binary Concrete).
  In y = τ·logit(x) this is y = f(z) + ε, so log p(x | z) = log p_ε(y − f(z)) + const, using
  ``noise.log_prob``; values saturated at 0 or 1 in floating point (|f + ε| ≳ τ·log(1/eps))
  are censored and contribute P(y ≤ y_lo) or P(y ≥ y_hi) instead; with ``tau=0`` it
  is the binary limit x = 1[f(z) + ε > 0],
  P(x = 1 | z) = 1 − F_ε(−f(z)), using ``noise.log_cdf``.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from perturb._math import log1mexp as _log1mexp
from perturb._deprecation import renamed
from perturb._validation import check_choice, check_int, check_positive, check_real
from perturb.noise import Logistic, Noise

__all__ = ["IVAE"]

_LOG_2PI = math.log(2 * math.pi)


def _mlp(n_in: int, n_out: int, hidden: int, n_layers: int = 2) -> nn.Sequential:
    layers: list[nn.Module] = []
    d = n_in
    for _ in range(n_layers):
        layers += [nn.Linear(d, hidden), nn.LeakyReLU(0.2)]
        d = hidden
    layers.append(nn.Linear(d, n_out))
    return nn.Sequential(*layers)


def _gauss_log_prob(z: torch.Tensor, mean: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    return -0.5 * (_LOG_2PI + logvar + (z - mean) ** 2 / logvar.exp()).sum(-1)


def _log_sf(noise: Noise, c: torch.Tensor) -> torch.Tensor:
    """log P(ε > c) = log(1 − F(c)): the noise's own survival function (exact in the tails for
    the built-in families); a duck-typed noise with only ``log_cdf`` gets log1mexp(log F)."""
    if isinstance(noise, Noise):
        return noise.log_sf(c)
    return _log1mexp(noise.log_cdf(c))


def _masked(a: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``a`` where ``keep``, 0 elsewhere: the unselected branch of a ``torch.where`` then has
    finite values and gradients (an infinite one would turn the selected gradient into NaN)."""
    return torch.where(keep, a, torch.zeros_like(a))


class IVAE(nn.Module):
    """iVAE (``conditional_prior=True``) or plain VAE (``False``) of the same size.

    Args:
        d_obs: observation dimension d.
        n_latent: latent dimension n.
        n_aux: number of segments (u is an integer id, one-hot encoded).
        hidden: width of every MLP.
        conditional_prior: iVAE prior p(z | u) and encoder q(z | x, u); else N(0, I) and q(z | x).
        likelihood: ``"gaussian"`` or ``"perturbed"`` (see module docstring).
        obs_scale: standard deviation of the Gaussian likelihood.
        noise: the perturbation of the ``"perturbed"`` likelihood (default Logistic()).
        tau: temperature τ ≥ 0 of the ``"perturbed"`` likelihood (0: binary observations).
        temperature: deprecated name of ``tau`` (``FutureWarning``; removed in 0.3).

    Shape: ``x`` ``(B, d_obs)``, ``u`` ``(B,)`` long; latents ``(B, n_latent)``.
    """

    def __init__(self, d_obs: int, n_latent: int, n_aux: int, hidden: int = 64,
                 conditional_prior: bool = True, likelihood: str = "gaussian",
                 obs_scale: float = 0.1, noise: Noise | None = None, tau: float = 0.0, *,
                 temperature: float | None = None):
        super().__init__()
        self.d_obs = check_int(d_obs, "d_obs", low=1)
        self.n_latent = check_int(n_latent, "n_latent", low=1)
        self.n_aux = check_int(n_aux, "n_aux", low=1)
        check_choice(likelihood, ("gaussian", "perturbed"), "likelihood")
        tau = renamed("IVAE", "temperature", temperature, "tau", tau, 0.0,
                      lambda v, name: check_real(v, name, low=0.0))
        check_real(tau, "tau", low=0.0)
        check_positive(obs_scale, "obs_scale")
        self.conditional_prior = conditional_prior
        self.likelihood, self.obs_scale = likelihood, obs_scale
        self.noise = noise if noise is not None else Logistic()
        self.tau = tau
        enc_in = d_obs + (n_aux if conditional_prior else 0)
        self.encoder = _mlp(enc_in, 2 * n_latent, hidden)
        self.decoder = _mlp(n_latent, d_obs, hidden)
        self.prior = _mlp(n_aux, 2 * n_latent, hidden, n_layers=1) if conditional_prior else None

    def _onehot(self, u: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        if u.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"u must hold integer segment ids, got dtype {u.dtype}")
        if bool(((u < 0) | (u >= self.n_aux)).any()):
            raise ValueError(f"u must lie in [0, {self.n_aux}), got values outside")
        return nn.functional.one_hot(u, self.n_aux).to(like.dtype)

    def encode(self, x: torch.Tensor, u: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log-variance of q(z | x, u), each ``(B, n_latent)``."""
        if self.conditional_prior and u is None:
            raise ValueError("u (the segment ids) is required with conditional_prior=True")
        inp = torch.cat([x, self._onehot(u, x)], -1) if u is not None and self.conditional_prior else x
        mean, logvar = self.encoder(inp).chunk(2, -1)
        return mean, logvar.clamp(-12, 8)

    def prior_params(self, u: torch.Tensor, like: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log-variance of p(z | u) (zeros for the plain VAE)."""
        if self.prior is None:
            zeros = torch.zeros(len(u), self.n_latent, dtype=like.dtype, device=like.device)
            return zeros, zeros
        mean, logvar = self.prior(self._onehot(u, like)).chunk(2, -1)
        return mean, logvar.clamp(-8, 8)

    @property
    def temperature(self) -> float:
        """Deprecated name of ``tau``."""
        return self.tau

    def log_likelihood(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """log p(x | z) up to a constant independent of the parameters, ``(B,)``."""
        f = self.decoder(z)
        if self.likelihood == "gaussian":
            return _gauss_log_prob(x, f, torch.full_like(f, 2 * math.log(self.obs_scale)))
        if self.tau == 0:
            one = x > 0.5
            log_p0 = self.noise.log_cdf(-f)                      # P(x = 0) = F(−f)
            log_p1 = _log_sf(self.noise, _masked(-f, one))          # P(x = 1) = 1 − F(−f)
            return torch.where(one, log_p1, log_p0).sum(-1)
        # x = σ((f + ε)/τ) saturates to 0 or 1 in floating point once |f + ε| ≳ τ·log(1/eps):
        # such values are censored observations (y ≤ y_lo or y ≥ y_hi), whose likelihood is a
        # probability, not the density at the clamp point (which would pull f towards it).
        eps = torch.finfo(x.dtype).eps
        xc = x.clamp(eps, 1 - eps)
        y = self.tau * (torch.log(xc) - torch.log1p(-xc))
        y_hi = self.tau * math.log((1 - eps) / eps)
        lo, hi = x <= eps, x >= 1 - eps
        interior = self.noise.log_prob(_masked(y - f, ~(lo | hi)))
        below = self.noise.log_cdf(_masked(-y_hi - f, lo))             # F(−y_hi − f)
        above = _log_sf(self.noise, _masked(y_hi - f, hi))              # 1 − F(y_hi − f)
        ll = torch.where(lo, below, torch.where(hi, above, interior))
        return ll.sum(-1)

    def forward(self, x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """One-sample reparameterised ELBO per example, ``(B,)`` (maximise its mean)."""
        mean, logvar = self.encode(x, u)
        z = mean + (0.5 * logvar).exp() * torch.randn_like(mean)
        p_mean, p_logvar = self.prior_params(u, x)
        return (self.log_likelihood(x, z) + _gauss_log_prob(z, p_mean, p_logvar)
                - _gauss_log_prob(z, mean, logvar))

    @torch.no_grad()
    def latents(self, x: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
        """Posterior means E_q[z | x, u]: the recovered sources, ``(B, n_latent)``."""
        return self.encode(x, u)[0]
