r"""The distribution of a perturbed argmax over a structure, with its relaxation as ``rsample``.

For scores θ, a noise ε (i.i.d. per coordinate) and a structure Z (:mod:`perturb.core`):

.. math::

    X = \arg\max_{z \in Z} \langle \theta + \varepsilon, z\rangle        \quad(\texttt{sample})
    \qquad
    X_\tau = \arg\max_{x \in \mathrm{conv} Z} \langle \theta + \varepsilon, x\rangle - \tau f(x)
    \quad(\texttt{rsample})

``sample`` draws X exactly (no gradient); ``rsample`` is the stochastic softmax X_τ
(``perturb.relax``: the same noise for the same generator state, differentiable through the
solver registered for (structure, f) with the chosen ``backward``). X_τ lies in conv Z, not in
Z, and X_τ → X as τ → 0 (Paulus et al. 2020, arXiv:2006.08063).

Exact quantities exist only where the law of X has a closed form or a cheap exact one:

- on the :class:`~perturb.Simplex` with continuous noise, P(X = e_i) is
  ``noise.argmax_probs(θ)`` (Gumbel: softmax(θ/β), closed form; other continuous noise:
  quadrature to ~1e-13): ``marginals``, ``mean``, ``variance``;
- on the simplex with :class:`~perturb.Gumbel` noise also ``log_prob`` = log softmax(θ/β) and
  ``entropy`` (the Gumbel-max trick: X is Categorical(softmax(θ/β)));
- elsewhere (k-subsets, trees, permutations, or non-Gumbel noise for ``log_prob``) the law of
  the perturbed argmax has no tractable form (e.g. Gumbel top-k is sampling without
  replacement, whose set probability sums over k! orders): these raise NotImplementedError;
  the Gibbs families (:class:`KSubsetDistribution`, ...) are the exact alternatives.

``mode`` is the noiseless argmax argmax_z ⟨θ, z⟩ (the most probable outcome on the simplex
with i.i.d. noise; in general the MAP structure of the scores, not necessarily the most
probable perturbed argmax).
"""
from __future__ import annotations

from typing import cast

import torch
from torch.types import _size
from torch.distributions import Distribution

from perturb._validation import check_choice, check_tau
from perturb.distributions.constraints import StructureSupport, log_potential
from perturb.distributions.gibbs import _resolve_validate, _sample_count, _validate_with
from perturb.noise import Gumbel, Noise
from perturb.noise._args import check_noise
from perturb.regularizers import Regularizer
from perturb.core import _FINITE_NOISES, _check_structure, _perturb, _relax
from perturb.backward import BACKWARD_MODES
from perturb.structures import Simplex, Structure

__all__ = ["PerturbedStructure"]


