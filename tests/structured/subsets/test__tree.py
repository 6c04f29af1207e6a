"""Tests of perturb/structured/subsets/_tree.py, the kernels of the k-subset DP, against brute
force: the count distribution of independent Bernoullis (Poisson-binomial, by enumeration), the
conditional marginals P(l ∈ S | |S| = k) by enumeration, both kernels of the merge and split
products against their definitions, and the tilt ν against E_ν[N] = k."""
import itertools
import math

import pytest
import torch

from perturb.structured.subsets import _tree

F64 = torch.float64


def _poisson_binomial(p: torch.Tensor) -> torch.Tensor:
    """P(N = j), j = 0..n, of a row of independent Bernoulli(p_l), by enumeration."""
    n = p.shape[-1]
    out = torch.zeros(n + 1, dtype=F64)
    for bits in itertools.product([0, 1], repeat=n):
        b = torch.tensor(bits, dtype=F64)
        out[int(b.sum())] += float(torch.prod(torch.where(b > 0, p, 1 - p)))
    return out


@pytest.mark.parametrize("n, k", [(1, 1), (3, 2), (4, 1), (7, 3), (9, 5), (12, 4)])
def test_inside_root_is_the_truncated_count_distribution(n, k):
    g = torch.Generator().manual_seed(n * 10 + k)
    x = torch.randn(2, n, dtype=F64, generator=g)
    t0 = _tree._leaves(x)                                        # padded with p = 0
    N = t0.shape[1]
    assert t0.shape == (2, N, 2) and N >= n and (t0[1, n:] == 0).all() and (t0[0, n:] == 1).all()
    torch.testing.assert_close(t0[1, :n].T, torch.sigmoid(x))
    root = _tree._inside(t0, k)[-1]
    assert root.shape == (k + 1, 1, 2)
    for b in range(2):
        want = _poisson_binomial(torch.sigmoid(x[b]))[: k + 1]
        torch.testing.assert_close(root[:, 0, b], want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("n, k", [(5, 2), (8, 3), (10, 6), (1, 1)])
def test_outside_and_leaves_give_the_conditional_marginals(n, k):
    """μ_l = P(l ∈ S | |S| = k) under independent Bernoulli(p_l), by enumerating k-subsets."""
    g = torch.Generator().manual_seed(n + k)
    x = torch.randn(1, n, dtype=F64, generator=g)
    tables = _tree._inside(_tree._leaves(x), k)
    outs, sws = _tree._outside(tables, k)
    assert [o.shape for o in outs] == [t.shape for t in tables]
    for t, sw in zip(tables, sws):                       # each block beside its sibling
        h = t.shape[1] // 2
        assert torch.equal(sw[:, 0], t[:, h:]) and torch.equal(sw[:, 1], t[:, :h])
    mu = _tree._leaf_marginals(tables[0], outs[0])[0, :n]
    q = torch.sigmoid(x[0])
    want, total = torch.zeros(n, dtype=F64), 0.0
    for s in itertools.combinations(range(n), k):
        inside = torch.zeros(n, dtype=torch.bool)
        inside[list(s)] = True
        w = float(torch.prod(torch.where(inside, q, 1 - q)))
        want += w * inside.to(F64)
        total += w
    torch.testing.assert_close(mu, want / total, rtol=1e-10, atol=1e-13)
    assert float(mu.sum()) == pytest.approx(k, rel=1e-12)


@pytest.mark.parametrize("kind", ["shift", "window"])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_products_against_their_definitions(kind, dtype, monkeypatch):
    """The merge (truncated convolution) and the split (correlation), each kernel forced."""
    monkeypatch.setattr(_tree, "_kernel", lambda t, entries: kind)
    g = torch.Generator().manual_seed(0)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for m, m_out in [(1, 1), (2, 3), (3, 4), (5, 5), (4, 7)]:
        L, R = (torch.randn(m, 3, 2, generator=g).to(dtype) for _ in range(2))
        got = _tree._conv(L, R, m_out)
        want = torch.stack([sum((L[i] * R[c - i] for i in range(m) if 0 <= c - i < m),
                                torch.zeros(3, 2, dtype=dtype)) for c in range(m_out)])
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    for m, m_o in [(1, 1), (2, 3), (3, 2), (4, 7), (5, 5)]:
        I = torch.randn(m, 2, 3, generator=g).to(dtype)
        o = torch.randn(m_o, 1, 3, generator=g).to(dtype)
        got = _tree._corr(o, I)
        want = torch.stack([sum((I[i] * o[j + i] for i in range(m) if j + i < m_o),
                                torch.zeros(2, 3, dtype=dtype)) for j in range(m)])
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_tilt_centres_the_count_near_k():
    """ys = y − c with c the k-th largest score, and E_ν[N] = Σ σ(ys − ν) close to k (one
    Newton step from a start exact in the exponential regime: within 1 of k)."""
    g = torch.Generator().manual_seed(3)
    y = 3 * torch.randn(4, 30, dtype=F64, generator=g)
    k = 6
    ys, c, nu = _tree._tilt(y, k)
    torch.testing.assert_close(ys + c, y)
    kth = torch.topk(y, k, -1).values[:, -1:]
    torch.testing.assert_close(c, kth)
    expected = torch.sigmoid(ys - nu).sum(-1)
    assert ((expected - k).abs() < 1.0).all()
    assert math.isfinite(float(nu.abs().max()))
