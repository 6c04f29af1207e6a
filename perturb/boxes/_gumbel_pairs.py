"""log P(child ⊆ parent) of Gumbel boxes in one autograd node (private engine of the hierarchy
trainer's pair scores, :meth:`~perturb.boxes.hierarchy.BoxHierarchyModel.score_pairs`).

For a child box c and a parent box p with Gumbel intersection scale β and volume scale β_v
(notation of :mod:`perturb.boxes.volumes` and :mod:`perturb.boxes.intersections`),

    lo_∩ = max(lo_c, lo_p) + β·softplus(−|lo_c − lo_p|/β)
    hi_∩ = min(hi_c, hi_p) − β·softplus(−|hi_c − hi_p|/β)
    log P = min(0, Σ_i g(u_i^∩) − g(u_i^c)),    u = log 2 − w/(2β_v),  g(u) = log K0(e^u),

with w the side widths hi − lo of the intersection and of the child. The terms log(2β_v) of
the two log volumes cancel and are never formed. The gradient, with q = −g'(u) from the same
table gather as g (:func:`~perturb.boxes._bessel._log_k0_exp`) and G the incoming gradient
(0 where the clamp at 0 is active),

    ∂/∂w^∩_i = G·q(u_i^∩)/(2β_v) =: a_i,    ∂/∂w^c_i = −G·q(u_i^c)/(2β_v) =: −b_i,
    ∂/∂hi_c = a·σ_h − b,  ∂/∂hi_p = a·(1 − σ_h),  σ_h = σ((hi_p − hi_c)/β),
    ∂/∂lo_c = b − a·σ_l,  ∂/∂lo_p = −a·(1 − σ_l), σ_l = σ((lo_c − lo_p)/β),

is computed in one pass from q and the two corner gaps (the only saved tensors). Against the
composition of :func:`~perturb.boxes.intersection` and :func:`~perturb.boxes.volume` this is
one autograd node instead of a dozen and no saved intersection corners; the values agree to
rounding (tests/boxes/test__gumbel_pairs.py).

log(1 − P) of the negative pairs whose child lies nearly inside its parent (every side of
the child shortened by the intersection by δ_i <= 1e-2·β_v) is the first-order form of
:func:`~perturb.boxes.log1m_containment_prob`, also one node (:class:`_GumbelLog1mNested`):
with y_lo = (lo_p − lo_c)/β, y_hi = (hi_c − hi_p)/β, ℓ = log softplus,

    log δ_i = logaddexp(ℓ(y_lo), ℓ(y_hi)) + log β,   m_i = w^c_i − δ_i/2,
    t_i = log δ_i + H(m_i),   H(m) = log L′(m) = h(log 2 − m/(2β_v)) − log(2β_v),
    s = logsumexp_i t_i,   log(1 − P) = log(1 − exp(−e^s))   (s itself below s = −20),

(h = log q of :func:`~perturb.boxes._bessel._log_neg_g_prime`), whose gradient is, with
π = softmax(t), G_s = G·e^s/expm1(e^s) (1 below s = −20) and H′ = −h′/(2β_v),

    ∂/∂m_i = G_s·π_i·H′(m_i) =: μ_i,   ∂/∂log δ_i = G_s·π_i − μ_i·δ_i/2 =: λ_i,
    ∂/∂y = λ·σ(ℓ(y) − ℓ(y'))·ℓ′(y)  (y' the other gap),   w^c = hi_c − lo_c gets μ.

Inputs must be finite (boxes built from finite parameters); the general functions handle
infinite corners. Float32 and float64; half types go through the general path.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from perturb._autograd import once_differentiable
from perturb._math import exp_floored, log1mexp, log_expm1, logaddexp2
from perturb._validation import reads_stall
from perturb.boxes._bessel import _log_k0_exp, _log_neg_g_prime
from perturb.boxes.intersections import _NESTED, _neg_softplus_gap_
from perturb.boxes.volumes import _SOFTPLUS_TAIL, _log_softplus

_LOG2 = math.log(2.0)


def _gumbel_pair_forward(lower: torch.Tensor, upper: torch.Tensor, beta: float, vbeta: float,
                         slope: bool) -> tuple[torch.Tensor, torch.Tensor,
                                               torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """``(log_p, raw, q, d_lo, d_hi)``: the clamped and unclamped log P of the pairs
    (child ``lower[:P]``, parent ``lower[P:]``), q = −g' of the widths (``(2, P, d)``, None
    unless ``slope``) and the corner gaps lo_c − lo_p and hi_c − hi_p (``(P, d)``)."""
    n = lower.shape[0] // 2
    lo_c, lo_p = lower[:n], lower[n:]
    hi_c, hi_p = upper[:n], upper[n:]
    c = 1.0 / beta
    d_lo, d_hi = lo_c - lo_p, hi_c - hi_p
    # the intersection corners as :func:`perturb.boxes.intersection` rounds them
    lo_i = torch.maximum(lo_c, lo_p).sub_(_neg_softplus_gap_(d_lo.abs(), c))
    hi_i = torch.minimum(hi_c, hi_p).add_(_neg_softplus_gap_(d_hi.abs(), c))
    u = torch.empty((2, *d_lo.shape), dtype=lower.dtype, device=lower.device)
    torch.sub(hi_i, lo_i, out=u[0])
    torch.sub(hi_c, lo_c, out=u[1])
    u.mul_(-0.5 / vbeta).add_(_LOG2)
    g, q = _log_k0_exp(u, slope=slope)
    assert g is not None  # value=True
    sums = g.sum(dim=-1)
    raw = sums[0] - sums[1]
    return raw.clamp(max=0.0), raw, q, d_lo, d_hi


def _gumbel_pair_backward(grad: torch.Tensor, raw: torch.Tensor, q: torch.Tensor,
                          d_lo: torch.Tensor, d_hi: torch.Tensor, beta: float, vbeta: float
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients ``(lower, upper)`` (``(2P, d)``, children first) of
    :class:`_GumbelLogContainment` (module docstring) given the gradient ``grad`` of log P."""
    c = 1.0 / beta
    # the clamp at 0 passes the gradient where raw <= 0 (as torch.clamp does)
    s = torch.where(raw <= 0, grad, 0.0).mul_(0.5 / vbeta).unsqueeze(-1)
    a = q[0] * s                                     # ∂/∂ intersection width
    b = q[1] * s                                     # −∂/∂ child width
    n, d = d_lo.shape
    g_lower = torch.empty((2 * n, d), dtype=a.dtype, device=a.device)
    g_upper = torch.empty_like(g_lower)
    a_h = torch.sigmoid(d_hi.mul(-c)).mul_(a)        # a·σ((hi_p − hi_c)/β)
    torch.sub(a_h, b, out=g_upper[:n])
    torch.sub(a, a_h, out=g_upper[n:])
    a_l = torch.sigmoid(d_lo.mul(c)).mul_(a)         # a·σ((lo_c − lo_p)/β)
    torch.sub(b, a_l, out=g_lower[:n])
    torch.sub(a_l, a, out=g_lower[n:])
    return g_lower, g_upper


