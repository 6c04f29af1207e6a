"""Perturbation distributions: what ε is in ``U = θ + ε``.

Every noise ``ε`` here is a distribution on the real line; a perturbation of scores ``θ`` of
shape ``(*batch, d)`` adds ``d`` independent draws per batch element. Two functionals of the
perturbed scores drive the rest of the library (see the module docstring of
:mod:`perturb.relax` for the perturb-then-argmax abstraction):

.. math::

    \\operatorname{expected\\_max}(θ) = \\mathbb{E}[\\max_i (θ_i + ε_i)],
    \\qquad
    \\operatorname{argmax\\_probs}(θ)_i = P(\\operatorname{argmax}_j (θ_j + ε_j) = i)
        = \\int f(x - θ_i) \\prod_{j \\ne i} F(x - θ_j)\\, dx .

``argmax_probs`` is the gradient of ``expected_max`` (both are computed, never Monte-Carlo):

- Gumbel: closed forms ``scale·logsumexp(θ/scale) + scale·γ`` and ``softmax(θ/scale)``
  (max-stability of the Gumbel family).
- other continuous noise: one-dimensional Gauss–Legendre quadrature in float64, accurate to
  about 1e-13 for the built-in families (measured against closed forms and scipy), batched and
  differentiable by autograd.
- :class:`Discrete`: exact, by counting over the support (ties split uniformly).

User-defined noise subclasses :class:`Noise`: ``sample`` (or ``icdf``) is enough to perturb;
``cdf`` and ``log_prob`` make ``argmax_probs``/``expected_max`` available through the generic
quadrature.
"""
from __future__ import annotations

import math
import numbers
from typing import Sequence

import numpy as np
import torch

from ._math import EULER_GAMMA
from ._noise_discrete import _win_weights
from ._noise_quadrature import (_F64, _TAIL, _bisect_quantile, _quadrature_argmax_probs,
                                _quadrature_expected_max)
from ._validation import check_dim, check_positive, check_scores, check_value, validation_enabled

__all__ = ["Noise", "Gumbel", "Normal", "Gaussian", "Logistic", "Uniform", "Discrete",
           "EULER_GAMMA"]

#: The Euler–Mascheroni constant γ (the mean of a standard Gumbel).


# ---------------------------------------------------------------------------------------------
# small helpers


def _real(value: object, name: str) -> float:
    """A finite real number (Python number or 0-dim tensor) as float; ValueError otherwise."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a real number, got a tensor of shape "
                             f"{tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def _as_tensor(x: object, name: str) -> torch.Tensor:
    """Floating tensor view of ``x`` (numbers and integer tensors become the default dtype)."""
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x, dtype=torch.get_default_dtype())
    if not x.is_floating_point():
        if x.is_complex():
            raise ValueError(f"{name} must be real, got dtype {x.dtype}")
        x = x.to(torch.get_default_dtype())
    return x


def _check_unit(u: object) -> torch.Tensor:
    """``u`` as a floating tensor; ValueError (while validation is on) unless 0 <= u <= 1."""
    u = _as_tensor(u, "u")
    if validation_enabled() and u.numel():
        ok = (u >= 0) & (u <= 1)
        check_value(ok.all(), "u must lie in [0, 1] (and not be NaN)",
                    lambda: repr(u[~ok].flatten()[0].item()))
    return u


def _check_generator(generator: object) -> None:
    """ValueError unless ``generator`` is None or a ``torch.Generator``."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")


def _sample_args(shape: object, generator: torch.Generator | None,
                 device: torch.device | str | None,
                 dtype: torch.dtype | None) -> tuple[torch.Size, torch.device | str | None,
                                                      torch.dtype]:
    """Normalise the arguments of ``sample``; the device defaults to the generator's."""
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (int(shape),)
    try:
        dims = tuple(shape)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"shape must be a tuple of ints or a torch.Size, got {shape!r}") from None
    if any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 0 for s in dims):
        raise ValueError(f"shape must contain non-negative ints, got {shape!r}")
    if dtype is None:
        dtype = torch.get_default_dtype()
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    _check_generator(generator)
    if device is None and generator is not None:
        device = generator.device
    return torch.Size(int(s) for s in dims), device, dtype


def _default_device() -> torch.device:
    """Where a factory function without ``device=`` allocates."""
    get = getattr(torch, "get_default_device", None)  # torch >= 2.3
    return get() if get is not None else torch.device("cpu")


