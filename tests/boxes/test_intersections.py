"""Tests of perturb/boxes/intersections.py: intersection, containment probability and overlap."""
import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from perturb.boxes import (EULER_GAMMA, Box, containment_prob, intersection,
                           log1m_containment_prob, log1mexp,
                           log_containment_prob, overlap, volume)
from perturb.boxes.intersections import _gumbel_intersection_backward, _GumbelIntersection

F64 = torch.float64


def _box(lo, hi, dtype=F64, grad=False):
    return Box(torch.tensor(lo, dtype=dtype, requires_grad=grad),
               torch.tensor(hi, dtype=dtype, requires_grad=grad))


def _max_gumbel(mu, beta, n, gen):
    """n samples of MaxGumbel(mu, beta) for each entry of mu: shape (n, *mu.shape)."""
    u = torch.rand((n, *mu.shape), generator=gen, dtype=F64)
    return mu + beta * -torch.log(-torch.log(u))


def _min_gumbel(mu, beta, n, gen):
    """MinGumbel(mu, beta) = −MaxGumbel(−mu, beta)."""
    return -_max_gumbel(-mu, beta, n, gen)


def _sample_box(box, beta, n, gen):
    return _max_gumbel(box.lower, beta, n, gen), _min_gumbel(box.upper, beta, n, gen)


# ---------------------------------------------------------------------- intersection
def test_hard_intersection_values_and_broadcasting():
    a = _box([[0.0, 0.0]], [[2.0, 1.0]])
    b = _box([[1.0, -1.0], [3.0, 0.5]], [[3.0, 0.5], [4.0, 0.7]])
    i = intersection(a, b)
    assert i.shape == (2, 2)
    torch.testing.assert_close(i.lower, torch.tensor([[1.0, 0.0], [3.0, 0.5]], dtype=F64))
    torch.testing.assert_close(i.upper, torch.tensor([[2.0, 0.5], [2.0, 0.7]], dtype=F64))
    torch.testing.assert_close(volume(i), torch.tensor([0.5, 0.0], dtype=F64))


