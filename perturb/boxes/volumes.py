"""Box volumes: hard, soft (softplus) and Gumbel (exact Bessel form, or its softplus approximation).

All volumes are computed as sums of per-coordinate log side lengths, never as products, so
boxes in hundreds of dimensions neither underflow nor lose their gradients; the non-log volume
is ``exp`` of the log volume.

Gumbel side length (Dasgupta et al. 2020). With the lower corner X_lo ~ MaxGumbel(μ_lo, β) and
the upper corner X_hi ~ MinGumbel(μ_hi, β), independent, and x = μ_hi − μ_lo,

    E[max(0, X_hi − X_lo)] = 2β · K0(z),    z = 2·exp(−x / (2β)),

with K0 the modified Bessel function of the second kind of order 0. (With the corners the other
way round, MinGumbel below and MaxGumbel above, this identity is false: at x = 0, β = 0.3 the
expectation is 0.415, the formula 0.068.) We evaluate it in log space through u = log z:

    log E[side] = log(2β) + g(u),    g(u) = log K0(e^u),    u = log 2 − x/(2β),
    g'(u) = −z·K1(z)/K0(z)                      (because K0' = −K1),

with g(u) = A(u) − z and q(u) = −g'(u) = B(u) + z, where A = log k0e(z) and
B = z·(k1e(z)/k0e(z) − 1) are the smooth parts (``k0e(z) = e^z K0(z)``,
``k1e(z) = e^z K1(z)``; A ≈ log(log 2 − u − γ) for small z and ½log(π/(2z)) for large z, B
increases from 0.05 at u = −20 to 1/2).

Evaluation of g and g′ (a piecewise-polynomial table, asymptotic forms beyond it, accuracy):
:mod:`perturb.boxes._bessel`.

The softplus form β·log(1 + exp(x/β − 2γ)) (``approx=True``) matches the exact one
asymptotically for x ≫ β but is several times off for separated corners: at x = −0.5, β = 0.3
it gives 0.0174 against the exact 0.0034 (x = 0: 0.082 vs 0.068).
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from perturb._autograd import once_differentiable
from perturb._math import EULER_GAMMA, exp_floored, nan_to_
from perturb._precision import full_precision
from perturb._validation import broadcasts_to, check_choice, check_tau, unreadable
from perturb.boxes._bessel import (_any, _log_k0_exp, _log_k0_exp_slope, _LogK0Exp,
                                   _LogNegGPrime)
from perturb.boxes.box import Box, _check_corner, _width

__all__ = ["gumbel_side_length", "log_gumbel_side_length", "EULER_GAMMA"]

_LOG2 = math.log(2.0)
# log softplus(y) = y - exp(y)/2 + O(exp(2y)) below this y.
_SOFTPLUS_TAIL = -30.0


def _log_gumbel_side_slope(width: torch.Tensor, beta: float | torch.Tensor, approx: bool
                           ) -> torch.Tensor:
    """log of d/dx log E[side](x) at x = ``width`` (positive for every finite x).

    exact: d/dx log(2β·K0(2e^{−x/(2β)})) = −g'(u)/(2β), u = log 2 − x/(2β);
    approx: d/dx log(β·softplus(y)) = σ(y)/(β·softplus(y)), y = x/β − 2γ.
    Differentiable (the exact form through :class:`_LogNegGPrime`).
    """
    if approx:
        y = width / beta - 2.0 * EULER_GAMMA
        return F.logsigmoid(y) - _log_softplus(y) - _log(beta)
    return _LogNegGPrime.apply(_LOG2 - width / (2.0 * beta))[0] - _log(2.0 * beta)


def _log_softplus(y: torch.Tensor) -> torch.Tensor:
    """log(softplus(y)) = log log(1 + e^y), finite for every finite y (≈ y − e^y/2 for y ≪ 0),
    ∓∞ at y = ∓∞ with finite gradients (1 and 0).

    Branch-free: with m = min(y, 0), p = y − m = max(y, 0) and v = e^{−min(|y|, 80)},

        log softplus(y) = log(p + log1p(v)·e^{min(−m, 80)}) + m,

    where the sum is log1p(e^y)/e^y ∈ [1 − e^y/2, 1] for y <= 0 and softplus(y) for y > 0 (the
    clamps at 80 change it by < 1e-34). No exponential under- or overflows (slow on x86 CPUs)
    and no ``torch.where`` (not vectorised on the CPU), forward or backward; autograd gives
    σ(y)/softplus(y), also at y = 0 (m and p share one clamp, so their one-sided derivatives
    there agree).
    """
    m = y.clamp(max=0.0)
    p = nan_to_(y - m, 0.0)   # y = −∞ (an empty side at infinity): p = 0, not NaN
    v = torch.exp((m - p).clamp(min=-80.0))
    return torch.log(p + torch.log1p(v) * torch.exp((-m).clamp(max=80.0))) + m


def _log_softplus_value(y: torch.Tensor) -> torch.Tensor:
    """log softplus(y), finite for every finite y (y − e^y/2 below y = −30, where softplus
    underflows)."""
    value = F.softplus(y).log_()
    if y.numel() and _any(y.amin() < _SOFTPLUS_TAIL):
        yt = y.clamp(max=_SOFTPLUS_TAIL)
        value = torch.where(y < _SOFTPLUS_TAIL, yt - 0.5 * exp_floored(yt), value)
    return value


def _log_softplus_grad(y: torch.Tensor) -> torch.Tensor:
    """d/dy log softplus(y) = σ(y)/softplus(y) (1 − e^y/2 below y = −30)."""
    grad = torch.sigmoid(y).div_(F.softplus(y))
    if y.numel() and _any(y.amin() < _SOFTPLUS_TAIL):
        yt = y.clamp(max=_SOFTPLUS_TAIL)
        grad = torch.where(y < _SOFTPLUS_TAIL, 1.0 - 0.5 * exp_floored(yt), grad)
    return grad


class _LogVolume(torch.autograd.Function):
    """Fused log volume Σ_i log side(x_i), x = upper − lower, for a fixed scale s > 0.

        exact=False:  side(x) = s·softplus(x/s − shift)       (soft: shift = 0; Gumbel approx:
                                                               shift = 2γ, s = β)
        exact=True:   side(x) = 2s·K0(2·exp(−x/(2s)))         (Gumbel, s = β)

    Backward: ∂/∂upper = −∂/∂lower = g · d log side/dx with
    d/dx log(s·softplus(y)) = σ(y)/(s·softplus(y)) (y = x/s − shift) and
    d/dx log K0(e^u) = q(u)/(2s) (u = log 2 − x/(2s), q = −g' as in :func:`_log_k0_exp`).
    The second output is an intermediate, returned non-differentiable for the backward: y for
    the softplus forms; for the exact form q, computed in the same pass as the value (same
    table gather) when ``slope`` is True, else u (q is then computed in the backward).
    ``slope``: whether a backward is expected (the caller knows; the forward runs without
    grad mode). Once differentiable.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(lower: torch.Tensor, upper: torch.Tensor,
                scale: float, shift: float, exact: bool, slope: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor]:
        t = _width(lower, upper)
        d = t.shape[-1]
        if exact:
            t.mul_(-0.5 / scale).add_(_LOG2)
            value, q = _log_k0_exp(t, slope=slope)
            assert value is not None  # value=True
            aux = q if q is not None else t
            const = d * math.log(2.0 * scale)
        else:
            t.mul_(1.0 / scale)
            if shift:
                t.sub_(shift)
            value = _log_softplus_value(t)
            aux = t
            const = d * math.log(scale)
        return _sum_log_sides(value).add_(const), aux

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        _, _, scale, _, exact, *rest = inputs
        _, aux = output
        ctx.mark_non_differentiable(aux)
        ctx.save_for_backward(aux)
        ctx.scale, ctx.exact = scale, exact
        ctx.is_slope = exact and (rest[0] if rest else True)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor, *_: torch.Tensor
                 ) -> tuple:
        (aux,) = ctx.saved_tensors
        if not (ctx.needs_input_grad[0] or ctx.needs_input_grad[1]):
            return None, None, None, None, None, None
        g_upper = _log_volume_backward(aux, grad_out, ctx.scale, ctx.exact, ctx.is_slope)
        g_lower = -g_upper if ctx.needs_input_grad[0] else None
        return (g_lower, (g_upper if ctx.needs_input_grad[1] else None), None, None, None,
                None)


