"""Tests for perturb.boxes._logistic_sides: the closed form of the expected side of two
Logistic-perturbed boxes, against mpmath (the partial-fraction formula at 120 digits, limits by
perturbing ties by 1e-30), against the generic quadrature (a Logistic subclass, which takes it)
on hypothesis-drawn corners through every regime, against Monte Carlo, float64 gradcheck in
every regime (ties δ = 0, ε = 0 included), and finiteness of values and gradients at extreme
corners."""
from __future__ import annotations

import math

import mpmath
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from perturb.boxes import Box, expected_volume
from perturb.boxes._logistic_sides import _SMALL, logistic_log_loss, logistic_log_side2
from perturb.boxes.expected_volumes import _log_sides
from perturb.noise import Logistic

F64 = torch.float64
# hard side c, spreads δ (lowers) and ε (uppers), in units of s: every regime and its edges
CS = [-500.0, -50.0, -5.0, -1.0, -0.3, -1e-6, 0.0, 1e-6, 0.3, 1.0, 5.0, 50.0, 500.0]
SPREADS = [0.0, 1e-12, 1e-6, 0.1, 0.3, _SMALL - 0.01, _SMALL, 0.7, 1.0, 3.0, 50.0, 1000.0]


class _QuadratureLogistic(Logistic):
    """Logistic noise that is not the Logistic class: the generic quadrature."""


def _corners(rows: list[tuple[float, float, float, float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a1, a2, b1, b2)`` rows → lowers and uppers ``(2, n)``, the uppers listed in reverse
    (so that the engine's sorting is exercised)."""
    t = torch.tensor(rows, dtype=F64)
    return torch.stack([t[:, 0], t[:, 1]]), torch.stack([t[:, 3], t[:, 2]])


def _rows(offset: float = 0.0) -> list[tuple[float, float, float, float]]:
    rows = []
    for c in CS:
        for d in SPREADS:
            for e in SPREADS:
                a1 = offset
                rows.append((a1, a1 + d, a1 + d + c, a1 + d + c + e))
    return rows


def _reference(a1: float, a2: float, b1: float, b2: float) -> float:
    """log I (units of s) from the partial-fraction formula at 120 digits, on the float
    corners; a tie is split by 1e-30 (the limit, to 1e-30)."""
    with mpmath.workdps(120):
        a1_, a2_, b1_, b2_ = (mpmath.mpf(v) for v in (a1, a2, b1, b2))
        if a2_ == a1_:
            a2_ += mpmath.mpf("1e-30")
        if b2_ == b1_:
            b2_ += mpmath.mpf("1e-30")

        def q(y):
            return y / mpmath.expm1(y) if y != 0 else mpmath.mpf(1)

        num = q(b1_ - a2_) - q(b2_ - a2_) - q(b1_ - a1_) + q(b2_ - a1_)
        den = (mpmath.exp(a2_) - mpmath.exp(a1_)) * (mpmath.exp(-b1_) - mpmath.exp(-b2_))
        return float(mpmath.log(num / den))


@pytest.mark.parametrize("offset", [0.0, 1e4])
def test_against_mpmath(offset):
    """Every (c, δ, ε) of the grid (all regimes, their thresholds, ties): the log side within
    5e-15 relative (absolute below 1) of the exact value, at 0 and at corners near 1e4."""
    rows = _rows(offset)
    lo, up = _corners(rows)
    got = logistic_log_side2(lo, up, 1.0)
    for row, v in zip(rows, got.tolist()):
        want = _reference(*row)
        tol = 5e-15 * max(1.0, abs(want)) + (2e-12 if offset else 0.0)
        assert abs(v - want) <= tol, (row, v, want)


@pytest.mark.parametrize("scale", [1e-3, 0.1, 1.0])
def test_scale(scale):
    """``log(s·I)`` of the corners in units of ``s``."""
    rows = _rows()[::7]
    lo, up = _corners(rows)
    got = logistic_log_side2(lo * scale, up * scale, scale)
    want = logistic_log_side2(lo, up, 1.0) + math.log(scale)
    torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-13)


_spread = st.one_of(st.sampled_from([0.0, 1e-12, 1e-6, 0.3, 1.0, 50.0]),
                    st.floats(0.0, 5.0))
_hard = st.one_of(st.sampled_from([-500.0, -50.0, -5.0, 0.0]), st.floats(-20.0, 60.0))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(_hard, _spread, _spread, st.floats(-1e4, 1e4)), min_size=1,
                max_size=12),
       st.sampled_from([1e-3, 0.1, 1.0]), st.booleans())
