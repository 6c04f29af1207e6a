r"""Expected volumes of boxes whose corners are perturbed by a noise object.

The box :math:`B_j = [l_j, u_j]` perturbed by a noise :math:`N` has the random corners
:math:`L_j = l_j + ε_j` and :math:`U_j = u_j − ε'_j`, all :math:`ε, ε'` independent draws of
:math:`N` (for :class:`~perturb.noise.Gumbel` noise the lower corner is MaxGumbel and the upper
MinGumbel: the Gumbel boxes of Dasgupta et al. 2020). The coordinates are independent, so the
expected volume of the intersection of :math:`B_1, …, B_m` is a product over coordinates of

.. math::

    E[(\min_j U_j − \max_j L_j)_+]
        = \int P(\max_j L_j ≤ x)\, P(\min_j U_j > x)\, dx
        = \int \prod_j F(x − l_j) \prod_j F(u_j − x)\, dx ,

(:math:`(U − L)_+ = \int 1[L ≤ x < U]\,dx` and Fubini; :math:`F` the noise's CDF, continuous).

Evaluation, per coordinate, with :math:`g = \min_j u_j − \max_j l_j` (the hard side):

- **Gumbel** noise: the closed form. Max-stability makes :math:`\max_j L_j` MaxGumbel at
  :math:`β \log \sum_j e^{l_j/β}` (and the min of the uppers MinGumbel), so the intersection is a
  Gumbel box and its side the Bessel form of :func:`perturb.boxes.gumbel_side_length`.
- **Wide sides** (:math:`g ≥ 2(h − l)` in the noise's quadrature offsets: the two ends of the
  side never meet within mass 1e-14): :math:`E[\min_j U_j] − E[\max_j L_j]`, two expected
  maxima (:meth:`perturb.noise.Noise.expected_max`), exact to its quadrature error (about
  1e-13 absolute); the side is at least :math:`g − 2h`, so no cancellation.
- **One box under Normal or Logistic noise** (the volumes of single boxes, the denominators
  of containment): the closed forms of ``perturb/boxes/_noise_sides.py`` (the side is
  ``g − S`` with ``S`` the sum of two draws).
- **Noise of bounded support** (``Uniform``, user noises with ``bounded = True``) and
  **NegativeExponential** noise: the integrand has kinks where a factor reaches 0 or 1, so it
  is integrated piece by piece between them: Gauss–Legendre per piece, exact for Uniform
  (``perturb/boxes/_bounded_sides.py``), and the closed form of a piecewise-exponential
  integrand (``perturb/boxes/_negexp_sides.py``); also the lost side of nested pairs.
- **Two boxes under Logistic noise** (the intersections of pair scores): the closed form of
  ``perturb/boxes/_logistic_sides.py`` (partial fractions of the product of four sigmoids;
  5e-15 relative against mpmath), and the loss of nested pairs in ``log(1 − P)`` likewise.
- **Other sides**: the integral above in log space (a log-sum-exp of log weights plus
  :math:`\sum_j \log F`), composite Gauss–Legendre in float64 over
  :math:`[\min(L, U) + l_N, \max(L, U) − l_N]` (:math:`L = \max_j l_j`, :math:`U = \min_j u_j`,
  :math:`l_N` the noise's lower 1e-14 quantile, all placed on the detached corners), narrowed
  onto the peak by one or two coarse locating passes (``_zoom``; under Normal noise on the
  inverted sides only, :func:`_locate_inverted`), then panels of the noise's width
  (:meth:`perturb.noise.Noise.quadrature_layout`; twice that with order 16 for Logistic,
  3.75 times with order 24 for Normal), at most 256 of them. Log space keeps the relative
  accuracy of
  the tiny sides of inverted boxes; a side inverted by more than 256 panel widths (about 600
  scales for Normal noise, where the log side is below −9·10⁴) is integrated with wider
  panels and loses it (values and gradients stay finite).

Gradients: the last pass is one autograd Function whose backward is the quadrature of the
derivative on the same nodes (``perturb/boxes/_side_integral.py``; the grid is detached: the
integrals do not depend on where it sits), so they are exact to the same tolerance; the closed
forms and the wide sides are autograd through a few elementwise ops.

Cost (bench/bench_perturbed_boxes.py, training-step row): the quadrature of a two-box side
evaluates ``log F`` at 4 × K nodes: for Normal noise at scale 0.1 and the widths of unit-cube
boxes K = 72 (3 panels of order 24) on the sides that are not inverted and 32 + 72 on the
inverted ones, ``log Φ`` from ``erfc`` (:meth:`perturb.noise.Noise._log_cdf_`, half the cost
of ``log_ndtr``) and the last pass in cache-sized blocks on the CPU. That, not the closed
forms, is what a training step with Normal boxes costs over the Gumbel closed form: a median
0.26 s (2.3× faster than the 0.60 s of log_ndtr with a locating pass on every side, same
interleaved runs on a loaded shared machine) against about 5 ms for Gumbel boxes
(bench/RESULTS.md, section perturbed_boxes). Logistic pair scores take the two-box closed form (a
training step 20–30× faster than by quadrature); three or more Logistic boxes the
quadrature (200–250 nodes per side).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from perturb._deprecation import warn_future
from perturb._validation import reads_stall, unreadable
from perturb.boxes import _bounded_sides, _negexp_sides
from perturb.boxes._bessel import _any
from perturb.boxes._folded_sides import folded_log_sides
from perturb.boxes._logistic_sides import logistic_log_side2
from perturb.boxes._noise_sides import side_closed_form
from perturb.boxes._side_integral import _log_cdf, log_side
from perturb.boxes.box import Box, _broadcast_all, _width
from perturb.boxes.volumes import (_log_gumbel_side_length, _log_hard_volume, _log_volume,
                                   _resolve_method, _sum_log_sides)
from perturb.noise import Gumbel, Logistic, NegativeExponential, Noise, Normal
from perturb.noise._args import check_noise
from perturb.noise._quadrature import gl_pieces

__all__ = ["volume", "expected_volume"]

_F64 = torch.float64
# Most panels of the log-space integral per side (see the module docstring).
_MAX_PANELS = 256
# Zoom passes onto the peak of the integrand, the log drop that bounds it, the least panels
# of a zoomed pass and the Gauss–Legendre order of the locating passes (they only find the
# peak; the last pass integrates with the noise's order). Errors against the Gumbel closed
# form and the Normal closed form stay at 1.6e-15 with 16 panels of order 20 or these
# (bench/bench_perturbed_boxes.py, tests/boxes/test_expected_volumes.py).
_ZOOMS = 2
_ZOOM_DROP = 40.0
_ZOOM_PANELS = 4
_ZOOM_ORDER = 8
# Kept nodes of every peak after which a coarse locating pass is the last one.
_RESOLVED = 8
# The sides' locating passes use _ZOOM_PANELS panels whatever the span: for a log-concave
# integrand the kept nodes bracket the e^−40 range at any resolution (:func:`_zoom`), so a
# coarse pass only shrinks less, and one deeply inverted side no longer sets the node count
# of the whole batch's locating passes.
# Rule of the last pass of the sides for the built-in families: panels of twice the noise's
# width, order 16 (their declared width and orders, 16 and 20, serve the argmax integrands).
# On random pairs and sides inverted by 3 to 100 scales the log side is within 1.2e-15
# (Normal) and 6.2e-16 (Logistic) relative of a 4× finer order-24 rule (the declared rule:
# 8.0e-16 and 6.1e-16 with order 12; twice the width with order 12 loses digits, four times
# with order 24 9.2e-15 for Logistic). Two thirds of the nodes of the declared width with
# order 12 (tests/boxes/test_expected_volumes.py). Normal (no locating pass where not
# inverted, :func:`_locate_inverted`): 3.75 widths, order 24, at least 3 panels, within
# 1.1e-15 of the 4× finer rule on those pairs and coincident corners (3.5 widths with order
# 22: 8e-15; 4.75 with 32: 2.2e-15), 9e-16 of mpmath on sides alone.
_SIDE_RULE: dict[type, tuple[float, int]] = {Normal: (3.75, 24), Logistic: (2.0, 16)}
# The least panels of a last pass without locating passes (Normal): with 1 or 2, a side
# alone (no wider side setting the batch's panels) loses digits (5e-14 relative); 3: 1e-15
_LEAST_PANELS = 3
# Logistic pairs in closed form (perturb/boxes/_logistic_sides.py); False restores the
# quadrature they took before, for bench/bench_perturbed_boxes.py's before/after rows
_LOGISTIC_PAIRS_CLOSED = True

def check_box_noise(noise: object, name: str = "noise") -> None:
    """ValueError unless ``noise`` is None or a continuous noise with a CDF and a density on
    the whole line or a bounded interval, or ``NegativeExponential`` (what the engines of this
    module integrate)."""
    if noise is None:
        return
    if isinstance(noise, type):
        check_noise(noise, name)            # the class for an instance: says what to pass
    if not isinstance(noise, Noise):
        raise ValueError(f"{name} must be a perturb.noise.Noise (e.g. Gumbel(scale=0.1), "
                         f"Normal(0.1)) or None for hard boxes, got {type(noise).__name__}")
    lacks = [flag for flag in ("continuous", "has_cdf", "has_log_prob")
             if not getattr(noise, flag)]
    if lacks:
        raise ValueError(f"{name}={noise!r} lacks {', '.join(lacks)}: expected box volumes "
                         f"integrate the noise's CDF, so they need a continuous noise with "
                         f"cdf() and log_prob()")
    if _piecewise(noise) is None and (
            noise.bounded or not all(math.isinf(float(end)) for end in noise.support)):
        raise ValueError(f"{name}={noise!r} has the support {noise.support}, bounded on one "
                         f"side only: expected box volumes are implemented for noise on the "
                         f"whole line (Gumbel, Normal, Logistic, or a user noise), on a bounded "
                         f"interval (Uniform, or a user noise with bounded = True) and for "
                         f"NegativeExponential")


def _piecewise(noise: Noise) -> Any:
    """The engine module of noise whose sides are integrated piece by piece between kinks:
    bounded support (``_bounded_sides``) or NegativeExponential (``_negexp_sides``); else
    None."""
    if _bounded_sides.is_bounded_noise(noise):
        return _bounded_sides
    return _negexp_sides if type(noise) is NegativeExponential else None


def _gumbel_log_sides(lo: torch.Tensor, up: torch.Tensor, beta: float) -> torch.Tensor:
    """Closed form: log E[side] of the Gumbel intersection of the m boxes ``(m, *batch, d)``.
    The corners are ``max + β·log Σ exp((l − max)/β)`` (the sum is >= 1 exactly), so the
    intersection is never outside the hard one by a rounding (as in ``intersection``)."""
    top, bottom = lo.amax(0), up.amin(0)
    lower = top + beta * torch.log(torch.exp((lo - top) / beta).sum(0))
    upper = bottom - beta * torch.log(torch.exp((bottom - up) / beta).sum(0))
    return _log_gumbel_side_length(lower, upper, beta, False)


def _log_sides(lo: torch.Tensor, up: torch.Tensor, noise: Noise) -> torch.Tensor:
    """log E[(min_j U_j − max_j L_j)_+] for the m boxes ``lo, up`` ``(m, *batch, d)`` (finite,
    float64), ``(*batch, d)``; the engine of the module docstring."""
    piecewise = _piecewise(noise)
    if piecewise is not None:       # bounded or NegativeExponential noise: exact pieces
        return piecewise.log_sides(lo, up, noise)
    m = lo.shape[0]
    if m == 2 and type(noise) is Logistic and _LOGISTIC_PAIRS_CLOSED:     # closed form
        return logistic_log_side2(lo, up, float(noise.scale))
    closed = side_closed_form(noise) if m == 1 else None
    if closed is not None:          # one box under Normal or Logistic noise: elementary
        return closed(up[0] - lo[0])
    layout = noise.quadrature_layout(max(m, 2))
    low, high, width = float(layout.low), float(layout.high), float(layout.width)
    left, right = lo.detach().amax(0), up.detach().amin(0)
    wide = (right - left) >= 2.0 * (high - low)
    bulk = None
    if bool(wide.any()):
        # E[min U] − E[max L], about a reference point so that far-away boxes keep their digits
        # the noise's engine: these scores come from checked boxes (no second value check)
        c = left.unsqueeze(0)
        e_max_l = noise._expected_max((lo - c).movedim(0, -1))
        e_min_u = -noise._expected_max((c - up).movedim(0, -1))
        bulk = torch.log(torch.where(wide, e_min_u - e_max_l, torch.ones_like(left)))
        if bool(wide.all()):
            return bulk
    a = torch.minimum(left, right) + low
    b = torch.maximum(left, right) - low
    a, b = torch.where(wide, left, a), torch.where(wide, left + width, b)     # unused there
    stretch, order = _SIDE_RULE.get(type(noise), (1.0, int(layout.order)))
    log_fn = lambda x: _log_g(lo, up, noise, x)                              # noqa: E731
    last = lambda x, log_w: log_side(lo, up, x, log_w, noise)                # noqa: E731
    if type(noise) is not Normal:
        direct = _log_integral(log_fn, a, b, stretch * width, order, coarse=True, last=last)
    else:
        a, b = _locate_inverted(lo, up, noise, a, b, ~wide & (right < left),
                                stretch * width, order)
        direct = _log_integral(log_fn, a, b, stretch * width, order, coarse=True, last=last,
                               locate=False)
    return direct if bulk is None else torch.where(wide, bulk, direct)


def _locate_inverted(lo: torch.Tensor, up: torch.Tensor, noise: Noise, a: torch.Tensor,
                     b: torch.Tensor, inverted: torch.Tensor, width: float, order: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """[a, b] narrowed onto the peak (:func:`_locate`) on the ``inverted`` sides only
    ``(*batch, d)``, the Normal rule of :func:`_log_sides`.

    A side that is not inverted (``min u ≥ max l``) has no narrow peak: its integrand rises
    over the noise's width at the lower corners and falls at the upper ones, so [a, b] (the
    noise's 1e-14 range about them) is already where it lives and a locating pass would keep
    nearly all of it (the log sides agree to 4e-16 with and without). Inverted sides peak
    between the ends, narrower the deeper they are inverted: those are located, on their rows
    only (one host read; on CUDA and under tracing every side). Not for Logistic noise: its
    last pass loses digits (6e-13) on the unlocated range of its exponential tails."""
    if not _any(inverted.any()):
        return a, b
    ends = lo.detach(), up.detach()
    if reads_stall(a):
        return _locate(lambda x: _log_g(*ends, noise, x), a, b, width, order, True)
    rows = inverted.nonzero(as_tuple=True)
    lo_r, up_r = ends[0][:, inverted], ends[1][:, inverted]       # the rows' order (row-major)
    a_r, b_r = _locate(lambda x: _log_g(lo_r, up_r, noise, x), a[rows], b[rows], width, order,
                       True)
    return a.index_put(rows, a_r), b.index_put(rows, b_r)


def _locate(log_fn: Callable[[torch.Tensor], torch.Tensor], a: torch.Tensor, b: torch.Tensor,
            width: float, order: int, coarse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """[a, b] narrowed onto the peak of ``exp(log_fn)`` by ``_ZOOMS`` locating passes without
    autograd (:func:`_log_integral`)."""
    def panels(a: torch.Tensor, b: torch.Tensor, least: int) -> int:
        span = float((b - a).max()) if a.numel() else 0.0         # an empty batch: any grid
        return min(_MAX_PANELS, max(least, math.ceil(span / width)))

    for i in range(_ZOOMS):
        n = _ZOOM_PANELS if coarse else panels(a, b, 1 if i == 0 else _ZOOM_PANELS)
        with torch.no_grad():
            x, _ = _nodes(a, b, n, min(order, _ZOOM_ORDER))
            a, b, kept = _zoom(x, log_fn(x), a, b)
        # a coarse pass that kept many nodes of every peak, on nodes within half a panel of
        # each other, leaves little to another (at most one panel of the last pass, and the
        # peaks are resolved); narrow peaks (inverted sides under Gumbel-like tails) zoom on
        if (coarse and i + 1 < _ZOOMS and a.numel()
                and float((x[..., -1] - x[..., 0]).max()) <= x.shape[-1] * width / 2
                and int(kept.min()) >= _RESOLVED):
            break
    return a, b


def _log_integral(log_fn: Callable[[torch.Tensor], torch.Tensor], a: torch.Tensor,
                  b: torch.Tensor, width: float, order: int, coarse: bool = False,
                  last: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                  locate: bool = True) -> torch.Tensor:
    """``log ∫_a^b exp(log_fn(x)) dx`` per element of ``a``/``b`` ``(*batch, d)``: composite
    Gauss–Legendre on panels no wider than ``width`` (at most ``_MAX_PANELS``), after
    ``_ZOOMS`` passes that narrow [a, b] onto the peak (:func:`_locate`, :func:`_zoom`;
    ``locate=False``: none, the caller located them; ``coarse``: ``_ZOOM_PANELS`` panels
    each, for log-concave integrands, else panels no wider than ``width``). ``log_fn`` maps
    nodes ``(*batch, d, K)`` to the log integrand there; ``last``, if given, maps the last
    pass's nodes and log weights to the result (a fused pass with its own backward,
    ``perturb/boxes/_side_integral.py``)."""
    if locate:
        a, b = _locate(log_fn, a, b, width, order, coarse)
    span = float((b - a).max()) if a.numel() else 0.0             # an empty batch: any grid
    least = _ZOOM_PANELS if locate else _LEAST_PANELS
    x, w = _nodes(a, b, min(_MAX_PANELS, max(least, math.ceil(span / width))), order)
    if last is not None:
        return last(x, torch.log(w))
    return torch.logsumexp(torch.log(w) + log_fn(x), dim=-1)


def _nodes(a: torch.Tensor, b: torch.Tensor, n: int, order: int
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes and weights ``(*batch, d, n·order)`` of ``n`` equal panels on [a, b]."""
    edges = a.unsqueeze(-1) + (b - a).unsqueeze(-1) * torch.linspace(
        0.0, 1.0, n + 1, dtype=_F64, device=a.device)
    return gl_pieces(edges, order)