def _open_uniform(shape: torch.Size, generator: torch.Generator | None,
                  device: torch.device | str | None, dtype: torch.dtype) -> torch.Tensor:
    """U(0, 1) draws clamped into the open interval [tiny, 1 − eps/2] so no transform gives inf."""
    u = torch.rand(shape, generator=generator, device=device, dtype=dtype)
    bounds = _OPEN_UNIT.get(dtype)
    if bounds is None:
        fi = torch.finfo(dtype)
        bounds = _OPEN_UNIT[dtype] = (fi.tiny, 1.0 - fi.eps / 2)
    return u.clamp_(*bounds)


_OPEN_UNIT: dict[torch.dtype, tuple[float, float]] = {}


def _zero_grad_like(value: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """``value`` (same shape as ``theta``) as a function of ``theta`` with zero derivative.

    Used where the true derivative is zero almost everywhere (a piecewise-constant function of
    θ), so that Jacobian code sees a zero and not a detached output.
    """
    if not theta.requires_grad:
        return value
    return torch.where(torch.ones_like(value, dtype=torch.bool), value, theta)



# ---------------------------------------------------------------------------------------------
# the base class


class Noise:
    """Base class of perturbation distributions ε (one real value per coordinate).

    A subclass needs only :meth:`sample` (or :meth:`icdf`, from which the default ``sample``
    draws by inversion) to be used for perturbing. For the exact functionals
    :meth:`argmax_probs` and :meth:`expected_max` a continuous noise provides :meth:`cdf` and
    :meth:`log_prob` (returning ``-inf``, with a zero gradient, outside the support); the generic
    quadrature then applies. Its range comes from :meth:`icdf` (or bisection on :meth:`cdf`);
    noise with bounded support sets ``bounded = True`` and :attr:`support`; a density with kinks
    or jumps inside its support lists them in ``breakpoints`` (the rule is only accurate for
    densities smooth between them). Subclasses may override ``_quadrature_layout`` /
    ``_quadrature_order`` to tune the rule; the defaults are conservative, not verified for
    every density.

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
        >>> p = Laplace().argmax_probs(torch.tensor([0.0, 1.0]))
    """

    bounded: bool = False
    continuous: bool = True
    breakpoints: tuple[float, ...] = ()

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

        Closed form for Gumbel, exact counting for :class:`Discrete`, Gauss–Legendre
        quadrature (float64, error about 1e-13 for the built-in families) of
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
            NotImplementedError: a user noise without ``cdf``/``log_prob``.

        Example:
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
        without renormalisation), differentiable by autograd. :class:`Discrete`: exact, ties
        split uniformly among the tied maximisers. Ties have probability zero for continuous
        noise.

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
            NotImplementedError: a user noise without ``cdf``/``log_prob``.

        Example:
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
        if not self.continuous:
            raise NotImplementedError(
                f"{type(self).__name__}: expected_max needs a continuous noise (cdf and "
                f"log_prob) or an override")
        return _quadrature_expected_max(self, theta)

    def _argmax_probs(self, theta: torch.Tensor) -> torch.Tensor:
        """``argmax_probs`` over the last dim, ``d ≥ 2`` (override for closed forms)."""
        if not self.continuous:
            raise NotImplementedError(
                f"{type(self).__name__}: argmax_probs needs a continuous noise (cdf and "
                f"log_prob) or an override")
        return _quadrature_argmax_probs(self, theta)

    def _check_theta(self, theta: torch.Tensor, dim: int) -> torch.Tensor:
        check_scores(theta, "theta")
        dim = check_dim(theta, dim)
        if theta.shape[dim] == 0:
            raise ValueError(f"theta must have at least one entry along dim={dim}, "
                             f"got shape {tuple(theta.shape)}")
        return theta

    def _quadrature_layout(self, d: int) -> tuple[float, float, float, int]:
        """``(lo, hi, panel width, order)`` of the grid of offsets ``x − max θ`` (unbounded).

        Default: quantiles of the noise leaving mass ``_TAIL`` of the max outside, 64 panels of
        order 20. Built-in families override it with widths matched to their shape.
        """
        lo = self._quantile(_TAIL)
        hi = self._quantile(1.0 - max(_TAIL / d, 4 * torch.finfo(_F64).eps))
        return lo, hi, (hi - lo) / 64, 20

    def _quadrature_order(self, d: int) -> int:
        """Gauss–Legendre order per piece between kinks (bounded support)."""
        return 24

    def _quantile(self, p: float) -> float:
        """``F⁻¹(p)`` as a float: :meth:`icdf` if defined, else bisection on :meth:`cdf`."""
        try:
            return float(self.icdf(torch.tensor(p, dtype=_F64)))
        except NotImplementedError:
            pass
        return _bisect_quantile(self.cdf, p, repr(self))

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
        return type(self) is type(other) and params == other._params()  # type: ignore[union-attr]

    def __hash__(self) -> int:
        params = self._params()
        if params is None:
            return object.__hash__(self)
        return hash((type(self).__name__, tuple(params.items())))


