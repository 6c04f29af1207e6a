"""The base class of perturbation distributions and its declared capabilities.

A noise declares what it can do with class attributes, as ``torch.distributions`` does with
``has_rsample`` and ``has_enumerate_support``; code that consumes a noise (the generic
quadrature, :mod:`perturb.checks`) reads these flags and never probes the methods:

====================== ==================================================================
``continuous``         ε has a density: ties among perturbed scores have probability zero
``bounded``            the support is a bounded interval (:attr:`Noise.support`)
``has_log_prob``       :meth:`Noise.log_prob` is defined (a density, or a mass if not
                       continuous)
``has_cdf``            :meth:`Noise.cdf` is defined
``has_icdf``           :meth:`Noise.icdf` is defined (sampling by inversion, quasi-Monte Carlo)
``has_sample``         :meth:`Noise.sample` works (defined, or derived from ``icdf``)
``has_variance``       :attr:`Noise.variance` is defined
``has_closed_form``    ``argmax_probs``/``expected_max`` are computed without quadrature
                       (closed forms, exact counting)
``has_argmax_probs``   ``argmax_probs``/``expected_max`` are available: a closed form, or the
                       quadrature (``continuous`` with ``has_cdf`` and ``has_log_prob``)
====================== ==================================================================

The built-in families declare every flag in their class body. A user subclass that leaves a
flag out gets it from the base class at class creation: ``has_cdf`` is True when the subclass
(or a parent) defines ``cdf``, and likewise ``has_log_prob`` (``log_prob``), ``has_icdf``
(``icdf``), ``has_variance`` (``variance``), ``has_closed_form`` (``_argmax_probs`` or
``argmax_probs``); ``has_sample`` also holds when only ``icdf`` is defined; ``has_argmax_probs``
follows from the others. Setting a flag in the class body overrides the derivation.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import torch

from .._math import log1mexp
from .._validation import check_dim, check_scores
from . import _quadrature
from ._args import _open_uniform, _sample_args, _zero_grad_like

__all__ = ["Noise", "QuadratureLayout"]


class QuadratureLayout(NamedTuple):
    """Where the quadrature of :mod:`perturb.noise` puts its nodes, for ``d`` coordinates.

    Attributes:
        low: lower end of the grid, as an offset from ``max θ``: the quantile leaving mass
            1e-14 of the perturbed max below (bounded noise: the left end of the support).
        high: upper end, the offset leaving mass 1e-14 above (bounded: the right end).
        width: the widest panel (``math.inf``: one panel per piece between kinks, which is
            what bounded noise uses).
        order: Gauss–Legendre nodes per panel.
    """

    low: float
    high: float
    width: float
    order: int


# capability flag -> the member whose definition declares it (see the module docstring)
_BY_DEFINITION = {"has_log_prob": ("log_prob",), "has_cdf": ("cdf",), "has_icdf": ("icdf",),
                  "has_variance": ("variance",),
                  "has_closed_form": ("_argmax_probs", "argmax_probs")}


class Noise:
    """Base class of perturbation distributions ε (one real value per coordinate).

    A subclass needs only :meth:`sample` (or :meth:`icdf`, from which the default ``sample``
    draws by inversion) to be used for perturbing. For the exact functionals
    :meth:`argmax_probs` and :meth:`expected_max` a continuous noise provides :meth:`cdf` and
    :meth:`log_prob` (returning ``-inf``, with a zero gradient, outside the support); the generic
    quadrature (:mod:`perturb.noise._quadrature`) then applies on the grid of
    :meth:`quadrature_layout`. Noise with bounded support sets ``bounded = True`` and
    :attr:`support`; a density with kinks or jumps inside its support lists them in
    ``breakpoints`` (the rule is only accurate for densities smooth between them).

    Capabilities are declared, not discovered: the class attributes ``has_log_prob``,
    ``has_cdf``, ``has_icdf``, ``has_sample``, ``has_variance``, ``has_closed_form`` and
    ``has_argmax_probs`` (see :mod:`perturb.noise.base`) default to what the subclass defines,
    and may be set explicitly in the class body.

    Attributes:
        bounded: the support is a bounded interval.
        continuous: ε has a density (ties among perturbed scores have probability zero).
        breakpoints: points inside the support where the density is not smooth.

    Example:
        >>> class Laplace(Noise):
        ...     breakpoints = (0.0,)
        ...     def cdf(self, x):
        ...         return torch.where(x < 0, 0.5 * torch.exp(x.clamp_max(0)),
        ...                            1 - 0.5 * torch.exp(-x.clamp_min(0)))
        ...     def log_prob(self, x):
        ...         return -x.abs() - math.log(2)
        ...     def icdf(self, u):
        ...         return -torch.sign(u - 0.5) * torch.log1p(-2 * (u - 0.5).abs())
        >>> Laplace.has_cdf, Laplace.has_sample, Laplace.has_argmax_probs
        (True, True, True)
        >>> p = Laplace().argmax_probs(torch.tensor([0.0, 1.0]))
    """

    bounded: bool = False
    continuous: bool = True
    breakpoints: tuple[float, ...] = ()

    has_log_prob: bool = False
    has_cdf: bool = False
    has_icdf: bool = False
    has_sample: bool = False
    has_variance: bool = False
    has_closed_form: bool = False
    has_argmax_probs: bool = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        """Fill in the capability flags a subclass does not declare (module docstring)."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__
        for flag, members in _BY_DEFINITION.items():
            if flag not in own and any(m in own for m in members):
                setattr(cls, flag, True)
        if "has_sample" not in own:
            cls.has_sample = bool(cls.has_sample or "sample" in own or cls.has_icdf)
        if "has_argmax_probs" not in own:
            cls.has_argmax_probs = bool(cls.has_closed_form or (
                cls.continuous and cls.has_cdf and cls.has_log_prob))

    # -- distribution -------------------------------------------------------------------------

    def sample(self, shape: Sequence[int] | torch.Size | int, *,
               generator: torch.Generator | None = None,
               device: torch.device | str | None = None,
               dtype: torch.dtype | None = None) -> torch.Tensor:
        """Draw independent samples of shape ``shape``.

        Args:
            shape: the output shape (tuple of ints or ``torch.Size``).
            generator: a ``torch.Generator``; the same seed gives the same samples.
            device: defaults to the generator's device, else the default device.
            dtype: a floating dtype; defaults to ``torch.get_default_dtype()``.

        Shape:
            ``shape``.

        Raises:
            ValueError: bad ``shape`` or a non-floating ``dtype``.

        Returns:
            A tensor of shape ``shape`` on ``device`` with dtype ``dtype``.
        """
        shape, device, dtype = _sample_args(shape, generator, device, dtype)
        return self.icdf(_open_uniform(shape, generator, device, dtype))

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """Log density at ``x`` (elementwise)."""
        raise NotImplementedError(f"{type(self).__name__} does not define log_prob()")

    def cdf(self, x: torch.Tensor) -> torch.Tensor:
        """Cumulative distribution function ``F(x) = P(ε ≤ x)`` (elementwise)."""
        raise NotImplementedError(f"{type(self).__name__} does not define cdf()")

    def log_cdf(self, x: torch.Tensor) -> torch.Tensor:
        """``log F(x)``; subclasses override it with a form that is accurate in the tails."""
        return torch.log(self.cdf(x))

    def log_sf(self, x: torch.Tensor) -> torch.Tensor:
        """``log(1 − F(x)) = log P(ε > x)``, the log survival function; accurate where
        ``F(x)`` rounds to 1 when a subclass overrides it (the default, ``log1mexp(log F)``, is
        ``-inf`` there). A subclass of a built-in family that changes ``log_cdf`` overrides
        this too (the families' versions are written for their own law)."""
        return log1mexp(self.log_cdf(x).clamp(max=0.0))

    def icdf(self, u: torch.Tensor) -> torch.Tensor:
        """Quantile function ``F⁻¹(u)`` for ``u ∈ [0, 1]`` (elementwise; for quasi-Monte Carlo)."""
        raise NotImplementedError(
            f"{type(self).__name__} defines neither sample() nor icdf(); define one of them")

    @property
    def mean(self) -> float:
        """``E[ε]``."""
        raise NotImplementedError(f"{type(self).__name__} does not define mean")

    @property
    def variance(self) -> float:
        """``Var[ε]``."""
        raise NotImplementedError(f"{type(self).__name__} does not define variance")

    @property
    def stddev(self) -> float:
        """``sqrt(Var[ε])``."""
        return math.sqrt(self.variance)

    @property
    def support(self) -> tuple[float, float]:
        """The interval ``(low, high)`` holding the support (``±inf`` when unbounded)."""
        return (-math.inf, math.inf)

    # -- functionals of the perturbed max -----------------------------------------------------

    def expected_max(self, theta: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Expected maximum of the perturbed scores, ``E[max_i(θ_i + ε_i)]``.

        Closed form for Gumbel, exact counting for :class:`~perturb.noise.Discrete`,
        Gauss–Legendre quadrature (float64, error about 1e-13 for the built-in families) of
        ``E = a + ∫_a^∞ (1 − F_max) − ∫_{−∞}^a F_max`` with ``F_max(x) = Π_i F(x − θ_i)``
        otherwise. Differentiable in θ; its gradient is :meth:`argmax_probs`.

        Args:
            theta: scores, a floating tensor.
            dim: the dim holding the ``d`` perturbed coordinates.

        Shape:
            ``theta``: ``(*batch, d)`` (``d`` at ``dim``); returns ``(*batch,)``.

        Returns:
            The expected maximum, in ``theta``'s dtype and device (float64 inside; needs a
            device with float64 support).

        Raises:
            ValueError: non-floating, empty or non-finite ``theta``, bad ``dim``.
            NotImplementedError: a noise without ``has_argmax_probs`` (no closed form, and no
                ``cdf``/``log_prob`` for the quadrature).

        Example:
            >>> from perturb.noise import Gumbel
            >>> Gumbel().expected_max(torch.zeros(2))  # log 2 + γ
            tensor(1.2704)
        """
        x = self._check_theta(theta, dim).movedim(dim, -1)
        return self._expected_max(x)

    def argmax_probs(self, theta: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Distribution of the perturbed argmax, ``P(argmax_j(θ_j + ε_j) = i)``.

        Gumbel: ``softmax(θ/scale)``. Other continuous noise: the integral
        ``∫ f(x − θ_i) Π_{j≠i} F(x − θ_j) dx`` by Gauss–Legendre quadrature in float64 (product
        of CDFs in log space; rows sum to 1 within about 1e-13 for the built-in families,
        without renormalisation), differentiable by autograd. :class:`~perturb.noise.Discrete`:
        exact, ties split uniformly among the tied maximisers. Ties have probability zero for
        continuous noise.

        Args:
            theta: scores, a floating tensor.
            dim: the dim holding the ``d`` coordinates.

        Shape:
            ``theta``: ``(*batch, d)``; returns the same shape.

        Returns:
            Probabilities along ``dim`` (non-negative, summing to 1), in ``theta``'s dtype and
            device. Cost for quadrature: ``O(batch · d · N)`` time and memory with ``N`` a few
            hundred nodes (``N ≈ 2d·order`` for bounded noise).

        Raises:
            ValueError: non-floating, empty or non-finite ``theta``, bad ``dim``.
            NotImplementedError: a noise without ``has_argmax_probs``.

        Example:
            >>> from perturb.noise import Normal
            >>> Normal().argmax_probs(torch.tensor([1.0, 0.0]))  # Φ(1/√2), Φ(−1/√2)
            tensor([0.7602, 0.2398])
        """
        x = self._check_theta(theta, dim).movedim(dim, -1)
        if x.shape[-1] == 1:
            out = _zero_grad_like(torch.ones_like(x), x)
        else:
            out = self._argmax_probs(x)
        return out.movedim(-1, dim)

    # -- hooks --------------------------------------------------------------------------------

    def _expected_max(self, theta: torch.Tensor) -> torch.Tensor:
        """``expected_max`` over the last dim (override for closed forms)."""
        self._require_quadrature("expected_max")
        return _quadrature.expected_max(self, theta)

    def _argmax_probs(self, theta: torch.Tensor) -> torch.Tensor:
        """``argmax_probs`` over the last dim, ``d ≥ 2`` (override for closed forms)."""
        self._require_quadrature("argmax_probs")
        return _quadrature.argmax_probs(self, theta)

    def _log_cdf_(self, z: torch.Tensor) -> torch.Tensor:
        """``log F(z)`` for a fresh float64 tensor ``z`` that the call may overwrite (the node
        terms of the box quadrature, :mod:`perturb.boxes.expected_volumes`).

        Accuracy contract: absolute, about 1e-15 where ``log F`` is of order 1 and relative
        where it is large and negative (what a sum of ``log F`` inside a log-sum-exp needs);
        not the relative accuracy of :meth:`log_cdf` where ``F`` rounds to 1. Default:
        ``log_cdf(z)``; a family overrides it to standardise ``z`` in place or to take a
        cheaper form. The result may share ``z``'s storage; read ``z`` no longer.
        """
        return self.log_cdf(z)

    def _log_hazard_(self, z: torch.Tensor, log_cdf: torch.Tensor) -> torch.Tensor:
        """``log f(z) − log F(z)`` for a fresh float64 tensor ``z`` (may be overwritten) and
        ``log_cdf``, :meth:`_log_cdf_` of the same values (not overwritten): the hazard terms of
        the box quadrature's backward. Default: ``log_prob(z) − log_cdf``; a family overrides
        it with a cheaper or more accurate form (Logistic: ``log_sf(z) − log s``, exact where
        its ``log_prob`` loses digits in the far tail)."""
        return self.log_prob(z) - log_cdf

    def _require_quadrature(self, what: str) -> None:
        """NotImplementedError unless the declared capabilities allow the generic quadrature."""
        if not (self.continuous and self.has_cdf and self.has_log_prob):
            raise NotImplementedError(
                f"{type(self).__name__}: {what} needs a continuous noise with cdf and log_prob "
                f"(has_cdf={self.has_cdf}, has_log_prob={self.has_log_prob}, "
                f"continuous={self.continuous}) or a closed form")

    def _check_theta(self, theta: torch.Tensor, dim: int) -> torch.Tensor:
        check_scores(theta, "theta")
        dim = check_dim(theta, dim)
        if theta.shape[dim] == 0:
            raise ValueError(f"theta must have at least one entry along dim={dim}, "
                             f"got shape {tuple(theta.shape)}")
        return theta

    def quadrature_layout(self, d: int) -> QuadratureLayout:
        """The grid of the generic quadrature for ``d`` coordinates (a :class:`QuadratureLayout`).

        Default, unbounded noise: the quantiles leaving mass 1e-14 of the max of ``d``
        perturbed scores outside (from :meth:`icdf` when ``has_icdf``, else bisection on
        :meth:`cdf`), 64 panels of order 20. Bounded noise: :attr:`support`, one panel per piece
        between kinks, order 24. The defaults are conservative, not verified for every density;
        the built-in families override them with widths matched to their shape.
        """
        if self.bounded:
            low, high = self.support
            return QuadratureLayout(float(low), float(high), math.inf, 24)
        lo = self._quantile(_quadrature._TAIL)
        hi = self._quantile(1.0 - max(_quadrature._TAIL / d, 4 * torch.finfo(torch.float64).eps))
        return QuadratureLayout(lo, hi, (hi - lo) / 64, 20)

    def _quantile(self, p: float) -> float:
        """``F⁻¹(p)`` as a float: :meth:`icdf` if declared, else bisection on :meth:`cdf`."""
        if self.has_icdf:
            return float(self.icdf(torch.tensor(p, dtype=torch.float64)))
        return _quadrature._bisect_quantile(self.cdf, p, repr(self))

    # -- identity -----------------------------------------------------------------------------

    def _params(self) -> dict[str, object] | None:
        """The parameters defining the distribution (for ``repr``/``==``); None: identity."""
        return None

    def __repr__(self) -> str:
        params = self._params()
        if params is None:
            return f"{type(self).__name__}()"
        return f"{type(self).__name__}(" + ", ".join(f"{k}={v!r}" for k, v in params.items()) + ")"

    def __eq__(self, other: object) -> bool:
        params = self._params()
        if params is None:
            return self is other
        return type(self) is type(other) and params == other._params()

    def __hash__(self) -> int:
        params = self._params()
        if params is None:
            return object.__hash__(self)
        return hash((type(self).__name__, tuple(params.items())))
