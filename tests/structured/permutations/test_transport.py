"""Tests of perturb/structured/permutations/transport.py: the Transport(a, b) structure.

Oracles: scipy.optimize.linprog (the LP max ⟨w, P⟩ over U(a, b), an independent solver), POT's
``ot.emd`` and ``ot.sinkhorn``, brute-force vertex enumeration, the Birkhoff special case
(a = b = 1 gives matching and doubly stochastic Sinkhorn), float64 gradcheck.
"""
import numpy as np
import ot
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

import perturb
from perturb import Gumbel, regularized_argmax, relax
from perturb.structured import Permutations, Transport, matching, sinkhorn

from _draws import randn as _randn

F64 = torch.float64


def _marginals(n, m, batch=(), seed=0, zeros=False):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(*batch, n, generator=g, dtype=F64) + 0.2
    b = torch.rand(*batch, m, generator=g, dtype=F64) + 0.2
    if zeros:
        a[..., 0] = 0.0
        b[..., -1] = 0.0
    return a, b * a.sum(-1, keepdim=True) / b.sum(-1, keepdim=True)


def _linprog_value(w, a, b):
    """max ⟨w, P⟩ over U(a, b) by scipy's HiGHS LP solver (equality constraints, P ≥ 0)."""
    n, m = w.shape
    A = np.zeros((n + m, n * m))
    for i in range(n):
        A[i, i * m:(i + 1) * m] = 1.0
    for j in range(m):
        A[n + j, j::m] = 1.0
    res = linprog(-w.reshape(-1).numpy(), A_eq=A, b_eq=np.concatenate([a.numpy(), b.numpy()]),
                  bounds=(0, None), method="highs")
    assert res.status == 0
    return -res.fun


# ------------------------------------------------------------------------------------------
# exact argmax
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,m", [(2, 3), (4, 4), (5, 3), (1, 4), (6, 7)])
def test_argmax_is_the_linprog_optimum(n, m):
    a, b = _marginals(n, m, seed=n * 10 + m)
    T = Transport(a, b)
    w = _randn(3, n, m, seed=m)
    P = T.argmax(w)
    assert P.shape == w.shape and P.dtype == F64
    assert bool(T.check(P).all())
    for k in range(3):
        torch.testing.assert_close((w[k] * P[k]).sum(), torch.tensor(
            _linprog_value(w[k], a, b), dtype=F64), atol=1e-9, rtol=1e-9)
        torch.testing.assert_close(P[k], torch.from_numpy(ot.emd(a.numpy(), b.numpy(),
                                                                 -w[k].numpy())))


@pytest.mark.parametrize("n,m", [(1, 1), (1, 3), (3, 1), (4, 5)])
def test_argmax_large_scores(n, m):
    """Scores of ±100 (costs far below 0): POT's simplex calls some negative-cost problems
    infeasible (1 x 1 with cost < −2); the solver shifts the cost to be nonnegative."""
    a, b = _marginals(n, m, batch=(4,), seed=20)
    w = 100 * _randn(4, n, m, seed=21)
    P = Transport(a, b).argmax(w)
    for k in range(4):
        assert abs(float((w[k] * P[k]).sum()) - _linprog_value(w[k], a[k], b[k])) < 1e-8


def test_argmax_batched_marginals_and_float32():
    a, b = _marginals(3, 5, batch=(4,), seed=1)
    w = _randn(2, 4, 3, 5, seed=2, dtype=torch.float32)       # marginals broadcast over dim 0
    P = Transport(a, b).argmax(w)
    assert P.dtype == torch.float32 and P.shape == w.shape
    for i in range(2):
        for k in range(4):
            value = _linprog_value(w[i, k].double(), a[k], b[k])
            assert abs(float((w[i, k].double() * P[i, k].double()).sum()) - value) < 1e-5


def test_argmax_empty_batch():
    a, b = _marginals(2, 3)
    assert Transport(a, b).argmax(torch.zeros(0, 2, 3, dtype=F64)).shape == (0, 2, 3)


def test_uniform_unit_marginals_give_matching():
    """a = b = 1 (n = m): the vertices are the permutation matrices."""
    ones = torch.ones(5, dtype=F64)
    w = _randn(4, 5, 5, seed=3)
    T = Transport(ones, ones)
    torch.testing.assert_close(T.argmax(w), matching(w))
    assert bool(Permutations().check(T.argmax(w)).all())
    assert Transport(ones[:4], ones[:4]).enumerate(4, dtype=F64).shape[0] == 24   # 4!
    torch.testing.assert_close(regularized_argmax(w, T, tau=0.3),
                               regularized_argmax(w, Permutations(), tau=0.3))


