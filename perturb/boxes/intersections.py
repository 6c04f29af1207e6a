"""Intersection of boxes, containment probability and overlap.

Hard intersection: ``[max(lo_a, lo_b), min(hi_a, hi_b)]``.

Gumbel intersection (max-stability). If X_lo^a ~ MaxGumbel(μ_a, β) and X_lo^b ~ MaxGumbel(μ_b, β)
are independent then P(max ≤ t) = exp(−e^{−(t−μ_a)/β} − e^{−(t−μ_b)/β}), i.e.

    max(X_lo^a, X_lo^b) ~ MaxGumbel(lse_β(μ_a, μ_b), β),   lse_β(a, b) = β·log(e^{a/β} + e^{b/β}),

and likewise min(X_hi^a, X_hi^b) ~ MinGumbel(−lse_β(−μ_hi^a, −μ_hi^b), β). So the intersection
of two Gumbel boxes is again a Gumbel box, with those corner locations, and its expected volume
has the closed form of :func:`~perturb.boxes.volume`. (This only works with MaxGumbel lower and
MinGumbel upper corners.) lse_β is computed as ``max(a, b) + β·log1p(exp(−|a − b|/β))``, exact
for any β and ±1e4 coordinates, and never below the hard corner max(a, b) (the correction is
added to it), so the Gumbel intersection lies inside the hard one exactly, in any dtype.

Containment: ``P(b ⊆ a) := E[Vol(a ∩ b)] / E[Vol(b)]``, the conditional probability of the box
model (the probability, under the uniform measure, that a point of b lies in a); for Gumbel
boxes it is the ratio of expectations (the standard Gumbel-box quantity, a first-order
approximation of E[Vol(a ∩ b)/Vol(b)]), computed as a difference of log volumes.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from perturb._autograd import once_differentiable
from perturb._math import exp_floored, log_expm1, logaddexp2, nan_to_
from perturb._math import log1mexp as _log1mexp
from perturb._validation import check_value, reads_stall, unreadable, validation_enabled
from perturb.boxes.box import Box, _broadcast_boxes
from perturb.boxes._folded_sides import folded_pairs
from perturb.boxes._nested_loss import _log1m_ratio
from perturb.boxes.expected_volumes import _log_expected_volume, _noise_reach, _resolve_noise
from perturb.boxes.volumes import (_any, _as_scale, _log, _log_gumbel_side_slope, _log_softplus,
                                  _log_volume)
from perturb.noise import Noise

__all__ = ["intersection", "containment_prob", "log_containment_prob",
           "log1m_containment_prob", "log1mexp", "overlap"]

#: A pair counts as nested when every δ_i <= _NESTED · β_vol (midpoint rule below it).
_NESTED = 1e-2


def _gap(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a − b| in a fresh buffer, 0 where a = b = ±∞ (instead of ∞ − ∞ = NaN: equal corners,
    also at infinity)."""
    return nan_to_(torch.sub(a, b).abs_(), 0.0)