@pytest.mark.parametrize("beta", [1e-3, 0.1, 2.0])
@pytest.mark.parametrize("tensor_beta", [False, True])
def test_gumbel_intersection_is_scaled_logsumexp(beta, tensor_beta):
    g = torch.Generator().manual_seed(0)
    lo = torch.randn(2, 5, 3, generator=g, dtype=F64)
    hi = lo + torch.rand(2, 5, 3, generator=g, dtype=F64)
    a, b = Box(lo[0], hi[0]), Box(lo[1], hi[1])
    bt = torch.tensor(beta, dtype=F64) if tensor_beta else beta
    i = intersection(a, b, beta=bt)
    torch.testing.assert_close(i.lower, beta * torch.logsumexp(lo / beta, dim=0))
    torch.testing.assert_close(i.upper, -beta * torch.logsumexp(-hi / beta, dim=0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gumbel_intersection_stable_at_large_coordinates(dtype):
    a = Box(torch.tensor([1e4, -1e4], dtype=dtype), torch.tensor([1e4 + 1, -1e4 + 1], dtype=dtype))
    b = Box(torch.tensor([1e4 + 0.5, -1e4], dtype=dtype), torch.tensor([1e4 + 2, -1e4 + 3],
                                                                       dtype=dtype))
    for beta in (1e-3, 1.0):
        i = intersection(a, b, beta=beta)
        assert bool(torch.isfinite(i.lower).all()) and bool(torch.isfinite(i.upper).all())
        assert bool((i.lower >= torch.maximum(a.lower, b.lower)).all())
        assert bool((i.lower <= torch.maximum(a.lower, b.lower) + beta * math.log(2) + 1e-2).all())
    torch.testing.assert_close(intersection(a, b, beta=1e-3).lower,
                               intersection(a, b).lower, atol=1e-3 * math.log(2) + 2e-3, rtol=0)


def test_intersection_max_stability_by_monte_carlo(generator):
    # max of MaxGumbel lower corners ~ MaxGumbel(lse_β), min of MinGumbel upper corners ~
    # MinGumbel(−lse_β(−·)): check the means and the CDF at a few points.
    beta, n = 0.4, 200_000
    a, b = _box([0.0], [1.0]), _box([0.3], [1.5])
    i = intersection(a, b, beta=beta)
    lo = torch.maximum(_max_gumbel(a.lower, beta, n, generator),
                       _max_gumbel(b.lower, beta, n, generator))[:, 0]
    hi = torch.minimum(_min_gumbel(a.upper, beta, n, generator),
                       _min_gumbel(b.upper, beta, n, generator))[:, 0]
    se_lo, se_hi = lo.std() / math.sqrt(n), hi.std() / math.sqrt(n)
    assert abs(lo.mean() - (i.lower[0] + beta * EULER_GAMMA)) < 5 * se_lo
    assert abs(hi.mean() - (i.upper[0] - beta * EULER_GAMMA)) < 5 * se_hi
    for t in (-0.2, 0.4, 1.0):
        p_lo = math.exp(-math.exp(-(t - i.lower[0].item()) / beta))
        p_hi = 1 - math.exp(-math.exp((t - i.upper[0].item()) / beta))
        for emp, p in (((lo <= t).double().mean().item(), p_lo),
                       ((hi <= t).double().mean().item(), p_hi)):
            assert abs(emp - p) < 5 * math.sqrt(p * (1 - p) / n) + 1e-12


def test_expected_intersection_volume_by_monte_carlo(generator):
    # E[Vol(A ∩ B)] for random Gumbel corners equals the Bessel volume of the lse box.
    beta, n = 0.2, 200_000
    a = _box([0.0, 0.1], [1.0, 0.8])
    b = _box([0.4, -0.2], [1.3, 0.5])
    la, ha = _sample_box(a, beta, n, generator)
    lb, hb = _sample_box(b, beta, n, generator)
    v = (torch.minimum(ha, hb) - torch.maximum(la, lb)).clamp(min=0).prod(-1)
    want = volume(intersection(a, b, beta=beta), beta=beta).item()
    assert abs(v.mean().item() - want) < 5 * v.std().item() / math.sqrt(n)


# ---------------------------------------------------------------------- containment
def test_containment_prob_is_ratio_of_expectations_by_monte_carlo(generator):
    beta, n = 0.25, 200_000
    a = _box([0.0, 0.0], [1.0, 1.2])
    b = _box([0.3, 0.6], [0.9, 1.6])
    la, ha = _sample_box(a, beta, n, generator)
    lb, hb = _sample_box(b, beta, n, generator)
    num = (torch.minimum(ha, hb) - torch.maximum(la, lb)).clamp(min=0).prod(-1)
    den = (hb - lb).clamp(min=0).prod(-1)
    m_num, m_den = num.mean().item(), den.mean().item()
    s_num, s_den = num.std().item() / math.sqrt(n), den.std().item() / math.sqrt(n)
    p = containment_prob(a, b, beta=beta).item()
    assert abs(m_num - volume(intersection(a, b, beta=beta), beta=beta).item()) < 5 * s_num
    assert abs(m_den - volume(b, beta=beta).item()) < 5 * s_den
    rel = math.hypot(s_num / m_num, s_den / m_den)  # conservative: ignores the + correlation
    assert abs(m_num / m_den - p) < 5 * rel * p


def test_containment_hard_cases():
    a = _box([[0.0, 0.0]] * 4, [[1.0, 1.0]] * 4)
    b = _box([[0.2, 0.2], [2.0, 2.0], [0.5, 0.0], [0.5, 0.5]],
             [[0.8, 0.8], [3.0, 3.0], [1.5, 1.0], [0.5, 0.9]])   # last one empty (width 0)
    p = containment_prob(a, b)
    torch.testing.assert_close(p, torch.tensor([1.0, 0.0, 0.5, 1.0], dtype=F64))
    lp = log_containment_prob(a, b)
    assert lp[1].item() == -math.inf and lp[0].item() == 0.0


def test_containment_soft_and_gumbel_tend_to_hard():
    a = _box([[0.0, 0.0]] * 3, [[1.0, 1.0]] * 3)
    b = _box([[0.2, 0.2], [2.0, 2.0], [0.5, 0.0]], [[0.8, 0.8], [3.0, 3.0], [1.5, 1.0]])
    hard = containment_prob(a, b)
    torch.testing.assert_close(containment_prob(a, b, beta=1e-4), hard, atol=1e-3, rtol=0)
    torch.testing.assert_close(containment_prob(a, b, beta=1e-4, approx=True), hard, atol=1e-3,
                               rtol=0)
    torch.testing.assert_close(containment_prob(a, b, temperature=1e-4), hard, atol=1e-3, rtol=0)


def test_containment_bounds_and_volume_beta():
    g = torch.Generator().manual_seed(1)
    lo = torch.randn(2, 50, 4, generator=g, dtype=F64)
    hi = lo + torch.randn(2, 50, 4, generator=g, dtype=F64)
    a, b = Box(lo[0], hi[0]), Box(lo[1], hi[1])
    for kw in ({"beta": 0.3}, {"beta": 0.3, "approx": True}, {"beta": 0.3, "volume_beta": 1.0},
               {"temperature": 0.5}, {}):
        p = containment_prob(a, b, **kw)
        assert bool(((p >= 0) & (p <= 1)).all()), kw
    # separate volume scale: log E[Vol_vb(a ∩_β b)] − log E[Vol_vb(b)]
    want = (volume(intersection(a, b, beta=0.3), beta=1.0, log=True)
            - volume(b, beta=1.0, log=True))
    torch.testing.assert_close(log_containment_prob(a, b, 0.3, 1.0), want)
    torch.testing.assert_close(containment_prob(a, b, 0.3, log=True),
                               log_containment_prob(a, b, 0.3))


def test_disjoint_boxes_gradients_hard_zero_gumbel_nonzero():
    a = _box([0.0, 0.0], [1.0, 1.0], grad=True)
    b = _box([2.0, 0.0], [3.0, 1.0], grad=True)
    p_hard = containment_prob(a, b)
    assert p_hard.item() == 0.0
    grads = torch.autograd.grad(p_hard, (a.lower, a.upper, b.lower, b.upper), allow_unused=True)
    assert all(g is None or g.abs().sum().item() == 0 for g in grads)
    lp = log_containment_prob(a, b, beta=0.1)
    assert math.isfinite(lp.item())
    ga_hi, gb_lo = torch.autograd.grad(lp, (a.upper, b.lower))
    # moving a's upper corner right or b's lower corner left increases P(b ⊆ a)
    assert ga_hi[0].item() > 0 and gb_lo[0].item() < 0


def test_nested_boxes_gradients_hard_zero_gumbel_nonzero():
    a = _box([0.0, 0.0], [1.0, 1.0], grad=True)
    b = _box([0.3, 0.3], [0.6, 0.6], grad=True)
    p_hard = containment_prob(a, b)
    assert p_hard.item() == 1.0
    grads = torch.autograd.grad(p_hard, (a.lower, a.upper, b.lower, b.upper), allow_unused=True)
    assert all(g is None or g.abs().sum().item() == 0 for g in grads)
    lp = log_containment_prob(a, b, beta=0.1)
    ga_lo, ga_hi = torch.autograd.grad(lp, (a.lower, a.upper))
    # enlarging a increases P(b ⊆ a) even when b is already inside
    assert bool((ga_lo < 0).all()) and bool((ga_hi > 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("approx", [False, True])
def test_far_apart_boxes_finite(dtype, approx):
    beta = 0.01
    a = _box([[0.0, 0.0]], [[1.0, 1.0]], dtype=dtype, grad=True)
    b = _box([[10.0 + 1.0, 0.0]], [[12.0, 1.0]], dtype=dtype, grad=True)   # gap 1000β
    lp = log_containment_prob(a, b, beta=beta, approx=approx)
    lo = overlap(a, b, beta=beta, approx=approx, log=True)
    grads = torch.autograd.grad(lp.sum() + lo.sum(), (a.lower, a.upper, b.lower, b.upper))
    assert bool(torch.isfinite(lp).all()) and bool(torch.isfinite(lo).all())
    assert all(bool(torch.isfinite(g).all()) for g in grads)
    assert grads[1][0, 0].item() > 0   # pull a's upper corner towards b


def test_gradcheck_containment_and_overlap():
    a = _box([[0.0, 0.1], [0.2, -0.3]], [[1.0, 0.9], [0.5, 0.4]], grad=True)
    b = _box([[0.3, 0.5], [0.0, 0.0]], [[1.4, 1.1], [0.8, 0.2]], grad=True)
    for approx in (False, True):
        def f(la, ua, lb, ub):
            x, y = Box(la, ua), Box(lb, ub)
            return (log_containment_prob(x, y, 0.3, 0.5, approx=approx),
                    overlap(x, y, 0.2, approx=approx, log=True))
        assert torch.autograd.gradcheck(f, (a.lower, a.upper, b.lower, b.upper))


def test_tensor_beta_path_matches_float_path():
    a = _box([[0.0, 0.1]], [[1.0, 0.9]])
    b = _box([[0.3, 0.5]], [[1.4, 1.1]])
    bt = torch.tensor(0.3, dtype=F64, requires_grad=True)
    for approx in (False, True):
        p_t = log_containment_prob(a, b, bt, approx=approx)
        torch.testing.assert_close(p_t, log_containment_prob(a, b, 0.3, approx=approx))
        (g,) = torch.autograd.grad(p_t.sum(), bt)
        assert math.isfinite(g.item())


# ---------------------------------------------------------------------- custom backward
def test_gumbel_intersection_function_gradcheck_and_helper():
    g = torch.Generator().manual_seed(5)
    x = [torch.randn(3, 4, generator=g, dtype=F64, requires_grad=True) for _ in range(4)]
    for beta in (0.05, 1.0):
        assert torch.autograd.gradcheck(lambda *t: _GumbelIntersection.apply(*t, beta), x)
    # helper against autograd through the plain formula
    gl, gu = torch.randn(3, 4, generator=g, dtype=F64), torch.randn(3, 4, generator=g, dtype=F64)
    lower = 0.3 * torch.logaddexp(x[0] / 0.3, x[2] / 0.3)
    upper = -0.3 * torch.logaddexp(-x[1] / 0.3, -x[3] / 0.3)
    want = torch.autograd.grad((lower * gl).sum() + (upper * gu).sum(), x)
    got = _gumbel_intersection_backward(*(t.detach() for t in x), 0.3, gl, gu)
    for w, h in zip(want, got):
        torch.testing.assert_close(h, w)


# ---------------------------------------------------------------------- overlap
def test_overlap_hard_values():
    a = _box([[0.0], [0.0], [0.0], [0.0]], [[2.0], [1.0], [1.0], [0.0]])
    b = _box([[1.0], [0.0], [2.0], [1.0]], [[3.0], [1.0], [3.0], [0.5]])
    torch.testing.assert_close(overlap(a, b), torch.tensor([1 / 3, 1.0, 0.0, 0.0], dtype=F64))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-2, 2), min_size=6, max_size=6), st.floats(0.05, 1.0))
def test_overlap_symmetric_bounded_and_matches_direct_formula(c, beta):
    a = _box([c[0], c[1]], [c[0] + abs(c[2]) + 0.1, c[1] + 0.5])
    b = _box([c[3], c[4]], [c[3] + abs(c[5]) + 0.1, c[4] + 1.0])
    o = overlap(a, b, beta=beta)
    torch.testing.assert_close(o, overlap(b, a, beta=beta))
    assert 0.0 <= o.item() <= 1.0
    vi = volume(intersection(a, b, beta=beta), beta=beta)
    va, vb = volume(a, beta=beta), volume(b, beta=beta)
    torch.testing.assert_close(o, vi / (va + vb - vi), rtol=1e-9, atol=1e-300)
    # containment in each direction bounds the Jaccard ratio from above
    assert o.item() <= min(containment_prob(a, b, beta).item(),
                           containment_prob(b, a, beta).item()) + 1e-12


# ---------------------------------------------------------------------- errors
@pytest.mark.parametrize("kw,match", [
    ({"beta": 0.0}, "^beta"), ({"beta": -0.1}, "^beta"),
    ({"beta": 0.1, "volume_beta": 0.0}, "volume_beta"),
    ({"volume_beta": 0.5}, "volume_beta"),
    ({"beta": 0.1, "temperature": 0.1}, "not both"),
    ({"approx": True}, "approx"),
    ({"temperature": -1.0}, "temperature"),
])
def test_bad_arguments(kw, match):
    a, b = _box([0.0], [1.0]), _box([0.5], [2.0])
    with pytest.raises(ValueError, match=match):
        containment_prob(a, b, **kw)


def test_mismatched_boxes():
    a = _box([0.0], [1.0])
    with pytest.raises(ValueError, match="dimension"):
        intersection(a, _box([0.0, 0.0], [1.0, 1.0]))
    with pytest.raises(ValueError, match="dtype"):
        overlap(a, _box([0.0], [1.0], dtype=torch.float32))
    with pytest.raises(ValueError, match="broadcastable"):
        intersection(_box([[0.0]] * 2, [[1.0]] * 2), _box([[0.0]] * 3, [[1.0]] * 3))
    with pytest.raises(ValueError, match="Box"):
        intersection(a, torch.zeros(1))
    with pytest.raises(ValueError, match="beta"):
        intersection(a, a, beta=0.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_cuda_matches_cpu():
    g = torch.Generator().manual_seed(7)
    lo = torch.randn(2, 32, 6, generator=g)
    hi = lo + torch.rand(2, 32, 6, generator=g)
    outs = []
    for dev in ("cpu", "cuda"):
        t = [x.to(dev).requires_grad_() for x in (lo[0], hi[0], lo[1], hi[1])]
        a, b = Box(t[0], t[1]), Box(t[2], t[3])
        lp = log_containment_prob(a, b, beta=0.1) + overlap(a, b, beta=0.1, log=True)
        outs.append((lp, *torch.autograd.grad(lp.sum(), t)))
    for c, d in zip(*outs):
        torch.testing.assert_close(d.cpu(), c, rtol=1e-4, atol=1e-5)


def test_containment_broadcasts_all_pairs():
    # (r, 1, d) children against (1, n, d) parents: the all-pairs matrix, computed once
    g = torch.Generator().manual_seed(8)
    lo = torch.rand(5, 3, generator=g, dtype=F64)
    boxes = Box(lo, lo + 0.5 * torch.rand(5, 3, generator=g, dtype=F64))
    parents = Box(boxes.lower.unsqueeze(0), boxes.upper.unsqueeze(0))
    children = Box(boxes.lower[:2].unsqueeze(1), boxes.upper[:2].unsqueeze(1))
    for kw in ({}, {"beta": 0.1}, {"temperature": 0.1}):
        p = containment_prob(parents, children, **kw)
        o = overlap(parents, children, **kw)
        assert p.shape == o.shape == (2, 5)
        for i in range(2):
            for j in range(5):
                torch.testing.assert_close(p[i, j], containment_prob(boxes[j], boxes[i], **kw))
                torch.testing.assert_close(o[i, j], overlap(boxes[j], boxes[i], **kw))
        if not kw:   # hard: every box contains itself
            torch.testing.assert_close(p.diagonal(), torch.ones(2, dtype=F64))


# ----------------------------------------------------------------- log(1 − P), nested pairs
def _mp_log1m_containment(alo, ahi, blo, bhi, beta, vbeta):
    """log(1 − P(b ⊆ a)) of Gumbel boxes at 60 digits (mpmath), the direct formula."""
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(60):
        def side(x):
            return 2 * vbeta * mpmath.besselk(0, 2 * mpmath.exp(-x / (2 * vbeta)))
        p = mpmath.mpf(1)
        for la, ha, lb, hb in zip(alo, ahi, blo, bhi):
            la, ha, lb, hb = (mpmath.mpf(v) for v in (la, ha, lb, hb))
            lo = beta * mpmath.log(mpmath.exp(la / beta) + mpmath.exp(lb / beta))
            hi = -beta * mpmath.log(mpmath.exp(-ha / beta) + mpmath.exp(-hb / beta))
            p *= side(hi - lo) / side(hb - lb)
        return float(mpmath.log(1 - p))


@pytest.mark.parametrize("depth", [0.001, 0.01, 0.03, 0.05, 0.1, 0.2, 0.4])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_log1m_containment_matches_high_precision(depth, dtype):
    """Children from barely to deeply inside (δ/β_vol from 0.3 down to e^{-40}): the nested
    branch (midpoint rule) and the direct branch both agree with a 60-digit evaluation, also
    where 1 − P is below the dtype's resolution (depth 0.2 in float32, 0.4 in both)."""
    alo, ahi = [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]
    blo, bhi = [depth, depth + 0.05, 2 * depth], [0.7, 1.0 - depth, 0.5]
    a = Box(torch.tensor(alo, dtype=dtype), torch.tensor(ahi, dtype=dtype))
    b = Box(torch.tensor(blo, dtype=dtype), torch.tensor(bhi, dtype=dtype))
    got = log1m_containment_prob(a, b, beta=0.01, volume_beta=0.1).item()
    want = _mp_log1m_containment(alo, ahi, blo, bhi, 0.01, 0.1)
    assert got == pytest.approx(want, rel=1e-7 if dtype == F64 else 2e-5)
    if depth >= 0.4:            # log1mexp(log P) is off: -inf (float32) or by > 5% (float64)
        old = log1mexp(log_containment_prob(a, b, beta=0.01, volume_beta=0.1)).item()
        assert abs(old - want) > 0.05


def test_log1m_containment_equals_log1mexp_where_p_is_accurate():
    g = torch.Generator().manual_seed(0)
    lo_a = torch.rand(200, 4, generator=g, dtype=F64) * 0.2
    a = Box(lo_a, lo_a + 1.0)
    lo_b = lo_a + torch.rand(200, 4, generator=g, dtype=F64) * 0.3 - 0.05
    b = Box(lo_b, lo_b + 0.4 * torch.rand(200, 4, generator=g, dtype=F64) + 0.05)
    for kw in (dict(beta=0.05, volume_beta=0.2), dict(beta=0.1), dict(beta=0.1, approx=True),
               dict(temperature=0.1), {}):
        got = log1m_containment_prob(a, b, **kw)
        want = log1mexp(log_containment_prob(a, b, **kw))
        ok = want > -20          # P - 1 resolvable in float64 through log P
        torch.testing.assert_close(got[ok], want[ok], rtol=1e-6, atol=1e-9)


def test_log1m_containment_gradcheck_and_nested_gradient():
    """gradcheck on nested and non-nested pairs (lower, upper of both boxes, float64); the
    deeply nested negative of hard boxes has log(1 − P) = -inf with a zero, not NaN, gradient."""
    lo_a = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], dtype=F64)
    hi_a = torch.ones(3, 2, dtype=F64)
    lo_b = torch.tensor([[0.3, 0.35], [0.05, 0.2], [0.5, -0.2]], dtype=F64)   # nested x2, not
    hi_b = torch.tensor([[0.6, 0.7], [0.5, 0.98], [1.2, 0.4]], dtype=F64)
    ins = [t.clone().requires_grad_() for t in (lo_a, hi_a, lo_b, hi_b)]

    def f(la, ha, lb, hb):
        return log1m_containment_prob(Box(la, ha), Box(lb, hb), beta=0.05, volume_beta=0.2)

    from perturb.boxes.intersections import _log1m_nested
    nested, _ = _log1m_nested(Box(lo_a, hi_a), Box(lo_b, hi_b), 0.05, 0.2, False)
    assert nested.tolist() == [True, False, False]
    lo_b2 = lo_b.clone()
    lo_b2[1] = torch.tensor([0.25, 0.25])              # make the second pair nested too
    ins[2] = lo_b2.clone().requires_grad_()
    assert torch.autograd.gradcheck(f, tuple(ins), eps=1e-7, atol=1e-7, rtol=1e-5)
    lb = lo_b.clone().requires_grad_()
    hard = log1m_containment_prob(Box(lo_a, hi_a), Box(lb, hi_b))
    assert hard[0].item() == -math.inf
    (g,) = torch.autograd.grad(hard[1:].sum() + 0 * hard[0].clamp(min=-1.0), (lb,))
    assert bool(torch.isfinite(g).all())


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_log1m_containment_deep_nesting_has_finite_nonzero_gradient(dtype):
    """At depths where e^{-Δ/β} underflows the dtype, log(1 − P) ≈ −Δ/β stays finite and its
    gradient moves the child's corners outwards."""
    a = Box(torch.zeros(3, dtype=dtype), torch.ones(3, dtype=dtype))
    lo = torch.full((3,), 0.45, dtype=dtype, requires_grad=True)
    hi = torch.full((3,), 0.55, dtype=dtype, requires_grad=True)
    out = log1m_containment_prob(a, Box(lo, hi), beta=1e-3, volume_beta=0.1)
    assert math.isfinite(out.item()) and out.item() < -400
    # tensor scales (per coordinate, as box-embeddings allows) give the same value
    t = log1m_containment_prob(a, Box(lo, hi), beta=torch.full((3,), 1e-3, dtype=dtype),
                               volume_beta=torch.full((3,), 0.1, dtype=dtype))
    torch.testing.assert_close(t, out)
    g_lo, g_hi = torch.autograd.grad(-out, (lo, hi))
    assert bool((g_lo > 0).all() and (g_hi < 0).all())
    assert bool(torch.isfinite(g_lo).all() and torch.isfinite(g_hi).all())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-0.5, 1.5), min_size=8, max_size=8),
       st.sampled_from([0.003, 0.03, 0.3]), st.sampled_from([0.1, 1.0]))