class PerturbedStructure(Distribution):
    r"""X = argmax_{z∈Z} ⟨θ + ε, z⟩ as a torch distribution; ``rsample`` is its relaxation.

    See :mod:`perturb.distributions.perturbed` for the math and where exact quantities exist.

    Args:
        theta: scores θ.
        structure: Z, a :class:`perturb.Structure` (``Simplex()``, ``KSubset(k)``,
            ``Permutations()``, ``SpanningTrees()``, ``Arborescences(root)``...).
        noise: ε, a :class:`perturb.Noise` (default ``Gumbel()``).
        tau: temperature τ > 0 of ``rsample`` (a float, or a tensor broadcastable to
            ``(*batch)``); ``sample`` does not depend on it.
        regularizer: f of ``rsample`` (default: ``structure.default_regularizer()``).
        backward: backward mode of ``rsample`` (``"auto"``, ``"analytic"``, ``"implicit"``,
            ``"unroll"``, ``"finite_difference"``; the pair's supported ones, checked when
            ``rsample`` runs).
        validate_args: torch.distributions validation: θ's values (NaN, inf, as the structure
            allows) at construction and the support in ``log_prob``. Shapes are always checked.

    Shape: ``theta``: ``(*batch, *event)`` with ``structure.event_dim`` event dims;
    ``sample``/``rsample(sample_shape)`` -> ``(*sample_shape, *batch, *event)`` in θ's dtype;
    ``log_prob``: ``(*sample, *batch, *event)`` -> ``(*sample, *batch)``; ``entropy()``:
    ``(*batch)``; ``mode``, ``marginals``: ``(*batch, *event)``.

    Raises:
        ValueError: bad θ for the structure, τ ≤ 0, a structure/noise/regularizer of the wrong
            type, an unknown ``backward``.
        NotImplementedError: ``log_prob``/``entropy``/``marginals`` where no exact form exists
            (module docstring); ``rsample`` for an unregistered (structure, regularizer) pair.

    Example::

        >>> import perturb
        >>> theta = torch.randn(4, 10, requires_grad=True)
        >>> d = PerturbedStructure(theta, perturb.Simplex(), tau=0.5)
        >>> x = d.rsample()                 # Gumbel-softmax, (4, 10), differentiable
        >>> z = d.sample((8,))              # exact one-hots, (8, 4, 10)
        >>> d.log_prob(z).shape             # log softmax(θ) at z
        torch.Size([8, 4])
        >>> from perturb.structured import KSubset
        >>> y = PerturbedStructure(theta, KSubset(3), tau=0.1).rsample()   # relaxed top-3
    """

    arg_constraints = {"theta": log_potential}
    has_rsample = True
    has_enumerate_support = True

    def __init__(self, theta: torch.Tensor, structure: Structure, noise: Noise | None = None,
                 tau: float | torch.Tensor = 1.0, regularizer: Regularizer | None = None,
                 backward: str = "auto", validate_args: bool | None = None):
        validate = _resolve_validate(validate_args)
        _check_structure(structure)
        noise = Gumbel() if noise is None else noise
        check_noise(noise)
        if regularizer is not None and not isinstance(regularizer, Regularizer):
            raise ValueError(f"regularizer must be a perturb Regularizer, got {regularizer!r}")
        check_tau(tau)
        check_choice(backward, BACKWARD_MODES, "backward")
        _validate_with(structure, theta, "theta", validate)
        self.theta = theta
        self.structure = structure
        self.noise = noise
        self.tau = tau
        self.regularizer = regularizer
        self.backward = backward
        d = structure.event_dim
        super().__init__(theta.shape[:theta.ndim - d], theta.shape[theta.ndim - d:],
                         validate_args=validate)

    # -- sampling ------------------------------------------------------------------------------

    @property
    def support(self) -> StructureSupport:
        """The vertices Z of the structure (what ``sample`` returns; ``rsample`` is in conv Z)."""
        return StructureSupport(self.structure)

    def sample(self, sample_shape: _size = torch.Size(),
               generator: torch.Generator | None = None) -> torch.Tensor:
        """Exact perturbed argmax X = argmax_z ⟨θ + ε, z⟩, no gradient.

        The noise is drawn as :func:`perturb.perturb` draws it, so with the same generator state
        X is the forward value of ``relax(θ, ..., hard=True)``.

        Shape: ``(*sample_shape, *batch, *event)``.
        """
        shape, count = _sample_count(sample_shape)
        out_shape = shape + self.batch_shape + self.event_shape
        if count == 0:
            return self.theta.new_zeros(out_shape)
        with torch.no_grad():
            u = _perturb(self.theta.detach(), self.noise, count if shape else None, generator)
            if type(self.noise) not in _FINITE_NOISES:
                self.structure.validate(u, "theta + noise")
            return self.structure.argmax(u).reshape(out_shape)

    def rsample(self, sample_shape: _size = torch.Size(),
                generator: torch.Generator | None = None) -> torch.Tensor:
        """The relaxed sample X_τ = regularized argmax of θ + ε at τ (``perturb.relax``).

        Differentiable in θ (and a tensor τ) through the ``backward`` mode; lies in conv Z.

        Shape: ``(*sample_shape, *batch, *event)``.

        Raises:
            NotImplementedError: no solver for (structure, regularizer).
            ValueError: ``backward`` not supported by that solver.
        """
        shape, count = _sample_count(sample_shape)
        out_shape = shape + self.batch_shape + self.event_shape
        if count == 0:
            return self.theta.new_zeros(out_shape)
        x = _relax(self.theta, self.structure, self.noise, self.regularizer, self.tau, False,
                   count if shape else None, generator, self.backward)
        return x.reshape(out_shape)

    # -- exact quantities ----------------------------------------------------------------------

    @property
    def mode(self) -> torch.Tensor:
        """The noiseless argmax argmax_z ⟨θ, z⟩, ``(*batch, *event)``, no gradient."""
        with torch.no_grad():
            return self.structure.argmax(self.theta.detach())

    def _on_simplex(self, what: str, gumbel_only: bool) -> None:
        ok = isinstance(self.structure, Simplex) and (
            type(self.noise) is Gumbel if gumbel_only else getattr(self.noise, "continuous",
                                                                   False))
        if ok:
            return
        need = ("Gumbel noise on the Simplex (the Gumbel-max trick)" if gumbel_only else
                "continuous noise on the Simplex (noise.argmax_probs)")
        raise NotImplementedError(
            f"PerturbedStructure.{what} is exact only for {need}; got {self.structure!r} with "
            f"{self.noise!r}. The law of a perturbed argmax over other structures has no "
            f"tractable form: estimate it from sample(), or use the exact Gibbs families "
            f"(KSubsetDistribution, SpanningTreeDistribution, ArborescenceDistribution)")

    @property
    def marginals(self) -> torch.Tensor:
        """P(X = e_i) = ``noise.argmax_probs(θ)`` on the simplex (continuous noise); differentiable.

        Raises:
            NotImplementedError: other structures or discrete noise.
        """
        self._on_simplex("marginals", gumbel_only=False)
        if type(self.noise) is Gumbel:
            return torch.softmax(self.theta / self.noise.scale, dim=-1)
        return self.noise.argmax_probs(self.theta)

    @property
    def mean(self) -> torch.Tensor:
        """E[X], the :attr:`marginals`."""
        return self.marginals

    @property
    def variance(self) -> torch.Tensor:
        """Var[X] entrywise, p(1 − p)."""
        p = self.marginals
        return p * (1 - p)

    def _log_probs(self) -> torch.Tensor:
        self._on_simplex("log_prob", gumbel_only=True)
        return torch.log_softmax(self.theta / cast(Gumbel, self.noise).scale, dim=-1)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """log P(X = z) = ⟨z, log softmax(θ/β)⟩ for one-hot z (Gumbel noise on the simplex).

        Raises:
            NotImplementedError: other structures or noise (module docstring).
            ValueError: (``validate_args``) ``value`` of the wrong shape or not one-hot.
        """
        self._on_simplex("log_prob", gumbel_only=True)
        if self._validate_args:
            self._validate_sample(value)
        logp = self._log_probs()
        z = value.to(logp.dtype)
        return torch.where(z != 0, logp, torch.zeros((), dtype=logp.dtype,
                                                     device=logp.device)).mul(z).sum(-1)

    def entropy(self) -> torch.Tensor:
        """H(X) = −Σ p log p with p = softmax(θ/β) (Gumbel noise on the simplex), ``(*batch)``."""
        logp = self._log_probs()
        p = logp.exp()
        safe = torch.where(p > 0, logp, torch.zeros((), dtype=logp.dtype, device=logp.device))
        return -(p * safe).sum(-1)

    def enumerate_support(self, expand: bool = True) -> torch.Tensor:
        """Every vertex of Z (``structure.enumerate``; tiny n only).

        Shape: ``(|Z|, *batch, *event)`` with ``expand``, else ``(|Z|, 1, ..., 1, *event)``.
        """
        z = self.structure.enumerate(self.event_shape[-1], dtype=self.theta.dtype,
                                     device=self.theta.device)
        z = z.reshape(z.shape[:1] + (1,) * len(self.batch_shape) + self.event_shape)
        if expand:
            z = z.expand(z.shape[:1] + self.batch_shape + self.event_shape)
        return z

    def expand(self, batch_shape: _size, _instance=None):
        """A view with a larger batch shape (θ broadcast, not copied)."""
        new = self._get_checked_instance(PerturbedStructure, _instance)
        batch_shape = torch.Size(batch_shape)
        new.theta = self.theta.expand(batch_shape + self.event_shape)
        for key in ("structure", "noise", "tau", "regularizer", "backward"):
            setattr(new, key, getattr(self, key))
        Distribution.__init__(new, batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def __repr__(self) -> str:
        return (f"PerturbedStructure(theta: {tuple(self.theta.shape)}, "
                f"structure={self.structure!r}, noise={self.noise!r}, tau={self.tau!r}, "
                f"regularizer={self.regularizer!r}, backward={self.backward!r})")