def _neg_softplus_gap(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
    """−β·softplus(−|a − b|/β) ∈ [−β·log 2, 0] (c = 1/β), in one buffer: softplus with the
    negative scale −c written over |a − b| (every op but the first in place: at large sizes
    each fresh buffer costs as much as a pass). ∞ − ∞ (equal infinite corners) reads as 0."""
    return _neg_softplus_gap_(_gap(a, b), c)


def _neg_softplus_gap_(gap: torch.Tensor, c: float) -> torch.Tensor:
    """−β·softplus(−gap/β) (c = 1/β) written over a fresh ``gap = |a − b|`` buffer."""
    # F.softplus(x, beta) = log1p(exp(beta·x))/beta, here with beta = −c < 0 (x ≥ 0: never
    # above the threshold), written over its input (torch's stub does not list out=)
    if unreadable(gap):
        return torch.nn.functional.softplus(gap, -c, 20.0)
    return torch._C._nn.softplus(gap, -c, 20.0, out=gap)  # type: ignore[call-arg]


def _lse_correction(a: torch.Tensor, b: torch.Tensor, beta: float | torch.Tensor
                    ) -> torch.Tensor:
    """lse_β(a, b) − max(a, b) = β·log1p(exp(−|a − b|/β)) ∈ [0, β·log 2], for any β (a tensor
    too; :func:`_neg_softplus_gap` is the one-buffer form for a number)."""
    return beta * torch.log1p(exp_floored(_gap(a, b).neg_() / beta))


class _GumbelIntersection(torch.autograd.Function):
    """Corners of the Gumbel intersection for a fixed scale β > 0 (one node, analytic backward).

        lower = β·log(e^{lo_a/β} + e^{lo_b/β}) = max(lo_a, lo_b) + β·softplus(−|lo_a − lo_b|/β)
        upper = −β·log(e^{−hi_a/β} + e^{−hi_b/β}) = min(hi_a, hi_b) − β·softplus(−|hi_a − hi_b|/β)
        ∂lower/∂lo_a = σ((lo_a − lo_b)/β) = 1 − ∂lower/∂lo_b
        ∂upper/∂hi_a = σ((hi_b − hi_a)/β) = 1 − ∂upper/∂hi_b

    The second form adds a non-negative correction to the hard corner, so the Gumbel
    intersection lies inside the hard one exactly, after rounding too (β·logaddexp(a/β, b/β)
    rounds up to 1 ulp below max(a, b): a/β·β is not a). Equal infinite corners give that
    corner (the gap ∞ − ∞ is read as 0). The inputs must already have a common shape.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(lo_a: torch.Tensor, hi_a: torch.Tensor,
                lo_b: torch.Tensor, hi_b: torch.Tensor, beta: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
        c = 1.0 / beta
        return (torch.maximum(lo_a, lo_b).sub_(_neg_softplus_gap(lo_a, lo_b, c)),
                torch.minimum(hi_a, hi_b).add_(_neg_softplus_gap(hi_a, hi_b, c)))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        lo_a, hi_a, lo_b, hi_b, beta = inputs
        ctx.save_for_backward(lo_a, hi_a, lo_b, hi_b)
        ctx.beta = beta

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g_lower: torch.Tensor, g_upper: torch.Tensor
                 ) -> tuple:
        lo_a, hi_a, lo_b, hi_b = ctx.saved_tensors
        need = ctx.needs_input_grad
        return (*_gumbel_intersection_backward(lo_a, hi_a, lo_b, hi_b, ctx.beta, g_lower,
                                               g_upper, need[:4]), None)


def _gumbel_intersection_backward(lo_a: torch.Tensor, hi_a: torch.Tensor, lo_b: torch.Tensor,
                                  hi_b: torch.Tensor, beta: float, g_lower: torch.Tensor | None,
                                  g_upper: torch.Tensor | None,
                                  needs: tuple[bool, ...] = (True, True, True, True)) -> tuple:
    """Gradients (lo_a, hi_a, lo_b, hi_b) of :class:`_GumbelIntersection`: softmax weights
    σ(±(a − b)/β) times the incoming gradients (None where not needed)."""
    c = 1.0 / beta
    g_lo_a = g_lo_b = g_hi_a = g_hi_b = None
    # equal infinite corners (∞ − ∞ = NaN) share the gradient: weight 1/2
    if g_lower is not None and (needs[0] or needs[2]):
        w = torch.sigmoid(nan_to_((lo_a - lo_b).mul_(c), 0.0))
        g_lo_a = _times(w, g_lower)
        g_lo_b = g_lower - g_lo_a if needs[2] else None
        g_lo_a = g_lo_a if needs[0] else None
    if g_upper is not None and (needs[1] or needs[3]):
        w = torch.sigmoid(nan_to_((hi_b - hi_a).mul_(c), 0.0))
        g_hi_a = _times(w, g_upper)
        g_hi_b = g_upper - g_hi_a if needs[3] else None
        g_hi_a = g_hi_a if needs[1] else None
    return g_lo_a, g_hi_a, g_lo_b, g_hi_b


def _times(w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``w · g`` written over the fresh ``w``; a fresh product where ``g`` is batched by
    torch.func and ``w`` may not be (jacrev's vmap over the incoming gradients)."""
    return w * g if unreadable(g) else w.mul_(g)


def intersection(a: Box, b: Box, beta: float | torch.Tensor | None = None) -> Box:
    """Intersection of two batches of boxes: hard, or Gumbel with scale ``beta``::

        hard (beta=None):  lower = max(lo_a, lo_b),          upper = min(hi_a, hi_b)
        Gumbel (beta > 0): lower = β·log(e^{lo_a/β} + e^{lo_b/β}),
                           upper = −β·log(e^{−hi_a/β} + e^{−hi_b/β})

    The Gumbel form gives the locations of the intersection's corners when the lower corners
    are MaxGumbel and the upper corners MinGumbel with scale β (max-stability; see the module
    docstring). It tends to the hard one as β → 0. The result may be empty as a hard box.

    Args:
        a, b: the boxes (batch shapes broadcast).
        beta: ``None`` for the hard intersection, or the Gumbel scale β > 0.

    Shape:
        ``a``, ``b``: ``(*batch, d)``; returns a box of shape ``(*batch, d)``.

    Returns:
        The intersection box.

    Raises:
        ValueError: ``beta <= 0``; different ``d``/dtype/device; non-broadcastable batches.

    Example:
        >>> a = Box(torch.tensor([0.0]), torch.tensor([2.0]))
        >>> b = Box(torch.tensor([1.0]), torch.tensor([3.0]))
        >>> intersection(a, b).lower, intersection(a, b, beta=0.1).lower
        (tensor([1.]), tensor([1.0000]))

    References:
        Dasgupta et al. 2020, arXiv:2010.04831.
    """
    a, b = _broadcast_boxes(a, b)
    if beta is None:
        return Box._trusted(torch.maximum(a.lower, b.lower), torch.minimum(a.upper, b.upper))
    beta = _as_scale(beta, "beta", a.lower)
    if not isinstance(beta, torch.Tensor):
        return Box._trusted(*_GumbelIntersection.apply(a.lower, a.upper, b.lower, b.upper,
                                                       beta))
    return Box._trusted(torch.maximum(a.lower, b.lower) + _lse_correction(a.lower, b.lower, beta),
                        torch.minimum(a.upper, b.upper) - _lse_correction(a.upper, b.upper, beta))


def _noise_scales(noise: Noise | None, *scales: Any) -> tuple:
    """The scales :func:`_where_unbounded` adds to its cut, with the noise's reach."""
    return scales if noise is None else (*scales, _noise_reach(noise))


def _box_log_volume(box: Box, method: str, vbeta: Any, temperature: Any, approx: bool,
                    noise: Noise | None) -> torch.Tensor:
    """log E[Vol(box)] under the resolved model of :func:`_log_volumes`."""
    if noise is not None:
        return _log_expected_volume([box.lower], [box.upper], noise)
    return _log_volume(box, method, vbeta, temperature, approx)


def _log_volumes(a: Box, b: Box, beta: float | torch.Tensor | None,
                 volume_beta: float | torch.Tensor | None,
                 temperature: float | torch.Tensor | None, approx: bool,
                 noise: Noise | None = None
                 ) -> tuple[torch.Tensor, str, float | torch.Tensor | None]:
    """log E[Vol(a ∩ b)] and the resolved (method, volume scale) shared by containment and
    overlap. The volumes of ``a`` and ``b`` alone are then computed on their own batch shapes
    (not the broadcast one) and broadcast by the arithmetic. ``noise`` (resolved, not Gumbel):
    the quadrature of :mod:`perturb.boxes.expected_volumes`."""
    if noise is not None:
        a, b = _broadcast_boxes(a, b)
        return _log_expected_volume([a.lower, b.lower], [a.upper, b.upper], noise), "noise", None
    if beta is not None:
        if temperature is not None:
            raise ValueError("give beta (Gumbel boxes) or temperature (soft volumes), not both")
        method, vbeta = "gumbel", beta if volume_beta is None else volume_beta
        # the volume scale against b's own boxes (its volume is computed on b's shape), under
        # the name the caller used; β itself is checked by the intersection
        _as_scale(vbeta, "beta" if volume_beta is None else "volume_beta", b.lower)
    else:
        if volume_beta is not None:
            raise ValueError(f"volume_beta={volume_beta!r} needs a Gumbel intersection: give "
                             f"beta too")
        if approx:
            raise ValueError("approx=True is the softplus approximation of the Gumbel volume and "
                             "needs beta")
        method, vbeta = ("soft" if temperature is not None else "hard"), None
    inter = intersection(a, b, beta)
    log_inter = _log_volume(inter, method, vbeta, temperature, approx)
    return log_inter, method, vbeta


def log_containment_prob(a: Box, b: Box, beta: float | torch.Tensor | None = None,
                         volume_beta: float | torch.Tensor | None = None, *,
                         temperature: float | torch.Tensor | None = None,
                         approx: bool = False, noise: Noise | None = None) -> torch.Tensor:
    """``log P(b ⊆ a) = log E[Vol(a ∩ b)] − log E[Vol(b)]``; see :func:`containment_prob`."""
    beta, noise = _resolve_noise(noise, beta, volume_beta, temperature, approx)

    def log_p(a: Box, b: Box) -> torch.Tensor:
        log_inter, method, vbeta = _log_volumes(a, b, beta, volume_beta, temperature, approx,
                                                noise)
        log_b = _box_log_volume(b, method, vbeta, temperature, approx, noise)
        out = log_inter - log_b
        if method == "hard" or noise is not None:
            # An empty b (hard, or under noise of bounded support, whose expected volume can
            # be exactly 0) is contained in every box: P = 1 (0/0 otherwise).
            out = torch.where(torch.isneginf(log_b).expand_as(out), torch.zeros_like(out), out)
        return out

    out = _where_unbounded(log_p(a, b), a, b, log_p,
                           _noise_scales(noise, beta, volume_beta, temperature))
    return out.clamp(max=0.0)


def _where_unbounded(out: torch.Tensor, a: Box, b: Box, fn: Callable[[Box, Box], torch.Tensor],
                     scales: tuple) -> torch.Tensor:
    """``out = fn(a, b)``, its NaNs (∞/∞ or 0/0 of volumes: boxes with ±inf corners) replaced
    by the limit of ``fn`` on the boxes cut to the cube [−R, R]^d as R → ∞ (:class:`Box`), and
    what is NaN even then (0/0 of boxes empty at infinity) by 0: log 1, an empty box is
    contained.

    R = 4·(M + s + 1)/eps, with M the largest finite |corner| and s the sum of the scales (β,
    T): the cut moves no finite corner and the ratios are at their limit to rounding (a ratio
    that tends to 0 comes out O(1/R)). The pairs with a NaN are recomputed with their boxes cut
    (the first computation is dropped for them, so its infinite derivatives never meet the
    backward pass). Only where needed: one host read of ``isnan(out).any()`` on the CPU; on
    CUDA, under ``torch.compile`` and inside ``torch.func`` (no host reads there) every call
    computes ``fn`` a second time.
    """
    nan = torch.isnan(out)
    if not _any(nan.any()):
        return out
    corners = torch.broadcast_tensors(a.lower, a.upper, b.lower, b.upper)
    with torch.no_grad():
        m = torch.stack([torch.where(torch.isfinite(c), c.abs(), 0.0).amax() if c.numel()
                         else c.new_zeros(()) for c in corners]).amax()
        for s in scales:
            if s is not None:
                m = m + (s.detach().amax().to(m) if isinstance(s, torch.Tensor) else float(s))
        r = 4.0 * (m + 1.0) / torch.finfo(out.dtype).eps
    rows = nan.reshape(*nan.shape, 1).expand(corners[0].shape)
    cut = [torch.where(rows, c.clamp(-r, r), c) for c in corners]
    limit = fn(Box._trusted(cut[0], cut[1]), Box._trusted(cut[2], cut[3]))
    if unreadable(out):     # torch.func: a where, which keeps the gradient at ±inf entries
        return torch.where(torch.isnan(limit), 0.0, limit)
    return nan_to_(limit, 0.0)


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 − exp(x)) for x ≤ 0, stably (Mächler 2012): log(−expm1(x)) for x > −log 2,
    log1p(−exp(x)) otherwise. ``-inf`` at x = 0.

    Shape:
        any; elementwise.

    Raises:
        ValueError: ``x`` not a floating tensor, or (while validation is enabled) an entry > 0
            or NaN, where 1 − exp(x) < 0 has no real log.
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"x must be a floating-point tensor, got "
                         f"{getattr(x, 'dtype', type(x).__name__)}")
    if validation_enabled() and x.numel():
        check_value((x.detach() <= 0).all(), "x must be <= 0 everywhere (log(1 − exp(x)) is "
                    "not real for x > 0) and not NaN")
    return _log1mexp(x)