# ---------------------------------------------------------------------------------------------
# location-0 scale families


class _ScaleNoise(Noise):
    """Shared parts of the one-parameter families ``ε = scale · ε₀``."""

    # Standardised panel width and Gauss–Legendre order of the quadrature grid (see
    # ``_quadrature_layout``); chosen from measured errors (docs/noise.md).
    _panel_width = 3.0
    _order = 20

    def __init__(self, scale: float = 1.0) -> None:
        check_positive(scale if not isinstance(scale, torch.Tensor) else scale.detach(), "scale")
        self.scale = _real(scale, "scale")

    def _params(self) -> dict[str, object]:
        return {"scale": self.scale}

    def _standard_tails(self, d: int) -> tuple[float, float]:
        """Standardised quantiles at lower mass ``_TAIL`` and upper mass ``_TAIL / d``."""
        raise NotImplementedError

    def _quadrature_layout(self, d: int) -> tuple[float, float, float, int]:
        lo, hi = self._standard_tails(d)
        return self.scale * lo, self.scale * hi, self.scale * self._panel_width, self._order

    def _from_uniform(self, u: torch.Tensor) -> torch.Tensor:
        """The quantile transform, unchecked."""
        raise NotImplementedError

    def icdf(self, u: torch.Tensor) -> torch.Tensor:
        """Quantile function ``F⁻¹(u)``, ``u ∈ [0, 1]`` (for inversion and quasi-Monte Carlo).

        Raises:
            ValueError: ``u`` outside ``[0, 1]`` (while validation is enabled).
        """
        return self._from_uniform(_check_unit(u))

    def sample(self, shape: Sequence[int] | torch.Size | int, *,
               generator: torch.Generator | None = None,
               device: torch.device | str | None = None,
               dtype: torch.dtype | None = None) -> torch.Tensor:
        shape, device, dtype = _sample_args(shape, generator, device, dtype)
        return self._from_uniform(_open_uniform(shape, generator, device, dtype))

    sample.__doc__ = Noise.sample.__doc__


