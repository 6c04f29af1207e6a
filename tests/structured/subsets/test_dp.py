"""The log-depth k-subset tree (perturb/structured/subsets/dp.py) against independent oracles.

Oracles: enumeration of all C(n, k) subsets (float64), the former sequential DP (kept in the
module as a private reference), float64 gradcheck, the three kernels against each other, and
Monte Carlo frequencies of the sampler with 5-sigma bounds from the standard error.
"""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from perturb import set_validation
from perturb.structured import KSubset, topk
from perturb.structured.subsets import dp as dp
from perturb.structured.subsets import _tree as tree
from perturb.structured.subsets.dp import ksubset_log_partition, ksubset_marginals, sample_ksubset


def _brute(w, k):
    """log Z, marginals, covariance and subset probabilities of one row (float64, -inf ok)."""
    n = w.shape[-1]
    Z = KSubset(k).enumerate(n, dtype=torch.float64)
    s = torch.where(Z > 0, w.double(), 0.0).sum(-1)        # Σ_{i∈S} w_i (−inf when masked)
    p = torch.softmax(s, 0)
    mu = p @ Z
    return torch.logsumexp(s, 0), mu, (Z * p[:, None]).T @ Z - torch.outer(mu, mu), p, Z


@st.composite
def _problem(draw):
    n = draw(st.integers(1, 8))
    k = draw(st.integers(1, n))
    batch = draw(st.sampled_from([(), (1,), (3,), (2, 2)]))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    scale = draw(st.sampled_from([0.1, 1.0, 5.0, 50.0]))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    w = scale * torch.randn(*batch, n, generator=g, dtype=torch.float64)
    if draw(st.booleans()):                       # ties
        w = w.round()
    n_masked = draw(st.integers(0, n - k))        # keep ≥ k finite entries per row
    if n_masked:
        idx = torch.rand(*batch, n, generator=g).argsort(-1)[..., :n_masked]
        w = w.scatter(-1, idx, -math.inf)
    return w.to(dtype), k


@settings(max_examples=80, deadline=None)
@given(_problem())
def test_matches_enumeration(problem):
    w, k = problem
    logz, mu = ksubset_log_partition(w, k), ksubset_marginals(w, k)
    assert logz.shape == w.shape[:-1] and mu.shape == w.shape and mu.dtype == w.dtype
    rows = w.reshape(-1, w.shape[-1])
    f64 = w.dtype == torch.float64
    for r, lz, m in zip(rows, logz.reshape(-1), mu.reshape(-1, w.shape[-1])):
        ref_lz, ref_mu, *_ = _brute(r, k)
        torch.testing.assert_close(lz.double(), ref_lz, rtol=1e-12 if f64 else 1e-5,
                                   atol=1e-12 if f64 else 1e-4)
        torch.testing.assert_close(m.double(), ref_mu, rtol=0, atol=1e-12 if f64 else 1e-5)
        assert bool((m[r == -math.inf] == 0).all())


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), data=st.data(), seed=st.integers(0, 2**16),
       scale=st.sampled_from([0.01, 1.0, 30.0, 1e4]),
       dtype=st.sampled_from([torch.float32, torch.float64]))
def test_marginals_sum_to_k_in_unit_interval(n, data, seed, scale, dtype):
    k = data.draw(st.integers(1, n))
    w = (scale * torch.randn(3, n, generator=torch.Generator().manual_seed(seed))).to(dtype)
    for tau in (1e-3, 1.0):
        mu = ksubset_marginals(w, k, tau)
        assert bool(torch.isfinite(mu).all() & (mu >= 0).all() & (mu <= 1).all())
        tol = (1e-4 if dtype == torch.float32 else 1e-10) * max(1, k)
        torch.testing.assert_close(mu.sum(-1), torch.full((3,), float(k), dtype=dtype),
                                   rtol=0, atol=tol)