def _log_volume_backward(aux: torch.Tensor, grad_out: torch.Tensor, scale: float, exact: bool,
                         is_slope: bool = False) -> torch.Tensor:
    """Gradient of :class:`_LogVolume` with respect to ``upper`` (``lower`` gets its negative).

    ``aux`` is the saved intermediate (y for the softplus forms; for exact, q = −g'(u) when
    ``is_slope``, else u), ``grad_out`` the incoming gradient of shape ``(*batch,)``.
    """
    if exact:
        q = aux if is_slope else _log_k0_exp_slope(aux)
        return q * (grad_out * (0.5 / scale)).unsqueeze(-1)
    g = (grad_out / scale).unsqueeze(-1)
    if unreadable(g):       # torch.func: g may be batched where aux is not (jacrev)
        return _log_softplus_grad(aux) * g
    return _log_softplus_grad(aux).mul_(g)


def _as_scale(value: float | torch.Tensor, name: str, like: torch.Tensor) -> float | torch.Tensor:
    check_tau(value, name)
    if isinstance(value, torch.Tensor):
        if not broadcasts_to(value.shape, like.shape):
            raise ValueError(f"{name} must broadcast to the corners' shape {tuple(like.shape)} "
                             f"(*batch, d) without enlarging it, got shape {tuple(value.shape)}")
        return value.to(dtype=like.dtype, device=like.device)
    return float(value)