class _GumbelLogContainment(torch.autograd.Function):
    """log P(child ⊆ parent) of Gumbel boxes, clamped at 0 (module docstring).

    Inputs: ``lower``, ``upper`` ``(2P, d)``, the P children's corners then the P parents';
    ``beta``, ``vbeta`` numbers. Output ``(P,)``. Once differentiable.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(lower: torch.Tensor, upper: torch.Tensor, beta: float, vbeta: float,
                slope: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                             torch.Tensor, torch.Tensor]:
        log_p, raw, q, d_lo, d_hi = _gumbel_pair_forward(lower, upper, beta, vbeta, slope)
        if q is None:               # no backward expected: placeholders for the saved slots
            q = d_lo.new_empty(0)
        return log_p, raw, q, d_lo, d_hi

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        _, _, beta, vbeta, *_ = inputs
        _, raw, q, d_lo, d_hi = output
        ctx.mark_non_differentiable(raw, q, d_lo, d_hi)
        ctx.save_for_backward(raw, q, d_lo, d_hi)
        ctx.beta, ctx.vbeta = beta, vbeta

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor, *_: torch.Tensor) -> tuple:
        raw, q, d_lo, d_hi = ctx.saved_tensors
        if not (ctx.needs_input_grad[0] or ctx.needs_input_grad[1]):
            return None, None, None, None, None
        if q.numel() == 0 and raw.numel():
            raise RuntimeError("_GumbelLogContainment: forward ran with slope=False, no "
                               "backward possible")
        g_lower, g_upper = _gumbel_pair_backward(grad, raw, q, d_lo, d_hi, ctx.beta, ctx.vbeta)
        return (g_lower if ctx.needs_input_grad[0] else None,
                g_upper if ctx.needs_input_grad[1] else None, None, None, None)


def gumbel_log_containment(lower: torch.Tensor, upper: torch.Tensor, beta: float,
                           vbeta: float) -> torch.Tensor:
    """log P(child ⊆ parent), ``(P,)``, of the boxes ``[lower, upper]`` (``(2P, d)``, the P
    children then the P parents; finite, float32 or float64) for numbers β and β_v
    (:class:`_GumbelLogContainment`)."""
    return _apply(lower, upper, beta, vbeta)[0]


def _apply(lower: torch.Tensor, upper: torch.Tensor, beta: float, vbeta: float) -> tuple:
    slope = torch.is_grad_enabled() and (lower.requires_grad or upper.requires_grad)
    return _GumbelLogContainment.apply(lower, upper, float(beta), float(vbeta), slope)


def _nested_forward(lo_c: torch.Tensor, hi_c: torch.Tensor, lo_p: torch.Tensor,
                    hi_p: torch.Tensor, beta: float, vbeta: float) -> tuple:
    """``(near, nested, saved)``: the first-order log(1 − P) of every pair (module docstring;
    finite also where not nested: log δ is lowered there to the nested bound, as in the dense
    form of :func:`~perturb.boxes.intersections._log1m_nested`), whether each pair is nested,
    and the tensors of the backward."""
    y_lo = (lo_p - lo_c) / beta
    y_hi = (hi_c - hi_p) / beta
    l_lo, l_hi = _log_softplus(y_lo), _log_softplus(y_hi)
    log_delta = logaddexp2(l_lo, l_hi) + math.log(beta)
    over = log_delta - math.log(_NESTED * vbeta)
    nested = over.amax(dim=-1) <= 0
    log_delta = log_delta - over.clamp(min=0.0)               # = log δ where nested
    delta = exp_floored(log_delta)
    mid = (hi_c - lo_c) - 0.5 * delta
    h, h_slope = _log_neg_g_prime(_LOG2 - mid / (2.0 * vbeta))
    t = log_delta + h - math.log(2.0 * vbeta)
    s = torch.logsumexp(t, dim=-1)
    near = torch.where(s < -20.0, s, torch.log(-torch.expm1(-torch.exp(s.clamp(min=-20.0)))))
    return near, nested, (y_lo, y_hi, l_lo, l_hi, delta, h_slope, t, s)


def _nested_backward(grad: torch.Tensor, y_lo: torch.Tensor, y_hi: torch.Tensor,
                     l_lo: torch.Tensor, l_hi: torch.Tensor, delta: torch.Tensor,
                     h_slope: torch.Tensor, t: torch.Tensor, s: torch.Tensor, beta: float,
                     vbeta: float) -> tuple[torch.Tensor, ...]:
    """Gradients ``(lo_c, hi_c, lo_p, hi_p)`` of :class:`_GumbelLog1mNested` given the
    gradient ``grad`` of log(1 − P) (module docstring; the pairs that are not nested get the
    gradient of the lowered log δ, which their caller discards)."""
    # d/ds log(1 − exp(−e^s)) = e/expm1(e), e = e^s: 1 below s = −20 (the value is s there),
    # e·exp(−e) to 1e-23 above s = 4 (finite for any s: the pairs that are not nested may have
    # any s, and their zero gradient must stay 0)
    e = torch.exp(s.clamp(min=-20.0, max=80.0))
    ratio = torch.where(s > 4.0, e * exp_floored(-e), e / torch.expm1(e))
    g_s = torch.where(s < -20.0, grad, grad * ratio)
    g_t = torch.exp(t - s.unsqueeze(-1)).mul_(g_s.unsqueeze(-1))       # G_s·π
    mu = g_t * h_slope * (-0.5 / vbeta)                                # ∂/∂m
    lam = g_t - 0.5 * mu * delta                                       # ∂/∂log δ
    p_lo = torch.sigmoid(l_lo - l_hi)
    g_ylo = lam * p_lo * _dlog_softplus(y_lo) / beta
    g_yhi = (lam - lam * p_lo) * _dlog_softplus(y_hi) / beta
    return -g_ylo - mu, g_yhi + mu, g_ylo, -g_yhi


def _dlog_softplus(y: torch.Tensor) -> torch.Tensor:
    """d/dy log softplus(y) = σ(y)/softplus(y), 1 − e^y/2 below y = −30 (where softplus
    underflows): :func:`~perturb.boxes.volumes._log_softplus_grad` without its host read (the
    tail is selected, not tested for)."""
    tail = 1.0 - 0.5 * exp_floored(y.clamp(max=_SOFTPLUS_TAIL))
    return torch.where(y < _SOFTPLUS_TAIL, tail, torch.sigmoid(y) / F.softplus(y))


class _GumbelLog1mNested(torch.autograd.Function):
    """The first-order log(1 − P) of Gumbel pairs (child ``lo_c, hi_c``, parent
    ``lo_p, hi_p``, ``(k, d)`` each) and whether each is nested (module docstring):
    ``(near (k,), nested (k,) bool)``. Once differentiable."""

    generate_vmap_rule = True

    @staticmethod
    def forward(lo_c: torch.Tensor, hi_c: torch.Tensor, lo_p: torch.Tensor,
                hi_p: torch.Tensor, beta: float, vbeta: float) -> tuple:
        near, nested, saved = _nested_forward(lo_c, hi_c, lo_p, hi_p, beta, vbeta)
        return (near, nested, *saved)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        ctx.mark_non_differentiable(*output[1:])
        ctx.save_for_backward(*output[2:])
        ctx.beta, ctx.vbeta = inputs[4], inputs[5]

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor, *_: torch.Tensor) -> tuple:
        y_lo, y_hi, l_lo, l_hi, delta, h_slope, t, s = ctx.saved_tensors
        grads = _nested_backward(grad, y_lo, y_hi, l_lo, l_hi, delta, h_slope, t, s, ctx.beta,
                                 ctx.vbeta)
        return (*(g if need else None for g, need in zip(grads, ctx.needs_input_grad)),
                None, None)


def _log1m_far_forward(log_p: torch.Tensor) -> torch.Tensor:
    """log(1 − P) = log1mexp(log P) where log P < 0, −inf where P = 1 (the values of
    :func:`~perturb.boxes.intersections._log1m_containment` without a box model, bit for bit:
    the same :func:`~perturb._math.log1mexp` on the entries it keeps)."""
    return log1mexp(log_p).masked_fill_(~(log_p < 0), -math.inf)


def _log1m_far_backward(grad: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    """Gradient of :func:`_log1m_far_forward`: d/dx log(1 − eˣ) = −1/expm1(−x) for x < 0
    (−eˣ/(1 − eˣ) without the cancellation of 1 − eˣ near 0), 0 where P = 1."""
    slope = torch.expm1(log_p.neg()).reciprocal_().neg_()
    return grad * slope.masked_fill_(~(log_p < 0), 0.0)


class _Log1mFar(torch.autograd.Function):
    """log(1 − P) from log P <= 0 of the negative pairs (:func:`_log1m_far_forward`), one
    node: the composition's two-branch ``where`` chain records about ten autograd nodes on a
    step's 5,120 negatives. Once differentiable."""

    generate_vmap_rule = True

    @staticmethod
    def forward(log_p: torch.Tensor) -> torch.Tensor:
        return _log1m_far_forward(log_p)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        ctx.save_for_backward(inputs[0])

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (log_p,) = ctx.saved_tensors
        return _log1m_far_backward(grad, log_p)