class Gumbel(_ScaleNoise):
    """Max-Gumbel noise with location 0: ``F(x) = exp(−exp(−x/β))``, ``β = scale``.

    Mean ``βγ`` (γ the Euler–Mascheroni constant), variance ``π²β²/6``. Max-stable: the max of
    independent ``θ_i + ε_i`` is again Gumbel with location ``β·logsumexp(θ/β)``, which gives the
    closed forms ``expected_max = β·logsumexp(θ/β) + βγ`` and ``argmax_probs = softmax(θ/β)``
    (the Gumbel-max trick). Sampling: ``−β·log E`` with ``E ~ Exp(1)`` from one random draw
    (:meth:`_exponential`): ``exponential_`` on CUDA (one kernel; it never returns 0 or inf),
    ``E = −log U`` with ``U = torch.rand`` clamped into (0, 1) elsewhere (torch's CPU
    ``exponential_`` is a serial loop, about 7× slower). Samples are finite. As for every torch
    sampler, CPU and CUDA generators give different streams.

    Args:
        scale: ``β > 0``.

    Raises:
        ValueError: ``scale`` not a finite positive number.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> eps = Gumbel(scale=0.5).sample((3, 4), generator=g)

    References:
        Gumbel (1954); Maddison, Tarlow, Minka, "A* Sampling" (2014), arXiv:1411.0030.
    """

    def sample(self, shape: Sequence[int] | torch.Size | int, *,
               generator: torch.Generator | None = None,
               device: torch.device | str | None = None,
               dtype: torch.dtype | None = None) -> torch.Tensor:
        shape, device, dtype = _sample_args(shape, generator, device, dtype)
        return self._log_exponential(shape, generator, device, dtype).neg_()

    sample.__doc__ = Noise.sample.__doc__

    @staticmethod
    def _exponential(shape: torch.Size, generator: torch.Generator | None,
                     device: torch.device | str | None, dtype: torch.dtype) -> torch.Tensor:
        """The one random draw behind a sample: ``E ~ Exp(1)``, finite and > 0; unchecked args.

        CUDA: ``exponential_`` (one kernel; its uniform lies in (0, 1] and log 1 is replaced by
        −eps/2, so E > 0). Elsewhere: ``E = −log U``, ``U = torch.rand`` clamped to
        ``[tiny, 1 − eps/2]`` (torch's CPU ``exponential_`` is a serial loop, ~7× slower).
        """
        dev = device if isinstance(device, torch.device) else (
            torch.device(device) if device is not None else _default_device())
        if dev.type == "cuda":
            return torch.empty(shape, device=dev, dtype=dtype).exponential_(generator=generator)
        u = _open_uniform(shape, generator, dev, dtype)
        return torch.xlogy(-1, u, out=u)  # -log U in one op

    def _log_exponential(self, shape: torch.Size, generator: torch.Generator | None,
                         device: torch.device | str | None, dtype: torch.dtype) -> torch.Tensor:
        """``β·log E`` with ``E ~ Exp(1)``: minus a Gumbel(0, β) draw; arguments unchecked.

        :meth:`sample` negates it in place, and :func:`perturb.relax.perturb` computes
        ``θ − β·log E``, which is bitwise ``θ + sample(...)`` for the same generator state
        (negation is exact) with one pass less. One buffer, updated in place.
        """
        e = self._exponential(shape, generator, device, dtype).log_()
        return e if self.scale == 1 else e.mul_(self.scale)

    def _from_uniform(self, u: torch.Tensor) -> torch.Tensor:
        return -self.scale * torch.log(-torch.log(u))

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        z = _as_tensor(x, "x") / self.scale
        return -z - torch.exp(-z) - math.log(self.scale)

    def cdf(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(self.log_cdf(x))

    def log_cdf(self, x: torch.Tensor) -> torch.Tensor:
        return -torch.exp(-_as_tensor(x, "x") / self.scale)

    @property
    def mean(self) -> float:
        return self.scale * EULER_GAMMA

    @property
    def variance(self) -> float:
        return (math.pi * self.scale) ** 2 / 6

    def _standard_tails(self, d: int) -> tuple[float, float]:
        return -math.log(-math.log(_TAIL)), -math.log(-math.log1p(-_TAIL / d))

    def _expected_max(self, theta: torch.Tensor) -> torch.Tensor:
        return self.scale * torch.logsumexp(theta / self.scale, -1) + self.scale * EULER_GAMMA

    def _argmax_probs(self, theta: torch.Tensor) -> torch.Tensor:
        return torch.softmax(theta / self.scale, -1)


class Normal(_ScaleNoise):
    """Centred normal noise ``N(0, σ²)``, ``σ = scale``: ``F(x) = Φ(x/σ)``.

    Mean 0, variance ``σ²``. ``argmax_probs``/``expected_max`` by quadrature (no closed form for
    ``d > 2``; for ``d = 2``, ``P(argmax = 1) = Φ((θ₁ − θ₂)/(σ√2))``). ``log_cdf`` uses
    ``torch.special.log_ndtr`` and ``icdf`` ``torch.special.ndtri``; sampling uses
    ``torch.normal``. Alias: :data:`Gaussian`.

    Args:
        scale: ``σ > 0``.

    Raises:
        ValueError: ``scale`` not a finite positive number.

    Example:
        >>> Normal(scale=2.0).argmax_probs(torch.tensor([0.0, 0.0, 1.0])).sum()
        tensor(1.)
    """

    _order = 16

    def sample(self, shape: Sequence[int] | torch.Size | int, *,
               generator: torch.Generator | None = None,
               device: torch.device | str | None = None,
               dtype: torch.dtype | None = None) -> torch.Tensor:
        shape, device, dtype = _sample_args(shape, generator, device, dtype)
        # one op (normal_ scales in the same pass); the same draws as torch.randn for scale 1
        return torch.normal(0.0, self.scale, shape, generator=generator, device=device,
                            dtype=dtype)

    sample.__doc__ = Noise.sample.__doc__

    def _from_uniform(self, u: torch.Tensor) -> torch.Tensor:
        return self.scale * torch.special.ndtri(u)

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        z = _as_tensor(x, "x") / self.scale
        return -0.5 * z * z - math.log(self.scale) - 0.5 * math.log(2 * math.pi)

    def cdf(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.ndtr(_as_tensor(x, "x") / self.scale)

    def log_cdf(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.log_ndtr(_as_tensor(x, "x") / self.scale)

    @property
    def mean(self) -> float:
        return 0.0

    @property
    def variance(self) -> float:
        return self.scale ** 2

    def _standard_tails(self, d: int) -> tuple[float, float]:
        t = torch.tensor([_TAIL, _TAIL / d], dtype=_F64)
        q = torch.special.ndtri(t)
        return float(q[0]), -float(q[1])

    def _quadrature_layout(self, d: int) -> tuple[float, float, float, int]:
        # The max of d standard normals concentrates at width ~ 1/sqrt(2 log d): narrower panels.
        lo, hi = self._standard_tails(d)
        width = 2.5 / math.sqrt(1.0 + 0.5 * math.log(d))
        return self.scale * lo, self.scale * hi, self.scale * width, self._order


#: Alias of :class:`Normal`.
Gaussian = Normal


class Logistic(_ScaleNoise):
    """Centred logistic noise: ``F(x) = σ(x/s) = 1/(1 + exp(−x/s))``, ``s = scale``.

    Mean 0, variance ``π²s²/3``. (The difference of two independent Gumbels is logistic; the
    perturbed argmax with logistic noise is *not* a softmax, not even for ``d = 2``.)
    ``argmax_probs``/``expected_max`` by quadrature.

    Args:
        scale: ``s > 0``.

    Raises:
        ValueError: ``scale`` not a finite positive number.

    Example:
        >>> Logistic().cdf(torch.tensor(0.0))
        tensor(0.5000)
    """

    def _from_uniform(self, u: torch.Tensor) -> torch.Tensor:
        return self.scale * (torch.log(u) - torch.log1p(-u))

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        z = _as_tensor(x, "x") / self.scale
        return -z - 2 * torch.nn.functional.softplus(-z) - math.log(self.scale)

    def cdf(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(_as_tensor(x, "x") / self.scale)

    def log_cdf(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.logsigmoid(_as_tensor(x, "x") / self.scale)

    @property
    def mean(self) -> float:
        return 0.0

    @property
    def variance(self) -> float:
        return (math.pi * self.scale) ** 2 / 3

    def _standard_tails(self, d: int) -> tuple[float, float]:
        q = _TAIL / d
        return math.log(_TAIL) - math.log1p(-_TAIL), math.log1p(-q) - math.log(q)


# ---------------------------------------------------------------------------------------------
# bounded noise


class Uniform(Noise):
    """Uniform noise on ``[low, high]``: ``F(x) = clamp((x − low)/(high − low), 0, 1)``.

    Mean ``(low + high)/2``, variance ``(high − low)²/12``. Bounded support: with scores further
    apart than ``high − low`` the lower one can never win, so Perturb-Argmax probabilities hit
    0 and 1 and stop being identifiable there. Ties have probability zero.
    ``argmax_probs``/``expected_max`` integrate the piecewise-polynomial integrands exactly
    (Gauss–Legendre between the kinks ``θ_j + low``, ``θ_j + high``; exact up to rounding for
    ``d ≤ 64``), and the kinks move with θ so that the autograd gradient is exact as well.

    Args:
        low: left end of the support.
        high: right end, ``high > low``.

    Raises:
        ValueError: non-finite ``low``/``high`` or ``low >= high``.

    Example:
        >>> Uniform(0.0, 1.0).expected_max(torch.zeros(2))  # E[max of two U(0,1)] = 2/3
        tensor(0.6667)
    """

    bounded = True

    def __init__(self, low: float = -1.0, high: float = 1.0) -> None:
        self.low = _real(low, "low")
        self.high = _real(high, "high")
        if not self.low < self.high:
            raise ValueError(f"Uniform needs low < high, got low={self.low!r}, high={self.high!r}")

    def _params(self) -> dict[str, object]:
        return {"low": self.low, "high": self.high}

    @property
    def support(self) -> tuple[float, float]:
        return (self.low, self.high)

    def sample(self, shape: Sequence[int] | torch.Size | int, *,
               generator: torch.Generator | None = None,
               device: torch.device | str | None = None,
               dtype: torch.dtype | None = None) -> torch.Tensor:
        shape, device, dtype = _sample_args(shape, generator, device, dtype)
        u = torch.rand(shape, generator=generator, device=device, dtype=dtype)
        return self.low + (self.high - self.low) * u

    sample.__doc__ = Noise.sample.__doc__

    def icdf(self, u: torch.Tensor) -> torch.Tensor:
        return self.low + (self.high - self.low) * _check_unit(u)

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        x = _as_tensor(x, "x")
        inside = (x >= self.low) & (x <= self.high)
        value = torch.full_like(x, -math.log(self.high - self.low))
        return torch.where(inside, value, torch.full_like(x, -math.inf))

    def cdf(self, x: torch.Tensor) -> torch.Tensor:
        return ((_as_tensor(x, "x") - self.low) / (self.high - self.low)).clamp(0.0, 1.0)

    @property
    def mean(self) -> float:
        return 0.5 * (self.low + self.high)

    @property
    def variance(self) -> float:
        return (self.high - self.low) ** 2 / 12

    def _quadrature_order(self, d: int) -> int:
        # Between kinks the integrands are polynomials of degree ≤ d: exact with d//2 + 1 nodes.
        return min(d // 2 + 1, 32)


class Discrete(Noise):
    """Discrete noise: ``ε = values[k]`` with probability ``probs[k]``.

    Mean ``Σ p_k v_k``, variance ``Σ p_k v_k² − mean²``. ``log_prob`` is the log *mass*
    (``log p_k`` at a support point, ``-inf`` elsewhere), ``cdf`` a step function, ``icdf`` the
    generalised inverse ``min{v : F(v) ≥ u}``. Values with zero probability are dropped.

    Ties among perturbed scores have positive probability; ``argmax_probs`` splits a tie
    uniformly among the tied maximisers (perturbed scores closer than 8 units of roundoff of
    ``theta``'s dtype, relative to ``1 + max|θ| + max|v|``, count as tied: float32 scores
    ``0.1 + 0.2`` and ``0.2 + 0.1`` tie). It is computed exactly without enumerating the
    ``K^d`` outcomes: with ``u = θ_i + v_k``, ``a_j = P(θ_j + ε_j < u)`` and
    ``b_j = P(θ_j + ε_j = u)``,

    .. math::

        P(\\text{argmax} = i) = \\sum_k p_k \\int_0^1 \\prod_{j \\ne i} (a_j + b_j s)\\, ds,

    since ``E[s^T] = Π (a_j + b_j s)`` for ``T`` the number of ties and ``1/(1+T) = ∫ s^T ds``
    (the polynomial integral is done exactly by Gauss–Legendre). Cost ``O(d²K·m)`` with
    ``m = d//2 + 1`` when ties occur, ``O(d²K log K)`` otherwise. The argmax distribution is
    piecewise constant in θ: its gradient is zero almost everywhere (and it is returned with that
    zero gradient); ``expected_max`` is piecewise linear with gradient ``argmax_probs``.

    Args:
        values: the support points (distinct, finite), a sequence or 1-D tensor.
        probs: their probabilities (non-negative, summing to 1 within 1e-6; renormalised).
            ``None``: uniform.

    Raises:
        ValueError: empty, non-finite or repeated ``values``; ``probs`` of another length,
            negative, or not summing to 1.

    Example:
        >>> Discrete([-1.0, 1.0]).argmax_probs(torch.tensor([0.0, 0.0]))
        tensor([0.5000, 0.5000])
    """

    bounded = True
    continuous = False

    def __init__(self, values: Sequence[float] | torch.Tensor,
                 probs: Sequence[float] | torch.Tensor | None = None) -> None:
        v = self._as_vector(values, "values")
        if v.size == 0:
            raise ValueError("values must contain at least one support point, got none")
        if not np.all(np.isfinite(v)):
            raise ValueError(f"values must be finite, got {v.tolist()}")
        if np.unique(v).size != v.size:
            raise ValueError(f"values must be distinct, got {v.tolist()}")
        if probs is None:
            p = np.full(v.size, 1.0 / v.size)
        else:
            p = self._as_vector(probs, "probs")
            if p.size != v.size:
                raise ValueError(f"probs must have one entry per value: got {p.size} probs for "
                                 f"{v.size} values")
            if not np.all(np.isfinite(p)) or np.any(p < 0):
                raise ValueError(f"probs must be finite and non-negative, got {p.tolist()}")
            if abs(p.sum() - 1.0) > 1e-6:
                raise ValueError(f"probs must sum to 1, got sum {p.sum()!r}")
            p = p / p.sum()
        self.values = tuple(float(x) for x in v)
        self.probs = tuple(float(x) for x in p)
        keep = p > 0
        order = np.argsort(v[keep])
        self._v = v[keep][order]
        self._p = p[keep][order]
        self._cum = np.concatenate([[0.0], np.cumsum(self._p)])
        self._cum[-1] = 1.0

    @staticmethod
    def _as_vector(x: object, name: str) -> np.ndarray:
        if isinstance(x, torch.Tensor):
            x = x.detach().cpu().to(_F64).numpy()
        try:
            arr = np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a sequence of real numbers, got {x!r}") from None
        if arr.ndim != 1:
            raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
        return arr

    def _params(self) -> dict[str, object]:
        return {"values": self.values, "probs": self.probs}

    def _tensors(self, device: torch.device, dtype: torch.dtype = _F64
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sorted support, probabilities and cumulative sums ``[0, p_1, ..., 1]``."""
        return (torch.as_tensor(self._v, dtype=dtype, device=device),
                torch.as_tensor(self._p, dtype=dtype, device=device),
                torch.as_tensor(self._cum, dtype=dtype, device=device))

    @property
    def support(self) -> tuple[float, float]:
        return (float(self._v[0]), float(self._v[-1]))

    def sample(self, shape: Sequence[int] | torch.Size | int, *,
               generator: torch.Generator | None = None,
               device: torch.device | str | None = None,
               dtype: torch.dtype | None = None) -> torch.Tensor:
        shape, device, dtype = _sample_args(shape, generator, device, dtype)
        u = torch.rand(shape, generator=generator, device=device, dtype=_F64)
        v, _, cum = self._tensors(u.device)
        # u in [C_{k-1}, C_k) -> v_k: P(v_k) = p_k exactly.
        k = torch.searchsorted(cum[1:-1].contiguous(), u, right=True)
        return v[k].to(dtype)

    sample.__doc__ = Noise.sample.__doc__

    def icdf(self, u: torch.Tensor) -> torch.Tensor:
        u = _check_unit(u)
        v, _, cum = self._tensors(u.device)
        k = torch.searchsorted(cum[1:-1].contiguous(), u.to(_F64), right=False)
        return v[k].to(u.dtype)

    def cdf(self, x: torch.Tensor) -> torch.Tensor:
        x = _as_tensor(x, "x")
        v, _, cum = self._tensors(x.device)
        return cum[torch.searchsorted(v, x.to(_F64).detach(), right=True)].to(x.dtype)

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """Log probability *mass*: ``log p_k`` where ``x == values[k]``, ``-inf`` elsewhere."""
        x = _as_tensor(x, "x")
        v, p, _ = self._tensors(x.device)
        hit = x.to(_F64).detach().unsqueeze(-1) == v
        mass = (hit * p).sum(-1)
        return torch.log(mass).to(x.dtype)

    @property
    def mean(self) -> float:
        return float(np.dot(self._p, self._v))

    @property
    def variance(self) -> float:
        return float(np.dot(self._p, (self._v - self.mean) ** 2))

    def _win_weights(self, theta: torch.Tensor) -> torch.Tensor:
        """``W[..., i, k] = p_k · P(i wins, ties split | ε_i = v_k)``, shape ``(*batch, d, K)``.

        No gradient; see the class docstring for the formula.
        """
        v, p, cum = self._tensors(theta.device)
        return _win_weights(theta, v, p, cum, float(np.abs(self._v).max()))

    def _argmax_probs(self, theta: torch.Tensor) -> torch.Tensor:
        probs = self._win_weights(theta).sum(-1).to(theta.dtype)
        return _zero_grad_like(probs, theta)

    def _expected_max(self, theta: torch.Tensor) -> torch.Tensor:
        w = self._win_weights(theta)
        v = torch.as_tensor(self._v, dtype=_F64, device=theta.device)
        values = theta.to(_F64).unsqueeze(-1) + v
        return (w * values).sum((-2, -1)).to(theta.dtype)
