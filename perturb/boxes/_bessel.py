r"""The Bessel side length of Gumbel boxes: g(u) = log K0(e^u) and its slope, fast and exact
(private engine of :mod:`perturb.boxes.volumes`; notation there: u = log 2 − x/(2β),
g(u) = A(u) − z, q(u) = −g'(u) = B(u) + z, z = e^u).

Evaluation. On −20 <= u <= 36, A and B come from a piecewise-polynomial table: intervals of
width 1/8 in u centred on the multiples of 1/8, on each a polynomial in s = 8u − round(8u)
(exact in floating point, |s| <= 1/2) of degree 6 for float64 and 3 for float32 (and the
half types, computed in float32). The table is built once per process, in float64, by
interpolating A and B at the Chebyshev–Lobatto points of each interval (the ends included,
so the pieces join continuously), with A and B from ``torch.special``'s k0e/k1e (B from the
asymptotic series of K0 and K1 for z >= 20, where k1e/k0e − 1 cancels). Evaluating it is
one gather of the coefficients and 3 or 6 fused multiply-adds per element: several times
cheaper than k0e and k1e (about 45 ns per element each on a CPU core), and g and g' come from
the same gather, so the fused volume computes the slope in its forward and its backward is a
multiplication. Accuracy (tests/boxes/test__bessel.py, a 400,001-point grid and mpmath at 40
digits): float64 within 4e-15 of torch.special (absolute on g where |g| <= 1, relative
beyond; relative on q; 2.2e-15 and 2.6e-15 measured), float32 within 2 eps of the float64
values at the same argument (1.5 and 1.35 eps measured; torch.special's float32 k0e/k1e, the
previous evaluation, were 7 and 10 eps off).

Beyond the table: for u > 36, A = ½log(π/2) − u/2 − 1/(8z) + ... and B = 1/2 − 1/(8z) + ...
with 1/(8z) < 3e-17, so A continues as A(36) − (u − 36)/2 and B as B(36). For u < −20 (wide
sides, x > 41β) the small-argument form K0(z) = −log(z/2) − γ + O(z² log z) is used, i.e.
g(u) = log(log 2 − u − γ), exact to double precision there and never underflowing. For
very inverted boxes (x ≪ 0) the true log side length is ≈ −z = −2·exp(−x/(2β)), which leaves
the range of the dtype (float32 near x = −176β, float64 near x = −1418β). From
u_max = 0.75·log(finfo.max) on (x ≈ −131β in float32, −1063β in float64; z ≈ 1e29 and 1e231)
g continues along its tangent line, so values and gradients stay finite, monotone and
continuous: exact wherever the exact value is representable with a margin, a documented linear
extrapolation beyond.
"""
from __future__ import annotations

import functools
import math
from typing import Any

import torch

from perturb._autograd import once_differentiable
from perturb._math import EULER_GAMMA
from perturb._validation import reads_stall, unreadable

_LOG2 = math.log(2.0)
# Below this u = log z the small-argument form of K0 is exact to < 1e-17 relative.
_SMALL_U = -20.0

# The piecewise-polynomial table of g and g' (module docstring): u in [_TAB_LO, _TAB_HI] in
# intervals of width _TAB_H centred on the multiples of _TAB_H, degree _tab_degree(dtype) in each.
# _TAB_H is a power of 2, so that v = u/_TAB_H and s = v − round(v) are exact in any dtype.
_TAB_LO = _SMALL_U
_TAB_HI = 36.0          # beyond: A = log k0e(z) + (u − 36)/2 and B = 1/2 to 1e-16 (1/(8z))
_TAB_H = 0.125
_C_SMALL = _LOG2 - EULER_GAMMA       # K0(e^u) = c − u (1 + O(z² log z)) for u → −∞


def _any(cond: torch.Tensor) -> bool:
    """``bool(cond)`` for a 0-dim condition, deciding whether a regime's extra work is needed;
    True (the general branch-free path) on CUDA, where the read would stall the device, and
    under ``torch.func.vmap``, where data-dependent branching is impossible."""
    if reads_stall(cond):
        return True
    try:
        return bool(cond)
    except RuntimeError:
        return True