def _log(value: float | torch.Tensor) -> float | torch.Tensor:
    return torch.log(value) if isinstance(value, torch.Tensor) else math.log(value)


def _check_corners(lower: Any, upper: Any) -> None:
    _check_corner(lower, "lower", min_ndim=0)
    _check_corner(upper, "upper", min_ndim=0)
    try:
        torch.broadcast_shapes(lower.shape, upper.shape)
    except RuntimeError:
        raise ValueError(f"lower and upper must broadcast together, got shapes "
                         f"{tuple(lower.shape)} and {tuple(upper.shape)}") from None


def log_gumbel_side_length(lower: torch.Tensor, upper: torch.Tensor,
                           beta: float | torch.Tensor = 1.0, approx: bool = False
                           ) -> torch.Tensor:
    """``log E[max(0, X_hi − X_lo)]`` for Gumbel corners; see :func:`gumbel_side_length`."""
    _check_corners(lower, upper)
    return _log_gumbel_side_length(lower, upper, beta, approx)


def _log_gumbel_side_length(lower: torch.Tensor, upper: torch.Tensor,
                            beta: float | torch.Tensor, approx: bool) -> torch.Tensor:
    beta = _as_scale(beta, "beta", lower)
    x = _width(lower, upper)
    if approx:
        return _log(beta) + _log_softplus(x / beta - 2.0 * EULER_GAMMA)
    u = _LOG2 - x / (2.0 * beta)
    return _log(2.0 * beta) + _LogK0Exp.apply(u)


def _sum_log_sides(log_sides: torch.Tensor) -> torch.Tensor:
    """Σ_i log side_i over the last dim; −inf where an empty side (log 0) meets an infinite one
    (∞ − ∞ = NaN): a box with an empty side is empty (:class:`~perturb.boxes.Box`)."""
    return nan_to_(log_sides.sum(dim=-1), -math.inf)