def test_log1m_matches_one_minus_p_on_random_boxes(c, beta, vbeta):
    """1 − P from log1m_containment_prob matches 1 − exp(log P) for random Gumbel boxes
    (nested, overlapping or apart; float64) to the documented relative accuracy of the nested
    branch (midpoint rule with δ_i <= 1e-2·β_vol: relative error <= (1e-2)²/24 ≈ 4e-6), wherever
    1 − P > 1e-6 is resolved through log P."""
    t = torch.tensor(c, dtype=F64).reshape(4, 2)
    a = Box(torch.minimum(t[0], t[1]), torch.maximum(t[0], t[1]))
    b = Box(torch.minimum(t[2], t[3]), torch.maximum(t[2], t[3]))
    lp = log_containment_prob(a, b, beta=beta, volume_beta=vbeta)
    l1m = log1m_containment_prob(a, b, beta=beta, volume_beta=vbeta)
    assert l1m.item() <= 0.0 and math.isfinite(l1m.item())
    one_minus_p = -torch.expm1(lp).item()
    if one_minus_p > 1e-6:
        assert torch.exp(l1m).item() == pytest.approx(one_minus_p, rel=5e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nested_log1m_dense_path_equals_the_indexed_one(dtype):
    """The branch-free nested-pair path (the default where host reads stall: CUDA, compile,
    torch.func) gives the same log(1 − P) and gradients as the indexed CPU path, on a mix of
    deeply nested, barely nested, partly outside and far pairs."""
    from perturb.boxes.intersections import _log1m_containment, _log1m_nested
    g = torch.Generator().manual_seed(0)
    n, d = 3000, 6
    plo = 2 * torch.rand(n, d, generator=g, dtype=dtype)
    phi = plo + 0.5 + 2 * torch.rand(n, d, generator=g, dtype=dtype)
    out_ = (torch.rand(n, 1, generator=g, dtype=dtype) < 0.3).to(dtype)
    clo = (plo + (phi - plo) * (0.005 + 0.4 * torch.rand(n, d, generator=g, dtype=dtype))
           - out_ * torch.rand(n, d, generator=g, dtype=dtype))
    chi = clo + 0.01 + 0.5 * (phi - clo) * torch.rand(n, d, generator=g, dtype=dtype)
    nested, _ = _log1m_nested(Box(plo, phi), Box(clo, chi), 0.01, 0.1, False, dense=True)
    assert 0 < int(nested.sum()) < n
    results = []
    for dense in (False, True):
        t = [x.clone().requires_grad_() for x in (plo, phi, clo, chi)]
        a, b = Box(t[0], t[1]), Box(t[2], t[3])
        value = _log1m_containment(log_containment_prob(a, b, 0.01, 0.1), a, b, 0.01, 0.1,
                                   False, dense)
        finite = torch.isfinite(value)
        grads = torch.autograd.grad(value[finite].sum(), t)
        results.append((value.detach(), grads))
    (v0, g0), (v1, g1) = results
    torch.testing.assert_close(v1, v0, rtol=0, atol=0)
    for x, y in zip(g1, g0):
        assert not bool(torch.isnan(x).any())
        torch.testing.assert_close(x, y, rtol=1e-12 if dtype == torch.float64 else 1e-5,
                                   atol=0)


def test_nested_log1m_dense_path_gradcheck():
    """float64 gradcheck of the branch-free nested-pair path, on nested and non-nested pairs
    (the non-nested ones go through its safe, unused branch)."""
    from perturb.boxes.intersections import _log1m_containment
    plo = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    phi = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    clo = torch.tensor([[0.3, 0.4], [0.2, -0.3], [0.05, 0.3]], dtype=torch.float64)
    chi = torch.tensor([[0.6, 0.7], [0.5, 0.6], [0.5, 0.97]], dtype=torch.float64)

    def f(a_lo, a_hi, b_lo, b_hi):
        a, b = Box(a_lo, a_hi), Box(b_lo, b_hi)
        return _log1m_containment(log_containment_prob(a, b, 0.01, 0.1), a, b, 0.01, 0.1,
                                  False, True)

    args = tuple(t.clone().requires_grad_() for t in (plo, phi, clo, chi))
    assert bool(torch.isfinite(f(*args)).all())
    assert torch.autograd.gradcheck(f, args)


_NESTED_PAIR = [0.0, 1.0, 0.0, 1.0, 0.2, 0.5, 0.3, 0.6]   # b well inside a


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-0.5, 1.5), min_size=8, max_size=8),
       st.floats(-5.0, 0.0), st.floats(1.0, 50.0), st.booleans())
