r"""The distribution of a perturbed argmax over a structure.

For scores θ (``logits``), a noise ε (i.i.d. per coordinate) and a structure Z
(:mod:`perturb.core`):

.. math::

    X = \arg\max_{z \in Z} \langle \theta + \varepsilon, z\rangle

``sample`` and ``rsample`` draw from this one law, as a ``torch.distributions`` object must:
``sample`` is X (no gradient); ``rsample`` is the same X (the same noise for the same generator
state) whose gradient is that of the relaxation
X_τ = argmax_{x ∈ conv Z} ⟨θ + ε, x⟩ − τ f(x) — the straight-through estimator of
``perturb.relax(..., hard=True)``, as ``torch.distributions.OneHotCategoricalStraightThrough`` is
for the categorical. The relaxed point X_τ itself, with its own law, is
:class:`~perturb.distributions.RelaxedPerturbedStructure` (as ``RelaxedOneHotCategorical`` is
torch's).

Exact quantities exist only where the law of X has a closed form or a cheap exact one:

- on the :class:`~perturb.Simplex` with continuous noise, P(X = e_i) is
  ``noise.argmax_probs(θ)`` (Gumbel: softmax(θ/β), closed form; other continuous noise:
  quadrature to ~1e-13): ``marginals``, ``mean``, ``variance``, ``log_prob``, ``entropy`` and
  the KL divergence between two such distributions (:mod:`perturb.distributions.kl`);
- elsewhere (k-subsets, trees, permutations) the law of the perturbed argmax has no tractable
  form (e.g. Gumbel top-k is sampling without replacement, whose set probability sums over k!
  orders): these raise NotImplementedError; the Gibbs families (:class:`KSubsetDistribution`,
  ...) are the exact alternatives.

``mode`` is the noiseless argmax argmax_z ⟨θ, z⟩ (the most probable outcome on the simplex
with i.i.d. noise; in general the MAP structure of the scores, not necessarily the most
probable perturbed argmax).
"""
from __future__ import annotations

from typing import Any

import torch
from torch.types import _size
from torch.distributions import Distribution

from perturb._validation import check_choice, check_tau
from perturb.distributions.constraints import StructureSupport, log_potential
from perturb.distributions.gibbs import (_resolve_validate, _sample_count, _scores_argument,
                                         _validate_with)
from perturb.noise import Gumbel, Noise
from perturb.noise._args import check_noise
from perturb.regularizers import Regularizer
from perturb._engine import FINITE_NOISES, check_structure, perturb_checked, relax_checked
from perturb.backward import BACKWARD_MODES
from perturb.structures import Simplex, Structure

__all__ = ["PerturbedStructure"]


def _can_enumerate(structure: Structure) -> bool:
    """Whether the structure's class implements ``enumerate`` (the base class does not)."""
    return type(structure).enumerate is not Structure.enumerate