def test_against_quadrature(configs, scale, nested):
    """Hypothesis-drawn corners (c, δ, ε in units of s, including disjoint c = −5, −50, −500
    and ties; the first corner anywhere in ±1e4 units; ``nested``: the second box inside the
    first): the closed form against the generic quadrature, relative error of the side below
    1e−12 (of the log side where it exceeds 1 in magnitude; absolute 2e−12 for the rounding
    of corners near 1e4)."""
    rows = []
    for c, d, e, at in configs:
        if nested:      # box 2 inside box 1: l1 ≤ l2, u2 ≤ u1; hard side c = u2 − l2 ≥ 0
            c = abs(c)
        rows.append((at, at + d, at + d + c, at + d + c + e))
    t = torch.tensor(rows, dtype=F64) * scale
    # box 1 = [a1, b2], box 2 = [a2, b1] (nested) or [a2, b2], [a1, b1] (crossed)
    lo = torch.stack([t[:, 0], t[:, 1]])
    up = torch.stack([t[:, 3], t[:, 2]]) if nested else torch.stack([t[:, 2], t[:, 3]])
    got = logistic_log_side2(lo, up, scale)
    want = _log_sides(lo, up, _QuadratureLogistic(scale))
    tol = 1e-12 * want.abs().clamp(min=1.0) + 2e-12 * (t.abs().amax(-1) / scale / 1e4)
    assert ((got - want).abs() <= tol).all(), (rows, got, want)


def test_dispatch_matches_engine():
    """expected_volume of two boxes under Logistic noise is the closed form (the sum of the
    log sides), and agrees with the quadrature (a subclass)."""
    g = torch.Generator().manual_seed(0)
    lo = torch.rand(2, 50, 4, generator=g, dtype=F64)
    up = lo + 0.05 + 0.5 * torch.rand(2, 50, 4, generator=g, dtype=F64)
    a, b = Box(lo[0], up[0]), Box(lo[1], up[1])
    got = expected_volume(a, b, noise=Logistic(0.1), log=True)
    torch.testing.assert_close(got, logistic_log_side2(lo, up, 0.1).sum(-1), rtol=0, atol=0)
    quad = expected_volume(a, b, noise=_QuadratureLogistic(0.1), log=True)
    torch.testing.assert_close(got, quad, rtol=1e-12, atol=1e-12)


def test_against_monte_carlo():
    """One crossed pair at scale 0.3: the mean of (min U − max L)+ over 400k draws within 5
    standard errors of the closed form."""
    g = torch.Generator().manual_seed(1)
    lo, up = torch.tensor([0.0, 0.2], dtype=F64), torch.tensor([1.0, 0.7], dtype=F64)
    noise = Logistic(0.3)
    n = 400_000
    eps = noise.sample((n, 4), generator=g, dtype=F64)
    low = torch.maximum(lo[0] + eps[:, 0], lo[1] + eps[:, 1])
    high = torch.minimum(up[0] - eps[:, 2], up[1] - eps[:, 3])
    side = (high - low).clamp(min=0.0)
    se = float(side.std()) / math.sqrt(n)
    want = math.exp(float(logistic_log_side2(lo.view(2, 1), up.view(2, 1), 0.3)))
    assert abs(float(side.mean()) - want) < 5 * se