@example(_NESTED_PAIR, -5.0, 1.0, False).via("the corners of both ranges")
@example(_NESTED_PAIR, -5.0, 50.0, True).via("the corners of both ranges")
@example(_NESTED_PAIR, 0.0, 50.0, False).via("the corners of both ranges")
@example(_NESTED_PAIR, 0.0, 1.0, True).via("the corners of both ranges")
def test_log1m_containment_over_the_whole_range_of_both_scales(c, log10_beta, vbeta, tensor):
    """Intersection scale β ∈ [1e-5, 1] and volume scale β_vol ∈ [1, 50] (the ranges
    box-embeddings tests), float or tensor scales: log(1 − P) is finite, ≤ 0, agrees with the
    60-digit evaluation wherever that resolves 1 − P, and has finite gradients equal to the
    central differences of that evaluation. (The nested-pair pre-test took
    log(expm1(β_vol/β · 1e-2)), which overflowed for β_vol/β ≳ 7e4.) The comparison is with
    the 60-digit differences, not a float64 gradcheck: the nested-pair formula (midpoint rule,
    relative error < 1e-5) and the direct one differ by that much where a pair crosses
    δ = 1e-2·β_vol, which a step of 1e-8 would see as a slope."""
    beta = 10.0 ** log10_beta
    t = torch.tensor(c, dtype=F64).reshape(4, 2)
    lo_a, hi_a = torch.minimum(t[0], t[1]), torch.maximum(t[0], t[1]) + 0.05
    lo_b, hi_b = torch.minimum(t[2], t[3]), torch.maximum(t[2], t[3]) + 0.05
    scales = (torch.tensor(beta, dtype=F64), torch.tensor(vbeta, dtype=F64)) if tensor \
        else (beta, vbeta)

    def f(la, ha, lb, hb):
        return log1m_containment_prob(Box(la, ha), Box(lb, hb), *scales)

    value = f(lo_a, hi_a, lo_b, hi_b).item()
    assert math.isfinite(value) and value <= 0.0
    want = _mp_log1m_containment(lo_a.tolist(), hi_a.tolist(), lo_b.tolist(), hi_b.tolist(),
                                 beta, vbeta)
    if want > -100:            # 1 − P above 1e-43: resolved by the 60 digits
        assert value == pytest.approx(want, rel=1e-5, abs=1e-12)
    ins = tuple(x.clone().requires_grad_() for x in (lo_a, hi_a, lo_b, hi_b))
    grads = torch.autograd.grad(f(*ins), ins)
    assert all(bool(torch.isfinite(g).all()) for g in grads)
    if want > -100:
        corners = [x.tolist() for x in (lo_a, hi_a, lo_b, hi_b)]
        h = 1e-9
        for k, g in enumerate(grads):
            for i in range(2):
                up = [list(x) for x in corners]
                down = [list(x) for x in corners]
                up[k][i] += h
                down[k][i] -= h
                fd = (_mp_log1m_containment(*up, beta, vbeta)
                      - _mp_log1m_containment(*down, beta, vbeta)) / (2 * h)
                assert g[i].item() == pytest.approx(fd, rel=1e-3, abs=1e-6)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, allow_subnormal=False), min_size=8, max_size=8),
       st.floats(-6.0, 2.0), st.sampled_from([torch.float32, F64]), st.booleans(),
       st.floats(0.0, 1e-3))