def _log_g(lo: torch.Tensor, up: torch.Tensor, noise: Noise, x: torch.Tensor) -> torch.Tensor:
    """``Σ_j log F(x − l_j) + Σ_j log F(u_j − x)`` at nodes ``x`` ``(*batch, d, K)``."""
    return (_log_cdf(noise, x.unsqueeze(0) - lo.unsqueeze(-1)).sum(0)
            + _log_cdf(noise, up.unsqueeze(-1) - x.unsqueeze(0)).sum(0))


def _zoom(x: torch.Tensor, log_g: torch.Tensor, a: torch.Tensor, b: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The part of [a, b] where the integrand is within e^−40 of its largest node value,
    widened by one node on each side. ``log g`` is concave in x for log-concave noise (the
    built-in families), so the true peak lies within one node of the best node and the mass
    outside is below e^−40 of the total: the next pass resolves narrow peaks (Gumbel-like
    lower tails make inverted sides very peaked). Also returns the number of kept nodes."""
    k = x.shape[-1]
    idx = torch.arange(k, device=x.device)
    keep = log_g >= log_g.amax(-1, keepdim=True) - _ZOOM_DROP
    first = torch.where(keep, idx, k).amin(-1, keepdim=True)
    last = torch.where(keep, idx, -1).amax(-1, keepdim=True)
    new_a = torch.where(first > 0, x.gather(-1, (first - 1).clamp_min(0)), a.unsqueeze(-1))
    new_b = torch.where(last < k - 1, x.gather(-1, (last + 1).clamp_max(k - 1)),
                        b.unsqueeze(-1))
    return new_a.squeeze(-1), new_b.squeeze(-1), (last - first + 1).squeeze(-1)


def _log_expected_volume(lowers: list[torch.Tensor], uppers: list[torch.Tensor],
                         noise: Noise | None) -> torch.Tensor:
    """log E[vol(∩ boxes)] of checked, broadcast corners ``(*batch, d)``; ``(*batch,)``."""
    lo, up = torch.stack(lowers), torch.stack(uppers)
    if noise is None:
        return _log_hard_volume(_width(lo.amax(0), up.amin(0)))
    # ±inf corners: a lower at −inf (upper at +inf) does not constrain the side (its factor F
    # is 1); a lower at +inf or an upper at −inf empties it; with every lower at −inf (or every
    # upper at +inf) the side is infinite
    finite = torch.isfinite(lo).all() & torch.isfinite(up).all()
    # inside torch.func the finiteness cannot be read: the general path always
    general = unreadable(lo) or not bool(finite)
    if general:
        empty = (torch.isposinf(lo) | torch.isneginf(up)).any(0)
        infinite = ~empty & (torch.isneginf(lo).all(0) | torch.isposinf(up).all(0))
        special = empty | infinite
        with torch.no_grad():   # stand-ins for the unconstraining corners, beyond the noise's reach
            top = torch.where(torch.isfinite(lo), lo, -math.inf).amax(0)
            bottom = torch.where(torch.isfinite(up), up, math.inf).amin(0)
            top = torch.where(special, 0.0, top)
            bottom = torch.where(special, 1.0, bottom)
            reach = (top - bottom).abs() + 1e3 * _noise_reach(noise)
        lo = torch.where(torch.isneginf(lo), top - reach, lo)
        up = torch.where(torch.isposinf(up), bottom + reach, up)
        lo = torch.where(special, 0.0, lo)
        up = torch.where(special, 1.0, up)
    if type(noise) is Gumbel:           # the closed form (a subclass may change the law)
        sides = _gumbel_log_sides(lo, up, noise.scale)
    elif unreadable(lo):     # torch.func: the eager engine, folded into one node
        sides = folded_log_sides(lo.to(_F64), up.to(_F64), noise, _log_sides).to(lo.dtype)
    else:
        sides = _log_sides(lo.to(_F64), up.to(_F64), noise).to(lo.dtype)
    if general:
        sides = torch.where(empty, -math.inf, torch.where(infinite, math.inf, sides))
    return _sum_log_sides(sides)


def _noise_reach(noise: Noise) -> float:
    """The width of the noise's 1e-14 range: beyond it its CDF is 1 to double precision."""
    layout = noise.quadrature_layout(2)
    return float(layout.high) - float(layout.low)


def _check_boxes(boxes: tuple[Box, ...]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The corners of ``boxes`` broadcast to one batch shape (same d, dtype, device)."""
    if not boxes:
        raise ValueError("expected_volume needs at least one box")
    boxes = _broadcast_all(boxes, [f"boxes[{i}]" for i in range(len(boxes))])
    return [b.lower for b in boxes], [b.upper for b in boxes]


def expected_volume(*boxes: Box, noise: Noise | None = None, log: bool = False) -> torch.Tensor:
    r"""Expected volume of the intersection of ``boxes`` whose corners are perturbed by ``noise``.

    .. math::

        E[\mathrm{vol}(B_1 ∩ … ∩ B_m)] = \prod_{i=1}^d \int \prod_j F(x − l_{ji})
            \prod_j F(u_{ji} − x)\, dx,
        \qquad L_j = l_j + ε_j,\ U_j = u_j − ε'_j,

    with all :math:`ε, ε'` independent draws of ``noise`` (module docstring). ``Gumbel(scale=β)``
    gives the Gumbel boxes of Dasgupta et al.: the result equals
    ``volume(intersection(*boxes, beta=β), beta=β)`` (closed form, the fast path); Normal,
    Logistic and user noises are integrated by quadrature (float64, relative error ~1e-12 on
    the log volume; one box under Normal or Logistic noise and two boxes under Logistic noise
    in closed form, the latter within 5e-15 relative of mpmath); noise of bounded support
    (``Uniform``, or a user noise with ``bounded = True``) piece by piece between the kinks
    of its CDF (exact for Uniform, whose boxes can be disjoint with volume exactly 0) and
    ``NegativeExponential`` in closed form; ``noise=None`` is the zero-noise limit, the hard
    volume. The softplus ("soft") volume of Li et al.
    smooths the hard volume and is no noise's expectation: it is :func:`perturb.boxes.volume`
    with ``temperature=``.

    Args:
        *boxes: one or more :class:`~perturb.boxes.Box` (same d, dtype and device; batch shapes
            broadcast). One box gives its own expected volume.
        noise: a continuous :class:`~perturb.noise.Noise` with ``cdf`` and ``log_prob`` on
            the whole line or on a bounded interval, or ``NegativeExponential``; or None (hard
            boxes).
        log: return ``log E[vol]`` (computed in log space throughout; use it for small volumes
            in high dimension).

    Shape:
        boxes ``(*batch, d)`` → ``(*batch,)``.

    Returns:
        The expected volume (or its log), in the boxes' dtype; differentiable in the corners.
        ±inf corners: a side with a lower corner at +inf or an upper at −inf is empty (volume
        0); a side unbounded on both ends' sides is infinite.

    Raises:
        ValueError: no box, or not a Box; different d, dtype or device; batch shapes that do
            not broadcast; a noise without a CDF or a density (``Discrete``), or with a
            support bounded on one side only (other than ``NegativeExponential``).

    Example:
        >>> from perturb.noise import Gumbel, Normal
        >>> a = Box(torch.tensor([0.0, 0.0]), torch.tensor([1.0, 2.0]))
        >>> b = Box(torch.tensor([0.5, 0.5]), torch.tensor([2.0, 1.0]))
        >>> expected_volume(a, b)                              # hard: [0.5, 1] x [0.5, 1]
        tensor(0.2500)
        >>> expected_volume(a, b, noise=Normal(0.3))           # mean-zero noise: close to it
        tensor(0.2493)
        >>> expected_volume(a, b, noise=Gumbel(0.1))           # Gumbel corners shrink the box
        tensor(0.1504)

    References:
        Dasgupta et al. 2020, arXiv:2010.04831 (Gumbel boxes).

    See Also:
        - :func:`perturb.boxes.volume`: the volume of one box (Gumbel, soft or hard)
        - :func:`perturb.boxes.containment_prob`: E[vol(a ∩ b)] / E[vol(b)]
    """
    check_box_noise(noise)
    lowers, uppers = _check_boxes(boxes)
    out = _log_expected_volume(lowers, uppers, noise)
    return out if log else torch.exp(out)


def _resolve_noise(noise: Noise | None, beta: Any, volume_beta: Any, temperature: Any,
                   approx: bool) -> tuple[Any, Noise | None]:
    """``(beta, noise)`` for the containment functions: ``noise=Gumbel(scale=β)`` is the
    Gumbel path with ``beta=β`` (closed form and the nested-pair precision of
    :func:`~perturb.boxes.log1m_containment_prob`); other noises go to the quadrature of
    this module."""
    if noise is None:
        return beta, None
    check_box_noise(noise)
    given = [name for name, v in (("beta", beta), ("volume_beta", volume_beta),
                                  ("temperature", temperature)) if v is not None]
    if given or approx:
        raise ValueError(f"noise={noise!r} describes the boxes' perturbation by itself: drop "
                         f"{', '.join(given) if given else 'approx'}")
    if type(noise) is Gumbel:
        return noise.scale, None
    return None, noise


#: What to write instead of each deprecated ``method=`` string of :func:`volume`.
_METHOD_INSTEAD = {
    "gumbel": "give beta=β, or noise=Gumbel(scale=β), for the expected volume of Gumbel boxes",
    "soft": "give temperature=T: the softplus volume of Li et al. is a smoothing of the hard "
            "volume, not a noise's expectation",
    "hard": "drop it: the hard volume, the zero-noise limit, is the default",
}


def _deprecated_method(fn: str, method: str | None, beta: Any, temperature: Any
                       ) -> tuple[Any, Any]:
    """``(beta, temperature)`` meaning what a deprecated ``method=`` string of ``fn`` meant
    (after checking it against them and warning); unchanged when ``method`` is None."""
    if method is None:
        return beta, temperature
    method = _resolve_method(method, beta, temperature)
    warn_future(fn, f"method={method!r}", _METHOD_INSTEAD[method])
    if method == "gumbel" and beta is None:
        beta = 1.0
    if method == "soft" and temperature is None:
        temperature = 1.0
    return beta, temperature


def volume(box: Box, method: str | None = None, beta: float | torch.Tensor | None = None,
           temperature: float | torch.Tensor | None = None, approx: bool = False,
           log: bool = False, *, noise: Noise | None = None) -> torch.Tensor:
    """Volume of a batch of boxes: hard, expected under a corner noise, or softplus-smoothed::

        hard (default):  Π_i max(hi_i − lo_i, 0)
        Gumbel (beta=β): Π_i 2β·K0(2·exp(−(μ_hi,i − μ_lo,i)/(2β)))             (exact)
                         Π_i β·softplus((μ_hi,i − μ_lo,i)/β − 2γ)               (approx=True)
        noise=N:         E[Π_i max(0, U_i − L_i)],  L = lo + ε, U = hi − ε', ε, ε' ~ N
        soft (temperature=T): Π_i T·softplus((hi_i − lo_i)/T)                  (Li et al. 2019)

    The Gumbel volume is the expected volume of a box with MaxGumbel(μ_lo, β) lower and
    MinGumbel(μ_hi, β) upper corners (independent coordinates make it the product of the
    expected sides, :func:`gumbel_side_length`); ``beta=β`` and ``noise=Gumbel(scale=β)`` are
    the same closed form. Any other noise on the line (Normal, Logistic, a user noise with
    ``cdf`` and ``log_prob``) is integrated by quadrature (:func:`expected_volume`, about
    10–100× the closed form's cost). The hard volume is the zero-noise limit of all of them.
    The softplus ("soft") volume is no noise's expectation: it smooths the hard volume, and is
    selected by its ``temperature``. Every volume is computed as a sum of log sides;
    ``log=False`` returns its ``exp``. The hard log volume is ``-inf`` (with zero gradient) for
    an empty box. As β → 0 and T → 0 both smooth volumes tend to the hard one.

    Args:
        box: the boxes (for the noises: the corner locations).
        method: deprecated (FutureWarning; removed in 0.3): "gumbel" is ``beta=``, "soft" is
            ``temperature=``, "hard" is the default. With ``method="gumbel"`` and no ``beta``,
            β = 1.
        beta: Gumbel scale β > 0 (a float, or a tensor broadcasting against the boxes' batch).
        temperature: softplus temperature T > 0 of the soft volume.
        approx: Gumbel only: use the softplus approximation of the Bessel form.
        log: return the log volume.
        noise: a :class:`~perturb.noise.Noise` perturbing both corners (keyword only; not with
            ``beta``, ``temperature`` or ``approx``).

    Shape:
        ``box``: ``(*batch, d)``; returns ``(*batch,)``.

    Returns:
        The volumes (or log volumes). float16 / bfloat16 corners (and autocast regions) are
        computed in float32 (the Bessel functions have no half kernels) and returned in the
        corners' dtype (:mod:`perturb._precision`); the noise quadrature runs in float64.

    Raises:
        ValueError: ``box`` not a :class:`Box`; ``beta``/``temperature`` <= 0; both given;
            ``approx`` without ``beta``; ``noise`` with any of them, or a noise without a CDF
            or density, or with bounded support; an unknown ``method`` or one contradicting
            ``beta``/``temperature``.

    Example:
        >>> from perturb.noise import Normal
        >>> b = Box(torch.zeros(2), torch.tensor([1.0, 2.0]))
        >>> volume(b), volume(b, beta=0.01), volume(b, temperature=0.1)
        (tensor(2.), tensor(1.9655), tensor(2.0000))
        >>> volume(b, noise=Normal(0.5))      # mean-zero noise: E[(U − L)+] >= E[U − L]
        tensor(2.0508)

    References:
        Vilnis et al. 2018 (hard boxes); Li et al. 2019, "Smoothing the Geometry of
        Probabilistic Box Embeddings" (soft); Dasgupta et al. 2020, arXiv:2010.04831 (Gumbel).

    See Also:
        - :func:`perturb.boxes.expected_volume`: intersections of several boxes under any noise
        - :func:`perturb.boxes.gumbel_side_length`: the Gumbel side in one coordinate
    """
    if not isinstance(box, Box):
        raise ValueError(f"box must be a Box, got {type(box).__name__}")
    if noise is not None:
        if method is not None:
            raise ValueError(f"noise={noise!r} describes the boxes' perturbation by itself: "
                             f"drop method={method!r}")
        beta, noise = _resolve_noise(noise, beta, None, temperature, approx)
        if noise is not None:
            return expected_volume(box, noise=noise, log=log)
    beta, temperature = _deprecated_method("volume", method, beta, temperature)
    method = _resolve_method(None, beta, temperature)
    if approx and method != "gumbel":
        raise ValueError("approx=True is the softplus approximation of the Gumbel volume and "
                         "needs beta")
    out = _log_volume(box, method, beta, temperature, approx)
    return out if log else torch.exp(out)
