r"""KL divergences between the distributions of :mod:`perturb.distributions`, registered with
``torch.distributions.kl.register_kl`` so that ``torch.distributions.kl_divergence`` finds them.

- **Gibbs families** (the same family over the same structure):
  KL(p_a ‖ p_b) = A(θ_b) − A(θ_a) − ⟨θ_b − θ_a, μ(θ_a)⟩_Z, from the exact log-partition A and
  marginals μ = ∇A (E_a[log p_a − log p_b] with log p = ⟨θ, z⟩_Z − A). Exact and differentiable;
  +inf where p_b masks an entry p_a uses.
- **The categorical case**: :class:`PerturbedStructure` on the simplex with continuous noise is
  Categorical(p), p the argmax probabilities (softmax(θ/β) for Gumbel noise, a quadrature
  otherwise): Σ p_a (log p_a − log p_b), also against ``torch.distributions.OneHotCategorical``.
- **Gaussian-softmax** (:class:`RelaxedPerturbedStructure` on the simplex, entropy regularizer,
  Normal noise): the KL between the laws of the relaxed samples X = softmax((θ + σZ)/τ) on the
  open simplex. KL is invariant under a bijection, and the log-ratios y_i = log(x_i/x_d)
  (i < d) map the open simplex one-to-one onto R^{d−1}, where y ~ N(P θ/τ, (σ/τ)²(I + 11ᵀ))
  (in centred coordinates: an isotropic Gaussian of variance s² = (σ/τ)² in the d − 1
  dimensions orthogonal to 1). Hence, with ρ = s_a²/s_b² and P the centring projection,

  .. math:: \mathrm{KL} = \tfrac12\Big[(d-1)(\rho - 1 - \log\rho)
            + \frac{\lVert P(\theta_a/\tau_a - \theta_b/\tau_b)\rVert^2}{s_b^2}\Big],

  which is ‖P(θ_a − θ_b)‖²/(2σ²) for equal σ and τ: independent of τ. The Gumbel-softmax
  (Concrete) pair has no closed form; it raises NotImplementedError.
"""
from __future__ import annotations

import math
from typing import cast

import torch
from torch.distributions import OneHotCategorical
from torch.distributions.kl import register_kl

from perturb.distributions.gibbs import GibbsDistribution
from perturb.noise import Normal
from perturb.distributions.perturbed import PerturbedStructure
from perturb.distributions.relaxed import RelaxedPerturbedStructure

__all__: list[str] = []


@register_kl(GibbsDistribution, GibbsDistribution)
def _kl_gibbs(p: GibbsDistribution, q: GibbsDistribution) -> torch.Tensor:
    """A(θ_q) − A(θ_p) − ⟨θ_q − θ_p, μ_p⟩_Z: the cross entropy minus the entropy, both exact
    (in float64 below it)."""
    p._check_same_family(q, "q")
    wide = p if p._theta.dtype == torch.float64 else p._in_float64()
    other = q if q._theta.dtype == torch.float64 else q._in_float64()
    mu = wide.marginals
    out = (other.partition - other._score(mu)) - (wide.partition - wide._score(mu))
    # a rounding below 0 where the two are equal: KL >= 0
    return out.clamp(min=0.0).to(p._theta.dtype)


def _categorical_kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    p = log_p.exp()
    zero = torch.zeros((), dtype=p.dtype, device=p.device)
    return (p * torch.where(p > 0, log_p - log_q, zero)).sum(-1)


@register_kl(PerturbedStructure, PerturbedStructure)
def _kl_perturbed(p: PerturbedStructure, q: PerturbedStructure) -> torch.Tensor:
    """Categorical KL of the argmax probabilities (continuous noise on the simplex)."""
    return _categorical_kl(p._log_probs(), q._log_probs())


@register_kl(PerturbedStructure, OneHotCategorical)
def _kl_perturbed_onehot(p: PerturbedStructure, q: OneHotCategorical) -> torch.Tensor:
    return _categorical_kl(p._log_probs(), q.logits)


@register_kl(OneHotCategorical, PerturbedStructure)
def _kl_onehot_perturbed(p: OneHotCategorical, q: PerturbedStructure) -> torch.Tensor:
    return _categorical_kl(p.logits, q._log_probs())


def _gaussian_softmax_terms(d: RelaxedPerturbedStructure) -> tuple[torch.Tensor, torch.Tensor]:
    """(θ/τ, log s²) with s = σ/τ, for a Gaussian-softmax distribution; NotImplementedError
    for the others."""
    if d._density_kind() != "normal":
        raise NotImplementedError(
            "kl_divergence between RelaxedPerturbedStructure distributions has a closed form "
            "only for the Gaussian-softmax (Normal noise on the Simplex with the entropy "
            "regularizer); the Gumbel-softmax (Concrete) pair has none: estimate it by Monte "
            "Carlo, (p.log_prob(x) - q.log_prob(x)).mean() with x = p.rsample((n,))")
    tau = d._tau_column()                                  # against (*batch, d)
    log_tau = (torch.log(tau).squeeze(-1) if isinstance(tau, torch.Tensor) else
               torch.tensor(math.log(tau), dtype=d.logits.dtype, device=d.logits.device))
    return d.logits / tau, 2 * (math.log(cast(Normal, d.noise).scale) - log_tau)


@register_kl(RelaxedPerturbedStructure, RelaxedPerturbedStructure)
def _kl_relaxed(p: RelaxedPerturbedStructure, q: RelaxedPerturbedStructure) -> torch.Tensor:
    """The Gaussian-softmax KL (module docstring)."""
    m_p, log_s2_p = _gaussian_softmax_terms(p)
    m_q, log_s2_q = _gaussian_softmax_terms(q)
    if p.event_shape != q.event_shape:
        raise ValueError(f"the two distributions have event shapes {tuple(p.event_shape)} and "
                         f"{tuple(q.event_shape)}")
    k = p.event_shape[-1] - 1
    diff = m_p - m_q
    diff = diff - diff.mean(-1, keepdim=True)
    log_rho = log_s2_p - log_s2_q
    trace = k * (torch.expm1(log_rho) - log_rho)          # k(ρ − 1 − log ρ), exact near ρ = 1
    return 0.5 * (trace + diff.pow(2).sum(-1) * torch.exp(-log_s2_q))
