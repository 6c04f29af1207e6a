r"""Closed forms of the expected sides of boxes whose corners are perturbed by
:class:`~perturb.noise.NegativeExponential` noise (private engine of
:mod:`perturb.boxes.expected_volumes`).

With ``F(z) = min(1, e^{z/s})``, one coordinate of the intersection of the boxes ``j = 1..m``
has the integrand :math:`g = e^{h}`,

.. math::

    h(x) = \sum_j \min\bigl(0, \tfrac{x − l_j}{s}\bigr) + \sum_j \min\bigl(0, \tfrac{u_j − x}{s}\bigr),

a concave piecewise-linear exponent with kinks at the ``2m`` corners. Between consecutive
kinks ``p < q`` (``Δ = q − p``) its slope is ``k/s`` with the integer
``k = #{l_j > x} − #{u_j < x}``, so

.. math::

    \int_p^q e^{h} = e^{\max(h(p), h(q))}\,Δ\,φ(|k|Δ/s), \qquad φ(t) = \frac{1 − e^{−t}}{t},

and the two tails (slopes ``±m/s``) give :math:`s\,e^{h(p_1)}/m` and :math:`s\,e^{h(p_{2m})}/m`.
The log side is the log-sum-exp of these ``2m + 1`` non-negative terms: exact, in log space
(nothing over- or underflows for corners ±1e4 apart), and differentiable by autograd (the
formula is the integral itself as a function of the corners while their order is fixed; ``h``
is continuous, so the order changing is harmless).

The lost side of a nearly nested pair, :math:`δ = \int g_b (1 − h_a)` with
:math:`h_a = e^{η}`, :math:`η(x) = \min(0, (x − l_a)/s) + \min(0, (u_a − x)/s) ≤ 0`
(:func:`log_lost_side`, for ``log(1 − P)``), uses the kinks of both boxes. On a piece, going
from the end ``e`` where η is largest (so η has slope ``−c/s``, ``c ≥ 0``, and ``η(e) = η₀``)
with ``g_b`` of slope ``k/s`` there (units of ``s``, ``t`` the distance from ``e``):

.. math::

    \int_0^Δ e^{h_b(e) + kt}\,(1 − e^{η_0 − ct})\,dt
      = e^{h_b(e)}\Bigl[(−\mathrm{expm1}\,η_0)\,E_{k−c} + (E_k − E_{k−c})\Bigr],
    \qquad E_κ = \int_0^Δ e^{κt}\,dt,

two non-negative terms (no cancellation where ``h_a`` is close to 1, deep inside a). The
difference :math:`E_k − E_{k−c} = \int_0^Δ e^{(k−c)t}\,\mathrm{expm1}(ct)\,dt` is taken from the
closed forms where ``cΔ ≥ 1`` (they differ by a factor ``≥ 1 + (1 − e^{−1})``), and by a
12-point Gauss–Legendre rule of its smooth positive integrand below (exact to rounding: the
exponents stay below 3 on the piece); on the tails it is ``c/(k(k − c))``.
"""
from __future__ import annotations

import math

import torch

from perturb._math import log1mexp
from perturb.noise.exponential import NegativeExponential
from perturb.noise._quadrature import gl_pieces

_DIFF_GL_ORDER = 12


def _safe_log(v: torch.Tensor) -> torch.Tensor:
    """``log v`` for ``v >= 0``: −inf where ``v == 0``, with a zero gradient there."""
    pos = v > 0
    return torch.where(pos, torch.log(torch.where(pos, v, torch.ones_like(v))), -math.inf)


def _log_phi(t: torch.Tensor) -> torch.Tensor:
    """``log((1 − e^{−t})/t)`` for ``t >= 0`` (0 at ``t = 0``, its limit)."""
    pos = t > 0
    ts = torch.where(pos, t, torch.ones_like(t))
    return torch.where(pos, torch.log(-torch.expm1(-ts)) - torch.log(ts), 0.0)


def _log_e(k: torch.Tensor, width: torch.Tensor) -> torch.Tensor:
    """``log ∫_0^Δ e^{kt} dt`` for finite ``Δ >= 0`` (−inf at ``Δ = 0``)."""
    return k.clamp(min=0) * width + _safe_log(width) + _log_phi(k.abs() * width)


