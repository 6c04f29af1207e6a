"""Tests for perturb.boxes._gumbel_pairs: the fused log P(child ⊆ parent) of Gumbel boxes and
log(1 − P) of the negatives, against the composition of the public functions (intersection,
volume, log_containment_prob, log1m_containment_prob), float64 gradcheck, the backward helper
against autograd, and extreme inputs."""
import math

import pytest
import torch

from perturb.boxes import Box, log1m_containment_prob, log_containment_prob
from perturb.boxes._gumbel_pairs import (_GumbelLog1mNested, _GumbelLogContainment,
                                         _gumbel_pair_backward,
                                         _gumbel_pair_forward, gumbel_log_containment,
                                         gumbel_pair_scores)

BETA, VBETA = 0.05, 0.3


def _boxes(p: int, d: int, dtype: torch.dtype, generator: torch.Generator,
           spread: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lower, upper)`` of 2p random boxes (children then parents), some sides inverted."""
    c = spread * torch.randn(2 * p, d, dtype=dtype, generator=generator)
    h = torch.rand(2 * p, d, dtype=dtype, generator=generator) * 2 - 0.2
    return c - h, c + h


def _nested(p: int, d: int, dtype: torch.dtype, generator: torch.Generator
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Children deep inside their parents (first half) and random pairs (second half)."""
    lo = torch.rand(2 * p, d, dtype=dtype, generator=generator)
    w = torch.rand(2 * p, d, dtype=dtype, generator=generator) * 0.5 + 0.1
    k = p // 2
    lo[:k] = lo[p:p + k] + 0.3 * w[p:p + k]                  # child k inside parent p + k
    w[:k] = w[p:p + k] * 0.3 * torch.rand(k, d, dtype=dtype, generator=generator)
    return lo, lo + w


def _reference(lower, upper, beta=BETA, vbeta=VBETA):
    p = lower.shape[0] // 2
    return log_containment_prob(Box(lower[p:], upper[p:]), Box(lower[:p], upper[:p]),
                                beta=beta, volume_beta=vbeta)