def test_enumerate_and_check():
    """Vertices: brute force over bases; each is a vertex, the argmax is the best of them, and
    interior points (the independent plan a bᵀ / Σa) or infeasible plans are not vertices."""
    a, b = _marginals(3, 3, seed=4)
    T = Transport(a, b)
    V = T.enumerate(3, dtype=F64)
    assert V.shape[1:] == (3, 3) and bool(T.check(V).all())
    # a vertex of the 3 x 3 transport polytope has at most n + m − 1 = 5 nonzero entries
    assert bool(((V > 0).sum((-1, -2)) <= 5).all())
    assert len({tuple(v.flatten().tolist()) for v in V}) == V.shape[0]
    w = _randn(20, 3, 3, seed=5)
    best = (w.unsqueeze(1) * V).sum((-1, -2)).amax(-1)
    torch.testing.assert_close((w * T.argmax(w)).sum((-1, -2)), best)
    independent = a[:, None] * b[None, :] / a.sum()
    assert not bool(T.check(independent))
    assert not bool(T.check(V[0] * 1.01))
    assert not bool(T.check(torch.zeros(3, 4, dtype=F64)))


def test_zero_masses():
    """A zero entry of a or b is an empty row or column: zero in the plan, the rest equal to
    the problem without it."""
    a, b = _marginals(4, 5, seed=6, zeros=True)
    T = Transport(a, b)
    w = _randn(2, 4, 5, seed=7)
    P = T.argmax(w)
    assert bool((P[:, 0] == 0).all()) and bool((P[..., -1] == 0).all())
    assert bool(T.check(P).all())
    X = regularized_argmax(w, T, tau=0.5)
    assert bool((X[:, 0] == 0).all()) and bool((X[..., -1] == 0).all())
    sub = sinkhorn(w[:, 1:, :-1], tau=0.5, a=a[1:], b=b[:-1], tol=1e-10)
    torch.testing.assert_close(X[:, 1:, :-1], sub, atol=1e-6, rtol=1e-6)


# ------------------------------------------------------------------------------------------
# the Entropy relaxation
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tau", [1.0, 0.2])
def test_entropy_is_pot_sinkhorn(tau):
    a, b = _marginals(4, 6, seed=8)
    w = _randn(4, 6, seed=9)
    X = regularized_argmax(w, Transport(a, b, tol=1e-12), tau=tau)
    ref = ot.sinkhorn(a.numpy(), b.numpy(), -w.numpy(), reg=tau, method="sinkhorn_log",
                      numItermax=100000, stopThr=1e-13)
    torch.testing.assert_close(X, torch.from_numpy(ref), atol=1e-8, rtol=1e-6)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 6), m=st.integers(1, 6), batch=st.integers(1, 3),
       tau=st.floats(0.05, 5.0), seed=st.integers(0, 2**31 - 1))
def test_property_marginals_hold(n, m, batch, tau, seed):
    """The relaxed plan and the exact plan are in U(a, b); the relaxed linear value is below
    the exact optimum, and the relaxed plan's regularized objective is at least the exact
    plan's (it is the maximiser over U(a, b))."""
    a, b = _marginals(n, m, batch=(batch,), seed=seed)
    T = Transport(a, b, tol=1e-10)
    w = _randn(batch, n, m, seed=seed + 1)
    X = regularized_argmax(w, T, tau=tau)
    P = T.argmax(w)
    for Y in (X, P):
        assert bool((Y >= 0).all())
        torch.testing.assert_close(Y.sum(-1), a, atol=1e-8, rtol=0)
        torch.testing.assert_close(Y.sum(-2), b, atol=1e-8, rtol=0)
    assert bool(T.check(P).all())
    exact, soft = (w * P).sum((-1, -2)), (w * X).sum((-1, -2))
    assert bool((soft <= exact + 1e-8).all())
    h = lambda Y: -(Y * torch.log(torch.where(Y > 0, Y, 1.0))).sum((-1, -2))  # noqa: E731
    assert bool((soft + tau * h(X) >= exact + tau * h(P) - 1e-7).all())


@pytest.mark.parametrize("n,m", [(3, 4), (5, 5), (6, 3)])
def test_small_tau_approaches_the_emd_plan(n, m):
    """τ → 0: the entropic plan converges to the optimal plan (unique for continuous scores),
    the limit POT users expect from ot.sinkhorn → ot.emd."""
    a, b = _marginals(n, m, seed=n + m)
    w = _randn(n, m, seed=11)
    T = Transport(a, b, n_iters=20000, tol=1e-12)
    P = T.argmax(w)
    errs = [float((regularized_argmax(w, T, tau=t) - P).abs().max()) for t in (0.1, 0.01, 1e-3)]
    assert errs[-1] < 1e-6, errs
    # decreasing with τ, until the solver's accuracy: tol = 1e-12 on the marginals bounds an
    # entry's error by n·tol (at most 6e-12 here)
    assert all(e2 <= max(e1, max(n, m) * 1e-12) for e1, e2 in zip(errs, errs[1:])), errs