def test_gumbel_intersection_lies_inside_the_hard_one(c, log10_beta, dtype, tensor, jitter):
    """For every input, dtype and scale β (float or tensor): the Gumbel intersection's lower
    corner is >= max(lo_a, lo_b) and its upper corner <= min(hi_a, hi_b), exactly, after
    rounding (box-embeddings asserts this for its Gumbel intersection). Corners a rounding
    apart (``jitter`` of a few ulps) are where β·logaddexp(a/β, b/β) fell 1 ulp outside."""
    beta = 10.0 ** log10_beta
    t = torch.tensor(c, dtype=dtype).reshape(4, 2)
    t[2] = t[0] * (1 + jitter)           # near-equal corners: the rounding-sensitive case
    a, b = Box(t[0], t[1]), Box(t[2], t[3])
    inter = intersection(a, b, torch.tensor(beta, dtype=dtype) if tensor else beta)
    assert bool((inter.lower >= torch.maximum(a.lower, b.lower)).all())
    assert bool((inter.upper <= torch.minimum(a.upper, b.upper)).all())
    # and it is the scaled log-sum-exp to rounding
    want = beta * torch.logaddexp(a.lower.double() / beta, b.lower.double() / beta)
    torch.testing.assert_close(inter.lower.double(), want, rtol=4 * torch.finfo(dtype).eps,
                               atol=4 * beta * torch.finfo(dtype).eps)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_gumbel_intersection_inside_the_hard_one_on_many_random_pairs(dtype):
    """The same containment on 10^5 random pairs per β (the rounding case has a probability
    of about 1/10 per coordinate with the logaddexp form)."""
    g = torch.Generator().manual_seed(0)
    lo = torch.randn(4, 100_000, generator=g, dtype=dtype) * 10
    lo[1] = lo[0] + torch.randn(100_000, generator=g, dtype=dtype) * 1e-3
    for beta in (1e-5, 1e-3, 0.1, 0.3, 1.0, 7.0):
        inter = intersection(Box(lo[0], lo[2]), Box(lo[1], lo[3]), beta)
        assert bool((inter.lower >= torch.maximum(lo[0], lo[1])).all()), beta
        assert bool((inter.upper <= torch.minimum(lo[2], lo[3])).all()), beta


