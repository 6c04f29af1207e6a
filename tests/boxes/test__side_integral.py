"""Tests for perturb.boxes._side_integral: the last quadrature pass of a perturbed side with
its hazard-quadrature backward, against autograd through the same sum (values and gradients),
float64 gradcheck, an mpmath gradient where the Logistic density loses digits, and the
once-differentiable contract."""
from __future__ import annotations

import mpmath
import pytest
import torch

from perturb.boxes._side_integral import log_side
from perturb.noise import Gumbel, Logistic, Normal
from perturb.noise._quadrature import gl_pieces

F64 = torch.float64
NOISES = [Normal(0.1), Logistic(0.1), Gumbel(0.2)]


def _grid(lo: torch.Tensor, up: torch.Tensor, panels: int = 24, order: int = 12):
    """Nodes and log weights on [min corner − 1, max corner + 1] per element."""
    a = torch.minimum(lo.amax(0), up.amin(0)).detach() - 1.0
    b = torch.maximum(lo.amax(0), up.amin(0)).detach() + 1.0
    edges = a.unsqueeze(-1) + (b - a).unsqueeze(-1) * torch.linspace(0, 1, panels + 1,
                                                                     dtype=F64)
    x, w = gl_pieces(edges, order)
    return x, torch.log(w)


def _pairs(seed: int, n: int = 40):
    g = torch.Generator().manual_seed(seed)
    lo = torch.rand(2, n, 3, generator=g, dtype=F64)
    up = lo + 0.6 * torch.rand(2, n, 3, generator=g, dtype=F64) - 0.1
    lo[1, :4] += 0.8                                             # some inverted sides
    return lo, up


def _autograd(lo, up, x, log_w, noise):
    terms = (noise.log_cdf(x.unsqueeze(0) - lo.unsqueeze(-1)).sum(0)
             + noise.log_cdf(up.unsqueeze(-1) - x.unsqueeze(0)).sum(0))
    return torch.logsumexp(log_w + terms, -1)


@pytest.mark.parametrize("noise", NOISES, ids=repr)
def test_matches_autograd_through_the_sum(noise):
    """Same nodes: the values agree to rounding, the gradients to 1e-12 relative."""
    lo, up = _pairs(0)
    x, log_w = _grid(lo, up)
    outs = []
    for fn in (log_side, _autograd):
        l, u = lo.clone().requires_grad_(), up.clone().requires_grad_()
        v = fn(l, u, x, log_w, noise)
        v.sum().backward()
        outs.append((v.detach(), l.grad, u.grad))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-15, atol=1e-14)
    for i in (1, 2):
        scale = outs[1][i].abs().max()
        assert float((outs[0][i] - outs[1][i]).abs().max() / scale) < 1e-12


@pytest.mark.parametrize("noise", NOISES, ids=repr)
def test_gradcheck_float64(noise):
    lo, up = _pairs(1, n=3)
    x, log_w = _grid(lo, up, panels=8)
    fn = lambda l, u: log_side(l, u, x, log_w, noise)                     # noqa: E731
    assert torch.autograd.gradcheck(fn, (lo.requires_grad_(), up.requires_grad_()))


def test_logistic_gradient_in_the_far_tail_matches_mpmath():
    """A side inverted by 30 scales: the nodes reach x − l = −30 s, where Logistic.log_prob's
    softplus threshold costs 4e−9; the hazard from log_sf keeps the gradient to 1e−13."""
    s = 0.1
    lo = torch.tensor([[[0.7182]], [[3.2044]]], dtype=F64, requires_grad=True)
    up = torch.tensor([[[1.0008]], [[0.2603]]], dtype=F64)
    x, log_w = _grid(lo, up, panels=200, order=16)
    log_side(lo, up, x, log_w, Logistic(s)).sum().backward()
    with mpmath.workdps(30):
        L = [mpmath.mpf(float(v)) for v in lo.detach().flatten()]
        U = [mpmath.mpf(float(v)) for v in up.flatten()]
        ms = mpmath.mpf(s)
        cdf = lambda z: 1 / (1 + mpmath.exp(-z / ms))                      # noqa: E731
        g = lambda t: cdf(t - L[0]) * cdf(t - L[1]) * cdf(U[0] - t) * cdf(U[1] - t)  # noqa
        pts = [-1, 0.26, 0.72, 1.0, 3.2, 4.2]
        want = -mpmath.quad(lambda t: g(t) * (1 - cdf(t - L[1])) / ms, pts) / mpmath.quad(g, pts)
    assert float(lo.grad[1, 0, 0]) == pytest.approx(float(want), rel=1e-13)


def test_second_derivatives_raise():
    lo, up = _pairs(2, n=2)
    x, log_w = _grid(lo, up, panels=4)
    lo.requires_grad_()
    (g,) = torch.autograd.grad(log_side(lo, up, x, log_w, Normal(0.1)).sum(), lo,
                               create_graph=True)
    with pytest.raises(RuntimeError):
        g.sum().backward()


@pytest.mark.parametrize("noise", NOISES, ids=repr)
def test_blocks_of_the_cpu_pass_equal_one_block(noise, monkeypatch):
    """The CPU pass goes through the sides in blocks of about ``_BLOCK`` node terms (cache
    blocking): with blocks of 7 sides (a last partial block) the values and the gradients
    equal those of one block, batch dims and all."""
    import perturb.boxes._side_integral as si
    lo, up = _pairs(3, n=20)                                      # 60 sides
    x, log_w = _grid(lo, up, panels=4, order=8)
    outs = []
    for block in (si._BLOCK, 7 * 2 * x.shape[-1]):
        monkeypatch.setattr(si, "_BLOCK", block)
        l, u = lo.clone().requires_grad_(), up.clone().requires_grad_()
        v = log_side(l, u, x, log_w, noise)
        (v * torch.linspace(0.5, 1.5, v.numel(), dtype=F64).view_as(v)).sum().backward()
        outs.append((v.detach(), l.grad, u.grad))
    assert outs[0][0].shape == (20, 3)
    for one, blocked in zip(*outs):
        torch.testing.assert_close(blocked, one, rtol=1e-15, atol=1e-300)
