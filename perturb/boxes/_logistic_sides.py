r"""Closed form of the expected side of the intersection of two Logistic-perturbed boxes
(private engine of :mod:`perturb.boxes.expected_volumes`).

Per coordinate, with Logistic(s) noise, lowers ``l_1, l_2`` and uppers ``u_1, u_2`` in units of
``s`` (``a_i = l_i/s`` sorted, ``b_j = u_j/s`` sorted), the expected side is
:math:`s\,I`, :math:`I = \int σ(x − a_1)σ(x − a_2)σ(b_1 − x)σ(b_2 − x)\,dx`. Partial fractions
(:math:`σ(x − a_1)σ(x − a_2) = [σ(x − a_2) − e^{a_1 − a_2}σ(x − a_1)]/(1 − e^{a_1 − a_2})`, the
mirror for the uppers) and the one-box integral :math:`\int σ(x − a)σ(b − x)\,dx = G(b − a)`,
:math:`G(y) = y/(1 − e^{−y}) = e^y q(y)`, :math:`q(y) = y/(e^y − 1)`, give

.. math::

    I = \frac{q(c) − q(c + ε) − q(c + δ) + q(c + δ + ε)}
             {(e^{a_2} − e^{a_1})(e^{−b_1} − e^{−b_2})}
      = \frac{e^{c}\,Δ^2 q}{(1 − e^{−δ})(1 − e^{−ε})},

:math:`δ = a_2 − a_1`, :math:`ε = b_2 − b_1`, :math:`c = b_1 − a_2` (the hard side, in units of
``s``), :math:`Δ^2 q` the mixed second difference of ``q`` on :math:`[c, c+δ] × [c, c+ε]`.
Equivalently :math:`I = E[K(b − a)]` with ``a`` on :math:`[a_1, a_2]` of density ∝ :math:`e^a`,
``b`` on :math:`[b_1, b_2]` of density ∝ :math:`e^{−b}`, and
:math:`K(y) = e^y q''(y) = [(y − 2) + (y + 2)e^{−y}]/(1 − e^{−y})^3` the side of two identical
boxes (:math:`K(−y) = e^{−2y}K(y)`, :math:`K ≈ y − 2` for large ``y``).

Regimes (threshold ``T = 0.5`` on δ and ε), all in log space:

- **δ, ε ≥ T**: the first formula, whose cancellation is bounded (at most about
  :math:`24/T^2 ≈ 100` in the worst case, c near 0). ``q(y) + y/2 = (y/2)\coth(y/2)`` is even,
  so :math:`Δ^2 q = H + Δ^2[q(|y|)]` with the hinge :math:`H = Δ^2(|y|/2) = \max(0, \min(δ, ε,
  −c, c + δ + ε))` computed exactly; for ``c ≥ 0`` the numerator is
  :math:`N(c) = G(c) − e^{−ε}G(c + ε) − e^{−δ}G(c + δ) + e^{−δ−ε}G(c + δ + ε)` (:math:`I =
  N/((1 − e^{−δ})(1 − e^{−ε}))`); for both boxes inverted past each other (``c + δ + ε ≤ 0``,
  where the linear parts cancel exactly) the same ``N`` at :math:`c^* = −(c + δ + ε)` times
  :math:`e^{c − c^*}`; in between :math:`\log I = c + \log Δ^2 q − \log(1 − e^{−δ}) −
  \log(1 − e^{−ε})`. Nothing overflows or underflows at any finite corners.
- **δ < T ≤ ε** (and the mirror): Gauss–Legendre (``_NODES`` nodes) over ``a`` of the
  closed form :math:`f(a) = E_b K(b − a) = [q'(b_2 − a) − q'(b_1 − a)]/(e^{a − b_1} −
  e^{a − b_2})`, itself in three sign regimes of ``b_j − a``; the mirror
  (:math:`(a_1, a_2, b_1, b_2) → (−b_2, −b_1, −a_2, −a_1)` leaves ``I`` unchanged) swaps δ and ε.
- **δ, ε < T**: Gauss–Legendre in both directions of ``E[K(b − a)]``. ``K`` is analytic in
  :math:`|\mathrm{Im}\,y| < 2π`, so on intervals of at most T the rule is exact to rounding
  (the removable singularities δ, ε → 0 need nothing special: δ = 0 puts every node on a_1).

Near 0 the small-argument forms are series: ``(1 − e^{−w})/w`` is ``−expm1(−w)/w`` (exact)
above 1e−8; ``(w − 1 + e^{−w})/w^2`` below 0.25 (12 terms) and the numerator of ``K`` below 1
(9 terms in ``(w/2)^2``), where their closed forms cancel. Accuracy (tests/boxes/
test__logistic_sides.py): within 5e−15 relative of the formula at 120 digits (mpmath) on a
grid of c from −500 to 500 and δ, ε from 0 to 1000 through every threshold, and within 1e−12
of the float64 quadrature of :mod:`perturb.boxes.expected_volumes` on hypothesis-drawn corners
(±1e4 scales, s from 1e−3 to 1). Gradients are autograd through these elementwise ops: every
branch sees safe inputs (unused branches give zero, not NaN), the corners are sorted by a
permutation (a tie is the edge δ = 0 of a smooth function, gradchecked there), and the
kinks of the pieces of ``Δ^2 q`` are placed by the same signs so that they cancel.

:func:`logistic_log_loss` gives what b's side loses in ``a ∩ b`` (the nested-negative loss
``log(1 − P)``) as ``T_1 + T_2 − T_3`` of three such two-box sides, a subtraction that loses at
most a factor 2 (its docstring).

Cost: a few dozen elementwise ops per side where δ, ε ≥ T, on 5 (25) Gauss–Legendre nodes
where one (both) of δ, ε is below T, against 200–250 ``log F`` nodes and a zooming pass of the
quadrature per side (bench/bench_perturbed_boxes.py: a training step 20–30× faster).
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from perturb.boxes._bessel import _any
from perturb.noise._quadrature import gl_pieces

# δ or ε below this are integrated by Gauss–Legendre (module docstring)
_SMALL = 0.5
_NODES = 5
# where the loss of :func:`logistic_log_loss` puts the corner that T_1 and T_2 lack: this many
# scales beyond the others (σ there is 1 − e^{−2000}, 1 to rounding)
_FAR = 2000.0
# (1 − e^{−w})/w from expm1 (accurate for every w > 0) above this, 1 − w/2 below
_ONE_SERIES = 1e-8
# Taylor series of the small-argument forms of ρ and K below these, with these many terms
# (truncation below 1e-18 relative; the closed forms lose at most ~2e-15 above them)
_RHO_SERIES, _RHO_TERMS = 0.25, 12
_K_SERIES, _K_TERMS = 1.0, 9


def _series(w: torch.Tensor, coef: list[float]) -> torch.Tensor:
    """``Σ_k coef[k] w^k`` by Horner."""
    out = torch.full_like(w, coef[-1])
    for c in reversed(coef[:-1]):
        out = out * w + c
    return out


# (w − 1 + e^{−w})/w² = Σ_k (−1)^k w^k/(k+2)!
_C_RHO = [(-1) ** k / math.factorial(k + 2) for k in range(_RHO_TERMS)]
# Σ_k 2k z^{k−1}/(2k+1)!, k ≥ 1 (the numerator of K in z = (w/2)², _log_k)
_C_K = [2 * k / math.factorial(2 * k + 1) for k in range(1, _K_TERMS + 1)]


def _small_form(w: torch.Tensor, below: float, coef: list[float],
                closed: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``closed(w)`` for ``w ≥ below``, the series ``coef`` below (``w ≥ 0``)."""
    small = w < below
    if not _any(small.any()):       # one regime only: skip the other's ops (CPU; not traced)
        return closed(w)
    if not _any((~small).any()):
        return _series(w, coef)
    ws = torch.where(small, w, torch.zeros_like(w))
    wc = torch.where(small, torch.full_like(w, below), w)
    return torch.where(small, _series(ws, coef), closed(wc))


