r"""``log(1 − P(b ⊆ a))`` of boxes perturbed by a noise other than Gumbel, the loss of a
negative pair (private engine of :func:`perturb.boxes.log1m_containment_prob`).

Pairs with ``P <= 1/2`` take ``log1mexp(log P)`` from the expected volumes of
:mod:`perturb.boxes.expected_volumes`; the nearly nested ones integrate what b loses in the
intersection directly (no cancellation): by quadrature, in closed form (two Logistic boxes) or
piece by piece (bounded and NegativeExponential noise). Formulas in :func:`_log1m_near`.
"""
from __future__ import annotations

import math

import torch

from perturb._math import log1mexp
from perturb._validation import reads_stall
from perturb.boxes import expected_volumes as _ev
from perturb.boxes._bessel import _any
from perturb.boxes._logistic_sides import logistic_log_loss
from perturb.boxes.expected_volumes import _log_g, _log_integral, _log_sides, _piecewise
from perturb.noise import Logistic, Noise

_LOG2 = math.log(2.0)


def _log1m_ratio(lo_a: torch.Tensor, up_a: torch.Tensor, lo_b: torch.Tensor,
                 up_b: torch.Tensor, noise: Noise) -> torch.Tensor:
    r"""``log(1 − E[vol(a ∩ b)] / E[vol(b)])`` for finite float64 corners ``(*batch, d)``,
    accurate when ``b`` lies deep inside ``a`` (where the ratio rounds to 1).

    Pairs with :math:`P = \prod_i s_{ab,i}/s_{b,i} ≤ 1/2` take ``log1mexp(log P)``, which is
    well conditioned there (its derivative in ``log P`` is at most 1); the others (b nearly
    inside a, where 1 − P cancels) integrate what b loses (:func:`_log1m_near`), on those
    pairs only (one host read; on CUDA and under tracing every pair, ``reads_stall``).
    """
    log_b = _log_sides(lo_b.unsqueeze(0), up_b.unsqueeze(0), noise)
    log_ab = _log_sides(torch.stack([lo_a, lo_b]), torch.stack([up_a, up_b]), noise)
    # b with a side of expected length exactly 0 (noise of bounded support) is contained in
    # every box, as an empty hard box: P = 1, log(1 − P) = −inf, zero gradients
    empty = torch.isneginf(log_b).any(-1)
    log_p = torch.where(empty.unsqueeze(-1), 0.0, log_ab - log_b).clamp(max=0.0).sum(-1)
    far = (log_p <= -_LOG2) | empty
    out = log1mexp(torch.where(far & ~empty, log_p, torch.full_like(log_p, -1.0)))
    out = torch.where(empty, -math.inf, out)
    if not _any((~far).any()):
        return out
    if log_p.dim() == 0 or reads_stall(log_p):
        near = _log1m_near(lo_a, up_a, lo_b, up_b, log_b, log_ab, noise)
        return torch.where(far, out, near)
    rows = (~far).nonzero(as_tuple=True)
    near = _log1m_near(lo_a[rows], up_a[rows], lo_b[rows], up_b[rows], log_b[rows],
                       log_ab[rows], noise)
    return out.index_put(rows, near)