class _PerturbedBase(Distribution):
    """What the exact and the relaxed perturbed distributions share: the arguments, their
    checks, ``expand`` and ``mode``. Subclasses define the law (``sample``/``rsample``)."""

    arg_constraints = {"logits": log_potential}
    has_rsample = True

    def __init__(self, logits: torch.Tensor | None = None, structure: Structure | None = None,
                 noise: Noise | None = None, tau: float | torch.Tensor = 1.0,
                 regularizer: Regularizer | None = None, backward: str = "auto",
                 validate_args: bool | None = None, *, theta: torch.Tensor | None = None):
        name = type(self).__name__
        logits = _scores_argument(name, logits, "theta", theta)
        validate = _resolve_validate(validate_args)
        check_structure(structure)  # type: ignore[arg-type]
        assert structure is not None  # (checked)
        noise = Gumbel() if noise is None else noise
        check_noise(noise)
        if regularizer is not None and not isinstance(regularizer, Regularizer):
            raise ValueError(f"regularizer must be a perturb Regularizer, got {regularizer!r}")
        check_tau(tau)
        check_choice(backward, BACKWARD_MODES, "backward")
        _validate_with(structure, logits, "logits", validate)
        self.logits = logits
        self.structure = structure
        self.noise = noise
        self.tau = tau
        self.regularizer = regularizer
        self.backward = backward
        d = structure.event_dim
        super().__init__(logits.shape[:logits.ndim - d], logits.shape[logits.ndim - d:],
                         validate_args=validate)

    @property
    def theta(self) -> torch.Tensor:
        """The scores, under their former name (``logits``)."""
        return self.logits

    @property
    def mode(self) -> torch.Tensor:
        """The noiseless argmax argmax_z ⟨θ, z⟩, ``(*batch, *event)``, no gradient."""
        with torch.no_grad():
            return self.structure.argmax(self.logits.detach())

    def _noise_sample(self, sample_shape: _size, generator: torch.Generator | None, hard: bool
                      ) -> torch.Tensor:
        """The relaxation on θ + ε (``perturb.relax``; ``hard``: its straight-through form),
        ``(*sample_shape, *batch, *event)``."""
        shape, count = _sample_count(sample_shape)
        out_shape = shape + self.batch_shape + self.event_shape
        if count == 0:
            return self.logits.new_zeros(out_shape)
        x = relax_checked(self.logits, self.structure, self.noise, self.regularizer, self.tau,
                          hard, count if shape else None, generator, self.backward)
        return x.reshape(out_shape)

    def expand(self, batch_shape: _size, _instance: Any = None) -> Any:
        """A view with a larger batch shape (θ broadcast, not copied)."""
        new = self._get_checked_instance(type(self), _instance)
        batch_shape = torch.Size(batch_shape)
        new.logits = self.logits.expand(batch_shape + self.event_shape)
        for key in ("structure", "noise", "tau", "regularizer", "backward"):
            setattr(new, key, getattr(self, key))
        Distribution.__init__(new, batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(logits: {tuple(self.logits.shape)}, "
                f"structure={self.structure!r}, noise={self.noise!r}, tau={self.tau!r}, "
                f"regularizer={self.regularizer!r}, backward={self.backward!r})")


class PerturbedStructure(_PerturbedBase):
    r"""X = argmax_{z∈Z} ⟨θ + ε, z⟩ as a torch distribution, with a straight-through ``rsample``.

    See :mod:`perturb.distributions.perturbed` for the math and where exact quantities exist.
    ``sample`` and ``rsample`` follow the same law: ``rsample`` is the exact X whose gradient is
    that of the relaxation at τ (``regularizer``, ``backward``), the straight-through estimator
    (``torch.distributions.OneHotCategoricalStraightThrough`` on the simplex); the relaxed
    point as a distribution of its own is :class:`RelaxedPerturbedStructure`.

    Args:
        logits: scores θ (``theta=`` is the former name: ``FutureWarning``).
        structure: Z, a :class:`perturb.Structure` (``Simplex()``, ``KSubset(k)``,
            ``Permutations()``, ``SpanningTrees()``, ``Arborescences(root)``...).
        noise: ε, a :class:`perturb.Noise` (default ``Gumbel()``).
        tau: temperature τ > 0 of the relaxation whose gradient ``rsample`` carries (a float,
            or a tensor broadcastable to ``(*batch)``); the law does not depend on it.
        regularizer: f of that relaxation (default: ``structure.default_regularizer()``).
        backward: its backward mode (``"auto"``, ``"analytic"``, ``"implicit"``, ``"unroll"``,
            ``"finite_difference"``; the pair's supported ones, checked when ``rsample`` runs).
        validate_args: torch.distributions validation: θ's values (NaN, inf, as the structure
            allows) at construction and the support in ``log_prob``. Shapes are always checked.

    Shape: ``logits``: ``(*batch, *event)`` with ``structure.event_dim`` event dims;
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
        >>> x = d.rsample()                 # a one-hot, with the Gumbel-softmax gradient
        >>> z = d.sample((8,))              # exact one-hots, (8, 4, 10)
        >>> d.log_prob(z).shape             # log softmax(θ) at z
        torch.Size([8, 4])
        >>> from perturb.structured import KSubset
        >>> y = PerturbedStructure(theta, KSubset(3), tau=0.1).rsample()   # top-3, ST gradient
    """

    @property
    def has_enumerate_support(self) -> bool:  # type: ignore[override]  # torch reads it
        """Whether the structure can list its vertices (implements ``enumerate``)."""
        return _can_enumerate(self.structure)

    # -- sampling ------------------------------------------------------------------------------

    @property
    def support(self) -> StructureSupport:
        """The vertices Z of the structure (what ``sample`` and ``rsample`` return)."""
        return StructureSupport(self.structure)

    def sample(self, sample_shape: _size = torch.Size(),
               generator: torch.Generator | None = None) -> torch.Tensor:
        """Exact perturbed argmax X = argmax_z ⟨θ + ε, z⟩, no gradient.

        The noise is drawn as :func:`perturb.perturb` draws it, so with the same generator state
        X is the value of :meth:`rsample` (and of ``relax(θ, ..., hard=True)``).

        Shape: ``(*sample_shape, *batch, *event)``.
        """
        shape, count = _sample_count(sample_shape)
        out_shape = shape + self.batch_shape + self.event_shape
        if count == 0:
            return self.logits.new_zeros(out_shape)
        with torch.no_grad():
            u = perturb_checked(self.logits.detach(), self.noise, count if shape else None,
                                generator)
            if type(self.noise) not in FINITE_NOISES:
                self.structure.validate(u, "logits + noise")
            return self.structure.argmax(u).reshape(out_shape)

    def rsample(self, sample_shape: _size = torch.Size(),
                generator: torch.Generator | None = None) -> torch.Tensor:
        """The exact X of :meth:`sample` (same law, same noise for the same generator state),
        with the gradient of the relaxation X_τ at ``tau`` (straight-through,
        ``perturb.relax(..., hard=True)``): differentiable in θ (and a tensor τ) through the
        ``backward`` mode.

        Shape: ``(*sample_shape, *batch, *event)``.

        Raises:
            NotImplementedError: no solver for (structure, regularizer).
            ValueError: ``backward`` not supported by that solver.
        """
        return self._noise_sample(sample_shape, generator, hard=True)

    # -- exact quantities ----------------------------------------------------------------------

    def _on_simplex(self, what: str) -> None:
        if isinstance(self.structure, Simplex) and getattr(self.noise, "continuous", False) \
                and getattr(self.noise, "has_argmax_probs", type(self.noise) is Gumbel):
            return
        raise NotImplementedError(
            f"PerturbedStructure.{what} is exact only for continuous noise on the Simplex (the "
            f"argmax probabilities noise.argmax_probs: a closed form for Gumbel noise, a "
            f"quadrature otherwise); got {self.structure!r} with {self.noise!r}. The law of a "
            f"perturbed argmax over other structures has no tractable form: estimate it from "
            f"sample(), or use the exact Gibbs families (KSubsetDistribution, "
            f"SpanningTreeDistribution, ArborescenceDistribution)")

    @property
    def marginals(self) -> torch.Tensor:
        """P(X = e_i) = ``noise.argmax_probs(θ)`` on the simplex (continuous noise); differentiable.

        Raises:
            NotImplementedError: other structures or discrete noise.
        """
        self._on_simplex("marginals")
        if type(self.noise) is Gumbel:
            return torch.softmax(self.logits / self.noise.scale, dim=-1)
        return self.noise.argmax_probs(self.logits)

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
        """log P(X = e_i), ``(*batch, n)``: log softmax(θ/β) for Gumbel noise, else the log of
        the argmax probabilities (−inf where one underflows)."""
        self._on_simplex("log_prob")
        if type(self.noise) is Gumbel:
            return torch.log_softmax(self.logits / self.noise.scale, dim=-1)
        return torch.log(self.marginals)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """log P(X = z) = ⟨z, log p⟩ for one-hot z, p the argmax probabilities (continuous noise
        on the simplex; log softmax(θ/β) for Gumbel noise).

        Raises:
            NotImplementedError: other structures or noise (module docstring).
            ValueError: (``validate_args``) ``value`` of the wrong shape or not one-hot.
        """
        self._on_simplex("log_prob")
        if self._validate_args:
            self._validate_sample(value)
        logp = self._log_probs()
        z = value.to(logp.dtype)
        return torch.where(z != 0, logp, torch.zeros((), dtype=logp.dtype,
                                                     device=logp.device)).mul(z).sum(-1)

    def entropy(self) -> torch.Tensor:
        """H(X) = −Σ p log p with p the argmax probabilities (continuous noise on the simplex),
        ``(*batch)``."""
        logp = self._log_probs()
        p = logp.exp()
        safe = torch.where(p > 0, logp, torch.zeros((), dtype=logp.dtype, device=logp.device))
        return -(p * safe).sum(-1)

    def cross_entropy(self, other: "PerturbedStructure") -> torch.Tensor:
        """H(p, q) = −Σ p log q, q the argmax probabilities of ``other`` (continuous noise on the
        simplex, both), ``(*batch)``."""
        if not isinstance(other, PerturbedStructure):
            raise ValueError(f"other must be a PerturbedStructure, got {type(other).__name__}")
        p, log_q = self._log_probs().exp(), other._log_probs()
        return -(p * torch.where(p > 0, log_q, torch.zeros((), dtype=log_q.dtype,
                                                           device=log_q.device))).sum(-1)

    def enumerate_support(self, expand: bool = True) -> torch.Tensor:
        """Every vertex of Z (``structure.enumerate``; tiny n only).

        Shape: ``(|Z|, *batch, *event)`` with ``expand``, else ``(|Z|, 1, ..., 1, *event)``.
        """
        z = self.structure.enumerate(self.event_shape[-1], dtype=self.logits.dtype,
                                     device=self.logits.device)
        z = z.reshape(z.shape[:1] + (1,) * len(self.batch_shape) + self.event_shape)
        if expand:
            z = z.expand(z.shape[:1] + self.batch_shape + self.event_shape)
        return z