def test_values_and_gradients_match_the_composition(generator):
    lower, upper = (t.requires_grad_() for t in _boxes(200, 6, torch.float64, generator))
    ours, ref = gumbel_log_containment(lower, upper, BETA, VBETA), _reference(lower, upper)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    w = torch.randn(200, dtype=torch.float64, generator=generator)
    g_ours = torch.autograd.grad((ours * w).sum(), (lower, upper))
    g_ref = torch.autograd.grad((ref * w).sum(), (lower, upper))
    for a, b in zip(g_ours, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_float32_as_accurate_as_the_composition(generator):
    lower, upper = _boxes(300, 10, torch.float64, generator)
    lo32, hi32 = lower.float(), upper.float()
    exact = _reference(lo32.double(), hi32.double())         # the float32 inputs, in float64
    ours = gumbel_log_containment(lo32, hi32, BETA, VBETA).double()
    general = _reference(lo32, hi32).double()
    scale = exact.abs().clamp(min=1.0)
    eps = torch.finfo(torch.float32).eps
    assert ((ours - exact).abs() / scale).max() <= max(
        8 * eps, 1.5 * ((general - exact).abs() / scale).max().item())


def test_gradcheck_float64(generator):
    # overlapping, separated and nested pairs of moderate log P (the finite differences of
    # values ~1e3 with slopes ~1e3 are not accurate to 1e-7)
    c = 0.3 * torch.randn(24, 3, dtype=torch.float64, generator=generator)
    h = 0.1 + torch.rand(24, 3, dtype=torch.float64, generator=generator)
    assert torch.autograd.gradcheck(
        lambda lo, hi: gumbel_log_containment(lo, hi, BETA, VBETA),
        ((c - h).requires_grad_(), (c + h).requires_grad_()), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_backward_helper_matches_autograd_of_the_composition(generator):
    lower, upper = (t.requires_grad_() for t in _boxes(50, 4, torch.float64, generator))
    log_p, raw, q, d_lo, d_hi = _gumbel_pair_forward(lower.detach(), upper.detach(), BETA,
                                                    VBETA, True)
    grad = torch.randn(50, dtype=torch.float64, generator=generator)
    g_lo, g_hi = _gumbel_pair_backward(grad, raw, q, d_lo, d_hi, BETA, VBETA)
    want = torch.autograd.grad((_reference(lower, upper) * grad).sum(), (lower, upper))
    torch.testing.assert_close(g_lo, want[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_hi, want[1], rtol=1e-10, atol=1e-12)


def test_no_grad_forward_skips_the_slope(generator):
    lower, upper = _boxes(20, 3, torch.float32, generator)
    with torch.no_grad():
        out = _GumbelLogContainment.apply(lower, upper, BETA, VBETA, False)
    assert out[2].numel() == 0
    torch.testing.assert_close(out[0], gumbel_log_containment(lower, upper, BETA, VBETA))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale,beta", [(1e4, 0.01), (1.0, 1e-3), (1e4, 1e-3)])
def test_extremes_are_finite(dtype, scale, beta, generator):
    lower, upper = (t.requires_grad_() for t in _boxes(64, 5, dtype, generator, spread=scale))
    log_p, log1m = gumbel_pair_scores(lower, upper, 16, beta, beta)
    assert torch.isfinite(log_p).all() and (log_p <= 0).all()
    assert not torch.isnan(log1m).any() and (log1m <= 0).all()
    g = torch.autograd.grad(log_p.sum() + log1m.clamp(min=-1e3).sum(), (lower, upper))
    assert all(torch.isfinite(t).all() for t in g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pair_scores_match_log1m_containment_prob(dtype, generator):
    lower, upper = (t.requires_grad_() for t in _nested(40, 4, dtype, generator))
    n_pos, beta, vbeta = 8, 0.01, 0.1
    log_p, log1m = gumbel_pair_scores(lower, upper, n_pos, beta, vbeta)
    parent = Box(lower[40 + n_pos:], upper[40 + n_pos:])
    child = Box(lower[n_pos:40], upper[n_pos:40])
    want = log1m_containment_prob(parent, child, beta, vbeta)
    assert (want < -5).sum() >= 5                            # nested negatives are present
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=1e-5,
                                                                            atol=1e-5)
    torch.testing.assert_close(log1m, want, **tol)
    torch.testing.assert_close(log_p, _reference(lower, upper, beta, vbeta), **tol)
    w = torch.linspace(-1, 1, 32, dtype=dtype)
    g_ours = torch.autograd.grad((log1m * w).sum(), (lower, upper))
    g_ref = torch.autograd.grad((want * w).sum(), (lower, upper), allow_unused=True)
    for a, b in zip(g_ours, g_ref):
        torch.testing.assert_close(a, torch.zeros_like(a) if b is None else b, **tol)


def test_pair_scores_without_nested_negatives(generator):
    lower, upper = _boxes(30, 3, torch.float64, generator)
    lower[30:] += 50.0                                        # parents far away: P ≈ 0
    upper[30:] += 50.0
    log_p, log1m = gumbel_pair_scores(lower, upper, 10, BETA, VBETA)
    assert log1m.shape == (20,)
    torch.testing.assert_close(log1m, torch.log(-torch.expm1(log_p[10:])))


def test_nested_first_order_gradcheck_float64(generator):
    lower, upper = _nested(12, 3, torch.float64, generator)
    k = 6                                                     # the nested half
    args = [t.requires_grad_() for t in (lower[:k], upper[:k], lower[12:12 + k],
                                         upper[12:12 + k])]
    near, nested = _GumbelLog1mNested.apply(*args, 0.01, 0.1)[:2]
    assert nested.all() and (near < -2).all()
    assert torch.autograd.gradcheck(
        lambda *t: _GumbelLog1mNested.apply(*t, 0.01, 0.1)[0], tuple(args), eps=1e-8,
        atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_branch_free_path_matches_the_indexed_one(dtype, generator, monkeypatch):
    """Where host reads stall, log(1 − P) is computed for every negative and merged by where:
    same values and gradients as the indexed path, finite gradients for every pair."""
    import perturb.boxes._gumbel_pairs as gp
    lower, upper = _nested(40, 4, dtype, generator)
    lower[45:60] -= 3.0                                      # some parents far away
    out = {}
    for stall in (False, True):
        monkeypatch.setattr(gp, "reads_stall", lambda t, stall=stall: stall)
        lo, hi = lower.clone().requires_grad_(), upper.clone().requires_grad_()
        log_p, log1m = gumbel_pair_scores(lo, hi, 8, 0.01, 0.1)
        g = torch.autograd.grad(log_p.sum() + log1m.sum(), (lo, hi))
        out[stall] = (log_p, log1m, *g)
    for a, b in zip(out[False], out[True]):     # equal up to the vector kernels' rounding
        assert torch.isfinite(b).all()
        torch.testing.assert_close(a, b, rtol=4 * torch.finfo(dtype).eps, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log1m_far_matches_the_composition(dtype):
    """The one-node log(1 − P) of the negatives far from nesting: the values of
    ``_log1m_containment`` (no box model) bit for bit, −inf with a zero gradient at P = 1, and
    the gradient of the composition (autograd through its where chain) to rounding."""
    from perturb.boxes._gumbel_pairs import _Log1mFar
    from perturb.boxes.box import Box
    from perturb.boxes.intersections import _log1m_containment
    x = torch.cat([torch.tensor([0.0, -1e-30, -1e-7, -0.5, -math.log(2.0), -0.7, -3.0, -80.0,
                                 -120.0, -1e4, -1e30]),
                   -torch.logspace(-6, 3, 200, dtype=torch.float64)]).to(dtype)
    box = Box(torch.zeros(x.shape[0], 1, dtype=dtype), torch.ones(x.shape[0], 1, dtype=dtype))
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours = _Log1mFar.apply(a)
    want = _log1m_containment(b, box, box, None, None, False)
    assert torch.equal(ours, want)
    assert ours[0] == -math.inf
    w = torch.linspace(0.5, 2.0, x.shape[0], dtype=dtype)
    (g_ours,) = torch.autograd.grad(torch.where(torch.isinf(ours), 0.0, ours * w).sum(), a)
    (g_want,) = torch.autograd.grad(torch.where(torch.isinf(want), 0.0, want * w).sum(), b)
    assert g_ours[0] == 0 and torch.isfinite(g_ours).all()
    tol = dict(rtol=1e-12, atol=0.0) if dtype == torch.float64 else dict(rtol=4e-7, atol=0.0)
    torch.testing.assert_close(g_ours, g_want, **tol)


def test_log1m_far_gradcheck_float64():
    from perturb.boxes._gumbel_pairs import _Log1mFar
    x = torch.tensor([-1e-6, -0.01, -0.69, -0.7, -2.0, -30.0], dtype=torch.float64,
                     requires_grad=True)
    assert torch.autograd.gradcheck(_Log1mFar.apply, (x,), eps=1e-9, atol=1e-6, rtol=1e-6)


def test_nested_candidates_match_amax(generator):
    from perturb.boxes._gumbel_pairs import _nested_candidates
    for dtype in (torch.float32, torch.float64):
        d_lo = torch.randn(500, 7, generator=generator, dtype=dtype) * 0.05
        d_hi = torch.randn(500, 7, generator=generator, dtype=dtype) * 0.05
        d_lo[:50], d_hi[:50] = d_lo[:50].abs() + 0.03, -d_hi[:50].abs() - 0.03   # inside
        bound = -0.02
        want = torch.maximum(d_lo.neg(), d_hi).amax(dim=-1) <= bound
        assert 50 <= int(want.sum()) < 500
        assert torch.equal(_nested_candidates(d_lo, d_hi, bound), want)
