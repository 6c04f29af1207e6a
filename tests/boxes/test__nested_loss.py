"""Tests for perturb.boxes._nested_loss: log(1 − P) of nearly nested pairs against the
far-pair form where both apply, batches against their pairs alone (values and gradients).
The nested-pair accuracy against mpmath is tested through log1m_containment_prob in
test_expected_volumes.py and the engines' own test files."""
from __future__ import annotations

import math

import pytest
import torch

from perturb.boxes._nested_loss import _log1m_near, _log1m_ratio
from perturb.boxes.expected_volumes import _log_sides
from perturb.noise import Logistic, Normal

F64 = torch.float64


@pytest.mark.parametrize("noise", [Normal(0.1), Logistic(0.1)], ids=["normal", "logistic"])
def test_log1m_far_pairs_equal_the_loss_integral(noise):
    """Pairs with P <= 1/2 take log1mexp(log P); on them the loss integral (what the nearly
    nested pairs take, and every pair took before) gives the same log(1 − P) to 1e-12
    relative, or 1e-14 absolute where log(1 − P) ≈ −P is small (there the integral forms
    log(1 − P) as the log of a sum near 1, which log1mexp(log P) does not), and a batch
    mixing both kinds equals its pairs computed alone (values and gradients)."""
    g = torch.Generator().manual_seed(5)
    lo_a = torch.rand(40, 4, generator=g, dtype=F64)
    up_a = lo_a + 0.1 + 0.4 * torch.rand(40, 4, generator=g, dtype=F64)
    lo_b = torch.rand(40, 4, generator=g, dtype=F64)
    up_b = lo_b + 0.1 + 0.4 * torch.rand(40, 4, generator=g, dtype=F64)
    lo_a[:5], up_a[:5] = -0.5, 2.0                      # b nearly nested in a: the integral
    log_b = _log_sides(lo_b.unsqueeze(0), up_b.unsqueeze(0), noise)
    log_ab = _log_sides(torch.stack([lo_a, lo_b]), torch.stack([up_a, up_b]), noise)
    near = _log1m_near(lo_a, up_a, lo_b, up_b, log_b, log_ab, noise)
    corners = [t.clone().requires_grad_() for t in (lo_a, up_a, lo_b, up_b)]
    got = _log1m_ratio(*corners, noise)
    far = (log_ab - log_b).clamp(max=0).sum(-1) <= -math.log(2)
    assert 0 < int(far.sum()) < 40
    torch.testing.assert_close(got[far].detach(), near[far], rtol=1e-12, atol=1e-14)
    got.sum().backward()
    for i in (0, 3, 7):
        one = [t[i:i + 1].clone().requires_grad_() for t in (lo_a, up_a, lo_b, up_b)]
        alone = _log1m_ratio(*one, noise)
        alone.sum().backward()
        torch.testing.assert_close(got[i:i + 1].detach(), alone.detach(), rtol=1e-12, atol=0)
        for full, part in zip(corners, one):
            torch.testing.assert_close(full.grad[i:i + 1], part.grad, rtol=1e-12, atol=1e-14)


def test_nothing_lost_under_bounded_noise_has_a_zero_gradient():
    """b inside the part of a where Uniform corners always contain it, in every coordinate:
    1 − P = 0 exactly, log(1 − P) = −inf and the gradient 0 (logsumexp of all −inf gave NaN,
    which reached the parameters through the floored negative loss)."""
    from perturb.boxes import Box, log1m_containment_prob
    from perturb.noise import Uniform
    lo = torch.tensor([[0.9, 0.9]], dtype=F64, requires_grad=True)
    a = Box(torch.zeros(1, 2, dtype=F64), torch.full((1, 2), 3.0, dtype=F64))
    out = log1m_containment_prob(a, Box(lo, lo.detach() + 0.4), noise=Uniform(-0.1, 0.1))
    assert float(out.detach()) == -math.inf
    (g,) = torch.autograd.grad(torch.where(torch.isneginf(out), 0.0, out).sum(), lo)
    assert torch.equal(g, torch.zeros_like(g))
