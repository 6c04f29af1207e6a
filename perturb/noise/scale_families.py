"""The location-0 scale families ``ε = scale · ε₀``: Gumbel, Normal (alias Gaussian), Logistic.

Each gives its quantile transform, (log) density, (log) CDF, moments, and the quadrature grid
matched to its shape (:meth:`~perturb.noise.Noise.quadrature_layout`); Gumbel adds the closed
forms of max-stability. The functionals are defined in :mod:`perturb.noise.base`.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from .._math import EULER_GAMMA, log1mexp
from .._validation import check_positive, reads_stall, unreadable
from ._args import _as_tensor, _check_unit, _default_device, _open_uniform, _real, _sample_args
from ._quadrature import _F64, _TAIL
from .base import Noise, QuadratureLayout

__all__ = ["Gumbel", "Normal", "Gaussian", "Logistic"]

_SQRT2 = math.sqrt(2.0)
_LOG2 = math.log(2.0)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
# erfc(t) of Normal._log_cdf_ is used up to t = 30/√2 (z = −30σ, erfc ~ 1e−197, far from
# underflow); log_ndtr beyond
_ERFC_DEEP = 30.0 / _SQRT2


class _ScaleNoise(Noise):
    """Shared parts of the one-parameter families ``ε = scale · ε₀``."""

    # Standardised panel width and Gauss–Legendre order of the quadrature grid (see
    # ``quadrature_layout``); chosen from measured errors (docs/noise.md).
    _panel_width = 3.0
    _order = 20

    has_log_prob = True
    has_cdf = True
    has_icdf = True
    has_sample = True
    has_variance = True
    has_closed_form = False
    has_argmax_probs = True

    def __init__(self, scale: float = 1.0, *extra: object, loc: float = 0.0) -> None:
        name = type(self).__name__
        if extra:  # torch.distributions.Normal(loc, scale) habits: say what this one takes
            raise TypeError(f"{name}() takes one positional argument, scale, got "
                            f"{1 + len(extra)}: a perturbation noise has location 0 (the scores "
                            f"θ are the location), so write {name}(scale=...) and put a "
                            f"location into θ")
        if isinstance(loc, bool) or not isinstance(loc, (int, float)) or loc != 0:
            raise ValueError(f"loc must be 0 for {name} (a perturbation noise has location 0; "
                             f"shift the scores θ instead), got {loc!r}")
        check_positive(scale if not isinstance(scale, torch.Tensor) else scale.detach(), "scale")
        self.scale = _real(scale, "scale")

    def _params(self) -> dict[str, object]:
        return {"scale": self.scale}

    def _standard_tails(self, d: int) -> tuple[float, float]:
        """Standardised quantiles at lower mass ``_TAIL`` and upper mass ``_TAIL / d``."""
        raise NotImplementedError

    def quadrature_layout(self, d: int) -> QuadratureLayout:
        """Standardised tails times ``scale``, panels of ``_panel_width`` scale units."""
        lo, hi = self._standard_tails(d)
        return QuadratureLayout(self.scale * lo, self.scale * hi, self.scale * self._panel_width,
                                self._order)

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

    has_closed_form = True

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
        if unreadable(u):
            return u.log_().neg_()        # under vmap: xlogy's out= variant has no batch rule
        return torch.xlogy(-1, u, out=u)  # -log U in one op

    def _log_exponential(self, shape: torch.Size, generator: torch.Generator | None,
                         device: torch.device | str | None, dtype: torch.dtype) -> torch.Tensor:
        """``β·log E`` with ``E ~ Exp(1)``: minus a Gumbel(0, β) draw; arguments unchecked.

        :meth:`sample` negates it in place, and :func:`perturb.perturb` computes
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

    def log_sf(self, x: torch.Tensor) -> torch.Tensor:
        # log(1 − exp(−e^{−z})); above z = 30, log t − t/2 with t = e^{−z} (the next term,
        # t²/24, is below 1e-27), so log S ≈ −z stays finite where e^{−z} underflows.
        # Each branch sees clamped inputs, so neither overflows into the other's gradient.
        z = _as_tensor(x, "x") / self.scale
        hi = z.clamp(min=30.0)
        return torch.where(z > 30.0, -hi - 0.5 * torch.exp(-hi),
                           log1mexp(-torch.exp(-z.clamp(max=30.0))))

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

    def log_sf(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.log_ndtr(-_as_tensor(x, "x") / self.scale)     # symmetric

    def _log_cdf_(self, z: torch.Tensor) -> torch.Tensor:
        # log(erfc(−z/(σ√2))/2), in place: half the cost of log_ndtr on the CPU (erfc is
        # vectorised, log_ndtr's erfcx branch is not) and within 1e-15 absolute of it (erfc
        # is accurate to a few ulp relative); below −30σ (erfc near underflow) log_ndtr on
        # those elements only. Where reads stall (CUDA) log_ndtr throughout: no host read;
        # under autograd too (erfc_ and clamp_ in place would lose the inputs it needs).
        if reads_stall(z) or z.requires_grad:
            return torch.special.log_ndtr(z.div_(self.scale))
        t = z.mul_(-1.0 / (self.scale * _SQRT2))
        if not (t.numel() and float(t.max()) > _ERFC_DEEP):
            return t.erfc_().log_().sub_(_LOG2)
        deep = t > _ERFC_DEEP
        far = torch.special.log_ndtr(t[deep].mul_(-_SQRT2))
        out = t.clamp_(max=_ERFC_DEEP).erfc_().log_().sub_(_LOG2)
        out[deep] = far
        return out

    def _log_hazard_(self, z: torch.Tensor, log_cdf: torch.Tensor) -> torch.Tensor:
        # log φ(z/σ) − log σ − log F = −(log F + z²/(2σ²) + log σ√(2π)), in place on the
        # fresh z (three passes)
        return torch.addcmul(log_cdf, z, z, value=0.5 / self.scale ** 2, out=z).add_(
            math.log(self.scale) + _LOG_SQRT_2PI).neg_()

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

    def quadrature_layout(self, d: int) -> QuadratureLayout:
        """Panels of ``2.5/sqrt(1 + ½ log d)`` scale units, order 16."""
        # The max of d standard normals concentrates at width ~ 1/sqrt(2 log d): narrower panels.
        lo, hi = self._standard_tails(d)
        width = 2.5 / math.sqrt(1.0 + 0.5 * math.log(d))
        return QuadratureLayout(self.scale * lo, self.scale * hi, self.scale * width, self._order)


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
        # the density is symmetric: log f = −|z| − 2 log1p(e^{−|z|}) is exact in both tails
        # (softplus(−z) returns −z unchanged below z = −20 and drops e^{z})
        a = (_as_tensor(x, "x") / self.scale).abs()
        return -a - 2 * torch.log1p(torch.exp(-a)) - math.log(self.scale)

    def cdf(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(_as_tensor(x, "x") / self.scale)

    def log_cdf(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.logsigmoid(_as_tensor(x, "x") / self.scale)

    def log_sf(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.logsigmoid(-_as_tensor(x, "x") / self.scale)   # symmetric

    def _log_cdf_(self, z: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.logsigmoid(z.div_(self.scale))      # standardised in place

    def _log_hazard_(self, z: torch.Tensor, log_cdf: torch.Tensor) -> torch.Tensor:
        # f/F = (1 − F)/s: log_sf, exact in both tails (log_prob's softplus drops e^z below
        # z = −20: 4e−9 relative there)
        return torch.nn.functional.logsigmoid(z.div_(-self.scale)).sub_(math.log(self.scale))

    @property
    def mean(self) -> float:
        return 0.0

    @property
    def variance(self) -> float:
        return (math.pi * self.scale) ** 2 / 3

    def _standard_tails(self, d: int) -> tuple[float, float]:
        q = _TAIL / d
        return math.log(_TAIL) - math.log1p(-_TAIL), math.log1p(-q) - math.log(q)