@pytest.mark.parametrize("d,e,c", [(0.0, 0.0, 1.0), (0.0, 0.0, -3.0), (0.0, 0.0, 0.0),
                                   (0.0, 2.0, 0.5), (2.0, 0.0, -4.0), (0.3, 0.2, 0.1),
                                   (1e-6, 0.4, -0.7), (1.0, 2.0, 3.0), (1.0, 2.0, -30.0),
                                   (1.0, 2.0, -1.5), (0.1, 3.0, -0.2), (3.0, 4.0, -10.0),
                                   (2.0, 2.0, -2.0), (0.7, 0.0, 0.0)])
def test_gradcheck(d, e, c):
    """float64 gradcheck in every regime: both spreads small (ties δ = ε = 0 exactly), one
    small, none; c ≥ 0, c + δ + ε ≤ 0 and between; corners on a kink of the hinge."""
    a1 = torch.tensor([-0.4, 0.3, 1.1], dtype=F64)
    lo = torch.stack([a1, a1 + d]).requires_grad_()
    up = torch.stack([a1 + d + c + e, a1 + d + c]).requires_grad_()
    assert torch.autograd.gradcheck(lambda l, u: logistic_log_side2(l, u, 0.5), (lo, up),
                                    eps=1e-7, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("scale", [1e-3, 1.0])
def test_extreme_corners_finite(scale):
    """Corners ±1e4 (raw: up to 1e7 scales apart), boxes inverted and nested by 1e4, ties:
    finite log sides and gradients."""
    big = [1e4, -1e4, 10.0, 0.0]
    rows = [(a, b, u, v) for a in big for b in big for u in big for v in big]
    t = torch.tensor(rows, dtype=F64)
    lo = torch.stack([t[:, 0], t[:, 1]]).requires_grad_()
    up = torch.stack([t[:, 2], t[:, 3]]).requires_grad_()
    out = logistic_log_side2(lo, up, scale)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(lo.grad).all() and torch.isfinite(up.grad).all()


def _loss_reference(la: float, ua: float, lb: float, ub: float) -> float:
    """log ∫ g_b (1 − h_a) (units of s), breakpoints every 5 scales, with the digits that
    1 − h_a needs (h_a = 1 − e^{−300} for the deepest case)."""
    with mpmath.workdps(40 + int(max(abs(la), abs(ua)) / 2)):
        la_, ua_, lb_, ub_ = (mpmath.mpf(v) for v in (la, ua, lb, ub))

        def sig(z):
            return 1 / (1 + mpmath.exp(-z))

        def f(x):
            return sig(x - lb_) * sig(ub_ - x) * (1 - sig(x - la_) * sig(ua_ - x))

        lo, hi = min(la, ua, lb, ub) - 60, max(la, ua, lb, ub) + 60
        pts = [mpmath.mpf(lo + 5 * k) for k in range(int((hi - lo) / 5) + 2)]
        return float(mpmath.log(mpmath.quad(f, [-mpmath.inf] + pts + [mpmath.inf])))


LOSS_CASES = [(-5, 5, -1, 1), (-50, 50, -1, 1), (-30, 30, 0, 0), (0, 1, 0.2, 0.5), (0, 1, 0, 1),
              (-3, 3, 2, 4), (-1, 1, -1, 1), (0, 10, 5, 5.5), (-20, 40, -1, 30), (5, -5, 0, 1),
              (-300, 300, -5, 5), (-0.1, 0.1, -0.1, 0.1), (0, 3, 0, 3.0000001)]


def test_loss_against_mpmath():
    """What b's side loses in a ∩ b (b nested deep in a, shallowly, equal, inverted a): the
    closed form within 1e-14 relative of the integral (of 1 − h_a, so no cancellation in the
    reference either)."""
    t = torch.tensor(LOSS_CASES, dtype=F64)
    got = logistic_log_loss(t[:, 0], t[:, 1], t[:, 2], t[:, 3], 1.0)
    for row, v in zip(LOSS_CASES, got.tolist()):
        want = _loss_reference(*row)
        assert abs(v - want) <= 1e-14 * max(1.0, abs(want)), (row, v, want)


@pytest.mark.parametrize("scale", [1e-3, 0.1])
def test_log1m_against_quadrature(scale):
    """log(1 − P(b ⊆ a)) of nested and nearly nested pairs (the path of _log1m_near): the
    closed form against the quadrature (a subclass) to 1e-12 relative, with finite
    gradients; b nested deeper than the float precision of P itself included."""
    from perturb.boxes import log1m_containment_prob
    g = torch.Generator().manual_seed(2)
    lo_a = torch.rand(40, 3, generator=g, dtype=F64)
    up_a = lo_a + 0.2 + torch.rand(40, 3, generator=g, dtype=F64)
    depth = torch.tensor([0.0, 1.0, 5.0, 30.0] * 10, dtype=F64)[:, None] * scale
    lo_b = (lo_a + depth * torch.rand(40, 3, generator=g, dtype=F64)).requires_grad_()
    up_b = (up_a - depth * torch.rand(40, 3, generator=g, dtype=F64)).requires_grad_()
    a, b = Box(lo_a, up_a), Box(lo_b, up_b)
    got = log1m_containment_prob(a, b, noise=Logistic(scale))
    want = log1m_containment_prob(a, b, noise=_QuadratureLogistic(scale))
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    got.sum().backward()
    assert torch.isfinite(lo_b.grad).all() and torch.isfinite(up_b.grad).all()


@pytest.mark.parametrize("case", [(-5.0, 5.0, -1.0, 1.0), (0.0, 1.0, 0.2, 0.5),
                                  (-30.0, 30.0, 0.0, 0.0), (5.0, -5.0, 0.0, 1.0)])
def test_loss_gradcheck(case):
    """float64 gradcheck of the loss in each corner."""
    t = [torch.tensor([v], dtype=F64, requires_grad=True) for v in case]
    assert torch.autograd.gradcheck(lambda *c: logistic_log_loss(*c, 0.7), tuple(t),
                                    eps=1e-7, atol=1e-6, rtol=1e-5)


def test_switch_restores_quadrature(monkeypatch):
    """``_LOGISTIC_PAIRS_CLOSED = False`` (the bench's before path) takes the quadrature for
    pairs and the nested-pair loss; both paths agree to 1e-12. Three boxes always take it."""
    from perturb.boxes import expected_volumes as ev
    from perturb.boxes import log1m_containment_prob
    g = torch.Generator().manual_seed(3)
    lo = torch.rand(3, 20, 4, generator=g, dtype=F64)
    up = lo + 0.05 + 0.5 * torch.rand(3, 20, 4, generator=g, dtype=F64)
    boxes = [Box(lo[i], up[i]) for i in range(3)]
    inner = Box(lo[0] + 0.01, up[0] - 0.01)
    noise = Logistic(0.1)
    closed = (expected_volume(*boxes[:2], noise=noise, log=True),
              log1m_containment_prob(boxes[0], inner, noise=noise))
    calls = []
    monkeypatch.setattr(ev, "logistic_log_side2", lambda *a: calls.append(a) or 1 / 0)
    triple = expected_volume(*boxes, noise=noise, log=True)      # m = 3: never the closed form
    assert not calls and torch.isfinite(triple).all()
    monkeypatch.setattr(ev, "_LOGISTIC_PAIRS_CLOSED", False)
    quad = (expected_volume(*boxes[:2], noise=noise, log=True),
            log1m_containment_prob(boxes[0], inner, noise=noise))
    assert not calls
    for c, q in zip(closed, quad):
        torch.testing.assert_close(c, q, rtol=1e-12, atol=1e-12)