def _one(w: torch.Tensor) -> torch.Tensor:
    """``(1 − e^{−w})/w``, ``w ≥ 0``."""
    return _small_form(w, _ONE_SERIES, [1.0, -0.5], lambda v: -torch.expm1(-v) / v)


def _g(w: torch.Tensor) -> torch.Tensor:
    """``G(w) = w/(1 − e^{−w})``, ``w ≥ 0``."""
    return 1.0 / _one(w)


def _rho(w: torch.Tensor) -> torch.Tensor:
    """``ρ(w) = (w − 1 + e^{−w})/(1 − e^{−w})² = −e^w q'(w)``, ``w ≥ 0`` (ρ(0) = 1/2)."""
    num = _small_form(w, _RHO_SERIES, _C_RHO, lambda v: (v + torch.expm1(-v)) / (v * v))
    one = _one(w)
    return num / (one * one)


def _log_k(y: torch.Tensor) -> torch.Tensor:
    """``log K(y) = y + log q''(|y|)``, any ``y`` (``q''`` is even: smooth through 0, and
    the gradient of ``|y|`` at 0, zero, is right). Below ``w = _K_SERIES`` the numerator
    ``((w − 2) + (w + 2)e^{−w})/w³ = (e^{−h}/2) Σ_k 2k h^{2k−2}/(2k+1)!``, ``h = w/2``, is a
    series in ``h²``."""
    w = y.abs()
    small = w < _K_SERIES
    ws = torch.where(small, w, torch.zeros_like(w))
    wc = torch.where(small, torch.full_like(w, _K_SERIES), w)
    h = ws / 2
    log_series = torch.log(_series(h * h, _C_K)) - h - math.log(2.0)
    log_closed = torch.log(((wc - 2) + (wc + 2) * torch.exp(-wc)) / (wc * wc * wc))
    return y - w + torch.where(small, log_series, log_closed) - 3 * torch.log(_one(w))