def _any_of(*conds: torch.Tensor) -> list[bool]:
    """:func:`_any` of several 0-dim conditions with one host read (all True where reads
    stall or are impossible)."""
    if reads_stall(conds[0]):
        return [True] * len(conds)
    try:
        return [bool(c) for c in torch.stack(conds).tolist()]
    except RuntimeError:
        return [True] * len(conds)


def _u_max(dtype: torch.dtype) -> float:
    """u beyond which g(u) = log K0(e^u) continues linearly (z = e^u ~ finfo.max^0.75)."""
    return 0.75 * math.log(torch.finfo(dtype).max)


def _k0_reference(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A, B)`` = (log k0e(z), z·(k1e(z)/k0e(z) − 1)), z = e^u: the functions the table
    interpolates (g = A − z, q = −g' = B + z), from ``torch.special``'s exponentially scaled
    Bessel functions in ``u``'s dtype. For z >= 20, where k1e/k0e − 1 ≈ 1/(2z) cancels, B
    comes from the asymptotic series of K0 and K1 instead (:func:`_k0_ratio_series`)."""
    z = torch.exp(u)
    k0e = torch.special.scaled_modified_bessel_k0(z)
    b = z * (torch.special.scaled_modified_bessel_k1(z) / k0e - 1.0)
    return torch.log(k0e), torch.where(z >= 20.0, _k0_ratio_series(z.clamp(min=20.0)), b)


def _k0_ratio_series(z: torch.Tensor, terms: int = 40) -> torch.Tensor:
    """z·(K1(z)/K0(z) − 1) for z >= 20 from K_ν(z) ~ √(π/(2z)) e^{−z} Σ_k a_k(ν) z^{−k},
    a_k(ν) = Π_{j<=k} (4ν² − (2j − 1)²) / (k!·8^k): the ratio
    Σ_{k>=1} (a_k(1) − a_k(0)) z^{1−k} / Σ_k a_k(0) z^{−k}, with no cancellation. 40 terms
    reach the series' smallest term (k ≈ 2z) at z = 20, where it is below 1e-16."""
    a0, a1 = [1.0], [1.0]
    for k in range(1, terms + 1):
        a0.append(a0[-1] * -((2 * k - 1) ** 2) / (8 * k))
        a1.append(a1[-1] * (4 - (2 * k - 1) ** 2) / (8 * k))
    w = z.reciprocal()
    num = torch.zeros_like(z)
    den = torch.zeros_like(z)
    for k in range(terms, 0, -1):
        num = num * w + (a1[k] - a0[k])
        den = den * w + a0[k]
    return num / (den * w + 1.0)


def _tab_degree(dtype: torch.dtype) -> int:
    """Degree of the table's polynomials: 6 for float64, 3 for float32 (interpolation errors
    2e-15 and 2e-9, both far below the dtype's eps; the smaller table is half the work)."""
    return 6 if dtype == torch.float64 else 3


@functools.lru_cache(maxsize=None)
def _k0_coefficients(n: int) -> torch.Tensor:
    """Monomial coefficients of A and B on each interval, degree ``n``, float64 on the CPU:
    shape ``(2·(n + 1), K)``, rows A_0, B_0, A_1, B_1, ... (2-D and contiguous:
    ``index_select`` along the last dim is fast only for those).

    :func:`_k0_reference` interpolated at the n + 1 Chebyshev–Lobatto points of each interval
    (the ends included, so the pieces join continuously), as polynomials in
    s = u/h − round(u/h) ∈ [−1/2, 1/2].
    """
    f64 = torch.float64
    j = torch.arange(n + 1, dtype=f64)
    t = -torch.cos(math.pi * j / n)                         # nodes in [−1, 1]
    count = round((_TAB_HI - _TAB_LO) / _TAB_H) + 1
    centres = _TAB_LO + _TAB_H * torch.arange(count, dtype=f64)
    a, b = _k0_reference(centres[:, None] + (0.5 * _TAB_H) * t)      # (K, n + 1) each
    vander = t[:, None] ** j                                # vander[i, m] = t_i^m
    coef = torch.linalg.solve(vander, torch.stack([a, b]).transpose(1, 2))   # (2, n + 1, K)
    coef = coef * (2.0 ** j)[:, None]                       # in s = t/2
    return coef.transpose(0, 1).reshape(2 * (n + 1), count).contiguous()


@functools.lru_cache(maxsize=None)
def _k0_tables(dtype: torch.dtype, device: torch.device
               ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """The coefficient tables (:func:`_k0_coefficients`) of the degree n for ``dtype``
    (:func:`_tab_degree`), in ``dtype`` on ``device``: ``(A, B)``, each n + 1 contiguous 1-D
    tensors of K entries, one per power of s. Each power is gathered on its own by a 1-D
    ``index_select``, which leaves its coefficients contiguous, so that the Horner steps
    vectorise (a gather of whole rows of coefficients is no cheaper and leaves them strided,
    which makes each fused multiply-add several times slower: 1.2 ms against 0.75 ms for
    112,640 float32 elements on one core)."""
    both = _k0_coefficients(_tab_degree(dtype)).to(device=device, dtype=dtype)
    return tuple(both[0::2].unbind(0)), tuple(both[1::2].unbind(0))


# Elements per chunk of :func:`_k0_poly` times coefficient rows gathered: the gathered
# coefficients of a chunk stay below 16 MiB (float32) instead of growing with the input (a
# (2·(n+1), N) gather of N = 1e6 elements is tens of MB; above 32 MiB glibc maps every such
# allocation afresh and page-faults it in on every call).
_CHUNK = 1 << 22


def _k0_poly(u: torch.Tensor, part: int) -> torch.Tensor:
    """The table's polynomials at clamp(u, _TAB_LO, _TAB_HI): ``part`` 0: A, 1: B (shape of
    ``u``), 2: both (shape ``(2, *u.shape)``). One gather per power of s and ``deg`` fused
    multiply-adds (Horner) per chunk of elements."""
    a, b = _k0_tables(u.dtype, u.device)
    n = _tab_degree(u.dtype)
    v = u.clamp(_TAB_LO, _TAB_HI).mul_(1.0 / _TAB_H)
    k = torch.round(v)
    s = v.sub_(k).reshape(-1)                               # exact: |s| <= 1/2
    # the clamp keeps a NaN u (an ∞ − ∞ width) from indexing out of range: its s is NaN, so
    # its value stays NaN
    idx = k.sub_(_TAB_LO / _TAB_H).reshape(-1).long().clamp_(0, a[0].shape[0] - 1)
    step = max(1, _CHUNK // (2 * (n + 1)))
    if idx.shape[0] <= step:
        acc = _horners(a, b, idx, s, part)
    else:
        acc = torch.cat([_horners(a, b, idx[lo:lo + step], s[lo:lo + step], part)
                         for lo in range(0, idx.shape[0], step)], dim=-1)
    return acc.reshape(acc.shape[:-1] + u.shape)


def _horners(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...], idx: torch.Tensor,
             s: torch.Tensor, part: int) -> torch.Tensor:
    """A (``part`` 0), B (1) or both (2: a ``(2, len(idx))`` result whose A and B are
    interleaved in memory, as a gather of whole coefficient rows leaves them: a sum over a
    dimension of A, a log volume, then runs in the same order, so results stay the same to
    the bit)."""
    if part != 2:
        return _horner(b if part else a, idx, s, None)
    if unreadable(s):       # torch.func: vmap has no rule for out=, a stack instead
        return torch.stack([_horner(a, idx, s, None), _horner(b, idx, s, None)])
    out = torch.empty((idx.shape[0], 2), dtype=a[0].dtype, device=a[0].device).T
    out_a, out_b = out.unbind(0)
    _horner(a, idx, s, out_a)
    _horner(b, idx, s, out_b)
    return out


def _horner(coef: tuple[torch.Tensor, ...], idx: torch.Tensor, s: torch.Tensor,
            out: torch.Tensor | None) -> torch.Tensor:
    """Σ_i coef[i][idx]·s^i by Horner's rule: per power one 1-D gather (contiguous), then a
    fused multiply-add; the last one written to ``out`` when given."""
    acc = coef[-1].index_select(0, idx)
    for c in coef[-2:0:-1]:
        acc = torch.addcmul(c.index_select(0, idx), acc, s)
    return torch.addcmul(coef[0].index_select(0, idx), acc, s, out=out)


def _log_k0_exp(u: torch.Tensor, value: bool = True, slope: bool = True
                ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(g, q)``: g(u) = log K0(e^u) and q(u) = −g'(u) = z·K1(z)/K0(z), z = e^u, for every
    finite u (regimes in the module docstring); either may be skipped (None).

    −20 <= u <= 36: g = A − z and q = B + z from the table; u > 36: A and B continue as
    their asymptotes (A − (u − 36)/2, B = 1/2); u < −20: g = log(c − u), q = 1/(c − u),
    c = log 2 − γ; u > u_max: g continues along its tangent line (q constant).
    """
    parts = _k0_poly(u, 2 if value and slope else 0 if value else 1)
    um = _u_max(u.dtype)
    z = u.clamp(min=_TAB_LO, max=um).exp()      # below _TAB_LO z is not used (where below)
    g = q = None
    if value:
        g = (parts[0] if slope else parts).sub_(z)
    if slope:
        q = (parts[1] if value else parts).add_(z)
    if not u.numel():
        return g, q
    lo, hi = torch.aminmax(u)
    above, beyond, below = _any_of(hi > _TAB_HI, hi > um, lo < _TAB_LO)   # one host read
    if g is not None and above:
        g = g - 0.5 * (u - u.clamp(max=_TAB_HI))
        if beyond:
            g = g - math.exp(um) * (u - um).clamp(min=0.0)
    if below:
        g, q = _small_regime(u, g, q)
    return g, q


def _small_regime(u: torch.Tensor, g: torch.Tensor | None, q: torch.Tensor | None
                  ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``g`` and ``q`` of :func:`_log_k0_exp` with the small-argument form where u < −20:
    g = log t, q = 1/t, t = log 2 − u − γ (the same values either way).

    Where host reads are free, only the rows (along the last dim) holding such a u are
    gathered, fixed and written back into ``g`` and ``q`` (fresh tensors, in place): wide
    sides are rare (17 of a WordNet step's 112,640 widths), and the full-size ``where``,
    ``log`` and reciprocal cost more than finding their rows (:func:`_log_k0_exp` of those
    widths: 1.38 against 1.48 ms, fastest of 300 in alternation, one CPU thread). Elsewhere
    (CUDA, compile, torch.func): full-size, branch-free."""
    if u.dim() and not reads_stall(u):
        # rows of the last dim (1-D: rows of one element), views of u, g and q
        uu, gg, qq = ((u, g, q) if u.dim() > 1 else
                      tuple(None if x is None else x.unsqueeze(-1) for x in (u, g, q)))
        assert uu is not None
        # a row holds a wide side iff its count of them is > 0: a matrix-vector product of
        # the flags (exact counts), about 2x faster than amin along a short last dim
        hits = uu.lt(_TAB_LO).to(uu.dtype)
        count = (hits.reshape(-1, hits.shape[-1]) @ hits.new_ones(hits.shape[-1]))
        rows = count.reshape(hits.shape[:-1]).nonzero(as_tuple=True)
        us = uu[rows]
        small = us < _TAB_LO
        t = _C_SMALL - us.clamp(max=_TAB_LO)
        if gg is not None:
            gg.index_put_(rows, torch.where(small, torch.log(t), gg[rows]))
        if qq is not None:
            qq.index_put_(rows, torch.where(small, t.reciprocal(), qq[rows]))
        # contiguous, as the where of the branch-free path leaves it: a sum of g along a
        # dimension (a log volume) then runs in the same order, so the two paths agree to the bit
        return (None if g is None else g.contiguous()), q
    small = u < _TAB_LO
    t = _C_SMALL - u.clamp(max=_TAB_LO)
    if g is not None:
        g = torch.where(small, torch.log(t), g)
    if q is not None:
        q = torch.where(small, t.reciprocal(), q)
    return g, q


def _log_k0_exp_value(u: torch.Tensor) -> torch.Tensor:
    """g(u) = log K0(e^u) for every finite u (:func:`_log_k0_exp`)."""
    g = _log_k0_exp(u, slope=False)[0]
    assert g is not None  # value=True
    return g


def _log_k0_exp_slope(u: torch.Tensor) -> torch.Tensor:
    """q(u) = −g'(u) = z·K1(z)/K0(z), z = e^u (:func:`_log_k0_exp`)."""
    q = _log_k0_exp(u, value=False)[1]
    assert q is not None  # slope=True
    return q


def _log_k0_exp_grad(u: torch.Tensor) -> torch.Tensor:
    """g'(u) = −z K1(z)/K0(z), z = e^u (−1/(log 2 − u − γ) for u < −20, constant beyond
    u_max; :func:`_log_k0_exp`)."""
    return _log_k0_exp_slope(u).neg_()


def _log_k0_exp_backward(u: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    """Backward of g(u) = log K0(e^u): ``grad_output · g'(u)``, g'(u) = −e^u K1(e^u)/K0(e^u)."""
    return grad_output * _log_k0_exp_grad(u)


class _LogK0Exp(torch.autograd.Function):
    """g(u) = log K0(e^u) for any finite u, with g'(u) = −z·K1(z)/K0(z), z = e^u.

    Both from :func:`_log_k0_exp` (the piecewise-polynomial table between u = −20 and 36,
    the small-z asymptote ``K0(z) ≈ −log(z/2) − γ`` below, a tangent-line continuation
    beyond u_max; see the module docstring). Once differentiable.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(u: torch.Tensor) -> torch.Tensor:
        return _log_k0_exp_value(u)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[torch.Tensor], output: torch.Tensor) -> None:
        (u,) = inputs
        ctx.save_for_backward(u)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor | None:
        (u,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None
        return _log_k0_exp_backward(u, grad_output)


def _log_neg_g_prime(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """h(u) = log q, q = −g'(u) = z·K1(z)/K0(z), z = e^u (the log slope of g, for
    :func:`_log_gumbel_side_slope`), and h'(u) = q − z²/q = z·(r − 1/r), r = K1/K0, from
    K0' = −K1 and K1' = −K0 − K1/z. With the table's B = q − z this is h' = B·(q + z)/q, free
    of cancellation for large z. For u < −20, q = 1/t (t = log 2 − u − γ), so h = −log t and
    h' = 1/t = q; beyond u_max q is constant, so h' = 0."""
    b = _k0_poly(u, 1)
    z = u.clamp(min=_TAB_LO, max=_u_max(u.dtype)).exp()    # below _TAB_LO: replaced below
    q = b + z
    slope = b.mul_(q + z).div_(q)
    if u.numel():
        lo, hi = torch.aminmax(u)
        beyond, below = _any_of(hi > _u_max(u.dtype), lo < _TAB_LO)      # one host read
        if beyond:
            slope = torch.where(u > _u_max(u.dtype), torch.zeros_like(slope), slope)
        if below:
            small = u < _TAB_LO
            t = _C_SMALL - u.clamp(max=_TAB_LO)
            q = torch.where(small, t.reciprocal(), q)
            slope = torch.where(small, q, slope)
    return torch.log(q), slope


class _LogNegGPrime(torch.autograd.Function):
    """h(u) = log(−g'(u)) = log(z·K1(z)/K0(z)), z = e^u, with h'(u) = z·(K1/K0 − K0/K1)
    (regimes as :func:`_log_neg_g_prime`). Once differentiable."""

    generate_vmap_rule = True

    @staticmethod
    def forward(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _log_neg_g_prime(u)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(output[1])

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_value: torch.Tensor, _: torch.Tensor
                 ) -> torch.Tensor:
        (slope,) = ctx.saved_tensors
        return grad_value * slope