def _log1m_near(lo_a: torch.Tensor, up_a: torch.Tensor, lo_b: torch.Tensor,
                up_b: torch.Tensor, log_b: torch.Tensor, log_ab: torch.Tensor, noise: Noise
                ) -> torch.Tensor:
    r"""``log(1 − P)`` of :func:`_log1m_ratio` for nearly nested pairs, given the log sides
    ``log_b`` of b and ``log_ab`` of a ∩ b ``(*batch, d)``.

    Per coordinate the side of b loses :math:`δ = s_b − s_{ab} = \int g_b(x)(1 − h_a(x))\,dx`
    in the intersection (:math:`g_b` the integrand of b's side, :math:`h_a = F(x − l_a)
    F(u_a − x)`), integrated directly in log space with :math:`1 − h_a` from the survival
    function (no cancellation): by quadrature on each half of b (the two ends of b meet a's
    two ends, :func:`_log_lost_side`), or piece by piece for bounded and NegativeExponential
    noise (``log_lost_side`` of ``_bounded_sides`` / ``_negexp_sides``).
    With :math:`r = δ / s_b`, :math:`\log(s_{ab}/s_b) = \log(1 − r)` is ``log1mexp(log r)``
    for r <= 1/2 and :math:`\log s_{ab} − \log s_b` above; the result is
    :math:`\log(1 − \prod_i (1 − r_i)) = \log \sum_i r_i \prod_{j<i} (1 − r_j)`, a log-sum-exp
    of positive terms (no cancellation when every :math:`r_i` is tiny). Under Logistic noise
    (the class itself) δ is the closed form
    :func:`~perturb.boxes._logistic_sides.logistic_log_loss` instead of the integral.
    """
    piecewise = _piecewise(noise)
    if piecewise is not None:
        log_delta = piecewise.log_lost_side(lo_a, up_a, lo_b, up_b, noise)
    elif type(noise) is Logistic and _ev._LOGISTIC_PAIRS_CLOSED:   # closed form of the loss
        log_delta = logistic_log_loss(lo_a, up_a, lo_b, up_b, float(noise.scale))
    else:
        log_delta = _log_lost_side(lo_a, up_a, lo_b, up_b, noise)
    return _log1m_from_loss(log_delta, log_b, log_ab)


def _log_lost_side(lo_a: torch.Tensor, up_a: torch.Tensor, lo_b: torch.Tensor,
                   up_b: torch.Tensor, noise: Noise) -> torch.Tensor:
    """log δ of :func:`_log1m_near` by quadrature, on each half of b."""
    layout = noise.quadrature_layout(2)
    low, width, order = float(layout.low), float(layout.width), int(layout.order)
    with torch.no_grad():
        mid = (lo_b + up_b) / 2
        start = torch.minimum(torch.minimum(lo_a, lo_b), up_b) + low
        stop = torch.maximum(torch.maximum(up_a, up_b), lo_b) - low

    def log_loss(x: torch.Tensor) -> torch.Tensor:     # log g_b(x) + log(1 − h_a(x))
        # 1 − F(x − l_a) F(u_a − x) = S(x − l_a) + F(x − l_a) S(u_a − x), from the survival
        # function: log1mexp(log h_a) is −inf (and its gradient NaN) where h_a rounds to 1,
        # deep inside a, which is exactly where b sits when a contains it
        below, above = x - lo_a.unsqueeze(-1), up_a.unsqueeze(-1) - x
        log_1m_h = torch.logaddexp(noise.log_sf(below),
                                   noise.log_cdf(below) + noise.log_sf(above))
        return _log_g(lo_b.unsqueeze(0), up_b.unsqueeze(0), noise, x) + log_1m_h

    return torch.logaddexp(_log_integral(log_loss, start, mid, width, order),
                           _log_integral(log_loss, mid, stop, width, order))


def _log1m_from_loss(log_delta: torch.Tensor, log_b: torch.Tensor, log_ab: torch.Tensor
                     ) -> torch.Tensor:
    """``log(1 − P)`` of :func:`_log1m_near` from the log losses ``log_delta`` of b's sides
    and the log sides ``log_b``, ``log_ab`` ``(*batch, d)``."""
    log_r = (log_delta - log_b).clamp(max=0.0)
    small = log_r < -_LOG2
    log_keep = torch.where(small, log1mexp(torch.where(small, log_r, -1.0)),
                           (log_ab - log_b).clamp(max=0.0))
    # 1 − Π_i (1 − r_i) = Σ_i r_i Π_{j<i} (1 − r_j): a sum of positive terms, so tiny r_i
    # (b deep inside a, where log1mexp(Σ_i log(1 − r_i)) rounds to log 0) keep their digits
    before = torch.cumsum(log_keep, -1) - log_keep
    terms = log_r + before
    # b inside the part of a where h_a = 1 in every coordinate (noise of bounded support):
    # nothing is lost, 1 − P = 0 exactly; log 0 with a zero gradient, not logsumexp's NaN
    none = torch.isneginf(terms).all(-1, keepdim=True)
    out = torch.logsumexp(torch.where(none, 0.0, terms), -1)
    return torch.where(none.squeeze(-1), -math.inf, out).clamp(max=0.0)
