r"""Negative-exponential noise ``ε = −s·E``, ``E ~ Exp(1)``: closed-form perturbed argmax.

The perturbed scores :math:`X_i = θ_i − sE_i` have the CDFs :math:`F_i(x) = \min(1,
e^{(x − θ_i)/s})`. With the scores sorted, :math:`t_1 ≥ … ≥ t_n` (in units of ``s``), the CDF
of the maximum on the segment :math:`x ∈ (t_{k+1}, t_k]` (:math:`t_{n+1} = −∞`) is
:math:`\prod_{j ≤ k} e^{x − t_j} = e^{kx − S_k}`, :math:`S_k = \sum_{j ≤ k} t_j`. Integrating
segment by segment,

.. math::

    c_k = \int_{t_{k+1}}^{t_k} e^{kx − S_k}\,dx = \frac{A_k\,(1 − e^{−k(t_k − t_{k+1})})}{k},
    \qquad A_k = e^{k t_k − S_k} = e^{−\sum_{j<k}(t_j − t_k)} ∈ (0, 1],

and, because the density of coordinate :math:`r` times the other CDFs is the same
:math:`e^{kx − S_k}` on every segment :math:`k ≥ r`,

.. math::

    P(\operatorname{argmax} = r) = \sum_{k ≥ r} c_k,
    \qquad E[\max_i X_i] = s\,\Bigl(t_1 − \sum_k c_k\Bigr)

(the second from :math:`E[M] = t_1 − \int_{−∞}^{t_1} F_{\max}`). Every term is non-negative
(no cancellation; ``expm1`` keeps ``1 − e^{−kδ}`` accurate for close scores, and tied scores
give zero terms with finite gradients). For ``n = 2`` and a gap ``Δ ≥ 0``:
:math:`P = (1 − e^{−Δ/s}/2,\ e^{−Δ/s}/2)`.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from ._args import _as_tensor, _sample_args
from ._quadrature import _TAIL
from .base import Noise, QuadratureLayout
from .scale_families import Gumbel, _ScaleNoise

__all__ = ["NegativeExponential"]


class NegativeExponential(_ScaleNoise):
    """Negative-exponential noise: ``ε = −s·E`` with ``E ~ Exp(1)``, ``s = scale``.

    ``F(x) = exp(x/s)`` for ``x ≤ 0`` (1 above), density ``exp(x/s)/s`` on ``(−∞, 0]``; mean
    ``−s``, variance ``s²``. The perturbed argmax has closed forms (module docstring):
    ``argmax_probs`` and ``expected_max`` from one sort and two cumulative sums, exact and
    differentiable. Sampling: ``−s·E`` from the same exponential draw as :class:`Gumbel` (finite;
    ``E > 0``).

    This is the additive "Neg. Exp." perturbation compared with Gaussian and Gumbel noise on
    latent arborescences in the stochastic-softmax-tricks experiments. (The multiplicative
    exponential race ``argmin_i E_i e^{−θ_i}`` is the Gumbel-max trick after a log: on one
    categorical it is softmax; the additive form here is not.)

    The density jumps at 0: ``breakpoints = (0.0,)`` makes the generic quadrature (used by
    :mod:`perturb.checks`) split its panels there. The support is ``(−inf, 0]``.

    Args:
        scale: ``s > 0``.

    Raises:
        ValueError: ``scale`` not a finite positive number.

    Example:
        >>> NegativeExponential().argmax_probs(torch.tensor([1.0, 0.0]))  # 1 − e⁻¹/2, e⁻¹/2
        tensor([0.8161, 0.1839])
        >>> NegativeExponential(2.0).expected_max(torch.tensor([0.0]))      # the mean, −s
        tensor(-2.)
    """

    breakpoints = (0.0,)
    has_closed_form = True

    @property
    def support(self) -> tuple[float, float]:
        return (-math.inf, 0.0)

    def sample(self, shape: Sequence[int] | torch.Size | int, *,
               generator: torch.Generator | None = None,
               device: torch.device | str | None = None,
               dtype: torch.dtype | None = None) -> torch.Tensor:
        shape, device, dtype = _sample_args(shape, generator, device, dtype)
        return Gumbel._exponential(shape, generator, device, dtype).mul_(-self.scale)

    sample.__doc__ = Noise.sample.__doc__

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        z = _as_tensor(x, "x") / self.scale
        return torch.where(z <= 0, z, torch.full_like(z, -math.inf)) - math.log(self.scale)

    def cdf(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(self.log_cdf(x))

    def log_cdf(self, x: torch.Tensor) -> torch.Tensor:
        return (_as_tensor(x, "x") / self.scale).clamp(max=0.0)

    def _from_uniform(self, u: torch.Tensor) -> torch.Tensor:
        return self.scale * torch.log(u)

    @property
    def mean(self) -> float:
        return -self.scale

    @property
    def variance(self) -> float:
        return self.scale ** 2

    def quadrature_layout(self, d: int) -> QuadratureLayout:
        """Lower end at the 1e-14 quantile of the max of ``d`` (``s·log 1e-14``), upper end one
        scale above the support's end (so that the jump at ``max θ`` is an inner edge, which
        moves with θ), panels of 3 scales, order 20 (the density is ``exp`` between kinks)."""
        return QuadratureLayout(self.scale * math.log(_TAIL), self.scale, 3.0 * self.scale, 20)

    def _segments(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(c, t₁, order)``: the segment integrals ``c_k`` of the module docstring (in units of
        ``s``), the largest score ``t₁ = max θ/s`` and the sort order of θ (descending)."""
        t, order = torch.sort(theta / self.scale, dim=-1, descending=True)
        u = t - t[..., :1]                                     # <= 0: no growth at |θ| = 1e4
        k = torch.arange(1, t.shape[-1] + 1, dtype=t.dtype, device=t.device)
        log_a = (k * u - torch.cumsum(u, -1)).clamp(max=0.0)   # log A_k = −Σ_{j<k}(t_j − t_k)
        gap = torch.cat([t[..., :-1] - t[..., 1:],
                         torch.full_like(t[..., :1], math.inf)], -1)
        c = torch.exp(log_a) * -torch.expm1(-k * gap) / k
        return c, t[..., 0], order

    def _expected_max(self, theta: torch.Tensor) -> torch.Tensor:
        c, t1, _ = self._segments(theta)
        return self.scale * (t1 - c.sum(-1))

    def _argmax_probs(self, theta: torch.Tensor) -> torch.Tensor:
        c, _, order = self._segments(theta)
        p_sorted = torch.flip(torch.cumsum(torch.flip(c, [-1]), -1), [-1])
        return torch.empty_like(p_sorted).scatter(-1, order, p_sorted)
