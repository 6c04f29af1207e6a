r"""Expected sides of boxes whose corners are perturbed by noise of bounded support (private
engine of :mod:`perturb.boxes.expected_volumes`).

For noise on ``[a, b]`` (:class:`~perturb.noise.Uniform`, or a user noise with ``bounded =
True``), ``F(z) = 0`` below ``a`` and ``1`` above ``b``, so the integrand of one coordinate of
the intersection of the boxes ``j = 1..m``,

.. math::

    g(x) = \prod_j F(x − l_j) \prod_j F(u_j − x), \qquad E[\text{side}] = \int g(x)\,dx,

vanishes outside :math:`(\max_j l_j + a,\ \min_j u_j − a)` (the side is exactly 0 when that
range is empty) and has kinks only at :math:`l_j + o` and :math:`u_j − o` for the offsets
``o`` in ``{a, b}`` and the noise's ``breakpoints``. Between two consecutive kinks every factor
is either constant (0 or 1) or the CDF on the inside of its support, so Gauss–Legendre on each
piece, with ``quadrature_layout(2m).order`` nodes, integrates it: for Uniform noise each factor
is linear there and ``g`` a polynomial of degree at most ``2m``, integrated exactly (to
rounding) by ``m + 1`` nodes. For a user noise the accuracy is that of its order on a density
smooth between the kinks.

Gradients are autograd through the rule: the nodes and weights move with the kinks, and on a
polynomial piece the rule *is* the exact integral as a function of the corners, so its
derivative is exact too (``g`` is continuous, so the boundary terms of neighbouring pieces
cancel). Empty sides give ``log 0 = −inf`` with zero gradients: every log below is taken of a
value masked to 1 where it is 0, so no ``0 · inf`` reaches the backward.

The lost side of a nearly nested pair, :math:`δ = \int g_b(x)\,(1 − h_a(x))\,dx` with
:math:`h_a = F(x − l_a)\,F(u_a − x)` (:func:`log_lost_side`, for ``log(1 − P)``), is the same
kind of integral on the kinks of both boxes, with :math:`1 − h_a = S(x − l_a) + F(x − l_a)\,
S(u_a − x)` from the survival function (a sum of non-negative terms: no cancellation where
``h_a`` is close to 1).
"""
from __future__ import annotations

import math

import torch

from perturb.noise import Noise, Uniform
from perturb.noise._quadrature import gl_pieces


def is_bounded_noise(noise: Noise) -> bool:
    """Whether ``noise``'s support is a bounded interval (the sides of this module)."""
    low, high = noise.support
    return bool(noise.bounded) and math.isfinite(float(low)) and math.isfinite(float(high))


def _offsets(noise: Noise) -> list[float]:
    """The kink offsets of one factor: the ends of the support and the breakpoints."""
    low, high = noise.support
    return sorted({float(low), float(high), *(float(p) for p in noise.breakpoints)})


def _cdf(noise: Noise, z: torch.Tensor, survival: bool = False) -> torch.Tensor:
    """``F(z)`` (or ``S(z) = 1 − F(z)`` from ``log_sf``, accurate where F is close to 1),
    exactly 0 or 1 outside the support; the noise is only called inside it (elsewhere on the
    support's midpoint), so its formulas never see, and never differentiate, an outside value."""
    low, high = (float(e) for e in noise.support)
    if type(noise) is Uniform:      # linear on the support: exact and safe as it stands
        return ((high - z) if survival else (z - low)).div_(high - low).clamp_(0.0, 1.0)
    inside = (z > low) & (z < high)
    zs = torch.where(inside, z, torch.full_like(z, 0.5 * (low + high)))
    value = torch.exp(noise.log_sf(zs)) if survival else noise.cdf(zs)
    outside = (z <= low) if survival else (z >= high)
    return torch.where(inside, value, outside.to(z.dtype))


