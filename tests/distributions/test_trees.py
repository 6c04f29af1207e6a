"""SpanningTreeDistribution and ArborescenceDistribution: family-specific behaviour (the generic
brute-force suite is in test_gibbs.py): Cayley's formula, the scoring conventions (symmetric
part; ignored diagonal and root column), masked edges, argument errors."""
from __future__ import annotations

import math

import pytest
import torch

from perturb.distributions import ArborescenceDistribution, SpanningTreeDistribution
from perturb.structured import Arborescences, SpanningTrees

F64 = torch.float64


@pytest.mark.parametrize("n", [3, 4, 5])
def test_cayley_uniform(n):
    logz = (n - 2) * math.log(n)
    for d in (SpanningTreeDistribution(torch.zeros(n, n, dtype=F64)),
              ArborescenceDistribution(torch.zeros(n, n, dtype=F64), root=n - 1)):
        torch.testing.assert_close(d.partition, torch.tensor(logz, dtype=F64))
        torch.testing.assert_close(d.entropy(), torch.tensor(logz, dtype=F64))


def test_spanning_tree_uses_the_symmetric_part():
    w = torch.randn(2, 5, 5, dtype=F64)
    s = 0.5 * (w + w.transpose(-1, -2))
    a, b = SpanningTreeDistribution(w), SpanningTreeDistribution(s)
    T = b.sample((4,), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(a.log_prob(T), b.log_prob(T))
    torch.testing.assert_close(a.entropy(), b.entropy())
    # the diagonal is ignored
    c = SpanningTreeDistribution(w + torch.diag_embed(torch.randn(2, 5, dtype=F64)))
    torch.testing.assert_close(c.log_prob(T), a.log_prob(T))
    torch.testing.assert_close(c.entropy(), a.entropy())


def test_arborescence_ignores_diagonal_and_root_column():
    w = torch.randn(5, 5, dtype=F64)
    v = w.clone()
    v.diagonal().add_(3.0)
    v[:, 2] += torch.randn(5, dtype=F64)
    a, b = ArborescenceDistribution(w, root=2), ArborescenceDistribution(v, root=2)
    T = a.sample((6,), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(a.log_prob(T), b.log_prob(T))
    torch.testing.assert_close(a.entropy(), b.entropy())
    assert bool(Arborescences(2).check(T).all())
    assert torch.equal(a.mode, b.mode)


@pytest.mark.parametrize("directed", [False, True])
def test_masked_edges(directed):
    n = 4
    w = torch.randn(n, n, dtype=F64)
    w[0, 1] = -math.inf                                     # forbids {0,1} (resp. 0 → 1)
    w = w.requires_grad_()
    d = ArborescenceDistribution(w, root=0) if directed else SpanningTreeDistribution(w)
    structure = Arborescences(0) if directed else SpanningTrees()
    Z = structure.enumerate(n, dtype=F64)
    ok = Z[:, 0, 1] == 0
    wf = w.detach().masked_fill(torch.isinf(w.detach()), 0.0)
    if directed:
        s = (Z * wf).sum((-1, -2))
    else:
        s = (torch.triu(Z, 1) * 0.5 * (wf + wf.T)).sum((-1, -2))
    logp = s[ok] - torch.logsumexp(s[ok], 0)
    torch.testing.assert_close(d.partition, torch.logsumexp(s[ok], 0))
    torch.testing.assert_close(d.entropy(), -(logp.exp() * logp).sum())
    assert d.marginals[0, 1] == 0
    lp = d.log_prob(Z)
    assert bool((lp[~ok] == -math.inf).all())
    torch.testing.assert_close(lp[ok], logp)
    T = d.sample((500,), generator=torch.Generator().manual_seed(2))
    assert bool((T[:, 0, 1] == 0).all())
    assert d.mode[0, 1] == 0
    (g,) = torch.autograd.grad(d.entropy() + d.log_prob(T[:3]).sum(), w)
    assert bool(torch.isfinite(g).all())


def test_large_scores_stay_finite():
    w = (1e4 * torch.randn(2, 6, 6, generator=torch.Generator().manual_seed(0)))
    w = w.requires_grad_()
    for d in (SpanningTreeDistribution(w), ArborescenceDistribution(w, root=3)):
        h = d.entropy()
        assert bool(torch.isfinite(h).all()) and bool((h > -1e-2).all())
        assert bool(torch.isfinite(d.log_prob(d.mode)).all())
        (g,) = torch.autograd.grad(h.sum(), w)
        assert bool(torch.isfinite(g).all())


def test_errors():
    S = torch.randn(2, 4, 4, dtype=F64)
    for make in (SpanningTreeDistribution, ArborescenceDistribution):
        with pytest.raises(ValueError, match="logits"):
            make(torch.randn(2, 4, 3, dtype=F64))
        with pytest.raises(ValueError, match="logits"):
            make(torch.randn(1, 1, dtype=F64))
        with pytest.raises(ValueError, match="logits"):
            make(S.long())
    for root in (-1, 4, 1.0, None):
        with pytest.raises(ValueError, match="root"):
            ArborescenceDistribution(S, root=root)
    cut = S.clone()
    cut[..., 0, 1:] = -math.inf
    cut[..., 1:, 0] = -math.inf                             # node 0 isolated
    d = SpanningTreeDistribution(cut)
    with pytest.raises(ValueError, match="disconnected"):
        d.partition


def test_entropy_gradient_of_a_peaked_arborescence():
    """Once NaN: the double backward of log through the reduced weights (denormal-small on this
    peaked graph) overflowed in reduced_marginals_vjp (tests/structured/trees/test__elimination.py)."""
    torch.manual_seed(12)
    w = (1e4 * torch.randn(2, 6, 6))[1].double().requires_grad_()
    d = ArborescenceDistribution(w, root=3)
    assert bool(torch.isfinite(d.entropy()))
    (g,) = torch.autograd.grad(d.entropy(), w)
    assert bool(torch.isfinite(g).all())