def _log1m_nested(a: Box, b: Box, beta: float | torch.Tensor, vbeta: float | torch.Tensor,
                  approx: bool, dense: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(nested, log(1 − P))`` for Gumbel boxes: the mask of the pairs with every
    δ_i <= 1e-2·β_vol, and log(1 − P(b ⊆ a)) by the first-order form, on those pairs only
    (``dense=False``, boolean indexing) or on every pair, meaningful where ``nested``
    (``dense=True``: no data-dependent shapes, so no host read; what
    :func:`_log1m_containment` picks where reads stall, i.e. on CUDA, under ``torch.compile``
    and inside ``torch.func``).

    The Gumbel intersection's side i is b's side w_i shortened by
    δ_i = β·softplus((lo_a − lo_b)/β) + β·softplus((hi_b − hi_a)/β) > 0, so with L the log
    expected side, −log P = Σ_i [L(w_i) − L(w_i − δ_i)] = Σ_i δ_i·L′(w_i − δ_i/2)·(1 + ε_i)
    (midpoint rule; ε_i = O((δ_i/β_vol)²), as the derivatives of L scale with 1/β_vol). Hence
    log(−log P) = s = logsumexp_i(log δ_i + log L′(w_i − δ_i/2)), where log δ_i = log β +
    log softplus(·) never underflows, and log(1 − P) = log(1 − exp(−e^s)).
    """
    a, b = _broadcast_boxes(a, b)
    # equal infinite corners (∞ − ∞) are equal corners: y = 0
    y_lo = nan_to_((a.lower - b.lower) / beta, 0.0)
    y_hi = nan_to_((b.upper - a.upper) / beta, 0.0)
    full = y_lo.shape
    if dense:
        log_delta = logaddexp2(_log_softplus(y_lo), _log_softplus(y_hi)) + _log(beta)
        over = log_delta - _log(_NESTED * vbeta)
        nested = over.amax(dim=-1) <= 0
        # the pairs that are not nested get a harmless log δ (in the nested regime) and width
        # (1: not an infinite one of an unbounded b), so that their unused branch has finite
        # values and gradients (they are multiplied by 0)
        # (log δ − over at its positive entries is log(1e-2·β_vol); taken as that, not as the
        # difference, which is ∞ − ∞ for the infinite y of an unbounded pair)
        cap = torch.zeros_like(over) + _log(_NESTED * vbeta)
        safe = torch.where(nested.unsqueeze(-1) | (over <= 0), log_delta, cap)
        width = torch.where(nested.unsqueeze(-1), (b.upper - b.lower).expand(full), 1.0)
        return nested, _log1m_first_order(safe, width, vbeta, approx)
    # δ_i > β·softplus(y) for y = y_lo and y = y_hi, so δ_i <= c = 1e-2·β_vol needs both
    # y < softplus⁻¹(c/β) = log(expm1(c/β)): a cheap test of every pair (a little loose),
    # the exact one (two log softplus per coordinate) only for the pairs that pass it
    ratio = _NESTED * vbeta / beta
    bound = log_expm1(ratio) + 1e-3
    if isinstance(bound, torch.Tensor) and bound.ndim:    # a bound per coordinate
        cand = (torch.maximum(y_lo, y_hi) <= bound).all(dim=-1)
    else:   # amax, then compare: ``all`` over a bool tensor is ~10× slower on the CPU; y has
        cand = torch.maximum(y_lo, y_hi).amax(dim=-1) <= bound     # no NaN (nan_to_ above)
    if not bool(cand.any()):        # the common case: no pair near nesting, nothing to add
        return cand, y_lo.new_empty(0)

    def pick(t: Any, mask: torch.Tensor) -> Any:
        return t.expand(full)[mask] if isinstance(t, torch.Tensor) and t.ndim else t

    beta_c, vbeta_c = pick(beta, cand), pick(vbeta, cand)
    # logaddexp2: torch.logaddexp's backward takes exp of gaps ≪ −88 (slow, _math.exp_floored)
    log_delta = logaddexp2(_log_softplus(y_lo[cand]), _log_softplus(y_hi[cand])) + _log(beta_c)
    inner = (log_delta - _log(_NESTED * vbeta_c)).amax(dim=-1) <= 0
    nested = cand.clone()
    nested[cand] = inner
    if isinstance(vbeta_c, torch.Tensor) and vbeta_c.ndim:
        vbeta_c = vbeta_c[inner]
    width = (b.upper - b.lower).expand(full)[cand][inner]
    return nested, _log1m_first_order(log_delta[inner], width, vbeta_c, approx)


def _log1m_first_order(log_delta: torch.Tensor, width: torch.Tensor,
                       vbeta: float | torch.Tensor, approx: bool) -> torch.Tensor:
    """log(1 − P) = log(1 − exp(−e^s)), s = logsumexp_i(log δ_i + log L′(w_i − δ_i/2)), over
    the last dimension (:func:`_log1m_nested`)."""
    mid = width - 0.5 * exp_floored(log_delta)
    s = torch.logsumexp(log_delta + _log_gumbel_side_slope(mid, vbeta, approx), dim=-1)
    # log(1 − e^{−t}), t = e^s, is s − t/2 + O(t²): s itself below t = 2e-9
    return torch.where(s < -20.0, s, torch.log(-torch.expm1(-torch.exp(s.clamp(min=-20.0)))))


def _merge_nested(far: torch.Tensor, nested: torch.Tensor, near: torch.Tensor) -> torch.Tensor:
    """``far`` with the entries where ``nested`` replaced by ``near`` (differentiably)."""
    if not bool(nested.any()):
        return far
    return far.reshape(-1).index_put((nested.reshape(-1),), near).reshape(far.shape)


def log1m_containment_prob(a: Box, b: Box, beta: float | torch.Tensor | None = None,
                           volume_beta: float | torch.Tensor | None = None, *,
                           temperature: float | torch.Tensor | None = None,
                           approx: bool = False, noise: Noise | None = None) -> torch.Tensor:
    """``log(1 − P(b ⊆ a))``, accurate also when ``b`` lies deep inside ``a``.

    This is the loss −log(1 − P) of a *negative* pair. Computed from log P it breaks down
    where it matters: for Gumbel boxes P = 1 − O(e^{−Δ/β}) when b is nested Δ deep in a,
    which rounds to 1 (float32: Δ > 16β) and leaves a wrongly nested negative pair with a
    constant loss and a zero gradient, the flat region Gumbel boxes exist to remove. Here, for
    Gumbel boxes whose intersection shortens every side of b by at most 1e-2·β_vol, −log P is
    evaluated as Σ_i δ_i·L′(w_i − δ_i/2) in log space (δ_i: how much the intersection shortens
    side i; L: the log expected side; midpoint rule, relative error below 1e-5), so log(1 − P)
    is finite with a non-zero gradient at any finite depth. Elsewhere it is log1mexp(log P).
    Hard and soft boxes have a hard intersection: for them a nested pair has P = 1 exactly and
    the result is −inf, the true value.
    With another ``noise`` (:func:`~perturb.boxes.expected_volume`) the part of each side of b
    that the intersection loses is integrated directly in log space, so nested pairs keep
    their value and gradient for every noise.

    Args, modes and shapes as :func:`containment_prob`; returns ``(*batch,)``, values <= 0.

    Example:
        >>> a = Box(torch.zeros(2), torch.ones(2))
        >>> b = Box(torch.full((2,), 0.4), torch.full((2,), 0.6))
        >>> log_containment_prob(a, b, beta=0.01)      # P rounds to 1 in float32
        tensor(0.)
        >>> log1m_containment_prob(a, b, beta=0.01)
        tensor(-41.5500)

    See Also:
        - :func:`perturb.boxes.log_containment_prob`: log P
        - :func:`perturb.boxes.containment_loss`: the loss built from both
    """
    beta, noise = _resolve_noise(noise, beta, volume_beta, temperature, approx)
    if noise is not None:
        return _log1m_noise(a, b, noise)
    log_p = log_containment_prob(a, b, beta, volume_beta, temperature=temperature,
                                 approx=approx)
    return _log1m_containment(log_p, a, b, beta,
                              beta if volume_beta is None else volume_beta, approx)


def _log1m_noise(a: Box, b: Box, noise: Noise) -> torch.Tensor:
    """log(1 − P) under a quadrature noise: the direct integral of what b loses in the
    intersection (:func:`~perturb.boxes._nested_loss._log1m_ratio`) for pairs with finite
    corners, ``log1mexp(log P)`` for the unbounded ones (their limit; log P is computed only
    when there are such pairs)."""
    a, b = _broadcast_boxes(a, b)
    corners = (a.lower, a.upper, b.lower, b.upper)
    finite = torch.stack([torch.isfinite(c).all(-1) for c in corners]).all(0)
    far = None
    if _any((~finite).any()):
        a_far, b_far = a, b
        if unreadable(finite):
            # inside torch.func every row takes this branch: the finite rows (dropped below)
            # as a pair with 0 < P < 1, so that their gradients through it are 0, not 0·inf
            unb = [torch.where(finite.unsqueeze(-1), fill, c)
                   for c, fill in zip(corners, (0.0, 1.0, 0.5, 1.5))]
            a_far, b_far = Box._trusted(unb[0], unb[1]), Box._trusted(unb[2], unb[3])
        far = _log1m_containment(log_containment_prob(a_far, b_far, noise=noise), a_far, b_far,
                                 None, None, False)
        if not _any(finite.any()):
            return far
    rows = finite.unsqueeze(-1)
    safe = [torch.where(rows, c, fill).to(torch.float64)
            for c, fill in zip(corners, (0.0, 1.0, 0.0, 1.0))]
    if unreadable(finite):      # torch.func: the eager engine, folded (one node)
        near = folded_pairs(_log1m_ratio, noise, *safe).to(a.dtype)
    else:
        near = _log1m_ratio(safe[0], safe[1], safe[2], safe[3], noise).to(a.dtype)
    return near if far is None else torch.where(finite, near, far)


def _log1m_containment(log_p: torch.Tensor, a: Box, b: Box, beta: float | torch.Tensor | None,
                       vbeta: float | torch.Tensor | None, approx: bool,
                       dense: bool | None = None) -> torch.Tensor:
    """log(1 − P(b ⊆ a)) given log P (:func:`log1m_containment_prob`; ``beta=None``: hard
    intersection, log1mexp only)."""
    inside = log_p < 0       # P = 1 exactly: -inf, with a zero (not NaN) gradient
    far = torch.where(inside, _log1mexp(torch.where(inside, log_p, torch.full_like(log_p, -1.0))),
                      torch.full_like(log_p, -math.inf))
    if beta is None or vbeta is None:  # vbeta defaults to beta: both set or both None
        return far
    if dense is None:
        dense = reads_stall(log_p)
    nested, near = _log1m_nested(a, b, beta, vbeta, approx, dense)
    if dense:                   # one value per pair: no data-dependent shape, no host read
        return torch.where(nested.expand_as(far), near.expand_as(far), far)
    return _merge_nested(far, nested.expand_as(far), near)


def containment_prob(a: Box, b: Box, beta: float | torch.Tensor | None = None,
                     volume_beta: float | torch.Tensor | None = None, *,
                     temperature: float | torch.Tensor | None = None, approx: bool = False,
                     log: bool = False, noise: Noise | None = None) -> torch.Tensor:
    """Probability that ``b`` is contained in ``a``: ``P(b ⊆ a) = E[Vol(a ∩ b)] / E[Vol(b)]``.

    Under the uniform measure this is the conditional probability P(a | b) of the box model:
    the fraction of b's volume that lies in a (1 when b ⊆ a, 0 when they are disjoint, for
    hard boxes). For Gumbel boxes both volumes are expected volumes (intersection with scale
    ``beta``, volumes with scale ``volume_beta``, default ``beta``; box-embeddings calls them
    intersection and volume temperatures); the ratio of expectations is the standard Gumbel-box
    quantity, not E[Vol(a ∩ b)/Vol(b)] and not the probability of the event {B ⊆ A} for random
    corners. Computed in log space, so it stays accurate for tiny volumes in high dimension.

    Modes: ``beta`` given: Gumbel boxes (``approx=True`` uses the softplus volume); ``beta=None``
    and ``temperature`` given: hard intersection, soft volumes; neither: hard boxes (an empty
    ``b`` counts as contained: P = 1).

    Args:
        a: the containing ("parent") boxes.
        b: the contained ("child") boxes.
        beta: Gumbel intersection scale, or None.
        volume_beta: Gumbel volume scale (default: ``beta``).
        temperature: softplus volume temperature for soft boxes (``beta=None`` only).
        approx: softplus approximation of the Gumbel volume.
        log: return ``log P`` (as :func:`log_containment_prob`).
        noise: instead of ``beta``/``temperature``, a :class:`~perturb.noise.Noise` perturbing
            every corner (lower ``+ε``, upper ``−ε'``): both volumes are the expected volumes
            of :func:`~perturb.boxes.expected_volume` (``Gumbel(scale=β)`` is ``beta=β``;
            Normal, Logistic and user noises by quadrature).

    Shape:
        ``a``, ``b``: ``(*batch, d)`` (batch shapes broadcast); returns ``(*batch,)``.

    Returns:
        P(b ⊆ a) in [0, 1] (or its log, ≤ 0).

    Raises:
        ValueError: β, T <= 0; ``beta`` and ``temperature`` both given; ``volume_beta`` or
            ``approx`` without ``beta``; ``noise`` with any of them, or a noise without a CDF
            (:func:`~perturb.boxes.expected_volume`); mismatched boxes.

    Example:
        >>> a = Box(torch.zeros(2), torch.ones(2))
        >>> b = Box(torch.full((2,), 0.2), torch.full((2,), 0.8))
        >>> containment_prob(a, b), containment_prob(a, b, beta=0.1)
        (tensor(1.), tensor(0.8999))

    References:
        Vilnis et al. 2018, arXiv:1805.06627; Dasgupta et al. 2020, arXiv:2010.04831.

    See Also:
        - :func:`perturb.boxes.log_containment_prob`: its logarithm
        - :func:`perturb.boxes.log1m_containment_prob`: log(1 − P), accurate for nested pairs
        - :func:`perturb.boxes.overlap`: the symmetric score
    """
    out = log_containment_prob(a, b, beta, volume_beta, temperature=temperature, approx=approx,
                               noise=noise)
    return out if log else torch.exp(out)


def overlap(a: Box, b: Box, beta: float | torch.Tensor | None = None,
            volume_beta: float | torch.Tensor | None = None, *,
            temperature: float | torch.Tensor | None = None, approx: bool = False,
            log: bool = False, noise: Noise | None = None) -> torch.Tensor:
    """Jaccard-type overlap ``E[Vol(a ∩ b)] / (E[Vol(a)] + E[Vol(b)] − E[Vol(a ∩ b)])``.

    The intersection volume over the (inclusion-exclusion) union volume: 1 for identical hard
    boxes, 0 for disjoint ones. It is a ratio of volumes, **not** the probability
    P(a ∩ b ≠ ∅) that random boxes meet. Symmetric in ``a`` and ``b``. Computed in log space:
    ``log U = lse(la, lb) + log(1 − exp(li − lse(la, lb)))``. For two empty hard boxes it is 0.

    Args:
        a, b: the boxes.
        beta, volume_beta, temperature, approx, noise: as in :func:`containment_prob`.
        log: return the log overlap.

    Shape:
        ``a``, ``b``: ``(*batch, d)`` (batch shapes broadcast); returns ``(*batch,)``.

    Returns:
        The overlap ratio in [0, 1] (or its log).

    Raises:
        ValueError: as :func:`containment_prob`.

    Example:
        >>> a = Box(torch.tensor([0.0]), torch.tensor([2.0]))
        >>> b = Box(torch.tensor([1.0]), torch.tensor([3.0]))
        >>> overlap(a, b)
        tensor(0.3333)
    """
    beta, noise = _resolve_noise(noise, beta, volume_beta, temperature, approx)

    def log_overlap(a: Box, b: Box) -> torch.Tensor:
        log_inter, method, vbeta = _log_volumes(a, b, beta, volume_beta, temperature, approx,
                                                noise)
        la = _box_log_volume(a, method, vbeta, temperature, approx, noise)
        lb = _box_log_volume(b, method, vbeta, temperature, approx, noise)
        lab = torch.logaddexp(la, lb)
        # two empty boxes, or a bounded intersection in an unbounded union: overlap 0
        zero = torch.isneginf(lab) | (torch.isposinf(lab) & ~torch.isposinf(log_inter))
        unbounded = torch.isposinf(log_inter)   # ∞/∞: NaN here, the limit below
        # li <= min(la, lb) for every method, so li - lab <= -log 2: log1mexp is stable there.
        d = torch.where(zero | unbounded, -1.0, (log_inter - lab).clamp(max=-math.log(2.0)))
        out = log_inter - (lab + torch.log(-torch.expm1(d)))
        return torch.where(zero, -math.inf, torch.where(unbounded, math.nan, out))

    out = _where_unbounded(log_overlap(a, b), a, b, log_overlap,
                           _noise_scales(noise, beta, volume_beta, temperature))
    return out if log else torch.exp(out)