def _nested_candidates(d_lo: torch.Tensor, d_hi: torch.Tensor, bound: float) -> torch.Tensor:
    """``max_i max(−d_lo_i, d_hi_i) <= bound`` per row of ``(k, d)`` corner gaps, as a count
    of the coordinates above the bound (a matrix-vector product of the flags, exact): the
    same mask as ``amax(dim=-1) <= bound``, about 2× faster along a short last dim."""
    over = torch.maximum(d_lo.neg(), d_hi).gt_(bound).to(d_lo.dtype)
    return (over @ over.new_ones(over.shape[-1])) == 0


def gumbel_pair_scores(lower: torch.Tensor, upper: torch.Tensor, n_pos: int, beta: float,
                       vbeta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log P, log(1 − P))`` of the pairs (child ``i``, parent ``P + i``) of the boxes
    ``[lower, upper]`` (``(2P, d)``, finite, float32 or float64): log P of every pair, and
    log(1 − P) of the pairs from ``n_pos`` on, accurate for children nested deep inside their
    parents (:func:`~perturb.boxes.log1m_containment_prob`: the first-order form where every
    side is shortened by at most 1e-2·β_v, log1mexp(log P) elsewhere).

    The nested test reads the corner gaps of the fused forward: a pair can be nested only if
    lo_p − lo_c and hi_c − hi_p are at most β·log(expm1(1e-2·β_v/β)) in every coordinate
    (the loose test of :func:`~perturb.boxes.intersections._log1m_nested`); the exact test and
    the first-order form (:class:`_GumbelLog1mNested`) run on those pairs only, gathered (one
    host read: their number). Where reads stall (CUDA, ``torch.compile``, ``torch.func``) the
    first-order form runs on every negative instead and is merged by ``where``: no host read,
    no data-dependent shape (the same values and gradients, tested).

    Shape:
        ``(P,)`` and ``(P − n_pos,)``.
    """
    log_p, _, _, d_lo, d_hi = _apply(lower, upper, beta, vbeta)
    n = log_p.shape[0]
    far = _Log1mFar.apply(log_p[n_pos:])
    bound = beta * (log_expm1(_NESTED * vbeta / beta) + 1e-3)
    cand = _nested_candidates(d_lo[n_pos:], d_hi[n_pos:], bound)
    if reads_stall(log_p):      # CUDA, compile, torch.func: every negative, merged by where
        near, nested = _GumbelLog1mNested.apply(lower[n_pos:n], upper[n_pos:n],
                                                lower[n + n_pos:], upper[n + n_pos:],
                                                float(beta), float(vbeta))[:2]
        return log_p, torch.where(nested, near, far)
    rows = cand.nonzero().squeeze(-1)
    if rows.numel() == 0:           # the common case: no negative near nesting
        return log_p, far
    ids = torch.cat([rows + n_pos, rows + (n + n_pos)])
    lo, hi = lower.index_select(0, ids), upper.index_select(0, ids)
    k = rows.shape[0]
    near, nested = _GumbelLog1mNested.apply(lo[:k], hi[:k], lo[k:], hi[k:], float(beta),
                                            float(vbeta))[:2]
    return log_p, far.index_put((rows,), torch.where(nested, near, far[rows]))
