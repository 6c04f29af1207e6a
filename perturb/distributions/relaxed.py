r"""The relaxed sample of a perturbed argmax as a distribution of its own.

For scores θ (``logits``), noise ε and a structure Z with a regularizer f at temperature τ,

.. math:: X_\tau = \arg\max_{x \in \mathrm{conv} Z} \langle \theta + \varepsilon, x\rangle - \tau f(x),

a point of conv Z (``perturb.relax``). ``sample`` and ``rsample`` both draw X_τ (``sample``
without the gradient), as ``torch.distributions.RelaxedOneHotCategorical`` does for the
Gumbel-softmax; the exact vertex law is :class:`~perturb.distributions.PerturbedStructure`.

Densities in closed form, on the simplex (f the negative entropy: X_τ = softmax((θ + ε)/τ)),
with respect to Lebesgue measure on the first d − 1 coordinates of the open simplex:

- **Gumbel noise** of scale β (the Concrete distribution, Maddison et al. 2017, with logits
  l = θ/β and temperature λ = τ/β):

  .. math:: \log p(x) = \log (d-1)! + (d-1)\log\lambda + \sum_k \big(l_k - (\lambda+1)\log x_k\big)
            - d \log\sum_k e^{l_k - \lambda\log x_k}

- **Normal noise** of scale σ (the Gaussian-softmax): the log-ratios y_i = log(x_i/x_d) = (u_i −
  u_d)/τ of u = θ + σZ are Gaussian with covariance (σ/τ)²(I + 11ᵀ) in d − 1 dimensions, and
  |∂y/∂x| = 1/Π_i x_i, so with w = τ log x − θ and P the centring projection,

  .. math:: \log p(x) = -\tfrac{d-1}{2}\log 2\pi - (d-1)\log\tfrac{\sigma}{\tau} - \tfrac12\log d
            - \frac{\lVert P w\rVert^2}{2\sigma^2} - \sum_i \log x_i .

  The same coordinates give the KL divergence between two Gaussian-softmax distributions in
  closed form (:mod:`perturb.distributions.kl`), the property that recommends the
  Gaussian-softmax for variational auto-encoders (Potapczynski et al. 2020).

Other noises (Logistic: the density is a (d − 1)-dimensional integral), other regularizers
(sparsemax puts mass on the faces of the simplex: no density) and other structures (a relaxed
k-subset or tree has no density in closed form) raise NotImplementedError saying so.
"""
from __future__ import annotations

import math
from typing import Any, cast

import torch
from torch.distributions import constraints
from torch.types import _size

from perturb.distributions.constraints import StructureHull
from perturb.distributions.perturbed import _PerturbedBase
from perturb.noise import Gumbel, Normal
from perturb.regularizers import Entropy, ExpFamilyEntropy
from perturb.structures import Simplex

__all__ = ["RelaxedPerturbedStructure"]