# ----------------------------------------------------------------- unbounded boxes (±inf corners)
_INF = math.inf
_KINDS = [{}, {"beta": 0.1}, {"temperature": 0.5}, {"beta": torch.tensor(0.1, dtype=F64)},
          {"beta": 0.05, "volume_beta": 0.3}]


def _b(lo, hi):
    return Box(torch.tensor(lo, dtype=F64), torch.tensor(hi, dtype=F64))


@pytest.mark.parametrize("kw", _KINDS, ids=str)
def test_containment_and_overlap_of_unbounded_boxes_are_their_truncation_limits(kw):
    """∞/∞ ratios are the limit of the boxes cut to [−R, R]^d: the line contains everything,
    the half-line [0, ∞) holds half of the line, a bounded box holds no unbounded one, and an
    unbounded box overlaps itself fully (hard); nothing is NaN."""
    line = _b([[-_INF, 0.0]], [[_INF, 1.0]])
    half = _b([[0.0, 0.0]], [[_INF, 1.0]])
    unit = _b([[0.0, 0.0]], [[1.0, 1.0]])
    # in the second coordinate all three share [0, 1]: its ratio is that of unit intervals
    # (1 for hard boxes, below 1 for Gumbel boxes, whose intersection shrinks)
    own = containment_prob(_b([[0.0]], [[1.0]]), _b([[0.0]], [[1.0]]), **kw).item()
    assert containment_prob(line, half, **kw).item() == pytest.approx(own, rel=1e-9)
    assert containment_prob(half, line, **kw).item() == pytest.approx(0.5 * own, rel=1e-9)
    assert containment_prob(unit, line, **kw).item() == 0.0
    for a, b in ((line, line), (half, line), (unit, line), (line, half)):
        for f in (containment_prob, log_containment_prob, log1m_containment_prob, overlap):
            assert not bool(torch.isnan(f(a, b, **kw)).any()), (f.__name__, a, b)
    if not kw:
        assert containment_prob(line, unit).item() == 1.0
        assert overlap(line, line).item() == pytest.approx(1.0, rel=1e-12)
        assert overlap(line, half).item() == pytest.approx(0.5, rel=1e-12)
        assert overlap(unit, line).item() == 0.0