@pytest.mark.parametrize("n,k", [(1, 1), (2, 1), (37, 5), (300, 10), (257, 64), (100, 99)])
def test_tree_matches_sequential_reference(n, k, seed):
    """New vs old: values, and the backward (Cov·g) against the sequential forward-mode one."""
    y = 3 * torch.randn(4, n, dtype=torch.float64)
    g = torch.randn(4, n, dtype=torch.float64)
    x = y.clone().requires_grad_(True)
    mu = ksubset_marginals(x, k)
    (new_vjp,) = torch.autograd.grad((mu * g).sum(), x)
    xo = y.clone().requires_grad_(True)
    old = dp._SequentialMarginals.apply(xo, k)[0]
    (old_vjp,) = torch.autograd.grad((old * g).sum(), xo)
    torch.testing.assert_close(mu, old, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(new_vjp, old_vjp, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(ksubset_log_partition(y, k), dp._sequential_log_partition(y, k),
                               rtol=1e-12, atol=1e-10)


def test_gradcheck_log_partition_and_marginals(seed):
    w = torch.randn(2, 9, dtype=torch.float64, requires_grad=True)
    w.data[0, 3] = -math.inf
    tau = torch.tensor([0.7, 1.3], dtype=torch.float64, requires_grad=True)
    finite = torch.randn(2, 9, dtype=torch.float64, requires_grad=True)
    for k in (1, 3):
        assert torch.autograd.gradcheck(lambda v, t: ksubset_log_partition(v, k, t), (finite, tau))
        assert torch.autograd.gradcheck(lambda v, t: ksubset_marginals(v, k, t), (finite, tau))
        assert torch.autograd.gradgradcheck(lambda v: ksubset_log_partition(v, k), (finite,))
        # unrolled: autograd through the tree, any order
        assert torch.autograd.gradgradcheck(lambda v: dp._marginals_unrolled(v, k), (finite,))
    # masked entries: gradient zero there, finite elsewhere
    (gr,) = torch.autograd.grad((ksubset_marginals(w, 3) * torch.randn(2, 9,
                                 dtype=torch.float64)).sum(), w)
    assert gr[0, 3] == 0 and bool(torch.isfinite(gr).all())


def test_vjp_helper_is_covariance(seed):
    n, k = 8, 3
    y = 2 * torch.randn(3, n, dtype=torch.float64)
    y[1, 0] = -math.inf
    g = torch.randn(3, n, dtype=torch.float64)
    ys, _, nu = dp._prepare(y, k)
    mu, t0, *tables = dp._KSubsetMarginals.apply(ys, nu, k)
    out = dp._marginals_vjp(t0, tables, g, k)
    for b in range(3):
        torch.testing.assert_close(out[b], _brute(y[b], k)[2] @ g[b], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["shift", "window"])
def test_kernels_agree(kind, dtype, monkeypatch, seed):
    """Each kernel (forced at every level) gives the enumeration's marginals and Cov·g, over
    several tree levels (n = 8 and 13: three and four levels above the leaves)."""
    monkeypatch.setattr(tree, "_kernel", lambda t, entries: kind)
    for n in (8, 13):
        w = 2 * torch.randn(3, n, dtype=torch.float64)
        g = torch.randn(3, n, dtype=torch.float64)
        for k in (1, 4, 7):
            x = w.to(dtype).requires_grad_(True)
            mu = ksubset_marginals(x, k)
            (vjp,) = torch.autograd.grad((mu * g.to(dtype)).sum(), x)
            for b in range(3):
                _, ref_mu, cov, *_ = _brute(w[b], k)
                tol = 1e-6 if dtype == torch.float32 else 1e-12
                torch.testing.assert_close(mu[b].double(), ref_mu, rtol=0, atol=tol)
                torch.testing.assert_close(vjp[b].double(), cov @ g[b], rtol=0,
                                           atol=1e-5 if dtype == torch.float32 else 1e-12)


def test_kernel_choice_at_scale_matches_sequential_reference(monkeypatch, seed):
    """A batch wide enough that the CPU picks the shift kernel on the low levels and the windows
    on the high ones (both recorded), against the former sequential DP (float64)."""
    chosen = set()
    pick = tree._kernel

    def record(t, entries):
        kind = pick(t, entries)
        chosen.add(kind)
        return kind
    monkeypatch.setattr(tree, "_kernel", record)
    y = 2 * torch.randn(64, 300, dtype=torch.float64)
    g = torch.randn(64, 300, dtype=torch.float64)
    x = y.clone().requires_grad_(True)
    mu = ksubset_marginals(x, 7)
    (vjp,) = torch.autograd.grad((mu * g).sum(), x)
    assert chosen == {"shift", "window"}
    xo = y.clone().requires_grad_(True)
    old = dp._SequentialMarginals.apply(xo, 7)[0]
    (old_vjp,) = torch.autograd.grad((old * g).sum(), xo)
    torch.testing.assert_close(mu, old, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(vjp, old_vjp, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ties_at_extreme_scores(dtype):
    """Issue 17: exact ±1e4 ties at τ = 1e-3 (|y| = 1e7), compared with float64 enumeration."""
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        n = int(torch.randint(2, 9, (), generator=g))
        k = int(torch.randint(1, n + 1, (), generator=g))
        w = torch.randint(-1, 2, (n,), generator=g).to(torch.float64) * 1e4
        mu = ksubset_marginals(w.to(dtype), k, 1e-3)
        torch.testing.assert_close(mu.double(), _brute(w / 1e-3, k)[1], rtol=0,
                                   atol=1e-6 if dtype == torch.float32 else 1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_unrolled_backward_at_extreme_scores_is_finite_and_equals_the_analytic_one(dtype):
    """Scores U(−1e4, 1e4) at τ = 1e-3 (|y| up to 1e7), including ±1e4 ties: the marginals'
    gradient by unrolling (autograd twice through the tree, which differentiated softplus
    through torch.logaddexp, whose double backward overflows at such gaps) is finite and
    equals the analytic (tangent-pass) one."""
    g = torch.Generator().manual_seed(3)
    w = (2 * torch.rand(6, 20, generator=g, dtype=dtype) - 1) * 1e4
    w[0, :4] = 1e4                                                # ties at the top
    c = torch.randn(6, 20, generator=g, dtype=dtype)
    grads = []
    for mode in ("analytic", "unroll"):
        x = w.clone().requires_grad_()
        mu = ksubset_marginals(x, 5, 1e-3, backward=mode)
        (gx,) = torch.autograd.grad((mu * c).sum(), x)
        assert bool(torch.isfinite(mu).all()) and bool(torch.isfinite(gx).all()), mode
        grads.append(gx)
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=1e-9)


def _hard_rows(n):
    g = torch.Generator().manual_seed(n)
    yield torch.zeros(n)
    yield torch.randn(n, generator=g) * 1e3
    yield torch.where(torch.rand(n, generator=g) < 0.5, 1e7, -1e7)
    yield torch.randint(-1, 2, (n,), generator=g).float() * 1e4
    yield torch.arange(n).float() * 0.01
    yield torch.cat([torch.zeros(n - 5), torch.full((5,), 1000.0)])
    yield torch.log(torch.arange(1, n + 1).float()) * 3


@pytest.mark.parametrize("n", [50, 400])
def test_tilt_keeps_count_k_probable(n):
    """The stability condition: P_ν(N = k) is far from underflow on adversarial rows."""
    for y in _hard_rows(n):
        for k in sorted({1, 3, n // 10, n // 2, n - 1}):
            ys, _, nu = dp._prepare(y[None].double(), k)
            root = tree._inside(tree._leaves(ys - nu), k)[-1]
            assert float(root[k, 0, 0]) > math.exp(-10), (n, k, y[:5])


@pytest.mark.parametrize("n,k", [(5, 2), (6, 3), (7, 1)])
def test_sampler_matches_subset_probabilities(n, k, generator):
    N = 40000
    w = torch.linspace(-1.0, 1.5, n, dtype=torch.float64)
    if n == 6:
        w[2] = -math.inf
    samples = sample_ksubset(w, k, tau=0.8, n_samples=N, generator=generator)
    assert samples.shape == (N, n) and bool(KSubset(k).check(samples).all())
    *_, p, Z = _brute(w / 0.8, k)
    freq = (samples[:, None, :] == Z[None]).all(-1).double().mean(0)
    se = (p * (1 - p) / N).sqrt()
    assert bool(((freq - p).abs() <= 5 * se + 1e-12).all()), (freq, p)


def test_sampler_batched_reproducible_masked():
    w = torch.randn(3, 2, 11)
    w[0, 1, :4] = -math.inf
    a = sample_ksubset(w, 5, n_samples=7, generator=torch.Generator().manual_seed(3))
    b = sample_ksubset(w, 5, n_samples=7, generator=torch.Generator().manual_seed(3))
    assert a.shape == (7, 3, 2, 11) and torch.equal(a, b)
    assert bool(KSubset(5).check(a).all()) and bool((a[:, 0, 1, :4] == 0).all())


def test_small_tau_approaches_topk(seed):
    w = torch.randperm(40).double().reshape(1, 40) * 0.1 + torch.zeros(3, 1, dtype=torch.float64)
    w[1] = -w[1]
    hard = topk(w, 7)
    errors = [float((ksubset_marginals(w, 7, tau) - hard).abs().max())
              for tau in (1.0, 0.1, 0.01, 1e-3)]
    assert all(a > b for a, b in zip(errors, errors[1:])) and errors[-1] < 1e-12


def test_infeasible_mask_and_empty_batch():
    w = torch.tensor([[0.0, -math.inf, -math.inf], [0.0, 1.0, 2.0]])
    for fn in (ksubset_marginals, ksubset_log_partition, sample_ksubset):
        with pytest.raises(ValueError, match="fewer than k=2"):
            fn(w, 2)
        with pytest.raises(ValueError, match=r"\+inf|infinite"):
            fn(torch.tensor([0.0, math.inf, 1.0]), 1)
    with set_validation(False):                 # no check: finite garbage is allowed, no crash
        ksubset_marginals(w, 2)
    empty = torch.zeros(0, 5)
    assert ksubset_marginals(empty, 2).shape == (0, 5)
    assert ksubset_log_partition(empty, 2).shape == (0,)
    assert sample_ksubset(empty, 2, n_samples=3).shape == (3, 0, 5)


def test_half_precision_is_computed_in_float32():
    w = torch.randn(2, 30)
    for dtype in (torch.float16, torch.bfloat16):
        mu = ksubset_marginals(w.to(dtype), 4)
        assert mu.dtype == dtype and bool(torch.isfinite(mu).all())
        torch.testing.assert_close(mu.float(), ksubset_marginals(w.to(dtype).float(), 4),
                                   rtol=0, atol=1e-2)