class RelaxedPerturbedStructure(_PerturbedBase):
    r"""X_τ = argmax_{x ∈ conv Z} ⟨θ + ε, x⟩ − τ f(x) as a torch distribution over conv Z.

    See :mod:`perturb.distributions.relaxed` for the densities. ``rsample`` is the relaxed
    sample of ``perturb.relax`` (differentiable in θ and a tensor τ through ``backward``);
    ``sample`` is the same draw without the gradient (one law).

    Args:
        logits: scores θ (``theta=`` is the former name: ``FutureWarning``).
        structure: Z, a :class:`perturb.Structure`.
        noise: ε (default ``Gumbel()``).
        tau: temperature τ > 0 (a float, or a tensor broadcastable to ``(*batch)``).
        regularizer: f (default: the structure's; on the simplex the negative entropy).
        backward: the relaxation's backward mode (as :func:`perturb.regularized_argmax`).
        validate_args: torch.distributions validation (θ's values, the support in
            ``log_prob``).

    Shape: ``logits``: ``(*batch, *event)``; ``sample``/``rsample(sample_shape)`` ->
    ``(*sample_shape, *batch, *event)``; ``log_prob``: ``(*sample, *batch, *event)`` ->
    ``(*sample, *batch)``.

    Raises:
        ValueError: as :class:`PerturbedStructure`.
        NotImplementedError: ``log_prob`` without a closed-form density (module docstring).

    Example::

        >>> import perturb
        >>> d = RelaxedPerturbedStructure(torch.zeros(3, 4), perturb.Simplex(), perturb.Normal(),
        ...                               tau=0.5)
        >>> x = d.rsample((2,))               # Gaussian-softmax samples, (2, 3, 4)
        >>> d.log_prob(x).shape
        torch.Size([2, 3])
    """

    has_enumerate_support = False

    @property
    def support(self) -> Any:
        """The convex hull conv Z, which is the probability simplex for :class:`~perturb.Simplex`, else
        :class:`~perturb.distributions.constraints.StructureHull`."""
        if isinstance(self.structure, Simplex):
            return constraints.simplex
        return StructureHull(self.structure)

    def rsample(self, sample_shape: _size = torch.Size(),
                generator: torch.Generator | None = None) -> torch.Tensor:
        """X_τ for fresh noise (``perturb.relax``), differentiable; ``(*sample_shape, *batch,
        *event)``."""
        return self._noise_sample(sample_shape, generator, hard=False)

    def sample(self, sample_shape: _size = torch.Size(),
               generator: torch.Generator | None = None) -> torch.Tensor:
        """X_τ without the gradient: :meth:`rsample`'s law (the same draw for the same
        generator state)."""
        with torch.no_grad():
            return self.rsample(sample_shape, generator)

    # -- densities -------------------------------------------------------------------------------

    def _density_kind(self) -> str:
        """"gumbel" or "normal" where a closed-form density exists; NotImplementedError else."""
        softmax = self.regularizer is None or isinstance(self.regularizer,
                                                         (Entropy, ExpFamilyEntropy))
        if isinstance(self.structure, Simplex) and softmax:
            if type(self.noise) is Gumbel:
                return "gumbel"
            if type(self.noise) is Normal:
                return "normal"
            raise NotImplementedError(
                f"RelaxedPerturbedStructure.log_prob: softmax((θ + ε)/τ) has a closed-form "
                f"density for Gumbel noise (the Concrete distribution) and Normal noise (the "
                f"Gaussian-softmax), not for {self.noise!r}: there it is a (d − 1)-dimensional "
                f"integral")
        raise NotImplementedError(
            f"RelaxedPerturbedStructure.log_prob: the relaxed sample has a closed-form density "
            f"only on the Simplex with the entropy regularizer (softmax), with Gumbel or Normal "
            f"noise; got {self.structure!r} with {self.regularizer!r} (sparsemax puts mass on "
            f"the simplex's faces, and a relaxed k-subset, permutation or tree has no density "
            f"in closed form)")

    def _tau_column(self) -> float | torch.Tensor:
        """τ broadcasting against ``(*batch, d)``."""
        tau = self.tau
        if isinstance(tau, torch.Tensor):
            return tau.to(self.logits).reshape(*tau.shape, 1)
        return tau

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """log p(x) of a point of the open simplex (module docstring: the Concrete density for
        Gumbel noise, the Gaussian-softmax density for Normal noise), w.r.t. Lebesgue measure on
        the first d − 1 coordinates. Differentiable in θ, τ and x.

        Shape: ``(*sample, *batch, d)`` -> ``(*sample, *batch)``.

        Raises:
            NotImplementedError: no closed-form density (other noise, regularizer, structure).
            ValueError: (``validate_args``) ``value`` not on the simplex.
        """
        kind = self._density_kind()
        if self._validate_args:
            self._validate_sample(value)
        d = self.event_shape[-1]
        log_x = torch.log(value)
        tau = self._tau_column()
        if kind == "gumbel":
            beta = cast(Gumbel, self.noise).scale
            logits, lam = self.logits / beta, tau / beta
            log_lam = torch.log(lam) if isinstance(lam, torch.Tensor) else math.log(lam)
            if isinstance(log_lam, torch.Tensor):
                log_lam = log_lam.squeeze(-1)
            score = logits - lam * log_x
            return (math.lgamma(d) + (d - 1) * log_lam
                    + (score - log_x).sum(-1) - d * torch.logsumexp(score, -1))
        sigma = cast(Normal, self.noise).scale
        w = tau * log_x - self.logits
        centred = w - w.mean(-1, keepdim=True)
        log_tau = torch.log(tau).squeeze(-1) if isinstance(tau, torch.Tensor) else math.log(tau)
        const = -0.5 * (d - 1) * math.log(2 * math.pi) - 0.5 * math.log(d)
        return (const + (d - 1) * (log_tau - math.log(sigma))
                - centred.pow(2).sum(-1) / (2 * sigma ** 2) - log_x.sum(-1))

    @property
    def mean(self) -> torch.Tensor:
        """Not available in closed form (E[softmax((θ + ε)/τ)] is an integral); raises NotImplementedError."""
        raise NotImplementedError(
            "RelaxedPerturbedStructure.mean has no closed form (E[X_τ] is a d-dimensional "
            "integral); estimate it from rsample(), or use PerturbedStructure(...).mean for "
            "the τ → 0 limit")

    def entropy(self) -> torch.Tensor:
        """Not in closed form: NotImplementedError (Monte Carlo: −log_prob of samples)."""
        raise NotImplementedError(
            "RelaxedPerturbedStructure.entropy has no closed form; estimate it as "
            "-log_prob(rsample()).mean() where log_prob exists")