def _h(x: torch.Tensor, lo: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``Σ_j min(0, x − l_j) + Σ_j min(0, u_j − x)`` (units of s) at ``x`` ``(*batch, d, K)``
    for corners ``(m, *batch, d)``."""
    xs = x.unsqueeze(0)
    return ((xs - lo.unsqueeze(-1)).clamp(max=0).sum(0)
            + (up.unsqueeze(-1) - xs).clamp(max=0).sum(0))


def _slope(x: torch.Tensor, lo: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The integer slope of :func:`_h` at ``x`` (away from the kinks), as a float tensor."""
    xs = x.unsqueeze(0)
    return ((lo.unsqueeze(-1) > xs).sum(0) - (up.unsqueeze(-1) < xs).sum(0)).to(x.dtype)


def _kinks(lo: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The sorted corners ``(*batch, d, 2m)`` of corners ``(m, *batch, d)``."""
    return torch.sort(torch.cat([lo, up]).movedim(0, -1), -1).values


def log_sides(lo: torch.Tensor, up: torch.Tensor, noise: NegativeExponential) -> torch.Tensor:
    """log E[(min_j U_j − max_j L_j)_+] ``(*batch, d)`` for finite corners ``(m, *batch, d)``
    (float64; the module docstring)."""
    s = float(noise.scale)
    lo, up = lo / s, up / s
    m = lo.shape[0]
    p = _kinks(lo, up)
    hp = _h(p, lo, up)
    a, b = p[..., :-1], p[..., 1:]
    k = _slope((a + b) / 2, lo, up)
    middle = torch.maximum(hp[..., :-1], hp[..., 1:]) + _log_e(-k.abs(), b - a)
    tails = hp[..., [0, -1]] - math.log(m)
    return torch.logsumexp(torch.cat([tails, middle], -1), -1) + math.log(s)


def _log_diff(k: torch.Tensor, c: torch.Tensor, width: torch.Tensor) -> torch.Tensor:
    """``log(E_k − E_{k−c})`` on ``[0, Δ]`` for ``c >= 0`` (−inf where ``c = 0`` or ``Δ = 0``);
    ``Δ = inf`` (tails, ``k < 0``): ``log(c/(k(k − c)))``."""
    tail = torch.isinf(width)
    kc = k - c
    at_tail = _safe_log(c) - _safe_log(k * kc)
    finite_w = torch.where(tail, torch.zeros_like(width), width)
    wide = c * finite_w >= 1
    # closed forms: log E_k + log(1 − E_{k−c}/E_k), the ratio at most 1/(1 + (1 − e^{-1}))
    log_ek, log_ekc = _log_e(k, finite_w), _log_e(kc, finite_w)
    ratio = torch.where(wide, log_ekc - log_ek, torch.full_like(k, -1.0))
    closed = log_ek + log1mexp(ratio)
    # Gauss–Legendre of e^{(k−c)t} expm1(ct) on [0, Δ] for narrow pieces
    narrow_w = torch.where(wide, torch.zeros_like(finite_w), finite_w)
    edges = torch.stack([torch.zeros_like(narrow_w), narrow_w], -1)
    t, w = gl_pieces(edges, _DIFF_GL_ORDER)
    vals = (w * torch.exp(kc.unsqueeze(-1) * t) * torch.expm1(c.unsqueeze(-1) * t)).sum(-1)
    out = torch.where(wide, closed, _safe_log(vals))
    return torch.where(tail, at_tail, out)


def log_lost_side(lo_a: torch.Tensor, up_a: torch.Tensor, lo_b: torch.Tensor,
                  up_b: torch.Tensor, noise: NegativeExponential) -> torch.Tensor:
    """log δ, :math:`δ = \\int g_b(x)(1 − h_a(x))\\,dx` ``(*batch, d)``: the part of b's side
    that a ∩ b loses, for finite corners ``(*batch, d)`` (float64; module docstring)."""
    s = float(noise.scale)
    la, ua, lb, ub = (v.unsqueeze(0) / s for v in (lo_a, up_a, lo_b, up_b))
    p = _kinks(torch.cat([la, lb]), torch.cat([ua, ub]))
    inf = torch.full_like(p[..., :1], math.inf)
    # pieces: the left tail (−inf, p1], the middles, the right tail [p4, inf)
    a = torch.cat([-inf, p], -1)
    b = torch.cat([p, inf], -1)
    width = b - a
    mid = torch.where(torch.isinf(a), b - 1, torch.where(torch.isinf(b), a + 1, (a + b) / 2))
    ka, kb = _slope(mid, la, ua), _slope(mid, lb, ub)
    # start at the end where η is largest: the right end where η rises (ka > 0)
    from_right = ka > 0
    # tails: η rises towards the left tail's finite end (ka = 1) and falls from the right
    # tail's (ka = −1), so e is always a finite end
    e = torch.where(from_right, b, a)
    sign = torch.where(from_right, -1.0, 1.0)
    k, c = sign * kb, -(sign * ka)
    eta0 = _h(e, la, ua)
    log_a = _safe_log(-torch.expm1(eta0)) + torch.where(
        torch.isinf(width), -_safe_log(c - k), _log_e(k - c, torch.where(
            torch.isinf(width), torch.zeros_like(width), width)))
    log_b = _log_diff(k, c, width)
    pieces = _h(e, lb, ub) + torch.logaddexp(log_a, torch.where(
        torch.isneginf(log_a) & torch.isneginf(log_b), 0.0, log_b))
    pieces = torch.where(torch.isneginf(log_a) & torch.isneginf(log_b), -math.inf, pieces)
    empty = torch.isneginf(pieces).all(-1, keepdim=True)
    safe = torch.where(empty, torch.zeros_like(pieces), pieces)
    out = torch.where(empty.squeeze(-1), -math.inf, torch.logsumexp(safe, -1))
    return out + math.log(s)