def test_unbounded_containment_has_finite_gradients_and_bounded_pairs_are_untouched():
    """The pairs cut to the cube are recomputed on the cut boxes, so the infinite derivatives
    of the first evaluation never reach the backward; bounded pairs in the same batch keep
    their values to the last bit."""
    lo_a = torch.tensor([[-_INF, 0.0], [0.0, 0.0]], dtype=F64, requires_grad=True)
    hi_a = torch.tensor([[_INF, 1.0], [1.0, 1.0]], dtype=F64, requires_grad=True)
    lo_b = torch.tensor([[0.0, 0.2], [0.1, 0.2]], dtype=F64, requires_grad=True)
    hi_b = torch.tensor([[_INF, 0.7], [0.6, 0.7]], dtype=F64, requires_grad=True)
    for kw in ({"beta": 0.1}, {"temperature": 0.5}, {}):
        for f in (log_containment_prob, lambda a, b, **k: overlap(a, b, log=True, **k)):
            v = f(Box(lo_a, hi_a), Box(lo_b, hi_b), **kw)
            alone = f(Box(lo_a[1:], hi_a[1:]), Box(lo_b[1:], hi_b[1:]), **kw)
            assert v[1].item() == alone.item()
            g = torch.autograd.grad(v[torch.isfinite(v)].sum(), (lo_a, hi_a, lo_b, hi_b),
                                    allow_unused=True)
            assert all(x is None or bool(torch.isfinite(x).all()) for x in g), kw


def test_gumbel_intersection_of_equal_infinite_corners():
    """Equal infinite corners give that corner (∞ − ∞ is read as a zero gap), with the
    gradient shared equally (weight 1/2), not NaN."""
    lo = torch.tensor([-_INF, 0.0], dtype=F64, requires_grad=True)
    hi = torch.tensor([_INF, 1.0], dtype=F64, requires_grad=True)
    inter = intersection(Box(lo, hi), Box(lo.detach().clone(), hi.detach().clone()), beta=0.1)
    assert inter.lower[0].item() == -_INF and inter.upper[0].item() == _INF
    g_lo, g_hi = torch.autograd.grad((inter.lower + inter.upper).sum(), (lo, hi))
    assert g_lo.tolist() == [0.5, 0.5] and g_hi.tolist() == [0.5, 0.5]
