r"""The one quadrature of :mod:`perturb.noise` (private).

For continuous noise with density ``f`` and CDF ``F`` the functionals of the perturbed max are
one-dimensional integrals over the value ``x`` of the max:

.. math::

    p_i = P(\arg\max_j(θ_j + ε_j) = i) = \int f(x-θ_i) \prod_{j \ne i} F(x-θ_j)\,dx,
    \qquad
    \frac{\partial p_i}{\partial θ_j}
        = -\int f(x-θ_i) f(x-θ_j) \prod_{k \ne i,j} F(x-θ_k)\,dx \quad (i \ne j),

    \mathbb E[\max_i(θ_i+ε_i)] = a + \int_a^\infty (1 - F_{\max}) - \int_{-\infty}^a F_{\max},
    \qquad F_{\max}(x) = \prod_j F(x-θ_j).

Everything here evaluates them with one rule, composite Gauss–Legendre in float64, on a grid
the noise declares through :meth:`perturb.noise.Noise.quadrature_layout`
(:class:`~perturb.noise.base.QuadratureLayout`: the range of offsets ``[low, high]`` from
``max θ``, the panel width and the order per panel), plus the kinks ``θ_j + k`` of the density
(``k`` in ``noise.breakpoints``, and the ends of the support of bounded noise) as extra edges.

Accuracy policy (one for all three consumers):

- **Range.** ``low``/``high`` leave mass ``_TAIL = 1e-14`` of the max outside on each side.
  ``cover="max"`` (``argmax_probs``, ``expected_max``) integrates over
  ``[max θ + low, max θ + high]``: absolute error ~1e-13, and every ``F(x − θ_j)`` on the grid
  is at least ``_TAIL``. ``cover="all"`` (the log-space :func:`log_argmax_probs` behind
  :mod:`perturb.checks`) starts at ``min θ + low`` instead, so that each ``p_i`` is integrated
  over the whole range where its own density lives: ``log p_i`` keeps its relative accuracy
  for ``p_i`` down to ~1e-300 (for noise with at most exponential tails).
- **Panels.** Equal panels no wider than ``width`` (``width / refine`` with ``refine > 1``,
  which is how the checks measure the quadrature error: the change under a finer rule), each
  with ``order`` Gauss–Legendre nodes; bounded noise: one panel per piece between kinks
  (split ``refine`` times), where the integrands are polynomials for uniform noise, so the
  rule is exact.
- **Log space.** Products of CDFs are sums of ``log F``; ``cover="max"`` floors ``log F`` at
  ``log(tiny)`` so that the leave-one-out product ``exp(Σ_j log F_j − log F_i)`` is finite and
  differentiable; ``cover="all"`` keeps exact zeros (``-inf``) and forms ``p_i`` from the
  ratio ``f_i/F_i``, never subtracting infinities.
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Callable, NamedTuple

import numpy as np
import torch

if TYPE_CHECKING:
    from .base import Noise

# Probability mass of max_i(θ_i + ε_i) left outside the quadrature range, on each side.
_TAIL = 1e-14
_F64 = torch.float64
_TINY64 = torch.finfo(_F64).tiny
_LOG_TINY64 = math.log(_TINY64)


# ---------------------------------------------------------------------------------------------
# Gauss–Legendre rules


@functools.lru_cache(maxsize=None)
def _gauss_legendre(order: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss–Legendre nodes and weights on [-1, 1] (exact for polynomials of degree 2·order−1)."""
    return np.polynomial.legendre.leggauss(order)