def gumbel_side_length(lower: torch.Tensor, upper: torch.Tensor,
                       beta: float | torch.Tensor = 1.0, approx: bool = False,
                       log: bool = False) -> torch.Tensor:
    """Expected side length of a Gumbel interval, exactly (Bessel) or by softplus.

    With X_lo ~ MaxGumbel(lower, β), X_hi ~ MinGumbel(upper, β) independent, x = upper − lower:

        exact (default):  E[max(0, X_hi − X_lo)] = 2β · K0(2·exp(−x/(2β)))
        approx=True:      β · log(1 + exp(x/β − 2γ))

    The exact form is evaluated in log space (see the module docstring) and is finite, with a
    finite gradient, for any finite separation (±1000β included). The approximation has the
    same asymptote x − 2βγ for x ≫ β but is too large for separated corners: at x = −0.5,
    β = 0.3 it gives 0.0174 against the exact 0.0034.

    Args:
        lower: the MaxGumbel locations μ_lo.
        upper: the MinGumbel locations μ_hi.
        beta: the Gumbel scale β > 0 (a number or a tensor broadcastable to the corners).
        approx: use the softplus approximation.
        log: return the log of the expected side length.

    Shape:
        ``lower``, ``upper``: ``(*batch, d)`` (broadcastable); returns the broadcast shape.

    Returns:
        The expected side lengths (or their logs), elementwise.

    Raises:
        ValueError: ``beta <= 0`` or not finite; corners that are not floating tensors, contain
            NaN, or do not broadcast together.

    Example:
        >>> gumbel_side_length(torch.tensor([0.0]), torch.tensor([0.0]), beta=0.3)
        tensor([0.0683])

    References:
        Dasgupta et al., "Improving Local Identifiability in Probabilistic Box Embeddings",
        NeurIPS 2020, arXiv:2010.04831.
    """
    out = log_gumbel_side_length(lower, upper, beta, approx=approx)
    return out if log else torch.exp(out)


def _log_hard_volume(width: torch.Tensor) -> torch.Tensor:
    """Σ log max(w, 0); −inf (with zero gradient) when any side is empty."""
    empty = (width <= 0).any(dim=-1)
    safe = torch.where(width > 0, width, torch.ones_like(width))
    logv = torch.log(safe).sum(dim=-1)
    return torch.where(empty, torch.full_like(logv, -math.inf), logv)


_METHODS = ("hard", "soft", "gumbel")


def _resolve_method(method: str | None, beta: Any, temperature: Any) -> str:
    if method is None:
        if beta is not None and temperature is not None:
            raise ValueError("give beta (Gumbel volume) or temperature (soft volume), not both")
        return "gumbel" if beta is not None else "soft" if temperature is not None else "hard"
    check_choice(method, _METHODS, "method")
    if method != "gumbel" and beta is not None:
        raise ValueError(f"beta is the Gumbel scale and is only used by method='gumbel', "
                         f"got method={method!r} and beta={beta!r}")
    if method != "soft" and temperature is not None:
        raise ValueError(f"temperature is only used by method='soft', got method={method!r} "
                         f"and temperature={temperature!r}")
    return method


def _log_volume(box: Box, method: str, beta: Any, temperature: Any, approx: bool
                ) -> torch.Tensor:
    return _log_volume_of(box.lower, box.upper, method, beta, temperature, approx)


@full_precision
def _log_volume_of(lower: torch.Tensor, upper: torch.Tensor, method: str, beta: Any,
                   temperature: Any, approx: bool) -> torch.Tensor:
    box = Box._trusted(lower, upper)
    if method == "hard":
        return _log_hard_volume(_width(box.lower, box.upper))
    if method == "soft":
        t = _as_scale(1.0 if temperature is None else temperature, "temperature", box.lower)
        if not isinstance(t, torch.Tensor):
            return _LogVolume.apply(box.lower, box.upper, t, 0.0, False)[0]
        return _sum_log_sides(_log(t) + _log_softplus(_width(box.lower, box.upper) / t))
    b = _as_scale(1.0 if beta is None else beta, "beta", box.lower)
    if not isinstance(b, torch.Tensor):
        slope = torch.is_grad_enabled() and (box.lower.requires_grad or box.upper.requires_grad)
        return _LogVolume.apply(box.lower, box.upper, b, 2.0 * EULER_GAMMA if approx else 0.0,
                                not approx, slope)[0]
    return _sum_log_sides(_log_gumbel_side_length(box.lower, box.upper, b, approx))