def _pieces(kinks: torch.Tensor, left: torch.Tensor, right: torch.Tensor, order: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes and weights ``(*batch, d, K)`` of ``order``-point rules on the pieces between the
    sorted ``kinks`` ``(*batch, d, E)`` clipped to ``[left, right]`` (an empty range, ``left >=
    right``, gives pieces of zero width)."""
    left = torch.minimum(left, right).unsqueeze(-1)
    edges = torch.cat([kinks, left, right.unsqueeze(-1)], -1)
    edges = torch.maximum(torch.minimum(edges, right.unsqueeze(-1)), left)
    return gl_pieces(torch.sort(edges, -1).values, order)


def _kinks(lo: torch.Tensor, up: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``l_j + o`` and ``u_j − o`` ``(*batch, d, 2·m·|o|)`` for corners ``(m, *batch, d)``."""
    k_lo = (lo.unsqueeze(-1) + offsets).movedim(0, -2).flatten(-2)
    k_up = (up.unsqueeze(-1) - offsets).movedim(0, -2).flatten(-2)
    return torch.cat([k_lo, k_up], -1)


def _factors(lo: torch.Tensor, up: torch.Tensor, noise: Noise, x: torch.Tensor
             ) -> torch.Tensor:
    """``F(x − l_j)`` and ``F(u_j − x)`` ``(2m, *batch, d, K)`` at the nodes ``x``."""
    return _cdf(noise, torch.cat([x.unsqueeze(0) - lo.unsqueeze(-1),
                                  up.unsqueeze(-1) - x.unsqueeze(0)]))


def _log_rule(factors: torch.Tensor, w: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``log Σ_k w_k Π_i factors_ik`` over the nodes ``keep`` (last dim), where every factor
    and weight is positive; the other nodes add nothing, and a side without any is ``−inf``.
    Logs are taken of values clamped to the smallest normal float (a clamped value passes no
    gradient: no ``0·inf`` in the backward), then the dropped nodes are masked."""
    tiny = torch.finfo(factors.dtype).tiny
    logs = torch.log(factors.clamp_min(tiny)).sum(0) + torch.log(w.clamp_min(tiny))
    some = keep.any(-1, keepdim=True)
    terms = torch.where(keep, logs, torch.where(some, -math.inf, 0.0))
    return torch.where(some.squeeze(-1), torch.logsumexp(terms, -1), -math.inf)


def log_sides(lo: torch.Tensor, up: torch.Tensor, noise: Noise) -> torch.Tensor:
    """log E[(min_j U_j − max_j L_j)_+] ``(*batch, d)`` for finite corners ``(m, *batch, d)``
    (float64) and noise of bounded support (module docstring); ``−inf`` for empty sides."""
    low = float(noise.support[0])
    m = lo.shape[0]
    offsets = torch.tensor(_offsets(noise), dtype=lo.dtype, device=lo.device)
    left, right = lo.amax(0) + low, up.amin(0) - low
    x, w = _pieces(_kinks(lo, up, offsets), left, right, int(noise.quadrature_layout(2 * m).order))
    # the nodes of pieces of positive width lie inside (max_j l_j + a, min_j u_j − a), where
    # every factor is positive
    return _log_rule(_factors(lo, up, noise, x), w, w > 0)


def log_lost_side(lo_a: torch.Tensor, up_a: torch.Tensor, lo_b: torch.Tensor,
                  up_b: torch.Tensor, noise: Noise) -> torch.Tensor:
    """log δ, :math:`δ = \\int g_b(x)(1 − h_a(x))\\,dx` ``(*batch, d)``: the part of b's side
    that a ∩ b loses, for finite corners ``(*batch, d)`` (float64; module docstring)."""
    low = float(noise.support[0])
    offsets = torch.tensor(_offsets(noise), dtype=lo_a.dtype, device=lo_a.device)
    kinks = _kinks(torch.stack([lo_a, lo_b]), torch.stack([up_a, up_b]), offsets)
    x, w = _pieces(kinks, lo_b + low, up_b - low, int(noise.quadrature_layout(4).order))
    below, above = x - lo_a.unsqueeze(-1), up_a.unsqueeze(-1) - x
    # 1 − F(x − l_a) F(u_a − x) = S(x − l_a) + F(x − l_a) S(u_a − x), every term >= 0
    lost = _cdf(noise, below, True) + _cdf(noise, below) * _cdf(noise, above, True)
    factors = torch.cat([_factors(lo_b.unsqueeze(0), up_b.unsqueeze(0), noise, x),
                         lost.unsqueeze(0)])
    return _log_rule(factors, w, (w > 0) & (lost > 0))
