"""KSubsetDistribution: family-specific behaviour (the generic brute-force suite over every
Gibbs family is in test_gibbs.py): masks, closed forms, extremes, argument errors."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from perturb.distributions import KSubsetDistribution

F64 = torch.float64


def _brute(theta, k):
    """(Z, log p) over the k-subsets of the unmasked items, by enumeration (1-D theta)."""
    n = theta.shape[-1]
    Z = torch.tensor([[float(i in c) for i in range(n)]
                      for c in itertools.combinations(range(n), k)], dtype=F64)
    s = torch.stack([theta[z.bool()].sum() for z in Z])
    return Z, s - torch.logsumexp(s, 0)


def test_uniform_closed_form():
    n, k = 7, 3
    d = KSubsetDistribution(torch.zeros(n, dtype=F64), k)
    torch.testing.assert_close(d.partition, torch.tensor(math.log(math.comb(n, k)), dtype=F64))
    torch.testing.assert_close(d.entropy(), d.partition)
    torch.testing.assert_close(d.marginals, torch.full((n,), k / n, dtype=F64))


def test_k_equals_n_is_a_point_mass():
    theta = torch.randn(4, dtype=F64)
    d = KSubsetDistribution(theta, 4)
    torch.testing.assert_close(d.entropy(), torch.tensor(0.0, dtype=F64), atol=1e-12, rtol=0)
    torch.testing.assert_close(d.log_prob(torch.ones(4, dtype=F64)),
                               torch.tensor(0.0, dtype=F64), atol=1e-12, rtol=0)
    assert torch.equal(d.sample((3,)), torch.ones(3, 4, dtype=F64))


def test_masked_items():
    theta = torch.tensor([0.3, -math.inf, 1.2, -0.5, 0.0], dtype=F64, requires_grad=True)
    d = KSubsetDistribution(theta, 2)
    keep = torch.tensor([0, 2, 3, 4])
    Z, logp = _brute(theta.detach()[keep], 2)
    torch.testing.assert_close(d.partition, torch.logsumexp(
        torch.stack([theta.detach()[keep][z.bool()].sum() for z in Z]), 0))
    assert d.marginals[1] == 0
    torch.testing.assert_close(d.entropy(), -(logp.exp() * logp).sum())
    z = d.sample((2000,), generator=torch.Generator().manual_seed(0))
    assert bool((z[:, 1] == 0).all())
    assert d.log_prob(torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0], dtype=F64)) == -math.inf
    assert bool(torch.isfinite(d.log_prob(z)).all())
    assert d.mode[1] == 0
    (g,) = torch.autograd.grad(d.entropy() + d.log_prob(z[:5]).sum(), theta)
    assert bool(torch.isfinite(g).all()) and g[1] == 0


@pytest.mark.parametrize("scale", [1e4, 1e-4])
def test_extreme_logits_stay_finite(scale):
    theta = (scale * torch.randn(3, 8, dtype=torch.float32)).requires_grad_()
    d = KSubsetDistribution(theta, 3)
    h = d.entropy()
    assert bool(torch.isfinite(h).all())
    assert bool((h >= -1e-3).all()) and bool((h <= math.log(math.comb(8, 3)) + 1e-3).all())
    assert bool(torch.isfinite(d.log_prob(d.mode)).all())
    (g,) = torch.autograd.grad(h.sum(), theta)
    assert bool(torch.isfinite(g).all())


def test_errors():
    v = torch.randn(3, 5, dtype=F64)
    for k in (0, 6, 1.5, True):
        with pytest.raises(ValueError, match="k"):
            KSubsetDistribution(v, k)
    with pytest.raises(ValueError, match="logits"):
        KSubsetDistribution(v.long(), 2)
    with pytest.raises(ValueError, match="logits"):
        KSubsetDistribution(torch.tensor(1.0), 1)
    masked = v.clone()
    masked[1, 1:] = -math.inf                               # one unmasked item, k = 2
    with pytest.raises(ValueError, match="logits"):
        KSubsetDistribution(masked, 2)
    with pytest.raises(ValueError, match="logits"):
        KSubsetDistribution(v + math.inf, 2)