def _gl(order: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule of :func:`_gauss_legendre` as float64 tensors on ``device``."""
    t, w = _gauss_legendre(order)
    return (torch.as_tensor(t, dtype=_F64, device=device),
            torch.as_tensor(w, dtype=_F64, device=device))


def gl_pieces(edges: torch.Tensor, order: int, refine: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes and weights of ``order``-point rules on every interval between consecutive ``edges``
    (``(*batch, E)`` → ``(*batch, (E−1)·refine·order)``), each interval split into ``refine``
    equal parts; node ``k`` belongs to interval ``k // (refine·order)``."""
    t, wt = _gl(order, edges.device)
    a, b = edges[..., :-1, None], edges[..., 1:, None]
    if refine > 1:
        s = torch.arange(refine, dtype=_F64, device=edges.device) / refine
        a, b = a + (b - a) * s, a + (b - a) * (s + 1.0 / refine)         # (*batch, E−1, refine)
        a, b = a.flatten(-2)[..., None], b.flatten(-2)[..., None]
    return ((a + b) / 2 + (b - a) / 2 * t).flatten(-2), ((b - a) / 2 * wt).flatten(-2)


def _bisect_quantile(cdf: Callable[[torch.Tensor], torch.Tensor], p: float, name: str) -> float:
    """``F⁻¹(p)`` by bracketing and bisection on ``cdf`` (``name`` for the error message)."""

    def below(x: float) -> bool:
        return float(cdf(torch.tensor(x, dtype=_F64))) < p

    lo, hi = -1.0, 1.0
    while below(hi):
        hi *= 2.0
        if hi > 1e300:
            raise ValueError(f"{name}: could not bracket the {p} quantile from its cdf")
    while not below(lo):
        lo *= 2.0
        if lo < -1e300:
            raise ValueError(f"{name}: could not bracket the {p} quantile from its cdf")
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if below(mid):
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


# ---------------------------------------------------------------------------------------------
# the grid and the integrand terms


class _Terms(NamedTuple):
    """Quadrature weights and log integrand factors at the nodes.

    ``w`` ``(*batch, N)``; ``log_f`` and ``log_cdf`` ``(*batch, N, d)``: ``log f(x − θ_j)`` and
    ``log F(x − θ_j)`` at node ``x`` (``log_cdf`` floored at ``log(tiny)`` when asked);
    ``a`` ``(*batch,)``: the grid's lower end.
    """

    w: torch.Tensor
    log_f: torch.Tensor
    log_cdf: torch.Tensor
    a: torch.Tensor


def _terms(noise: "Noise", theta: torch.Tensor, *, cover: str = "max", refine: int = 1,
           floor: bool = True) -> _Terms:
    """The grid of the module docstring and the integrand factors on it.

    ``theta`` ``(*batch, d)`` is float64 and shifted so that its (detached) max is 0: the
    integrals are translation-equivariant and the nodes stay exact for scores of ±1e4.

    Unbounded noise: equal panels on ``[start, max θ + high]`` (``start = max θ + low`` or, with
    ``cover="all"``, ``min θ + low``), placed on the detached θ (the integrals do not depend on
    where the grid sits); kinks of the density (``noise.breakpoints``) split the panels at
    ``x = θ_j + k``. Bounded noise with support ``[l, h]``: the integrands are smooth between
    the kinks ``x = θ_j + k``, ``k ∈ {l, h} ∪ breakpoints``, which are sorted (stably) into
    pieces with one rule each. The pieces move with θ (not detached): the density jumps at the
    ends of the support, and moving the pieces is what makes the autograd derivative exact
    (Leibniz' boundary terms). Whether a piece lies inside the support of coordinate ``j`` is
    decided from the *ranks* of ``θ_j + l`` and ``θ_j + h`` in that sort, not by comparing
    floats, so that at tied scores (zero-length pieces) every term is evaluated for one and the
    same ordering of the kinks: the derivatives stay exact there too.
    """
    d = theta.shape[-1]
    layout = noise.quadrature_layout(d)
    order = int(layout.order)
    kinks = tuple(float(k) for k in noise.breakpoints)
    if not noise.bounded:
        low, high, width = float(layout.low), float(layout.high), float(layout.width)
        if kinks:   # every kink of the largest score strictly inside, where its edge can move
            high = max(high, max(kinks) + min(width, high - low))
        m = theta.detach().amax(-1, keepdim=True)
        if cover == "max":
            n_panels = max(1, math.ceil((high - low) / width))
            edges = m + torch.linspace(low, high, n_panels + 1, dtype=_F64, device=theta.device)
        else:
            start = theta.detach().amin(-1, keepdim=True) + low
            span = m + high - start
            n_panels = max(1, math.ceil(float(span.max()) / width))
            edges = start + span * torch.linspace(0.0, 1.0, n_panels + 1, dtype=_F64,
                                                  device=theta.device)
        lo, hi = edges[..., :1], edges[..., -1:]
        rank = None
        if kinks:
            at = torch.cat([theta + k for k in kinks], -1)
            at = torch.minimum(torch.maximum(at, lo), hi)
            n_grid = edges.shape[-1]
            edges, perm = torch.cat([edges.expand(*theta.shape[:-1], -1), at], -1).sort(
                dim=-1, stable=True)
            rank = torch.empty_like(perm).scatter_(
                -1, perm, torch.arange(perm.shape[-1], device=perm.device).expand_as(perm))
            rank = rank[..., n_grid:]                                   # (*batch, K·d)
        x, w = gl_pieces(edges, order, refine)
        z = x.unsqueeze(-1) - theta.unsqueeze(-2)                       # (*batch, N, d)
        if rank is not None:
            z = _kink_sides(z, rank, kinks, order * refine)
        log_cdf = noise.log_cdf(z)
        if floor:
            log_cdf = log_cdf.clamp_min(_LOG_TINY64)
        return _Terms(w.expand_as(x), noise.log_prob(z), log_cdf, lo[..., 0])
    low, high = (float(s) for s in noise.support)
    at = torch.cat([theta + k for k in (low, high) + kinks], -1)       # (*batch, K·d)
    edges, perm = at.sort(dim=-1, stable=True)
    rank = torch.empty_like(perm).scatter_(
        -1, perm, torch.arange(perm.shape[-1], device=perm.device).expand_as(perm))
    x, w = gl_pieces(edges, order, refine)
    piece = torch.arange(edges.shape[-1] - 1, device=x.device).repeat_interleave(order * refine)
    piece = piece.view(*(1,) * (x.ndim - 1), -1, 1)                    # (..., N, 1)
    before = piece < rank[..., None, :d]              # piece left of θ_j + low: F = 0, f = 0
    after = piece >= rank[..., None, d:2 * d]         # piece right of θ_j + high: F = 1, f = 0
    z = (x.unsqueeze(-1) - theta.unsqueeze(-2)).clamp(low, high)       # (*batch, N, d)
    log_f = torch.where(before | after, torch.full_like(z, -math.inf), noise.log_prob(z))
    zero = _LOG_TINY64 if floor else -math.inf
    log_cdf = torch.log(noise.cdf(z).clamp_min(_TINY64 if floor else 0.0))
    log_cdf = torch.where(after, torch.zeros_like(z), log_cdf)
    log_cdf = torch.where(before, torch.full_like(z, zero), log_cdf)
    return _Terms(w, log_f, log_cdf, edges[..., 0])


def _kink_sides(z: torch.Tensor, rank: torch.Tensor, kinks: tuple[float, ...],
                per_piece: int) -> torch.Tensor:
    """``z = x − θ_j`` put on the side of each kink ``k`` that the sorted edges say (the piece of
    the node before or after the edge ``θ_j + k``, by its rank), one ulp away from ``k``.

    Only zero-length pieces, at tied kinks, change: there every node sits on the kink, and the
    jump of the density must be seen on the side the sort placed it, so that the derivative of
    the moving edges (Leibniz' boundary terms) reaches the coordinate whose kink it is.
    ``rank``: ``(*batch, K·d)`` positions of the kinks among the sorted edges."""
    d = z.shape[-1]
    piece = torch.arange(z.shape[-2], device=z.device) // per_piece
    piece = piece.view(*(1,) * (z.ndim - 2), -1, 1)                   # (..., N, 1)
    for q, k in enumerate(kinks):
        left = piece < rank[..., None, q * d:(q + 1) * d]
        z = torch.where(left, z.clamp(max=math.nextafter(k, -math.inf)),
                        z.clamp(min=math.nextafter(k, math.inf)))
    return z


# ---------------------------------------------------------------------------------------------
# the three consumers


def argmax_probs(noise: "Noise", theta: torch.Tensor) -> torch.Tensor:
    """``P(argmax_i(θ_i + ε_i) = i)`` over the last dim of ``theta`` ``(*batch, d)``, ``d ≥ 2``.

    ``cover="max"``; the leave-one-out product is ``exp(Σ_j log F_j − log F_i)`` (every term is
    bounded below on the grid, so there is no cancellation to speak of). Differentiable by
    autograd; float64 inside, cast back to ``theta``'s dtype.
    """
    th = theta.to(_F64)
    th = th - th.detach().amax(-1, keepdim=True)
    w, log_f, log_cdf, _ = _terms(noise, th)
    total = log_cdf.sum(-1, keepdim=True)
    g = torch.exp(log_f + (total - log_cdf))
    return (w.unsqueeze(-1) * g).sum(-2).to(theta.dtype)


def expected_max(noise: "Noise", theta: torch.Tensor) -> torch.Tensor:
    """``E[max_i(θ_i + ε_i)] = a + ∫_a^∞ (1 − F_max(x)) dx − ∫_{−∞}^a F_max(x) dx``.

    ``a`` is the grid's lower end, where ``F_max(a)`` is below ``_TAIL`` (zero for bounded
    noise), so the last term and the tail beyond the grid are neglected (each below ``_TAIL``
    times the noise scale). Last dim of ``theta``; differentiable by autograd.
    """
    th = theta.to(_F64)
    shift = th.detach().amax(-1, keepdim=True)
    th = th - shift
    w, _, log_cdf, a = _terms(noise, th)
    log_fmax = log_cdf.sum(-1)                                          # (*batch, N)
    return (shift[..., 0] + (a + (w * -torch.expm1(log_fmax)).sum(-1))).to(theta.dtype)


def log_argmax_probs(noise: "Noise", theta: torch.Tensor, *, hessian: bool = True,
                     refine: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(p, log p, H)`` with ``H = ∂p/∂θ`` (symmetric, rows summing to 0), in float64.

    ``cover="all"``, exact zeros kept: ``log p_i = logsumexp_x(log w + Σ_j log F_j + log f_i −
    log F_i)``, relative accuracy for tiny ``p_i``. ``H`` off the diagonal is
    ``−∫ f_i f_j Π_{k≠i,j} F_k = −Σ_x g_i g_j`` with ``g = sqrt(w Π F)·f/F``; the diagonal makes
    rows sum to zero. ``refine`` splits every panel (the error estimate of the checks). No
    autograd. Shape: ``theta`` ``(*batch, d)`` → ``(*batch, d)``, ``(*batch, d)``,
    ``(*batch, d, d)``.
    """
    th = theta.detach().to(_F64)
    th = th - th.amax(-1, keepdim=True)
    w, log_f, log_cdf, _ = _terms(noise, th, cover="all", refine=refine, floor=False)
    ninf = -math.inf
    log_f = log_f.nan_to_num(nan=ninf, neginf=ninf)
    log_r = torch.where(torch.isneginf(log_f), torch.full_like(log_f, ninf), log_f - log_cdf)
    log_r = log_r.nan_to_num(nan=ninf, posinf=ninf, neginf=ninf)        # log(f/F), (*b, N, d)
    log_wp = torch.log(w) + log_cdf.sum(-1)                             # log(w Π F), (*b, N)
    log_p = torch.logsumexp(log_wp.unsqueeze(-1) + log_r, dim=-2)
    p = log_p.exp()
    if not hessian:
        return p, log_p, None
    g = torch.exp(0.5 * log_wp.unsqueeze(-1) + log_r).nan_to_num(0.0)
    m = g.transpose(-1, -2) @ g                                         # ∫ f_i f_j Π_{k≠i,j} F_k
    m = m - torch.diag_embed(m.diagonal(dim1=-2, dim2=-1))
    return p, log_p, torch.diag_embed(m.sum(-1)) - m