# ------------------------------------------------------------------------------------------
# gradients, relax, registry
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backward", ["implicit", "unroll"])
def test_gradcheck_scores_and_marginals(backward):
    a, b = _marginals(3, 4, seed=12)
    w = _randn(2, 3, 4, seed=13).requires_grad_()
    a = a.clone().requires_grad_()
    b = b.clone().requires_grad_()

    def f(w, a, b):
        # the gauge (t, −t) of the marginal gradients is fixed by projecting the inputs'
        # perturbations onto Σda = Σdb: feed b rescaled to Σa
        return regularized_argmax(w, Transport(a, b * a.sum() / b.sum(), n_iters=5000,
                                               tol=1e-13), tau=0.7, backward=backward)

    assert torch.autograd.gradcheck(f, (w, a, b), atol=1e-6, rtol=1e-5)


def test_relax_with_gumbel_and_hard():
    a, b = _marginals(4, 5, seed=14)
    T = Transport(a, b)
    theta = _randn(8, 4, 5, seed=15).requires_grad_()
    g = torch.Generator().manual_seed(0)
    X = relax(theta, T, Gumbel(), tau=0.1, generator=g)
    torch.testing.assert_close(X.sum(-1), a.expand(8, 4), atol=1e-5, rtol=0)
    H = relax(theta, T, Gumbel(), tau=0.1, hard=True, generator=torch.Generator().manual_seed(0))
    assert bool(T.check(H.detach()).all())
    (H * _randn(8, 4, 5, seed=16)).sum().backward()
    assert theta.grad is not None and bool(torch.isfinite(theta.grad).all())


def test_registry_pairs():
    rows = {(p.structure, p.regularizer): p for p in perturb.registered_pairs()}
    assert rows[("Transport", "Entropy")].supported
    for reg in ("SquaredNorm", "ExpFamilyEntropy"):
        assert not rows[("Transport", reg)].supported
    a, b = _marginals(2, 3)
    with pytest.raises(NotImplementedError, match="quadratic program"):
        regularized_argmax(_randn(2, 3), Transport(a, b), perturb.SquaredNorm())
    with pytest.raises(NotImplementedError, match="permanent"):
        regularized_argmax(_randn(2, 3), Transport(a, b), perturb.ExpFamilyEntropy())


def test_equality_hash_repr():
    a, b = _marginals(2, 3)
    assert Transport(a, b) == Transport(a.clone(), b.clone())
    assert hash(Transport(a, b)) == hash(Transport(a.clone(), b.clone()))
    assert Transport(a, b) != Transport(a, b, tol=1e-3)
    assert Transport(a, b) != Permutations()
    assert "Transport(a=<(2,)>, b=<(3,)>" in repr(Transport(a, b))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_cuda_matches_cpu():
    a, b = _marginals(5, 7, seed=17)
    w = _randn(3, 5, 7, seed=18)
    T = Transport(a.cuda(), b.cuda())
    torch.testing.assert_close(T.argmax(w.cuda()).cpu(), Transport(a, b).argmax(w))
    torch.testing.assert_close(regularized_argmax(w.cuda(), T, tau=0.3).cpu(),
                               regularized_argmax(w, Transport(a, b), tau=0.3))


def test_transport_cost_is_pots_sinkhorn2_and_emd2_in_the_limit():
    """Transport(a, b).cost(C, τ) = ⟨C, P_τ⟩ = ot.sinkhorn2(a, b, C, τ) at several τ, tends to
    ot.emd2 as τ → 0, and its gradient is that of the value (float64 gradcheck; POT's envelope
    gradient, the plan, is a different quantity, checked here to differ)."""
    import ot
    g = torch.Generator().manual_seed(0)
    a = torch.rand(5, dtype=torch.float64, generator=g) + 0.1
    b = torch.rand(7, dtype=torch.float64, generator=g) + 0.1
    a, b = a / a.sum(), b / b.sum()
    C = torch.rand(5, 7, dtype=torch.float64, generator=g)
    T = Transport(a, b, n_iters=100_000, tol=1e-12)
    for reg in (1.0, 0.1, 0.01):
        want = ot.sinkhorn2(a.numpy(), b.numpy(), C.numpy(), reg, numItermax=100_000,
                            stopThr=1e-12)
        assert T.cost(C, reg).item() == pytest.approx(float(want), rel=1e-9)
    assert T.cost(C, 1e-3).item() == pytest.approx(ot.emd2(a.numpy(), b.numpy(), C.numpy()),
                                                   abs=1e-6)
    c = C.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda x: T.cost(x, 0.5), (c,))
    (grad,) = torch.autograd.grad(T.cost(c, 0.5), c)
    plan = perturb.regularized_argmax(-C, T, tau=0.5)
    assert not torch.allclose(grad, plan)
    batched = T.cost(torch.stack([C, 2 * C]), 0.1)
    assert batched.shape == (2,)
    torch.testing.assert_close(batched[0], T.cost(C, 0.1))
