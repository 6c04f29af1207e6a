"""Uniform noise on an interval: the bounded case, where Perturb-Argmax saturates."""
from __future__ import annotations

import math
from typing import Sequence

import torch

from ._args import _as_tensor, _check_unit, _real, _sample_args
from .base import Noise, QuadratureLayout

__all__ = ["Uniform"]


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
    continuous = True
    has_log_prob = True
    has_cdf = True
    has_icdf = True
    has_sample = True
    has_variance = True
    has_closed_form = False
    has_argmax_probs = True

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

    def log_cdf(self, x: torch.Tensor) -> torch.Tensor:
        return _log_fraction(_as_tensor(x, "x") - self.low, self.high - self.low)

    def log_sf(self, x: torch.Tensor) -> torch.Tensor:
        """``log((high − x)/(high − low))`` on the support, directly (no ``1 − F``: exact
        where F is close to 1), 0 below it and −inf above."""
        return _log_fraction(self.high - _as_tensor(x, "x"), self.high - self.low)

    @property
    def mean(self) -> float:
        return 0.5 * (self.low + self.high)

    @property
    def variance(self) -> float:
        return (self.high - self.low) ** 2 / 12

    def quadrature_layout(self, d: int) -> QuadratureLayout:
        """The support, one panel per piece between kinks, ``min(d//2 + 1, 32)`` nodes each."""
        # Between kinks the integrands are polynomials of degree ≤ d: exact with d//2 + 1 nodes.
        return QuadratureLayout(self.low, self.high, math.inf, min(d // 2 + 1, 32))


def _log_fraction(v: torch.Tensor, width: float) -> torch.Tensor:
    """``log clamp(v/width, 0, 1)``: −inf where ``v <= 0`` with a zero gradient there (the log
    is taken of a value masked to 1), 0 where ``v >= width``."""
    r = (v / width).clamp(max=1.0)
    pos = r > 0
    return torch.where(pos, torch.log(torch.where(pos, r, torch.ones_like(r))), -math.inf)