def _log1mexp_neg(x: torch.Tensor) -> torch.Tensor:
    """``log(1 − e^{−x})`` for ``x ≥ _SMALL`` (no cancellation there)."""
    return torch.log(-torch.expm1(-x))


def _log_direct(c: torch.Tensor, d: torch.Tensor, e: torch.Tensor, cd: torch.Tensor,
                ce: torch.Tensor, cde: torch.Tensor) -> torch.Tensor:
    """log I for δ, ε ≥ ``_SMALL`` (module docstring), elementwise. The three sub-regimes
    share four values of ``G`` at non-negative arguments: ``c, c + ε, c + δ, c + δ + ε``
    (c ≥ 0), ``c^*, c^* + ε, c^* + δ, c^* + δ + ε`` (c + δ + ε ≤ 0), ``|y|`` between (where
    ``Δ²q = H + Δ²[q(|y|)]``, ``q(w) = e^{−w}G(w)``; the kinks of ``H`` and ``q(|y|)`` cancel:
    both are placed by the signs of the same ``y``, with the average of the two sides at 0)."""
    pos, neg = c >= 0, cde <= 0

    def arg(p: torch.Tensor, n: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return torch.where(pos, p, torch.where(neg, n, m))

    w0, w1 = arg(c, -cde, -c), arg(ce, -cd, ce.abs())
    w2, w3 = arg(cd, -ce, cd.abs()), arg(cde, -c, cde)
    g0, g1, g2, g3 = _g(w0), _g(w1), _g(w2), _g(w3)
    xd, xe = torch.exp(-d), torch.exp(-e)
    n_end = g0 - xe * g1 - xd * g2 + xd * xe * g3          # N(c) or N(c*)
    # H = min(δ, −c) + min(0, c + ε), each min chosen by the sign of c + δ and c + ε (the
    # arguments whose |·| carries the matching kink of q(|y|)), averaged at 0 as |·| is
    zero = torch.zeros_like(c)
    hinge = (torch.where(cd < 0, d, torch.where(cd > 0, -c, (d - c) / 2))
             + torch.where(ce < 0, ce, torch.where(ce > 0, zero, ce / 2)))
    n_mid = (hinge + torch.exp(-w0) * g0 - torch.exp(-w1) * g1 - torch.exp(-w2) * g2
             + torch.exp(-w3) * g3)
    num = torch.where(pos | neg, n_end, n_mid)
    offset = arg(torch.zeros_like(c), c + cde, c)
    return offset + torch.log(num) - _log1mexp_neg(d) - _log1mexp_neg(e)


def _log_f(y1: torch.Tensor, y2: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """``log f`` with ``f = [q'(y2) − q'(y1)]/(e^{−y1}(1 − e^{−ε}))``, ``y2 = y1 + ε``,
    ε ≥ ``_SMALL`` (the two-box side with coincident lowers), elementwise; with ``q'(y) =
    −e^{−y}ρ(y)`` for ``y ≥ 0`` and ``q'(y) = −1 − q'(−y)`` below (``ρ`` at non-negative
    arguments of each sign regime: its one-sided derivative at 0 is the true one)."""
    pos, neg = y1 >= 0, y2 <= 0
    wa = torch.where(pos, y1, torch.where(neg, -y2, -y1))
    wb = torch.where(pos, y2, torch.where(neg, -y1, y2))
    ra, rb = _rho(wa), _rho(wb)
    n_end = ra - torch.exp(-e) * rb                          # times e^{y1 + y2} when y2 ≤ 0
    n_mid = 1 - torch.exp(-wa) * ra - torch.exp(-wb) * rb    # 1 + q'(|y1|) + q'(y2), times e^{y1}
    num = torch.where(pos | neg, n_end, n_mid)
    offset = torch.where(pos, torch.zeros_like(y1), torch.where(neg, y1 + y2, y1))
    return offset + torch.log(num) - _log1mexp_neg(e)


def _gl(n: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Gauss–Legendre nodes and log weights on [0, 1]."""
    x, w = gl_pieces(torch.tensor([0.0, 1.0], dtype=dtype, device=device), n)
    return x, torch.log(w)


def _log_one_small(d, e, cd, cde):
    """log I for δ < ``_SMALL`` ≤ ε: Gauss–Legendre over ``a = a_1 + u``, u ∈ [0, δ],
    weight ∝ e^u, of ``f(a)`` (``b_1 − a = c + δ − u``)."""
    t, log_w = _gl(_NODES, d.dtype, d.device)
    u = d.unsqueeze(-1) * t
    log_w = log_w + u
    log_w = log_w - torch.logsumexp(log_w, -1, keepdim=True)
    y1 = cd.unsqueeze(-1) - u
    y2 = cde.unsqueeze(-1) - u
    return torch.logsumexp(log_w + _log_f(y1, y2, e.unsqueeze(-1).expand_as(y1)), -1)


def _log_both_small(d, e, cd):
    """log I for δ, ε < ``_SMALL``: Gauss–Legendre in ``a`` (weight ∝ e^u, u ∈ [0, δ]) and
    ``b`` (weight ∝ e^{−v}, v ∈ [0, ε]) of ``K(b − a)``, ``b − a = c + δ + v − u``."""
    t, log_w = _gl(_NODES, d.dtype, d.device)
    u = d.unsqueeze(-1) * t
    v = e.unsqueeze(-1) * t
    lu = log_w + u
    lv = log_w - v
    lu = lu - torch.logsumexp(lu, -1, keepdim=True)
    lv = lv - torch.logsumexp(lv, -1, keepdim=True)
    y = cd[..., None, None] - u.unsqueeze(-1) + v.unsqueeze(-2)
    log_w2 = lu.unsqueeze(-1) + lv.unsqueeze(-2)
    return torch.logsumexp((log_w2 + _log_k(y)).flatten(-2), -1)


def _log_side_units(c: torch.Tensor, d: torch.Tensor, e: torch.Tensor, cd: torch.Tensor,
                    ce: torch.Tensor, cde: torch.Tensor) -> torch.Tensor:
    """log I (units of s) from ``c = b_1 − a_2``, ``δ``, ``ε``, ``c + δ``, ``c + ε``,
    ``c + δ + ε`` (each a difference of two corners), 1-D tensors."""
    small_d, small_e = d < _SMALL, e < _SMALL
    # one spread small: δ < T ≤ ε as it is, ε < T ≤ δ mirrored (δ ↔ ε, c + δ ↔ c + ε), in one call
    sd, se, scd = (torch.where(small_d, d, e), torch.where(small_d, e, d),
                   torch.where(small_d, cd, ce))
    out = torch.zeros_like(c)
    cases = [(~small_d & ~small_e, lambda i: _log_direct(c[i], d[i], e[i], cd[i], ce[i], cde[i])),
             (small_d ^ small_e, lambda i: _log_one_small(sd[i], se[i], scd[i], cde[i])),
             (small_d & small_e, lambda i: _log_both_small(d[i], e[i], cd[i]))]
    for mask, fn in cases:
        if not _any(mask.any()):
            continue
        if not _any((~mask).any()):
            return fn(slice(None))
        idx = mask.nonzero(as_tuple=True)
        out = out.index_put(idx, fn(idx))
    return out


def logistic_log_side2(lo: torch.Tensor, up: torch.Tensor, scale: float) -> torch.Tensor:
    """``log E[(min(U_1, U_2) − max(L_1, L_2))_+]`` for two boxes ``lo, up`` ``(2, *batch, d)``
    (finite float64) under Logistic(``scale``) noise, ``(*batch, d)`` (module docstring)."""
    # sorted by a permutation, not minimum/maximum: at a tie those pass the whole gradient to
    # both corners, where I is smooth in each corner and the tie is just the edge δ = 0
    lower, upper = lo[0] <= lo[1], up[0] <= up[1]
    l1, l2 = torch.where(lower, lo[0], lo[1]), torch.where(lower, lo[1], lo[0])
    u1, u2 = torch.where(upper, up[0], up[1]), torch.where(upper, up[1], up[0])
    shape = l1.shape
    diffs = [((p - m) / scale).reshape(-1) for p, m in
             ((u1, l2), (l2, l1), (u2, u1), (u1, l1), (u2, l2), (u2, l1))]
    return (math.log(scale) + _log_side_units(*diffs)).reshape(shape)


def logistic_log_loss(lo_a: torch.Tensor, up_a: torch.Tensor, lo_b: torch.Tensor,
                      up_b: torch.Tensor, scale: float) -> torch.Tensor:
    r"""``log(s_b − s_{a∩b})``: what the expected side of ``b`` loses in the intersection with
    ``a`` under Logistic(``scale``) noise, elementwise over finite float64 corners
    ``(*batch, d)``, without the cancellation of the difference when ``b`` lies deep in ``a``.

    With :math:`g_b = σ(x − l_b)σ(u_b − x)` (units of ``s``), the loss is
    :math:`\int g_b (1 − σ(x − l_a)σ(u_a − x))` and :math:`1 − σ(p)σ(q) = σ(−p) + σ(−q) −
    σ(−p)σ(−q)`: :math:`T_1 + T_2 − T_3`, :math:`T_1 = \int g_b σ(l_a − x)` (uppers
    :math:`u_b, l_a`), :math:`T_2 = \int g_b σ(x − u_a)` (lowers :math:`l_b, u_a`), :math:`T_3 =
    \int g_b σ(l_a − x)σ(x − u_a)`, each a two-box side of :func:`logistic_log_side2` (the
    missing corner of T_1 and T_2 a stand-in ``_FAR`` scales beyond the others, where its
    factor is 1 to rounding). :math:`T_3 ≤ \min(T_1, T_2)`, so the subtraction loses at most
    a factor 2: ``log1mexp`` of a log ratio ≤ −log 2.
    """
    far = _FAR * scale
    lower = torch.minimum(lo_b, up_a)
    upper = torch.maximum(up_b, lo_a)
    lo = torch.stack([torch.stack([lo_b, lower - far]), torch.stack([lo_b, up_a]),
                      torch.stack([lo_b, up_a])], 1)
    up = torch.stack([torch.stack([up_b, lo_a]), torch.stack([up_b, upper + far]),
                      torch.stack([up_b, lo_a])], 1)
    t1, t2, t3 = logistic_log_side2(lo, up, scale)
    both = torch.logaddexp(t1, t2)
    return both + torch.log(-torch.expm1(t3 - both).clamp(max=-0.5))   # t3 − both ≤ −log 2
