"""Private quadrature machinery behind :mod:`perturb.noise` (and :mod:`perturb._identify`).

The generic ``argmax_probs``/``expected_max`` of a continuous noise by one-dimensional
Gauss–Legendre quadrature in float64 (see the module docstring of :mod:`perturb.noise` for the
two functionals). Everything here is duck-typed on the noise: it reads ``bounded``, ``support``,
``breakpoints``, ``log_prob``, ``cdf``, ``log_cdf`` and the hooks ``_quadrature_layout`` /
``_quadrature_order`` of :class:`perturb.noise.Noise`.
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

if TYPE_CHECKING:
    from .noise import Noise

# Probability mass of max_i(θ_i + ε_i) left outside the quadrature range, on each side.
_TAIL = 1e-14
_F64 = torch.float64
_TINY64 = torch.finfo(_F64).tiny


# ---------------------------------------------------------------------------------------------
# Gauss–Legendre rules

@functools.lru_cache(maxsize=None)
def _gauss_legendre(order: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss–Legendre nodes and weights on [-1, 1] (exact for polynomials of degree 2·order−1)."""
    return np.polynomial.legendre.leggauss(order)


def _gl(order: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    t, w = _gauss_legendre(order)
    return (torch.as_tensor(t, dtype=_F64, device=device),
            torch.as_tensor(w, dtype=_F64, device=device))


def _pieces(edges: torch.Tensor, order: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gauss–Legendre nodes and weights on every interval between consecutive ``edges``."""
    t, wt = _gl(order, edges.device)
    a, b = edges[..., :-1, None], edges[..., 1:, None]
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
# the generic quadrature (continuous noise)


def _quadrature_terms(noise: "Noise", theta: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quadrature weights and the log density / log CDF terms at the nodes.

    Returns ``w`` ``(*batch, N)``, ``log_f`` and ``log_cdf`` ``(*batch, N, d)`` (the values of
    ``log f(x − θ_j)`` and ``log F(x − θ_j)`` at node ``x``, the latter never ``-inf``), and the
    grid's lower end ``a`` ``(*batch,)``. ``theta`` ``(*batch, d)`` is float64, centred.

    Unbounded noise: composite Gauss–Legendre on ``[M + lo, M + hi]`` with ``M = max θ``
    detached (the integral does not depend on where the grid sits), ``lo``/``hi`` the quantiles
    leaving mass ``_TAIL`` of the max outside; there ``F(x − θ_j) ≥ _TAIL``. Kinks of the
    density (``noise.breakpoints``) split the panels at ``x = θ_j + k``.

    Bounded noise with support ``[l, h]``: the integrands are smooth between the kinks
    ``x = θ_j + k``, ``k ∈ {l, h} ∪ breakpoints``, which are sorted (stably) into pieces with one
    Gauss–Legendre rule each. The pieces move with θ (not detached): the density jumps at the
    ends of the support, and moving the pieces is what makes the autograd derivative exact
    (Leibniz' boundary terms). Whether a piece lies inside the support of coordinate ``j`` is
    decided from the *ranks* of ``θ_j + l`` and ``θ_j + h`` in that sort, not by comparing
    floats, so that at tied scores (zero-length pieces) every term is evaluated for one and the
    same ordering of the kinks: the derivatives stay exact there too.
    """
    d = theta.shape[-1]
    kinks = tuple(float(k) for k in noise.breakpoints)
    if not noise.bounded:
        low, high, width, order = noise._quadrature_layout(d)
        n_panels = max(1, math.ceil((high - low) / width))
        m = theta.detach().amax(-1, keepdim=True)
        edges = m + torch.linspace(low, high, n_panels + 1, dtype=_F64, device=theta.device)
        lo, hi = edges[..., :1], edges[..., -1:]
        if kinks:
            at = torch.cat([theta + k for k in kinks], -1)
            at = torch.minimum(torch.maximum(at, lo), hi)
            edges = torch.cat([edges.expand(*theta.shape[:-1], -1), at], -1).sort(-1).values
        x, w = _pieces(edges, order)
        z = x.unsqueeze(-1) - theta.unsqueeze(-2)                       # (*batch, N, d)
        log_cdf = noise.log_cdf(z).clamp_min(math.log(_TINY64))
        return w.expand_as(x), noise.log_prob(z), log_cdf, lo[..., 0]
    low, high = noise.support
    order = noise._quadrature_order(d)
    at = torch.cat([theta + k for k in (low, high) + kinks], -1)       # (*batch, K·d)
    edges, perm = at.sort(dim=-1, stable=True)
    rank = torch.empty_like(perm).scatter_(
        -1, perm, torch.arange(perm.shape[-1], device=perm.device).expand_as(perm))
    x, w = _pieces(edges, order)
    piece = torch.arange(edges.shape[-1] - 1, device=x.device).repeat_interleave(order)
    piece = piece.view(*(1,) * (x.ndim - 1), -1, 1)                    # (..., N, 1)
    before = piece < rank[..., None, :d]              # piece left of θ_j + low: F = 0, f = 0
    after = piece >= rank[..., None, d:2 * d]         # piece right of θ_j + high: F = 1, f = 0
    z = (x.unsqueeze(-1) - theta.unsqueeze(-2)).clamp(low, high)       # (*batch, N, d)
    log_f = torch.where(before | after, torch.full_like(z, -math.inf), noise.log_prob(z))
    log_cdf = torch.log(noise.cdf(z).clamp_min(_TINY64))
    log_cdf = torch.where(after, torch.zeros_like(z), log_cdf)
    log_cdf = torch.where(before, torch.full_like(z, math.log(_TINY64)), log_cdf)
    return w, log_f, log_cdf, edges[..., 0]



def _quadrature_argmax_probs(noise: "Noise", theta: torch.Tensor) -> torch.Tensor:
    """``P(argmax_i(θ_i + ε_i) = i) = ∫ f(x − θ_i) Π_{j≠i} F(x − θ_j) dx`` by quadrature.

    The product of CDFs is formed in log space as ``Σ_j log F(x − θ_j) − log F(x − θ_i)``
    (every term is bounded below on the grid, so there is no cancellation to speak of).
    Works on the last dim of ``theta`` ``(*batch, d)``; float64 inside, cast back.
    """
    th = theta.to(_F64)
    th = th - th.detach().amax(-1, keepdim=True)       # translation invariance: exact nodes
    w, log_f, log_cdf, _ = _quadrature_terms(noise, th)
    total = log_cdf.sum(-1, keepdim=True)
    g = torch.exp(log_f + (total - log_cdf))
    return (w.unsqueeze(-1) * g).sum(-2).to(theta.dtype)


def _quadrature_expected_max(noise: "Noise", theta: torch.Tensor) -> torch.Tensor:
    """``E[max_i(θ_i + ε_i)] = a + ∫_a^∞ (1 − F_max(x)) dx − ∫_{−∞}^a F_max(x) dx``.

    ``F_max(x) = Π_j F(x − θ_j)``; ``a`` is the grid's lower end, where ``F_max(a)`` is below
    ``_TAIL`` (zero for bounded noise), so the last term and the tail beyond the grid are
    neglected (each below ``_TAIL`` times the noise scale). Last dim of ``theta``.
    """
    th = theta.to(_F64)
    shift = th.detach().amax(-1, keepdim=True)
    th = th - shift
    w, _, log_cdf, a = _quadrature_terms(noise, th)
    log_fmax = log_cdf.sum(-1)                                          # (*batch, N)
    return (shift[..., 0] + (a + (w * -torch.expm1(log_fmax)).sum(-1))).to(theta.dtype)
