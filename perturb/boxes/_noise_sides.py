r"""Closed forms of the expected side of one perturbed box (private engine of
:mod:`perturb.boxes.expected_volumes`).

One box ``[l, u]`` with corners ``L = l + ε``, ``U = u − ε'`` (``ε, ε'`` independent draws of
the noise) has the side ``U − L = g − S``, ``g = u − l`` and ``S = ε + ε'``, so its expected
side is :math:`E[(g − S)_+] = \int_{-∞}^g F_S(y)\,dy`. For two noises this is elementary:

- **Normal(σ)**: ``S ~ N(0, 2σ²)``; with ``s = σ√2`` and ``z = g/s``,
  :math:`E = s\,h(z)`, :math:`h(z) = zΦ(z) + φ(z)`. For ``z ≥ 0`` both terms are positive;
  for ``z = −t < 0``, :math:`h = φ(t)\,(1 − t R(t))` with the Mills ratio
  :math:`R(t) = Φ(−t)/φ(t) = \sqrt{π/2}\,\mathrm{erfcx}(t/\sqrt2)` for ``t < 4`` (the
  subtraction loses at most a factor 20 there), and beyond from the continued fraction
  :math:`R = 1/(t + c)`, :math:`c = 1/(t + 2/(t + 3/(t + …)))`, which gives
  :math:`1 − tR = c/(t + c)` without a subtraction (40 terms: below 1e−16 relative for
  ``t ≥ 4``; tests/boxes/test__noise_sides.py checks it against mpmath).
- **Logistic(s)**: ``S`` is the sum of two logistics, with CDF
  :math:`F_S(y) = e^y (e^y − 1 − y)/(e^y − 1)^2` (scale 1), whose integral is
  :math:`G(y) = y/(1 − e^{−y})`: :math:`E = s\,G(g/s)`. In log space
  :math:`\log G = \log|y| − \log(−\mathrm{expm1}(−|y|)) + \min(y, 0)`, and
  :math:`\log G ≈ y/2 − y^2/24` for ``|y| < 1e−5`` (the removable singularity at 0).

Both are the exact values (to rounding) where the quadrature of the module above is exact to
its tolerance, and their gradients are autograd through a handful of elementwise ops.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from perturb.boxes._bessel import _any
from perturb.noise import Logistic, Noise, Normal

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_SQRT_HALF_PI = math.sqrt(math.pi / 2.0)
# Mills-ratio regimes of the Normal side: erfcx below, the continued fraction from here on
_CF_FROM = 4.0
_CF_TERMS = 40
_LOGISTIC_SERIES = 1e-5


def _log_h_normal(z: torch.Tensor) -> torch.Tensor:
    """``log(zΦ(z) + φ(z))`` elementwise (float64; the regimes of the module docstring)."""
    t = -z
    pos = z >= 0
    zp = torch.where(pos, z, torch.zeros_like(z))
    direct = torch.log(zp * torch.special.ndtr(zp) + torch.exp(-0.5 * zp * zp - _LOG_SQRT_2PI))
    mid = ~pos & (t < _CF_FROM)
    tm = torch.where(mid, t, torch.ones_like(t))
    log_phi = -0.5 * tm * tm - _LOG_SQRT_2PI
    mills = log_phi + torch.log1p(-tm * _SQRT_HALF_PI * torch.special.erfcx(tm / math.sqrt(2.0)))
    out = torch.where(pos, direct, mills)
    far = ~pos & ~mid
    if _any(far.any()):
        tf = torch.where(far, t, torch.full_like(t, _CF_FROM))
        c = torch.zeros_like(tf)
        for k in range(_CF_TERMS, 1, -1):
            c = k / (tf + c)
        c = 1.0 / (tf + c)
        cf = -0.5 * tf * tf - _LOG_SQRT_2PI + torch.log(c) - torch.log(tf + c)
        out = torch.where(far, cf, out)
    return out


def _log_g_logistic(y: torch.Tensor) -> torch.Tensor:
    """``log(y / (1 − e^{−y}))`` elementwise (float64), finite at every finite ``y``."""
    small = y.abs() < _LOGISTIC_SERIES
    ys = torch.where(small, torch.ones_like(y), y)
    a = ys.abs()
    general = torch.log(a) - torch.log(-torch.expm1(-a)) + ys.clamp(max=0.0)
    return torch.where(small, y / 2 - y * y / 24, general)


def _normal_log_side(gap: torch.Tensor, scale: float) -> torch.Tensor:
    s = scale * math.sqrt(2.0)
    return math.log(s) + _log_h_normal(gap / s)


def _logistic_log_side(gap: torch.Tensor, scale: float) -> torch.Tensor:
    return math.log(scale) + _log_g_logistic(gap / scale)


def side_closed_form(noise: Noise) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``gap ↦ log E[(U − L)_+]`` for one box of hard side ``gap = u − l`` (float64, any shape)
    under ``noise``, where a closed form exists (Normal, Logistic: exactly those classes, a
    subclass may change the law); None otherwise."""
    if type(noise) is Normal:
        return lambda gap: _normal_log_side(gap, float(noise.scale))
    if type(noise) is Logistic:
        return lambda gap: _logistic_log_side(gap, float(noise.scale))
    return None
